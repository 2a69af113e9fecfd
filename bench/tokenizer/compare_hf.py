#!/usr/bin/env python3
"""Runs Hugging Face `tokenizers` on the same workloads as tokenizer_bench and prints both
side by side (MB/s, tokens/s and the C++/HF speed-up).

  /tmp/venv-tok/bin/python bench/tokenizer/compare_hf.py --bench build/bin/tokenizer_bench \
      [--tokenizers ../shared/models/tokenizers] [--names qwen2,llama2] [--threads N]

Workloads (same text, same token counts):
  lines   every line encoded separately on one thread (HF: encode_batch with
          RAYON_NUM_THREADS=1, so no Python call per line is timed);
  whole   the whole file as one text, one thread;
  batch   all lines with encode_batch on N threads (HF: RAYON_NUM_THREADS=N);
  decode  each line's ids decoded separately, one thread (HF: decode_batch, 1 thread).
Each figure is the best of --repeat runs after a warm-up run.
"""

import argparse
import json
import os
import subprocess
import sys
import time


def split_lines(text):
    lines, start = [], 0
    while start < len(text):
        nl = text.find("\n", start)
        end = len(text) if nl < 0 else nl + 1
        lines.append(text[start:end])
        start = end
    return lines


def best_time(repeat, fn):
    result = fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def run_hf(args, threads_label):
    """Measures in this process; RAYON_NUM_THREADS was fixed by the parent before import."""
    from tokenizers import Tokenizer

    rows = []
    for name in args.names.split(","):
        tok = Tokenizer.from_file(os.path.join(args.tokenizers, name, "tokenizer.json"))
        for fname in args.files.split(","):
            with open(os.path.join(args.corpus, fname), encoding="utf-8", newline="") as f:
                text = f.read()
            nbytes = len(text.encode("utf-8"))
            lines = split_lines(text)
            if threads_label == 1:
                s, encs = best_time(args.repeat, lambda: tok.encode_batch(lines, add_special_tokens=False))
                ntok = sum(len(e.ids) for e in encs)
                rows.append((name, "lines", fname, 1, nbytes, ntok, s))
                s, enc = best_time(args.repeat, lambda: tok.encode(text, add_special_tokens=False))
                rows.append((name, "whole", fname, 1, nbytes, len(enc.ids), s))
                ids = [e.ids for e in encs]
                s, _ = best_time(args.repeat, lambda: tok.decode_batch(ids, skip_special_tokens=False))
                rows.append((name, "decode", fname, 1, nbytes, ntok, s))
            else:
                s, encs = best_time(args.repeat, lambda: tok.encode_batch(lines, add_special_tokens=False))
                rows.append((name, "batch", fname, threads_label, nbytes,
                             sum(len(e.ids) for e in encs), s))
    print(json.dumps(rows))


def parse_cpp(output):
    rows = {}
    for line in output.splitlines():
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        if fields.get("workload") in ("lines", "whole", "batch", "decode"):
            key = (fields["tokenizer"], fields["workload"], fields["file"])
            rows[key] = (float(fields["MB/s"]), float(fields["tokens/s"]), int(fields["tokens"]))
    return rows


def main():
    parser = argparse.ArgumentParser()
    data = os.environ.get("RL_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "models"))
    parser.add_argument("--bench", default="build/bin/tokenizer_bench")
    parser.add_argument("--tokenizers", default=os.path.join(data, "tokenizers"))
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--names", default="qwen2,llama2")
    parser.add_argument("--files", default="en_tiny_shakespeare.txt,zh_sanguo_yanyi.txt,mixed_blns.txt")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hf-worker", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.corpus is None:
        args.corpus = os.path.join(args.tokenizers, "..", "..", "corpus")
    if args.hf_worker:
        run_hf(args, args.hf_worker)
        return

    common = ["--tokenizers", args.tokenizers, "--corpus", args.corpus, "--names", args.names,
              "--files", args.files, "--repeat", str(args.repeat)]
    hf = {}
    for threads in (1, args.threads):
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
        out = subprocess.run([sys.executable, __file__, "--hf-worker", str(threads)] + common,
                             env=env, check=True, capture_output=True, text=True).stdout
        for name, workload, fname, _, nbytes, ntok, s in json.loads(out.strip().splitlines()[-1]):
            if workload == "batch" and threads == 1:
                continue
            hf[(name, workload, fname)] = (nbytes / s / 1e6, ntok / s, ntok)
    cpp_out = subprocess.run([args.bench, "--threads", str(args.threads)] + common, check=True,
                             capture_output=True, text=True).stdout
    cpp = parse_cpp(cpp_out)

    print("%-7s %-7s %-26s %10s %10s %12s %12s %7s %s" % (
        "tok", "work", "file", "cpp MB/s", "hf MB/s", "cpp tok/s", "hf tok/s", "speedup", "same #tokens"))
    for key in sorted(cpp):
        if key not in hf:
            continue
        c, h = cpp[key], hf[key]
        print("%-7s %-7s %-26s %10.2f %10.2f %12.0f %12.0f %6.1fx %s" % (
            key[0], key[1], key[2], c[0], h[0], c[1], h[1], c[0] / h[0], c[2] == h[2]))


if __name__ == "__main__":
    main()
