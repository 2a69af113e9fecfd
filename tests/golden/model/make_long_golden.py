#!/usr/bin/env python3
"""Writes hf_llama_long.json: a long-context golden for the CPU model runner.

The tiny Llama-3 checkpoint of make_hf_fixtures.py (llama3 RoPE scaling, original context 256,
max_position_embeddings 1024) is made with the C++ maker, transformers (float32, eager) extends
an 8-token prompt greedily to LENGTH tokens, and the fixture stores every token and, for every
position, the log-probability (log_softmax in float64 of the float32 logits) of the next token.
tests/worker/model/long_context_golden_test.cc runs the same sequence through the runner and requires
every logprob within 1e-5: RoPE angle errors grow with the position, so this catches frequencies
that are not computed exactly as transformers computes them.

Usage: make_long_golden.py --maker build/bin/make_test_model [--out tests/golden/model]
"""

import argparse
import json
import pathlib
import subprocess
import tempfile

import torch
import transformers

SEED = 101
PROMPT = [5, 17, 300, 42, 7, 250, 99, 11]
LENGTH = 1020


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maker", required=True)
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = pathlib.Path(tmp) / "llama"
        subprocess.run([args.maker, "--arch", "llama", "--size", "tiny", "--seed", str(SEED),
                        "--dtype", "float32", "--out", str(model_dir)], check=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            out = model.generate(torch.tensor([PROMPT]), max_new_tokens=LENGTH - len(PROMPT),
                                 min_new_tokens=LENGTH - len(PROMPT), do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            ids = out[0].tolist()
            assert len(ids) == LENGTH, len(ids)
            logits = model(torch.tensor([ids])).logits[0].double()
            logp = torch.log_softmax(logits, dim=-1)
            next_logp = [float(logp[i, ids[i + 1]]) for i in range(LENGTH - 1)]
    data = {
        "maker": {"arch": "llama", "size": "tiny", "seed": SEED, "dtype": "float32"},
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                     "CPU float32, eager attention",
        "ids": ids,
        "next_token_logprobs": [round(v, 9) for v in next_logp],
    }
    path = pathlib.Path(args.out) / "hf_llama_long.json"
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"{path}: {LENGTH} tokens, {len(PROMPT)} prompt")


if __name__ == "__main__":
    main()
