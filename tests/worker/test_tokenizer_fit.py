"""rl-worker checks at start-up that the model folder's tokenizer fits its embedding: a tokenizer
with more ids than config.json's vocab_size is refused (the two cannot both be right); one that
stops short (a padded embedding, normal for real models) starts with one warning line naming the
ids that decode to nothing."""

import json
import shutil
import subprocess

import pytest

from rltest import BIN, DATA, STORIES, Server


@pytest.fixture
def stories_copy(tmp_path):
    if not STORIES.is_dir():
        pytest.fail(f"test data missing: {STORIES} (set RL_TEST_DATA)")
    dst = tmp_path / "model"
    shutil.copytree(STORIES, dst)
    return dst


def test_a_larger_tokenizer_is_refused(stories_copy):
    shutil.copy(DATA / "tokenizers" / "qwen2" / "tokenizer.json", stories_copy / "tokenizer.json")
    (stories_copy / "tokenizer_config.json").unlink()
    r = subprocess.run([str(BIN / "rl-worker"), "--model", str(stories_copy), "--port", "0",
                        "--kv-cache-gb", "0.01"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "listening on" not in r.stdout
    assert "the tokenizer has ids up to 151645 but config.json vocab_size is 512" in r.stderr, \
        r.stderr


def test_a_padded_embedding_starts_with_one_warning(stories_copy, tmp_path):
    # Drop the tokenizer's ids 500..511 (and the merges that make or use them).
    path = stories_copy / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < 500}
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if all(p in vocab for p in m.split(" ")) and
                              m.replace(" ", "") in vocab]
    path.write_text(json.dumps(tok))
    log = tmp_path / "worker.log"
    w = Server([BIN / "rl-worker", "--model", stories_copy, "--port", "0", "--kv-cache-gb", "0.01"],
               log)
    try:
        lines = [x for x in log.read_text().splitlines() if "decode to nothing" in x]
        assert len(lines) == 1, log.read_text()
        assert "ids 500..511 (12 of the model's 512)" in lines[0], lines[0]
    finally:
        w.stop()
