#!/usr/bin/env python3
"""benches/metacpu.py MOUNTPOINT DAEMON_PID [--files N] [--rounds R] [--json]

What one metadata operation costs the FUSE server that answers it: creates N empty files in
100 directories under MOUNTPOINT, renames each, deletes each, and reports per phase the rate,
the wall time per operation, the server's CPU time per operation (user + system, from
/proc/PID/stat, so the kernel's side of the FUSE round trip is in it) and its context switches
per operation (all threads). Run it on tierfs and on the no-work FUSE floor
(`fuse-floor`) in turn to see how much of tierfs's time per operation is its own work and how
much is the round trip every FUSE filesystem pays. A benchmark run by hand, never a test.
"""
import argparse
import json
import os
import time


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid):
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
        except FileNotFoundError:
            pass  # a thread that ended while we counted
    return total


def phase(pid, name, fn, items):
    c0, x0, t0 = cpu_seconds(pid), context_switches(pid), time.perf_counter()
    for p in items:
        fn(p)
    wall = time.perf_counter() - t0
    n = len(items)
    return {
        "phase": name,
        "ops": n,
        "ops_s": round(n / wall),
        "wall_us_per_op": round(wall * 1e6 / n, 1),
        "server_cpu_us_per_op": round((cpu_seconds(pid) - c0) * 1e6 / n, 1),
        "ctxsw_per_op": round((context_switches(pid) - x0) / n, 2),
    }


def one_round(root, pid, files):
    top = os.path.join(root, f"metacpu-{time.time_ns()}")
    os.mkdir(top)
    for i in range(100):
        os.mkdir(os.path.join(top, str(i)))
    paths = [os.path.join(top, str(i % 100), f"f{i}") for i in range(files)]
    out = [
        phase(pid, "create", lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)), paths),
        phase(pid, "rename", lambda p: os.rename(p, p + ".r"), paths),
        phase(pid, "delete", lambda p: os.unlink(p + ".r"), paths),
    ]
    for i in range(100):
        os.rmdir(os.path.join(top, str(i)))
    os.rmdir(top)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("mountpoint")
    ap.add_argument("pid", type=int, help="the PID of the FUSE server answering the mount")
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON object per phase and round")
    a = ap.parse_args()
    for r in range(a.rounds):
        for row in one_round(a.mountpoint, a.pid, a.files):
            row["round"] = r + 1
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"round {r + 1} {row['phase']:7s} {row['ops_s']:7d} ops/s  wall {row['wall_us_per_op']:6.1f} us/op"
                    f"  server cpu {row['server_cpu_us_per_op']:6.1f} us/op  {row['ctxsw_per_op']:5.2f} ctxsw/op",
                    flush=True,
                )


if __name__ == "__main__":
    main()
