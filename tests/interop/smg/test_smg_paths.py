"""What reaches the worker through the pinned gateway, and what does not: a keyed worker (both
API keys set) behind the real SMG on its key-free --sglang-port listener, with a logging proxy
between them that records every Generate request and answer (sglang_proxy.py)."""

import json
import subprocess
import time
import urllib.error
import urllib.request

import grpc
import pytest
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from conftest import (ADMIN_KEY, ALIAS, DATA_KEY, MODEL, PAUSE_TIMEOUT_S, RLCTL, rlctl,
                      rlctl_json)

PROMPT = "Once upon a time"
ADMIN_ENV = {"RL_ADMIN_API_KEY": ADMIN_KEY}


def sampled(gw, headers=None, **extra):
    status, body = gw.post("/v1/completions", {
        "model": gw.model, "prompt": PROMPT, "max_tokens": 24, "temperature": 1.0, **extra},
        headers=headers)
    assert status == 200, body
    return body["choices"][0]["text"]


def proxy(gw):
    return gw.fleet.proxy


def sent_with_id(gw, fragment):
    """The Generate requests the gateway sent whose request id contains `fragment`."""
    return [r for r in proxy(gw).generate_requests() if fragment in r.request_id]


def test_seed_in_the_request_id_reproduces_sampled_completions(keyed_gateway):
    gw = keyed_gateway
    # The x-request-id header: the gateway appends "-<uuid>", so every id is unique.
    a = sampled(gw, headers={"x-request-id": "seed=11"})
    assert a == sampled(gw, headers={"x-request-id": "seed=11"})
    b = sampled(gw, headers={"x-request-id": "seed=12"})
    assert b != a
    # SGLang's `rid` body field (extra_body in the OpenAI client) reaches the worker as is.
    assert sampled(gw, rid="ep-1/seed=11") == a
    assert sampled(gw, rid="ep-2/seed=12") == b
    assert len(sent_with_id(gw, "seed=11")) == 3
    # Chat completions and /generate carry it the same way.
    chat = {"model": gw.model, "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": 16, "temperature": 1.0}
    texts = []
    for seed in (5, 5, 6):
        status, body = gw.post("/v1/chat/completions", chat,
                               headers={"x-request-id": f"seed={seed}"})
        assert status == 200, body
        texts.append(body["choices"][0]["message"]["content"])
    assert texts[0] == texts[1] != texts[2]
    ids = []
    for seed in (5, 5, 6):
        status, body = gw.post("/generate", {
            "model": gw.model, "input_ids": [1, 403, 407], "rid": f"gen-{len(ids)}/seed={seed}",
            "sampling_params": {"max_new_tokens": 16, "temperature": 1.0}})
        assert status == 200, body
        ids.append((body[0] if isinstance(body, list) else body)["output_ids"])
    assert ids[0] == ids[1] != ids[2]
    # A malformed seed is the caller's mistake, named.
    status, body = gw.post("/v1/completions", {"model": gw.model, "prompt": PROMPT,
                                               "max_tokens": 2}, headers={"x-request-id": "seed=x"})
    assert status == 400, body
    assert "seed=" in json.dumps(body)


def test_openai_seed_and_custom_params_never_reach_the_worker(keyed_gateway):
    """SMG 1.13 drops OpenAI's `seed` and every `custom_params` shape (the README says so)."""
    gw = keyed_gateway
    sampled(gw, rid="no-seed-1", seed=11, custom_params={"seed": 11})
    status, body = gw.post("/generate", {
        "model": gw.model, "input_ids": [1, 403], "rid": "no-seed-2",
        "sampling_params": {"max_new_tokens": 4, "seed": 11, "custom_params": {"seed": 11}}})
    assert status == 200, body
    status, body = gw.post("/v1/chat/completions", {
        "model": gw.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "rid": "no-seed-3", "seed": 11, "custom_params": {"seed": 11}})
    assert status == 200, body
    sent = sent_with_id(gw, "no-seed-")
    assert len(sent) == 3
    for r in sent:
        assert not r.sampling_params.HasField("custom_params"), r


