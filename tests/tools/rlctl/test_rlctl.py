"""rlctl's command-line contracts: exit codes, --json objects, offline commands."""

import json
import subprocess

from rltest import BUILD, DATA

RLCTL = str(BUILD / "bin" / "rlctl")


def rlctl(*args, stdin=None):
    return subprocess.run([RLCTL, *args], input=stdin, capture_output=True, text=True, timeout=120)


def test_tokenize_and_detokenize_stories260k():
    tok = str(DATA / "stories260K")
    r = rlctl("tokenize", "--tokenizer", tok, "--text", "Once upon a time")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [1, 403, 407, 261, 378]
    r = rlctl("--json", "tokenize", "--tokenizer", tok, "--no-special", "--text", "Once upon a time")
    assert json.loads(r.stdout) == {"ids": [403, 407, 261, 378]}
    r = rlctl("tokenize", "--tokenizer", tok, stdin="Once upon a time\nOnce\n")
    assert [json.loads(l) for l in r.stdout.splitlines()] == [[1, 403, 407, 261, 378], [1, 403]]
    r = rlctl("detokenize", "--tokenizer", tok, "--skip-special", stdin="[1, 403, 407, 261, 378]\n")
    assert r.stdout == "Once upon a time\n"


def test_make_model_then_serve(tmp_path, start_worker):
    out = tmp_path / "m"
    r = rlctl("--json", "make-model", "--arch", "qwen3", "--size", "tiny", "--seed", "3",
              "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["arch"] == "qwen3"
    w = start_worker(model=out)
    r = rlctl("--target", w.address, "--json", "model-info")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["model_type"] == "qwen3"
    assert int(info["weight_version"]) == 0


def test_errors_are_json_and_exit_codes():
    r = rlctl("--json", "--target", "127.0.0.1:1", "--timeout", "2", "model-info")
    assert r.returncode == 1
    assert json.loads(r.stdout)["error"]["code"] == "UNAVAILABLE"
    assert rlctl("pause", "--mode", "sideways").returncode == 2
    assert rlctl("frobnicate").returncode == 2
    assert rlctl("--bogus-flag").returncode == 2
    r = rlctl("--json", "tokenize", "--tokenizer", "/nonexistent")
    assert r.returncode == 1 and "error" in json.loads(r.stdout)


def test_async_rl_flags(start_worker):
    """Issue 34: pause --mode drain [--drain-timeout-ms], generate --max-version-lag, and
    update-weights --keep-kv reach the worker."""
    w = start_worker()
    r = rlctl("--target", w.address, "--json", "pause", "--mode", "drain",
              "--drain-timeout-ms", "5000")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout).get("drained") is True
    r = rlctl("--target", w.address, "--json", "server-info")
    assert json.loads(r.stdout)["pause_mode"] == "PAUSE_MODE_DRAIN"
    r = rlctl("--target", w.address, "--json", "pause", "--mode", "drain",
              "--drain-timeout-ms", "700000")
    assert r.returncode == 1 and "drain_timeout_ms" in r.stdout
    r = rlctl("--target", w.address, "--json", "update-weights", "--from-disk",
              str(DATA / "stories260K"), "--keep-kv", "--keep-pause")
    assert r.returncode == 0, r.stderr
    assert "kept their KV" in json.loads(r.stdout)["message"]
    assert rlctl("--target", w.address, "continue").returncode == 0
    r = rlctl("--target", w.address, "--json", "generate", "--ids", "1,403,407",
              "--max-new-tokens", "3", "--max-version-lag", "-1")
    assert r.returncode == 0, r.stderr
    r = rlctl("--target", w.address, "--json", "generate", "--ids", "1,403,407",
              "--max-new-tokens", "3", "--max-version-lag", "-5")
    assert r.returncode == 1 and "max_version_lag" in r.stdout


def test_generate_resume_id(start_worker):
    """Issue 34: generate --resume-id goes to the router (a worker refuses it, naming why);
    --resume-id with a prompt is a usage error; an id the router does not keep is NOT_FOUND."""
    import rltest
    w = start_worker()
    r = rlctl("--target", w.address, "--json", "generate", "--resume-id", "x", "--text", "Hi")
    assert r.returncode == 2, r.stdout + r.stderr
    r = rlctl("--target", w.address, "--json", "generate", "--resume-id", "x")
    assert r.returncode == 1 and "needs an rl-router" in r.stdout, r.stdout
    router = rltest.start_router([w])
    try:
        r = rlctl("--target", router.address, "--json", "generate", "--resume-id", "never-ran")
        assert r.returncode == 1, r.stdout
        assert json.loads(r.stdout)["error"]["code"] == "NOT_FOUND"
        r = rlctl("--target", router.address, "--json", "generate", "--ids", "1,403,407",
                  "--max-new-tokens", "3", "--request-id", "named-1")
        assert r.returncode == 0, r.stderr
    finally:
        router.stop()
