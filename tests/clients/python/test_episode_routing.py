"""R3 in agent episodes (docs/episodes.md, "Routing (R3)"): a tiny Qwen3-MoE on two real
rl-workers started with --enable-return-routed-experts, behind rl-router. A 3-turn episode with a
fork at turn 1: each exported branch's routing equals, token by token, what the workers returned
for its turns (each token's routing from the turn that first processed it), shaped [tokens - 1,
MoE layers, top_k]; the verl batch carries it aligned with input_ids; rlctl shows it. Without
the flag no routing; an episode with a turn sent without routing is refused, naming the turn."""

import subprocess

import grpc
import numpy as np
import pytest

from rltest import BIN, start_router, start_worker


@pytest.fixture(scope="module")
def moe_fleet(tmp_path_factory):
    model = tmp_path_factory.mktemp("moe") / "model"
    subprocess.run([str(BIN / "rlctl"), "make-model", "--arch", "qwen3_moe", "--size", "tiny",
                    "--out", str(model)], check=True, capture_output=True, timeout=60)
    workers, router = [], None
    try:
        for _ in range(2):
            workers.append(start_worker("--kv-cache-gb", "0.02", "--enable-return-routed-experts",
                                        model=model))
        router = start_router(workers, tokenizer=model)
        yield router
    finally:
        for s in ([router] if router else []) + workers:
            s.stop()


def _turn(client, episode, ids, routed=True, seed=1):
    return client.generate(input_ids=ids, max_new_tokens=5, temperature=1.0, seed=seed,
                           ignore_eos=True, episode_id=episode, return_trajectory=True,
                           return_routed_experts=routed, return_expert_weights=routed).one()


def _expected(turns, n_tokens):
    """Per position [0, n_tokens - 1): (ids, weights) from the first of `turns` (root first) whose
    returned routing covers it."""
    ids, wts = [], []
    for pos in range(n_tokens - 1):
        for r in turns:
            re = r.routed_experts
            if re.start_pos <= pos < re.start_pos + re.shape[0]:
                ids.append(re.expert_ids()[pos - re.start_pos])
                wts.append(re.expert_weights()[pos - re.start_pos])
                break
        else:
            raise AssertionError(f"no turn routed position {pos}")
    return np.stack(ids), np.stack(wts)


def test_each_branch_carries_the_routing_its_turns_were_given(moe_fleet):
    from rlfleet import Client, episodes_to_dataproto
    with Client(moe_fleet.address) as c:
        p1 = [5, 17, 300, 42]
        r1 = _turn(c, "r3_ep", p1)
        p2 = p1 + r1.output_ids + [7, 8]
        r2 = _turn(c, "r3_ep", p2, seed=2)
        p3 = p2 + r2.output_ids + [9]
        r3 = _turn(c, "r3_ep", p3, seed=3)
        # The agent edits its history after turn 1: a fork sharing turn 1's tokens.
        p4 = p1 + r1.output_ids + [11, 12, 13]
        r4 = _turn(c, "r3_ep", p4, seed=4)
        for r, p in ((r1, p1), (r2, p2), (r3, p3), (r4, p4)):
            # Each worker routed the whole prompt and every output token but the last.
            assert r.routed_experts.start_pos == 0
            assert r.routed_experts.shape == (len(p) + 4, 2, 4)

        plain = c.get_episode("r3_ep")
        assert all(s.routed_experts is None for s in plain.samples)
        assert [t.has_routed_experts for t in plain.turns] == [True] * 4
        e = c.get_episode("r3_ep", return_routed_experts=True, return_expert_weights=True)
        assert [t.parent for t in e.turns] == [-1, 0, 1, 0]
        assert [s.turns for s in e.samples] == [[0, 1, 2], [0, 3]]
        for s, turns, last in ((e.samples[0], [r1, r2, r3], r3), (e.samples[1], [r1, r4], r4)):
            assert s.trajectory.tokens == last.trajectory.tokens
            n = len(s.trajectory.tokens)
            re = s.routed_experts
            assert re.start_pos == 0 and re.shape == (n - 1, 2, 4)
            want_ids, want_w = _expected(turns, n)
            np.testing.assert_array_equal(re.expert_ids(), want_ids)
            np.testing.assert_array_equal(re.expert_weights(), want_w)
            # Turn 1's tokens keep turn 1's routing; the rest is the later turns' own.
            k = len(p1) + 4
            np.testing.assert_array_equal(re.expert_ids()[:k], r1.routed_experts.expert_ids())
            np.testing.assert_array_equal(re.expert_ids()[-1], last.routed_experts.expert_ids()[-1])

        ids_only = c.get_episode("r3_ep", return_routed_experts=True)
        assert ids_only.samples[0].routed_experts.expert_weights() is None

        dp = episodes_to_dataproto([e], pad_token_id=0)
        b = dp["batch"]
        P = b["prompts"].shape[1]
        assert b["routed_experts"].shape == (2, b["input_ids"].shape[1], 2, 4)
        assert b["routed_expert_weights"].shape == b["routed_experts"].shape
        for row, s in enumerate(e.samples):
            n = len(s.trajectory.tokens)
            col = P - len(p1)  # trajectory token 0's column (every branch starts from p1)
            assert list(b["input_ids"][row, col:col + n]) == s.trajectory.tokens
            np.testing.assert_array_equal(b["routed_experts"][row, col:col + n - 1],
                                          s.routed_experts.expert_ids())
            assert (b["routed_experts"][row, :col] == -1).all()
            assert (b["routed_experts"][row, col + n - 1:] == -1).all()

        out = subprocess.run([str(BIN / "rlctl"), "--target", moe_fleet.address, "episode",
                              "--episode-id", "r3_ep", "--routed-experts"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        n0 = len(e.samples[0].trajectory.tokens)
        assert f"routed experts [{n0 - 1}, 2, 4] from token 0" in out.stdout, out.stdout


def test_a_branch_with_a_turn_without_routing_is_refused(moe_fleet):
    from rlfleet import Client
    with Client(moe_fleet.address) as c:
        # Never asked: the episode exports as before, without routing; asked: refused.
        r = _turn(c, "r3_none", [5, 17, 300], routed=False)
        assert r.routed_experts is None
        e = c.get_episode("r3_none")
        assert e.samples[0].routed_experts is None and not e.turns[0].has_routed_experts
        with pytest.raises(grpc.RpcError) as err:
            c.get_episode("r3_none", return_routed_experts=True)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "turn 0" in err.value.details() and "without routing" in err.value.details()

        # A second turn sent without routing after one with: its branch is refused, naming it;
        # the refusal removes nothing.
        r1 = _turn(c, "r3_mixed", [5, 17, 300])
        _turn(c, "r3_mixed", [5, 17, 300] + r1.output_ids + [4], routed=False)
        with pytest.raises(grpc.RpcError) as err:
            c.get_episode("r3_mixed", return_routed_experts=True, remove=True)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "turn 1 (request" in err.value.details(), err.value.details()
        assert [t.has_routed_experts for t in c.get_episode("r3_mixed").turns] == [True, False]
        with pytest.raises(grpc.RpcError) as err:
            c.get_episode("r3_mixed", return_expert_weights=True)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
