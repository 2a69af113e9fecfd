"""rl-collect over-sampling (issue 34) end to end on loopback with stories260K at temperature
0: --batch-groups with --over-sample stops at the batch, aborts the groups still running
through the router (Router.Abort by group_id), keeps their partial samples (with their
dispatch version) in checkpoint.json, and the next run resumes them within their budget (their
outputs begin with the saved partial tokens); --group-filter drops groups; the DAPO example
filter and rlfleet's Python hook answer keep/drop."""

import json
import subprocess
import sys
from pathlib import Path

from rltest import BIN

REPO = Path(__file__).resolve().parents[2]
LONG = 480  # stories260K's context is 512; the prompt has 5 tokens
SHORT = 8


def write_prompts(path: Path, rows: int, long_rows=()):
    with open(path, "w") as f:
        for i in range(rows):
            row = {"index": i, "input_ids": [1, 403, 407, 261, 378 + i], "answer": str(i)}
            n = LONG if i in long_rows else SHORT
            row["sampling_params"] = {"max_new_tokens": n, "ignore_eos": True}
            f.write(json.dumps(row) + "\n")
    return path


def collect(router, prompts, out, *extra):
    cmd = [str(BIN / "rl-collect"), "--router", router, "--prompts", str(prompts), "--out",
           str(out), "--n", "2", "--concurrency", "32", "--temperature", "0", "--seed", "3",
           "--retry-backoff-ms", "50", "--max-backoff-ms", "500", "--progress", "off",
           "--log-level", "warn", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def checkpoint(out: Path):
    return json.loads((out / "checkpoint.json").read_text())


def groups_of(runs):
    return {i for first, last, _ in runs for i in range(first, last + 1)}


def test_over_sampling_stops_at_the_batch_and_the_next_run_resumes_partials(fleet, tmp_path):
    from rlfleet import load_trajectories
    router = fleet["router"].address
    long_rows = (0, 1, 2, 3)
    prompts = write_prompts(tmp_path / "p.jsonl", 12, long_rows)
    out = tmp_path / "out"
    said = collect(router, prompts, out, "--batch-groups", "6", "--over-sample", "2")
    assert "batch: 6 groups kept" in said, said
    c = checkpoint(out)
    done = groups_of(c["completed"])
    assert len(done) == 6, c["completed"]
    assert not done & set(long_rows)  # the long groups were still running at the batch
    partials = [p for p in c["partials"] if "output_ids" in p]
    assert any(p["index"] in long_rows for p in partials), c["partials"]
    for p in partials:
        assert 0 < len(p["output_ids"]) < (LONG if p["index"] in long_rows else SHORT)
        assert len(p["output_logprobs"]) == len(p["output_ids"])
        assert sum(n for _, n in p["segments"]) == len(p["output_ids"])
        assert p["dispatch_version"] == 0
    t = load_trajectories(out / "trajectories.safetensors")
    assert sorted(set(t.index.tolist())) == sorted(done)  # merged: the batch, whole groups

    said = collect(router, prompts, out, "--batch-groups", "6", "--over-sample", "2")
    assert f"{len(partials)} samples resumed" in said, said
    c2 = checkpoint(out)
    assert groups_of(c2["completed"]) == set(range(12))
    assert "partials" not in c2
    t = load_trajectories(out / "trajectories.safetensors")
    assert len(t) == 24
    row_of = {(i, k): r for r, (i, k) in enumerate(zip(t.index.tolist(), t.sample.tolist()))}
    for p in partials:
        r = row_of[(p["index"], p["sample"])]
        resp = t.response_ids(r).tolist()
        assert resp[:len(p["output_ids"])] == p["output_ids"]  # resumed, not started over
        assert len(resp) == (LONG if p["index"] in long_rows else SHORT)
        assert t.finish_reason[r] == "length"
        assert t.loss_mask[t.offsets[r] + int(t.prompt_len[r]):t.offsets[r + 1]].all()
    # Greedy: the resumed long samples equal the ones a fresh collection makes.
    ref = tmp_path / "ref"
    collect(router, write_prompts(tmp_path / "long.jsonl", 4, long_rows), ref)
    tr = load_trajectories(ref / "trajectories.safetensors")
    for r in range(len(tr)):
        i, k = int(tr.index[r]), int(tr.sample[r])
        assert tr.response_ids(r).tolist() == t.response_ids(row_of[(i, k)]).tolist(), (i, k)


def test_group_filter_drops_groups_and_they_are_never_collected_again(fleet, tmp_path):
    router = fleet["router"].address
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    out = tmp_path / "out"
    drop_odd = (f"{sys.executable} -c \"import json,sys; g=json.load(sys.stdin); "
                f"assert len(g['samples'])==2; print('drop' if g['index']%2 else 'keep')\"")
    said = collect(router, prompts, out, "--batch-groups", "3", "--over-sample", "1.5",
                   "--group-filter", drop_odd)
    c = checkpoint(out)
    kept = groups_of(c["completed"])
    assert kept and all(i % 2 == 0 for i in kept), c
    assert all(i % 2 == 1 for i in groups_of(c.get("dropped", [])))
    collect(router, prompts, out, "--batch-groups", "10", "--group-filter", drop_odd)
    c = checkpoint(out)
    assert groups_of(c["completed"]) == {0, 2, 4, 6, 8}
    assert groups_of(c["dropped"]) == {1, 3, 5, 7, 9}
    # A filter that answers neither keep nor drop stops the run naming it.
    p = subprocess.run([str(BIN / "rl-collect"), "--router", router, "--prompts", str(prompts),
                        "--out", str(tmp_path / "bad"), "--batch-groups", "1",
                        "--group-filter", "echo maybe", "--progress", "off"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "answered neither keep nor drop" in p.stderr, p.stderr


def test_dapo_filters_answer_keep_when_rewards_differ(tmp_path):
    group = {"index": 0, "metadata": {"answer": "42"},
             "samples": [{"sample": 0, "text": "it is 42"}, {"sample": 1, "text": "it is 7"}]}
    same = {"index": 1, "metadata": {"answer": "42"},
            "samples": [{"sample": 0, "text": "no"}, {"sample": 1, "text": "none"}]}
    for cmd in ([sys.executable, str(REPO / "examples/group_filters/dapo_filter.py")],
                [sys.executable, "-m", "rlfleet.group_filter", "dapo"]):
        for g, want in ((group, "keep"), (same, "drop")):
            p = subprocess.run(cmd, input=json.dumps(g), capture_output=True, text=True,
                               timeout=60, env={"PYTHONPATH": str(
                                   Path(__import__("rlfleet").__file__).parents[1])})
            assert p.returncode == 0, p.stderr
            assert p.stdout.strip() == want, (cmd, g)
    from rlfleet.group_filter import dapo_not_all_equal
    assert dapo_not_all_equal({"samples": [{"reward": 1}, {"reward": 0}]})
    assert not dapo_not_all_equal({"samples": [{"reward": 1}, {"reward": 1}]})
