"""Agent episodes through the real Shepherd Model Gateway in front of rl-router: an unmodified
agent on the official `openai` and `anthropic` clients (only the base URL changes) runs
multi-turn episodes with tool calls, streaming and not; Router.GetEpisode exports every branch
with the exact tokens the worker received and generated (checked against the worker itself),
loss mask 1 on exactly the generated tokens of every turn. docs/episodes.md."""

import json
import math
import subprocess
from pathlib import Path

import anthropic
import grpc
import openai
import pytest

from conftest import MODEL, SMG, START_TIMEOUT_S, rlctl_json
from rlfleet._stubs import router_pb2, router_pb2_grpc
from rltest import free_port, start_router, start_worker, stop_process, wait_for

TEMPLATE = Path(__file__).resolve().parent / "episode_template.jinja"
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                   "required": ["q"]}}}]


class AgentFleet:
    """rl-worker, rl-router (its key-free --sglang-port) and SMG in front of the router."""

    def __init__(self, logs):
        self.worker = self.router = self.smg = None
        try:
            self.worker = start_worker(log_path=logs / "worker.log")
            self.router = start_router([self.worker], "--sglang-port", "0",
                                       log_path=logs / "router.log")
            line = self.router.proc.stdout.readline()
            if not line.startswith("sglang listening on "):
                raise RuntimeError(f"rl-router printed no sglang listener: {line!r}")
            sglang = line.split()[-1]
            port = free_port()
            self.smg_log = logs / "smg.log"
            self.smg = subprocess.Popen(
                [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port),
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                 "--worker-urls", f"grpc://{sglang}", "--model-path", str(MODEL),
                 "--chat-template", str(TEMPLATE)],
                stdout=open(self.smg_log, "w"), stderr=subprocess.STDOUT)
            self.url = f"http://127.0.0.1:{port}"
            self.openai = openai.OpenAI(base_url=self.url + "/v1", api_key="unused",
                                        max_retries=0, timeout=60)
            self.anthropic = anthropic.Anthropic(base_url=self.url, api_key="unused",
                                                 max_retries=0, timeout=60)
            self.channel = grpc.insecure_channel(self.router.address)
            self.stub = router_pb2_grpc.RouterStub(self.channel)

            def ready():
                assert self.smg.poll() is None, self.smg_log.read_text()[-4000:]
                try:
                    self.openai.chat.completions.create(
                        model=str(MODEL), messages=[{"role": "user", "content": "hi"}],
                        max_tokens=1)
                    return True
                except (openai.APIConnectionError, openai.APIStatusError):
                    return False

            wait_for(ready, "smg in front of rl-router", timeout_s=START_TIMEOUT_S,
                     interval_s=0.25, detail=lambda: self.smg_log.read_text()[-4000:])
        except BaseException:
            self.stop()
            raise

    def episode(self, episode_id):
        return self.stub.GetEpisode(router_pb2.GetEpisodeRequest(episode_id=episode_id),
                                    timeout=30)

    def stop(self):
        if self.smg is not None:
            stop_process(self.smg)
        for s in (self.router, self.worker):
            if s is not None:
                s.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    f = AgentFleet(tmp_path_factory.mktemp("episodes"))
    try:
        yield f
    finally:
        f.stop()


def episode_header(episode_id):
    # SMG forwards x-request-id as the request id (with "-<uuid>" appended): the router reads
    # the episode from its `episode=` token.
    return {"x-request-id": f"episode={episode_id}"}


def openai_turn(fleet, episode_id, messages, stream, max_tokens=8):
    """(content, completion tokens, per-token logprobs or None) of one chat completion."""
    args = dict(model=str(MODEL), messages=messages, max_tokens=max_tokens, temperature=0,
                tools=TOOLS, extra_headers=episode_header(episode_id))
    if not stream:
        r = fleet.openai.chat.completions.create(logprobs=True, top_logprobs=2, **args)
        choice = r.choices[0]
        assert choice.message.tool_calls in (None, [])
        lps = [c.logprob for c in choice.logprobs.content]
        return choice.message.content or "", r.usage.completion_tokens, lps
    text, usage = [], None
    for event in fleet.openai.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **args):
        if event.choices and event.choices[0].delta.content:
            text.append(event.choices[0].delta.content)
        if event.usage is not None:
            usage = event.usage
    assert usage is not None
    return "".join(text), usage.completion_tokens, None


def agent_tool_step(messages, i):
    """What the test's agent adds after a model turn: a tool call of its own and the result."""
    call_id = f"call_{i}"
    messages.append({"role": "assistant", "content": None, "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"q": f"word{i}"})}}]})
    messages.append({"role": "tool", "tool_call_id": call_id, "content": f"found {i}"})
    messages.append({"role": "user", "content": "Go on."})


def mask_runs(mask):
    """Lengths of the runs of 1s in `mask`."""
    runs, n = [], 0
    for m in list(mask) + [0]:
        if m:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs


def check_against_worker(fleet, tokens, prompt_len, n):
    """The worker, given tokens[:prompt_len] greedily, generates exactly tokens[prompt_len:+n]."""
    out = rlctl_json("--target", fleet.worker.address, "generate", "--ids",
                     ",".join(map(str, tokens[:prompt_len])), "--max-new-tokens", str(n),
                     "--temperature", "0")["final"]
    assert out["output_ids"] == tokens[prompt_len:prompt_len + n]


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
        check_against_worker(fleet, tokens, t.prompt_tokens, t.completion_tokens)
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
    tokens = list(sample.trajectory.tokens)
    assert mask_runs(sample.trajectory.loss_mask) == completions
    for t in e.turns:
        check_against_worker(fleet, tokens, t.prompt_tokens, t.completion_tokens)


def test_unknown_episode_is_not_found_and_a_bad_id_is_refused(fleet):
    with pytest.raises(grpc.RpcError) as err:
        fleet.episode("never_recorded")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(openai.BadRequestError) as bad:
        fleet.openai.chat.completions.create(
            model=str(MODEL), messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            extra_headers={"x-request-id": "episode=a!b"})
    assert "episode" in str(bad.value)
