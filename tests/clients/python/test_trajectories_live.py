"""Live results as training data: `generate` returns Generations for every n (one() for the
single case); Trajectories.from_results gives exactly the columns rl-collect writes for the same
greedy prompts (tokens, loss masks, logprobs, per-token versions, scalars), and to_dataproto the
same batch plus the seed's non-tensor fields (index, __num_turns__, raw_prompt)."""

import json
import subprocess

import numpy as np
import pytest

from rltest import BIN

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went"]
N = 2
MAX_NEW = 10


def test_generate_returns_the_same_shape_for_every_n(fleet):
    from rlfleet import Client, GenerateResult, Generations
    with Client(fleet["router"].address) as c:
        one = c.generate(text=PROMPTS[0], max_new_tokens=4)
        assert isinstance(one, Generations) and len(one) == 1
        assert isinstance(one.one(), GenerateResult)
        many = c.generate(text=PROMPTS[0], max_new_tokens=4, n=3, temperature=1.0, seed=3)
        assert isinstance(many, Generations) and [r.index for r in many] == [0, 1, 2]
        assert len(many.output_ids) == 3 and len(many.texts) == 3
        with pytest.raises(ValueError, match="3 samples"):
            many.one()


def test_from_results_matches_the_collector_file(fleet, tmp_path):
    from rlfleet import Client, Trajectories, load_trajectories
    router = fleet["router"].address
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"index": i, "text": t, "tag": f"p{i}"}) + "\n"
                               for i, t in enumerate(PROMPTS)))
    out = tmp_path / "out"
    p = subprocess.run([str(BIN / "rl-collect"), "--router", router, "--prompts", str(prompts),
                        "--out", str(out), "--n", str(N), "--max-new-tokens", str(MAX_NEW),
                        "--temperature", "0", "--progress", "off"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    collected = load_trajectories(out)

    with Client(router) as c:
        groups = [c.generate(text=t, n=N, max_new_tokens=MAX_NEW, temperature=0.0,
                             return_logprob=True, return_trajectory=True) for t in PROMPTS]
    live = Trajectories.from_results(groups, prompts=PROMPTS,
                                     metadata=[{"tag": f"p{i}"} for i in range(len(PROMPTS))])
    for name in ("offsets", "tokens", "loss_mask", "weight_versions", "index", "sample", "group",
                 "prompt_len", "weight_version"):
        assert np.array_equal(getattr(live, name), getattr(collected, name)), name
    np.testing.assert_array_equal(live.rollout_logprobs, collected.rollout_logprobs)
    assert live.finish_reason == collected.finish_reason and live.status == collected.status
    assert live.metadata == collected.metadata

    a = live.to_dataproto(pad_token_id=0)
    b = collected.to_dataproto(pad_token_id=0)
    assert a["batch"].keys() == b["batch"].keys()
    for k in a["batch"]:
        np.testing.assert_array_equal(a["batch"][k], b["batch"][k], err_msg=k)
    nt = a["non_tensor_batch"]
    for k in ("index", "uid", "sample", "weight_version", "__num_turns__"):
        np.testing.assert_array_equal(nt[k], b["non_tensor_batch"][k], err_msg=k)
    assert nt["index"].tolist() == [0, 0, 1, 1, 2, 2]
    assert nt["__num_turns__"].tolist() == [2] * 6
    assert nt["raw_prompt"].tolist() == [t for t in PROMPTS for _ in range(N)]
    assert b["non_tensor_batch"]["raw_prompt"].tolist() == [None] * 6


def test_multi_turn_results_count_their_turns(fleet):
    from rlfleet import Client, Trajectories
    with Client(fleet["router"].address) as c:
        first = c.generate(text=PROMPTS[0], max_new_tokens=6, temperature=0.0,
                           return_logprob=True, return_trajectory=True).one()
        follow = PROMPTS[0] + first.text + " Then"
        second = c.generate(text=follow, max_new_tokens=6, temperature=0.0,
                            return_logprob=True, return_trajectory=True)
    t = Trajectories.from_results([first, second], prompts=[PROMPTS[0], follow])
    assert t.num_turns is not None and t.num_turns.tolist() == [2, 4]
    d = t.to_dataproto()
    assert d["non_tensor_batch"]["__num_turns__"].tolist() == [2, 4]
    # The second sample's prompt reuses the first turn's tokens exactly.
    p = t.prompt_ids(1).tolist()
    assert p[:len(t.prompt_ids(0)) + 6] == t.tokens[t.offsets[0]:t.offsets[1]].tolist()
    with pytest.raises(ValueError, match="return_trajectory"):
        with Client(fleet["router"].address) as c:
            Trajectories.from_results([c.generate(text="x", max_new_tokens=1)])
