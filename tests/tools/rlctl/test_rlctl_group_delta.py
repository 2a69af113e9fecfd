"""rlctl's group receives in the delta form (issue 30), against two rl-workers behind an rl-router:
a delta publication (rlctl publish-delta) sent by `rl-weight-sender --delta`, whose bucket lines
(`--plan-only`) name the encodings and the parent version, received with `rlctl receive-weights
--stage --manifest` (staged everywhere, verified, then activated: the fleet's checksum is the
child's manifest digest) and with `prepare-weights` / `complete-weights`; a delta of a version the
fleet does not serve is refused (exit 1, both versions named) and changes nothing; a
`--parent-version` that contradicts the lines, or `--manifest` without a parent, is refused by
rlctl itself."""

import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

import rltest
from rltest import BUILD, STORIES

RLCTL = str(BUILD / "bin" / "rlctl")
SENDER = str(BUILD / "bin" / "rl-weight-sender")


def rlctl(*args, stdin=None):
    return subprocess.run([RLCTL, *args], input=stdin, capture_output=True, text=True, timeout=120)


def perturbed_copy(src, dst, seed, names=3, density=0.02):
    """A copy of checkpoint folder `src` with about `density` of the words of a few F32 tensors
    changed in their mantissa."""
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    blob = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    rng = np.random.default_rng(seed)
    f32 = sorted(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    for name in rng.choice(f32, names, replace=False):
        begin, end = header[name]["data_offsets"]
        words = np.frombuffer(blob, dtype="<u4", count=(end - begin) // 4, offset=8 + n + begin)
        words = words.copy()
        idx = rng.choice(words.size, max(1, int(words.size * density)), replace=False)
        words[idx] ^= rng.integers(1, 0x7FFFFF, idx.size).astype(np.uint32)
        blob[8 + n + begin:8 + n + end] = words.tobytes()
    path.write_bytes(bytes(blob))


def publish(tmp_path, parent, parent_version, version, seed):
    child = tmp_path / f"child-{version}"
    perturbed_copy(parent, child, seed)
    out = tmp_path / f"pub-{version}"
    r = rlctl("--json", "publish-delta", "--parent", str(parent), "--from-disk", str(child),
              "--version", str(version), "--parent-version", str(parent_version), "--out",
              str(out))
    assert r.returncode == 0, r.stderr
    return child, out


def checksums(router):
    r = rlctl("--target", router, "--json", "weights-checker", "--action", "checksum")
    assert r.returncode == 0, r.stdout + r.stderr
    return {w["worker"]: w["result"]["rank_sha256"] for w in json.loads(r.stdout)["workers"]}


class Sender:
    """rl-weight-sender --delta listening on a free port for a group of `world` ranks."""

    def __init__(self, pub, world, group):
        self.proc = subprocess.Popen(
            [SENDER, "--delta", "--checkpoint", str(pub), "--listen", "127.0.0.1:0",
             "--world-size", str(world), "--group-name", group, "--timeout-s", "60",
             "--log-level", "warn"], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on "), line
        self.port = int(line.rsplit(":", 1)[1])

    def finish(self):
        out, _ = self.proc.communicate(timeout=120)
        return self.proc.returncode, out


@pytest.fixture
def fleet():
    f = rltest.Fleet(num_workers=2)
    yield f
    f.stop()


def test_group_delta_from_the_command_line(fleet, tmp_path):
    router = fleet.router.address
    _, pub1 = publish(tmp_path, STORIES, 0, 1, seed=1)
    manifest1 = json.loads((pub1 / "rl-manifest.json").read_text())
    plan = subprocess.run([SENDER, "--delta", "--checkpoint", str(pub1), "--plan-only",
                           "--bucket-mb", "0.01"], capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    lines = [json.loads(l) for l in plan.stdout.splitlines()]
    assert lines and all(l["parent_version"] == 0 for l in lines)
    assert all(e in ("overwrite", "xor") for l in lines for e in l["encodings"])
    dense = (STORIES / "model.safetensors").stat().st_size
    assert sum(sum(l["payload_bytes"]) for l in lines) < dense // 10  # the changed words only
    before = checksums(router)

    # One call, staged, verified against the manifest; then activated everywhere.
    sender = Sender(pub1, 3, "g1")
    r = rlctl("--target", router, "init-group", "--master-address", "127.0.0.1", "--master-port",
              str(sender.port), "--world-size", "3", "--group-name", "g1")
    assert r.returncode == 0, r.stdout + r.stderr
    r = rlctl("--target", router, "--json", "receive-weights", "--group-name", "g1", "--stage",
              "--version", "1", "--manifest", str(pub1 / "rl-manifest.json"), stdin=plan.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sender.finish()[0] == 0
    assert checksums(router) == before  # staged, not served
    info = json.loads(rlctl("--target", router, "--json", "server-info").stdout)
    for w in info["workers"]:
        assert w["info"]["has_staged_weights"] and int(w["info"]["staged_parent_version"]) == 0
        assert w["info"]["staged_weights_sha256"] == manifest1["sha256"]
    r = rlctl("--target", router, "activate-weights", "--version", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(checksums(router).values()) == {manifest1["sha256"]}
    assert rlctl("--target", router, "destroy-group", "--group-name", "g1").returncode == 0

    # Two-phase: prepare-weights (a delta of 1), the broadcast, complete-weights.
    child1 = tmp_path / "child-1"
    _, pub2 = publish(tmp_path, child1, 1, 2, seed=2)
    manifest2 = json.loads((pub2 / "rl-manifest.json").read_text())
    plan2 = subprocess.run([SENDER, "--delta", "--checkpoint", str(pub2), "--plan-only"],
                           capture_output=True, text=True, timeout=60).stdout
    sender = Sender(pub2, 3, "g2")
    assert rlctl("--target", router, "init-group", "--master-address", "127.0.0.1",
                 "--master-port", str(sender.port), "--world-size", "3",
                 "--group-name", "g2").returncode == 0
    # A flag that contradicts the lines is a usage error; a delta of a version the fleet does
    # not serve any more (pub-1's, of version 0) is refused before anything is posted.
    r = rlctl("--target", router, "--json", "prepare-weights", "--group-name", "g2",
              "--parent-version", "7", stdin=plan2)
    assert r.returncode != 0 and "the bucket lines name 1" in r.stdout, r.stdout
    r = rlctl("--target", router, "--json", "prepare-weights", "--group-name", "g2",
              stdin=plan.stdout)
    assert r.returncode == 1, r.stdout
    assert "applies to version 0" in r.stdout and "serves version 1" in r.stdout, r.stdout
    r = rlctl("--target", router, "--json", "prepare-weights", "--group-name", "g2",
              "--manifest", str(pub2 / "rl-manifest.json"), stdin=plan2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ready"] is True
    assert sender.finish()[0] == 0
    r = rlctl("--target", router, "complete-weights", "--group-name", "g2", "--version", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(checksums(router).values()) == {manifest2["sha256"]}
    assert rlctl("--target", router, "destroy-group", "--group-name", "g2").returncode == 0


def test_manifest_without_a_parent_is_a_usage_error(tmp_path):
    line = json.dumps({"names": ["a"], "dtypes": ["F32"], "shapes": [[2]]})
    m = tmp_path / "m.json"
    m.write_text("{}")
    r = rlctl("--target", "127.0.0.1:1", "--json", "receive-weights", "--group-name", "g",
              "--manifest", str(m), stdin=line + "\n")
    assert r.returncode != 0
    assert "--manifest verifies a delta" in r.stdout
    bad = json.dumps({"names": ["a"], "dtypes": ["F32"], "shapes": [[2]],
                      "encodings": ["xor", "dense"], "delta_counts": [1], "payload_bytes": [3]})
    r = rlctl("--target", "127.0.0.1:1", "--json", "prepare-weights", "--group-name", "g",
              stdin=bad + "\n")
    assert r.returncode != 0 and "one entry per name" in r.stdout, r.stdout
