#!/usr/bin/env python3
"""DAPO's dynamic-sampling filter as an rl-collect --group-filter command (issue 34), with no
dependency beyond Python: reads one group as JSON on stdin, prints `keep` when its samples'
rewards are not all equal (a group whose samples all score the same has zero GRPO advantage),
else `drop`.

    rl-collect --router HOST:PORT --prompts math.jsonl --out run1 --n 8 \
        --batch-groups 64 --over-sample 1.5 \
        --group-filter "python3 examples/group_filters/dapo_filter.py"

Reward: a sample's own "reward" field when present, else 1.0 when the prompt row's "answer"
field appears in the completion text, else 0.0. Replace `reward` with your verifier. The same
filter as a Python hook: `python -m rlfleet.group_filter dapo` (clients/python).
"""

import json
import sys


def reward(sample, metadata):
    if "reward" in sample:
        return float(sample["reward"])
    answer = metadata.get("answer")
    return 1.0 if answer is not None and str(answer) in sample.get("text", "") else 0.0


def main():
    group = json.load(sys.stdin)
    metadata = group.get("metadata") or {}
    rewards = {reward(s, metadata) for s in group.get("samples", [])}
    print("keep" if len(rewards) > 1 else "drop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
