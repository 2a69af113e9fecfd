#!/usr/bin/env python3
"""Regenerates the tokenizer golden fixtures with the Hugging Face `tokenizers` package.

Usage (from the repository root, once per vocabulary or corpus change):
  python3 -m venv /tmp/venv-tok && /tmp/venv-tok/bin/pip install -r tests/golden/tokenizer/requirements.txt
  /tmp/venv-tok/bin/python tests/golden/tokenizer/make_goldens.py [--data ../shared/models]

Writes tests/golden/tokenizer/<name>.json.gz for llama2, gpt2, qwen2, llama3 and stories260K:
  cases:  the strings of tokenizers/gpt2/cases.inp (inline text), encoded without and with
          special tokens, with byte offsets and Hugging Face's decode of the ids;
  lines:  a deterministic sample of lines of every corpus file (a line keeps its '\n', so
          CRLF files keep "\r\n"), by file and line index, with ids, the decode when it
          differs from the line, and byte offsets for every fourth sample;
  whole:  every corpus file encoded whole: token count and FNV-1a 64 of the ids (all ids
          are also stored for the files under 64 KB).
CI never runs this script: the C++ tests read the committed fixtures.
"""

import argparse
import gzip
import json
import os

import tokenizers
from tokenizers import Tokenizer

TOKENIZERS = {
    "llama2": "tokenizers/llama2/tokenizer.json",
    "gpt2": "tokenizers/gpt2/tokenizer.json",
    "qwen2": "tokenizers/qwen2/tokenizer.json",
    "llama3": "tokenizers/llama3/tokenizer.json",
    "stories260K": "stories260K/tokenizer.json",
}
SEPARATOR = "\n__ggml_vocab_test__\n"
LINES_PER_FILE = 160
WHOLE_IDS_MAX_BYTES = 64 * 1024


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def byte_offsets(text, char_offsets):
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8")))
    return [[starts[b], starts[e]] for b, e in char_offsets]


def split_lines(text):
    pieces = text.split("\n")
    lines = [p + "\n" for p in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


def sample_indices(n, k):
    if n <= k:
        return list(range(n))
    return sorted({(i * n) // k for i in range(k)})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=os.path.join(here, "..", "..", "..", "..", "shared", "models"))
    parser.add_argument("--out", default=here)
    args = parser.parse_args()
    data = os.path.abspath(args.data)
    corpus = os.path.join(data, "..", "corpus")
    files = sorted(f for f in os.listdir(corpus) if not f.endswith("SOURCES.md"))
    with open(os.path.join(data, "tokenizers/gpt2/cases.inp"), encoding="utf-8") as f:
        cases = f.read().split(SEPARATOR)[:-1]

    for name, rel in TOKENIZERS.items():
        tok = Tokenizer.from_file(os.path.join(data, rel))
        out = {"tokenizer": name, "hf_tokenizers_version": tokenizers.__version__,
               "cases": [], "lines": [], "whole": []}
        for text in cases:
            for special in (False, True):
                enc = tok.encode(text, add_special_tokens=special)
                out["cases"].append({
                    "text": text, "add_special_tokens": special, "ids": enc.ids,
                    "offsets": byte_offsets(text, enc.offsets),
                    "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                    "decoded_skip_special": tok.decode(enc.ids, skip_special_tokens=True),
                })
        for fname in files:
            with open(os.path.join(corpus, fname), encoding="utf-8", newline="") as f:
                text = f.read()
            lines = split_lines(text)
            for n, idx in enumerate(sample_indices(len(lines), LINES_PER_FILE)):
                line = lines[idx]
                enc = tok.encode(line, add_special_tokens=False)
                entry = {"file": fname, "line": idx, "ids": enc.ids}
                decoded = tok.decode(enc.ids)
                if decoded != line:
                    entry["decoded"] = decoded
                if n % 4 == 0:
                    entry["offsets"] = byte_offsets(line, enc.offsets)
                out["lines"].append(entry)
            ids = tok.encode(text, add_special_tokens=False).ids
            entry = {"file": fname, "num_ids": len(ids), "fnv1a64": fnv1a64(ids)}
            if len(text.encode("utf-8")) <= WHOLE_IDS_MAX_BYTES:
                entry["ids"] = ids
            out["whole"].append(entry)
        path = os.path.join(args.out, name + ".json.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
