"""Non-finite weights are refused at load by the real rl-worker: at start-up, on
UpdateWeightsFromDisk (the old weights keep serving, same checksum and greedy output), and while
asleep (the staged folder); --allow-non-finite-weights loads them. The checkpoint is
stories260K-bf16 with one NaN in the last element of a bf16 tensor."""

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from rltest import BIN, DATA

STORIES_BF16 = DATA / "stories260K-bf16"
BAD_TENSOR = "model.norm.weight"


def with_value_at_last_element(src: Path, dst: Path, tensor: str, bf16_bits: int) -> str:
    """Copies a safetensors model folder, writing `bf16_bits` into the last element of
    `tensor` (a BF16 tensor); returns the tensor's shape as the worker prints it."""
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    data = bytearray(path.read_bytes())
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + header_len])
    entry = header[tensor]
    assert entry["dtype"] == "BF16", entry
    _, end = entry["data_offsets"]
    struct.pack_into("<H", data, 8 + header_len + end - 2, bf16_bits)
    path.write_bytes(bytes(data))
    return "[" + ", ".join(str(d) for d in entry["shape"]) + "]"


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    if not STORIES_BF16.is_dir():
        pytest.fail(f"test data missing: {STORIES_BF16} (set RL_TEST_DATA)")
    dst = tmp_path_factory.mktemp("nan") / "stories260K-bf16-nan"
    shape = with_value_at_last_element(STORIES_BF16, dst, BAD_TENSOR, 0x7FC0)  # bf16 quiet NaN
    last = 1
    for d in json.loads(shape):
        last *= d
    return dst, f"tensor '{BAD_TENSOR}' (BF16 {shape}) holds NaN at element {last - 1}"


def rlctl(target, *args):
    r = subprocess.run([str(BIN / "rlctl"), "--target", target, "--json", *args],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, json.loads(r.stdout)


def served(address):
    """(rank checksum, greedy output ids, weight version) of a live worker."""
    rc, check = rlctl(address, "weights-checker", "--action", "checksum")
    assert rc == 0, check
    rc, gen = rlctl(address, "generate", "--text", "Once upon a time", "--max-new-tokens", "12",
                    "--temperature", "0")
    assert rc == 0, gen
    rc, info = rlctl(address, "server-info")
    assert rc == 0, info
    return check["rank_sha256"], gen["final"]["output_ids"], info["weight_version"]


def test_startup_refuses_a_nan_checkpoint(nan_model):
    model, expected = nan_model
    r = subprocess.run([str(BIN / "rl-worker"), "--model", str(model), "--port", "0",
                        "--kv-cache-gb", "0.01"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "listening on" not in r.stdout
    assert expected in r.stderr, r.stderr
    assert "--allow-non-finite-weights" in r.stderr, r.stderr


def test_update_is_refused_and_the_old_weights_keep_serving(start_worker, nan_model):
    model, expected = nan_model
    w = start_worker(model=STORIES_BF16)
    before = served(w.address)
    rc, out = rlctl(w.address, "update-weights", "--from-disk", str(model))
    assert rc == 1, out
    assert expected in out["error"]["message"], out
    assert served(w.address) == before
    # Asleep, the folder is checked when it is staged, not on wake.
    rc, out = rlctl(w.address, "release-memory")
    assert rc == 0, out
    rc, out = rlctl(w.address, "update-weights", "--from-disk", str(model))
    assert rc == 1, out
    assert expected in out["error"]["message"], out
    rc, out = rlctl(w.address, "resume-memory")
    assert rc == 0, out
    assert served(w.address) == before


def test_allow_flag_loads_them(start_worker, nan_model):
    model, _ = nan_model
    w = start_worker("--allow-non-finite-weights", model=model)
    rc, info = rlctl(w.address, "server-info")
    assert rc == 0 and info["weight_version"] == "0", info
    w2 = start_worker("--allow-non-finite-weights", model=STORIES_BF16)
    checksum = served(w2.address)[0]
    rc, out = rlctl(w2.address, "update-weights", "--from-disk", str(model))
    assert rc == 0, out
    rc, check = rlctl(w2.address, "weights-checker", "--action", "checksum")
    assert rc == 0 and check["rank_sha256"] != checksum, check
