"""Chaos soak and dead-worker detection figures (release checks; minutes, prints counts).

  python bench/chaos/chaos_soak.py [--duration-s 300] [--clients 4] [--report-every-s 10]
                                   [--rss-every-s 10] [--rss-print-every-s 300]
                                   [--rss-csv PATH] [--warmup-s 300]
      The scenario of tests/reliability/chaos.py (3 rl-workers + rl-router: one worker
      SIGKILLed and restarted every ~2 s, one SIGSTOPped and resumed, admin cycles pause retract
      -> update from disk -> continue) for the given time; prints the counts every
      --report-every-s and every violated invariant at the end (exit status 1 if any).
      Memory: the resident set (VmRSS) of the router and of every worker is sampled every
      --rss-every-s (to --rss-csv if given), printed at the start, every --rss-print-every-s
      and at the end; then, per process that lived through the run (the router, the stopped
      worker, the untouched one; the killed worker restarts every ~2 s and is shown only), the
      least-squares slope of RSS over time after --warmup-s and a verdict: "flat" when the
      fitted growth over that window is under max(4 MiB, 5 % of its mean), else "GROWING"
      (exit status 2 if any process grows and no invariant was violated).

  python bench/chaos/chaos_soak.py --detection [--black-holes 10]
      Time from SIGKILL of a worker to the router listing it DEAD, with and without N
      black-hole addresses (listeners that never accept) in the pool: health checks run
      concurrently (up to 32 at once), so the figure does not grow with the pool up to that.

Needs a build (build/bin/rl-worker, rl-router) and the venv (scripts/venv).
"""

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "reliability"))
import chaos  # noqa: E402  (puts tests/testing on sys.path; rlfleet is the venv's)
from chaos import Client, start_fixed_worker  # noqa: E402
from rlfleet.proto import router_pb2  # noqa: E402
from rltest import start_router  # noqa: E402


def detection_time(num_holes, log):
    holes = []
    for _ in range(num_holes):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        holes.append(s)
    w = start_fixed_worker(log)
    router = start_router([w] + [f"127.0.0.1:{s.getsockname()[1]}" for s in holes],
                          "--health-interval-ms", "500", "--health-timeout-ms", "1000",
                          "--health-failures", "1", log=log)
    try:
        client = Client(router.address, timeout=30)
        time.sleep(1.5)
        w.kill()
        start = time.monotonic()
        while time.monotonic() - start < 120:
            listing = client.list_workers()
            state = {x.address: x.state for x in listing.workers}[w.address]
            if state == router_pb2.WORKER_STATE_DEAD:
                return time.monotonic() - start
            time.sleep(0.02)
        return float("nan")
    finally:
        router.stop()
        w.stop()
        for s in holes:
            s.close()


def rss_kib(pid):
    """VmRSS of `pid` in KiB, or None when it is gone (the killed worker between restarts)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def fit_slope(points):
    """Least-squares slope (y per x) of [(x, y)]; 0 with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


