#!/usr/bin/env python3
"""benches/metacpu.py MOUNTPOINT DAEMON_PID [--files N] [--rounds R] [--pin MODE] [--json]

What one metadata operation costs the FUSE server that answers it: creates N empty files in
100 directories under MOUNTPOINT, renames each, deletes each, and reports per phase the rate,
the wall time per operation, the server's CPU time per operation (user + system, from
/proc/PID/stat, so the kernel's side of the FUSE round trip is in it) and its context switches
per operation (all threads). Run it on tierfs and on the no-work FUSE floor
(`fuse-floor`) in turn to see how much of tierfs's time per operation is its own work and how
much is the round trip every FUSE filesystem pays. A benchmark run by hand, never a test.

`--pin` places the two sides, because on a VM where one vCPU wakes another by an interrupt
that exits to the hypervisor, where the scheduler puts them decides the rate more than either
side's work does: `same` puts this process and every thread of the server on CPU 0 (each
round trip is a switch on one CPU, so each side's own work shows in full), `split` puts the
server on CPU 0 and this process on CPU 1 (every round trip wakes the other CPU), `none`
(default) leaves them to the scheduler, as `compare.sh` does. The server's threads stay
pinned after the run: use a mount made for the bench.
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


def pin(pid, mode):
    """Pins this process and every thread of `pid` as `mode` says (see the module's doc)."""
    if mode == "none":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 and mode == "split":
        raise SystemExit("metacpu.py: --pin split needs two CPUs")
    server, client = cpus[0], cpus[0] if mode == "same" else cpus[1]
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(task), {server})
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, {client})


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
    ap.add_argument("--pin", choices=["none", "same", "split"], default="none",
                    help="same: both sides on one CPU; split: server and client on two; none: the scheduler's choice")
    ap.add_argument("--json", action="store_true", help="one JSON object per phase and round")
    a = ap.parse_args()
    pin(a.pid, a.pin)
    for r in range(a.rounds):
        for row in one_round(a.mountpoint, a.pid, a.files):
            row["round"] = r + 1
            row["pin"] = a.pin
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
