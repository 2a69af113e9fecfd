"""Fixtures for the interop tests: the built binaries and a live fleet on loopback."""

import shutil
import time
import urllib.request

import pytest

from rltest import BUILD, STORIES, Server, free_port


class Fleet:
    """The README's quickstart: two rl-workers (stories260K) behind one rl-router."""

    def __init__(self, tmp):
        self.servers = []
        self.worker_metrics = [free_port(), free_port()]
        self.router_metrics = free_port()
        self.workers = []
        for i, port in enumerate(self.worker_metrics):
            w = Server([str(BUILD / "bin" / "rl-worker"), "--model", str(STORIES), "--port", "0",
                        "--metrics-port", str(port), "--kv-cache-gb", "0.01", "--threads", "1"],
                       tmp / f"worker{i}.log")
            self.servers.append(w)
            self.workers.append(w.address)
        args = [str(BUILD / "bin" / "rl-router"), "--tokenizer", str(STORIES), "--port", "0",
                "--metrics-port", str(self.router_metrics), "--health-interval-ms", "200"]
        for w in self.workers:
            args += ["--worker", w]
        r = Server(args, tmp / "router.log")
        self.servers.append(r)
        self.router = r.address

    def scrape(self, port):
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.read().decode()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self):
        for s in reversed(self.servers):
            s.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    if not (BUILD / "bin" / "rl-router").exists():
        pytest.fail(f"build the binaries first: {BUILD}/bin/rl-router is missing")
    if not STORIES.is_dir():
        pytest.fail(f"test data missing: {STORIES} (set RL_TEST_DATA)")
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    yield f
    f.stop()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A second checkpoint to load (a copy of stories260K)."""
    d = tmp_path_factory.mktemp("ckpt") / "step-100"
    shutil.copytree(STORIES, d)
    return d
