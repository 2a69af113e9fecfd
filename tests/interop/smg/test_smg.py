"""rl-worker behind the real Shepherd Model Gateway: OpenAI-compatible and SGLang-native HTTP
traffic reaches our engine through sglang.grpc.scheduler.SglangScheduler."""

import json
import socket

from conftest import MODEL, rlctl, rlctl_json
from rltest import wait_for

PROMPT = "Once upon a time"


def server_info(gw):
    return rlctl_json("--target", gw.worker, "server-info")


def rlctl_generate_ids(gw, ids, max_new_tokens, logprobs=False):
    args = ["--target", gw.worker, "generate", "--ids", ",".join(map(str, ids)),
            "--max-new-tokens", str(max_new_tokens), "--temperature", "0"]
    if logprobs:
        args.append("--logprobs")
    return rlctl_json(*args)["final"]


def prompt_ids(text):
    # The gateway tokenizes completions without special tokens (no BOS).
    return rlctl_json("tokenize", "--tokenizer", str(MODEL), "--no-special", "--text", text)["ids"]


def test_completions_greedy_equals_rlctl_generate(gateway):
    status, body = gateway.post("/v1/completions", {
        "model": gateway.model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0})
    assert status == 200, body
    ids = prompt_ids(PROMPT)
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 24
    assert body["choices"][0]["finish_reason"] == "length"
    ours = rlctl_generate_ids(gateway, ids, 24)
    assert len(ours["output_ids"]) == 24
    assert body["choices"][0]["text"] == ours["text"]
    assert ours["text"]


def test_completions_streaming_matches_non_streaming(gateway):
    request = {"model": gateway.model, "prompt": PROMPT, "max_tokens": 20, "temperature": 0}
    status, whole = gateway.post("/v1/completions", request)
    assert status == 200, whole
    events = gateway.stream("/v1/completions", request)
    assert len(events) >= 2  # incremental chunks, then the finish
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    assert text == whole["choices"][0]["text"]
    finishes = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])


