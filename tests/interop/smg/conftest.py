"""Fixtures for the SMG interop test: one rl-worker (stories260K) and the real Shepherd Model
Gateway (the pinned `smg` from requirements.txt) in front of it, both on 127.0.0.1."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUILD = Path(os.environ.get("RL_BUILD_DIR", ROOT / "build"))
DATA = Path(os.environ.get("RL_TEST_DATA", ROOT.parent / "shared" / "models"))
MODEL = DATA / "stories260K"
SMG = Path(sys.executable).parent / "smg"
RLCTL = str(BUILD / "bin" / "rlctl")
CHAT_TEMPLATE = Path(__file__).resolve().parent / "chat_template.jinja"
START_TIMEOUT_S = 90


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, grace_s=20):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class Gateway:
    """HTTP client of the gateway plus the worker's address (for rlctl)."""

    def __init__(self, url, worker, model_name, log_path):
        self.url = url
        self.worker = worker
        self.model = model_name
        self.log_path = log_path

    def post(self, path, body, timeout=60):
        """(HTTP status, parsed JSON body or raw text)."""
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
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


def rlctl(*args):
    r = subprocess.run([RLCTL, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def rlctl_json(*args):
    return json.loads(rlctl("--json", *args))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    logs = tmp_path_factory.mktemp("smg")
    worker = subprocess.Popen([str(BUILD / "bin" / "rl-worker"), "--model", str(MODEL),
                               "--port", "0"], stdout=subprocess.PIPE,
                              stderr=open(logs / "worker.log", "w"), text=True)
    line = worker.stdout.readline()
    if not line.startswith("listening on "):
        stop(worker)
        raise RuntimeError(f"rl-worker did not start: {line!r}")
    address = line.split()[-1]
    port = free_port()
    smg_log = logs / "smg.log"
    smg = subprocess.Popen(
        [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
         "--worker-urls", f"grpc://{address}", "--model-path", str(MODEL),
         "--chat-template", str(CHAT_TEMPLATE)],
        stdout=open(smg_log, "w"), stderr=subprocess.STDOUT)
    gw = Gateway(f"http://127.0.0.1:{port}", address, str(MODEL), smg_log)
    try:
        # Ready when the gateway routes a one-token completion to the worker.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert smg.poll() is None, f"smg exited: {gw.log_tail()}"
            try:
                status, _ = gw.post("/v1/completions", {"model": gw.model, "prompt": "Once",
                                                        "max_tokens": 1}, timeout=5)
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, f"smg not ready: {gw.log_tail()}"
            time.sleep(0.25)
        yield gw
    finally:
        stop(smg)
        stop(worker)
