"""The rlfleet package against a real router: typed sync / asyncio / streaming results with
every request field (top_logprobs_num, logprob_start_len, logprobs_at_temperature_one,
ignore_eos), the same flags on `rlctl generate`, and prompt-set preparation with the model's
chat template feeding rl-collect; the `client_id` option's header."""

import asyncio
import json
import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from rltest import BIN

OPTIONS = dict(max_new_tokens=8, temperature=0.0, ignore_eos=True, return_logprob=True,
               top_logprobs_num=3, logprob_start_len=0, logprobs_at_temperature_one=True,
               return_trajectory=True)


def check_result(r, prompt_tokens=None):
    from rlfleet import GenerateResult
    assert isinstance(r, GenerateResult)
    assert r.completion_tokens == 8 and len(r.output_ids) == 8
    assert r.finish_reason == "length"
    assert len(r.output_logprobs) == 8
    for lp, tok in zip(r.output_logprobs, r.output_ids):
        assert lp.token_id == tok and len(lp.top) == 3
        assert lp.top[0].logprob >= lp.top[1].logprob >= lp.top[2].logprob
    assert len(r.prompt_logprobs) >= 1
    assert r.token_weight_versions() == [0] * 8
    assert r.trajectory is not None
    assert len(r.trajectory.tokens) == r.prompt_tokens + 8
    assert r.trajectory.tokens[r.prompt_tokens:] == r.output_ids


def test_sync_async_and_streaming_clients(fleet):
    from rlfleet import AsyncClient, Chunk, Client, GenerateResult, SamplingParams
    addr = fleet["router"].address
    with Client(addr) as c:
        c.wait_ready()
        r = c.generate(text="Once upon a time", **OPTIONS).one()
        check_result(r)
        ids = c.generate(input_ids=[1, 403, 407, 261, 378],
                         sampling=SamplingParams(max_new_tokens=8, temperature=0.0,
                                                 ignore_eos=True),
                         **{k: v for k, v in OPTIONS.items()
                            if k not in ("max_new_tokens", "temperature", "ignore_eos")}).one()
        check_result(ids)
        assert ids.output_ids == r.output_ids  # the same prompt as text or as ids
        parts = list(c.generate_stream(text="Once upon a time", **OPTIONS))
        assert isinstance(parts[-1], GenerateResult)
        assert all(isinstance(p, Chunk) for p in parts[:-1]) and len(parts) > 1
        assert sum((p.token_ids for p in parts[:-1]), []) == parts[-1].output_ids
        assert c.model_info().weight_version == 0

    async def run():
        async with AsyncClient(addr) as ac:
            results = await asyncio.gather(*[ac.generate(text="Once upon a time", **OPTIONS)
                                             for _ in range(3)])
            streamed = [p async for p in ac.generate_stream(text="Once upon a time", **OPTIONS)]
            return results, streamed

    results, streamed = asyncio.run(run())
    for gens in results:
        a = gens.one()
        check_result(a)
        assert a.output_ids == r.output_ids
    assert streamed[-1].output_ids == r.output_ids


