"""A trainer-shaped GRPO loop against a live fleet, with NumPy standing in for the trainer.

    .venv/bin/python examples/grpo_loop.py --router 127.0.0.1:50051 --model DIR \\
        [--steps 3] [--prompts 4] [--group-size 4] [--max-new-tokens 16] \\
        [--push tensor|group|alternate] [--lr 0.02] [--seed 0] [--api-key KEY]

`--model` is the folder the fleet serves (its safetensors are the trainer's initial weights).
Every step, as a colocated RL trainer does it:

  1. rollout: a GRPO group of --group-size samples per prompt (logprobs, trajectories);
  2. score the samples (a toy reward: the share of distinct tokens) and compute group-relative
     advantages; the live results become verl's DataProto (Trajectories.from_results);
  3. sleep the fleet (release_memory) while the "trainer" works: a NumPy stand-in for an
     optimizer step perturbs the weights in memory (in a real trainer, the GPU is the trainer's
     now);
  4. push the new weights from memory: over the tensor stream (update_weights_from_tensor) or a
     tcp weight group with this process as rank 0 (WeightsGroup.receive_weights; the group is
     opened once, before the first step, as trainers init theirs); the fleet takes them asleep
     and serves them after waking;
  5. wake the fleet (resume_memory) and check what it serves: the version is the step, and every
     worker's checksums equal the pushed tensors.

Prints one JSON line per step, then a summary line. Exit status 0, or 1 with the error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from typing import Any

import numpy as np

from rlfleet import (Client, FleetError, Trajectories, WeightTensor, rank_sha256, read_safetensors,
                     tensor_sha256)

PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to", "One day, a bird",
           "The sun was hot and", "A big red ball", "Mom said to Ben", "There was a tree"]


def load_weights(model: str) -> dict[str, np.ndarray]:
    """The trainer's float32 master copy of the served weights (bf16 widened)."""
    weights = {}
    for name, t in read_safetensors(model).items():
        if isinstance(t, WeightTensor):  # BF16: widen the raw uint16 values to float32
            t = (t.data.astype(np.uint32) << 16).view(np.float32)
        weights[name] = np.ascontiguousarray(t, dtype=np.float32)
    return weights


def reward(output_ids: list[int]) -> float:
    """A toy reward: the share of distinct tokens in the completion."""
    return len(set(output_ids)) / max(len(output_ids), 1)


def grpo_advantages(rewards: np.ndarray, group: np.ndarray) -> np.ndarray:
    """(r - mean of its group) / (std of its group + eps)."""
    adv = np.zeros_like(rewards)
    for g in np.unique(group):
        m = group == g
        adv[m] = (rewards[m] - rewards[m].mean()) / (rewards[m].std() + 1e-6)
    return adv


def train_step(weights: dict[str, np.ndarray], batch: dict[str, Any], adv: np.ndarray,
               lr: float, rng: np.random.Generator) -> float:
    """The stand-in for an optimizer step: the policy-gradient surrogate from the DataProto's
    rollout logprobs, then a seeded perturbation of every tensor scaled by it (in place)."""
    mask = batch["response_mask"].astype(np.float32)
    logp = batch["rollout_log_probs"]
    loss = float(-(adv[:, None] * logp * mask).sum() / max(mask.sum(), 1.0))
    scale = lr * (1.0 + abs(loss))
    for w in weights.values():
        w += rng.normal(0.0, scale, w.shape).astype(np.float32) * np.float32(np.abs(w).mean()
                                                                           + 1e-3)
    return loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--push", choices=["tensor", "group", "alternate"], default="alternate")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--api-key")
    a = ap.parse_args(argv)
    if not 1 <= a.prompts <= len(PROMPTS) or a.steps < 1 or a.group_size < 2:
        ap.error(f"--prompts in [1, {len(PROMPTS)}], --steps >= 1, --group-size >= 2")
    rng = np.random.default_rng(a.seed)
    weights = load_weights(a.model)
    prompts = PROMPTS[:a.prompts]
    start = time.monotonic()
    try:
        with Client(a.router, api_key=a.api_key) as fleet, ExitStack() as stack:
            fleet.wait_ready()
            version = fleet.list_workers().fleet_weight_version
            group = (stack.enter_context(fleet.open_weights_group("grpo"))
                     if a.push != "tensor" else None)
            for step in range(1, a.steps + 1):
                # 1. Rollout: one GRPO group per prompt.
                t0 = time.monotonic()
                groups = [fleet.generate(text=p, n=a.group_size, max_new_tokens=a.max_new_tokens,
                                         temperature=1.0, seed=a.seed * 1000 + step,
                                         return_logprob=True, return_trajectory=True)
                          for p in prompts]
                served = {r.weight_version for g in groups for r in g}
                # 2. Score; live results -> DataProto.
                traj = Trajectories.from_results(groups, prompts=prompts)
                data = traj.to_dataproto(pad_token_id=0)
                rewards = np.array([reward(r.output_ids) for g in groups for r in g],
                                   dtype=np.float32)
                adv = grpo_advantages(rewards, data["non_tensor_batch"]["uid"])
                # 3. Sleep the fleet while the trainer trains.
                fleet.release_memory()
                asleep = all(w.info.asleep for w in fleet.get_server_info().workers)
                loss = train_step(weights, data["batch"], adv, a.lr, rng)
                # 4. Push the new weights from memory (accepted asleep, served after waking).
                version = step if version < step else version + 1
                mode = a.push if a.push != "alternate" else ("tensor" if step % 2 else "group")
                t1 = time.monotonic()
                if mode == "tensor" or group is None:
                    fleet.update_weights_from_tensor(weights, weight_version=version)
                else:
                    group.receive_weights(weights, weight_version=version)
                push_s = time.monotonic() - t1
                # 5. Wake and check what the fleet serves.
                fleet.resume_memory()
                want = {n: tensor_sha256(n, w) for n, w in weights.items()}
                sums = fleet.weights_checker("checksum").workers
                same = all(dict(w.result.tensor_sha256) == want and
                           w.result.rank_sha256 == rank_sha256(want) for w in sums)
                now = fleet.generate(text=prompts[0], max_new_tokens=2).one().weight_version
                nbytes = sum(w.nbytes for w in weights.values())
                print(json.dumps({
                    "step": step, "served_version": sorted(served), "samples": len(traj),
                    "mean_reward": round(float(rewards.mean()), 4), "loss": round(loss, 4),
                    "asleep_while_training": asleep, "push": mode,
                    "push_seconds": round(push_s, 4),
                    "push_gbps": round(nbytes / max(push_s, 1e-9) / 1e9, 3),
                    "version": now, "checksums_match": same, "workers": len(sums)}),
                    flush=True)
                if not (asleep and same and now == version):
                    print(f"grpo_loop: step {step}: the fleet does not serve the pushed weights "
                          f"(asleep {asleep}, checksums {same}, version {now} != {version})",
                          file=sys.stderr)
                    return 1
    except FleetError as e:
        print(f"grpo_loop: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"done": True, "steps": a.steps,
                      "seconds": round(time.monotonic() - start, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
