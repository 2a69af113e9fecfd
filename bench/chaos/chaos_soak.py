"""Chaos soak and dead-worker detection figures (release checks; minutes, prints counts).

  python bench/chaos/chaos_soak.py [--duration-s 300] [--clients 4]
      The scenario of tests/reliability/chaos.py (3 rl-workers + rl-router: one worker
      SIGKILLed and restarted every ~2 s, one SIGSTOPped and resumed, admin cycles pause retract
      -> update from disk -> continue) for the given time; prints the counts every second and
      every violated invariant at the end (exit status 1 if any).

  python bench/chaos/chaos_soak.py --detection [--black-holes 10]
      Time from SIGKILL of a worker to the router listing it DEAD, with and without N
      black-hole addresses (listeners that never accept) in the pool: health checks run
      concurrently (up to 32 at once), so the figure does not grow with the pool up to that.

Needs a build (build/bin/rl-worker, rl-router) and the venv (scripts/venv).
"""

import argparse
import socket
import sys
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration-s", type=float, default=300.0)
    p.add_argument("--clients", type=int, default=4)
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
    counts, violations = chaos.run(args.duration_s, args.clients, verbose=True)
    print("final:", counts)
    for v in violations:
        print("VIOLATION:", v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
