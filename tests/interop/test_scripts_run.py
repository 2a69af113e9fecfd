"""scripts/run, the first thing a newcomer runs: with the shared data it serves the real
stories260K model and prints real English; without it, a made model and a one-line note."""

import os
import subprocess

from rltest import BUILD, DATA, ROOT


def run(env_extra):
    env = {**os.environ, "RL_BUILD_DIR": str(BUILD), **env_extra}
    return subprocess.run([str(ROOT / "scripts" / "run")], capture_output=True, text=True,
                          timeout=600, env=env)


def test_run_serves_stories260k():
    r = run({"RL_TEST_DATA": str(DATA)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "model: stories260K" in r.stdout
    assert "Once upon a time, there was a little girl named Lily." in r.stdout, r.stdout
    assert "note:" not in r.stdout
    # The walk-through completed: update, checksum per worker, router metrics.
    assert "UpdateWeightsFromDisk: ok on all 2 workers" in r.stdout, r.stdout
    assert "rl_router_live_workers 2" in r.stdout, r.stdout


def test_run_without_data_says_so(tmp_path):
    r = run({"RL_TEST_DATA": str(tmp_path / "nothing")})
    assert r.returncode == 0, r.stdout + r.stderr
    notes = [line for line in r.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "random weights" in notes[0], r.stdout
    assert "rl_router_live_workers 2" in r.stdout, r.stdout