def test_completions_logprobs_are_dropped_by_the_gateway_not_the_worker(keyed_gateway):
    gw = keyed_gateway
    status, body = gw.post("/v1/completions", {
        "model": gw.model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 2,
        "rid": "lp-completions"})
    assert status == 200, body
    assert body["choices"][0].get("logprobs") is None  # the gateway's TODO (SMG 1.13)
    # The worker was asked for them and answered with them, top 2 per token.
    (req,) = sent_with_id(gw, "lp-completions")
    assert req.return_logprob and req.top_logprobs_num == 2
    (answer,) = proxy(gw).generate_responses("lp-completions")
    lps = answer.complete.output_logprobs
    assert len(lps.token_logprobs) == 4
    assert [len(t.values) for t in lps.top_logprobs] == [2, 2, 2, 2]
    # What does carry them through the gateway: chat completions and /generate.
    status, body = gw.post("/v1/chat/completions", {
        "model": gw.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert status == 200, body
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 for c in content)
    status, body = gw.post("/generate", {
        "model": gw.model, "input_ids": [1, 403, 407], "return_logprob": True,
        "top_logprobs_num": 2, "rid": "lp-generate",
        "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert status == 200, body
    meta = (body[0] if isinstance(body, list) else body)["meta_info"]
    assert len(meta["output_token_logprobs"]) == 4
    # /generate keeps the chosen tokens' logprobs but drops the top ones the worker sent.
    assert "output_top_logprobs" not in meta
    (answer,) = proxy(gw).generate_responses("lp-generate")
    assert [len(t.values) for t in answer.complete.output_logprobs.top_logprobs] == [2, 2, 2, 2]


def test_logit_bias_never_reaches_the_worker_which_refuses_it(keyed_gateway):
    gw = keyed_gateway
    # The gateway accepts it with a 200 and never sends it (SMG 1.13): documented, not ours.
    status, body = gw.post("/v1/completions", {
        "model": gw.model, "prompt": PROMPT, "max_tokens": 2, "logit_bias": {"432": 100},
        "rid": "bias-1"})
    assert status == 200, body
    (req,) = sent_with_id(gw, "bias-1")
    assert len(req.sampling_params.logit_bias) == 0
    # Sent to the worker, it is refused by name.
    with grpc.insecure_channel(gw.fleet.sglang) as ch:
        stub = pb_grpc.SglangSchedulerStub(ch)
        request = pb.GenerateRequest(request_id="bias-direct",
                                     tokenized=pb.TokenizedInput(input_ids=[1, 403]))
        request.sampling_params.max_new_tokens = 2
        request.sampling_params.logit_bias["432"] = 100.0
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(request, timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "logit_bias" in e.value.details()


def test_a_keyed_worker_serves_the_gateway_on_its_key_free_sglang_port(keyed_gateway):
    gw = keyed_gateway
    # Every call above went through the gateway to a worker started with both keys. SMG sends
    # no credential on gRPC at all, which is why the key-free listener exists:
    seen = proxy(gw).metadata_seen()
    assert {m for m, _ in seen} >= {"HealthCheck", "GetModelInfo", "Generate"}
    assert all(k != "authorization" for _, md in seen for k, _ in md)
    # The keyed port keeps its keys for SGLang's protocol, and says why a key-less call failed.
    with grpc.insecure_channel(gw.worker) as ch:
        stub = pb_grpc.SglangSchedulerStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.HealthCheck(pb.HealthCheckRequest(), timeout=10,
                                metadata=[("authorization", f"Bearer {DATA_KEY}")]).healthy
    assert "--sglang-port" in gw.fleet.worker_log.read_text()
    # rl.v1 is not on the key-free listener; on the keyed port it takes the key.
    out = subprocess.run([RLCTL, "--target", gw.fleet.sglang, "server-info"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "UNIMPLEMENTED" in out.stderr.upper(), out
    assert "weight_version" in rlctl_json("--target", gw.worker, "server-info", env=ADMIN_ENV)
    # /flush_cache through the gateway reaches the worker's FlushCache on that listener.
    status, body = gw.post("/flush_cache", {})
    assert status == 200 and body.get("workers_flushed") == 1, body


def test_model_alias_is_the_served_model_name(keyed_gateway):
    gw = keyed_gateway
    _, models = gw.get("/v1/models")
    assert [m["id"] for m in models["data"]] == [ALIAS]
    status, body = gw.post("/v1/completions", {"model": ALIAS, "prompt": PROMPT,
                                               "max_tokens": 2})
    assert status == 200 and body["model"] == ALIAS, body
    status, body = gw.post("/v1/completions", {"model": str(MODEL), "prompt": PROMPT,
                                               "max_tokens": 2})
    assert status == 404, body


def _post_raw(gw, body, timeout):
    req = urllib.request.Request(gw.url + "/v1/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_paused_worker_answers_within_the_bound(keyed_gateway):
    gw = keyed_gateway
    # The client's timeout is far above the bound and the gateway's retries; a hang fails it.
    client_timeout_s = 30 * PAUSE_TIMEOUT_S
    rlctl("--target", gw.worker, "pause", "--mode", "in_place", env=ADMIN_ENV)
    try:
        for stream in (False, True):
            status, text = _post_raw(gw, {"model": gw.model, "prompt": PROMPT, "max_tokens": 8,
                                          "stream": stream}, client_timeout_s)
            assert status == 503, text
            assert "--sglang-pause-timeout-s" in text
        status, body = gw.post("/generate", {
            "model": gw.model, "input_ids": [1, 403], "sampling_params": {"max_new_tokens": 4}},
            timeout=client_timeout_s)
        assert status == 503, body
    finally:
        rlctl("--target", gw.worker, "continue", env=ADMIN_ENV)
    # Resumed: served again once the worker's guard sees it (it samples every 50 ms).
    deadline = time.monotonic() + 30
    while True:
        status, body = gw.post("/v1/completions", {"model": gw.model, "prompt": PROMPT,
                                                   "max_tokens": 4}, timeout=client_timeout_s)
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, body
        time.sleep(0.1)
