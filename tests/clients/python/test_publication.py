"""rlfleet.publication: the trainer-side writers of manifests and delta publications against the
C++ side. The Python manifest of a checkpoint equals `rlctl publish`'s; a delta written in
Python has the same per-tensor payloads as `rlctl publish-delta`'s; a real rl-worker applies the
Python delta (one-call disk update) and then reports the child's manifest digest as its checksum;
a manifest whose digest was edited is refused on both sides."""

import json
import shutil
import subprocess

import numpy as np
import pytest

import rltest


def _step(src, dst, fraction, seed):
    """A copy of the stories260K checkpoint with `fraction` of every tensor's elements moved."""
    from rlfleet.tensors import read_safetensors
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    ckpt = read_safetensors(src)
    rng = np.random.default_rng(seed)
    header, blobs, offset = {}, [], 0
    for name in ckpt:
        v = np.array(ckpt[name], dtype=np.float32)
        mask = rng.random(v.shape) < fraction
        v[mask] += np.float32(0.01)
        b = v.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(v.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    (dst / "model.safetensors").write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def _rlctl(*args):
    out = subprocess.run([str(rltest.BIN / "rlctl"), "--json", *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def _delta_payloads(path):
    blob = path.read_bytes()
    assert blob[:8] == b"RLDELTA1"
    n = int.from_bytes(blob[8:16], "little")
    header = json.loads(blob[16:16 + n])
    data = blob[16 + n:]
    return header["manifest"]["sha256"], {
        t["name"]: (t["encoding"], t["count"], data[t["data_offsets"][0]:t["data_offsets"][1]])
        for t in header["tensors"]}


def test_manifest_matches_rlctl_publish(tmp_path):
    from rlfleet.publication import read_manifest, write_manifest
    a, b = tmp_path / "py", tmp_path / "cc"
    _step(rltest.STORIES, a, 0.02, 1)
    shutil.copytree(a, b)
    m = write_manifest(a, version=3, parent_version=2)
    out = _rlctl("publish", "--from-disk", str(b), "--version", "3", "--parent-version", "2")
    assert out["sha256"] == m["sha256"]
    assert read_manifest(b)["sha256"] == m["sha256"]
    assert read_manifest(a)["tensors"] == json.loads((b / "rl-manifest.json").read_text())["tensors"]
    # An edited digest is refused.
    edited = dict(m, sha256="0" * 64)
    (a / "rl-manifest.json").write_text(json.dumps(edited))
    with pytest.raises(ValueError, match="digest"):
        read_manifest(a)


def test_delta_matches_rlctl_and_a_worker_applies_it(tmp_path, start_worker):
    from rlfleet import Client
    from rlfleet.publication import write_delta
    child = tmp_path / "child"
    _step(rltest.STORIES, child, 0.02, 2)
    stats = write_delta(rltest.STORIES, child, tmp_path / "py", version=1, parent_version=0)
    assert 0 < stats["delta_bytes"] < stats["dense_bytes"] / 10
    out = _rlctl("publish-delta", "--parent", str(rltest.STORIES), "--from-disk", str(child),
                 "--version", "1", "--parent-version", "0", "--out", str(tmp_path / "cc"))
    assert out["delta_bytes"] > 0
    py_sha, py = _delta_payloads(tmp_path / "py" / "weights.rldelta")
    cc_sha, cc = _delta_payloads(tmp_path / "cc" / "weights.rldelta")
    assert py_sha == cc_sha
    assert py == cc
    assert {e for e, _, _ in py.values()} <= {"overwrite", "xor"}

    w = start_worker("--threads", "1")
    with Client(w.address, via="worker") as c:
        before = c.weights_checker("checksum").rank_sha256
        c.update_weights_from_disk(str(tmp_path / "py"))
        assert c.get_server_info().weight_version == 1
        assert c.weights_checker("checksum").rank_sha256 == py_sha
        assert py_sha != before
