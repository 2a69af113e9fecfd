"""In-memory tensors as the fleet's weight updates see them: a name, a safetensors dtype
("F32", "BF16", "F16"), a shape and little-endian bytes, read in bounded chunks.

Accepted tensors (`as_payload`):
- NumPy arrays of float32 / float16, and ml_dtypes-style bfloat16 arrays (dtype name
  "bfloat16");
- `WeightTensor(values, "BF16")`: raw values with an explicit dtype, e.g. bf16 held as uint16
  (NumPy has no bfloat16), or bytes with a shape;
- PyTorch tensors (float32 / float16 / bfloat16, CPU or CUDA; torch is never imported unless
  the caller already did).
Collections (`iter_named_tensors`): an iterable of (name, tensor) pairs, a mapping name →
tensor (what safetensors' `load_file` returns), a safetensors `safe_open` handle, or this
module's `read_safetensors` (tensors read from disk one at a time).

Cost: chunks are views of the caller's memory when the tensor is a C-contiguous little-endian
CPU array (NumPy, or torch on the CPU): no copy at all. Otherwise (strided views, big-endian
arrays, CUDA tensors) each chunk is copied on its own, so the extra memory is one chunk, never a
whole tensor. Hashing (`tensor_sha256`) reads the tensor once in the same chunks.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

DTYPE_SIZES: dict[str, int] = {"F32": 4, "BF16": 2, "F16": 2}
# What a payload may be on the weight-sync wire: a served dtype, or U8 (a delta receive's
# encoded tensor, rlfleet.weight_sync.EncodedPayload).
WIRE_DTYPE_SIZES: dict[str, int] = {**DTYPE_SIZES, "U8": 1}
# Other spellings a trainer uses for the same dtypes (NumPy, PyTorch, SGLang's metadata).
_DTYPE_ALIASES: dict[str, str] = {
    "f32": "F32", "float32": "F32", "float": "F32", "torch.float32": "F32", "torch.float": "F32",
    "bf16": "BF16", "bfloat16": "BF16", "torch.bfloat16": "BF16",
    "f16": "F16", "float16": "F16", "half": "F16", "torch.float16": "F16", "torch.half": "F16",
}
# Chunks of the tensor stream and of hashing: what a gRPC message carries comfortably.
DEFAULT_CHUNK_BYTES = 16 << 20
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


def normalize_dtype(dtype: Any) -> str:
    """The safetensors spelling of a float dtype ("F32", "BF16", "F16") from that spelling, a
    NumPy / PyTorch dtype or its name ("bfloat16", "torch.float16"). ValueError otherwise."""
    text = str(dtype)
    if text in DTYPE_SIZES:
        return text
    name = _DTYPE_ALIASES.get(text.lower())
    if name is None:
        raise ValueError(f"dtype {text!r} is not one the fleet serves (F32, BF16, F16; cast the "
                         "tensor first, e.g. astype(np.float32))")
    return name


@dataclass(frozen=True)
class WeightTensor:
    """Raw values with an explicit dtype: `data` is a NumPy array whose item size is the dtype's
    (bf16 as uint16, say) or bytes-like with `shape` given. The values are little-endian unless
    the array's dtype says otherwise."""
    data: Any
    dtype: str
    shape: Optional[tuple[int, ...]] = None


