"""The rlfleet package builds as an sdist and a wheel from a clean copy of the checkout
(`python -m build`, with the venv's pinned setuptools / grpcio-tools: --no-isolation), the sdist
carries the protos so a wheel builds from it with no repository around, the wheel carries the
generated stubs, the .proto files and py.typed, installs and imports, and the installed package
is clean under `mypy --strict` (and types a user's code: a wrong argument is an error)."""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from rltest import ROOT

PROTOS = ["admin", "generate", "router", "weight_sync", "worker"]


def clean_copy(dest: Path) -> Path:
    """The tracked files of clients/python and protos/ (what a fresh clone has)."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "clients/python", "protos"],
                       capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        for rel in r.stdout.split():
            if not (ROOT / rel).exists():  # deleted in the working tree
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    else:  # not a git checkout (a tarball): the folders without build outputs
        for d in ("clients/python", "protos"):
            shutil.copytree(ROOT / d, dest / d, ignore=shutil.ignore_patterns(
                "build", "dist", "*.egg-info", "__pycache__"))
    return dest / "clients" / "python"


def run(args, env=None, **kw):
    env = {k: v for k, v in (env or os.environ).items() if k != "RLFLEET_PROTO_ROOT"}
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, **kw)
    assert r.returncode == 0, f"{args}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r


def test_sdist_and_wheel_build_install_and_type_check(tmp_path):
    src = clean_copy(tmp_path / "checkout")
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)])
    sdists = list(dist.glob("rlfleet-*.tar.gz"))
    wheels = list(dist.glob("rlfleet-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(dist.iterdir())

    with tarfile.open(sdists[0]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for p in PROTOS:
        assert f"rlfleet/protos/rl/v1/{p}.proto" in names, sorted(names)
    assert "rlfleet/py.typed" in names and "setup.py" in names

    with zipfile.ZipFile(wheels[0]) as whl:
        files = set(whl.namelist())
        meta = next(whl.read(n).decode() for n in files if n.endswith("METADATA"))
    assert "rlfleet/py.typed" in files
    for p in PROTOS:
        assert f"rlfleet/_proto/rl/v1/{p}_pb2.py" in files
        assert f"rlfleet/_proto/rl/v1/{p}_pb2.pyi" in files
        assert f"rlfleet/protos/rl/v1/{p}.proto" in files
    for dep in ("grpcio", "protobuf", "numpy", "crc32c"):
        assert f"Requires-Dist: {dep}" in meta

    # A wheel from the sdist alone, far from any checkout.
    alone = tmp_path / "a" / "b" / "c"
    alone.mkdir(parents=True)
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(alone, filter="data")
    unpacked = next(alone.iterdir())
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "--wheel-dir", str(tmp_path / "wheel2"), str(unpacked)])
    assert list((tmp_path / "wheel2").glob("rlfleet-*.whl"))

    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
         str(wheels[0])])
    probe = ("import rlfleet, rlfleet.client, rlfleet.weight_sync; "
             "from rlfleet import Client, AsyncClient, FleetError, TcpWeightSender; "
             "print(rlfleet.__file__)")
    out = run([sys.executable, "-c", probe], cwd=tmp_path,
              env={**os.environ, "PYTHONPATH": str(site)}).stdout
    assert out.strip() == str(site / "rlfleet" / "__init__.py")

    # mypy --strict on the installed package, then on a user's file typed through it.
    config = src / "pyproject.toml"
    mypy = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config),
            "--cache-dir", str(tmp_path / "mypy-cache")]
    run(mypy + ["-p", "rlfleet"], cwd=site)
    user = tmp_path / "user"
    user.mkdir()
    (user / "trainer.py").write_text(
        "import numpy as np\n"
        "from rlfleet import Client, FleetError, Generations\n\n"
        "def step(c: Client, w: np.ndarray) -> int:\n"
        "    g: Generations = c.generate(text='x', max_new_tokens=4)\n"
        "    try:\n"
        "        r = c.update_weights_from_tensor([('w', w)], weight_version=1)\n"
        "    except FleetError as e:\n"
        "        return len(e.failures)\n"
        "    return r.weight_version + len(g.one().output_ids)\n")
    env = {**os.environ, "MYPYPATH": str(site)}
    run(mypy + ["trainer.py"], cwd=user, env=env)
    (user / "wrong.py").write_text(
        "from rlfleet import Client\n\n"
        "def step(c: Client) -> None:\n"
        "    c.update_weights_from_tensor([], weight_version='one')\n")
    r = subprocess.run(mypy + ["wrong.py"], cwd=user, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and 'incompatible type "str"' in r.stdout, r.stdout + r.stderr
