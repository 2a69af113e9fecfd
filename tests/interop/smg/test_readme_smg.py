"""The README's SMG block, run as written (ports swapped for free ones, the model folder for
RL_TEST_DATA's): rl-worker with --model-alias, the real smg in front of it, then every curl line,
each answer checked; the seeded completion is run twice and must repeat."""

import json
import shlex
import subprocess
import time

from conftest import MODEL, SMG
from rltest import BUILD, ROOT, free_port, stop_process

README_WORKER_PORT = "50061"
README_PORTS = ("30000", "29000")
README_MODEL = "../shared/models/stories260K"


def readme_smg_commands():
    """The commands of the README's SMG shell block, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## OpenAI-compatible API through SMG"):]
    block = section[section.index("```sh\n") + 6:]
    block = block[:block.index("```")]
    commands, pending = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            commands.append(words)
    return commands


def test_readme_smg_block_runs_as_written(tmp_path):
    commands = readme_smg_commands()
    ports = {README_WORKER_PORT: str(free_port())}
    ports.update({p: str(free_port()) for p in README_PORTS})

    def swap(word):
        for old, new in ports.items():
            word = word.replace(old, new)
        return word.replace(README_MODEL, str(MODEL))

    procs, curls = [], []
    try:
        for words in commands:
            words = [swap(w) for w in words if w != "&"]
            if words[0] in ("scripts/venv", "sleep"):
                continue  # the venv exists; readiness is waited for below
            if words[0] == "build/bin/rl-worker":
                worker = subprocess.Popen([str(BUILD / "bin" / "rl-worker"), *words[1:]],
                                          stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                          stderr=open(tmp_path / "worker.log", "w"))
                procs.append(worker)
                assert worker.stdout.readline().startswith("listening on ")
            elif words[0] == ".venv/bin/smg":
                procs.append(subprocess.Popen([str(SMG), *words[1:]], cwd=ROOT,
                                              stdout=open(tmp_path / "smg.log", "w"),
                                              stderr=subprocess.STDOUT))
            else:
                assert words[0] == "curl", words
                curls.append(words)
        assert len(procs) == 2 and len(curls) >= 5, commands

        def run(words, ready=True):
            r = subprocess.run(words, capture_output=True, text=True, timeout=60, cwd=ROOT)
            if not ready and r.returncode != 0:
                return None  # the gateway is not listening yet
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        # The first line, once the gateway listens and has registered the worker.
        deadline = time.monotonic() + 90
        while True:
            first = run(curls[0], ready=False)
            if first is not None and "choices" in first:
                break
            assert procs[1].poll() is None, (tmp_path / "smg.log").read_text()
            assert time.monotonic() < deadline, (first, (tmp_path / "smg.log").read_text())
            time.sleep(0.25)
        assert first["model"] == "stories" and first["choices"][0]["text"].strip(), first
        seeded = [c for c in curls if any("seed=" in w for w in c)]
        assert len(seeded) == 1
        texts = [run(seeded[0])["choices"][0]["text"] for _ in range(2)]
        assert texts[0] == texts[1] and texts[0].strip(), texts
        other = [w.replace("seed=42", "seed=43") for w in seeded[0]]
        assert run(other)["choices"][0]["text"] != texts[0]
        for words in curls:
            if words in (curls[0], seeded[0]):
                continue
            body = run(words)
            path = next(w for w in words if w.startswith("127.0.0.1:")).split("/", 1)[1]
            if path == "v1/chat/completions":
                assert body["choices"][0]["message"]["content"] is not None, body
            elif path == "generate":
                out = body[0] if isinstance(body, list) else body
                assert len(out["output_ids"]) == 4, body
                assert len(out["meta_info"]["output_token_logprobs"]) == 4, body
            elif path == "flush_cache":
                assert body.get("workers_flushed") == 1, body
            else:
                raise AssertionError(f"a curl line this test does not check: {words}")
    finally:
        for p in reversed(procs):
            stop_process(p)
