"""`python -m rlfleet prepare-prompts` with the models a newcomer has: stories260K ships no chat
template, so `--chat-template FILE` supplies one; models made by `rlctl make-model` carry a real
one (ChatML for Qwen, Llama-3 headers for Llama) whose special tokens are single tokens of their
tokenizer, and a worker serving the made model answers the rendered prompt with text."""

import json
import os
import subprocess
import sys

import pytest

from rltest import BIN, ROOT, STORIES, start_worker

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


def prepare(tmp_path, model, *extra):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": MESSAGES, "answer": "x"}) + "\n")
    out = tmp_path / "prompts.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    p = subprocess.run([sys.executable, "-m", "rlfleet", "prepare-prompts", "--data", str(data),
                        "--model", str(model), "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=60, env=env)
    rows = [json.loads(x) for x in out.read_text().splitlines()] if p.returncode == 0 else []
    return p, rows


def make_model(tmp_path, arch):
    out = tmp_path / arch
    subprocess.run([str(BIN / "rlctl"), "make-model", "--arch", arch, "--size", "tiny", "--seed",
                    "1", "--out", str(out)], check=True, capture_output=True, timeout=120)
    return out


def tokenize(model, text):
    r = subprocess.run([str(BIN / "rlctl"), "--json", "tokenize", "--tokenizer", str(model),
                        "--text", text], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(r.stdout)["ids"]


def test_stories260k_needs_and_takes_a_template_file(tmp_path):
    if not STORIES.is_dir():
        pytest.fail(f"test data missing: {STORIES} (set RL_TEST_DATA)")
    p, _ = prepare(tmp_path, STORIES)
    assert p.returncode != 0 and "--chat-template FILE" in p.stderr, p.stderr
    template = ROOT / "tests" / "interop" / "smg" / "chat_template.jinja"
    p, rows = prepare(tmp_path, STORIES, "--chat-template", str(template))
    assert p.returncode == 0, p.stderr
    assert rows == [{"index": 0, "text": "system: Be brief.\nuser: Hi there\nassistant:",
                     "answer": "x"}]


def test_made_qwen3_model_has_a_chatml_template(tmp_path):
    model = make_model(tmp_path, "qwen3")
    p, rows = prepare(tmp_path, model)
    assert p.returncode == 0, p.stderr
    text = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert rows[0]["text"] == text
    config = json.loads((model / "config.json").read_text())
    tok = json.loads((model / "tokenizer.json").read_text())
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    ids = tokenize(model, text)
    assert ids.count(specials["<|im_start|>"]) == 3 and ids.count(specials["<|im_end|>"]) == 2
    assert specials["<|im_end|>"] in config["eos_token_id"]
    # The tokenizer covers the model's vocabulary: its ids are 0 .. vocab_size - 1.
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) == config["vocab_size"]
    # A worker serving the made model answers the rendered prompt with text.
    w = start_worker(model=model)
    try:
        r = subprocess.run([str(BIN / "rlctl"), "--target", w.address, "--json", "generate",
                            "--text", text, "--max-new-tokens", "16", "--temperature", "0",
                            "--ignore-eos"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        final = json.loads(r.stdout)["final"]
        assert len(final["output_ids"]) == 16 and final["text"], final
    finally:
        w.stop()


def test_made_llama_model_has_a_llama3_template(tmp_path):
    model = make_model(tmp_path, "llama")
    p, rows = prepare(tmp_path, model)
    assert p.returncode == 0, p.stderr
    text = ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert rows[0]["text"] == text
    tok = json.loads((model / "tokenizer.json").read_text())
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    ids = tokenize(model, text)
    # The tokenizer prepends BOS once (the template leaves it out).
    assert ids[0] == specials["<|begin_of_text|>"] and ids.count(ids[0]) == 1
    assert ids.count(specials["<|start_header_id|>"]) == 3
    assert ids.count(specials["<|eot_id|>"]) == 2
