"""SMG's precise (event-driven) cache-aware routing in front of rl-workers: three workers, the
real pinned `smg` with `--policy cache_aware`, and prompts whose KV is put on a chosen worker
*behind the gateway's back* (a Generate straight to that worker). The gateway never routed those
prompts, so its approximate trees know nothing of them; only the worker's SubscribeKvEvents
stream (docs/kv-events.md) can tell it where they are cached. Every repeated prefix must land on
the worker that holds it, and be served there from the cache."""

import json
import os
import random
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from rltest import BIN, STORIES, Server, free_port, prometheus, stop_process, wait_for

SMG = Path(sys.executable).parent / "smg"
CHAT_TEMPLATE = Path(__file__).resolve().parent / "chat_template.jinja"
WORKERS = 3
PROMPTS = 6  # two per worker: a lucky pass by load-only routing is (1/3)^6
PROMPT_TOKENS = 240  # 15 blocks of the workers' default --page-size 16


def metrics(url):
    return prometheus(url)


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.loads(r.read())


class Fleet:
    def __init__(self, logs):
        self.workers, self.metric_urls, self.smg = [], [], None
        try:
            for i in range(WORKERS):
                log = logs / f"worker{i}.log"
                # A fixed port: a restarted worker comes back where the gateway looks for it.
                s = Server([BIN / "rl-worker", "--model", STORIES, "--port", str(free_port()),
                            "--metrics-port", "0"], log, tries=20)
                self.workers.append(s)
                m = wait_for(lambda: re.search(r"metrics on (http://\S+/metrics)",
                                               log.read_text()), f"worker {i}'s metrics address",
                             detail=lambda: log.read_text()[-2000:])
                self.metric_urls.append(m.group(1))
            port, self.prom_port = free_port(), free_port()
            self.smg_log = logs / "smg.log"
            self.smg = subprocess.Popen(
                [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port),
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prom_port),
                 "--policy", "cache_aware", "--block-size", "16",
                 "--worker-urls", *[f"grpc://{w.address}" for w in self.workers],
                 "--model-path", str(STORIES), "--chat-template", str(CHAT_TEMPLATE)],
                stdout=open(self.smg_log, "w"), stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1"})
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{port}"

    def smg_metrics(self):
        return metrics(f"http://127.0.0.1:{self.prom_port}/metrics")

    def log_tail(self):
        return self.smg_log.read_text(errors="replace")[-4000:]

    def stop(self):
        if self.smg is not None:
            stop_process(self.smg)
        for w in self.workers:
            w.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    f = Fleet(tmp_path_factory.mktemp("smg-kv-events"))
    try:
        def ready():
            assert f.smg.poll() is None, f"smg exited: {f.log_tail()}"
            try:
                status, _ = post(f.url + "/generate", {"model": str(STORIES), "input_ids": [1, 2, 3],
                                                       "sampling_params": {"max_new_tokens": 1}},
                                      timeout=5)
                return status == 200
            except OSError:
                return False

        wait_for(ready, "smg to serve", timeout_s=90, interval_s=0.25, detail=f.log_tail)
        # One KV event subscription per worker, open before anything is cached.
        wait_for(lambda: f.smg_metrics().get("smg_kv_event_subscriptions_total", 0) >= WORKERS,
                 "smg to subscribe to every worker's KV events", timeout_s=30,
                 detail=f.log_tail)
        yield f
    finally:
        f.stop()


def rlctl_generate(worker, ids):
    r = subprocess.run([str(BIN / "rlctl"), "--target", worker, "--json", "generate", "--ids",
                        ",".join(map(str, ids)), "--max-new-tokens", "1", "--temperature", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def seed_and_route(fleet, rng, target, i):
    """Caches a fresh prompt on worker `target` behind the gateway's back, waits until the
    gateway counted its block stores, sends it (8 tokens longer) through the gateway and checks
    it was served by `target` from its cache."""
    vocab = range(3, 500)  # stories260K's 512 ids, past the specials
    ids = [1] + [rng.choice(vocab) for _ in range(PROMPT_TOKENS - 1)]
    blocks = fleet.smg_metrics().get("smg_kv_event_blocks_total", 0)
    rlctl_generate(fleet.workers[target].address, ids)
    # The stores reach the gateway asynchronously: wait until it counted them.
    wait_for(lambda: fleet.smg_metrics().get("smg_kv_event_blocks_total", 0)
             >= blocks + PROMPT_TOKENS // 16,
             f"smg to receive prompt {i}'s block stores", timeout_s=20, detail=fleet.log_tail)
    seen = [metrics(u) for u in fleet.metric_urls]
    status, body = post(fleet.url + "/generate", {
        "model": str(STORIES), "input_ids": ids + [rng.choice(vocab) for _ in range(8)],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    assert status == 200, body
    after = [metrics(u) for u in fleet.metric_urls]
    served = [after[w]["rl_worker_prompt_tokens_total"] - seen[w]["rl_worker_prompt_tokens_total"]
              for w in range(WORKERS)]
    cached = [after[w]["rl_worker_cached_tokens_total"] - seen[w]["rl_worker_cached_tokens_total"]
              for w in range(WORKERS)]
    assert served[target] == PROMPT_TOKENS + 8, (
        f"prompt {i} cached on worker {target} went elsewhere: prompt tokens per worker "
        f"{served}\n{fleet.log_tail()}")
    assert cached[target] >= PROMPT_TOKENS - 16, (i, cached)


def test_cache_aware_routes_a_prefix_to_the_worker_that_holds_it(fleet):
    rng = random.Random(7)
    for i in range(PROMPTS):
        seed_and_route(fleet, rng, i % WORKERS, i)


def test_a_restarted_worker_is_subscribed_to_again(fleet):
    """A worker killed and restarted (its cache empty, its event stream new) is subscribed to
    again, and a prefix cached on it afterwards is routed to it."""
    subscriptions = fleet.smg_metrics().get("smg_kv_event_subscriptions_total", 0)
    worker = fleet.workers[1]
    worker.kill()
    worker.start(tries=20)
    wait_for(lambda: fleet.smg_metrics().get("smg_kv_event_subscriptions_total", 0)
             > subscriptions, "smg to subscribe to the restarted worker", timeout_s=60,
             interval_s=0.25, detail=fleet.log_tail)
    # Its metrics listener moved (--metrics-port 0): read the new address.
    urls = wait_for(lambda: re.findall(r"metrics on (http://\S+/metrics)",
                                       worker.log_path.read_text())[1:],
                    "the restarted worker's metrics address")
    fleet.metric_urls[1] = urls[-1]
    rng = random.Random(11)
    for i in range(3):
        seed_and_route(fleet, rng, 1, i)