class TensorPayload:
    """One named tensor, ready to stream: its spec and its bytes as bounded chunks."""

    def __init__(self, name: str, dtype: str, shape: Sequence[int],
                 blocks: Callable[[int], Iterator[memoryview]], zero_copy: bool) -> None:
        if not name:
            raise ValueError("a tensor name must not be empty")
        self.name = name
        self.dtype = dtype
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        if any(d < 0 for d in self.shape):
            raise ValueError(f"tensor {name!r}: negative dimension in {list(self.shape)}")
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * WIRE_DTYPE_SIZES[dtype]
        self._blocks = blocks
        # Whether chunks are views of the caller's memory (no copy).
        self.zero_copy = zero_copy

    def chunks(self, max_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[memoryview]:
        """The tensor's bytes in order, every chunk at most `max_bytes` (and at least one byte;
        a tensor of 0 bytes yields nothing). Each chunk is valid until the next is taken."""
        if max_bytes < WIRE_DTYPE_SIZES[self.dtype]:
            raise ValueError(f"chunk size {max_bytes} is smaller than one {self.dtype} value")
        done = 0
        for block in self._blocks(max_bytes):
            n = len(block)
            if n == 0:
                continue
            done += n
            if done > self.nbytes:
                raise ValueError(f"tensor {self.name!r}: more bytes than its {self.describe()}")
            yield block
        if done != self.nbytes:
            raise ValueError(f"tensor {self.name!r}: {done} bytes, its {self.describe()} needs "
                             f"{self.nbytes}")

    def describe(self) -> str:
        return f"{self.dtype}{list(self.shape)}"

    def __repr__(self) -> str:
        return f"TensorPayload({self.name!r}, {self.describe()})"


# NumPy --------------------------------------------------------------------------------------

def _le_dtype(dt: np.dtype[Any]) -> np.dtype[Any]:
    if dt.byteorder == ">" or (dt.byteorder == "=" and not _LITTLE_ENDIAN_HOST):
        little: np.dtype[Any] = dt.newbyteorder("<")
        return little
    return dt


def _as_bytes(block: np.ndarray[Any, Any]) -> memoryview:
    # uint8 view first: memoryview cannot export every dtype (ml_dtypes' bfloat16).
    return block.reshape(-1).view(np.uint8).data


def _numpy_blocks(a: np.ndarray[Any, Any], max_bytes: int) -> Iterator[memoryview]:
    le = _le_dtype(a.dtype)
    per = max(1, max_bytes // a.itemsize)
    if a.ndim == 0:
        yield _as_bytes(np.ascontiguousarray(a.reshape(1), dtype=le))
        return
    if a.flags.c_contiguous and le == a.dtype:
        flat = a.reshape(-1)
        for i in range(0, flat.shape[0], per):
            yield _as_bytes(flat[i:i + per])
        return
    if a.ndim == 1:
        for i in range(0, a.shape[0], per):
            yield _as_bytes(np.ascontiguousarray(a[i:i + per], dtype=le))
        return
    row = int(np.prod(a.shape[1:], dtype=np.int64)) * a.itemsize
    rows = max_bytes // row if row else a.shape[0]
    if rows >= 1:
        for i in range(0, a.shape[0], rows):
            yield _as_bytes(np.ascontiguousarray(a[i:i + rows], dtype=le))
    else:
        for i in range(a.shape[0]):
            yield from _numpy_blocks(a[i], max_bytes)


def _numpy_dtype_name(a: np.ndarray[Any, Any]) -> Optional[str]:
    if a.dtype.kind == "f" and a.itemsize == 4:
        return "F32"
    if a.dtype.kind == "f" and a.itemsize == 2:
        return "F16"
    if a.dtype.name == "bfloat16" and a.itemsize == 2:  # ml_dtypes
        return "BF16"
    return None


def _numpy_payload(name: str, a: np.ndarray[Any, Any], dtype: Optional[str]) -> TensorPayload:
    if dtype is None:
        dtype = _numpy_dtype_name(a)
        if dtype is None:
            raise TypeError(f"tensor {name!r}: NumPy dtype {a.dtype} is not F32, F16 or bfloat16 "
                            "(cast it, or wrap raw values as WeightTensor(values, 'BF16'))")
    elif a.itemsize != DTYPE_SIZES[dtype]:
        raise TypeError(f"tensor {name!r}: {a.dtype} values are {a.itemsize} bytes, {dtype} "
                        f"needs {DTYPE_SIZES[dtype]}")
    zero_copy = bool(a.flags.c_contiguous) and _le_dtype(a.dtype) == a.dtype
    return TensorPayload(name, dtype, a.shape, lambda m: _numpy_blocks(a, m), zero_copy)


# PyTorch ------------------------------------------------------------------------------------

def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_host_bytes(piece: Any) -> memoryview:
    import torch
    if piece.device.type != "cpu":
        piece = piece.to("cpu")
    piece = piece.contiguous().reshape(-1)
    return memoryview(piece.view(torch.uint8).numpy())


def _torch_blocks(t: Any, max_bytes: int) -> Iterator[memoryview]:
    per = max(1, max_bytes // t.element_size())
    if t.dim() == 0:
        yield _torch_host_bytes(t.reshape(1))
        return
    if t.is_contiguous() or t.dim() == 1:
        flat = t.reshape(-1) if t.is_contiguous() else t
        for i in range(0, flat.shape[0], per):
            yield _torch_host_bytes(flat[i:i + per])
        return
    row = int(np.prod(tuple(t.shape[1:]), dtype=np.int64)) * t.element_size()
    rows = max_bytes // row if row else t.shape[0]
    if rows >= 1:
        for i in range(0, t.shape[0], rows):
            yield _torch_host_bytes(t[i:i + rows])
    else:
        for i in range(t.shape[0]):
            yield from _torch_blocks(t[i], max_bytes)


def _torch_payload(name: str, t: Any) -> TensorPayload:
    try:
        dtype = normalize_dtype(str(t.dtype))
    except ValueError:
        raise TypeError(f"tensor {name!r}: torch dtype {t.dtype} is not float32, float16 or "
                        "bfloat16 (cast it first)") from None
    t = t.detach()
    zero_copy = t.device.type == "cpu" and t.is_contiguous()
    return TensorPayload(name, dtype, tuple(t.shape), lambda m: _torch_blocks(t, m), zero_copy)


# Any tensor ---------------------------------------------------------------------------------

def as_payload(name: str, tensor: Any) -> TensorPayload:
    """A TensorPayload of `tensor` (see the module docstring for what is accepted); TypeError
    naming the tensor for anything else."""
    if isinstance(tensor, TensorPayload):
        return tensor
    if isinstance(tensor, WeightTensor):
        dtype = normalize_dtype(tensor.dtype)
        data = tensor.data
        if isinstance(data, np.ndarray):
            if tensor.shape is not None and tuple(tensor.shape) != data.shape:
                data = data.reshape(tensor.shape)
            return _numpy_payload(name, data, dtype)
        if _is_torch_tensor(data):
            raise TypeError(f"tensor {name!r}: pass torch tensors as they are, not in "
                            "WeightTensor")
        if tensor.shape is None:
            raise TypeError(f"tensor {name!r}: WeightTensor over bytes needs a shape")
        raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        values = raw.view(np.uint16 if DTYPE_SIZES[dtype] == 2 else np.uint32)
        return _numpy_payload(name, values.reshape(tensor.shape), dtype)
    if isinstance(tensor, np.ndarray):
        return _numpy_payload(name, tensor, None)
    if _is_torch_tensor(tensor):
        return _torch_payload(name, tensor)
    raise TypeError(f"tensor {name!r}: {type(tensor).__name__} is not a NumPy array, a torch "
                    "tensor or a WeightTensor")


NamedTensors = Union[Mapping[str, Any], Iterable[tuple[str, Any]], Any]


def iter_named_tensors(named_tensors: NamedTensors) -> Iterator[TensorPayload]:
    """TensorPayloads of a collection (see the module docstring), in its order, one at a time:
    a safetensors handle or `read_safetensors` reads each tensor only when it is reached."""
    if isinstance(named_tensors, (str, bytes)):
        raise TypeError("named_tensors: a string is not a collection of tensors (for a file, "
                        "use rlfleet.read_safetensors(path))")
    if isinstance(named_tensors, Mapping):
        for name in named_tensors:
            yield as_payload(str(name), named_tensors[name])
        return
    if hasattr(named_tensors, "get_tensor") and hasattr(named_tensors, "keys"):
        for name in named_tensors.keys():  # a safetensors safe_open handle
            yield as_payload(str(name), named_tensors.get_tensor(name))
        return
    for item in named_tensors:
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise TypeError(f"named_tensors: expected (name, tensor) pairs, got "
                            f"{type(item).__name__}")
        yield as_payload(item[0], item[1])


def total_bytes(named_tensors: NamedTensors) -> Optional[int]:
    """The total bytes of a collection when known without reading any tensor (a list, a
    mapping, read_safetensors), else None (a generator, a safe_open handle)."""
    if isinstance(named_tensors, SafetensorsFile):
        return named_tensors.total_bytes()
    if isinstance(named_tensors, Mapping):
        return sum(as_payload(str(k), v).nbytes for k, v in named_tensors.items())
    if isinstance(named_tensors, (list, tuple)):
        try:
            return sum(as_payload(n, t).nbytes for n, t in named_tensors)
        except (TypeError, ValueError):
            return None
    return None


# Checksums ----------------------------------------------------------------------------------

def tensor_sha256(name: str, tensor: Any) -> str:
    """The hex SHA-256 the fleet's weights checker reports for `tensor` held under `name`:
    SHA-256 over  name '\\0' dtype '\\0' shape '\\0' bytes  (dtype in safetensors spelling,
    shape as decimal dims joined by ',', bytes little-endian). A worker holds a pushed tensor in
    the dtype of its own weights: hash the values as the worker holds them."""
    p = as_payload(name, tensor)
    h = hashlib.sha256()
    h.update(p.name.encode() + b"\0" + p.dtype.encode() + b"\0" +
             ",".join(str(d) for d in p.shape).encode() + b"\0")
    for chunk in p.chunks():
        h.update(chunk)
    return h.hexdigest()


def rank_sha256(tensor_digests: Mapping[str, str]) -> str:
    """The weights checker's per-rank digest: SHA-256 over the lines "name:digest\\n" in name
    order."""
    h = hashlib.sha256()
    for name in sorted(tensor_digests):
        h.update(f"{name}:{tensor_digests[name]}\n".encode())
    return h.hexdigest()


# Reading safetensors checkpoints ------------------------------------------------------------

_FILE_DTYPES: dict[str, str] = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8",
                                "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
                                "U8": "u1", "BOOL": "?"}
_MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class _Entry:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class SafetensorsFile(Mapping[str, Any]):
    """The tensors of a safetensors file, or of every *.safetensors in a folder, by name (sorted).

    Each access reads that tensor from disk into a new NumPy array (never a memory map: a
    checkpoint saved over the file later does not change it): F32 / F16 as float arrays, BF16
    as WeightTensor(uint16 values, "BF16"). Headers are checked when opened (JSON, offsets
    inside the file, sizes matching shapes); a bad file is a ValueError naming it."""

    def __init__(self, path: Union[str, Path]) -> None:
        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files:
            raise ValueError(f"{path}: no *.safetensors file")
        self._entries: dict[str, _Entry] = {}
        for f in files:
            for name, entry in _read_header(f).items():
                if name in self._entries:
                    raise ValueError(f"{f}: tensor {name!r} also in {self._entries[name].path}")
                self._entries[name] = entry
        self._names = sorted(self._entries)

    def __getitem__(self, name: str) -> Any:
        e = self._entries[name]
        count = e.nbytes // np.dtype(_FILE_DTYPES[e.dtype]).itemsize
        with open(e.path, "rb") as f:
            f.seek(e.offset)
            values = np.fromfile(f, dtype=_FILE_DTYPES[e.dtype], count=count)
        if values.size != count:
            raise ValueError(f"{e.path}: tensor {name!r} is cut short")
        values = values.reshape(e.shape)
        return WeightTensor(values, "BF16") if e.dtype == "BF16" else values

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def spec(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(dtype, shape) of a tensor, without reading it."""
        e = self._entries[name]
        return e.dtype, e.shape

    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())


def read_safetensors(path: Union[str, Path]) -> SafetensorsFile:
    """The tensors of a safetensors file or checkpoint folder (SafetensorsFile)."""
    return SafetensorsFile(path)


def _read_header(path: Path) -> dict[str, _Entry]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: too short for a safetensors file")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > min(size - 8, _MAX_HEADER_BYTES):
            raise ValueError(f"{path}: header length {hlen} beyond the file")
        try:
            header = json.loads(f.read(hlen))
        except ValueError as e:
            raise ValueError(f"{path}: header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    base = 8 + hlen
    out: dict[str, _Entry] = {}
    for name, t in header.items():
        try:
            dtype = str(t["dtype"])
            shape = tuple(int(d) for d in t["shape"])
            begin, end = (int(x) for x in t["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: tensor {name!r}: bad header entry") from e
        if dtype not in _FILE_DTYPES:
            raise ValueError(f"{path}: tensor {name!r}: unknown dtype {dtype}")
        if any(d < 0 for d in shape):
            raise ValueError(f"{path}: tensor {name!r}: negative dimension")
        need = int(np.prod(shape, dtype=np.int64)) * np.dtype(_FILE_DTYPES[dtype]).itemsize
        if not 0 <= begin <= end <= size - base or end - begin != need:
            raise ValueError(f"{path}: tensor {name!r}: data offsets [{begin}, {end}) do not "
                             f"hold its {dtype}{list(shape)} inside the file")
        out[name] = _Entry(path, dtype, shape, base + begin, need)
    return out
