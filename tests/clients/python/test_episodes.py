"""Agent episodes on rl.v1 through the rlfleet client: turns named by `episode_id` reuse the
earlier turns' generated tokens through the router's text cache, `get_episode` exports the
branch, and `episodes_to_dataproto` lays it out as verl's batch with `__num_turns__` and
`raw_prompt` (docs/episodes.md)."""

import math

import grpc
import numpy as np
import pytest


def test_episode_on_rl_v1_exports_one_exact_sample_in_verl_layout(fleet):
    from rlfleet import Client, episodes_to_dataproto
    messages = [{"role": "user", "content": "Once upon a time"}]
    with Client(fleet["router"].address) as c:
        text = "user: Once upon a time\nassistant: "
        outputs = []
        for turn in range(3):
            r = c.generate(text=text, max_new_tokens=6, temperature=0.0, ignore_eos=True,
                           episode_id="ep_rlfleet", return_trajectory=True).one()
            outputs.append(r.output_ids)
            text += r.text + f"\nuser: more {turn}\nassistant: "
        e = c.get_episode("ep_rlfleet")
        assert [t.parent for t in e.turns] == [-1, 0, 1]
        assert [t.completion_tokens for t in e.turns] == [6, 6, 6]
        assert len(e.samples) == 1 and e.samples[0].turns == [0, 1, 2]
        # The last turn's trajectory, as Generate returned it, is the sample.
        assert e.samples[0].trajectory.tokens == r.trajectory.tokens
        assert e.samples[0].trajectory.loss_mask == r.trajectory.loss_mask
        assert sum(r.trajectory.loss_mask) == 18
        dp = episodes_to_dataproto([e], pad_token_id=0, raw_prompts={"ep_rlfleet": messages})
        b, nt = dp["batch"], dp["non_tensor_batch"]
        p = e.turns[0].prompt_tokens
        assert b["prompts"].shape == (1, p)
        assert list(b["prompts"][0]) == e.samples[0].trajectory.tokens[:p]
        resp = e.samples[0].trajectory.tokens[p:]
        assert list(b["responses"][0]) == resp
        assert int(b["response_mask"].sum()) == 18
        assert list(b["responses"][0][:6]) == outputs[0]
        assert list(b["response_mask"][0][:6]) == [1] * 6
        assert list(b["input_ids"][0]) == e.samples[0].trajectory.tokens
        assert all(not math.isnan(x) for x in b["rollout_log_probs"][0])
        assert list(nt["__num_turns__"]) == [3]
        assert nt["raw_prompt"][0] == messages
        assert list(nt["episode_id"]) == ["ep_rlfleet"]
        assert list(nt["finish_reason"]) == ["length"]
        # Removed once taken.
        c.get_episode("ep_rlfleet", remove=True)
        with pytest.raises(grpc.RpcError) as err:
            c.get_episode("ep_rlfleet")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            c.generate(text="x", max_new_tokens=1, episode_id="bad id")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_episodes_to_dataproto_pads_branches_of_a_fork():
    from rlfleet import Episode, EpisodeSample, EpisodeTurn, Trajectory, episodes_to_dataproto
    nan = float("nan")

    def traj(tokens, mask):
        return Trajectory(tokens, mask, [(-0.5 if m else nan) for m in mask], 3,
                          [3] * len(tokens))

    turns = [EpisodeTurn("a", 0, -1, 2, 2, "w", 3, "length"),
             EpisodeTurn("b", 0, 0, 5, 1, "w", 3, "stop"),
             EpisodeTurn("c", 0, 0, 6, 2, "w", 3, "length")]
    e = Episode("fork", turns, [
        EpisodeSample(traj([1, 5, 7, 8, 9, 10], [0, 0, 1, 1, 0, 1]), [0, 1]),
        EpisodeSample(traj([1, 5, 7, 8, 9, 11, 12, 13], [0, 0, 1, 1, 0, 0, 1, 1]), [0, 2])])
    dp = episodes_to_dataproto([e], pad_token_id=0)
    b, nt = dp["batch"], dp["non_tensor_batch"]
    assert b["prompts"].tolist() == [[1, 5], [1, 5]]
    assert b["responses"].tolist() == [[7, 8, 9, 10, 0, 0], [7, 8, 9, 11, 12, 13]]
    assert b["response_mask"].tolist() == [[1, 1, 0, 1, 0, 0], [1, 1, 0, 0, 1, 1]]
    assert b["rollout_weight_versions"].tolist()[0] == [3, 3, 3, 3, -1, -1]
    assert np.allclose(b["rollout_log_probs"][0], [-0.5, -0.5, 0, -0.5, 0, 0])
    assert b["attention_mask"].tolist()[0] == [1, 1, 1, 1, 1, 1, 0, 0]
    assert list(nt["__num_turns__"]) == [2, 2]
    assert list(nt["finish_reason"]) == ["stop", "length"]
    assert list(nt["raw_prompt"]) == [None, None]
    with pytest.raises(ValueError):
        episodes_to_dataproto([e], max_response_length=4)
