"""Fixtures for the SMG interop test: one rl-worker (stories260K) and the real Shepherd Model
Gateway (the pinned `smg` from requirements.txt) in front of it, both on 127.0.0.1."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rltest import BIN, STORIES, Server, free_port, stop_process, wait_for

MODEL = STORIES
SMG = Path(sys.executable).parent / "smg"
RLCTL = str(BIN / "rlctl")
CHAT_TEMPLATE = Path(__file__).resolve().parent / "chat_template.jinja"
START_TIMEOUT_S = 90


class Gateway:
    """HTTP client of the gateway plus the worker's address (for rlctl)."""

    def __init__(self, url, worker, model_name, log_path):
        self.url = url
        self.worker = worker
        self.model = model_name
        self.log_path = log_path

    def post(self, path, body, timeout=60, headers=None):
        """(HTTP status, parsed JSON body or raw text)."""
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _parse(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _parse(e.read())

    def stream(self, path, body, timeout=60):
        """The `data:` events of a streaming answer, parsed, up to [DONE]."""
        data = json.dumps({**body, "stream": True}).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        events = []
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            assert resp.status == 200
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    return events
                events.append(json.loads(payload))
        raise AssertionError(f"stream ended without [DONE] after {len(events)} events")

    def get(self, path, timeout=30):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            return resp.status, _parse(resp.read())

    def log_tail(self, n=4000):
        return Path(self.log_path).read_text(errors="replace")[-n:]


def _parse(raw):
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def rlctl(*args, env=None):
    r = subprocess.run([RLCTL, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return r.stdout


def rlctl_json(*args, env=None):
    return json.loads(rlctl("--json", *args, env=env))


class Fleet:
    """One rl-worker and the real SMG in front of it (optionally through a logging proxy)."""

    def __init__(self, logs, worker_args=(), env=None, sglang_port=False, proxy=False):
        self.server = None
        self.smg = None
        self.proxy = None
        self.worker_log = logs / "worker.log"
        try:
            self.server = Server([BIN / "rl-worker", "--model", MODEL, "--port", "0",
                                  *worker_args], self.worker_log,
                                 env={**os.environ, **env} if env else None)
            self.worker = self.server.address
            # The gateway's own address of the worker: --sglang-port's listener when asked for.
            target = self.worker
            if sglang_port:
                line = self.server.proc.stdout.readline()
                if not line.startswith("sglang listening on "):
                    raise RuntimeError(f"rl-worker printed no sglang listener: {line!r}")
                self.sglang = target = line.split()[-1]
            if proxy:
                from sglang_proxy import SglangProxy
                self.proxy = SglangProxy(target)
                target = self.proxy.address
            port = free_port()
            self.smg_log = logs / "smg.log"
            self.smg = subprocess.Popen(
                [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port),
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                 "--worker-urls", f"grpc://{target}", "--model-path", str(MODEL),
                 "--chat-template", str(CHAT_TEMPLATE)],
                stdout=open(self.smg_log, "w"), stderr=subprocess.STDOUT)
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{port}"

    def gateway(self, model_name):
        """Waits until the gateway routes a one-token completion for `model_name`."""
        gw = Gateway(self.url, self.worker, model_name, self.smg_log)
        gw.fleet = self

        def ready():
            assert self.smg.poll() is None, f"smg exited: {gw.log_tail()}"
            try:
                status, _ = gw.post("/v1/completions", {"model": gw.model, "prompt": "Once",
                                                        "max_tokens": 1}, timeout=5)
                return status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_for(ready, "smg to serve", timeout_s=START_TIMEOUT_S, interval_s=0.25,
                 detail=gw.log_tail)
        return gw

    def stop(self):
        if self.smg is not None:
            stop_process(self.smg)
        if self.server is not None:
            self.server.stop()
        if self.proxy is not None:
            self.proxy.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    fleet = Fleet(tmp_path_factory.mktemp("smg"))
    try:
        yield fleet.gateway(str(MODEL))
    finally:
        fleet.stop()


# The keyed worker of test_smg_paths.py: both keys set (in the environment, as RL_API_KEY is
# usually given), the gateway on the key-free --sglang-port listener through the logging proxy,
# a served-model alias and a short bound on waiting while paused.
DATA_KEY = "data-key-for-tests"
ADMIN_KEY = "admin-key-for-tests"
ALIAS = "stories"
PAUSE_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    fleet = Fleet(tmp_path_factory.mktemp("smg-keyed"),
                  worker_args=["--sglang-port", "0", "--model-alias", ALIAS,
                               "--sglang-pause-timeout-s", str(PAUSE_TIMEOUT_S)],
                  env={"RL_API_KEY": DATA_KEY, "RL_ADMIN_API_KEY": ADMIN_KEY},
                  sglang_port=True, proxy=True)
    try:
        yield fleet.gateway(ALIAS)
    finally:
        fleet.stop()
