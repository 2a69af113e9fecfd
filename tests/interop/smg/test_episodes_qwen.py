"""The 5-turn tool-call episode of test_episodes.py on a made Qwen3 model with Qwen2's real
tokenizer and a ChatML template in Qwen's tool layout (made_qwen.py, qwen_template.jinja), the
gateway reading tool calls with SMG's qwen parser (--tool-call-parser qwen): the agent (the
pinned `openai` client, streaming and not) declares a tool and adds an assistant tool call and
the tool's result after each answer. The export is one chain, byte for byte what the worker
received and generated (worker_proxy.py's record), the loss mask exactly every turn's
generated tokens, the last turn's logprobs those the agent received. docs/episodes.md."""

import math

import pytest

from agent_fleet import (TOOLS, AgentFleet, agent_tool_step, check_sample_against_worker,
                         index_calls, mask_runs, openai_turn)
from conftest import SMG, rlctl_json
from made_qwen import QWEN_TEMPLATE, make_qwen3_model
from rlfleet.prompts import ChatTemplate



@pytest.fixture(scope="module")
def qwen_fleet(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    logs = tmp_path_factory.mktemp("episodes-qwen")
    model = make_qwen3_model(logs / "qwen3")
    f = AgentFleet(logs, model, QWEN_TEMPLATE, smg_args=["--tool-call-parser", "qwen"])
    try:
        yield f
    finally:
        f.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_qwen_five_turn_tool_episode_exports_exact_tokens(qwen_fleet, stream):
    fleet = qwen_fleet
    episode_id = f"qwen_{'stream' if stream else 'unary'}"
    messages = [{"role": "system", "content": "You look words up."},
                {"role": "user", "content": "What does the cat say?"}]
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
    calls = fleet.proxy.calls()
    check_sample_against_worker(e, sample, calls, index_calls(calls), stop_ids={151643, 151645})
    mask = list(sample.trajectory.loss_mask)
    lps = list(sample.trajectory.rollout_logp)
    # A stop token generated mid-episode stays in the trajectory: ChatML renders it back.
    assert mask_runs(mask) == completions
    for m, lp in zip(mask, lps):
        assert (m == 1) == (not math.isnan(lp))
    if logprobs is not None:  # the last turn's logprobs as the agent saw them
        last = e.turns[-1]
        got = lps[last.prompt_tokens:last.prompt_tokens + last.completion_tokens]
        assert len(got) == len(logprobs)
        for a, b in zip(got, logprobs):
            assert abs(a - b) < 1e-4
    # The text between the model's turns is the gateway's rendering of the conversation with
    # the template (tools, tool calls, results); rlfleet renders it the same (as Hugging Face
    # does): the sample's text is the start of the final conversation rendered by rlfleet.
    rendered = ChatTemplate.from_model(fleet.model).render(messages, add_generation_prompt=False,
                                                           tools=TOOLS)
    text = rlctl_json("detokenize", "--tokenizer", fleet.model, "--ids",
                      ",".join(map(str, sample.trajectory.tokens)))["text"]
    assert rendered.startswith(text), (text, rendered)
    assert rendered.count('<tool_call>\n{"name": "lookup"') == 4
    assert rendered.count("<tool_response>") == 4 and '{"type": "function"' in rendered
