"""A made Qwen3 model with a real tokenizer and a real chat template, for the episode tests:
`rlctl make-model --arch qwen3 --size tiny` (random weights, the engine's qwen3 path), its
made 512-token tokenizer replaced by Qwen2's real byte-level BPE tokenizer from the test data
(`tokenizers/qwen2`: 151643 merges-based tokens and the ChatML specials), the embedding (tied
with the LM head) widened to that vocabulary, EOS = <|endoftext|> and <|im_end|> as in Qwen's
configs, and `qwen_template.jinja` (ChatML with Qwen's tool layout) as the chat template.

Cost: one rlctl call and a 39 MB safetensors file (151646 x 64 float32 embedding)."""

import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np

from rltest import BIN, DATA

QWEN_TOKENIZER = DATA / "tokenizers" / "qwen2"
QWEN_TEMPLATE = Path(__file__).resolve().parent / "qwen_template.jinja"


def _read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    tensors = {}
    for name, h in header.items():
        assert h["dtype"] == "F32", (name, h["dtype"])
        b, e = h["data_offsets"]
        tensors[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(h["shape"])
    return tensors, meta


def _write_safetensors(path, tensors, meta):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        blob = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if meta is not None:
        header["__metadata__"] = meta
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    tmp.replace(path)


def make_qwen3_model(out, seed=1):
    """Writes the model folder `out` (a Path) and returns it."""
    out = Path(out)
    if not (QWEN_TOKENIZER / "tokenizer.json").exists():
        raise FileNotFoundError(f"test data missing: {QWEN_TOKENIZER} (set RL_TEST_DATA)")
    subprocess.run([str(BIN / "rlctl"), "make-model", "--arch", "qwen3", "--size", "tiny",
                    "--seed", str(seed), "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    tok = json.loads((QWEN_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab = max(max(tok["model"]["vocab"].values()), max(specials.values())) + 1
    eos = [specials["<|endoftext|>"], specials["<|im_end|>"]]

    weights = out / "model.safetensors"
    tensors, meta = _read_safetensors(weights)
    embed = tensors["model.embed_tokens.weight"]
    rng = np.random.default_rng(seed)
    wide = rng.normal(0.0, float(embed.std()), size=(vocab, embed.shape[1])).astype("<f4")
    wide[:embed.shape[0]] = embed
    tensors["model.embed_tokens.weight"] = wide
    _write_safetensors(weights, tensors, meta)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"], "the made tiny qwen3 ties its LM head"
    config.update(vocab_size=vocab, eos_token_id=eos)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}) + "\n")
    shutil.copyfile(QWEN_TOKENIZER / "tokenizer.json", out / "tokenizer.json")
    tok_config = json.loads((QWEN_TOKENIZER / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = QWEN_TEMPLATE.read_text(encoding="utf-8")
    tok_config["eos_token"] = "<|im_end|>"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return out
