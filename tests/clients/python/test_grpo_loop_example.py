"""examples/grpo_loop.py, run as a user runs it, against two real rl-workers behind an
rl-router: every step's rollout is served by the previous step's pushed weights, the fleet sleeps
while the NumPy "trainer" works, takes the push (tensor stream and tcp group, alternating)
asleep, and serves exactly the pushed tensors after waking."""

import json
import os
import subprocess
import sys

import rltest

STEPS = 4


def test_grpo_loop_example(fleet2):
    import rlfleet
    site = os.path.dirname(os.path.dirname(rlfleet.__file__))
    p = subprocess.run([sys.executable, str(rltest.ROOT / "examples" / "grpo_loop.py"),
                        "--router", fleet2.address, "--model", str(rltest.STORIES),
                        "--steps", str(STEPS), "--prompts", "3", "--group-size", "4"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": site})
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    steps, done = lines[:-1], lines[-1]
    assert done["done"] and done["steps"] == STEPS
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert [s["push"] for s in steps] == ["tensor", "group"] * (STEPS // 2)
    for s in steps:
        assert s["served_version"] == [s["step"] - 1]  # the rollout saw the last push
        assert s["version"] == s["step"]
        assert s["samples"] == 12 and s["workers"] == 2
        assert s["asleep_while_training"] and s["checksums_match"]
