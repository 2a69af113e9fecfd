"""rlctl as a new user meets it: --json gives exactly one JSON object on stdout for every
command (errors too, exit 1; bad usage exit 2), `abort`, `metrics` against a worker,
`tokenize --text ""` and `--file`; every bench/ program parses flags like the binaries."""

import json
import os
import subprocess

import pytest

from rltest import BUILD, DATA, Server

RLCTL = str(BUILD / "bin" / "rlctl")
STORIES = str(DATA / "stories260K")


def rlctl(*args, stdin=None):
    return subprocess.run([RLCTL, *args], input=stdin, capture_output=True, text=True, timeout=120)


def one_json_object(r):
    """stdout is exactly one JSON object (json.loads rejects trailing data)."""
    obj = json.loads(r.stdout)
    assert isinstance(obj, dict), r.stdout
    return obj


@pytest.fixture
def fleet(start_worker):
    w = start_worker("--kv-cache-gb", "0.01", "--threads", "1")
    router = Server([str(BUILD / "bin" / "rl-router"), "--tokenizer", STORIES, "--port", "0",
                     "--worker", w.address, "--health-interval-ms", "200"])
    yield router.address, w.address
    router.stop()


def test_every_command_prints_one_json_object(fleet, tmp_path):
    router, worker = fleet
    model = tmp_path / "m"
    ckpt = tmp_path / "m2"
    # (args, expected exit status); run in this order.
    cases = [
        (["make-model", "--arch", "llama", "--size", "tiny", "--seed", "1", "--out", str(model)], 0),
        (["make-model", "--arch", "llama", "--size", "tiny", "--seed", "2", "--out", str(ckpt)], 0),
        (["tokenize", "--tokenizer", STORIES, "--text", "Once upon a time"], 0),
        (["detokenize", "--tokenizer", STORIES, "--ids", "403,407"], 0),
        (["--target", router, "health"], 0),
        (["--target", router, "generate", "--text", "Once upon a time", "--max-new-tokens", "4",
          "--temperature", "0"], 0),
        (["--target", router, "generate", "--ids", "1,403", "--max-new-tokens", "2"], 0),
        (["--target", router, "retrieve", "--text", "Once upon a time"], 0),
        (["--target", router, "workers", "list"], 0),
        (["--target", router, "workers", "disable", worker], 0),
        (["--target", router, "workers", "enable", worker], 0),
        (["--target", router, "workers", "remove", worker], 0),
        (["--target", router, "workers", "add", worker], 0),
        (["--target", router, "model-info"], 0),
        (["--target", worker, "server-info"], 0),
        (["--target", router, "list-weights"], 0),
        (["--target", router, "weights-checker", "--action", "checksum"], 0),
        (["--target", router, "pause", "--mode", "retract"], 0),
        (["--target", router, "update-weights", "--from-disk", STORIES, "--version", "7"], 0),
        (["--target", router, "continue"], 0),
        (["--target", router, "flush"], 0),
        (["--target", router, "metrics"], 0),
        (["--target", router, "abort", "--all"], 0),
        (["--target", worker, "abort", "--all"], 0),
        (["--target", router, "release-memory"], 0),
        (["--target", router, "resume-memory"], 0),
        # Failures: exit 1, still one object, with the error.
        (["--target", router, "abort", "--request-id", "nobody"], 1),
        (["--target", worker, "metrics"], 1),
        (["--target", router, "update-weights", "--from-disk", str(tmp_path / "nope")], 1),
        (["--target", router, "destroy-group", "--group-name", "nope"], 1),
        (["--target", router, "update-weights", "--distributed", "--group-name", "nope",
          "--bucket-json", "not json"], 1),
        (["--target", "127.0.0.1:1", "--timeout", "2", "server-info"], 1),
        (["tokenize", "--tokenizer", str(tmp_path / "none"), "--text", "x"], 1),
        (["--target", router, "init-group", "--master-address", "127.0.0.1", "--master-port",
          "1", "--world-size", "2", "--group-name", "g", "--group-timeout-ms", "500"], 1),
        # Bad usage: exit 2, one object.
        (["--target", router, "pause", "--mode", "sideways"], 2),
        (["--target", router, "abort"], 2),
        (["frobnicate"], 2),
        ([], 2),
        (["--bogus-flag", "health"], 2),
        (["health", "--max-new-tokens", "many"], 2),
    ]
    for args, want in cases:
        r = rlctl("--json", *args)
        assert r.returncode == want, f"rlctl --json {' '.join(args)}: {r.returncode} {r.stdout} {r.stderr}"
        obj = one_json_object(r)
        if want != 0:
            # A call that failed outright: {"error": ...}; a broadcast that some worker
            # refused: the answer itself, with success false.
            if "error" in obj:
                assert set(obj) == {"error"}, obj
                assert obj["error"]["code"] and obj["error"]["message"], obj
            else:
                assert want == 1 and obj["success"] is False, obj
    # A few answers in detail.
    r = rlctl("--json", "--target", worker, "metrics")
    err = one_json_object(r)["error"]
    assert err["code"] == "FAILED_PRECONDITION" and "rl-router" in err["message"], err
    assert "/metrics" in err["message"]
    r = rlctl("--json", "--target", router, "abort", "--request-id", "nobody")
    assert one_json_object(r)["error"]["code"] == "NOT_FOUND"


