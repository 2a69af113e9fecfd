"""Agent episodes through the Shepherd Model Gateway (smg, pinned) in front of rl-router, side by
side with the same agent talking to SMG in front of the worker directly: per-turn latency
(median, p90) and episodes/s, the same T-turn chat episodes (the `openai` client, greedy or
sampled, the same max_tokens), one rl-worker. Then, for the router's episodes, the retokenization
drift: each branch sample exported by Router.GetEpisode against the final conversation's text
encoded from scratch (the way a trainer re-renders and re-tokenizes), counted, with the first
case shown (docs/episodes.md).

  .venv/bin/python bench/episodes/episode_bench.py [--episodes 40] [--turns 5] [--max-tokens 16]
      [--concurrency 4] [--temperature 1.0] [--model DIR] [--chat-template FILE]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The venv's installed rlfleet (scripts/venv) first: it carries the generated gRPC stubs.
sys.path.append(str(ROOT / "clients" / "python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def listening(proc, label=""):
    want = f"{label} listening on " if label else "listening on "
    line = proc.stdout.readline()
    if not line.startswith(want):
        sys.exit(f"expected '{want}...', got {line!r}")
    return line.split()[-1]


def start_smg(target, model, template, log):
    port = free_port()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "smg"), "launch", "--host", "127.0.0.1", "--port",
         str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
         "--worker-urls", f"grpc://{target}", "--model-path", model, "--chat-template", template],
        stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}/v1"


def wait_ready(client, model, proc):
    import openai
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("smg did not come up")
        try:
            client.chat.completions.create(model=model, max_tokens=1,
                                           messages=[{"role": "user", "content": "hi"}])
            return
        except (openai.APIConnectionError, openai.APIStatusError):
            time.sleep(0.25)


def run_episodes(name, client, model, args, prefix):
    turn_latencies = []

    def episode(i):
        messages = [{"role": "user", "content": f"Tell me story number {i}."}]
        for t in range(args.turns):
            t0 = time.perf_counter()
            r = client.chat.completions.create(
                model=model, messages=messages, max_tokens=args.max_tokens,
                temperature=args.temperature,
                extra_headers={"x-request-id": f"episode={prefix}{i};seed={i * 100 + t}"})
            turn_latencies.append(time.perf_counter() - t0)
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": f"Go on ({t})."}]
        return messages

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        conversations = list(pool.map(episode, range(args.episodes)))
    wall = time.perf_counter() - t0
    lat = sorted(turn_latencies)
    print(f"{name:<30} {args.episodes / wall:7.2f} episodes/s   turn p50 "
          f"{statistics.median(lat) * 1e3:7.2f} ms   p90 {lat[int(len(lat) * 0.9)] * 1e3:7.2f} ms")
    return conversations, statistics.median(lat)


def rlctl_json(build, *args, stdin=None):
    out = subprocess.run([str(build / "bin" / "rlctl"), "--json", *args], input=stdin,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--model", default=str(ROOT.parent / "shared" / "models" / "stories260K"))
    ap.add_argument("--chat-template",
                    default=str(ROOT / "tests" / "interop" / "smg" / "episode_template.jinja"))
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    if not (1 <= args.episodes <= 10000 and 1 <= args.turns <= 100 and
            1 <= args.concurrency <= 64 and 1 <= args.max_tokens <= 4096):
        sys.exit("--episodes [1, 10000], --turns [1, 100], --concurrency [1, 64], "
                 "--max-tokens [1, 4096]")
    build = Path(args.build)
    import grpc
    import openai
    from rlfleet._stubs import router_pb2, router_pb2_grpc

    procs = []
    log = open(os.devnull, "w")
    try:
        worker = subprocess.Popen([str(build / "bin" / "rl-worker"), "--model", args.model,
                                   "--port", "0"], stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(worker)
        worker_addr = listening(worker)
        router = subprocess.Popen([str(build / "bin" / "rl-router"), "--tokenizer", args.model,
                                   "--port", "0", "--worker", worker_addr, "--sglang-port", "0",
                                   "--health-interval-ms", "100"],
                                  stdout=subprocess.PIPE, stderr=log, text=True)
        procs.append(router)
        router_addr = listening(router)
        router_sglang = listening(router, "sglang")
        smg_router, url_router = start_smg(router_sglang, args.model, args.chat_template, log)
        procs.append(smg_router)
        smg_worker, url_worker = start_smg(worker_addr, args.model, args.chat_template, log)
        procs.append(smg_worker)
        via_router = openai.OpenAI(base_url=url_router, api_key="unused", max_retries=0)
        via_worker = openai.OpenAI(base_url=url_worker, api_key="unused", max_retries=0)
        wait_ready(via_router, args.model, smg_router)
        wait_ready(via_worker, args.model, smg_worker)
        print(f"{args.episodes} episodes x {args.turns} turns, {args.max_tokens} tokens/turn, "
              f"temperature {args.temperature}, concurrency {args.concurrency}")
        _, direct = run_episodes("SMG -> rl-worker", via_worker, args.model, args, "direct")
        convs, routed = run_episodes("SMG -> rl-router -> rl-worker", via_router, args.model,
                                     args, "bench")
        print(f"{'added per turn (p50)':<30} {(routed - direct) * 1e3:7.2f} ms")

        stub = router_pb2_grpc.RouterStub(grpc.insecure_channel(router_addr))
        exported, forks = [], 0
        for i in range(args.episodes):
            e = stub.GetEpisode(router_pb2.GetEpisodeRequest(episode_id=f"bench{i}"))
            forks += len(e.samples) > 1
            exported += [(i, list(s.trajectory.tokens), list(s.trajectory.loss_mask))
                         for s in e.samples]
        # One rlctl call each way for every sample (--jsonl: texts with newlines).
        texts = rlctl_json(build, "detokenize", "--tokenizer", args.model, "--skip-special",
                           stdin="".join(json.dumps(t) + "\n" for _, t, _ in exported))["texts"]
        fresh = rlctl_json(build, "tokenize", "--tokenizer", args.model, "--jsonl",
                           stdin="".join(json.dumps(t) + "\n" for t in texts))["ids"]
        drifted = 0
        for (i, tokens, mask), ids, text in zip(exported, fresh, texts):
            if ids == tokens:
                continue
            drifted += 1
            if drifted == 1:
                at = next((k for k, (a, b) in enumerate(zip(tokens, ids)) if a != b),
                          min(len(tokens), len(ids)))
                print(f"first drift: episode bench{i} at token {at}: exported "
                      f"{tokens[at:at + 4]} (mask {mask[at:at + 4]}), re-encoded "
                      f"{ids[at:at + 4]}, text {text[:80]!r}...")
        print(f"router episodes: {len(exported)} samples ({forks} episodes forked); {drifted} "
              f"differ from their text re-encoded from scratch (tests/interop/smg/"
              f"test_episode_drift.py counts against the re-rendered conversation)")
    finally:
        for p in reversed(procs):
            stop(p)


if __name__ == "__main__":
    main()
