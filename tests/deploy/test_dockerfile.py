"""deploy/Dockerfile without a container engine (this machine has none): its structure (two
stages, scripts/setup in the build stage, a non-root user equal to the chart's runAsUser, every
binary the chart runs copied), the build context it relies on, and, on this build's binaries,
the step that derives the runtime stage's Debian packages (every shared library the binaries
load is owned by an installable package, and no -dev package or compiler is among them)."""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from rltest import BIN, ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"
BINARIES = ["rl-worker", "rl-router", "rlctl", "rl-collect", "rl-weight-sender"]


def instructions():
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_two_stages_non_root_and_the_chart_user():
    lines = instructions()
    stages = [l for l in lines if l.startswith("FROM ")]
    assert [s.split()[-1] for s in stages] == ["build", "runtime"], stages
    runtime = lines[lines.index(stages[1]):]
    users = [l for l in runtime if l.startswith("USER ")]
    values = yaml.safe_load((ROOT / "helm" / "rlfleet" / "values.yaml").read_text())
    assert users == [f"USER {values['runAsUser']}:{values['runAsUser']}"], users
    # The runtime stage installs no compiler and copies no source.
    assert not any(l.startswith("COPY . ") for l in runtime)
    assert not any("build-essential" in l or "scripts/setup" in l for l in runtime)
    build = lines[:lines.index(stages[1])]
    assert any("scripts/setup" in l and l.startswith("RUN ") for l in build)
    assert any("scripts/venv" in l for l in build)
    for b in BINARIES:
        assert any(f"build/bin/{b}" in l for l in build), b


def test_every_binary_the_chart_runs_is_in_the_image():
    chart = (ROOT / "helm" / "rlfleet" / "templates")
    run = set(re.findall(r"^\s*- (rl-[a-z-]+)\s*$", (chart / "worker.yaml").read_text() +
                         (chart / "router.yaml").read_text(), re.M))
    assert run == {"rl-worker", "rl-router"}
    assert run <= set(BINARIES)


def test_build_context_leaves_out_build_outputs_and_the_venv():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for p in ("build*/", ".venv/", ".git/"):
        assert p in ignored, p


def test_runtime_packages_derive_from_the_binaries():
    if not (BIN / "rl-worker").exists():
        pytest.skip("rl-worker is not built")
    assert any("deploy/runtime-packages /out/bin/*" in l for l in instructions())
    bins = [str(BIN / b) for b in BINARIES if (BIN / b).exists()]
    out = subprocess.run([str(ROOT / "deploy" / "runtime-packages"), *bins], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    packages = out.stdout.split()
    for want in ("libgrpc++1.51", "libprotobuf32", "libc-ares2", "libssl3", "libc6"):
        assert want in packages, packages
    assert not any(p.endswith("-dev") or p in ("gcc", "g++", "cmake") for p in packages), packages
    # Only the CUDA toolkit's libraries (from a CUDA base image) are left unowned.
    for line in out.stderr.splitlines():
        assert "/usr/local/cuda" in line, line
    # Each one is a package apt knows (installable in the runtime stage).
    known = subprocess.run(["apt-cache", "policy", *packages], capture_output=True, text=True,
                           timeout=300).stdout
    for p in packages:
        assert re.search(rf"^{re.escape(p)}:", known, re.M), p
