#!/usr/bin/env python3
"""Before / after: two engine_bench binaries run alternately, figures side by side.

Runs `--rounds` rounds; each round runs the baseline binary, then the current one (the order
flips every other round so neither always runs on a warmer machine), both with the same
engine_bench flags (default: the no_prefix scenario only, 256 concurrent requests on the made
tiny Llama). Prints, per binary, the min and median over rounds of the output tokens/s and of
the engine thread's CPU time per engine step (CLOCK_THREAD_CPUTIME_ID of the engine thread, a
figure a shared machine disturbs much less than wall time) and of the engine thread's whole CPU
time for the run (ms/step x steps: the requests arrive while the engine already runs, so the
number of steps varies a little from run to run, while the tokens are fixed), then the
after/before ratios.

  python3 bench/engine/compare.py --before /work/engine_bench.before \\
      --after build/bench/engine/engine_bench --rounds 5 -- --requests 256 --output 64
"""
import argparse
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^no_prefix\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)"
                 r"\s+(\d+)\s+([\d.]+)\s*$", re.M)


def run(binary, flags, timeout):
    """(out tok/s, engine-thread CPU ms per step, steps) of one no_prefix run."""
    cmd = [binary, "--scenarios", "no_prefix"] + flags
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"compare: {' '.join(cmd)}: {e}")
    if p.returncode != 0:
        sys.exit(f"compare: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    m = ROW.search(p.stdout)
    if m is None:
        sys.exit(f"compare: no no_prefix row with engine CPU time in the output of "
                 f"{binary}:\n{p.stdout[-2000:]}")
    return float(m[3]), float(m[8]), int(m[7])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="baseline engine_bench binary")
    ap.add_argument("--after", required=True, help="current engine_bench binary")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("flags", nargs="*", help="engine_bench flags (after --)")
    args = ap.parse_args()
    if args.rounds < 1 or args.rounds > 100:
        sys.exit("compare: --rounds must be in 1..100")
    res = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for which in order:
            tok_s, ms_step, steps = run(getattr(args, which), args.flags, args.timeout)
            res[which].append((tok_s, ms_step, ms_step * steps / 1e3))
            print(f"round {r + 1} {which:6s}: {tok_s:10.1f} out tok/s  {ms_step:8.4f} engine "
                  f"CPU ms/step  ({steps} steps, {ms_step * steps / 1e3:.3f} engine CPU s)",
                  flush=True)
    print(f"\n{'':8s} {'out tok/s best':>14s} {'median':>10s} {'eng ms/step best':>16s} "
          f"{'median':>10s} {'eng CPU s best':>15s} {'median':>10s}")
    summary = {}
    for which in ("before", "after"):
        tok = [x[0] for x in res[which]]
        ms = [x[1] for x in res[which]]
        cpu = [x[2] for x in res[which]]
        # Best throughput is the max; best CPU time is the min.
        summary[which] = (max(tok), statistics.median(tok), min(ms), statistics.median(ms),
                          min(cpu), statistics.median(cpu))
        print(f"{which:8s} {max(tok):14.1f} {statistics.median(tok):10.1f} {min(ms):16.4f} "
              f"{statistics.median(ms):10.4f} {min(cpu):15.3f} {statistics.median(cpu):10.3f}")
    b, a = summary["before"], summary["after"]
    print(f"{'after/before':>12s}: best tok/s x{a[0] / b[0]:.3f}, median tok/s "
          f"x{a[1] / b[1]:.3f}, best ms/step x{a[2] / b[2]:.3f}, median ms/step "
          f"x{a[3] / b[3]:.3f}, best engine CPU s x{a[4] / b[4]:.3f}, median x{a[5] / b[5]:.3f}")


if __name__ == "__main__":
    main()
