"""The README's Quickstart block, run as written with the real binaries: once as it stands
(stories260K: the generated text must be English) and once with its commented alternative line
(a model made by `rlctl make-model`: the text must be non-empty).

How "as written" is kept: the block's lines run in one bash (`-e`), from a temporary folder that
looks like a checkout after the build (`build/bin` and `.venv` are links to the build under test
and the venv), so everything the lines create lands there. Two things differ, and only these:
the README's ports (50051, 50061, 50062, 9100) become free ports, since other suites run at the
same time; and the first line (setup, venv, configure, build) is checked, not run, because this
test runs on the build it would rebuild. The alternative model line is run with its leading `# `
removed. The lines' background servers are killed with their process group at the end."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rltest import BUILD, DATA, ROOT, STORIES, free_port

README_PORTS = ("50051", "50061", "50062", "9100")
BUILD_LINE = "scripts/setup && scripts/venv && cmake -S . -B build -G Ninja && cmake --build build"
MADE_MODEL_PREFIX = "# rlctl make-model "
COMMON_WORDS = {"the", "a", "was", "she", "he", "and", "to", "little", "girl", "named", "there",
                "her", "they", "day", "big", "play", "loved"}


def quickstart_lines():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quickstart\n"):]
    block = section[section.index("```sh\n") + len("```sh\n"):]
    block = block[:block.index("```")]
    lines = [line for line in block.splitlines() if line.strip()]
    assert lines[0] == BUILD_LINE, "the Quickstart must build with scripts/venv before cmake"
    assert any(line.startswith(MADE_MODEL_PREFIX) for line in lines), lines
    return lines


def run_quickstart(tmp_path, made_model):
    """Runs the block (see the module comment); returns (rc, stdout, stderr)."""
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "bin").symlink_to(BUILD / "bin")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the venv running this test
    ports = {p: str(free_port()) for p in README_PORTS}
    script = []
    for line in quickstart_lines()[1:]:
        if line.startswith(MADE_MODEL_PREFIX):
            if not made_model:
                continue
            line = line[2:]
        elif line.lstrip().startswith("#"):
            continue
        for old, new in ports.items():
            line = re.sub(rf"\b{old}\b", new, line)
        script.append(line)
    # After the README's lines: what the PATH line promises resolves inside the venv.
    script += ["command -v grpcurl >&2", "rlfleet --help >/dev/null"]
    env = {**os.environ, "RL_TEST_DATA": str(DATA)}
    env.pop("RL_BUILD_DIR", None)
    # Files, not pipes: the servers the lines leave in the background keep their output open.
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        proc = subprocess.Popen(["bash", "-e", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                                stdout=out_file, stderr=err_file, start_new_session=True)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the quickstart did not finish in 90 s\n{out_path.read_text()}\n"
                    f"{err_path.read_text()}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the rl-worker and rl-router it left running
        except ProcessLookupError:
            pass
    out, err = out_path.read_text(), err_path.read_text()
    assert str(tmp_path / ".venv" / "bin" / "grpcurl") in err, err
    return proc.returncode, out, err


def generated_text(out):
    """The text `rlctl generate` printed before its summary line."""
    assert "[FINISH_REASON_LENGTH]" in out and "completion 32 tokens" in out, out
    return out[:out.index("[FINISH_REASON_LENGTH]")]


def test_quickstart_serves_english_with_stories260k(tmp_path):
    if not STORIES.is_dir():
        pytest.fail(f"test data missing: {STORIES} (set RL_TEST_DATA)")
    rc, out, err = run_quickstart(tmp_path, made_model=False)
    assert rc == 0, out + err
    text = generated_text(out)
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 15, text
    assert all(c.isascii() and (c.isprintable() or c == "\n") for c in text), text
    assert len({w.lower() for w in words} & COMMON_WORDS) >= 4, text
    assert (tmp_path / "build" / "step-100" / "model.safetensors").exists()


def test_quickstart_serves_text_with_a_made_qwen3_model(tmp_path):
    rc, out, err = run_quickstart(tmp_path, made_model=True)
    assert rc == 0, out + err
    assert generated_text(out).strip(), out
    assert (tmp_path / "build" / "qwen3-tiny" / "tokenizer_config.json").exists()
