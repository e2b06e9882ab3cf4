#!/usr/bin/env python3
"""benches/anchors.py -- the per-operation timings and the table of benches/anchors.sh.

    anchors.py ttfb OUT.json FILE...   first byte of each FILE, page cache dropped before each
    anchors.py create OUT.json DIR N   N one-byte files created in DIR, each with fsync
    anchors.py mkdir DIR N             N empty files in DIR (the listing's directory; untimed)
    anchors.py table OUTDIR PEER...    results.json and table.md from OUTDIR/<peer>.<measure>.json

ttfb: for each file, `sync; echo 3 >/proc/sys/vm/drop_caches` (root), then open, read(1),
close; "read_us" is the read(2) alone (what mountpoint-s3's fio job reports: the read's
lat_ns), "open_read_us" open + read + close. create: per file open(O_CREAT|O_EXCL), write one
byte, fsync, close, all timed; the file is then unlinked untimed (mountpoint-s3's
time_to_write_one_byte_file.fio: create_on_open, fsync_on_close, unlink_each_loop). Both
print {"samples_us": [...], "median_us", "p99_us", ...} into OUT.json. Timings use
time.perf_counter_ns; the Python around each call costs the same on every peer.
"""

import json
import os
import statistics
import sys
import time


def summary(samples):
    """Median, p99 (nearest rank) and count of a list of microsecond samples."""
    ordered = sorted(samples)
    rank = max(0, -(-99 * len(ordered) // 100) - 1)
    return {"n": len(ordered), "median_us": statistics.median(ordered), "p99_us": ordered[rank],
            "samples_us": samples}


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cmd_ttfb(out, files):
    reads, totals = [], []
    for path in files:
        drop_caches()
        t0 = time.perf_counter_ns()
        fd = os.open(path, os.O_RDONLY)
        t1 = time.perf_counter_ns()
        got = os.read(fd, 1)
        t2 = time.perf_counter_ns()
        os.close(fd)
        t3 = time.perf_counter_ns()
        if len(got) != 1:
            sys.exit(f"anchors.py ttfb: {path}: read returned {len(got)} bytes")
        reads.append((t2 - t1) / 1000)
        totals.append((t3 - t0) / 1000)
    result = summary(reads)
    result["open_read"] = summary(totals)
    json.dump(result, open(out, "w"))


def cmd_create(out, directory, n):
    samples = []
    for i in range(n):
        path = os.path.join(directory, f"one-byte-{i:06}")
        t0 = time.perf_counter_ns()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x")
        os.fsync(fd)
        os.close(fd)
        samples.append((time.perf_counter_ns() - t0) / 1000)
        os.unlink(path)
    json.dump(summary(samples), open(out, "w"))


def cmd_mkdir(directory, n):
    os.makedirs(directory, exist_ok=True)
    for i in range(n):
        os.close(os.open(os.path.join(directory, f"f{i:07}"), os.O_WRONLY | os.O_CREAT, 0o644))


# measure -> (label, key in its JSON, unit, higher is better)
MEASURES = [
    ("ttfb_cold", "time to first byte, first read (read(2), median)", "median_us", "µs", False),
    ("ttfb_cold", "time to first byte, first read (read(2), p99)", "p99_us", "µs", False),
    ("ttfb_hot", "time to first byte, second read (read(2), median)", "median_us", "µs", False),
    ("ls", "`ls -f` of the big directory (median)", "seconds", "s", False),
    ("create", "one-byte create + fsync + close (median)", "median_us", "µs", False),
    ("create", "one-byte create + fsync + close (p99)", "p99_us", "µs", False),
    ("seqread1", "sequential read, 1 thread", "mib_s", "MiB/s", True),
    ("seqread4", "sequential read, 4 threads", "mib_s", "MiB/s", True),
]


def load(outdir, peer, measure):
    path = os.path.join(outdir, f"{peer}.{measure}.json")
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def cell(value, unit):
    if value is None:
        return None
    if unit == "s":
        return f"{value:.3f}"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def ratio(value, base, higher):
    """How many times the baseline's speed: >1 is faster than the baseline, for either unit."""
    if value is None or base in (None, 0) or value == 0:
        return ""
    r = value / base if higher else base / value
    return f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"


def cmd_table(outdir, peers):
    results = {}
    for peer in peers:
        results[peer] = {}
        for measure, _, key, _, _ in MEASURES:
            data = load(outdir, peer, measure)
            if data is not None:
                results[peer][measure] = data
    json.dump(results, open(os.path.join(outdir, "results.json"), "w"), indent=1)
    lines = ["| measure | unit | " + " | ".join(peers) + " |", "|---|---|" + "---:|" * len(peers)]
    for measure, label, key, unit, higher in MEASURES:
        row = []
        for peer in peers:
            data = results[peer].get(measure)
            if data is None:
                row.append("n/a")
            elif "error" in data or "skipped" in data:
                row.append("ERR" if "error" in data else "skip")
            else:
                row.append(cell(data.get(key), unit))
        lines.append(f"| {label} | {unit} | " + " | ".join(row) + " |")
    lines += ["", "Speed as a multiple of the local disk's / of the FUSE floor's (>1: faster; "
              "for latencies, the baseline's time divided by the peer's):", "",
              "| measure | " + " | ".join(peers) + " |", "|---|" + "---:|" * len(peers)]
    for measure, label, key, unit, higher in MEASURES:
        def value(peer):
            data = results.get(peer, {}).get(measure) or {}
            return data.get(key)
        row = []
        for peer in peers:
            v = value(peer)
            row.append(f"{ratio(v, value('local'), higher) or '-'} / {ratio(v, value('floor'), higher) or '-'}")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    notes = []
    for peer in peers:
        for measure, data in results[peer].items():
            for k in ("error", "skipped"):
                if k in data:
                    notes.append(f"- {peer} {measure}: {k}: {data[k]}")
    lines += [""] + sorted(set(notes)) if notes else []
    table = "\n".join(lines) + "\n"
    open(os.path.join(outdir, "table.md"), "w").write(table)
    sys.stdout.write(table)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ttfb":
        cmd_ttfb(args[0], args[1:])
    elif cmd == "create" and len(args) == 3:
        cmd_create(args[0], args[1], int(args[2]))
    elif cmd == "mkdir" and len(args) == 2:
        cmd_mkdir(args[0], int(args[1]))
    elif cmd == "table":
        cmd_table(args[0], args[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
