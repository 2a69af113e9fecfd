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
and tests/golden/tokenizer/variants.json.gz: edited copies of those tokenizers (added-token
options, Metaspace, pair-form merges, split behaviors, NFKC/Strip/regex Replace, offset
trimming), each as {base, patch} plus encoded cases, so every option has a golden.
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
# Strings that exercise normalization offsets, whitespace classes and special tokens.
EXTRA_CASES = [
    "e\u0301x", "a\u0308\u0301b", "\u0344", "\u1100\u1161\u11a8z", "x\u0323\u0307y",
    "q\u0307\u0323", "\u212b", "a\u0085b", "a\u180eb c\u3000d\u2028e", "\ufb01 \u2460 \uff21",
    "<s>hi</s>", " <s> x", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n",
    "<|begin_of_text|>x<|end_of_text|>", "<unk>", "   leading", "trailing   ", "\r\n\r\n",
    "\t\ttab", "1234567 12.5", "don't DON'T You'LL", "\U0001F999\U0001F680x", "\u00a0\u00a0",
    "line1\nline2\n\n", "a" * 300, "\u2581x \u2581", "<0x41>",
]
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
        cases = f.read().split(SEPARATOR)[:-1] + EXTRA_CASES

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

    write_variants(data, args.out)


VARIANT_TEXTS = [
    "Hello world", " Hello  <tok>  world ", "a<tok>b", "x word y", "xword y", "word", "foo bar baz",
    "  spaced  out  ", "e\u0301 \ufb01 \u2460 \uff21\uff22", "A-B--C", "one\ttwo\nthree",
    "<s>Hello</s> there", "Hello", "", " ", "\u2581Hello", "caf\u00e9 \U0001F999",
]


def variants(data):
    def load(rel):
        with open(os.path.join(data, rel), encoding="utf-8") as f:
            return json.load(f)

    gpt2 = TOKENIZERS["gpt2"]
    qwen2 = TOKENIZERS["qwen2"]
    stories = TOKENIZERS["stories260K"]
    llama2 = TOKENIZERS["llama2"]
    bl_noregex = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    gpt2_added = load(gpt2)["added_tokens"] + [
        {"id": 50257, "content": "<tok>", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": False},
        {"id": 50258, "content": "word", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": 50259, "content": "bar", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": True},
    ]
    out = [
        ("gpt2_added_options", gpt2, {"added_tokens": gpt2_added}),
        ("gpt2_prefix_space_trim", gpt2, {
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                               "trim_offsets": True, "use_regex": True}}),
        ("stories_metaspace_first", stories, {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                              "prepend_scheme": "first", "split": True},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "ByteFallback"},
                {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                 "split": True}]}}),
        ("stories_metaspace_legacy", stories, {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                              "add_prefix_space": True},
            "decoder": {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}}),
        ("stories_pair_merges", stories, {"merges_as_pairs": True}),
        ("llama2_normalized_added", llama2, {"added_tokens": load(llama2)["added_tokens"] + [
            {"id": 32000, "content": "foo bar", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": True, "special": False}]}),
        ("qwen2_nfkc_strip_replace", qwen2, {"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Strip", "strip_left": True, "strip_right": True},
            {"type": "NFKC"},
            {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}]}}),
    ]
    for behavior in ("Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for invert in (False, True):
            out.append(("qwen2_split_%s_%s" % (behavior, invert), qwen2, {"pre_tokenizer": {
                "type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": {"String": " "}, "behavior": behavior,
                     "invert": invert},
                    bl_noregex]}}))
    return out


def apply_patch(base, patch):
    doc = dict(base)
    for key, value in patch.items():
        if key == "merges_as_pairs":
            doc["model"] = dict(doc["model"])
            doc["model"]["merges"] = [m.split(" ") for m in doc["model"]["merges"]]
        else:
            doc[key] = value
    return doc


def write_variants(data, out_dir):
    result = []
    for name, rel, patch in variants(data):
        with open(os.path.join(data, rel), encoding="utf-8") as f:
            base = json.load(f)
        tok = Tokenizer.from_str(json.dumps(apply_patch(base, patch)))
        cases = []
        for text in VARIANT_TEXTS:
            for special in (False, True):
                enc = tok.encode(text, add_special_tokens=special)
                cases.append({"text": text, "add_special_tokens": special, "ids": enc.ids,
                              "offsets": byte_offsets(text, enc.offsets),
                              "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                              "decoded_skip_special": tok.decode(enc.ids,
                                                                 skip_special_tokens=True)})
        result.append({"name": name, "base": rel, "patch": patch, "cases": cases})
    path = os.path.join(out_dir, "variants.json.gz")
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(result, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
