#!/usr/bin/env python3
"""table.py OUTDIR PEER... : print a markdown table of the metrics in OUTDIR/<peer>.jsonl,
with each peer's ratio to `local` and to `bindfs`.

Ratios are always value/baseline. For (hi) metrics >1 means better than the baseline,
for (lo) metrics (seconds) >1 means slower. '*' marks a phase cut short by PHASE_MAX_S
(its rate is still a valid rate over the part that ran). '!' marks a phase in which some
operations FAILED (see "errors"/"first_error" in the raw JSON); ERR a workload that died.
'+' marks a cell with a footnote (a peer's params.cold_note: what its "cache wiped" step did).

When the peer named by $TARGET_PEER (default: tierfs) is in the table, a second table checks
it against the performance targets in TARGETS (ratio to `local` or `bindfs`, >= the minimum).

Several rounds (compare.sh ROUNDS=N: every peer once per round, peers interleaved) append
several results per workload to a peer's .jsonl. The first table then shows each metric's
median over the rounds (ratios are ratios of those medians; a mark means some round had it).
The target table judges the median of the per-round ratios (each round's tierfs value over
the same round's baseline, measured minutes apart rather than a whole run apart) and lists
every round's ratio beside it.
"""
import json
import os
import sys

# (workload, path in metrics, label, direction)
METRICS = [
    ("fio_seqwrite", "write_wall_MiBps", "seq write 1M, MiB/s incl. end fsync", "hi"),
    ("fio_seqwrite", "write_MiBps", "seq write 1M, MiB/s (fio, excl. fsync)", "hi"),
    ("fio_seqwrite", "drain_s", "seq write: wait until in S3, s", "lo"),
    ("fio_seqwrite", "durable_MiBps", "seq write, MiB/s until durable in S3 (wall+drain)", "hi"),
    ("fio_seqread", "read_MiBps", "seq read 1M (peer cache warm), MiB/s", "hi"),
    ("fio_coldread", "read_MiBps", "seq read 1M (peer cache wiped), MiB/s", "hi"),
    ("fio_randread", "read_iops", "rand read 4k, IOPS", "hi"),
    ("fio_mmapread", "read_MiBps", "mmap walk 1M, MiB/s", "hi"),
    ("fio_randwrite", "write_iops", "rand write 4k, IOPS (fio)", "hi"),
    ("fio_randwrite", "wall_s", "rand write: wall incl. end fsync, s", "lo"),
    ("fio_randwrite", "drain_s", "rand write: wait until in S3, s", "lo"),
    ("fio_randwrite", "wall_plus_drain_s", "rand write: until durable in S3 (wall+drain), s", "lo"),
    ("meta", "create.ops_s", "meta create, ops/s", "hi"),
    ("meta", "stat.ops_s", "meta stat, ops/s", "hi"),
    ("meta", "rename.ops_s", "meta rename, ops/s", "hi"),
    ("meta", "delete.ops_s", "meta delete, ops/s", "hi"),
    ("meta", "drain_s", "meta: wait until S3 settled, s", "lo"),
    ("smallfile", "write.ops_s", "16 KiB files write, files/s", "hi"),
    ("smallfile", "sync_s", "16 KiB files: sync, s", "lo"),
    ("smallfile", "drain_s", "16 KiB files: wait until in S3, s", "lo"),
    ("smallfile", "read.ops_s", "16 KiB files read (cold page cache), files/s", "hi"),
    ("untar", "tar_entries_per_s", "untar (7.6k entries, 48 MiB), entries/s", "hi"),
    ("untar", "drain_s", "untar: wait until in S3, s", "lo"),
    ("untar", "du_entries_per_s", "du -s (cold), entries/s", "hi"),
    ("untar", "find_entries_per_s", "find + wc -l (cold), entries/s", "hi"),
    ("untar", "rm_entries_per_s", "rm -rf tree, entries/s", "hi"),
]


# performance targets of tierfs (benches/README.md): (workload, path, label, baseline, min ratio)
TARGETS = [
    ("fio_seqwrite", "write_wall_MiBps", "seq write 1M incl. fsync", "local", 0.6),
    ("fio_seqread", "read_MiBps", "hot seq read 1M", "bindfs", 0.9),
    ("fio_randread", "read_iops", "4k rand read IOPS", "bindfs", 0.9),
    ("meta", "create.ops_s", "create ops/s", "bindfs", 2.0),
    ("meta", "stat.ops_s", "stat ops/s", "bindfs", 2.0),
    ("meta", "rename.ops_s", "rename ops/s", "bindfs", 2.0),
    ("meta", "delete.ops_s", "delete ops/s", "bindfs", 2.0),
    ("untar", "tar_entries_per_s", "untar entries/s", "bindfs", 2.0),
]


def get(d, path):
    if path == "durable_MiBps":  # MiB / (wall incl. fsync + wait until in S3)
        w, dr, mib = d.get("wall_s"), d.get("drain_s") or 0, d.get("write_MiB")
        return round(mib / (w + dr), 1) if w and mib else None
    if path == "wall_plus_drain_s":
        return round(d["wall_s"] + (d.get("drain_s") or 0), 2) if d.get("wall_s") else None
    for p in path.split("."):
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def value(rounds, path):
    """Median of a metric over a peer's rounds of one workload (None: no round has it)."""
    return median([get(m, path) for m in rounds if not m.get("error")])


