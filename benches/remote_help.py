#!/usr/bin/env python3
"""benches/remote_help.py -- the workloads, samplers and checks of benches/remote.sh.

    remote_help.py writer DIR RATE_MIB SECONDS LOG MODE FILES FILE_MIB
    remote_help.py load TIERFS RUNDIR MNT DAEMON_PID RATE_MIB SECONDS POLL_S WRITER_LOG SAMPLES MODE FILES FILE_MIB
    remote_help.py verify WRITER_LOG LOAD_JSON MNT
    remote_help.py mktree DIR NFILES
    remote_help.py checktree DIR NFILES SAMPLES
    remote_help.py change DIR
    remote_help.py table OUTDIR
    remote_help.py show FILE KEY...     (one log line: key=value for KEYs of a JSON file, a/b for nested)
    remote_help.py json                 (stdin: a JSON document, maybe pretty-printed; stdout: one line)

writer: appends WRITE_MIB=1 MiB writes at RATE_MIB MiB/s, round-robin over FILES files under
DIR; a file that reached FILE_MIB is replaced by a new one. MODE `close`: every write is
open(O_APPEND) + write + close (the close pushes the kernel's writeback pages to tierfs);
`open`: files stay open, no fsync (pages may sit in the kernel's writeback cache); `fsync`:
as `close` plus fsync before the close. Each completed write is logged to LOG as one JSON
line {"t": unix time after it returned, "f": file name, "off", "len", "i"}; the content of a
write is a function of (file number, write number in that file), so `verify` can recompute it.
The writer runs until SECONDS, or until a write fails (the daemon was killed: ENOTCONN).

load: starts the writer, polls `tierfs --json status MNT` every POLL_S during SECONDS (the
samples go to SAMPLES, one JSON line each), then kill -9 DAEMON_PID while the writer is still
writing, waits for the writer, and prints one JSON line: the percentiles of how far the store
trailed, the kill time and what the writer did.

verify: on a fresh node (MNT, restored from the store), checks every logged write byte for
byte and prints one JSON line: what survived, and the window lost before the kill.

mktree: NFILES files of 100 bytes (content depends on the path only), 100 per directory,
DIR/tNN/dNN/fNN (100 leaf directories per top directory); prints {"files", "dirs", "seconds"}.
checktree: counts the files under DIR (os.walk) and checks the content of SAMPLES of them.
change: overwrites one file of a mktree tree (t00/d00/f00) with new 100 bytes.
table: reads OUTDIR/*.json, writes OUTDIR/table.md and OUTDIR/results.json, prints the table.
"""
import json
import os
import random
import signal
import subprocess
import sys
import time

MIB = 1 << 20
WRITE = MIB
PER_DIR = 100


# ---- steady writer ---------------------------------------------------------------------
def block(fileno, i):
    return random.Random(fileno * 1_000_003 + i).randbytes(WRITE)


