"""Progress of a weight push: a callback per chunk, or a bar on stderr (`progress=True`: tqdm
when it is installed, else one self-rewriting line, at most ten updates a second)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union


@dataclass(frozen=True)
class PushProgress:
    """Where a push stands: bytes handed to the transport so far (of `bytes_total` when known),
    tensors finished, and the tensor being sent."""
    bytes_done: int
    bytes_total: Optional[int]
    tensors_done: int
    tensor: str


ProgressCallback = Callable[[PushProgress], None]
Progress = Union[bool, ProgressCallback, None]


class _Bar:
    def __init__(self, what: str, total: Optional[int]) -> None:
        self._what = what
        self._total = total
        self._start = time.monotonic()
        self._last = 0.0
        self._tqdm: Any = None
        try:
            from tqdm import tqdm
            self._tqdm = tqdm(total=total, unit="B", unit_scale=True, desc=what, leave=True)
        except ImportError:
            pass
        self._shown = 0

    def __call__(self, p: PushProgress) -> None:
        if self._tqdm is not None:
            self._tqdm.update(p.bytes_done - self._shown)
            self._shown = p.bytes_done
            return
        now = time.monotonic()
        if now - self._last < 0.1 and p.bytes_done != self._total:
            return
        self._last = now
        rate = p.bytes_done / max(now - self._start, 1e-9) / 1e9
        mib = p.bytes_done / (1 << 20)
        if self._total:
            pct = 100.0 * p.bytes_done / self._total
            text = f"{mib:.1f}/{self._total / (1 << 20):.1f} MiB ({pct:.0f}%)"
        else:
            text = f"{mib:.1f} MiB"
        sys.stderr.write(f"\r{self._what}: {text}, {p.tensors_done} tensors, {rate:.2f} GB/s")
        sys.stderr.flush()
        self._shown = p.bytes_done

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._shown or self._last:
            sys.stderr.write("\n")
            sys.stderr.flush()


class Reporter:
    """Feeds `progress` (None / False: nothing; True: a bar; a callable: called) as a push goes.
    Use as a context manager so a bar ends its line."""

    def __init__(self, progress: Progress, what: str, total: Optional[int]) -> None:
        self.total = total
        self.bytes_done = 0
        self.tensors_done = 0
        self._bar: Optional[_Bar] = None
        self._fn: Optional[ProgressCallback] = None
        if progress is True:
            self._bar = _Bar(what, total)
            self._fn = self._bar
        elif callable(progress):
            self._fn = progress

    def add(self, nbytes: int, tensor: str, tensor_done: bool) -> None:
        self.bytes_done += nbytes
        if tensor_done:
            self.tensors_done += 1
        if self._fn is not None:
            self._fn(PushProgress(self.bytes_done, self.total, self.tensors_done, tensor))

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
