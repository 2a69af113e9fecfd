"""scripts/venv installs the rlfleet package into the venv (so `.venv/bin/python -m rlfleet`
works), quietly, again only when clients/python or protos/ changed, and writes nothing into the
checkout. Run on a copy of the files it reads, with a throw-away venv that borrows the project
venv's packages (a .pth file) so no network and no pinned install is needed: the requirements
stamp is written beforehand, as a finished first step would have."""

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from rltest import ROOT


def make_root(tmp):
    root = tmp / "root"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "venv", root / "scripts" / "venv")
    shutil.copy2(ROOT / "requirements.txt", root / "requirements.txt")
    shutil.copytree(ROOT / "clients" / "python", root / "clients" / "python",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    shutil.copytree(ROOT / "protos", root / "protos")
    return root


def make_venv(tmp, root):
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = venv / "bin" / "pip"
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    digest = hashlib.sha256((root / "requirements.txt").read_bytes()).hexdigest()
    (venv / ".requirements.sha256").write_text(digest + "\n")
    return venv, site


def run_venv(root, venv):
    r = subprocess.run([str(root / "scripts" / "venv")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "RL_VENV": str(venv)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{venv}/bin/python\n" and r.stderr == "", (r.stdout, r.stderr)


def installed(venv, tmp):
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import rlfleet, rlfleet._stubs; print(rlfleet.__file__)"],
                       capture_output=True, text=True, cwd=tmp, check=True)
    return Path(r.stdout.strip())


def test_venv_installs_rlfleet_and_reinstalls_on_change(tmp_path):
    root = make_root(tmp_path)
    venv, site = make_venv(tmp_path, root)
    run_venv(root, venv)
    init = installed(venv, tmp_path)
    assert init == site / "rlfleet" / "__init__.py", init
    r = subprocess.run([str(venv / "bin" / "python"), "-m", "rlfleet", "--help"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and "prepare-prompts" in r.stdout, r.stderr
    first = init.stat().st_mtime_ns

    run_venv(root, venv)  # nothing changed: not reinstalled
    assert init.stat().st_mtime_ns == first

    with open(root / "clients" / "python" / "rlfleet" / "__init__.py", "a") as f:
        f.write("\nVENV_TEST_MARKER = 1\n")
    run_venv(root, venv)
    assert "VENV_TEST_MARKER" in installed(venv, tmp_path).read_text()
    second = init.stat().st_mtime_ns

    with open(root / "protos" / "rl" / "v1" / "generate.proto", "a") as f:
        f.write("\n// changed\n")
    run_venv(root, venv)
    assert init.stat().st_mtime_ns != second

    # Built from a copy: nothing was written into the (copied) checkout.
    assert not (root / "clients" / "python" / "build").exists()
    assert not list((root / "clients" / "python").glob("*.egg-info"))
