#!/usr/bin/env python3
"""Side-by-side CPU throughput: our runner_bench against llama.cpp on the same checkpoint.

Builds nothing. Runs our `runner_bench` on a safetensors checkpoint and, when given, llama.cpp's
`llama-bench` / `llama-batched-bench` (from --llama-cpp, a build folder or its bin/) on a GGUF
of the same checkpoint, then prints one table with the ratios (ours / llama.cpp, > 1 is faster):

  batch-1 decode at 1 and 2 threads   runner_bench --batches 1      | llama-bench -p 0 -n 128
                                      (both 128 timed tokens after untimed warm-up steps:
                                      --decode-steps 128, --decode-warmup 2 | its warm-up run)
  prefill of 32 and 512 tokens        runner_bench --prompt-len P   | llama-bench -p P -n 0
                                      (both the mean of 5 timed runs: --prefill-reps 5 | -r 5)
  batched decode at 16 and 64 seqs    runner_bench --batches B      | llama-batched-bench -npl B

Example (the 0.5B checkpoint of issue 21):
  rlctl make-model --arch llama --size 0.5b --seed 1 --out /tmp/llama05
  python3 bench/runner/side_by_side.py --model /tmp/llama05 \\
      --llama-cpp /work/llama.cpp/build --gguf /tmp/llama05.bf16.gguf
Without --llama-cpp/--gguf only our figures are printed. Every figure is measured in --rounds
rounds (default 3, ours and theirs alternating) and printed as best and median, since a shared
machine is noisy; the ratios compare best with best and median with median. llama.cpp runs with
each --llama-fa setting (default: flash attention off and on) and keeps its faster figure.
--bf16-products runs ours in that mode (not exact; llama.cpp's bf16 path rounds x to bf16 too).
The header names what it ran on: the CPU model, its SIMD flags, the load average, the kernels our
runner chose on it and the llama.cpp version.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys

BATCH_LINE = re.compile(
    r"batch\s+(\d+): prefill\s+([\d.]+) tok/s .*?decode\s+([\d.]+) tok/s "
    r"\(([\d.]+) ms/step; bound ([\d.]+) ms = (\d+)%")
READ_LINE = re.compile(r"read bandwidth \((\d+) threads.*?: ([\d.]+) GB/s read")
KERNELS_LINE = re.compile(r"^cpu kernels: (.*)$", re.M)
# The flags that decide which kernels can run (lscpu / /proc/cpuinfo spelling).
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512dq",
              "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
              "amx_bf16", "amx_int8")


def cpu_description():
    """'MODEL (family F model M, N CPUs); SIMD flags: ...' from /proc/cpuinfo (Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return f"{platform.processor() or platform.machine()} (no /proc/cpuinfo)"
    first = text.split("\n\n")[0]
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    have = [f for f in SIMD_FLAGS if f in flags]
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model "
            f"{fields.get('model', '?')}, {os.cpu_count()} CPUs); SIMD flags: "
            f"{' '.join(have) or 'none of ' + ' '.join(SIMD_FLAGS)}")


