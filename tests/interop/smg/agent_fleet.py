"""The agent-facing stack of the episode tests: rl-worker, a recording proxy (worker_proxy.py)
between it and rl-router, rl-router with its key-free --sglang-port, and the real SMG gateway in
front of the router with a chat template; the pinned `openai` and `anthropic` clients on the
gateway, and a Router stub for GetEpisode. docs/episodes.md."""

import json
import subprocess

import anthropic
import grpc
import openai

from conftest import SMG, START_TIMEOUT_S
from rlfleet._stubs import router_pb2, router_pb2_grpc
from rltest import free_port, start_router, start_worker, stop_process, wait_for
from worker_proxy import WorkerProxy


class AgentFleet:
    """`model` served by one rl-worker behind rl-router, SMG (`template`, `smg_args`) in front."""

    def __init__(self, logs, model, template, smg_args=(), worker_args=()):
        self.worker = self.proxy = self.router = self.smg = None
        self.model = str(model)
        try:
            self.worker = start_worker(*worker_args, model=model, log_path=logs / "worker.log")
            self.proxy = WorkerProxy(self.worker.address)
            self.router = start_router([self.proxy.address], "--sglang-port", "0",
                                       tokenizer=model, log_path=logs / "router.log")
            line = self.router.proc.stdout.readline()
            if not line.startswith("sglang listening on "):
                raise RuntimeError(f"rl-router printed no sglang listener: {line!r}")
            sglang = line.split()[-1]
            port = free_port()
            self.smg_log = logs / "smg.log"
            self.smg = subprocess.Popen(
                [str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port),
                 "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                 "--worker-urls", f"grpc://{sglang}", "--model-path", self.model,
                 "--chat-template", str(template), *smg_args],
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
                        model=self.model, messages=[{"role": "user", "content": "hi"}],
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
        if self.router is not None:
            self.router.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.worker is not None:
            self.worker.stop()


def episode_header(episode_id, seed=None):
    """SMG forwards x-request-id as the request id (with "-<uuid>" appended): the router reads
    the episode from its `episode=` token, the worker the seed from `seed=`."""
    rid = f"episode={episode_id}" + (f";seed={seed}" if seed is not None else "")
    return {"x-request-id": rid}


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


def index_calls(calls):
    """tuple(prompt ids) -> [WorkerCall] of WorkerProxy.calls()."""
    by_prompt = {}
    for c in calls.values():
        by_prompt.setdefault(tuple(c.input_ids), []).append(c)
    return by_prompt


def check_sample_against_worker(episode, sample, calls, by_prompt, stop_ids):
    """The sample is, byte for byte, what the worker received and generated (its own record:
    `calls` = WorkerProxy.calls(), `by_prompt` = index_calls(calls)):

    - every turn of the branch reached the worker with the sample's prefix as its prompt, and
      what the worker generated there follows in the sample (a non-last turn's final stop token
      may be absent when the next turn's prompt went on without it: the chat template rendered
      the end of the turn another way; docs/episodes.md);
    - the loss mask is 1 on those outputs, and every run of 1s is tokens the worker generated
      right after exactly the sample's tokens before the run, with the sample's logprobs (a
      prompt may reuse generated tokens of a turn that is not its parent: mask 1 there too);
    - so the mask covers exactly the generated tokens."""
    tokens = list(sample.trajectory.tokens)
    mask = list(sample.trajectory.loss_mask)
    lps = list(sample.trajectory.rollout_logp)
    assert len(mask) == len(lps) == len(sample.trajectory.token_weight_versions) == len(tokens)
    for k, ti in enumerate(sample.turns):
        t = episode.turns[ti]
        call = calls.get(t.request_id)
        assert call is not None, f"turn {ti} ({t.request_id}) never reached the worker"
        assert call.input_ids == tokens[:t.prompt_tokens], f"turn {ti}: prompt differs"
        out = call.outputs.get(t.index, [])
        assert len(out) == t.completion_tokens, f"turn {ti}: {len(out)} != {t.completion_tokens}"
        seg = tokens[t.prompt_tokens:t.prompt_tokens + len(out)]
        if seg != out:
            assert k < len(sample.turns) - 1 and out[-1] in stop_ids and seg[:-1] == out[:-1], \
                f"turn {ti}: generated {out}, sample holds {seg}"
            out = out[:-1]
        assert mask[t.prompt_tokens:t.prompt_tokens + len(out)] == [1] * len(out), \
            f"turn {ti}: generated tokens not masked 1"
    a = 0
    while a < len(tokens):
        if not mask[a]:
            a += 1
            continue
        best = 0
        for call in by_prompt.get(tuple(tokens[:a]), []):
            for index, out in call.outputs.items():
                n = 0
                while a + n < len(tokens) and n < len(out) and mask[a + n] and \
                        out[n] == tokens[a + n]:
                    n += 1
                if n > best:
                    best = n
                    for j in range(n):
                        want = call.logprobs[index][j]
                        assert abs(lps[a + j] - want) < 1e-5, \
                            f"token {a + j}: logprob {lps[a + j]} != the worker's {want}"
        assert best > 0, f"token {a} is masked 1 but the worker never generated it there"
        a += best


# The test's agent: one tool it declares, one chat turn, its own tool step after each answer.
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                   "required": ["q"]}}}]


def openai_turn(fleet, episode_id, messages, stream, max_tokens=8):
    """(content, completion tokens, per-token logprobs or None) of one chat completion."""
    args = dict(model=fleet.model, messages=messages, max_tokens=max_tokens, temperature=0,
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