class RssSampler:
    """Samples the VmRSS of the fleet's processes on a thread: the router and every worker
    (`workers[0]` is the one chaos.py kills and restarts: its current pid is read each time)."""

    NAMES = ("router", "worker0 (killed/restarted)", "worker1 (stopped/resumed)", "worker2")
    STEADY = ("router", "worker1 (stopped/resumed)", "worker2")

    def __init__(self, every_s, print_every_s, csv_path):
        self.every_s = every_s
        self.print_every_s = print_every_s
        self.csv = open(csv_path, "w") if csv_path else None
        self.samples = {name: [] for name in self.NAMES}  # name -> [(t_s, KiB)]
        self.stop = threading.Event()
        self.thread = None
        self.t0 = None

    def start(self, router, workers):
        self.procs = [router] + list(workers)
        self.t0 = time.monotonic()
        if self.csv:
            self.csv.write("t_s," + ",".join(n.split()[0] + "_kib" for n in self.NAMES) + "\n")
        self.sample(print_it=True, label="start")
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def sample(self, print_it=False, label=""):
        t = time.monotonic() - self.t0
        row = []
        for name, server in zip(self.NAMES, self.procs):
            kib = rss_kib(server.proc.pid)
            row.append(kib)
            if kib is not None:
                self.samples[name].append((t, kib))
        if self.csv:
            self.csv.write(f"{t:.1f}," + ",".join("" if k is None else str(k) for k in row) + "\n")
            self.csv.flush()
        self.last = (t, row)
        if print_it:
            self.print_row(t, row, label)

    def print_row(self, t, row, label=""):
        text = ", ".join(f"{n.split()[0]} {'-' if k is None else f'{k / 1024:.1f}'} MiB"
                         for n, k in zip(self.NAMES, row))
        print(f"RSS [{label or f'{t:6.0f} s'}] {text}", flush=True)

    def loop(self):
        next_print = time.monotonic() + self.print_every_s
        while not self.stop.wait(self.every_s):
            now = time.monotonic()
            self.sample(print_it=now >= next_print)
            if now >= next_print:
                next_print += self.print_every_s

    def halt(self):
        """Stops sampling (before the fleet is stopped)."""
        self.stop.set()
        if self.thread:
            self.thread.join()

    def finish(self, warmup_s):
        """Prints the last sample and the per-process verdicts; True if any grows."""
        self.halt()
        if self.t0 is None:
            return False
        t, row = self.last  # the last sample taken while the fleet ran
        self.print_row(t, row, f"end, {t:.0f} s")
        if self.csv:
            self.csv.close()
        growing = False
        for name in self.NAMES:
            pts = self.samples[name]
            if not pts:
                continue
            kib = [k for _, k in pts]
            line = (f"RSS {name}: start {kib[0] / 1024:.1f} MiB, end {kib[-1] / 1024:.1f} MiB, "
                    f"min {min(kib) / 1024:.1f}, max {max(kib) / 1024:.1f}")
            if name not in self.STEADY:
                print(line + " (restarted every ~2 s: no verdict)", flush=True)
                continue
            steady = [(t, k) for t, k in pts if t >= warmup_s]
            if len(steady) < 2:
                steady = pts
            window_h = (steady[-1][0] - steady[0][0]) / 3600
            slope = fit_slope(steady) / 1024 * 3600  # MiB per hour
            mean = sum(k for _, k in steady) / len(steady) / 1024
            fitted = slope * window_h
            limit = max(4.0, 0.05 * mean)
            verdict = "flat" if fitted < limit else "GROWING"
            growing |= verdict != "flat"
            print(f"{line}; after {steady[0][0]:.0f} s: {len(steady)} samples, mean {mean:.1f} "
                  f"MiB, fitted slope {slope:+.2f} MiB/h = {fitted:+.2f} MiB over "
                  f"{window_h * 60:.0f} min (limit {limit:.1f}): {verdict}", flush=True)
        return growing


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--report-every-s", type=float, default=1.0)
    p.add_argument("--rss-every-s", type=float, default=10.0)
    p.add_argument("--rss-print-every-s", type=float, default=300.0)
    p.add_argument("--rss-csv", default=None)
    p.add_argument("--warmup-s", type=float, default=300.0)
    p.add_argument("--detection", action="store_true")
    p.add_argument("--black-holes", type=int, default=10)
    args = p.parse_args()
    if args.detection:
        with open("/tmp/chaos-detection.log", "w") as log:
            for n in (0, args.black_holes):
                t = detection_time(n, log)
                print(f"dead-worker detection with {n:3d} black-hole workers in the pool: "
                      f"{t:.2f} s (interval 0.5 s, timeout 1 s, 1 failure)", flush=True)
        return 0
    sampler = RssSampler(args.rss_every_s, args.rss_print_every_s, args.rss_csv)
    counts, violations = chaos.run(args.duration_s, args.clients, verbose=True,
                                   on_start=sampler.start, on_stop=sampler.halt,
                                   report_every_s=args.report_every_s)
    growing = sampler.finish(min(args.warmup_s, args.duration_s / 4))
    print("final:", counts)
    for v in violations:
        print("VIOLATION:", v)
    return 1 if violations else 2 if growing else 0


if __name__ == "__main__":
    sys.exit(main())
