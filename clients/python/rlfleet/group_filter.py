"""Group filters for rl-collect's over-sampling (issue 34; `--batch-groups N --over-sample F
--group-filter CMD`): rl-collect shows every group whose samples all finished to CMD, as JSON
on stdin, and keeps the group when CMD prints `keep` (`drop`: the group is recorded as dropped
and never collected again). This module turns a Python function into such a command:

    rl-collect ... --group-filter "python -m rlfleet.group_filter mypkg.rewards:keep_group"
    rl-collect ... --group-filter "python -m rlfleet.group_filter dapo"

A filter takes the group, a dict
    {"index": row index, "group_id": str, "metadata": the row's extra fields,
     "samples": [{"sample": k, "finish_reason": str, "text": str, "output_ids": [int],
                  "weight_version": int}, ...]}
and returns True to keep it. `dapo` is DAPO's dynamic-sampling filter: keep a group only when
its rewards are not all equal (a group whose samples all score the same has zero advantage in
GRPO and teaches nothing). Its reward is `reward(sample, metadata)`: by default a sample's own
"reward" field if the caller put one there, else 1.0 when the row's metadata "answer" appears in
the completion text, else 0.0.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any, Callable, Optional, TextIO, cast

Group = dict[str, Any]
Reward = Callable[[dict[str, Any], dict[str, Any]], float]


def answer_reward(sample: dict[str, Any], metadata: dict[str, Any]) -> float:
    """The sample's own "reward", else 1.0 when metadata["answer"] is in its text, else 0.0."""
    if "reward" in sample:
        return float(sample["reward"])
    answer = metadata.get("answer")
    return 1.0 if answer is not None and str(answer) in sample.get("text", "") else 0.0


def dapo_not_all_equal(group: Group, reward: Optional[Reward] = None) -> bool:
    """DAPO's filter: keep the group when its samples' rewards are not all equal."""
    reward = reward or answer_reward
    metadata = group.get("metadata") or {}
    rewards = [reward(s, metadata) for s in group.get("samples", [])]
    return len(set(rewards)) > 1


def run_filter(fn: Callable[[Group], bool], stdin: TextIO = sys.stdin,
               stdout: TextIO = sys.stdout) -> int:
    """Reads one group from `stdin`, prints keep or drop; 0, or 2 on a bad group."""
    try:
        group = json.load(stdin)
    except json.JSONDecodeError as e:
        print(f"rlfleet.group_filter: the group is not JSON: {e}", file=sys.stderr)
        return 2
    stdout.write("keep\n" if fn(group) else "drop\n")
    return 0


def resolve(spec: str) -> Callable[[Group], bool]:
    """`dapo`, or `module:function` (a filter importable from the command's environment)."""
    if spec == "dapo":
        return dapo_not_all_equal
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"filter {spec!r}: give `dapo` or `module:function`")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"filter {spec!r}: {module} has no function {name}")
    return cast(Callable[[Group], bool], fn)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m rlfleet.group_filter dapo|module:function", file=sys.stderr)
        return 2
    try:
        fn = resolve(argv[0])
    except (ValueError, ImportError) as e:
        print(f"rlfleet.group_filter: {e}", file=sys.stderr)
        return 2
    return run_filter(fn)


if __name__ == "__main__":
    sys.exit(main())
