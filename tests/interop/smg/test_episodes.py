"""Agent episodes through the real Shepherd Model Gateway in front of rl-router: an unmodified
agent on the official `openai` and `anthropic` clients (only the base URL changes) runs
multi-turn episodes with tool calls, streaming and not; Router.GetEpisode exports every branch
with the exact tokens the worker received and generated (checked against the worker itself),
loss mask 1 on exactly the generated tokens of every turn (checked against the worker's own
record: worker_proxy.py between the router and the worker). docs/episodes.md."""

import math
from pathlib import Path

import grpc
import openai
import pytest

from agent_fleet import (TOOLS, AgentFleet, agent_tool_step, check_sample_against_worker,
                         episode_header, index_calls, mask_runs, openai_turn)
from conftest import MODEL, SMG, rlctl, rlctl_json
from rlfleet._stubs import router_pb2

TEMPLATE = Path(__file__).resolve().parent / "episode_template.jinja"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    f = AgentFleet(tmp_path_factory.mktemp("episodes"), MODEL, TEMPLATE)
    try:
        yield f
    finally:
        f.stop()


def check_against_worker(fleet, e, sample):
    """The sample is byte for byte what the worker received and generated (its own record)."""
    calls = fleet.proxy.calls()
    check_sample_against_worker(e, sample, calls, index_calls(calls), stop_ids={2})


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_openai_five_turn_episode_with_tool_calls_exports_exact_tokens(fleet, stream):
    episode_id = f"openai_{'stream' if stream else 'unary'}"
    messages = [{"role": "user", "content": "Tell me a story about a cat."}]
    completions, logprobs = [], None
    for i in range(5):
        content, n, logprobs = openai_turn(fleet, episode_id, messages, stream)
        assert n > 0
        completions.append(n)
        messages.append({"role": "assistant", "content": content})
        if i < 4:
            agent_tool_step(messages, i)
    e = fleet.episode(episode_id)
    assert [t.parent for t in e.turns] == [-1, 0, 1, 2, 3]
    assert [t.completion_tokens for t in e.turns] == completions
    assert len(e.samples) == 1
    sample = e.samples[0]
    assert list(sample.turns) == [0, 1, 2, 3, 4]
    tokens = list(sample.trajectory.tokens)
    mask = list(sample.trajectory.loss_mask)
    lps = list(sample.trajectory.rollout_logp)
    assert len(mask) == len(lps) == len(sample.trajectory.token_weight_versions) == len(tokens)
    # Every turn's generated tokens, reused exactly in the later prompts, and nothing else.
    assert mask_runs(mask) == completions
    for t in e.turns:
        assert mask[t.prompt_tokens:t.prompt_tokens + t.completion_tokens] == \
            [1] * t.completion_tokens
        assert mask[t.prompt_tokens - 1] == 0
    check_against_worker(fleet, e, sample)
    for m, lp in zip(mask, lps):
        assert (m == 1) == (not math.isnan(lp))
        assert m == 0 or lp <= 0
    if logprobs is not None:  # the last turn's logprobs as the agent saw them
        last = e.turns[-1]
        got = lps[last.prompt_tokens:last.prompt_tokens + last.completion_tokens]
        assert len(got) == len(logprobs)
        for a, b in zip(got, logprobs):
            assert abs(a - b) < 1e-4


