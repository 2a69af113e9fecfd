"""Routing policies on a GRPO trace, in one run: rl-router (--policy round_robin, least_load,
affinity, cache_aware) and the pinned SMG gateway (--policy cache_aware, round_robin) in front of
the same three real rl-workers, each replaying the same trace.

The trace is one GRPO step of multi-turn RL as the issue describes it: `--groups` prompt groups
of `--n` 8 samples, each sample its own request (sharing the group's `group_id`), each sample
an episode of `--turns` 3 turns where a turn's prompt is the previous turn's prompt + its output
+ the feedback; every prompt starts with one shared system prompt, a group's samples share its
question. Two shapes (`--trace`):

- `retool` (the default): multi-turn tool-integrated math RL with a reasoning model, as verl's
  ReTool recipe runs it (recipe/retool: DAPO-Math-17k problems, a code sandbox as the tool,
  `max_turns=8`, `max_response_length=16384`, n=16; its Qwen3 variants think before each
  call). Lengths in tokens: system prompt ~150 (the chat template's tool header and the
  `code_interpreter` schema), question ~140 (a DAPO-Math-17k prompt: its answer-format
  instruction and the problem), ~2,048 generated a turn (the recipe's budget: 16,384 response
  tokens over up to 8 turns), ~50 of feedback (the sandbox's stdout in the tool-response
  wrapping). The bench runs those lengths divided by 16 (9 + 9 prompt tokens, `--max-tokens`
  128 a turn, 3 of feedback) so a run stays near a minute on 2 CPU cores.
- `math-tir`: the same shape at the lengths of verl's GSM8K multi-turn example
  (examples/sglang_multiturn: a `calc_gsm8k_reward` tool): system prompt ~100 (the example's
  system message, ~60 words, and the tool-call header), question ~100 (a GSM8K problem and the
  example's "Let's think step by step and output the final answer after `####`"), ~500
  generated a turn (`max_response_length=1024` over up to 5 assistant turns), ~50 of feedback
  ("Current parsed answer='72' reward=1.0" in the tool-response wrapping), divided by 8 (12 +
  12 prompt tokens, `--max-tokens` 62, 6 of feedback).

  For both: every length keeps its share, so the hit rates are those of the full lengths, and
  prefill and decode keep their proportions. 6 groups (a step has 32-512 prompts; 6 is enough
  that the group count is no bottleneck on 3 workers: 2 groups each), all 48 episodes in flight
  at once, as a rollout engine submits a step. A sticky policy misses only the feedback and the
  first turns (all in flight before anything is cached); round robin finds the shared prefix
  (system prompt and question) on every worker but an episode's history only on the third of
  its turns that land where the previous turn ran. The hit-rate ratio therefore grows with the
  generated share of a turn (retool, where a turn generates ~7x the shared prefix: ~2.1x;
  math-tir, 2.5x: ~1.8x), while the tokens/s gain shrinks as decode takes a larger share of the
  work.
- `search-r1`: Search-R1's search agent (which verl's SGLang multi-turn and SkyRL's SearchR1
  recipes reproduce): 128 generated tokens a turn (a short <think> and a <search> query; they cap
  a turn at 500) and a tool answer of 3 retrieved passages (`topk=3`) of `--followup-words` 120
  words, ~300 tokens (`max_obs_length=500`), a ~65-word system prompt (the tool protocol), a
  16-word question; 2 groups, 16 episodes in flight. The tool answers are new text for every
  policy, so a sticky policy hits ~65% and round robin ~47% (it finds the shared prefix
  everywhere): the hit-rate ratio is capped near 1.4x whatever the router does.

Sampling at temperature 1 with a seed per (group, sample, turn), `ignore_eos`. The workers run
`--page-size 1` (SGLang's default; rl-worker's is 16), so no cached prefix is rounded down to a
page. The skewed trace is the same with a routing key per episode, 80% of the episodes on 2 keys
(affinity and cache_aware key on it; the others ignore keys). Before each run the workers'
prefix caches are flushed and each gateway is fresh.

Per run it prints output tokens/s (wall clock of the replay), the workers' prefix-cache hit rate
(their rl_worker_cached_tokens_total / rl_worker_prompt_tokens_total over the run), each as a
ratio to round_robin's ("x rr"), the
prompt tokens they prefilled (prompt - cached: the work the cache did not save), p50 / p99
request latency, the load spread (max / mean of the workers' running + waiting requests, sampled
every 50 ms while any is busy, averaged) and the requests each worker served; with --rounds > 1
the medians over rounds (runs interleaved: round 1 of every row, then round 2, ...) and each
row's ratios to round_robin per round.

  .venv/bin/python bench/routing/grpo_trace_bench.py [--trace retool|math-tir|search-r1]
      [--model DIR] [--layers 8] [--groups N] [--n 8] [--turns 3] [--concurrency N]
      [--max-tokens N] [--system-words N] [--question-words N] [--followup-words N]
      [--threads 1] [--kv-cache-gb 2] [--page-size 1] [--policies LIST] [--rounds 1] [--seed 1]
      [--no-smg] [--no-skewed] [--quick]

Without --model it makes a Qwen3-0.6B-shaped model (`rlctl make-model --arch qwen3 --size 0.5b
--seed 1`) into BUILD/bench-models/qwen3-0.5b once, and runs its first `--layers` 8 of 28 layers
(BUILD/bench-models/qwen3-0.5b-8l, cut once): the same hidden size, heads and vocabulary, so
prefill and decode keep their proportions, at a third of the compute (stories260K's compute is
trivial, so its cache effects hardly show). Per run groups * n * turns requests (144 for
retool and math-tir, 48 for search-r1). `--quick` is the smallest run (1 group of 2 samples, 2 turns of 2
tokens), for the smoke test.
Servers listen on 127.0.0.1 port 0 (SMG, which takes no port 0, on a port found free); every
process is stopped at exit, on error, SIGINT and SIGTERM.
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from rltest import Server, free_port, prometheus, stop_process  # noqa: E402

OURS = ("round_robin", "least_load", "affinity", "cache_aware")
# Per trace, the defaults of the sizes not given on the command line (docstring: where each
# length comes from). retool's and math-tir's are in tokens (one-token words and newlines):
# the recipes' 150 / 140 / 2048 / 50 divided by 16 and 100 / 100 / 500 / 50 divided by 8.
TRACES = {
    "retool": {"groups": 6, "max_tokens": 128, "system_words": 9, "question_words": 9,
               "followup_words": 3},
    "math-tir": {"groups": 6, "max_tokens": 62, "system_words": 12, "question_words": 12,
                 "followup_words": 6},
    "search-r1": {"groups": 2, "concurrency": 16, "max_tokens": 128, "system_words": 20,
                  "question_words": 16, "followup_words": 120},
}
SMG_POLICIES = ("cache_aware", "round_robin")
WORDS = ("the of and to in is was for on that with as by at from his her an were which this "
         "reward policy model sample group step value token answer question proof number sum "
         "prime triangle circle area length square root angle equal each both other first "
         "second third last total count find show given let then thus hence solve check").split()

_procs = []  # Server / Popen objects to stop at exit, newest last
_tmp = tempfile.TemporaryDirectory(prefix="routing_bench_")


def stop_all():
    while _procs:
        p = _procs.pop()
        try:
            p.stop() if isinstance(p, Server) else stop_process(p)
        except Exception as e:  # keep stopping the others
            print(f"warning: stopping a process: {e}", file=sys.stderr)


def on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def words(rng, count, vocab=WORDS):
    return " ".join(rng.choice(vocab) for _ in range(count))


def tokens(rng, count, vocab):
    """`count` one-token words, each after a space."""
    return "".join(" " + rng.choice(vocab) for _ in range(count))


def one_token_words(model):
    """The words of WORDS that `model`'s tokenizer makes one token each after a space (a BPE
    vocabulary's "Ġword"), so retool's and math-tir's lengths are in tokens; all of WORDS if under 10 are."""
    try:
        with open(Path(model) / "tokenizer.json") as f:
            vocab = json.load(f)["model"]["vocab"]
    except (OSError, KeyError, ValueError):
        return WORDS
    one = [w for w in WORDS if "\u0120" + w in vocab]
    return one if len(one) >= 10 else WORDS