def writer(d, rate_mib, seconds, logpath, mode, nfiles, file_mib):
    os.makedirs(d, exist_ok=True)
    per_file = max(1, file_mib * MIB // WRITE)
    interval = WRITE / (rate_mib * MIB)
    log = open(logpath, "w", buffering=1)
    slots = list(range(nfiles))  # slot -> file number
    counts = {}                  # file number -> writes done
    handles = {}
    next_file = nfiles
    t0 = time.time()
    n = 0
    behind = 0.0
    err = None
    try:
        while True:
            due = t0 + n * interval
            now = time.time()
            if now - t0 >= seconds:
                break
            if due > now:
                time.sleep(due - now)
            else:
                behind = max(behind, now - due)
            slot = n % nfiles
            fno = slots[slot]
            i = counts.get(fno, 0)
            if i >= per_file:
                if fno in handles:
                    handles.pop(fno).close()
                fno = slots[slot] = next_file
                next_file += 1
                i = 0
            data = block(fno, i)
            ts = time.time()
            path = os.path.join(d, "w%05d" % fno)
            if mode == "open":
                fd = handles.get(fno)
                if fd is None:
                    fd = handles[fno] = open(path, "ab", buffering=0)
                fd.write(data)
            else:
                with open(path, "ab", buffering=0) as fd:
                    fd.write(data)
                    if mode == "fsync":
                        os.fsync(fd.fileno())
            t = time.time()
            counts[fno] = i + 1
            log.write(json.dumps({"t": round(t, 6), "f": "w%05d" % fno, "off": i * WRITE, "len": WRITE, "i": n,
                                  "dur": round(t - ts, 6)}) + "\n")
            n += 1
    except OSError as e:
        err = f"{type(e).__name__}: {e}"
    for fd in handles.values():
        try:
            fd.close()
        except OSError:
            pass
    elapsed = time.time() - t0
    print(json.dumps({"writes": n, "bytes": n * WRITE, "seconds": round(elapsed, 3),
                      "mib_s": round(n * WRITE / MIB / max(elapsed, 1e-9), 2), "max_behind_s": round(behind, 3),
                      "files": len(counts), "stopped_by": err}))


# ---- status sampling + kill ---------------------------------------------------------------
def status(tierfs, run, mnt):
    out = subprocess.run([tierfs, "--runtime-dir", run, "--json", "status", mnt], capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"tierfs status {mnt} failed: {out.stderr.strip() or out.stdout.strip()}")
    return json.loads(out.stdout)


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


FIELDS = [("remote", "oldest_pending_ms"), ("remote", "pending_bytes"), ("remote", "pending_batches"),
          ("cold", "oldest_dirty_ms"), ("cold", "dirty_bytes"), ("cold", "dirty_files")]


def load(tierfs, run, mnt, pid, rate_mib, seconds, poll, wlog, samples_path, mode, nfiles, file_mib):
    pid = int(pid)
    cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    if "tierfs" not in cmdline:
        raise SystemExit(f"pid {pid} is not a tierfs daemon: {cmdline!r}")
    first = status(tierfs, run, mnt)
    w = subprocess.Popen([sys.executable, __file__, "writer", os.path.join(mnt, "rpo"), str(rate_mib),
                          str(float(seconds) + 60), wlog, mode, str(nfiles), str(file_mib)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    samples, errors = [], []
    last = first
    while time.time() - t0 < seconds:
        ts = time.time()
        try:
            st = status(tierfs, run, mnt)
        except Exception as e:  # noqa: BLE001 - a failed poll is recorded, the load goes on
            errors.append(str(e)[:300])
            time.sleep(poll)
            continue
        last = st
        r, c = st.get("remote") or {}, st.get("cold") or {}
        s = {"t": round(ts - t0, 3), "call_ms": round((time.time() - ts) * 1000, 1)}
        for sec, k in FIELDS:
            s[f"{sec}.{k}"] = (r if sec == "remote" else c).get(k)
        s["remote.seq_lag"] = (r.get("last_seq") or 0) - (r.get("durable_seq") or 0)
        s["cold.uploaded_bytes"] = c.get("uploaded_bytes")
        samples.append(s)
        if w.poll() is not None:
            break
        time.sleep(max(0.0, poll - (time.time() - ts)))
    writer_alive = w.poll() is None
    kill_t = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        wout, werr = w.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        w.kill()
        wout, werr = w.communicate()
    with open(samples_path, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    try:
        wres = json.loads(wout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        wres = {"error": (werr or wout).strip()[-300:]}
    res = {"kill_unix": round(kill_t, 6), "writer_alive_at_kill": writer_alive, "samples": len(samples),
           "poll_s": poll, "status_errors": len(errors), "first_status_error": errors[0] if errors else None,
           "sample_call_ms_p50": pct([s["call_ms"] for s in samples], 50),
           "writer": wres, "rate_mib": rate_mib, "seconds": seconds, "mode": mode}
    for key in [f"{a}.{b}" for a, b in FIELDS] + ["remote.seq_lag"]:
        vals = [s[key] for s in samples if s.get(key) is not None]
        res[key] = {"max": max(vals) if vals else None, "p50": pct(vals, 50), "p95": pct(vals, 95)}
    up0 = (first.get("cold") or {}).get("uploaded_bytes") or 0
    up1 = (last.get("cold") or {}).get("uploaded_bytes") or 0
    res["uploaded_bytes_during_load"] = up1 - up0
    res["last_status"] = {"remote": last.get("remote"), "cold": last.get("cold")}
    print(json.dumps(res))


def describe(w, data, kill_t):
    """What a write that is inside the restored file but has the wrong bytes looks like."""
    got = data[w["off"]:w["off"] + w["len"]]
    want = block(int(w["f"][1:]), w["off"] // WRITE)
    same = next((k for k in range(len(got)) if got[k] != want[k]), len(got))
    # the same bytes as another write of this file (e.g. an older block at the wrong offset)?
    other = next((j for j in range(len(data) // WRITE + 1) if got == block(int(w["f"][1:]), j)), None)
    return {"f": w["f"], "off": w["off"], "age_at_kill_s": round(kill_t - w["t"], 3), "file_size": len(data),
            "zero_bytes": got.count(0), "matching_leading_bytes": same,
            "first_bad_offset_in_file": w["off"] + same, "equals_write_no": other}


def verify(wlog, load_json, mnt):
    kill_t = json.load(open(load_json))["kill_unix"]
    writes = [json.loads(line) for line in open(wlog) if line.strip()]
    writes = [w for w in writes if w["t"] <= kill_t]
    files, contents = {}, {}
    for w in writes:
        files.setdefault(w["f"], []).append(w)
    for name in files:
        try:
            with open(os.path.join(mnt, "rpo", name), "rb", buffering=0) as f:
                contents[name] = f.read()
        except FileNotFoundError:
            contents[name] = None
    ok, missing, corrupt = [], [], []
    for w in writes:
        data = contents[w["f"]]
        fno = int(w["f"][1:])
        want = block(fno, w["off"] // WRITE)
        if data is not None and data[w["off"]:w["off"] + w["len"]] == want:
            ok.append(w)
        elif data is None or len(data) < w["off"] + w["len"]:
            missing.append(w)
        else:
            corrupt.append(w)
    lost = sorted(missing + corrupt, key=lambda w: w["t"])
    newest_ok = max((w["t"] for w in ok), default=None)
    # everything completed before the oldest lost write survived: the consistent prefix
    if lost:
        before = [w["t"] for w in writes if w["t"] < lost[0]["t"]]
        prefix_t = max(before) if before else None
    else:
        prefix_t = max((w["t"] for w in writes), default=None)
    newest_write = max((w["t"] for w in writes), default=None)
    survivors_after_loss = [w for w in ok if lost and w["t"] > lost[0]["t"]]
    extra = {n: len(d) - max(w["off"] + w["len"] for w in files[n]) for n, d in contents.items() if d is not None}
    print(json.dumps({
        "writes_before_kill": len(writes), "bytes_before_kill": sum(w["len"] for w in writes),
        "files_before_kill": len(files), "files_present": sum(1 for d in contents.values() if d is not None),
        "writes_survived": len(ok), "bytes_survived": sum(w["len"] for w in ok),
        "writes_missing": len(missing), "writes_corrupt": len(corrupt),
        "corrupt_examples": [describe(w, contents[w["f"]], kill_t) for w in corrupt[:5]],
        "survived_after_a_lost_write": len(survivors_after_loss),
        "bytes_beyond_logged_writes": sum(max(0, v) for v in extra.values()),
        "newest_write_age_at_kill_s": None if newest_write is None else round(kill_t - newest_write, 3),
        "lost_window_s": None if newest_ok is None else round(kill_t - newest_ok, 3),
        "rpo_prefix_s": None if prefix_t is None else round(kill_t - prefix_t, 3),
        "oldest_lost_age_s": round(kill_t - lost[0]["t"], 3) if lost else None,
    }))


# ---- small-file trees ---------------------------------------------------------------------
def tree_paths(n):
    for k in range(n):
        leaf, f = divmod(k, PER_DIR)
        top, d = divmod(leaf, PER_DIR)
        yield "t%02d/d%02d" % (top, d), "f%02d" % f


def content(rel, gen=0):
    h = random.Random(f"{rel}#{gen}").randbytes(40).hex()
    return (f"{rel} {h}\n" + "x" * 100)[:99].encode() + b"\n"


def mktree(root, n):
    t0 = time.perf_counter()
    made = set()
    for d, f in tree_paths(n):
        if d not in made:
            os.makedirs(os.path.join(root, d), exist_ok=True)
            made.add(d)
        fd = os.open(os.path.join(root, d, f), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, content(f"{d}/{f}"))
        os.close(fd)
    secs = time.perf_counter() - t0
    print(json.dumps({"files": n, "dirs": len(made), "seconds": round(secs, 3), "files_s": round(n / secs, 1)}))


def checktree(root, n, samples):
    t0 = time.perf_counter()
    count = sum(len(fs) for _, _, fs in os.walk(root))
    walk_s = time.perf_counter() - t0
    rng = random.Random(7)
    paths = list(tree_paths(n))
    bad = []
    for d, f in rng.sample(paths, min(samples, n)):
        rel = f"{d}/{f}"
        try:
            with open(os.path.join(root, rel), "rb", buffering=0) as fh:  # no isatty() ioctl
                ok = fh.read() in (content(rel), content(rel, 1))
        except OSError as e:
            ok = False
            rel += f" ({e.strerror})"
        if not ok:
            bad.append(rel)
    print(json.dumps({"files_found": count, "files_expected": n, "walk_s": round(walk_s, 3),
                      "sampled": min(samples, n), "sample_bad": len(bad), "bad_examples": bad[:5]}))


def change(root):
    rel = "t00/d00/f00"
    with open(os.path.join(root, rel), "wb", buffering=0) as f:
        f.write(content(rel, 1))
    print(json.dumps({"changed": rel, "bytes": len(content(rel, 1))}))


# ---- table --------------------------------------------------------------------------------
def table(out):
    def load_(name):
        p = os.path.join(out, name + ".json")
        if not os.path.exists(p):
            return None
        try:
            return json.load(open(p))
        except ValueError as e:
            return {"error": f"unreadable {name}.json: {e}"}

    params = json.load(open(os.path.join(out, "params.json")))
    names = ["rpo_load", "rpo_verify", "rpo_restore", "incr_tierfs", "incr_restic"]
    counts = [int(n) for n in params["file_counts"].split()]
    names += [f"tree_{n}" for n in counts]
    res = {n: load_(n) for n in names}
    lines = []
    p = lines.append
    err = lambda d: d is not None and "error" in d  # noqa: E731

    def e(d):
        return "ERR" if err(d) else "-"

    def f1(v, scale=1.0, nd=1):
        return "-" if v is None else f"{v / scale:.{nd}f}"

    p(f"## Remote metadata (moto on loopback, one run, {params['date']})\n")
    # 1
    ld, vf = res["rpo_load"], res["rpo_verify"]
    p(f"### 1. How far the store trails a steady writer ({params['rate_mib']} MiB/s in 1 MiB writes, "
      f"{params['write_files']} files, mode `{params['write_mode']}`, {params['duration_s']} s, "
      f"status every {params['poll_s']} s)\n")
    if ld is None or err(ld):
        p(f"ERR: {ld['error'] if ld else 'not measured'}\n")
    else:
        wr = ld.get("writer", {})
        p("| status field | max | p50 | p95 |\n|---|---:|---:|---:|")
        for key, label, scale, unit in [("remote.oldest_pending_ms", "remote.oldest_pending_ms", 1, ""),
                                        ("cold.oldest_dirty_ms", "cold.oldest_dirty_ms", 1, ""),
                                        ("cold.dirty_bytes", "cold.dirty_bytes (MiB)", MIB, ""),
                                        ("remote.pending_bytes", "remote.pending_bytes (KiB)", 1024, ""),
                                        ("remote.pending_batches", "remote.pending_batches", 1, ""),
                                        ("remote.seq_lag", "remote last_seq - durable_seq", 1, "")]:
            d = ld.get(key) or {}
            nd = 0 if scale == 1 else 1
            p(f"| {label} | {f1(d.get('max'), scale, nd)} | {f1(d.get('p50'), scale, nd)} | {f1(d.get('p95'), scale, nd)} |")
        p("")
        p(f"Writer: {wr.get('writes', '?')} writes, {wr.get('mib_s', '?')} MiB/s achieved, at most "
          f"{wr.get('max_behind_s', '?')} s behind schedule; {ld['samples']} status samples "
          f"(call p50 {f1(ld.get('sample_call_ms_p50'))} ms, {ld['status_errors']} failed); cold tier uploaded "
          f"{ld.get('uploaded_bytes_during_load', 0) / MIB:.0f} MiB during the load "
          f"({ld.get('uploaded_bytes_during_load', 0) / max(1, wr.get('bytes') or 1):.2f}x the bytes written).\n")
    p("Real RPO: `kill -9` of the daemon at the end of the load (writer still writing), "
      "`fusermount3 -u -z`, `tierfs mount --takeover` on an empty data dir, every logged write checked byte for byte:\n")
    rs = res["rpo_restore"]
    if vf is None or err(vf):
        p(f"ERR: {vf['error'] if vf else 'not measured'}\n")
    else:
        p("| writes before kill | survived | missing | corrupt | files present | lost window (s) | consistent-prefix RPO (s) | restore mount (s) |")
        p("|---:|---:|---:|---:|---:|---:|---:|---:|")
        p(f"| {vf['writes_before_kill']} ({vf['bytes_before_kill'] / MIB:.0f} MiB) | {vf['writes_survived']} "
          f"({vf['bytes_survived'] / MIB:.0f} MiB) | {vf['writes_missing']} | {vf['writes_corrupt']} | "
          f"{vf['files_present']}/{vf['files_before_kill']} | {f1(vf['lost_window_s'], 1, 2)} | "
          f"{f1(vf['rpo_prefix_s'], 1, 2)} | {f1((rs or {}).get('seconds'), 1, 2) if not err(rs) else 'ERR'} |")
        p("")
        p("lost window = kill time - completion time of the newest write that survived completely; "
          "consistent-prefix RPO = kill time - completion of the last write before the oldest lost one "
          f"(every write older than that survived). Newest logged write finished {vf['newest_write_age_at_kill_s']} s "
          f"before the kill; {vf['survived_after_a_lost_write']} writes survived although an older one was lost.\n")
    # 2
    p("### 2. Fresh node: time to the first full `ls -R` (files of 100 bytes, 100 per directory)\n")
    p("| files | create via mount (s) | `tierfs sync` (s) | umount (s) | restore `tierfs mount` (s) | `ls -R` (s) | mount + `ls -R` (s) | 2nd `ls -R` (s) | files found | checkpoint |")
    p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in counts:
        d = res[f"tree_{n}"]
        if d is None or err(d):
            p(f"| {n} | {e(d)} | | | | | | | | {(d or {}).get('error', 'not measured')[:200]} |")
            continue
        g = d.get

        def s(k):
            return "ERR" if g(k) == "ERR" else f1(g(k), 1, 2)
        sy = g("sync") or {}
        note = (f"{sy.get('parts', '?')} parts, {sy.get('metadata_bytes', 0) / MIB:.1f} MiB metadata, "
                f"{sy.get('data_bytes', 0) / MIB:.1f} MiB data") if sy else ""
        ck = g("check") or {}
        found = f"{ck.get('files_found', '?')}" + (f" ({ck['sample_bad']} of {ck['sampled']} sampled BAD)" if ck.get("sample_bad") else "")
        total = f1(g("restore_s") + g("ls_s"), 1, 2) if isinstance(g("restore_s"), (int, float)) and isinstance(g("ls_s"), (int, float)) else "-"
        p(f"| {n} | {s('create_s')} | {s('sync_s')} | {s('umount_s')} | {s('restore_s')} | {s('ls_s')} | {total} | {s('ls2_s')} | {found} | {note} |")
    p("")
    # 3
    it, ir = res["incr_tierfs"], res["incr_restic"]
    p(f"### 3. Incremental: one 100-byte file changed in the {(it or {}).get('files', max(counts))}-file tree\n")
    p("| | first (s) | after one change (s) | added, as the tool reports | added to the bucket (moto) | notes |")
    p("|---|---:|---:|---:|---:|---|")
    if it is not None and not err(it) and not isinstance(it.get("sync"), dict):
        it = {"error": "no sync report in incr_tierfs.json"}
    if ir is not None and not err(ir) and not all(isinstance(ir.get(k), dict) for k in ("first", "second")):
        ir = {"error": "no restic summary in incr_restic.json (see restic.log)"}
    if it is None or err(it):
        p(f"| `tierfs sync` | ERR | ERR | | | {(it or {}).get('error', 'not measured')[:200]} |")
    else:
        s1 = it["sync"]
        b = it.get("bucket_delta") or {}
        p(f"| `tierfs sync` | {f1(it.get('first_sync_s'), 1, 2)} | {s1['millis'] / 1000:.3f} | "
          f"{s1['data_bytes'] + s1['metadata_bytes']} B (data {s1['data_bytes']}, metadata {s1['metadata_bytes']}) | "
          f"{b.get('bytes', '?')} B in {b.get('objects', '?')} new objects | parts uploaded {s1['parts_uploaded']}/{s1['parts']}; "
          f"sync wall {it.get('wall_s')} s; first = the initial sync after creating the tree (phase 2) |")
    if ir is None or err(ir):
        p(f"| `restic backup` | ERR | ERR | | | {(ir or {}).get('error', 'not measured')[:200]} |")
    else:
        b = ir.get("bucket_delta") or {}
        p(f"| `restic backup` | {f1(ir.get('first_s'), 1, 2)} | {f1(ir.get('second_s'), 1, 3)} | "
          f"{ir['second'].get('data_added', '?')} B | {b.get('bytes', '?')} B in {b.get('objects', '?')} new objects | "
          f"restic {ir.get('version', '?')}, from a local copy of the tree; first backup added "
          f"{(ir['first'].get('data_added') or 0) / MIB:.1f} MiB |")
    p("")
    notes = []
    for logname in sorted(os.listdir(out)):
        if logname.startswith("tierfs-daemon") and logname.endswith(".log"):
            bad = [ln.rstrip() for ln in open(os.path.join(out, logname), errors="replace")
                   if " WARN " in ln or " ERROR " in ln]
            ioctl = [ln for ln in bad if "[Not Implemented] ioctl" in ln]
            bad = [ln for ln in bad if ln not in ioctl]
            if bad or ioctl:
                notes.append(f"{logname}: {len(bad)} WARN/ERROR lines" + (f", first: `{bad[0][:220]}`" if bad else "")
                             + (f" (and {len(ioctl)} `[Not Implemented] ioctl` WARNs)" if ioctl else ""))
    if params.get("installed"):
        notes.append(f"installed by this run with apt-get: {params['installed']}.")
    env = open(os.path.join(out, "env.txt")).read().splitlines() if os.path.exists(os.path.join(out, "env.txt")) else []
    notes += [ln for ln in env if ln.startswith("loadavg")]
    for n in notes:
        p(f"- {n}")
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "table.md"), "w").write(text)
    json.dump({"params": params, "env": env, "results": res}, open(os.path.join(out, "results.json"), "w"), indent=1)
    sys.stdout.write(text)


if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "writer":
        writer(a[0], float(a[1]), float(a[2]), a[3], a[4], int(a[5]), int(a[6]))
    elif cmd == "load":
        load(a[0], a[1], a[2], a[3], float(a[4]), float(a[5]), float(a[6]), a[7], a[8], a[9], int(a[10]), int(a[11]))
    elif cmd == "verify":
        verify(a[0], a[1], a[2])
    elif cmd == "mktree":
        mktree(a[0], int(a[1]))
    elif cmd == "checktree":
        checktree(a[0], int(a[1]), int(a[2]))
    elif cmd == "change":
        change(a[0])
    elif cmd == "table":
        table(a[0])
    elif cmd == "show":
        d = json.load(open(a[0]))

        def get(k):
            v = d
            for part in k.split("/"):
                v = v.get(part) if isinstance(v, dict) else None
            return v
        print(", ".join(f"{k}={get(k)}" for k in a[1:]))
    elif cmd == "json":
        print(json.dumps(json.loads(sys.stdin.read())))
    else:
        raise SystemExit(f"remote_help.py: unknown command {cmd}")
