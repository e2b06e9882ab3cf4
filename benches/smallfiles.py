#!/usr/bin/env python3
"""benches/smallfiles.py -- trees of small files and their readers, for benches/smallfiles.sh.

    smallfiles.py mktree ws DIR [--files 2157] [--mib 95] [--seed 24]
    smallfiles.py mktree imagenet DIR [--files 20000] [--kib 100] [--per-dir 1000] [--seed 24]
    smallfiles.py walk DIR                 read every file once, in sorted os.walk order
    smallfiles.py random DIR MANIFEST [--workers 8] [--count 2000] [--seed 24]
    smallfiles.py verify DIR MANIFEST      every file's size and CRC-32 against the manifest
    smallfiles.py upload SRC PREFIX [--threads 32]   (boto3; S3_* as for s3_raw.py)
    smallfiles.py delta BEFORE AFTER       the `cold` counters a read moved (two status JSONs)
    smallfiles.py table OUTDIR --label bN=LABEL... [--rounds N ...]  smallfiles.sh's markdown table

mktree writes DIR and DIR.manifest (one line per file: relative path, size, CRC-32), from a
seeded generator, so two runs with the same knobs make the same bytes. `ws` is a workspace:
a git clone (.git/objects fan-out, sources), a virtualenv (site-packages, a few shared
objects) and untarred sources (a few 5-10 MiB files), several directory levels; sizes are
drawn log-uniform per class (most 1-20 KiB, 4.5% 100 KiB-1 MiB, 0.3% 5-10 MiB)
and the middle class is scaled so that the total is exactly --mib. `imagenet` is
--files files of --kib KiB, --per-dir to a directory.

walk, random and upload print one JSON line on stdout:
    {"op", "files", "bytes", "seconds", "mib_s", "files_s", ...}
walk opens, reads to the end (1 MiB reads) and closes each file; the directory listing is
part of the timed read (as for `find | xargs cat`), names sorted so that every filesystem
is read in the same order. random reads --count files picked with a seeded generator from
the manifest (a data loader's index; no listing) by --workers threads, each file whole.
"""

import argparse
import json
import os
import random
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

MIB = 1 << 20
KIB = 1 << 10


def log_uniform(rng, lo, hi):
    return int(lo * (hi / lo) ** rng.random())


