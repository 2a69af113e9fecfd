"""FleetError: the one exception every rlfleet call raises.

A call fails when the server answers a gRPC error, when an admin call answers `success=false`
(a router broadcast where any worker failed, e.g. a weight update one worker refused), and when
the trainer-side weight-group sender cannot deliver a bucket. FleetError subclasses
grpc.RpcError and keeps its `code()` / `details()` methods, so code written against raw grpc
keeps working; it adds the per-worker outcomes of a broadcast (`results`) and the response that
said `success=false` (`response`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import grpc


@dataclass(frozen=True)
class WorkerOutcome:
    """One target's result of a broadcast (rl.v1.WorkerResult), or one rank of a weight group.

    `code` is the gRPC status of that worker's answer; `left_out` says the router took the worker
    out of routing after the call (its weights may be partial, or it missed its deadline)."""
    worker: str
    success: bool
    code: grpc.StatusCode
    message: str
    weight_version: int = -1
    left_out: bool = False

    def __str__(self) -> str:
        if self.success:
            return f"{self.worker}: OK (v{self.weight_version})"
        out = " (left out of routing)" if self.left_out else ""
        return f"{self.worker}: {self.code.name}: {self.message}{out}"


def status_code(name: str) -> grpc.StatusCode:
    """The grpc.StatusCode named `name` ("FAILED_PRECONDITION"); UNKNOWN for anything else."""
    for code in grpc.StatusCode:
        if code.name == name:
            return code
    return grpc.StatusCode.UNKNOWN


class FleetError(grpc.RpcError):
    """A failed rlfleet call.

    code():    the grpc.StatusCode (for an in-band failure, the first failed worker's code)
    details(): the message
    method:    the RPC ("UpdateWeightsFromDisk") or operation ("broadcast") that failed
    results:   every target's WorkerOutcome (broadcasts through the router and weight groups;
               empty otherwise), successes included
    response:  the response message that carried success=false (None for gRPC errors)
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, method: str = "",
                 results: Sequence[WorkerOutcome] = (), response: Optional[Any] = None) -> None:
        super().__init__(message)
        self._code = code
        self._message = message
        self.method = method
        self.results: list[WorkerOutcome] = list(results)
        self.response = response

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    @property
    def failures(self) -> list[WorkerOutcome]:
        """The outcomes that failed."""
        return [r for r in self.results if not r.success]

    def __str__(self) -> str:
        head = f"{self.method}: " if self.method else ""
        text = f"{head}{self._code.name}: {self._message}"
        failed = self.failures
        if failed:
            text += "; " + "; ".join(str(r) for r in failed)
        return text

    def __repr__(self) -> str:
        return f"FleetError({self})"

    @staticmethod
    def from_rpc_error(error: grpc.RpcError, method: str) -> "FleetError":
        """Wraps a grpc error (sync or asyncio) raised by `method`."""
        code_fn = getattr(error, "code", None)
        details_fn = getattr(error, "details", None)
        code = code_fn() if callable(code_fn) else None
        details = details_fn() if callable(details_fn) else None
        if not isinstance(code, grpc.StatusCode):
            code = grpc.StatusCode.UNKNOWN
        return FleetError(code, str(details) if details is not None else str(error),
                          method=method)