def test_generate_input_ids_returns_our_logprobs(gateway):
    ids = [1, 403, 407, 261, 364]
    status, body = gateway.post("/generate", {
        "model": gateway.model, "input_ids": ids, "return_logprob": True,
        "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert status == 200, body
    out = body[0] if isinstance(body, list) else body
    ours = rlctl_generate_ids(gateway, ids, 6, logprobs=True)
    assert out["output_ids"] == ours["output_ids"]
    got = out["meta_info"]["output_token_logprobs"]
    assert [int(t) for _, t in got] == ours["output_ids"]
    for (lp, _), want in zip(got, ours["output_logprobs"]):
        assert abs(lp - want["logprob"]) < 1e-5
    # Input logprobs from position 0: the first token has none.
    inputs = out["meta_info"]["input_token_logprobs"]
    assert [int(t) for _, t in inputs] == ids
    assert inputs[0][0] is None
    assert all(lp is not None and lp <= 0 for lp, _ in inputs[1:])


def test_chat_completions_with_chat_template(gateway):
    status, body = gateway.post("/v1/chat/completions", {
        "model": gateway.model, "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 16, "temperature": 0})
    assert status == 200, body
    content = body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] == 16
    # The template renders "user: ...\nassistant:"; the engine continues exactly that text.
    rendered = "user: Tell me a story\nassistant:"
    status, plain = gateway.post("/v1/completions", {
        "model": gateway.model, "prompt": rendered, "max_tokens": 16, "temperature": 0})
    assert status == 200, plain
    assert content == plain["choices"][0]["text"]


def test_n_2_gives_two_completions(gateway):
    status, body = gateway.post("/v1/completions", {
        "model": gateway.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "n": 2})
    assert status == 200, body
    choices = sorted(body["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["text"] == choices[1]["text"]  # greedy: the same text twice
    assert body["usage"]["completion_tokens"] == 16
    events = gateway.stream("/v1/completions", {
        "model": gateway.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 1.0,
        "n": 2})
    indexes = {c["index"] for e in events for c in e.get("choices", [])}
    assert indexes == {0, 1}


def _drop_client_while_queued(gateway, stream):
    """Pauses the worker in place so the request stays queued, sends it over a raw socket,
    closes the socket once the worker holds it, and returns the worker's counters after."""
    rlctl("--target", gateway.worker, "pause", "--mode", "in_place")
    try:
        before = server_info(gateway)
        body = json.dumps({"model": gateway.model, "prompt": PROMPT, "max_tokens": 200,
                           "temperature": 1.0, "ignore_eos": True, "stream": stream}).encode()
        host, port = gateway.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            wait_for(lambda: server_info(gateway).get("num_waiting", 0) == 1,
                     "the request to reach the worker", interval_s=0.05)
        # The client is gone: the gateway cancels the call (and, streaming, calls Abort); the
        # worker frees the request although it is paused and never ran it.
        after = wait_for(
            lambda: (lambda i: i if i.get("num_waiting", 0) == 0 else None)(server_info(gateway)),
            "the worker to drop the request", interval_s=0.05)
        assert after.get("num_running", 0) == 0
        assert int(after.get("num_finished", 0)) == int(before.get("num_finished", 0)) + 1
    finally:
        rlctl("--target", gateway.worker, "continue")


def test_client_disconnect_mid_stream_frees_the_worker(gateway):
    _drop_client_while_queued(gateway, stream=True)
    # And one that disconnects after tokens flowed: nothing stays running.
    request = {"model": gateway.model, "prompt": PROMPT, "max_tokens": 400, "temperature": 1.0,
               "ignore_eos": True, "stream": True}
    import urllib.request
    req = urllib.request.Request(gateway.url + "/v1/completions",
                                 data=json.dumps(request).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    resp = urllib.request.urlopen(req, timeout=30)
    resp.readline()
    resp.close()
    wait_for(lambda: (lambda i: i.get("num_running", 0) == 0 and i.get("num_waiting", 0) == 0)(
        server_info(gateway)), "no running request", interval_s=0.05)


def test_client_disconnect_non_streaming_frees_the_worker(gateway):
    _drop_client_while_queued(gateway, stream=False)


def test_bad_request_maps_to_400(gateway):
    status, body = gateway.post("/v1/completions", {
        "model": gateway.model, "prompt": PROMPT, "max_tokens": 100000})
    assert status == 400, body
    assert "max_new_tokens" in json.dumps(body)
    status, body = gateway.post("/generate", {
        "model": gateway.model, "input_ids": [1, 100000], "sampling_params": {"max_new_tokens": 2}})
    assert status == 400, body
    assert "vocabulary" in json.dumps(body)
    # What the engine has no counterpart for is refused with a message, never ignored.
    status, body = gateway.post("/v1/chat/completions", {
        "model": gateway.model, "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}})
    assert status == 400, body
    assert "not supported" in json.dumps(body)


def test_flush_cache_reaches_the_worker(gateway):
    status, body = gateway.post("/v1/completions", {
        "model": gateway.model, "prompt": PROMPT + " there was", "max_tokens": 40,
        "temperature": 0})
    assert status == 200, body
    assert int(server_info(gateway).get("tree_cache_tokens", 0)) > 0
    status, body = gateway.post("/flush_cache", {})
    assert status == 200, body
    assert body.get("workers_flushed") == 1, body
    assert int(server_info(gateway).get("tree_cache_tokens", 0)) == 0


def test_worker_lists_the_sglang_scheduler_by_reflection(gateway):
    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    with grpc.insecure_channel(gateway.worker) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        reqs = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        resp = next(stub.ServerReflectionInfo(reqs, timeout=10))
    names = {s.name for s in resp.list_services_response.service}
    assert {"sglang.grpc.scheduler.SglangScheduler", "rl.v1.Worker", "rl.v1.Admin"} <= names
