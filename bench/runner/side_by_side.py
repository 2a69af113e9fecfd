#!/usr/bin/env python3
"""Side-by-side CPU throughput: our runner_bench against llama.cpp on the same checkpoint.

Builds nothing. Runs our `runner_bench` on a safetensors checkpoint and, when given, llama.cpp's
`llama-bench` / `llama-batched-bench` (from --llama-cpp, a build folder or its bin/) on a GGUF
of the same checkpoint, then prints one table with the ratios (ours / llama.cpp, > 1 is faster):

  batch-1 decode at 1 and 2 threads   runner_bench --batches 1      | llama-bench -p 0 -n N
  prefill of 32 and 512 tokens        runner_bench --prompt-len P   | llama-bench -p P -n 0
  batched decode at 16 and 64 seqs    runner_bench --batches B      | llama-batched-bench -npl B

Example (the 0.5B checkpoint of issue 21):
  rlctl make-model --arch llama --size 0.5b --seed 1 --out /tmp/llama05
  python3 bench/runner/side_by_side.py --model /tmp/llama05 \\
      --llama-cpp /work/llama.cpp/build --gguf /tmp/llama05.bf16.gguf
Without --llama-cpp/--gguf only our figures are printed. Every figure is the best of --rounds
runs (default 3, ours and theirs alternating), since a shared machine is noisy.
"""
import argparse
import json
import os
import re
import subprocess
import sys

BATCH_LINE = re.compile(
    r"batch\s+(\d+): prefill\s+([\d.]+) tok/s .*?decode\s+([\d.]+) tok/s "
    r"\(([\d.]+) ms/step; bound ([\d.]+) ms = (\d+)%")
READ_LINE = re.compile(r"read bandwidth \((\d+) threads.*?: ([\d.]+) GB/s read")


def run(cmd, timeout):
    """Runs cmd, returns its stdout; exits with a clear message when it fails."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"side_by_side: {' '.join(cmd)}: {e}")
    if p.returncode != 0:
        sys.exit(f"side_by_side: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    return p.stdout


def ours(args, threads, batches, prompt_len, steps):
    """{batch: (prefill tok/s, decode tok/s, % of read bound)} and the read bandwidth (GB/s)."""
    out = run([args.runner_bench, "--model", args.model, "--threads", str(threads),
               "--batches", ",".join(map(str, batches)), "--prompt-len", str(prompt_len),
               "--decode-steps", str(steps)], args.timeout)
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
    """tokens/s of one llama-bench test (pp `prompt` or tg `gen`)."""
    out = run([tool(args, "llama-bench"), "-m", args.gguf, "-t", str(threads), "-p", str(prompt),
               "-n", str(gen), "-r", "1", "-o", "json"], args.timeout)
    try:
        tests = json.loads(out)
        return float(tests[0]["avg_ts"])
    except (ValueError, KeyError, IndexError) as e:
        sys.exit(f"side_by_side: unexpected llama-bench output ({e}):\n{out[-2000:]}")


def llama_batched(args, threads, prompt, gen, batches):
    """{batch: decode tok/s (S_TG)} from llama-batched-bench's table."""
    ctx = max(batches) * (prompt + gen) + 64
    out = run([tool(args, "llama-batched-bench"), "-m", args.gguf, "-t", str(threads),
               "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(prompt), "-ntg", str(gen),
               "-npl", ",".join(map(str, batches))], args.timeout)
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
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per command")
    args = ap.parse_args()
    if (args.llama_cpp is None) != (args.gguf is None):
        sys.exit("side_by_side: --llama-cpp and --gguf go together")
    if args.rounds < 1 or args.decode_steps < 1:
        sys.exit("side_by_side: --rounds and --decode-steps must be positive")
    threads = [int(t) for t in args.threads.split(",")]
    top = max(threads)
    theirs = args.gguf is not None

    best = {}  # row name -> [ours, theirs, note]

    def keep(name, value, col, note=""):
        row = best.setdefault(name, [0.0, 0.0, ""])
        row[col] = max(row[col], value)
        if note:
            row[2] = note

    for _ in range(args.rounds):
        for t in threads:
            rows, bw = ours(args, t, [1], 32, args.decode_steps)
            keep(f"decode, batch 1, {t} thr (tok/s)", rows[1][1], 0,
                 f"ours {rows[1][2]}% of the read bound ({bw:.1f} GB/s)")
            if theirs:
                keep(f"decode, batch 1, {t} thr (tok/s)", llama_bench(args, t, 0, 128), 1)
        for p in (32, 512):
            rows, _ = ours(args, top, [1], p, 1)
            keep(f"prefill {p} tokens, {top} thr (tok/s)", rows[1][0], 0)
            if theirs:
                keep(f"prefill {p} tokens, {top} thr (tok/s)", llama_bench(args, top, p, 0), 1)
        rows, _ = ours(args, top, [16, 64], 32, args.decode_steps)
        lb = llama_batched(args, top, 32, args.decode_steps, [16, 64]) if theirs else {}
        for b in (16, 64):
            keep(f"decode, {b} seqs, {top} thr (tok/s)", rows[b][1], 0)
            if theirs:
                keep(f"decode, {b} seqs, {top} thr (tok/s)", lb[b], 1)

    print(f"best of {args.rounds} rounds; model {args.model}"
          + (f"; llama.cpp {args.llama_cpp} on {args.gguf}" if theirs else "; no llama.cpp given"))
    print(f"| {'':38} | {'ours':>9} | {'llama.cpp':>9} | {'ratio':>6} | note")
    print(f"|{'-' * 40}|{'-' * 11}|{'-' * 11}|{'-' * 8}|------")
    for name, (o, t, note) in best.items():
        their = f"{t:9.1f}" if theirs else f"{'-':>9}"
        ratio = f"{o / t:6.2f}" if theirs and t > 0 else f"{'-':>6}"
        print(f"| {name:38} | {o:9.1f} | {their} | {ratio} | {note}")


if __name__ == "__main__":
    main()
