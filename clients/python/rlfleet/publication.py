"""Publishing weight versions the way workers verify them (docs/weight-publications.md).

A publication names its version, its parent version and a manifest of per-tensor SHA-256
digests (the weights checker's digest); workers refuse to serve a staged version whose tensors
do not match it, and a version number they served with other content. Two trainer-side writers:

    from rlfleet.publication import write_manifest, write_delta
    write_manifest("ckpt/step-7", version=7, parent_version=6)      # ckpt/step-7/rl-manifest.json
    write_delta("ckpt/step-6", "ckpt/step-7", "pub/step-7", version=7)  # weights.rldelta + manifest

then `Client.stage_weights(model_path=...)` / the router's refit on either folder. The delta file
is the format rl-worker reads (weights.rldelta: magic, JSON header with the child's manifest,
per-tensor payloads encoded as overwrite or xor, the smaller of the two); a worker applies it to
a copy of the parent version it serves, then verifies the child's manifest.

Cost: writing a manifest reads and hashes every tensor once; a delta reads both checkpoints one
tensor at a time (NumPy, no copy of the whole model).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import numpy as np

from rlfleet._stubs import admin_pb2
from rlfleet.tensors import (DEFAULT_CHUNK_BYTES, NamedTensors, TensorPayload, WeightTensor,
                             as_payload, iter_named_tensors, rank_sha256, read_safetensors,
                             tensor_sha256)

MANIFEST_FILE = "rl-manifest.json"
MANIFEST_FORMAT = "rlfleet.manifest.v1"
DELTA_FILE = "weights.rldelta"
DELTA_FORMAT = "rlfleet.delta.v1"
_MAGIC = b"RLDELTA1"
_WORD: dict[str, np.dtype[Any]] = {"F32": np.dtype("<u4"), "BF16": np.dtype("<u2"),
                                  "F16": np.dtype("<u2")}


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _raw(values: Any) -> np.ndarray[Any, Any]:
    return np.asarray(values.data if isinstance(values, WeightTensor) else values)


def manifest_of(folder: Union[str, Path], version: int, parent_version: Optional[int] = None,
                parent_sha256: Optional[str] = None) -> dict[str, Any]:
    """The manifest of the safetensors checkpoint in `folder` (every tensor hashed), as the
    JSON object rl-manifest.json holds."""
    if version < 0:
        raise ValueError("version must be >= 0")
    if parent_version is not None and not 0 <= parent_version < version:
        raise ValueError("parent_version must be in [0, version)")
    ckpt = read_safetensors(folder)
    tensors: dict[str, dict[str, Any]] = {}
    for name in ckpt:
        dtype, shape = ckpt.spec(name)
        if dtype not in _WORD:
            continue  # never served: not part of a manifest
        tensors[name] = {"dtype": dtype, "shape": list(shape),
                         "sha256": tensor_sha256(name, ckpt[name])}
    m: dict[str, Any] = {"format": MANIFEST_FORMAT, "version": version}
    if parent_version is not None:
        m["parent_version"] = parent_version
    if parent_sha256:
        m["parent_sha256"] = parent_sha256
    m["sha256"] = rank_sha256({n: t["sha256"] for n, t in tensors.items()})
    m["tensors"] = tensors
    return m


def write_manifest(folder: Union[str, Path], version: int, parent_version: Optional[int] = None,
                   parent_sha256: Optional[str] = None) -> dict[str, Any]:
    """Writes FOLDER/rl-manifest.json (atomically) and returns the manifest."""
    m = manifest_of(folder, version, parent_version, parent_sha256)
    _atomic_write(Path(folder) / MANIFEST_FILE, json.dumps(m, indent=1).encode())
    return m


def read_manifest(folder: Union[str, Path]) -> Optional[dict[str, Any]]:
    """FOLDER/rl-manifest.json, or None when absent. ValueError when its digest does not match
    the tensors it lists."""
    path = Path(folder) / MANIFEST_FILE
    if not path.exists():
        return None
    m: dict[str, Any] = json.loads(path.read_text())
    if m.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: format is not {MANIFEST_FORMAT}")
    if rank_sha256({n: t["sha256"] for n, t in m["tensors"].items()}) != m.get("sha256"):
        raise ValueError(f"{path}: sha256 is not the digest of its tensors")
    return m


def _varints(values: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """LEB128 bytes of every value, as (bytes, length per value), vectorized."""
    v = values.astype(np.uint64)
    lengths = np.ones(v.shape, dtype=np.int64)
    t = v >> np.uint64(7)
    while np.any(t):
        lengths += (t > 0)
        t >>= np.uint64(7)
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    rest = v.copy()
    for k in range(int(lengths.max()) if v.size else 0):
        live = lengths > k
        byte = (rest[live] & np.uint64(0x7F)).astype(np.uint8)
        more = lengths[live] > k + 1
        out[starts[live] + k] = byte | (more.astype(np.uint8) << 7)
        rest[live] >>= np.uint64(7)
    return out, lengths


def _encode_overwrite(child: np.ndarray[Any, Any], idx: np.ndarray[Any, Any]) -> bytes:
    gaps = np.diff(idx, prepend=-1) - 1
    vb, vl = _varints(gaps)
    width = child.itemsize
    out = np.zeros(len(vb) + width * len(idx), dtype=np.uint8)
    entry = vl + width
    starts = np.concatenate(([0], np.cumsum(entry)[:-1]))
    vstarts = np.concatenate(([0], np.cumsum(vl)[:-1]))
    for k in range(int(vl.max()) if len(idx) else 0):
        live = vl > k
        out[starts[live] + k] = vb[vstarts[live] + k]
    words = child[idx].view(np.uint8).reshape(-1, width)
    for b in range(width):
        out[starts + vl + b] = words[:, b]
    return out.tobytes()


def _encode_xor(parent: np.ndarray[Any, Any], child: np.ndarray[Any, Any],
                idx: np.ndarray[Any, Any]) -> tuple[bytes, int]:
    """The xor runs: literal runs swallow zero gaps cheaper than a split (2 bytes)."""
    width = child.itemsize
    out = bytearray()
    n = parent.size
    pos = 0
    if len(idx):
        split = np.flatnonzero((np.diff(idx) - 1) * width > 2)
        run_starts = np.concatenate(([idx[0]], idx[split + 1]))
        run_ends = np.concatenate((idx[split] + 1, [idx[-1] + 1]))
        x = parent ^ child
        for s, e in zip(run_starts.tolist(), run_ends.tolist()):
            out += _varints(np.array([s - pos, e - s]))[0].tobytes()
            out += x[s:e].tobytes()
            pos = e
        count = int((run_ends - run_starts).sum())
    else:
        count = 0
    if pos < n:
        out += _varints(np.array([n - pos, 0]))[0].tobytes()
    return bytes(out), count


def encode_delta(dtype: str, parent: Any, child: Any) -> tuple[str, int, bytes]:
    """(encoding, count, payload) of `child` against `parent` (same dtype and shape): the smaller
    of overwrite and xor, as rl-worker decodes it."""
    word = _WORD[dtype]
    p = np.ascontiguousarray(_raw(parent)).reshape(-1).view(word)
    c = np.ascontiguousarray(_raw(child)).reshape(-1).view(word)
    if p.shape != c.shape:
        raise ValueError("parent and child differ in size")
    idx = np.flatnonzero(p != c)
    over = _encode_overwrite(c, idx)
    xor, count = _encode_xor(p, c, idx)
    if len(over) <= len(xor):
        return "overwrite", int(len(idx)), over
    return "xor", count, xor


def write_delta(parent: Union[str, Path], child: Union[str, Path], out: Union[str, Path],
                version: int, parent_version: Optional[int] = None) -> dict[str, Any]:
    """Publishes checkpoint `child` as a delta of checkpoint `parent` into `out`:
    OUT/weights.rldelta and OUT/rl-manifest.json (the child's manifest). The parent's version and
    digest come from PARENT/rl-manifest.json when present, else `parent_version` (required then)
    and a digest computed here. Returns {"delta_bytes", "dense_bytes", "changed_elements",
    "num_elements"}."""
    pm = read_manifest(parent)
    if pm is not None:
        if parent_version is not None and parent_version != pm["version"]:
            raise ValueError(f"parent_version {parent_version}, but {parent} is version "
                             f"{pm['version']}")
        parent_version = int(pm["version"])
        parent_sha = str(pm["sha256"])
    elif parent_version is None:
        raise ValueError(f"{parent} has no {MANIFEST_FILE}: name parent_version")
    else:
        parent_sha = str(manifest_of(parent, parent_version)["sha256"])
    if version <= parent_version:
        raise ValueError("version must be greater than the parent's")
    manifest = manifest_of(child, version, parent_version, parent_sha)
    pc, cc = read_safetensors(parent), read_safetensors(child)
    entries: list[dict[str, Any]] = []
    payloads: list[bytes] = []
    offset = 0
    stats = {"dense_bytes": 0, "changed_elements": 0, "num_elements": 0}
    for name in cc:
        dtype, shape = cc.spec(name)
        if dtype not in _WORD:
            continue  # never served
        if name not in pc or pc.spec(name) != (dtype, shape):
            raise ValueError(f"tensor {name!r}: no counterpart of the same dtype and shape in "
                             f"{parent}")
        pv, cv = _raw(pc[name]), _raw(cc[name])
        stats["dense_bytes"] += cv.nbytes
        stats["num_elements"] += cv.size
        encoding, count, payload = encode_delta(dtype, pv, cv)
        if count == 0:
            continue
        stats["changed_elements"] += int(np.count_nonzero(
            pv.reshape(-1).view(_WORD[dtype]) != cv.reshape(-1).view(_WORD[dtype])))
        entries.append({"name": name, "dtype": dtype, "encoding": encoding, "count": count,
                        "data_offsets": [offset, offset + len(payload)]})
        payloads.append(payload)
        offset += len(payload)
    header = json.dumps({"format": DELTA_FORMAT, "manifest": manifest,
                         "tensors": entries}).encode()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    blob = _MAGIC + struct.pack("<Q", len(header)) + header + b"".join(payloads)
    _atomic_write(out / DELTA_FILE, blob)
    _atomic_write(out / MANIFEST_FILE, json.dumps(manifest, indent=1).encode())
    stats["delta_bytes"] = len(blob)
    return stats


def _tensor_bytes(named: NamedTensors) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, raw little-endian bytes) of every tensor of `named`."""
    out: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for t in iter_named_tensors(named):
        out[t.name] = (t.dtype, t.shape, b"".join(bytes(c) for c in t.chunks()))
    return out


def _delta_entries(parent_tensors: NamedTensors, new_tensors: NamedTensors
                   ) -> Iterator[tuple[TensorPayload, bytes, Optional[tuple[str, int]]]]:
    """Per tensor of `new_tensors` that changed: (the tensor, the bytes to send, (encoding,
    count) when they are its delta payload against `parent_tensors`, None when they are the
    tensor whole: it has no counterpart there). Unchanged tensors are left out. ValueError for a
    dtype or shape that differs from the parent's."""
    parent = _tensor_bytes(parent_tensors)
    for t in iter_named_tensors(new_tensors):
        data = b"".join(bytes(c) for c in t.chunks())
        if t.name not in parent:
            yield t, data, None
            continue
        pdtype, pshape, pdata = parent[t.name]
        if (pdtype, pshape) != (t.dtype, t.shape):
            raise ValueError(f"tensor {t.name!r}: {t.dtype}{list(t.shape)} but the parent's "
                             f"is {pdtype}{list(pshape)} (a delta changes values only)")
        encoding, count, payload = encode_delta(
            t.dtype, np.frombuffer(pdata, dtype=_WORD[t.dtype]),
            np.frombuffer(data, dtype=_WORD[t.dtype]))
        if count == 0:
            continue  # unchanged: the worker keeps the parent's
        yield t, payload, (encoding, count)


def delta_tensors(parent_tensors: NamedTensors, new_tensors: NamedTensors) -> list[TensorPayload]:
    """The tensors a delta group receive broadcasts (issue 30; WeightsGroup.send_delta): every
    tensor of `new_tensors` that differs from its counterpart in `parent_tensors` as an
    rlfleet.weight_sync.EncodedPayload (encode_delta: the smaller of overwrite and xor), a
    tensor without a counterpart whole, an unchanged one not at all. ValueError for a dtype or
    shape that differs from the parent's."""
    from rlfleet.weight_sync import EncodedPayload
    out: list[TensorPayload] = []
    for t, data, encoded in _delta_entries(parent_tensors, new_tensors):
        if encoded is None:
            out.append(as_payload(t.name, WeightTensor(data, t.dtype, t.shape)))
        else:
            out.append(EncodedPayload(t.name, t.dtype, t.shape, encoded[0], encoded[1], data))
    return out


def delta_messages(parent_tensors: NamedTensors, new_tensors: NamedTensors, weight_version: int,
                   parent_version: int, *, stage: bool = False,
                   manifest: Optional[dict[str, Any]] = None,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    """The encoded messages of a delta tensor stream (UpdateWeightsFromTensor with
    parent_version, issue 30): every tensor of `new_tensors` that differs from its counterpart in
    `parent_tensors` (same dtype and shape) as its delta payload (encode_delta: the smaller of
    overwrite and xor), a tensor without a counterpart whole, an unchanged one not at all (the
    worker keeps the parent's). Payloads are cut in chunks of at most `chunk_bytes`. `manifest`
    (manifest_of's dict for the new version) makes the worker verify the result before it is
    applied or staged. ValueError for a dtype or shape that differs from the parent's."""
    if weight_version <= parent_version or parent_version < 0:
        raise ValueError("weight_version must be greater than parent_version >= 0")
    if not 0 < chunk_bytes:
        raise ValueError("chunk_bytes must be > 0")
    first = admin_pb2.UpdateWeightsFromTensorRequest(
        weight_version=weight_version, parent_version=parent_version, stage=stage,
        manifest_json=json.dumps(manifest) if manifest is not None else "")
    messages: list[bytes] = []
    names: set[str] = set()
    num_bytes = 0
    for t, data, encoded in _delta_entries(parent_tensors, new_tensors):
        chunk = admin_pb2.TensorChunk(name=t.name, dtype=t.dtype, shape=t.shape)
        if encoded is not None:
            chunk.encoding, chunk.delta_count, chunk.payload_bytes = (encoded[0], encoded[1],
                                                                       len(data))
        else:
            chunk.encoding = "dense"
        word = _WORD[t.dtype].itemsize
        step = chunk_bytes if chunk.encoding != "dense" else max(chunk_bytes // word * word, word)
        offset = 0
        while True:
            piece = data[offset:offset + step]
            msg = admin_pb2.UpdateWeightsFromTensorRequest() if messages else first
            msg.chunk.CopyFrom(chunk)
            msg.chunk.offset = offset
            msg.chunk.data = piece
            messages.append(msg.SerializeToString())
            offset += len(piece)
            if offset >= len(data):
                break
        names.add(t.name)
        num_bytes += len(data)
    end = admin_pb2.UpdateWeightsFromTensorRequest() if messages else first
    end.end.num_tensors = len(names)
    end.end.num_bytes = num_bytes
    messages.append(end.SerializeToString())
    return messages


__all__ = ["MANIFEST_FILE", "DELTA_FILE", "manifest_of", "write_manifest", "read_manifest",
           "encode_delta", "write_delta", "delta_messages", "delta_tensors"]
