"""Retokenization drift, counted over 200 random agent episodes on each of two models: stories260K
(with episode_template.jinja) and a made Qwen3 model with Qwen2's real tokenizer and a ChatML
template (made_qwen.py). The agent is the pinned `openai` client talking to the real SMG gateway
in front of rl-router (sampled, 2 or 3 turns, streaming or not, a few tokens per turn).

For every sample Router.GetEpisode exports:
- it is, byte for byte, what the worker received and generated (worker_proxy.py records the
  worker's side of every call), and the loss mask covers exactly the generated tokens;
- it is compared with the sample's final conversation re-rendered with the chat template
  (rlfleet.ChatTemplate, as Hugging Face's apply_chat_template renders it) and encoded from
  scratch, the way a trainer that re-tokenizes builds its sample. The samples that differ are
  counted and the first shown, split in two kinds: the same text tokenized differently (the model
  generated a non-canonical tokenization: a re-tokenizing trainer trains on tokens the model never
  produced) and a different text (what the agent got back is not what the model generated: bytes
  of a partial UTF-8 character come back as U+FFFD).

The counts are printed (ctest -V, or the log of a failure) and docs/episodes.md quotes them."""

import json
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_fleet import AgentFleet, check_sample_against_worker, episode_header, index_calls
from conftest import SMG
from made_qwen import QWEN_TEMPLATE, make_qwen3_model
from rlfleet.prompts import ChatTemplate, load_chat_template
from rltest import BIN, STORIES

EPISODES = 200
CONCURRENCY = 4
STORIES_TEMPLATE = Path(__file__).resolve().parent / "episode_template.jinja"
WORDS = ("cat dog sun tree boat rain king frog cake moon fish bird star road ship hill lamp "
         "door").split()


def rlctl_json(*args, stdin):
    r = subprocess.run([str(BIN / "rlctl"), "--json", *args], input=stdin, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def encode_all(model, texts):
    """Each text encoded from scratch by the model's tokenizer (one rlctl call)."""
    return rlctl_json("tokenize", "--tokenizer", str(model), "--jsonl",
                      stdin="".join(json.dumps(t) + "\n" for t in texts))["ids"]


def decode_all(model, id_lists):
    return rlctl_json("detokenize", "--tokenizer", str(model),
                      stdin="".join(json.dumps(ids) + "\n" for ids in id_lists))["texts"]


def run_agent(fleet, episode_id, rng):
    """One random episode; returns the conversation after each turn (messages + the answer)."""
    messages = [{"role": "user", "content": f"Tell me about the {rng.choice(WORDS)} and the "
                                            f"{rng.choice(WORDS)}."}]
    after = []
    for t in range(rng.randint(2, 3)):
        args = dict(model=fleet.model, messages=messages, max_tokens=rng.randint(4, 12),
                    temperature=1.0,
                    extra_headers=episode_header(episode_id, seed=rng.randrange(1 << 30)))
        if rng.random() < 0.5:
            content = fleet.openai.chat.completions.create(**args).choices[0].message.content
        else:
            parts = []
            for event in fleet.openai.chat.completions.create(stream=True, **args):
                if event.choices and event.choices[0].delta.content:
                    parts.append(event.choices[0].delta.content)
            content = "".join(parts)
        messages = messages + [{"role": "assistant", "content": content or ""}]
        after.append(messages)
        messages = messages + [{"role": "user", "content": f"And the {rng.choice(WORDS)}?"}]
    return after


def token_strings(model):
    """id -> the token's string in tokenizer.json (byte-level tokens in GPT-2's byte alphabet,
    SentencePiece ones with their U+2581 space)."""
    tok = json.loads((Path(model) / "tokenizer.json").read_text(encoding="utf-8"))
    strings = {i: t for t, i in tok["model"]["vocab"].items()}
    strings.update({t["id"]: t["content"] for t in tok.get("added_tokens", [])})
    return strings


def stop_ids(model):
    config = json.loads((Path(model) / "config.json").read_text())
    eos = config.get("eos_token_id", [])
    return set(eos if isinstance(eos, list) else [eos])


@pytest.fixture(scope="module", params=["stories260K", "qwen3"])
def drift_fleet(request, tmp_path_factory):
    assert SMG.exists(), f"{SMG} missing: run scripts/venv (smg is pinned in requirements.txt)"
    logs = tmp_path_factory.mktemp(f"drift-{request.param}")
    if request.param == "qwen3":
        model, template = make_qwen3_model(logs / "qwen3"), QWEN_TEMPLATE
    else:
        model, template = STORIES, STORIES_TEMPLATE
    f = AgentFleet(logs, model, template, worker_args=["--kv-cache-gb", "0.2"])
    f.template_file = template
    f.name = request.param
    try:
        yield f
    finally:
        f.stop()


def test_drift_count_over_200_random_episodes(drift_fleet):
    fleet = drift_fleet
    prefix = f"drift_{fleet.name}_"
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        convs = list(pool.map(lambda i: run_agent(fleet, f"{prefix}{i}", random.Random(i)),
                              range(EPISODES)))
    calls = fleet.proxy.calls()
    by_prompt = index_calls(calls)
    stops = stop_ids(fleet.model)
    template = ChatTemplate(*load_chat_template(fleet.model, None, fleet.template_file))

    exported, rendered = [], []
    turns = forked = 0
    for i, after in enumerate(convs):
        e = fleet.episode(f"{prefix}{i}")
        # Every turn recorded, in the agent's order (one completion per turn, no retries).
        assert len(e.turns) == len(after)
        turns += len(e.turns)
        forked += len(e.samples) > 1
        for s in e.samples:
            check_sample_against_worker(e, s, calls, by_prompt, stops)
            tokens = list(s.trajectory.tokens)
            if tokens and tokens[-1] in stops:
                tokens = tokens[:-1]  # the template renders the turn's end its own way
            exported.append((i, tokens))
            rendered.append(template.render(after[s.turns[-1]], add_generation_prompt=False))
    fresh = encode_all(fleet.model, rendered)
    drifted = [k for k, ((_, tokens), ids) in enumerate(zip(exported, fresh))
               if ids[:len(tokens)] != tokens]
    texts = decode_all(fleet.model, [exported[k][1] for k in drifted])
    fresh_texts = decode_all(fleet.model, [fresh[k] for k in drifted])
    retokenized = [k for k, t, f in zip(drifted, texts, fresh_texts)
                   if "\ufffd" not in t and f.startswith(t)]
    print(f"\n{fleet.name}: {EPISODES} episodes, {turns} turns, {len(exported)} samples "
          f"({forked} episodes forked); {len(drifted)} samples differ from their final "
          f"conversation re-rendered and encoded from scratch: {len(retokenized)} the same text "
          f"tokenized differently, {len(drifted) - len(retokenized)} a different text")
    if retokenized:
        k = retokenized[0]
        i, tokens = exported[k]
        ids = fresh[k]
        at = next(j for j, (a, b) in enumerate(zip(tokens, ids)) if a != b)
        vocab = token_strings(fleet.model)
        print(f"first case: episode {prefix}{i} at token {at}: the model generated "
              f"{[(t, vocab.get(t)) for t in tokens[at:at + 3]]}, the text encoded from scratch "
              f"is {[(t, vocab.get(t)) for t in ids[at:at + 3]]}")
    if fleet.name == "qwen3":
        # Random weights over Qwen's 151646 tokens generate non-canonical sequences all the
        # time: the count must find them, and a sample is never the re-encoded text's tokens
        # while its text is the same (the router kept the generated tokens).
        assert retokenized, "no non-canonical tokenization found on the made qwen3 model"