def run(cmd, timeout):
    """Runs cmd, returns its stdout; exits with a clear message when it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"side_by_side: {' '.join(cmd)}: {e}")
    if p.returncode != 0:
        sys.exit(f"side_by_side: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


# Batch-1 decode: timed tokens on both sides (llama-bench's -n). A few hundred milliseconds of
# steps (32 at 2 threads) swung by 25% between rounds with a single hiccup of the machine.
BATCH1_STEPS = 128


def ours(args, threads, batches, prompt_len, steps, prefill_reps=1):
    """{batch: (prefill tok/s, decode tok/s, % of read bound)} and the read bandwidth (GB/s)."""
    cmd = [args.runner_bench, "--model", args.model, "--threads", str(threads),
           "--batches", ",".join(map(str, batches)), "--prompt-len", str(prompt_len),
           "--decode-steps", str(steps), "--prefill-reps", str(prefill_reps)]
    if args.bf16_products:
        cmd.append("--bf16-products")
    out = run(cmd, args.timeout)
    kernels = KERNELS_LINE.search(out)
    if kernels and not args.kernels_line:
        args.kernels_line = kernels[1]
    rows = {int(m[1]): (float(m[2]), float(m[3]), int(m[6])) for m in BATCH_LINE.finditer(out)}
    bw = READ_LINE.search(out)
    if len(rows) != len(batches) or bw is None:
        sys.exit(f"side_by_side: unexpected runner_bench output:\n{out}")
    return rows, float(bw[2])


def tool(args, name):
    for sub in ("bin", ""):
        path = os.path.join(args.llama_cpp, sub, name)
        if os.access(path, os.X_OK):
            return path
    sys.exit(f"side_by_side: {name} not found under {args.llama_cpp} (or its bin/)")


def llama_bench(args, threads, prompt, gen):
    """tokens/s of one llama-bench test (pp `prompt` or tg `gen`), the best over --llama-fa."""
    fa = ",".join("1" if f == "on" else "0" for f in args.llama_fa)
    out = run([tool(args, "llama-bench"), "-m", args.gguf, "-t", str(threads), "-p", str(prompt),
               "-n", str(gen), "-r", "1", "-fa", fa, "-o", "json"], args.timeout)
    try:
        tests = json.loads(out)
        return max(float(t["avg_ts"]) for t in tests)
    except (ValueError, KeyError, TypeError) as e:
        sys.exit(f"side_by_side: unexpected llama-bench output ({e}):\n{out[-2000:]}")


def llama_batched(args, threads, prompt, gen, batches):
    """{batch: decode tok/s (S_TG)} from llama-batched-bench's table, best over --llama-fa."""
    best = {}
    for fa in args.llama_fa:
        for b, tps in llama_batched_once(args, threads, prompt, gen, batches, fa).items():
            best[b] = max(best.get(b, 0.0), tps)
    return best