def count_tokens(args, text):
    """Tokens of `text` (rlctl tokenize, no special tokens), or -1."""
    r = subprocess.run([str(args.build / "bin" / "rlctl"), "tokenize", "--tokenizer",
                        str(args.model), "--text", text, "--no-special"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.count(",") + 1 if r.returncode == 0 and r.stdout.strip() else -1


def make_trace(args, skewed):
    """Groups: dicts of question, group id, routing keys, and per (sample, turn) feedback."""
    rng = random.Random(args.seed)
    if args.trace == "search-r1":
        system = ("System: answer the question. Reason step by step inside <think> and </think>; "
                  "to look something up, write <search> query </search> and the results come "
                  "back between <information> and </information>; give the final answer inside "
                  "<answer> and </answer>. " + words(rng, args.system_words) + "\n")
    else:  # lengths in tokens: one-token words, a newline after each piece
        system = tokens(rng, args.system_words - 1, args.vocab) + "\n"
    groups = []
    for g in range(args.groups):
        # Skewed: 80% of the episodes (samples) on 2 routing keys, the rest a key each.
        keys = [(f"hot-{rng.randrange(2)}" if rng.random() < 0.8 else f"key-{g}-{s}")
                if skewed else "" for s in range(args.n)]
        groups.append({
            "id": f"group-{g}", "keys": keys,
            "question": (f"User: {g}: " + words(rng, args.question_words) + "\nAssistant:"
                         if args.trace == "search-r1" else
                         tokens(rng, args.question_words - 1, args.vocab) + "\n"),
            "followups": [[feedback(args, rng, s, t) for t in range(args.turns - 1)]
                          for s in range(args.n)],
        })
    return system, groups


def feedback(args, rng, sample, turn):
    """What comes back after a turn: a search tool's 3 retrieved passages as Search-R1 formats
    them, or a code interpreter's (or verifier's) short output."""
    count = args.followup_words
    if args.trace == "search-r1":
        docs = [f"Doc {d + 1} (result {sample}.{turn}.{d}): " + words(rng, count // 3)
                for d in range(3)]
        return "\n<information>" + "\n".join(docs) + "</information>\nAssistant:"
    return "\n" + tokens(rng, count - 2, args.vocab) + "\n"


def metrics(url):
    return prometheus(url, "rl_worker_")


class LoadSampler(threading.Thread):
    """Polls every worker's running + waiting requests; spread = max / mean while any is busy."""

    def __init__(self, urls):
        super().__init__(daemon=True)
        self.urls = urls
        self.done = threading.Event()
        self.spreads = []

    def run(self):
        while not self.done.wait(0.05):
            try:
                loads = [(m.get("rl_worker_running_requests", 0) +
                          m.get("rl_worker_waiting_requests", 0))
                         for m in (metrics(u) for u in self.urls)]
            except (urllib.error.URLError, OSError):
                continue
            mean = sum(loads) / len(loads)
            if mean > 0:
                self.spreads.append(max(loads) / mean)


def replay(send, system, groups, args):
    """Runs every episode (concurrency at a time); returns (latencies, output tokens, wall)."""
    latencies, tokens = [], []
    lock = threading.Lock()

    def episode(g, s):
        group = groups[g]
        prompt = system + group["question"]
        for t in range(args.turns):
            seed = (g * 1000 + s) * 10 + t
            t0 = time.perf_counter()
            text, n = send(prompt, group, group["keys"][s], seed)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                tokens.append(n)
            if t + 1 < args.turns:
                prompt = prompt + text + group["followups"][s][t]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(episode, g, s) for g in range(len(groups)) for s in range(args.n)]
        for f in futures:
            f.result()
    return latencies, sum(tokens), time.perf_counter() - t0


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def derive_layers(src, dst, layers):
    """Writes to `dst` the model `src` cut to its first `layers` decoder layers (config and
    safetensors rewritten, the tokenizer copied): the same shapes per layer, a fraction of the
    compute. Pure Python (the safetensors format is an 8-byte header length, a JSON header
    of names, dtypes, shapes and byte ranges, then the bytes)."""
    import shutil
    with open(src / "config.json") as f:
        config = json.load(f)
    if not 1 <= layers <= config["num_hidden_layers"]:
        sys.exit(f"--layers {layers}: {src} has {config['num_hidden_layers']} layers")
    config["num_hidden_layers"] = layers
    tmp = dst.with_name(dst.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in os.listdir(src):
        if name not in ("config.json", "model.safetensors"):
            shutil.copy(src / name, tmp / name)
    with open(tmp / "config.json", "w") as f:
        json.dump(config, f, indent=2)
    with open(src / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        base = f.tell()
        keep = {k: v for k, v in header.items()
                if k == "__metadata__" or not (m := re.match(r"model\.layers\.(\d+)\.", k))
                or int(m.group(1)) < layers}
        out, at = {}, 0
        for k, v in keep.items():
            if k == "__metadata__":
                out[k] = v
                continue
            b, e = v["data_offsets"]
            out[k] = dict(v, data_offsets=[at, at + e - b])
            at += e - b
        blob = json.dumps(out).encode()
        blob += b" " * (-len(blob) % 8)
        with open(tmp / "model.safetensors", "wb") as o:
            o.write(len(blob).to_bytes(8, "little"))
            o.write(blob)
            for k, v in keep.items():
                if k != "__metadata__":
                    f.seek(base + v["data_offsets"][0])
                    o.write(f.read(v["data_offsets"][1] - v["data_offsets"][0]))
    tmp.rename(dst)


class Workers:
    def __init__(self, args):
        self.servers, self.metric_urls = [], []
        for i in range(3):
            log = Path(_tmp.name) / f"worker{i}.log"
            s = Server([args.build / "bin" / "rl-worker", "--model", args.model, "--port", "0",
                        "--metrics-port", "0", "--threads", str(args.threads),
                        "--kv-cache-gb", str(args.kv_cache_gb), "--page-size",
                        str(args.page_size), "--no-reserve-update-buffers"],
                       log_path=log)
            _procs.append(s)
            self.servers.append(s)
            deadline = time.monotonic() + 60
            while not (m := re.search(r"metrics on (http://\S+/metrics)", log.read_text())):
                if time.monotonic() > deadline or s.proc.poll() is not None:
                    sys.exit(f"worker {i} printed no metrics address:\n{log.read_text()[-2000:]}")
                time.sleep(0.1)
            self.metric_urls.append(m.group(1))
        self.addresses = [s.address for s in self.servers]

    def flush(self):
        from rlfleet import Client
        for a in self.addresses:
            with Client(a, via="worker") as c:
                c.flush_cache()

    def counters(self):
        return [metrics(u) for u in self.metric_urls]


def run_one(name, send, workers, system, groups, args):
    workers.flush()
    before = workers.counters()
    sampler = LoadSampler(workers.metric_urls)
    sampler.start()
    try:
        lat, out_tokens, wall = replay(send, system, groups, args)
    finally:
        sampler.done.set()
        sampler.join()
    after = workers.counters()
    d = lambda k: [a.get(k, 0) - b.get(k, 0) for a, b in zip(after, before)]
    prompt, cached, reqs = sum(d("rl_worker_prompt_tokens_total")), sum(
        d("rl_worker_cached_tokens_total")), d("rl_worker_requests_total")
    return {"name": name, "tok_s": out_tokens / wall, "hit": cached / prompt if prompt else 0.0,
            "p50": percentile(lat, 0.5) * 1e3, "p99": percentile(lat, 0.99) * 1e3,
            "spread": statistics.mean(sampler.spreads) if sampler.spreads else float("nan"),
            "reqs": "/".join(str(int(r)) for r in reqs), "wall": wall,
            "prompt_tokens": int(prompt), "prefilled": int(prompt - cached)}


def ours(args, workers, policy):
    """rl-router over the workers with --policy; returns (send, stop)."""
    import grpc
    from rlfleet.proto import generate_pb2
    from rlfleet.types import build_generate_request
    router = Server([args.build / "bin" / "rl-router", "--tokenizer", args.model, "--port", "0",
                     "--policy", policy, "--health-interval-ms", "200",
                     # A loaded shared machine delays health answers by seconds: no worker
                     # should be taken out of routing for it mid-run.
                     "--health-timeout-ms", "10000", "--health-failures", "20",
                     *sum((["--worker", a] for a in workers.addresses), [])],
                    log_path=Path(_tmp.name) / f"router-{policy}.log")
    _procs.append(router)
    from rlfleet import Client
    from rlfleet.proto import router_pb2
    with Client(router.address) as c:
        deadline = time.monotonic() + 60
        while sum(w.state == router_pb2.WORKER_STATE_LIVE and not w.reason
                  for w in c.list_workers().workers) < 3:
            if time.monotonic() > deadline:
                sys.exit(f"router ({policy}): workers not live: {c.list_workers()}")
            time.sleep(0.1)
    channel = grpc.insecure_channel(router.address)
    call = channel.unary_stream("/rl.v1.Router/Generate",
                                request_serializer=generate_pb2.GenerateRequest.SerializeToString,
                                response_deserializer=generate_pb2.GenerateResponse.FromString)

    def send(prompt, group, key, seed):
        req = build_generate_request(prompt, max_new_tokens=args.max_tokens, temperature=1.0,
                                     seed=seed, ignore_eos=True, stream=False)
        req.group_id = group["id"]
        req.routing_key = key
        for msg in call(req, timeout=600):
            if msg.HasField("final"):
                return msg.final.text, len(msg.final.output_ids)
        raise RuntimeError("no final message")

    def routing():
        with Client(router.address) as c:
            r = c.get_metrics().routing
        return f"{r.keyed_picks}/{r.picks} keyed, {r.key_moves} moved"

    send.routing = routing

    def stop():
        channel.close()
        _procs.remove(router)
        router.stop()

    return send, stop


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def smg(args, workers, policy):
    """The pinned SMG gateway over the workers with --policy; returns (send, stop)."""
    port = free_port()
    log = open(Path(_tmp.name) / f"smg-{policy}.log", "w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "smg"), "launch", "--host", "127.0.0.1", "--port",
         str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
         "--worker-urls", *[f"grpc://{a}" for a in workers.addresses], "--model-path",
         str(args.model), "--policy", policy, "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT)
    _procs.append(proc)
    url = f"http://127.0.0.1:{port}/v1/completions"

    def send(prompt, group, key, seed):
        r = post(url, {"model": str(args.model), "prompt": prompt, "max_tokens": args.max_tokens,
                       "temperature": 1.0, "seed": seed, "ignore_eos": True})
        return r["choices"][0]["text"], r["usage"]["completion_tokens"]

    deadline = time.monotonic() + 120
    while True:  # ready when it routes to every worker (a few requests, round robin or not)
        try:
            post(url, {"model": str(args.model), "prompt": "warm", "max_tokens": 1}, timeout=10)
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline or proc.poll() is not None:
                log.flush()
                sys.exit(f"smg ({policy}) did not come up:\n"
                         f"{Path(log.name).read_text()[-3000:]}")
            time.sleep(0.25)
    time.sleep(1.0)  # let it see every worker's load / cache state

    def stop():
        _procs.remove(proc)
        stop_process(proc)
        log.close()

    return send, stop


def print_table(title, rows, base):
    """`base`: round_robin's row (None when it did not run); "x rr" columns are ratios to it."""
    print(f"\n{title}")
    print(f"{'gateway / policy':<24} {'out tok/s':>9} {'x rr':>5} {'hit rate':>8} {'x rr':>5} "
          f"{'prefilled':>9} {'p50 ms':>8} {'p99 ms':>8} {'spread':>6}  requests per worker")
    for r in rows:
        ratio = r["tok_s"] / base["tok_s"] if base and base["tok_s"] else 0.0
        hit_ratio = r["hit"] / base["hit"] if base and base["hit"] else 0.0
        print(f"{r['name']:<24} {r['tok_s']:9.1f} {ratio:5.2f} {r['hit'] * 100:7.1f}% "
              f"{hit_ratio:5.2f} {r['prefilled']:9.0f} {r['p50']:8.0f} {r['p99']:8.0f} {r['spread']:6.2f}  {r['reqs']}", flush=True)


def median_row(rows):
    out = dict(rows[0])
    for k in ("tok_s", "hit", "prefilled", "p50", "p99", "spread", "wall"):
        out[k] = statistics.median(r[k] for r in rows)
    out["reqs"] = " ".join(r["reqs"] for r in rows)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, default=ROOT / "build")
    ap.add_argument("--model", type=Path, default=None,
                    help="model folder (default: a made qwen3 0.5b under BUILD/bench-models)")
    ap.add_argument("--layers", type=int, default=8,
                    help="without --model: keep the made model's first N of 28 layers (0: all)")
    ap.add_argument("--trace", choices=sorted(TRACES), default="retool",
                    help="retool: multi-turn tool-integrated math RL with a reasoning model "
                         "(the default); math-tir: the same at GSM8K lengths; search-r1: "
                         "Search-R1's search agent (long tool answers)")
    ap.add_argument("--groups", type=int, default=None, help="prompt groups (retool 6)")
    ap.add_argument("--n", type=int, default=8, help="samples per group")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=None,
                    help="episodes in flight (retool, math-tir: all of them, as a rollout engine "
                         "submits a step)")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per turn")
    ap.add_argument("--system-words", type=int, default=None)
    ap.add_argument("--question-words", type=int, default=None)
    ap.add_argument("--followup-words", type=int, default=None,
                    help="words of the feedback after each turn")
    ap.add_argument("--threads", type=int, default=1, help="rl-worker --threads")
    ap.add_argument("--kv-cache-gb", type=float, default=2.0)
    ap.add_argument("--page-size", type=int, default=1,
                    help="rl-worker --page-size (1: SGLang's default, no prefix rounded away)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default=",".join(OURS),
                    help="rl-router policies to run (comma-separated)")
    ap.add_argument("--no-smg", action="store_true", help="skip the SMG gateway rows")
    ap.add_argument("--no-skewed", action="store_true", help="skip the skewed trace")
    ap.add_argument("--quick", action="store_true",
                    help="smallest sizes (1 group of 2, 2 turns of 2 tokens): a smoke run")
    args = ap.parse_args()
    for k, v in TRACES[args.trace].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.concurrency is None:
        args.concurrency = args.groups * args.n
    if args.quick:
        args.groups, args.n, args.turns, args.concurrency, args.max_tokens = 1, 2, 2, 2, 2
        args.system_words, args.question_words, args.followup_words = 4, 4, 3
        args.kv_cache_gb = 0.05
    bounds = {"groups": (1, 256), "n": (1, 64), "turns": (1, 16), "concurrency": (1, 256),
              "max_tokens": (1, 1024), "system_words": (0, 4000), "question_words": (1, 4000),
              "followup_words": (1, 1000), "threads": (0, 64), "rounds": (1, 20),
              "layers": (0, 28), "page_size": (1, 256)}
    for k, (lo, hi) in bounds.items():
        if not lo <= getattr(args, k) <= hi:
            ap.error(f"--{k.replace('_', '-')} must be in [{lo}, {hi}]")
    if not 0.01 <= args.kv_cache_gb <= 64:
        ap.error("--kv-cache-gb must be in [0.01, 64]")
    policies = [p for p in args.policies.split(",") if p]
    if not policies or any(p not in OURS for p in policies):
        ap.error(f"--policies: a comma-separated subset of {','.join(OURS)}")
    if not (args.build / "bin" / "rl-worker").exists():
        ap.error(f"{args.build}/bin/rl-worker missing: build first")
    if not args.no_smg and not (Path(sys.executable).parent / "smg").exists():
        ap.error("smg missing from the venv: run scripts/venv (or pass --no-smg)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.model is None:
            full = args.build / "bench-models" / "qwen3-0.5b"
            if not (full / "config.json").exists():
                print(f"making {full} (rlctl make-model --arch qwen3 --size 0.5b)", flush=True)
                subprocess.run([str(args.build / "bin" / "rlctl"), "make-model", "--arch",
                                "qwen3", "--size", "0.5b", "--seed", "1", "--out",
                                str(full)], check=True, timeout=900)
            args.model = full
            if args.layers:
                args.model = full.with_name(f"qwen3-0.5b-{args.layers}l")
                if not (args.model / "config.json").exists():
                    print(f"making {args.model} (the first {args.layers} layers)", flush=True)
                    derive_layers(full, args.model, args.layers)
        args.vocab = one_token_words(args.model)
        cpu = next((l.split(":", 1)[1].strip() for l in
                    subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                    if l.startswith("Model name")), "?")
        print(f"trace {args.trace}; model {args.model.name}; {args.groups} groups x {args.n} samples x {args.turns} "
              f"turns = {args.groups * args.n * args.turns} requests per run, {args.concurrency} "
              f"episodes in flight, {args.max_tokens} new tokens a turn; 3 workers "
              f"(--threads {args.threads}, --page-size {args.page_size}); CPU {cpu}; load {os.getloadavg()[0]:.1f}", flush=True)
        traces = [(f"GRPO trace ({args.trace})", make_trace(args, False))]
        system, groups = traces[0][1]
        print(f"prompt pieces in tokens: system {count_tokens(args, system)}, question "
              f"{count_tokens(args, groups[0]['question'])}, feedback "
              f"{count_tokens(args, groups[0]['followups'][0][0]) if args.turns > 1 else 0}; "
              f"{args.max_tokens} generated a turn", flush=True)
        workers = Workers(args)
        if not args.no_skewed:
            traces.append((f"skewed trace ({args.trace}, 80% of episodes on 2 routing keys)",
                           make_trace(args, True)))
        runs = []  # (trace title, row name, gateway factory, policy)
        for title, _ in traces:
            for p in policies:
                runs.append((title, f"rl-router {p}", ours, p))
            if not args.no_smg and title.startswith("GRPO trace"):
                for p in SMG_POLICIES:
                    runs.append((title, f"smg {p}", smg, p))
        results = {}
        for rnd in range(args.rounds):
            for title, name, factory, policy in runs:
                system, groups = dict(traces)[title]
                send, stop = factory(args, workers, policy)
                try:
                    row = run_one(name, send, workers, system, groups, args)
                    row["routing"] = send.routing() if hasattr(send, "routing") else ""
                finally:
                    stop()
                results.setdefault((title, name), []).append(row)
                print(f"  round {rnd + 1}: {title}: {name}: {row['tok_s']:.1f} tok/s, "
                      f"hit {row['hit'] * 100:.1f}%, {row['prompt_tokens']} prompt tokens, "
                      f"{row['wall']:.1f} s, load {os.getloadavg()[0]:.1f}"
                      + (f", picks {row['routing']}" if row["routing"] else ""), flush=True)
        for title, _ in traces:
            rows = [median_row(results[(t, n)]) for t, n, _, _ in runs if t == title]
            base = next((r for r in rows if r["name"] == "rl-router round_robin"), None)
            print_table(f"{title}" + (f", medians of {args.rounds} rounds" if args.rounds > 1
                                      else ""), rows, base)
            if args.rounds > 1:
                rr = results[(title, "rl-router round_robin")] if "round_robin" in policies \
                    else None
                for t, n, _, _ in runs:
                    if t == title and rr and n != "rl-router round_robin":
                        print(f"  {n}: x rr by round: tok/s " + ", ".join(
                            f"{a['tok_s'] / b['tok_s']:.2f}" for a, b in zip(results[(t, n)], rr))
                            + "; hit rate " + ", ".join(
                            f"{a['hit'] / b['hit']:.2f}" if b["hit"] else "-"
                            for a, b in zip(results[(t, n)], rr)))
        print(f"\nload average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        stop_all()
        _tmp.cleanup()


if __name__ == "__main__":
    main()
