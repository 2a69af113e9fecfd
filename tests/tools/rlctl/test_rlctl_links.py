"""rlctl is a client: it links client libraries only (protos, tokenizer, model files, bucket
plans), never the router's or the worker's server code nor the weight-sync transports."""

import shutil
import subprocess

import pytest

from rltest import BUILD

RLCTL = BUILD / "bin" / "rlctl"

# Namespaces and classes of server code (in demangled symbols).
SERVER_CODE = (
    "rl::router::",
    "rl::worker::",
    "rl::engine::",
    "rl::weight_sync::WeightReceiver",
    "rl::weight_sync::WeightSender",
    "rl::weight_sync::ConnectReceiver",
)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils)")
def test_rlctl_defines_no_server_code():
    out = subprocess.run(["nm", "-C", "--defined-only", str(RLCTL)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    symbols = [line.split(" ", 2)[-1] for line in out.splitlines()]
    assert any("rl::rlctl::" in s for s in symbols)  # the reading works: rlctl's own code is there
    assert any("rl::weight_sync::ParseBucketJson" in s for s in symbols)  # the bucket-plan library
    leaked = [s for s in symbols if any(code in s for code in SERVER_CODE)]
    assert leaked == [], leaked[:10]
