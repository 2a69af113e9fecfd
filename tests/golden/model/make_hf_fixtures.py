#!/usr/bin/env python3
"""Writes Hugging Face reference fixtures for the CPU model runner.

For each architecture (Llama-3 with llama3 RoPE scaling, Qwen2, Qwen3, Qwen3-MoE) it makes a tiny float32
checkpoint with the C++ maker (`make_test_model`, deterministic from arch/size/seed), runs it in
transformers (eager attention, float32), and writes hf_<arch>.json with the maker parameters,
the prompt, the logits of every prompt position, the greedy continuation and the smallest
top-1/top-2 margin; for MoE models also the router's top-k expert ids and weights of every token
of the final sequence, per MoE layer (R3), and the smallest gap between the k-th and the next
routing probability. tests/worker/model/hf_golden_test.cc re-creates the checkpoint with the maker and
compares, so CI needs neither torch nor the network.

Usage: make_hf_fixtures.py --maker build/bin/make_test_model [--out tests/golden/model]
"""

import argparse
import json
import pathlib
import subprocess
import tempfile

import numpy as np
import safetensors.numpy
import tokenizers
import torch
import transformers

ARCHS = {"llama": 101, "qwen2": 202, "qwen3": 303, "qwen3_moe": 404}
PROMPT = [5, 17, 300, 42, 7, 250, 99, 11]
NEW_TOKENS = 12


def fixture(maker: str, arch: str, seed: int, workdir: pathlib.Path) -> dict:
    model_dir = workdir / arch
    subprocess.run([maker, "--arch", arch, "--size", "tiny", "--seed", str(seed),
                    "--dtype", "float32", "--out", str(model_dir)], check=True)
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    sample = "Once upon a time, the model said hello."
    sample_ids = tok.encode(sample).ids

    extra = {"experts_implementation": "eager"} if arch.endswith("_moe") else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager", **extra)
    model.eval()
    ids = list(PROMPT)
    with torch.no_grad():
        prompt_logits = model(torch.tensor([ids])).logits[0].double().numpy()
        generated = []
        margins = []
        for _ in range(NEW_TOKENS):
            row = model(torch.tensor([ids])).logits[0, -1].double().numpy()
            order = np.argsort(-row)
            margins.append(float(row[order[0]] - row[order[1]]))
            generated.append(int(order[0]))
            ids.append(int(order[0]))
    weights = safetensors.numpy.load_file(str(model_dir / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"].astype(np.float64)
    routing = routing_of(model, ids) if arch.endswith("_moe") else {}
    return routing | {
        "maker": {"arch": arch, "size": "tiny", "seed": seed, "dtype": "float32"},
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                     "float32, eager attention",
        "embed_sum": float(embed.sum()),
        "tokenizer_sample": {"text": sample, "ids": sample_ids},
        "prompt_ids": PROMPT,
        "prompt_logits": [[round(float(v), 6) for v in row] for row in prompt_logits],
        "generated_ids": generated,
        "min_margin": min(margins),
    }


def routing_of(model, ids: list) -> dict:
    """Router top-k of every token of `ids`, per MoE layer, as transformers computes it."""
    captured = []  # per MoE layer in order: (scores [T, k], indices [T, k], probs [T, E])

    def hook(_module, _inputs, output):
        logits, scores, indices = output
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
        captured.append((scores.double().numpy(), indices.numpy(), probs.double().numpy()))

    handles = [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers
               if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    top_k = captured[0][1].shape[1]
    margin = min(float(np.min(np.sort(p, axis=-1)[:, -top_k] - np.sort(p, axis=-1)[:, -top_k - 1]))
                 for _, _, p in captured)
    return {
        "routed_ids": ids,
        # [tokens, moe layers, top_k]
        "routed_experts": [[c[1][t].tolist() for c in captured] for t in range(len(ids))],
        "routed_weights": [[[round(float(v), 7) for v in c[0][t]] for c in captured]
                           for t in range(len(ids))],
        "min_route_margin": margin,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maker", required=True, help="path to the make_test_model binary")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent))
    parser.add_argument("--arch", action="append", choices=sorted(ARCHS),
                        help="only these architectures (default: all)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for arch, seed in ARCHS.items():
            if args.arch and arch not in args.arch:
                continue
            data = fixture(args.maker, arch, seed, pathlib.Path(tmp))
            path = pathlib.Path(args.out) / f"hf_{arch}.json"
            path.write_text(json.dumps(data, separators=(",", ":")) + "\n")
            print(f"{path}: greedy {data['generated_ids']} min margin {data['min_margin']:.3f}"
                  + (f" min route margin {data['min_route_margin']:.2e}"
                     if "min_route_margin" in data else ""))


if __name__ == "__main__":
    main()
