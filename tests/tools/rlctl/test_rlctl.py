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


def test_push_a_delta_publication_and_a_checkpoint(tmp_path, start_worker):
    """Issue 30: `rlctl push --from-disk DIR [--stage]` sends a delta publication as a delta
    tensor stream (verified against its manifest; staged, then activated) and a checkpoint
    folder whole; a delta whose parent the worker does not serve is refused (exit 1)."""
    parent, child, delta = tmp_path / "p", tmp_path / "c", tmp_path / "d"
    for out, seed in ((parent, "3"), (child, "4")):
        r = rlctl("make-model", "--arch", "qwen3", "--size", "tiny", "--seed", seed, "--dtype",
                  "float32", "--out", str(out))
        assert r.returncode == 0, r.stderr
    r = rlctl("--json", "publish-delta", "--parent", str(parent), "--from-disk", str(child),
              "--version", "1", "--parent-version", "0", "--out", str(delta))
    assert r.returncode == 0, r.stderr
    manifest = json.loads((delta / "rl-manifest.json").read_text())
    w = start_worker(model=parent)
    r = rlctl("--target", w.address, "--json", "push", "--from-disk", str(delta), "--stage")
    assert r.returncode == 0, r.stdout + r.stderr
    info = json.loads(rlctl("--target", w.address, "--json", "server-info").stdout)
    assert info["has_staged_weights"] and int(info["staged_weight_version"]) == 1
    assert info["staged_weights_sha256"] == manifest["sha256"]
    assert int(info["staged_parent_version"]) == 0
    r = rlctl("--target", w.address, "--json", "activate-weights", "--version", "1")
    assert r.returncode == 0, r.stdout
    r = rlctl("--target", w.address, "--json", "weights-checker", "--action", "checksum")
    assert json.loads(r.stdout)["rank_sha256"] == manifest["sha256"]
    # The delta again: the worker serves 1, not its parent 0.
    r = rlctl("--target", w.address, "--json", "push", "--from-disk", str(delta))
    assert r.returncode == 1
    err = json.loads(r.stdout)["error"]
    assert err["code"] == "FAILED_PRECONDITION" and "applies to version 0" in err["message"]
    # A checkpoint folder, whole.
    r = rlctl("--target", w.address, "--json", "push", "--from-disk", str(parent), "--version", "2")
    assert r.returncode == 0, r.stdout
    assert int(json.loads(r.stdout)["weight_version"]) == 2
    assert rlctl("push").returncode == 2