def ratios(mine, theirs, path):
    """Per-round ratios of `mine` over `theirs` (None where a round failed)."""
    out = []
    for m, bm in zip(mine, theirs):
        x = get(m, path) if not m.get("error") else None
        y = get(bm, path) if not bm.get("error") else None
        out.append(x / y if x is not None and y else None)
    return out


def truncated(d, path):
    head = path.split(".")[0]
    sub = d.get(head) if isinstance(d, dict) else None
    if isinstance(sub, dict) and sub.get("errors"):
        return "!"
    if isinstance(sub, dict) and sub.get("truncated"):
        return True
    if path.startswith("tar_") and (d.get("tar_rc") not in (0, None) or d.get("truncated")):
        return True
    if path.startswith("rm_") and d.get("rm_rc") not in (0, None):
        return True
    return False


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        if v >= 100:
            return "%.0f" % v
        if v >= 10:
            return "%.1f" % v
        return "%.2f" % v
    return str(v)


def main():
    out, peers = sys.argv[1], sys.argv[2:]
    data, params = {}, {}
    for p in peers:
        f = os.path.join(out, p + ".jsonl")
        data[p], params[p] = {}, {}
        if os.path.exists(f):
            for line in open(f):
                r = json.loads(line)
                data[p].setdefault(r["workload"], []).append(r["metrics"])
                params[p][r["workload"]] = r.get("params") or {}
    notes = []  # footnotes: (peer, workload, text)
    for p in peers:
        note = params[p].get("fio_coldread", {}).get("cold_note")
        if note:
            notes.append((p, "fio_coldread", note))
    others = [p for p in peers if p not in ("local",)]
    hdr = ["metric", "dir"] + peers + ["%s/local" % p for p in others] + \
          ["%s/bindfs" % p for p in peers if p not in ("local", "bindfs")]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for wl, path, label, direction in METRICS:
        vals, marks = {}, {}
        for p in peers:
            rounds = data[p].get(wl) or []
            vals[p] = value(rounds, path)
            trs = [truncated(m, path) for m in rounds]
            marks[p] = "!" if "!" in trs else ("*" if any(trs) else "")
            if rounds and all(m.get("error") for m in rounds):
                vals[p], marks[p] = None, "ERR"
        if all(v in (None, 0) for v in vals.values()) and path.endswith("drain_s"):
            continue
        # "until durable in S3" = the plain wall-clock metric when no peer has a drain step
        if path in ("durable_MiBps", "wall_plus_drain_s") and \
                all(not m.get("drain_s") for p in peers for m in data[p].get(wl) or []):
            continue
        for p in peers:
            if any(n[0] == p and n[1] == wl for n in notes) and marks[p] != "ERR":
                marks[p] += "+"
        row = [label, direction] + [("ERR" if marks[p] == "ERR" else fmt(vals[p]) + marks[p]) for p in peers]
        pairs = [(p, "local") for p in others] + [(p, "bindfs") for p in peers if p not in ("local", "bindfs")]
        for p, base in pairs:
            b, v = vals.get(base), vals[p]
            row.append(("%.2f" % (v / b)) if (b and v is not None and b > 0) else "-")
        print("| " + " | ".join(row) + " |")
    if notes:
        print()
        for p, wl, text in notes:
            print("+ %s %s: %s" % (p, wl, text))
    tp = os.environ.get("TARGET_PEER", "tierfs")
    if tp in peers:
        n_rounds = max((len(r) for r in data[tp].values()), default=1)
        print()
        # The floor peer (benches/fuse-floor: FUSE with tierfs's settings and no work) shows the
        # most any FUSE filesystem reached against the same baseline in the same rounds.
        floor = "floor" if "floor" in peers and tp != "floor" else None
        cols = ["target (%s)%s" % (tp, ", median of %d rounds" % n_rounds if n_rounds > 1 else ""),
                tp, "baseline", "ratio", "need", "met"]
        if n_rounds > 1:
            cols.append("ratio per round")
        if floor:
            cols += ["floor's ratio", "%s/floor" % tp]
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for wl, path, label, base, need in TARGETS:
            mine, theirs = data[tp].get(wl) or [], data.get(base, {}).get(wl) or []
            v, b = value(mine, path), value(theirs, path)
            per_round = ratios(mine, theirs, path)
            r = median(per_round)
            if r is None:
                ratio, ok = "-", "n/a"
            else:
                ratio, ok = "%.2f" % r, ("yes" if r >= need else "NO")
            row = "| %s | %s | %s %s | %s | >= %.1fx %s | %s |" % (label, fmt(v), base, fmt(b), ratio, need, base, ok)
            if n_rounds > 1:
                row += " %s |" % " ".join("-" if x is None else "%.2f" % x for x in per_round)
            if floor:
                floors = data[floor].get(wl) or []
                fr = median(ratios(floors, theirs, path))
                fv = value(floors, path)
                row += " %s | %s |" % ("-" if fr is None else "%.2f" % fr,
                                       "%.2f" % (v / fv) if v is not None and fv else "-")
            print(row)


if __name__ == "__main__":
    main()
