"""Reads rl-collect output (`rlfleet.trajectories.v1` safetensors: ragged CSR columns plus
scalar columns in the header) into numpy, lays it out as verl's DataProto batch, converts to
torch (only when torch is installed) and exports Parquet (pyarrow).

DataProto layout (verl's agent-loop postprocess): `prompts` [N, P] left-padded, `responses`
[N, R] right-padded, `response_mask` [N, R] (the response's loss mask, 0 on padding),
`input_ids` = prompts ‖ responses, `attention_mask` [N, P+R] (1 on real tokens),
`position_ids` = clip(cumsum(attention_mask) - 1, 0), `rollout_log_probs` [N, R] (0 on
padding), plus `rollout_weight_versions` [N, R] (-1 on padding). Non-tensor fields (object
or int arrays of N): the seed's `index`, `__num_turns__` and `raw_prompt`, then sample, uid
(the GRPO group), finish_reason, weight_version, metadata.

Live results become the same columns with `Trajectories.from_results` (what rl-collect would
have written for them): a trainer gets the DataProto from `generate()` without a file.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    from rlfleet.types import GenerateResult

Array = np.ndarray[Any, Any]

FORMAT = "rlfleet.trajectories.v1"
_DTYPES = {"I64": np.int64, "I32": np.int32, "F32": np.float32, "U8": np.uint8}
_TENSORS = {"offsets": "I64", "tokens": "I32", "loss_mask": "U8", "rollout_logprobs": "F32",
            "weight_versions": "I64"}
_SCALARS = ["index", "sample", "group", "status", "finish_reason", "prompt_len", "attempts",
            "weight_version", "metadata"]
_MAX_HEADER = 1 << 31


@dataclass
class Trajectories:
    """Samples as ragged columns: sample i owns tokens[offsets[i]:offsets[i+1]], the first
    prompt_len[i] of them the prompt."""
    offsets: Array               # int64 [N+1]
    tokens: Array                # int32 [T]
    loss_mask: Array             # uint8 [T]
    rollout_logprobs: Array      # float32 [T], NaN on prompt tokens
    weight_versions: Array       # int64 [T], -1 on prompt tokens
    index: Array                 # int64 [N]
    sample: Array                # int32 [N]
    group: Array                 # int64 [N]
    prompt_len: Array            # int64 [N]
    attempts: Array              # int64 [N]
    weight_version: Array        # int64 [N]
    status: list[str]
    finish_reason: list[str]
    metadata: list[dict[str, Any]]
    # R3 (shards from rl-collect --return-routed-experts; None otherwise): sample i's routing is
    # routed_experts[routed_offsets[i]:routed_offsets[i+1]], shaped routed_shape[i] =
    # [tokens, MoE layers, top_k] for the tokens from position routed_start[i] on.
    routed_offsets: Optional[Array] = None   # int64 [N+1]
    routed_experts: Optional[Array] = None   # int32 [R]
    expert_weights: Optional[Array] = None   # float32 [R] or [0]
    routed_start: Optional[list[int]] = None
    routed_shape: Optional[list[list[int]]] = None
    # The seed's non-tensor fields: turns per sample (user + assistant turns: 2 for a
    # single-turn sample) and the raw prompt (text or chat messages) when known.
    num_turns: Optional[Array] = None        # int64 [N]; None: 2 for every sample
    raw_prompt: Optional[list[Any]] = None   # [N]; None: metadata["raw_prompt"] or None

    def routing(self, i: int) -> Optional[tuple[int, Array, Optional[Array]]]:
        """(start position, expert ids [tokens, layers, top_k], weights or None) of sample i;
        None when the file has no routing or the sample none."""
        if (self.routed_offsets is None or self.routed_shape is None or
                self.routed_start is None or self.routed_experts is None or
                self.expert_weights is None or not self.routed_shape[i]):
            return None
        b, e = self.routed_offsets[i], self.routed_offsets[i + 1]
        shape = tuple(self.routed_shape[i])
        w = self.expert_weights[b:e].reshape(shape) if len(self.expert_weights) else None
        return self.routed_start[i], self.routed_experts[b:e].reshape(shape), w

    def __len__(self) -> int:
        return len(self.index)

    @property
    def ok(self) -> Array:
        """Boolean mask of the samples that completed (status "ok")."""
        return np.array([s == "ok" for s in self.status], dtype=bool)

    def prompt_ids(self, i: int) -> Array:
        s = self.offsets[i]
        return self.tokens[s:s + self.prompt_len[i]]

    def response_ids(self, i: int) -> Array:
        return self.tokens[self.offsets[i] + self.prompt_len[i]:self.offsets[i + 1]]

    def _resp(self, column: Array, i: int) -> Array:
        return column[self.offsets[i] + self.prompt_len[i]:self.offsets[i + 1]]

    @staticmethod
    def from_results(results: Iterable[Union["GenerateResult", Sequence["GenerateResult"]]], *,
                     index: Optional[Sequence[int]] = None,
                     prompts: Optional[Sequence[Any]] = None,
                     metadata: Optional[Sequence[dict[str, Any]]] = None) -> "Trajectories":
        """The columns rl-collect would have written for live results: one element of
        `results` per prompt, either what `generate(...)` returned for it (Generations: its n
        samples form one GRPO group) or a single GenerateResult. Every result needs its
        trajectory (generate with return_trajectory=True; return_logprob=True for the
        logprobs, else NaN). Per prompt, optionally: `index` (default: the position), the raw
        prompt (`prompts`: text or chat messages, the DataProto's raw_prompt) and `metadata`
        (a dict, carried as collector files carry the prompt set's extra fields).

        As in collector files, the prompt is every trajectory token before the output (loss
        mask 0, logprob NaN, version -1) and the output has loss mask 1, its logprobs and
        per-token versions; `__num_turns__` is 2 per generated turn in the trajectory (earlier
        turns reused from the router's cache count too). ValueError naming the sample when a
        result lacks its trajectory."""
        from rlfleet.types import GenerateResult
        groups: list[list[GenerateResult]] = [
            [r] if isinstance(r, GenerateResult) else list(r) for r in results]
        n = len(groups)
        for what, col in (("index", index), ("prompts", prompts), ("metadata", metadata)):
            if col is not None and len(col) != n:
                raise ValueError(f"{what}: {len(col)} entries for {n} prompts")
        idx = list(index) if index is not None else list(range(n))
        offsets = [0]
        tokens: list[int] = []
        mask: list[int] = []
        logp: list[float] = []
        versions: list[int] = []
        cols: dict[str, list[Any]] = {k: [] for k in ("index", "sample", "group", "prompt_len",
                                                      "attempts", "weight_version", "status",
                                                      "finish_reason", "metadata", "turns",
                                                      "raw")}
        for g, samples in enumerate(groups):
            for s, r in enumerate(samples):
                t = r.trajectory
                n_out = len(r.output_ids)
                if t is None or len(t.tokens) < n_out:
                    raise ValueError(f"prompt {idx[g]} sample {s}: no trajectory (generate "
                                     "with return_trajectory=True)")
                plen = len(t.tokens) - n_out
                tokens.extend(t.tokens[:plen])
                tokens.extend(r.output_ids)
                mask.extend([0] * plen + [1] * n_out)
                logp.extend([float("nan")] * plen)
                if r.output_logprobs and len(r.output_logprobs) == n_out:
                    logp.extend(lp.logprob for lp in r.output_logprobs)
                else:
                    logp.extend([float("nan")] * n_out)
                versions.extend([-1] * plen)
                versions.extend(r.token_weight_versions())
                offsets.append(len(tokens))
                assistant_runs = _runs_of_ones(t.loss_mask[:plen]) + (1 if n_out else 0)
                cols["index"].append(idx[g])
                cols["sample"].append(s)
                cols["group"].append(g)
                cols["prompt_len"].append(plen)
                cols["attempts"].append(r.attempts)
                cols["weight_version"].append(r.weight_version)
                cols["status"].append("ok")
                cols["finish_reason"].append(r.finish_reason)
                cols["metadata"].append(dict(metadata[g]) if metadata is not None else {})
                cols["turns"].append(2 * max(assistant_runs, 1))
                cols["raw"].append(prompts[g] if prompts is not None else None)
        return Trajectories(
            offsets=np.array(offsets, dtype=np.int64), tokens=np.array(tokens, dtype=np.int32),
            loss_mask=np.array(mask, dtype=np.uint8),
            rollout_logprobs=np.array(logp, dtype=np.float32),
            weight_versions=np.array(versions, dtype=np.int64),
            index=np.array(cols["index"], dtype=np.int64),
            sample=np.array(cols["sample"], dtype=np.int32),
            group=np.array(cols["group"], dtype=np.int64),
            prompt_len=np.array(cols["prompt_len"], dtype=np.int64),
            attempts=np.array(cols["attempts"], dtype=np.int64),
            weight_version=np.array(cols["weight_version"], dtype=np.int64),
            status=cols["status"], finish_reason=cols["finish_reason"],
            metadata=cols["metadata"], num_turns=np.array(cols["turns"], dtype=np.int64),
            raw_prompt=cols["raw"] if prompts is not None else None)

    def to_dataproto(self, pad_token_id: int = 0, include_failed: bool = False,
                     max_prompt_length: Optional[int] = None,
                     max_response_length: Optional[int] = None) -> dict[str, Any]:
        """{"batch": {name: ndarray}, "non_tensor_batch": {name: ndarray}, "meta_info": {}}.
        Failed samples are left out unless include_failed. P and R default to the longest
        prompt / response; a sample longer than a given maximum is a ValueError."""
        rows = [i for i in range(len(self)) if include_failed or self.status[i] == "ok"]
        plens = [int(self.prompt_len[i]) for i in rows]
        rlens = [int(self.offsets[i + 1] - self.offsets[i] - self.prompt_len[i]) for i in rows]
        P = max(plens, default=0) if max_prompt_length is None else max_prompt_length
        R = max(rlens, default=0) if max_response_length is None else max_response_length
        for i, pl, rl in zip(rows, plens, rlens):
            if pl > P or rl > R:
                raise ValueError(f"sample index={self.index[i]} sample={self.sample[i]} has "
                                 f"{pl} prompt / {rl} response tokens, more than {P} / {R}")
        batch = pack_dataproto_batch(
            [(self.prompt_ids(i), self.response_ids(i), self._resp(self.loss_mask, i),
              self._resp(self.rollout_logprobs, i), self._resp(self.weight_versions, i))
             for i in rows], P, R, pad_token_id)
        sel = np.array(rows, dtype=np.int64)
        turns = (self.num_turns[sel] if self.num_turns is not None
                 else np.full(len(rows), 2, dtype=np.int64))
        raw = np.empty(len(rows), dtype=object)
        for r, i in enumerate(rows):
            raw[r] = (self.raw_prompt[i] if self.raw_prompt is not None
                      else self.metadata[i].get("raw_prompt"))
        non_tensor = {
            "index": self.index[sel], "__num_turns__": turns, "raw_prompt": raw,
            "sample": self.sample[sel], "uid": self.group[sel],
            "finish_reason": np.array([self.finish_reason[i] for i in rows], dtype=object),
            "weight_version": self.weight_version[sel],
            "metadata": np.array([self.metadata[i] for i in rows], dtype=object),
        }
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": {}}

    def to_torch(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """The DataProto batch as torch tensors: a tensordict.TensorDict when tensordict is
        installed, else a dict. ImportError when torch is not installed."""
        try:
            import torch
        except ImportError as e:
            raise ImportError("to_torch needs torch (pip install rlfleet[torch])") from e
        d = self.to_dataproto(**kwargs)
        batch = {k: torch.from_numpy(v) for k, v in d["batch"].items()}
        try:
            from tensordict import TensorDict
            n = next(iter(batch.values())).shape[0] if batch else 0
            batch = TensorDict(batch, batch_size=[n])
        except ImportError:
            pass
        return batch, d["non_tensor_batch"]

    def to_parquet(self, path: Union[str, Path]) -> None:
        """One row per sample: the scalar columns, metadata (JSON text), prompt_ids,
        response_ids, response_logprobs, response_weight_versions."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError("to_parquet needs pyarrow (pip install rlfleet[parquet])") from e
        n = len(self)
        starts = self.offsets[:-1]
        mids = starts + self.prompt_len
        ends = self.offsets[1:]

        def lists(values: Array, begin: Array, end: Array, typ: Any) -> Any:
            lengths = (end - begin).astype(np.int32)
            offs = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            take = np.concatenate([np.arange(b, e) for b, e in zip(begin, end)]) if n else \
                np.zeros(0, dtype=np.int64)
            return pa.ListArray.from_arrays(pa.array(offs), pa.array(values[take.astype(np.int64)], type=typ))

        table = pa.table({
            "index": pa.array(self.index, pa.int64()),
            "sample": pa.array(self.sample, pa.int32()),
            "group": pa.array(self.group, pa.int64()),
            "status": pa.array(self.status, pa.string()),
            "finish_reason": pa.array(self.finish_reason, pa.string()),
            "prompt_len": pa.array(self.prompt_len, pa.int64()),
            "attempts": pa.array(self.attempts, pa.int64()),
            "weight_version": pa.array(self.weight_version, pa.int64()),
            "metadata": pa.array([json.dumps(m, sort_keys=True) for m in self.metadata],
                                 pa.string()),
            "prompt_ids": lists(self.tokens, starts, mids, pa.int32()),
            "response_ids": lists(self.tokens, mids, ends, pa.int32()),
            "response_logprobs": lists(self.rollout_logprobs, mids, ends, pa.float32()),
            "response_weight_versions": lists(self.weight_versions, mids, ends, pa.int64()),
        })
        pq.write_table(table, str(path))


def pack_dataproto_batch(rows: Sequence[tuple[Any, Any, Any, Any, Any]], P: int, R: int,
                         pad_token_id: int) -> dict[str, np.ndarray]:
    """verl's DataProto tensors for rows of (prompt ids, response ids, response loss mask,
    response logprobs, response weight versions): prompts left-padded to P, responses
    right-padded to R (the caller checked both fit), NaN logprobs as 0, versions -1 on padding;
    input_ids, attention_mask and position_ids follow. Shared by Trajectories.to_dataproto and
    rlfleet.episodes."""
    n = len(rows)
    prompts = np.full((n, P), pad_token_id, dtype=np.int64)
    prompt_attn = np.zeros((n, P), dtype=np.int64)
    responses = np.full((n, R), pad_token_id, dtype=np.int64)
    response_attn = np.zeros((n, R), dtype=np.int64)
    response_mask = np.zeros((n, R), dtype=np.int64)
    logp = np.zeros((n, R), dtype=np.float32)
    versions = np.full((n, R), -1, dtype=np.int64)
    for r, (prompt, response, mask, lp, vers) in enumerate(rows):
        pl, rl = len(prompt), len(response)
        if pl:
            prompts[r, P - pl:] = prompt
            prompt_attn[r, P - pl:] = 1
        if rl:
            responses[r, :rl] = response
            response_attn[r, :rl] = 1
            response_mask[r, :rl] = mask
            logp[r, :rl] = np.nan_to_num(np.asarray(lp, dtype=np.float32), nan=0.0)
            versions[r, :rl] = vers
    attention_mask = np.concatenate([prompt_attn, response_attn], axis=1)
    position_ids = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
    return {
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask, "position_ids": position_ids,
        "rollout_log_probs": logp, "rollout_weight_versions": versions,
    }


def load_trajectories(path: Union[str, Path]) -> Trajectories:
    """Reads a trajectories.safetensors (or a shard; a folder means DIR/trajectories.safetensors).
    Raises ValueError naming the file when it is not a valid rlfleet.trajectories.v1 file."""
    path = Path(path)
    if path.is_dir():
        path = path / "trajectories.safetensors"
    data = path.read_bytes()

    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: {what}")

    if len(data) < 8:
        raise bad("too short for a safetensors file")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > min(len(data) - 8, _MAX_HEADER):
        raise bad("header length beyond the file")
    try:
        header = json.loads(data[8:8 + hlen])
    except ValueError as e:
        raise bad(f"header is not JSON: {e}") from e
    meta = header.pop("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} file")
    body = memoryview(data)[8 + hlen:]
    cols: dict[str, Array] = {}
    for name, dtype in _TENSORS.items():
        t = header.get(name)
        if t is None or t.get("dtype") != dtype or len(t.get("shape", [])) != 1:
            raise bad(f"tensor {name} missing or not a 1-D {dtype}")
        begin, end = t["data_offsets"]
        npd = np.dtype(_DTYPES[dtype])
        if not (0 <= begin <= end <= len(body)) or (end - begin) != t["shape"][0] * npd.itemsize:
            raise bad(f"tensor {name} has bad offsets")
        cols[name] = np.frombuffer(body[begin:end], dtype=npd).copy()
    scal: dict[str, Any] = {}
    for name in _SCALARS:
        try:
            scal[name] = json.loads(meta[name])
        except (KeyError, ValueError) as e:
            raise bad(f"metadata column {name} missing or not JSON") from e
    n = len(scal["index"])
    if any(len(v) != n for v in scal.values()) or len(cols["offsets"]) != n + 1:
        raise bad("columns differ in length")
    num_tokens = len(cols["tokens"])
    off = cols["offsets"]
    if any(len(cols[k]) != num_tokens for k in _TENSORS if k != "offsets") or \
            (n and (off[0] != 0 or off[-1] != num_tokens or np.any(np.diff(off) < 0))) or \
            (not n and list(off) != [0]):
        raise bad("offsets do not tile the token columns")
    routed: dict[str, Any] = {}
    if "routed_offsets" in header:
        for name, dtype in (("routed_offsets", "I64"), ("routed_experts", "I32"),
                            ("expert_weights", "F32")):
            t = header.get(name)
            if t is None or t.get("dtype") != dtype or len(t.get("shape", [])) != 1:
                raise bad(f"tensor {name} missing or not a 1-D {dtype}")
            begin, end = t["data_offsets"]
            npd = np.dtype(_DTYPES[dtype])
            if not (0 <= begin <= end <= len(body)) or \
                    (end - begin) != t["shape"][0] * npd.itemsize:
                raise bad(f"tensor {name} has bad offsets")
            routed[name] = np.frombuffer(body[begin:end], dtype=npd).copy()
        try:
            routed["routed_start"] = json.loads(meta["routed_start"])
            routed["routed_shape"] = json.loads(meta["routed_shape"])
        except (KeyError, ValueError) as e:
            raise bad("routed_start / routed_shape metadata missing or not JSON") from e
        ro = routed["routed_offsets"]
        if len(ro) != n + 1 or len(routed["routed_start"]) != n or \
                len(routed["routed_shape"]) != n or (n and (ro[0] != 0 or ro[-1] !=
                                                            len(routed["routed_experts"]))):
            raise bad("routed columns do not match the samples")
    return Trajectories(
        **routed,
        offsets=off, tokens=cols["tokens"], loss_mask=cols["loss_mask"],
        rollout_logprobs=cols["rollout_logprobs"], weight_versions=cols["weight_versions"],
        index=np.array(scal["index"], dtype=np.int64), sample=np.array(scal["sample"], dtype=np.int32),
        group=np.array(scal["group"], dtype=np.int64),
        prompt_len=np.array(scal["prompt_len"], dtype=np.int64),
        attempts=np.array(scal["attempts"], dtype=np.int64),
        weight_version=np.array(scal["weight_version"], dtype=np.int64),
        status=list(scal["status"]), finish_reason=list(scal["finish_reason"]),
        metadata=list(scal["metadata"]))


def _runs_of_ones(mask: Sequence[int]) -> int:
    """Maximal runs of 1 in a loss mask (the generated turns a prompt reuses)."""
    runs = 0
    prev = 0
    for m in mask:
        if m and not prev:
            runs += 1
        prev = m
    return runs
