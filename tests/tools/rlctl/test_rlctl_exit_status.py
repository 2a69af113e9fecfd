"""rlctl exits non-zero whenever any target failed, with or without --json: a resync from a
missing folder or refused by the router, a worker that cannot be added, a distributed bucket
that fails on every worker, server-info through a router with a worker that does not answer;
the same commands succeed (exit 0) when every target does."""

import json
import os
import signal
import subprocess

import pytest

from rltest import BUILD, STORIES, start_router, wait_for

RLCTL = str(BUILD / "bin" / "rlctl")


def rlctl(*args):
    return subprocess.run([RLCTL, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def two(start_worker):
    workers = [start_worker("--kv-cache-gb", "0.01", "--threads", "1") for _ in range(2)]
    # Slow health checks: a stopped worker stays live (a target) for the whole test.
    router = start_router(workers, "--admin-call-timeout-ms", "1500", "--health-timeout-ms",
                          "60000")
    wait_for(lambda: rlctl("--target", router.address, "workers", "list").stdout.count("LIVE") == 2,
             "both workers live")
    yield router.address, [w.address for w in workers], workers
    router.stop()


def both(*args):
    """The command's result without and with --json: (exit status, stdout, stderr) twice."""
    return rlctl(*args), rlctl("--json", *args)


def test_failed_targets_exit_1(two, tmp_path):
    router, (w0, w1), workers = two
    # One worker from another folder than the fleet's: refused by the router.
    for r in both("--target", router, "workers", "resync", w0, "--from-disk", "/nope"):
        assert r.returncode == 1, (r.stdout, r.stderr)
    # Every worker named: the load itself fails on each (the answer says FAILED, success false).
    human, as_json = both("--target", router, "workers", "resync", w0, w1, "--from-disk", "/nope")
    assert human.returncode == 1 and as_json.returncode == 1, (human.stdout, as_json.stdout)
    assert "FAILED: UpdateWeightsFromDisk (resync of every live worker): failed on all 2" \
        in human.stdout, human.stdout
    assert json.loads(as_json.stdout)["success"] is False
    # Refused by the router: another checkpoint with no fleet update recorded.
    other = tmp_path / "other"
    assert rlctl("make-model", "--arch", "llama", "--size", "tiny", "--seed", "3",
                 "--out", str(other)).returncode == 0
    for r in both("--target", router, "workers", "resync", w0, "--from-disk", str(other)):
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "no fleet update is recorded" in r.stdout + r.stderr
    # Nothing answers there; with --allow-unreachable it is registered (listed DEAD).
    for r in both("--target", router, "workers", "add", "127.0.0.1:1"):
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "allow" in r.stdout + r.stderr
    r = rlctl("--target", router, "workers", "add", "127.0.0.1:1", "--allow-unreachable")
    assert r.returncode == 0, r.stderr
    assert "127.0.0.1:1  WORKER_STATE_DEAD" in r.stdout
    assert rlctl("--target", router, "workers", "remove", "127.0.0.1:1").returncode == 0
    # A bucket every worker refuses (no such group).
    bucket = json.dumps({"names": ["model.norm.weight"], "dtypes": ["F32"], "shapes": [[64]]})
    for r in both("--target", router, "update-weights", "--distributed", "--group-name", "nope",
                  "--bucket-json", bucket):
        assert r.returncode == 1, (r.stdout, r.stderr)
    # Every target answering: exit 0.
    for r in both("--target", router, "server-info"):
        assert r.returncode == 0, r.stderr
    for r in both("--target", router, "workers", "resync", w0, "--from-disk", str(STORIES)):
        assert r.returncode == 0, (r.stdout, r.stderr)
    # A worker that does not answer (stopped) fails server-info and model-info through the router.
    os.kill(workers[1].proc.pid, signal.SIGSTOP)
    try:
        for cmd in ("server-info", "model-info"):
            for r in both("--target", router, cmd):
                assert r.returncode == 1, (cmd, r.stdout, r.stderr)
        r = rlctl("--json", "--target", router, "server-info")
        errors = [w for w in json.loads(r.stdout)["workers"] if w.get("error")]
        assert [w["worker"] for w in errors] == [w1], r.stdout
    finally:
        os.kill(workers[1].proc.pid, signal.SIGCONT)
