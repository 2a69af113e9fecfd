"""Requests/s and p50/p99 latency of /v1/completions through the Shepherd Model Gateway (smg,
pinned in requirements.txt) against rl.v1.Worker.Generate on the same worker directly: the
same prompts (SMG tokenizes the text without special tokens; the direct calls send those ids),
greedy, ignore_eos, the same number of new tokens, the same client concurrency. One run.

  .venv/bin/python bench/smg/smg_bench.py [--requests 400] [--concurrency 8] [--max-tokens 32]
"""

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROMPTS = ["Once upon a time", "The little dog", "One day, Lily went to the park",
           "Tom had a red ball", "The sun was hot and the birds", "Mom said to Ben",
           "There was a big tree", "The cat saw a bird and"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def run(name, fn, n, concurrency):
    latencies = [0.0] * n
    tokens = [0] * n

    def one(i):
        t0 = time.perf_counter()
        tokens[i] = fn(i)
        latencies[i] = time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    p50 = lat[len(lat) // 2] * 1e3
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
    print(f"{name:<34} {n / wall:8.1f} req/s   p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   "
          f"{sum(tokens)} output tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model", default=str(ROOT.parent / "shared" / "models" / "stories260K"))
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    if not 1 <= args.requests <= 100000 or not 1 <= args.concurrency <= 256:
        sys.exit("--requests in [1, 100000], --concurrency in [1, 256]")
    build = Path(args.build)
    from rlfleet import Client  # the venv's (scripts/venv installs it)

    worker = subprocess.Popen([str(build / "bin" / "rl-worker"), "--model", args.model,
                               "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    smg = None
    try:
        address = worker.stdout.readline().split()[-1]
        port = free_port()
        smg = subprocess.Popen(
            [str(Path(sys.executable).parent / "smg"), "launch", "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(free_port()), "--worker-urls", f"grpc://{address}",
             "--model-path", args.model, "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/v1/completions"
        body = lambda i: {"model": args.model, "prompt": PROMPTS[i % len(PROMPTS)],
                          "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
        deadline = time.monotonic() + 90
        while True:
            try:
                post(url, body(0), timeout=5)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline or smg.poll() is not None:
                    sys.exit("smg did not come up")
                time.sleep(0.25)

        ids = []
        for text in PROMPTS:
            out = subprocess.run([str(build / "bin" / "rlctl"), "--json", "tokenize",
                                  "--tokenizer", args.model, "--no-special", "--text", text],
                                 capture_output=True, text=True, check=True).stdout
            ids.append(json.loads(out)["ids"])
        local = threading.local()

        def direct(i):
            if not hasattr(local, "client"):
                local.client = Client(address, via="worker")
            final = local.client.generate(input_ids=ids[i % len(ids)],
                                          max_new_tokens=args.max_tokens, temperature=0,
                                          ignore_eos=True).one()
            return len(final.output_ids)

        def through_smg(i):
            return post(url, body(i))["usage"]["completion_tokens"]

        print(f"{args.requests} requests, {args.concurrency} concurrent, {args.max_tokens} new "
              f"tokens each, greedy, model {Path(args.model).name}, one run")
        for _ in range(min(args.requests, 32)):  # warm both paths
            direct(0)
            through_smg(0)
        run("rl.v1.Worker.Generate (direct)", direct, args.requests, args.concurrency)
        run("/v1/completions through SMG", through_smg, args.requests, args.concurrency)
    finally:
        if smg is not None:
            stop(smg)
        stop(worker)


if __name__ == "__main__":
    main()
