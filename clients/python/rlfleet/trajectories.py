"""Reads rl-collect output (`rlfleet.trajectories.v1` safetensors: ragged CSR columns plus
scalar columns in the header) into numpy, lays it out as verl's DataProto batch, converts to
torch (only when torch is installed) and exports Parquet (pyarrow).

DataProto layout (verl's agent-loop postprocess): `prompts` [N, P] left-padded, `responses`
[N, R] right-padded, `response_mask` [N, R] (the response's loss mask, 0 on padding),
`input_ids` = prompts ‖ responses, `attention_mask` [N, P+R] (1 on real tokens),
`position_ids` = clip(cumsum(attention_mask) - 1, 0), `rollout_log_probs` [N, R] (0 on
padding), plus `rollout_weight_versions` [N, R] (-1 on padding). Non-tensor fields: index,
sample, uid (the GRPO group), finish_reason, weight_version, metadata.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

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
    offsets: np.ndarray          # int64 [N+1]
    tokens: np.ndarray           # int32 [T]
    loss_mask: np.ndarray        # uint8 [T]
    rollout_logprobs: np.ndarray  # float32 [T], NaN on prompt tokens
    weight_versions: np.ndarray  # int64 [T], -1 on prompt tokens
    index: np.ndarray            # int64 [N]
    sample: np.ndarray           # int32 [N]
    group: np.ndarray            # int64 [N]
    prompt_len: np.ndarray       # int64 [N]
    attempts: np.ndarray         # int64 [N]
    weight_version: np.ndarray   # int64 [N]
    status: list[str]
    finish_reason: list[str]
    metadata: list[dict]
    # R3 (shards from rl-collect --return-routed-experts; None otherwise): sample i's routing is
    # routed_experts[routed_offsets[i]:routed_offsets[i+1]], shaped routed_shape[i] =
    # [tokens, MoE layers, top_k] for the tokens from position routed_start[i] on.
    routed_offsets: Optional[np.ndarray] = None   # int64 [N+1]
    routed_experts: Optional[np.ndarray] = None   # int32 [R]
    expert_weights: Optional[np.ndarray] = None   # float32 [R] or [0]
    routed_start: Optional[list[int]] = None
    routed_shape: Optional[list[list[int]]] = None

    def routing(self, i: int):
        """(start position, expert ids [tokens, layers, top_k], weights or None) of sample i;
        None when the file has no routing or the sample none."""
        if self.routed_offsets is None or not self.routed_shape[i]:
            return None
        b, e = self.routed_offsets[i], self.routed_offsets[i + 1]
        shape = tuple(self.routed_shape[i])
        w = self.expert_weights[b:e].reshape(shape) if len(self.expert_weights) else None
        return self.routed_start[i], self.routed_experts[b:e].reshape(shape), w

    def __len__(self) -> int:
        return len(self.index)

    @property
    def ok(self) -> np.ndarray:
        """Boolean mask of the samples that completed (status "ok")."""
        return np.array([s == "ok" for s in self.status], dtype=bool)

    def prompt_ids(self, i: int) -> np.ndarray:
        s = self.offsets[i]
        return self.tokens[s:s + self.prompt_len[i]]

    def response_ids(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] + self.prompt_len[i]:self.offsets[i + 1]]

    def _resp(self, column: np.ndarray, i: int) -> np.ndarray:
        return column[self.offsets[i] + self.prompt_len[i]:self.offsets[i + 1]]

    def to_dataproto(self, pad_token_id: int = 0, include_failed: bool = False,
                     max_prompt_length: Optional[int] = None,
                     max_response_length: Optional[int] = None) -> dict:
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
        n = len(rows)
        prompts = np.full((n, P), pad_token_id, dtype=np.int64)
        prompt_attn = np.zeros((n, P), dtype=np.int64)
        responses = np.full((n, R), pad_token_id, dtype=np.int64)
        response_attn = np.zeros((n, R), dtype=np.int64)
        response_mask = np.zeros((n, R), dtype=np.int64)
        logp = np.zeros((n, R), dtype=np.float32)
        versions = np.full((n, R), -1, dtype=np.int64)
        for r, (i, pl, rl) in enumerate(zip(rows, plens, rlens)):
            if pl:
                prompts[r, P - pl:] = self.prompt_ids(i)
                prompt_attn[r, P - pl:] = 1
            if rl:
                responses[r, :rl] = self.response_ids(i)
                response_attn[r, :rl] = 1
                response_mask[r, :rl] = self._resp(self.loss_mask, i)
                logp[r, :rl] = np.nan_to_num(self._resp(self.rollout_logprobs, i), nan=0.0)
                versions[r, :rl] = self._resp(self.weight_versions, i)
        attention_mask = np.concatenate([prompt_attn, response_attn], axis=1)
        position_ids = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
        batch = {
            "prompts": prompts, "responses": responses, "response_mask": response_mask,
            "input_ids": np.concatenate([prompts, responses], axis=1),
            "attention_mask": attention_mask, "position_ids": position_ids,
            "rollout_log_probs": logp, "rollout_weight_versions": versions,
        }
        sel = np.array(rows, dtype=np.int64)
        non_tensor = {
            "index": self.index[sel], "sample": self.sample[sel], "uid": self.group[sel],
            "finish_reason": np.array([self.finish_reason[i] for i in rows], dtype=object),
            "weight_version": self.weight_version[sel],
            "metadata": np.array([self.metadata[i] for i in rows], dtype=object),
        }
        return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": {}}

    def to_torch(self, **kwargs):
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

        def lists(values, begin, end, typ):
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


def load_trajectories(path: Union[str, Path]) -> Trajectories:
    """Reads a trajectories.safetensors (or a shard; a folder means DIR/trajectories.safetensors).
    Raises ValueError naming the file when it is not a valid rlfleet.trajectories.v1 file."""
    path = Path(path)
    if path.is_dir():
        path = path / "trajectories.safetensors"
    data = path.read_bytes()

    def bad(what):
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
    cols = {}
    for name, dtype in _TENSORS.items():
        t = header.get(name)
        if t is None or t.get("dtype") != dtype or len(t.get("shape", [])) != 1:
            raise bad(f"tensor {name} missing or not a 1-D {dtype}")
        b, e = t["data_offsets"]
        npd = np.dtype(_DTYPES[dtype])
        if not (0 <= b <= e <= len(body)) or (e - b) != t["shape"][0] * npd.itemsize:
            raise bad(f"tensor {name} has bad offsets")
        cols[name] = np.frombuffer(body[b:e], dtype=npd).copy()
    scal = {}
    for name in _SCALARS:
        try:
            scal[name] = json.loads(meta[name])
        except (KeyError, ValueError) as e:
            raise bad(f"metadata column {name} missing or not JSON") from e
    n = len(scal["index"])
    if any(len(v) != n for v in scal.values()) or len(cols["offsets"]) != n + 1:
        raise bad("columns differ in length")
    t = len(cols["tokens"])
    off = cols["offsets"]
    if any(len(cols[k]) != t for k in _TENSORS if k != "offsets") or \
            (n and (off[0] != 0 or off[-1] != t or np.any(np.diff(off) < 0))) or \
            (not n and list(off) != [0]):
        raise bad("offsets do not tile the token columns")
    routed = {}
    if "routed_offsets" in header:
        for name, dtype in (("routed_offsets", "I64"), ("routed_experts", "I32"),
                            ("expert_weights", "F32")):
            t = header.get(name)
            if t is None or t.get("dtype") != dtype or len(t.get("shape", [])) != 1:
                raise bad(f"tensor {name} missing or not a 1-D {dtype}")
            b, e = t["data_offsets"]
            npd = np.dtype(_DTYPES[dtype])
            if not (0 <= b <= e <= len(body)) or (e - b) != t["shape"][0] * npd.itemsize:
                raise bad(f"tensor {name} has bad offsets")
            routed[name] = np.frombuffer(body[b:e], dtype=npd).copy()
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