def test_rlctl_generate_logprob_flags(fleet):
    p = subprocess.run([str(BIN / "rlctl"), "--target", fleet["router"].address, "--json",
                        "generate", "--text", "Once upon a time", "--max-new-tokens", "6",
                        "--temperature", "0", "--ignore-eos", "--top-logprobs-num", "2",
                        "--logprob-start-len", "0", "--logprobs-at-temperature-one"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    final = out.get("final", out)
    lps = final.get("output_logprobs", final.get("outputLogprobs"))
    assert len(lps) == 6 and all(len(lp["top"]) == 2 for lp in lps)
    assert final.get("prompt_logprobs", final.get("promptLogprobs"))


TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "[SYS] {{ m['content'] }}\n{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
            "{% elif m['role'] == 'assistant' %}Bot: {{ m['content'] }}{{ eos_token }}\n"
            "{% else %}{{ raise_exception('unknown role ' + m['role']) }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}Bot:{% endif %}")


def test_prepare_prompts_with_the_chat_template_then_collect(fleet, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from rlfleet import load_trajectories
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": TEMPLATE}))
    rows = [{"prompt": [{"role": "system", "content": "Be kind."},
                        {"role": "user", "content": f"Tell story {i}"}],
             "answer": str(i), "id": 10 + i} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data.parquet")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    prompts = tmp_path / "prompts.jsonl"
    p = subprocess.run([sys.executable, "-m", "rlfleet", "prepare-prompts", "--data",
                        str(tmp_path / "data.parquet"), "--model", str(model), "--out",
                        str(prompts), "--index-key", "id"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in prompts.read_text().splitlines()]
    assert lines == [{"index": 10 + i, "text": f"<s>[SYS] Be kind.\nUser: Tell story {i}\nBot:",
                      "answer": str(i), "id": 10 + i} for i in range(3)]
    # A role the template does not know raises the template's own error.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "tool", "content": "x"}]}) + "\n")
    p = subprocess.run([sys.executable, "-m", "rlfleet", "prepare-prompts", "--data", str(bad),
                        "--model", str(model), "--out", str(tmp_path / "x.jsonl")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode != 0 and "unknown role tool" in p.stderr
    out = tmp_path / "out"
    c = subprocess.run([str(BIN / "rl-collect"), "--router", fleet["router"].address,
                        "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "4",
                        "--temperature", "0", "--progress", "off"],
                       capture_output=True, text=True, timeout=120)
    assert c.returncode == 0, c.stderr
    t = load_trajectories(out)
    assert t.index.tolist() == [10, 11, 12] and all(s == "ok" for s in t.status)
    assert [m["answer"] for m in t.metadata] == ["0", "1", "2"]


# client_id: the router's fair admission keys on the header (tests/clients/python/test_client_id.py shows
# it against a real router); here, that rlfleet's clients send it.
class _Recorder(grpc.GenericRpcHandler):
    """Records every call's metadata and refuses the call."""

    def __init__(self):
        self.metadata = []

    def service(self, details):
        self.metadata.append(dict(details.invocation_metadata))

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "recorder")

        return grpc.unary_stream_rpc_method_handler(refuse)


def test_rlfleet_clients_send_the_client_id_header():
    from rlfleet import AsyncClient, FleetError
    from rlfleet import Client as FleetClient
    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[recorder])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    target = f"127.0.0.1:{port}"
    try:
        with FleetClient(target, client_id="trainer-a", timeout=10) as c:
            with pytest.raises(FleetError):
                c.generate(text="x", max_new_tokens=1)

        async def run_async():
            async with AsyncClient(target, client_id="trainer-b", timeout=10) as c:
                with pytest.raises(FleetError):
                    await c.generate(text="x", max_new_tokens=1)

        asyncio.run(run_async())
        with FleetClient(target, timeout=10) as c:
            with pytest.raises(FleetError):
                c.generate(text="x", max_new_tokens=1)
    finally:
        server.stop(None)
    assert [m.get("rl-client-id") for m in recorder.metadata] == ["trainer-a", "trainer-b", None]
    for bad in ("x" * 129, "tab\there", "na\u00efve"):
        with pytest.raises(ValueError):
            FleetClient(target, client_id=bad)


def test_routing_fields_reach_the_request():
    """routing_key / group_id / episode_id (router placement under --policy affinity, agent
    episodes) are GenerateRequest fields set from generate's options; unknown options still
    raise."""
    from rlfleet import build_generate_request
    req = build_generate_request(text="x", routing_key="k1", group_id="g7", episode_id="ep_1",
                                 max_new_tokens=2)
    assert (req.routing_key, req.group_id, req.episode_id) == ("k1", "g7", "ep_1")
    assert req.sampling_params.max_new_tokens == 2
    plain = build_generate_request(text="x")
    assert (plain.routing_key, plain.group_id, plain.episode_id) == ("", "", "")
    with pytest.raises(TypeError):
        build_generate_request(text="x", routing_keys="typo")