def test_metrics_against_a_worker_says_what_to_do(start_worker):
    w = start_worker("--kv-cache-gb", "0.01", "--threads", "1")
    r = rlctl("--target", w.address, "metrics")
    assert r.returncode == 1
    assert r.stdout == ""
    assert "metrics is for rl-router targets" in r.stderr and "--metrics-port" in r.stderr, r.stderr


def test_abort_human_output(fleet):
    router, worker = fleet
    r = rlctl("--target", router, "abort", "--all")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "aborted 0 requests\n"
    r = rlctl("--target", router, "abort", "--request-id", "nobody")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr and "nobody" in r.stderr


def test_tokenize_empty_text_and_file(tmp_path):
    r = rlctl("--json", "tokenize", "--tokenizer", STORIES, "--text", "", stdin="should not be read\n")
    assert r.returncode == 0, r.stderr
    assert one_json_object(r) == {"ids": [1]}  # BOS only
    r = rlctl("tokenize", "--tokenizer", STORIES, "--no-special", "--text=")
    assert r.returncode == 0 and json.loads(r.stdout) == []
    text = "Once upon a time\nthere was a cat.\n\nThe end."
    f = tmp_path / "story.txt"
    f.write_text(text)
    whole = json.loads(rlctl("tokenize", "--tokenizer", STORIES, "--text", text).stdout)
    r = rlctl("tokenize", "--tokenizer", STORIES, "--file", str(f))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == whole
    assert len(r.stdout.splitlines()) == 1
    r = rlctl("--json", "tokenize", "--tokenizer", STORIES, "--file", str(f))
    assert one_json_object(r) == {"ids": whole}
    # Decoding gives the file back, newlines included.
    ids = ",".join(str(i) for i in whole)
    r = rlctl("--json", "detokenize", "--tokenizer", STORIES, "--skip-special", "--ids", ids)
    assert one_json_object(r) == {"text": text}
    # Errors: a missing file, both --text and --file; stdin mode with --json is one object.
    r = rlctl("--json", "tokenize", "--tokenizer", STORIES, "--file", str(tmp_path / "none"))
    assert r.returncode == 1 and one_json_object(r)["error"]["code"] == "NOT_FOUND"
    r = rlctl("--json", "tokenize", "--tokenizer", STORIES, "--file", str(f), "--text", "x")
    assert r.returncode == 2 and "error" in one_json_object(r)
    r = rlctl("--json", "tokenize", "--tokenizer", STORIES, stdin="Once\nupon\n")
    assert one_json_object(r) == {"ids": [[1, 403], [1, 407]]} or len(one_json_object(r)["ids"]) == 2
    r = rlctl("--json", "detokenize", "--tokenizer", STORIES, stdin="[403]\n[407]\n")
    assert len(one_json_object(r)["texts"]) == 2
    # --jsonl: one JSON string per stdin line, so a text may hold newlines (batch encoding of
    # rendered conversations); a line that is not a JSON string is an error naming it.
    r = rlctl("--json", "tokenize", "--tokenizer", STORIES, "--jsonl",
              stdin=json.dumps(text) + "\n" + json.dumps("Once") + "\n")
    assert r.returncode == 0, r.stderr
    assert one_json_object(r) == {"ids": [whole, [1, 403]]}
    r = rlctl("tokenize", "--tokenizer", STORIES, "--jsonl", stdin='"Once"\n[1]\n')
    assert r.returncode == 1 and "line 2" in r.stderr and "JSON string" in r.stderr, r.stderr


BENCHES = ["engine_bench", "runner_bench", "tokenizer_bench", "update_bench", "router_bench",
           "inflight_update_bench"]


@pytest.mark.parametrize("bench", BENCHES)
def test_bench_programs_use_the_flag_parser(bench):
    exe = BUILD / "bin" / bench
    assert exe.exists(), f"{exe} is not built"
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: {bench}"), r.stdout
    r = subprocess.run([str(exe), "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown flag --bogus" in r.stderr, r.stderr
    assert r.stdout == ""  # nothing ran
    r = subprocess.run([str(exe), "stray"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unexpected argument 'stray'" in r.stderr, r.stderr


def test_api_key_file(start_worker, tmp_path):
    w = start_worker("--kv-cache-gb", "0.01", "--threads", "1", "--admin-api-key", "s3cret")
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    r = rlctl("--target", w.address, "--json", "--api-key-file", str(key), "flush")
    assert r.returncode == 0, r.stderr
    assert one_json_object(r)["success"]
    r = rlctl("--target", w.address, "--json", "flush")
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stdout, r.stdout
    # A file and the flag together, or a missing file: usage errors naming the flag.
    r = rlctl("--target", w.address, "--json", "--api-key-file", str(key), "--api-key", "x",
              "flush")
    assert r.returncode == 2 and "--api-key and --api-key-file" in one_json_object(r)["error"]["message"]
    r = rlctl("--target", w.address, "--json", "--api-key-file", str(tmp_path / "none"), "flush")
    assert r.returncode == 2 and "--api-key-file" in one_json_object(r)["error"]["message"]
    big = tmp_path / "big"
    big.write_text("k" * 5000)
    r = rlctl("--target", w.address, "--json", "--api-key-file", str(big), "flush")
    assert r.returncode == 2 and "more than the limit of 4096" in r.stdout, r.stdout
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # refused at once, never waited on
    r = rlctl("--target", w.address, "--json", "--api-key-file", str(fifo), "flush")
    assert r.returncode == 2 and "a FIFO" in r.stdout, r.stdout