def test_history_edited_at_turn_three_forks_into_two_samples(fleet):
    episode_id = "forked"
    messages = [{"role": "user", "content": "Tell me a story."}]
    first, _, _ = openai_turn(fleet, episode_id, messages, False)
    messages += [{"role": "assistant", "content": first},
                 {"role": "user", "content": "More."}]
    second, _, _ = openai_turn(fleet, episode_id, messages, False)
    # Turn 3 goes on from turn 2, then the agent edits turn 2's answer and asks again.
    go_on = messages + [{"role": "assistant", "content": second},
                        {"role": "user", "content": "And then?"}]
    openai_turn(fleet, episode_id, go_on, False)
    edited = messages + [{"role": "assistant", "content": "The cat slept."},
                         {"role": "user", "content": "And then?"}]
    openai_turn(fleet, episode_id, edited, False)
    e = fleet.episode(episode_id)
    assert [t.parent for t in e.turns] == [-1, 0, 1, 0]
    assert [list(s.turns) for s in e.samples] == [[0, 1, 2], [0, 3]]
    a, b = (list(s.trajectory.tokens) for s in e.samples)
    # Both hold turn 1's whole trajectory, then part ways within "More.\nassistant: ..." (at
    # the latest where turn 2's answer and the edited one begin).
    t0 = e.turns[0]
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert t0.prompt_tokens + t0.completion_tokens < common <= e.turns[1].prompt_tokens
    # The edited answer is prompt (mask 0) in the second branch; turn 1's output is 1 in both.
    for s in e.samples:
        check_against_worker(fleet, e, s)
        mask = list(s.trajectory.loss_mask)
        t0 = e.turns[0]
        assert mask[t0.prompt_tokens:t0.prompt_tokens + t0.completion_tokens] == \
            [1] * t0.completion_tokens
    assert sum(e.samples[1].trajectory.loss_mask) == \
        e.turns[0].completion_tokens + e.turns[3].completion_tokens
    # rlctl shows the same episode.
    shown = rlctl_json("--target", fleet.router.address, "episode", "--episode-id", episode_id)
    assert [s["turns"] for s in shown["samples"]] == [[0, 1, 2], [0, 3]]
    # remove=True hands the episode over once.
    fleet.stub.GetEpisode(router_pb2.GetEpisodeRequest(episode_id=episode_id, remove=True))
    with pytest.raises(grpc.RpcError) as err:
        fleet.episode(episode_id)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # The router's metrics count it (the Prometheus text of GetMetrics, as /metrics serves it).
    text = rlctl("--target", fleet.router.address, "metrics")
    assert "rl_router_episodes_removed_total 1\n" in text
    live = int(next(line.split()[1] for line in text.splitlines()
                    if line.startswith("rl_router_episodes_live ")))
    recorded = int(next(line.split()[1] for line in text.splitlines()
                        if line.startswith("rl_router_episodes_turns_recorded_total ")))
    assert live >= 2 and recorded >= 4 + 2 * 5  # the two 5-turn episodes and this one


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_anthropic_messages_episode_exports_exact_tokens(fleet, stream):
    episode_id = f"anthropic_{'stream' if stream else 'unary'}"
    messages = [{"role": "user", "content": "Tell me a story about a dog."}]
    completions = []
    for _ in range(3):
        args = dict(model=str(MODEL), max_tokens=8, messages=messages, extra_body={"temperature": 0},
                    extra_headers=episode_header(episode_id))
        if stream:
            with fleet.anthropic.messages.stream(**args) as s:
                text = "".join(s.text_stream)
                final = s.get_final_message()
        else:
            final = fleet.anthropic.messages.create(**args)
            text = "".join(b.text for b in final.content if b.type == "text")
        completions.append(final.usage.output_tokens)
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": "Go on."}]
    e = fleet.episode(episode_id)
    assert [t.completion_tokens for t in e.turns] == completions
    assert [t.parent for t in e.turns] == [-1, 0, 1]
    assert len(e.samples) == 1
    sample = e.samples[0]
    assert mask_runs(sample.trajectory.loss_mask) == completions
    check_against_worker(fleet, e, sample)


def test_unknown_episode_is_not_found_and_a_bad_id_is_refused(fleet):
    with pytest.raises(grpc.RpcError) as err:
        fleet.episode("never_recorded")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(openai.BadRequestError) as bad:
        fleet.openai.chat.completions.create(
            model=str(MODEL), messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"x-request-id": "episode=a!b"})
    assert "episode" in str(bad.value)