def llama_batched_once(args, threads, prompt, gen, batches, fa):
    ctx = max(batches) * (prompt + gen) + 64
    out = run([tool(args, "llama-batched-bench"), "-m", args.gguf, "-t", str(threads),
               "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(gen),
               "-npl", ",".join(map(str, batches)), "-fa", fa], args.timeout)
    header, rows = None, {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = cells
        elif header and len(cells) == len(header) and cells[0].isdigit():
            rows[int(cells[header.index("B")])] = float(cells[header.index("S_TG t/s")])
    if sorted(rows) != sorted(batches):
        sys.exit(f"side_by_side: unexpected llama-batched-bench output:\n{out[-2000:]}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="our checkpoint folder (safetensors)")
    ap.add_argument("--runner-bench", default="build/bin/runner_bench")
    ap.add_argument("--llama-cpp", help="llama.cpp build folder (with bin/llama-bench)")
    ap.add_argument("--gguf", help="GGUF of the same checkpoint, for llama.cpp")
    ap.add_argument("--threads", default="1,2", help="thread counts for batch-1 decode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=32,
                    help="timed steps of the batched decode rows (batch 1: 128, as llama-bench)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per command")
    ap.add_argument("--llama-fa", default="off,on",
                    help="llama.cpp flash-attention settings to try (on/off), the best is kept")
    ap.add_argument("--bf16-products", action="store_true",
                    help="ours in bf16-products mode (runner_bench --bf16-products; not exact)")
    args = ap.parse_args()
    args.kernels_line = ""
    args.llama_fa = args.llama_fa.split(",")
    if not args.llama_fa or any(f not in ("on", "off") for f in args.llama_fa):
        sys.exit("side_by_side: --llama-fa takes on and/or off, comma-separated")
    if (args.llama_cpp is None) != (args.gguf is None):
        sys.exit("side_by_side: --llama-cpp and --gguf go together")
    if args.rounds < 1 or args.decode_steps < 1:
        sys.exit("side_by_side: --rounds and --decode-steps must be positive")
    threads = [int(t) for t in args.threads.split(",")]
    top = max(threads)
    theirs = args.gguf is not None
    cpu = cpu_description()
    llama_version = ""
    if theirs:
        try:  # llama-bench --version prints to stderr
            v = subprocess.run([tool(args, "llama-bench"), "--version"], capture_output=True,
                               text=True, timeout=60, check=False)
            llama_version = ((v.stdout + v.stderr).strip().splitlines() or ["?"])[0]
        except (OSError, subprocess.TimeoutExpired) as e:
            llama_version = f"? ({e})"
    loads = []
    print(f"cpu: {cpu}", file=sys.stderr, flush=True)

    seen = {}  # row name -> [[ours...], [theirs...], [notes...]]

    def keep(name, value, col, note=""):
        row = seen.setdefault(name, [[], [], []])
        row[col].append(value)
        print(f"  {name}: {('ours', 'llama.cpp')[col]} {value:.1f}", file=sys.stderr, flush=True)
        if note:
            row[2].append(note)

    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}: load average {loads[-1]:.1f}", file=sys.stderr)
        for t in threads:
            rows, bw = ours(args, t, [1], 32, BATCH1_STEPS)
            keep(f"decode, batch 1, {t} thr (tok/s)", rows[1][1], 0,
                 f"{rows[1][2]}% of {bw:.1f} GB/s")
            if theirs:
                keep(f"decode, batch 1, {t} thr (tok/s)", llama_bench(args, t, 0, BATCH1_STEPS), 1)
        for p in (32, 512):
            # The mean of 5 timed prefills, as llama-bench's default -r 5 reports its mean.
            rows, _ = ours(args, top, [1], p, 1, prefill_reps=5)
            keep(f"prefill {p} tokens, {top} thr (tok/s)", rows[1][0], 0)
            if theirs:
                keep(f"prefill {p} tokens, {top} thr (tok/s)", llama_bench(args, top, p, 0), 1)
        rows, _ = ours(args, top, [16, 64], 32, args.decode_steps)
        lb = llama_batched(args, top, 32, args.decode_steps, [16, 64]) if theirs else {}
        for b in (16, 64):
            keep(f"decode, {b} seqs, {top} thr (tok/s)", rows[b][1], 0)
            if theirs:
                keep(f"decode, {b} seqs, {top} thr (tok/s)", lb[b], 1)

    loads.append(os.getloadavg()[0])
    print(f"cpu: {cpu}")
    print(f"ours: {args.runner_bench}"
          + (" --bf16-products (not exact)" if args.bf16_products else " (exact float32)")
          + f"; kernels: {args.kernels_line or '?'}")
    if theirs:
        print(f"llama.cpp: {llama_version}; {args.llama_cpp} on {args.gguf} (flash attention: "
              f"best of {'/'.join(args.llama_fa)})")
    print(f"{args.rounds} rounds, best / median; model {args.model}; load average per round "
          f"{', '.join(f'{x:.1f}' for x in loads)} (1-minute, at each round's start and the end)"
          + ("" if theirs else "; no llama.cpp given"))
    print(f"| {'':38} | {'ours':>13} | {'llama.cpp':>13} | {'ratio':>11} | "
          "ours: % of the read bound (read GB/s) per round")
    print(f"|{'-' * 40}|{'-' * 15}|{'-' * 15}|{'-' * 13}|------")
    for name, (o, t, notes) in seen.items():
        ob, om = max(o), statistics.median(o)
        their, ratio = f"{'-':>13}", f"{'-':>11}"
        if theirs:
            tb, tm = max(t), statistics.median(t)
            their = f"{tb:6.1f}/{tm:6.1f}"
            ratio = f"{ob / tb:5.2f}/{om / tm:5.2f}" if tb > 0 and tm > 0 else ratio
        print(f"| {name:38} | {ob:6.1f}/{om:6.1f} | {their} | {ratio} | {'; '.join(notes)}")


if __name__ == "__main__":
    main()
