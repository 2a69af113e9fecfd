#!/usr/bin/env python3
"""Writes rope_inv_freq.json: RoPE inverse-frequency tables as Hugging Face transformers computes
them (float32 tensors on CPU), for every scaling type the runner supports (default, linear,
dynamic NTK, llama3), as float32 bit patterns. tests/worker/model/rope_table_test.cc compares
services/worker/model/rope_table.cc with them bit for bit, so CI needs no torch.

Tables are read from LlamaRotaryEmbedding.inv_freq; for dynamic NTK after a forward pass over
seq_len positions (the dynamic update then computes the base from an int64 tensor seq_len,
i.e. in float32).

Usage (any venv with torch + transformers): make_rope_fixtures.py [--out DIR]
"""

import argparse
import json
import pathlib

import numpy as np
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

CASES = [
    # name, head_dim, theta, max_pos, rope_scaling, seq_len (dynamic only)
    ("default_hd8_theta1e4", 8, 10000.0, 512, None, None),
    ("default_hd64_theta1e4", 64, 10000.0, 2048, None, None),
    ("default_hd128_theta5e5", 128, 500000.0, 8192, None, None),
    ("default_hd128_theta1e6", 128, 1000000.0, 32768, None, None),
    ("default_hd80_theta1e4", 80, 10000.0, 4096, None, None),
    ("linear_f2_hd128", 128, 10000.0, 4096, {"rope_type": "linear", "factor": 2.0}, None),
    ("linear_f4_hd64", 64, 500000.0, 4096, {"rope_type": "linear", "factor": 4.0}, None),
    ("llama3_31_hd128", 128, 500000.0, 131072,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, None),
    ("llama3_32_hd64", 64, 500000.0, 131072,
     {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, None),
    ("llama3_small_hd16", 16, 10000.0, 4096,
     {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, None),
    ("dynamic_f2_hd128_s3000", 128, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0}, 3000),
    ("dynamic_f2_hd128_s10000", 128, 10000.0, 2048, {"rope_type": "dynamic", "factor": 2.0},
     10000),
    ("dynamic_f4_hd64_s5000", 64, 1000000.0, 4096, {"rope_type": "dynamic", "factor": 4.0}, 5000),
]


def table(head_dim, theta, max_pos, scaling, seq_len):
    params = {"rope_type": "default", "rope_theta": theta}
    if scaling:
        params.update(scaling)
    config = transformers.LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, num_key_value_heads=4,
        head_dim=head_dim, max_position_embeddings=max_pos, rope_parameters=params)
    rope = LlamaRotaryEmbedding(config)
    if seq_len is not None:
        # A forward pass over seq_len positions triggers the dynamic update.
        x = torch.zeros(1, seq_len, head_dim)
        rope(x, torch.arange(seq_len, dtype=torch.int64)[None])
    inv_freq = rope.inv_freq
    assert inv_freq.dtype == torch.float32
    return inv_freq.numpy().view(np.uint32).tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent))
    args = parser.parse_args()
    cases = []
    for name, head_dim, theta, max_pos, scaling, seq_len in CASES:
        case = {"name": name, "head_dim": head_dim, "rope_theta": theta,
                "max_position_embeddings": max_pos, "rope_scaling": scaling,
                "inv_freq_bits": table(head_dim, theta, max_pos, scaling, seq_len)}
        if seq_len is not None:
            case["seq_len"] = seq_len
        cases.append(case)
    data = {"reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                         "CPU float32", "cases": cases}
    path = pathlib.Path(args.out) / "rope_inv_freq.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