def ws_layout(rng, files, total):
    """[(relpath, size)] of a workspace-like tree of `files` files, `total` bytes."""
    n_big = max(1, round(files * 0.003))
    n_mid = max(1, round(files * 0.045))
    n_small = files - n_big - n_mid
    if n_small < 1:
        raise SystemExit(f"mktree ws: --files {files} is too few (at least 3)")
    small = [log_uniform(rng, 1 * KIB, 20 * KIB) for _ in range(n_small)]
    mid = [log_uniform(rng, 100 * KIB, MIB) for _ in range(n_mid)]
    big = [rng.randint(5 * MIB, 10 * MIB) for _ in range(n_big)]
    rest = total - sum(small)
    if rest <= n_mid + n_big:
        raise SystemExit(f"mktree ws: {total >> 20} MiB is too little for {files} files")
    scale = (rest - sum(big)) / sum(mid) if rest > sum(big) + n_mid else rest / (sum(mid) + sum(big))
    mid = [max(1, int(s * scale)) for s in mid]
    if rest <= sum(big) + n_mid:  # a small --mib: the big ones shrink too
        big = [max(1, int(s * scale)) for s in big]
    diff = total - sum(small) - sum(mid) - sum(big)
    big = [s + diff // n_big for s in big]
    big[-1] += diff % n_big

    # directories: a git clone, a virtualenv, untarred sources; each a random tree
    def tree(root, n_dirs, depth):
        dirs = [root]
        for i in range(n_dirs):
            parent = rng.choice([d for d in dirs if d.count("/") - root.count("/") < depth])
            dirs.append(f"{parent}/d{i:03d}")
        return dirs

    git_objects = [f"repo/.git/objects/{i:02x}" for i in range(256)]
    repo_src = tree("repo/src", 40, 4)
    venv = tree("venv/lib/python3.11/site-packages", 120, 3)
    sources = tree("sources/pkg-1.2.3", 30, 4)
    out = []
    for i, s in enumerate(small):
        r = rng.random()
        if r < 0.35:
            d, name = rng.choice(git_objects), f"{rng.getrandbits(152):038x}"
        elif r < 0.6:
            d, name = rng.choice(repo_src), f"f{i:05d}.rs"
        elif r < 0.9:
            d, name = rng.choice(venv), f"m{i:05d}.py"
        else:
            d, name = rng.choice(sources), f"s{i:05d}.c"
        out.append((f"{d}/{name}", s))
    for i, s in enumerate(mid):
        d = rng.choice(venv if i % 2 else sources)
        out.append((f"{d}/lib{i:03d}.so", s))
    for i, s in enumerate(big):
        out.append((f"{rng.choice(sources)}/blob{i:02d}.bin", s))
    return out


def imagenet_layout(files, size, per_dir):
    return [(f"train/n{i // per_dir:05d}/img_{i:07d}.JPEG", size) for i in range(files)]


def cmd_mktree(a):
    rng = random.Random(a.seed)
    if a.kind == "ws":
        layout = ws_layout(rng, a.files, a.mib * MIB)
    else:
        layout = imagenet_layout(a.files, a.kib * KIB, a.per_dir)
    t0 = time.perf_counter()
    made = set()
    with open(a.dir + ".manifest", "w") as man:
        for rel, size in layout:
            path = os.path.join(a.dir, rel)
            d = os.path.dirname(path)
            if d not in made:
                os.makedirs(d, exist_ok=True)
                made.add(d)
            data = rng.randbytes(size)
            with open(path, "wb") as f:
                f.write(data)
            man.write(f"{rel}\t{size}\t{zlib.crc32(data)}\n")
    sizes = sorted(s for _, s in layout)
    print(json.dumps({"op": "mktree", "kind": a.kind, "files": len(layout), "bytes": sum(sizes),
                      "dirs": len(made), "min": sizes[0], "median": sizes[len(sizes) // 2], "max": sizes[-1],
                      "under_20k": sum(s <= 20 * KIB for s in sizes), "over_1m": sum(s > MIB for s in sizes),
                      "seconds": round(time.perf_counter() - t0, 2)}))


def read_file(path, buf):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(buf)
            if not got:
                return n
            n += got


def report(op, files, nbytes, seconds, **extra):
    out = {"op": op, "files": files, "bytes": nbytes, "seconds": round(seconds, 4),
           "mib_s": round(nbytes / MIB / seconds, 2), "files_s": round(files / seconds, 1)}
    out.update(extra)
    print(json.dumps(out), flush=True)


def cmd_walk(a):
    buf = bytearray(MIB)
    files = nbytes = 0
    t0 = time.perf_counter()
    for root, dirs, names in os.walk(a.dir):
        dirs.sort()
        for name in sorted(names):
            nbytes += read_file(os.path.join(root, name), buf)
            files += 1
    if files == 0:
        raise SystemExit(f"walk: no files under {a.dir}")
    report("walk", files, nbytes, time.perf_counter() - t0)


def manifest(path):
    with open(path) as f:
        return [(rel, int(size), int(crc)) for rel, size, crc in (line.rstrip("\n").split("\t") for line in f)]


def cmd_random(a):
    entries = manifest(a.manifest)
    rng = random.Random(a.seed)
    picks = [rng.randrange(len(entries)) for _ in range(a.count)]
    lock = threading.Lock()
    pos = [0]
    done = [0, 0]  # files, bytes

    def worker():
        buf = bytearray(MIB)
        files = nbytes = 0
        while True:
            with lock:
                i = pos[0]
                pos[0] += 1
            if i >= len(picks):
                break
            rel, size, _ = entries[picks[i]]
            got = read_file(os.path.join(a.dir, rel), buf)
            if got != size:
                raise RuntimeError(f"{rel}: read {got} bytes, manifest says {size}")
            files += 1
            nbytes += got
        with lock:
            done[0] += files
            done[1] += nbytes

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.workers) as pool:
        for f in [pool.submit(worker) for _ in range(a.workers)]:
            f.result()
    report("random", done[0], done[1], time.perf_counter() - t0, workers=a.workers,
           distinct=len(set(picks)))


def cmd_verify(a):
    bad = []
    entries = manifest(a.manifest)
    for rel, size, crc in entries:
        try:
            with open(os.path.join(a.dir, rel), "rb") as f:
                data = f.read()
        except OSError as e:
            bad.append(f"{rel}: {e}")
            continue
        if len(data) != size or zlib.crc32(data) != crc:
            bad.append(f"{rel}: {len(data)} bytes (want {size}), crc {zlib.crc32(data)} (want {crc})")
    print(json.dumps({"op": "verify", "files": len(entries), "bad": len(bad), "first_bad": bad[:5]}))
    if bad:
        sys.exit(1)


def cmd_upload(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import s3_raw
    s3 = s3_raw.client(a.threads)
    bucket = s3_raw.env("S3_BUCKET")
    paths = []
    for root, dirs, names in os.walk(a.src):
        paths += [os.path.join(root, n) for n in names]

    def put(p):
        with open(p, "rb") as f:
            body = f.read()
        s3.put_object(Bucket=bucket, Key=a.prefix + os.path.relpath(p, a.src), Body=body)
        return len(body)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as pool:
        nbytes = sum(pool.map(put, paths))
    report("upload", len(paths), nbytes, time.perf_counter() - t0, threads=a.threads)


def cmd_delta(a):
    def cold(p):
        with open(p) as f:
            d = json.load(f)
        return d.get("cold") or {}
    def gets(p):
        """(calls, seconds) of the GETs (whole and ranged) to every backend so far."""
        with open(p) as f:
            d = json.load(f)
        calls = ns = 0
        for backend in d.get("backends") or []:
            for r in (backend.get("traffic") or {}).get("requests", []):
                if r.get("op") in ("get", "get_range"):
                    calls += r.get("calls", 0)
                    ns += (r.get("latency") or {}).get("sum_ns", 0)
        return calls, ns / 1e9
    b, f = cold(a.before), cold(a.after)
    keys = ("fetched_bytes", "streamed_bytes", "read_misses", "read_hits", "read_hit_bytes", "evictions")
    out = {k: f.get(k, 0) - b.get(k, 0) for k in keys if k in f}
    (c0, s0), (c1, s1) = gets(a.before), gets(a.after)
    out.update(store_gets=c1 - c0, store_get_s=round(s1 - s0, 3))
    print(json.dumps(out))


def cmd_table(a):
    """The markdown table of smallfiles.sh from the JSON files in OUTDIR."""
    import statistics

    def load(name):
        p = os.path.join(a.outdir, name + ".json")
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return json.load(f)

    def med(name):
        """The measurement NAME over the rounds: median seconds (and mount), per-round seconds."""
        rs = [load(f"{name}.r{r}") for r in range(1, a.rounds + 1)]
        rs = [d for d in rs if d]
        if not rs:
            return None
        secs = statistics.median(d["seconds"] for d in rs)
        d = dict(rs[0])
        d.setdefault("files", d.get("objects"))
        d.update(seconds=secs, mib_s=d["bytes"] / MIB / secs, files_s=d["files"] / secs, rounds=[x["seconds"] for x in rs])
        if all("mount_s" in x for x in rs):
            d["mount_s"] = statistics.median(x["mount_s"] for x in rs)
        for k in ("fetched_bytes", "read_misses", "read_hits", "streamed_bytes", "umount_s", "store_gets", "store_get_s"):
            if all(k in x for x in rs):
                d[k] = statistics.median(x[k] for x in rs)
        return d

    builds = [lab.split("=", 1) for lab in a.labels]
    trees = a.trees.split()
    threads = [int(n) for n in a.raw_threads.split()]
    peers = a.peers.split()
    rows, ratios = [], []

    def row(tree, who, what, d, note=""):
        if d is None:
            rows.append(f"| {tree} | {who} | {what} | | | | | not measured |")
            return
        mount = f"{d['mount_s']:.2f}" if "mount_s" in d else ""
        if len(d["rounds"]) > 1:
            note = (note + "; " if note else "") + "rounds " + ", ".join(f"{x:.2f}" for x in d["rounds"]) + " s"
        rows.append(f"| {tree} | {who} | {what} | {mount} | {d['seconds']:.2f} | {d['mib_s']:.1f} | {d['files_s']:.0f} | {note} |")

    def tierfs_note(d, tree_bytes):
        if d is None or "fetched_bytes" not in d:
            return ""
        n = f"fetched {d['fetched_bytes'] / MIB:.0f} MiB ({d['fetched_bytes'] / tree_bytes:.2f}x the bytes read)"
        if "read_misses" in d:
            n += f", {d['read_misses']:.0f} read misses"
        if d.get("store_gets"):
            g = d["store_gets"]
            n += (f"; {g:.0f} store GETs of {d['store_get_s'] / g * 1000:.1f} ms on average, "
                  f"{d['store_get_s'] / d['seconds']:.2f} in flight on average")
        if "umount_s" in d:
            n += f"; umount {d['umount_s']:.1f} s"
        return n

    def ratio(label, x, y, goal):
        if x is None or y is None:
            ratios.append(f"| {label} | - | {goal or ''} | |")
            return
        v = x["files_s"] / y["files_s"]
        met = "" if goal is None else ("yes" if v >= goal else "**no**")
        ratios.append(f"| {label} | {v:.2f}x | {'>= %gx' % goal if goal else ''} | {met} |")

    for tree in trees:
        best = None
        for n in threads:
            d = med(f"raw{n}.{tree}.get")
            row(tree, f"raw GET, {n} thread{'s' if n != 1 else ''}", "all objects", d, "boto3; objects listed before the clock")
            if d and (best is None or d["files_s"] > best[1]["files_s"]):
                best = (n, d)
        for b, lab in builds:
            d = med(f"{b}.{tree}.walk")
            v = load(f"{b}.{tree}.verify")
            note = tierfs_note(d, d["bytes"]) if d else ""
            if v is not None:
                note += "; content verified" if v["bad"] == 0 else f"; **{v['bad']} FILES DIFFER**"
            row(tree, lab, "walk", d, note)
            ratio(f"{lab}, {tree} walk / raw GET ({best[0] if best else '-'} threads)", d, best and best[1], 0.5)
            if "rclone" in peers:
                ratio(f"{lab}, {tree} walk / rclone walk", d, med(f"rclone.{tree}.walk"), 3 if tree == "imagenet" else None)
        for p in peers:
            row(tree, p, "walk", med(f"{p}.{tree}.walk"))
    if "imagenet" in trees:
        for b, lab in builds:
            d = med(f"{b}.imagenet.random")
            row("imagenet", lab, f"random, {a.workers} threads", d, tierfs_note(d, d["bytes"]) if d else "")
            n = a.workers if a.workers in threads else max(threads, key=lambda n: (med(f"raw{n}.imagenet.get") or {}).get("files_s", 0), default=None)
            raw = med(f"raw{n}.imagenet.get") if n else None
            ratio(f"{lab}, imagenet random / raw GET ({n or '-'} threads)", d, raw, None)
            if "rclone" in peers:
                ratio(f"{lab}, imagenet random / rclone random", d, med("rclone.imagenet.random"), None)
        for p in peers:
            row("imagenet", p, f"random, {a.workers} threads", med(f"{p}.imagenet.random"))

    print(f"## Small files after a reset (median of {a.rounds} round{'s' if a.rounds > 1 else ''})\n")
    print("| tree | reader | read | mount ready s | read s | MiB/s | files/s | notes |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    print("\n| ratio (files/s of the same bytes; read s only, mount ready aside) | value | goal | met |\n|---|---:|---:|:-:|")
    print("\n".join(ratios))
    print()
    for tree in trees:
        t = load(f"tree.{tree}")
        if t:
            print(f"- {tree}: {t['files']} files, {t['bytes'] / MIB:.1f} MiB, {t['dirs']} directories; sizes "
                  f"{t['min']} B - {t['max'] / MIB:.1f} MiB, median {t['median'] / KIB:.1f} KiB; "
                  f"{t['under_20k']} files up to 20 KiB, {t['over_1m']} over 1 MiB")
        for b, lab in builds:
            w = load(f"write-{b}.{tree}")
            if w:
                print(f"- {lab}, {tree} write: cp {w['copy_s']:.1f} s, `tierfs sync` {w['sync_s']:.1f} s, "
                      f"`tierfs umount` {w['umount_s']:.1f} s")
    print(f"- walk: smallfiles.py walk, sorted os.walk, each file opened, read whole (1 MiB reads) and closed, "
          f"listing included; random: {a.workers} threads reading seeded random files of the imagenet manifest")
    print(f"- {a.server} on loopback; tierfs's store replicated to {a.replicas} bucket(s) on it"
          f"{f' (every upload goes {a.replicas} times to the one server)' if a.replicas > 1 else ''}; "
          f"tierfs --cache-size {a.cache_mib} MiB, every tierfs read on a fresh node (empty data dir, "
          "page cache dropped; the mount restores the workspace's metadata); rclone --vfs-cache-mode full and "
          "s3fs use_cache with fresh cache dirs, on the same trees as plain objects")
    if a.skipped.strip():
        print(f"- skipped (not installed): {a.skipped.strip()}")
    env = os.path.join(a.outdir, "env.txt")
    if os.path.exists(env):
        with open(env) as f:
            for line in f:
                if line.startswith(("loadavg", "busy", "host")):
                    print(f"- {line.strip()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("mktree")
    s.add_argument("kind", choices=("ws", "imagenet"))
    s.add_argument("dir")
    s.add_argument("--files", type=int)
    s.add_argument("--mib", type=int, default=95)
    s.add_argument("--kib", type=int, default=100)
    s.add_argument("--per-dir", type=int, default=1000)
    s.add_argument("--seed", type=int, default=24)
    s = sub.add_parser("walk")
    s.add_argument("dir")
    s = sub.add_parser("random")
    s.add_argument("dir")
    s.add_argument("manifest")
    s.add_argument("--workers", type=int, default=8)
    s.add_argument("--count", type=int, default=2000)
    s.add_argument("--seed", type=int, default=24)
    s = sub.add_parser("verify")
    s.add_argument("dir")
    s.add_argument("manifest")
    s = sub.add_parser("upload")
    s.add_argument("src")
    s.add_argument("prefix")
    s.add_argument("--threads", type=int, default=32)
    s = sub.add_parser("delta")
    s.add_argument("before")
    s.add_argument("after")
    s = sub.add_parser("table")
    s.add_argument("outdir")
    s.add_argument("--label", dest="labels", action="append", default=[], help="bN=LABEL, one per build")
    s.add_argument("--rounds", type=int, default=1)
    s.add_argument("--trees", default="ws imagenet")
    s.add_argument("--raw-threads", default="8 32")
    s.add_argument("--peers", default="")
    s.add_argument("--skipped", default="")
    s.add_argument("--replicas", type=int, default=3)
    s.add_argument("--server", default="one moto server")
    s.add_argument("--cache-mib", type=int, default=4096)
    s.add_argument("--workers", type=int, default=8)
    a = p.parse_args()
    if a.cmd == "mktree" and a.files is None:
        a.files = 2157 if a.kind == "ws" else 20000
    {"mktree": cmd_mktree, "walk": cmd_walk, "random": cmd_random, "verify": cmd_verify,
     "upload": cmd_upload, "delta": cmd_delta, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    main()
