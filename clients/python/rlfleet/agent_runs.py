"""Runs a prompt set as multi-turn agent episodes through rl-router and saves them the way
rl-collect saves single-turn samples: every (prompt, sample) pair is one episode driven by a
user-supplied Python function `agent(session, row)`, which talks to the model through
`session.chat(messages)` (the conversation rendered with the model's chat template, as Hugging
Face renders it, and generated under the episode's id: Router.Generate with `episode_id`, so the
router's text cache reuses every earlier turn's tokens exactly) and may call tools, edit its
history or run sub-agents in between. When the function returns, Router.GetEpisode (remove) gives
one sample per branch with the exact tokens, loss mask (1 on every generated token), logprobs
and per-token versions (docs/episodes.md).

Output folder (as rl-collect's, `rlfleet.trajectories.v1`): `shard_NNNNN.safetensors` every
`save_batch_size` episodes, `checkpoint.json` (completed and failed episodes, shards; rewritten
tmp -> fsync -> rename after each shard, so a crash loses at most the episodes not yet in a
shard, and a rerun resumes with the rest), and on merge `trajectories.safetensors` (every branch
sample, sorted by index, sample, branch) and `trajectories.zip` (that file and checkpoint.json:
the seed's artifact). Rows: `index`, `sample`, `group` (= index, the GRPO group), `prompt_len`
(the first turn's prompt), `status` "ok", `finish_reason` (of the branch's last turn),
`metadata` (the row's other fields plus `episode_id`, `branch`, `branches`), and the seed's
`num_turns` (2 per model turn) and `raw_prompt` (the row's messages).

Cost: one Router.Generate per turn and one GetEpisode per episode; `concurrency` episodes run
at once on threads (the agent function must be thread-safe); memory holds one shard's samples.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import secrets
import threading
import zipfile
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from rlfleet.prompts import ChatTemplate, read_rows
from rlfleet.trajectories import FORMAT, Trajectories, load_trajectories

Agent = Callable[["EpisodeSession", dict[str, Any]], Any]
MAX_EPISODES = 50_000_000  # as rl-collect's bound on a collection


class EpisodeSession:
    """One episode, as the agent function sees it: `chat` / `generate` run turns under the
    episode's id; `row` is the prompt set's row, `messages` its conversation."""

    def __init__(self, client: Any, episode_id: str, template: ChatTemplate, row: dict[str, Any],
                 messages: list[dict[str, Any]], options: dict[str, Any], seed: Optional[int]):
        self.client = client
        self.episode_id = episode_id
        self.row = row
        self.messages = messages
        self._template = template
        self._options = options
        self._seed = seed
        self.turns = 0

    def generate(self, text: str, **options: Any) -> Any:
        """One turn from a text prompt: the GenerateResult (its `.text` is the answer)."""
        opts = {**self._options, **options}
        if self._seed is not None and "seed" not in options:
            opts["seed"] = _mix(self._seed, self.episode_id.split(".", 1)[1], self.turns)
        self.turns += 1
        return self.client.generate(text=text, episode_id=self.episode_id, **opts).one()

    def chat(self, messages: list[dict[str, Any]], tools: Optional[list[Any]] = None,
             **options: Any) -> str:
        """The model's answer to `messages` (rendered with the chat template, generation prompt
        added; `tools` passed to the template)."""
        extra = {"tools": tools} if tools is not None else {}
        text = self._template.render(messages, add_generation_prompt=True, **extra)
        return str(self.generate(text, **options).text)


def _mix(seed: int, key: str, turn: int) -> int:
    """A per-turn seed, the same on every run of the collection (so a resumed run samples as
    the first would have)."""
    h = hashlib.sha256(f"{seed}/{key}/{turn}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def load_agent(spec: str) -> Agent:
    """`module:function` or `path/to/file.py:function`."""
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise ValueError(f"--agent {spec!r}: want MODULE:FUNCTION or FILE.py:FUNCTION")
    if mod_name.endswith(".py"):
        loc = importlib.util.spec_from_file_location("rlfleet_user_agent", mod_name)
        if loc is None or loc.loader is None:
            raise ValueError(f"--agent: cannot load {mod_name}")
        module = importlib.util.module_from_spec(loc)
        loc.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_name)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"--agent: {mod_name} has no function {fn_name}")
    return fn  # type: ignore[no-any-return]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    fd = os.open(str(path.parent), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_trajectories(t: Trajectories, path: Union[str, Path]) -> None:
    """Writes `t` as an rlfleet.trajectories.v1 file (what load_trajectories reads; the
    seed's num_turns and raw_prompt as extra metadata columns when set), atomically."""
    tensors = {"offsets": t.offsets.astype("<i8"), "tokens": t.tokens.astype("<i4"),
               "loss_mask": t.loss_mask.astype("u1"),
               "rollout_logprobs": t.rollout_logprobs.astype("<f4"),
               "weight_versions": t.weight_versions.astype("<i8")}
    dtypes = {"offsets": "I64", "tokens": "I32", "loss_mask": "U8", "rollout_logprobs": "F32",
              "weight_versions": "I64"}
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, a in tensors.items():
        b = a.tobytes()
        header[name] = {"dtype": dtypes[name], "shape": [len(a)],
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    meta = {"format": FORMAT}
    for name in ("index", "sample", "group", "prompt_len", "attempts", "weight_version"):
        meta[name] = json.dumps([int(x) for x in getattr(t, name)])
    for name in ("status", "finish_reason", "metadata"):
        meta[name] = json.dumps(getattr(t, name), default=str)
    if t.num_turns is not None:
        meta["num_turns"] = json.dumps([int(x) for x in t.num_turns])
    if t.raw_prompt is not None:
        meta["raw_prompt"] = json.dumps(t.raw_prompt, default=str)
    header["__metadata__"] = meta
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    _write_atomic(Path(path), len(head).to_bytes(8, "little") + head + b"".join(blobs))


def concat_trajectories(parts: list[Trajectories]) -> Trajectories:
    """One Trajectories of every row of `parts`, in order."""
    offsets = [np.zeros(1, dtype=np.int64)]
    base = 0
    for p in parts:
        offsets.append(p.offsets[1:] + base)
        base += int(p.offsets[-1])

    def cat(name: str, dtype: Any) -> Any:
        cols = [getattr(p, name) for p in parts]
        return np.concatenate(cols).astype(dtype) if cols else np.zeros(0, dtype=dtype)

    def lst(name: str) -> list[Any]:
        return [x for p in parts for x in getattr(p, name)]

    turns = [p.num_turns if p.num_turns is not None else np.full(len(p), 2) for p in parts]
    return Trajectories(
        offsets=np.concatenate(offsets), tokens=cat("tokens", np.int32),
        loss_mask=cat("loss_mask", np.uint8), rollout_logprobs=cat("rollout_logprobs", np.float32),
        weight_versions=cat("weight_versions", np.int64), index=cat("index", np.int64),
        sample=cat("sample", np.int32), group=cat("group", np.int64),
        prompt_len=cat("prompt_len", np.int64), attempts=cat("attempts", np.int64),
        weight_version=cat("weight_version", np.int64), status=lst("status"),
        finish_reason=lst("finish_reason"), metadata=lst("metadata"),
        num_turns=np.concatenate(turns).astype(np.int64) if turns else np.zeros(0, np.int64),
        raw_prompt=[x for p in parts for x in (p.raw_prompt or [None] * len(p))])


def _episode_rows(episode: Any, index: int, sample: int, messages: Any,
                  meta: dict[str, Any]) -> Trajectories:
    """One row per branch sample of a GetEpisode answer."""
    rows = []
    for b, s in enumerate(episode.samples):
        tr = s.trajectory
        root = episode.turns[s.turns[0]]
        rows.append(dict(
            tokens=tr.tokens, mask=tr.loss_mask, logp=tr.rollout_logp,
            versions=tr.token_weight_versions, prompt_len=root.prompt_tokens,
            weight_version=tr.weight_version,
            finish_reason=episode.turns[s.turns[-1]].finish_reason,
            metadata={**meta, "episode_id": episode.episode_id, "branch": b,
                      "branches": len(episode.samples)},
            turns=2 * len(s.turns)))
    offsets = np.cumsum([0] + [len(r["tokens"]) for r in rows]).astype(np.int64)

    def flat(key: str, dtype: Any) -> Any:
        return np.array([x for r in rows for x in r[key]], dtype=dtype)

    n = len(rows)
    return Trajectories(
        offsets=offsets, tokens=flat("tokens", np.int32), loss_mask=flat("mask", np.uint8),
        rollout_logprobs=flat("logp", np.float32), weight_versions=flat("versions", np.int64),
        index=np.full(n, index, dtype=np.int64), sample=np.full(n, sample, dtype=np.int32),
        group=np.full(n, index, dtype=np.int64),
        prompt_len=np.array([r["prompt_len"] for r in rows], dtype=np.int64),
        attempts=np.ones(n, dtype=np.int64),
        weight_version=np.array([r["weight_version"] for r in rows], dtype=np.int64),
        status=["ok"] * n, finish_reason=[r["finish_reason"] for r in rows],
        metadata=[r["metadata"] for r in rows],
        num_turns=np.array([r["turns"] for r in rows], dtype=np.int64),
        raw_prompt=[messages] * n)


def collect_agent_episodes(client: Any, prompts: Union[str, Path], agent: Agent,
                           out: Union[str, Path], model: Union[str, Path], *, n: int = 1,
                           concurrency: int = 8, save_batch_size: int = 64,
                           messages_key: str = "prompt",
                           chat_template_file: Optional[Union[str, Path]] = None,
                           seed: Optional[int] = None, merge: bool = True,
                           **options: Any) -> dict[str, Any]:
    """Runs every (row, sample) of `prompts` (JSONL or Parquet rows holding chat messages under
    `messages_key`, `index` optional) not already done in `out` as an episode of `agent` on
    `client` (an rlfleet.Client on the router); `options` are generate() options for every turn
    (max_new_tokens, temperature, ...; `seed` gives each turn a seed derived from it, the
    same on a rerun). Returns {"episodes", "done", "failed", "samples", "out"}; with `merge`
    and nothing left to do, also writes trajectories.safetensors and trajectories.zip."""
    if not (1 <= n <= 4096 and 1 <= concurrency <= 1024 and 1 <= save_batch_size <= 1 << 20):
        raise ValueError("n in [1, 4096], concurrency in [1, 1024], save_batch_size in [1, 2^20]")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    template = ChatTemplate.from_model(model, chat_template_file=chat_template_file)
    rows: list[tuple[int, dict[str, Any]]] = []
    seen: set[int] = set()
    for pos, row in enumerate(read_rows(prompts)):
        msgs = row.get(messages_key)
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise ValueError(f"{prompts} row {pos}: `{messages_key}` is not a list of chat "
                             "messages")
        index = row.get("index", pos)
        if not isinstance(index, int) or index in seen:
            raise ValueError(f"{prompts} row {pos}: index {index!r} is not a unique integer")
        seen.add(index)
        rows.append((index, row))
    ckpt_path = out / "checkpoint.json"
    ckpt = json.loads(ckpt_path.read_text()) if ckpt_path.exists() else {}
    if ckpt and ckpt.get("format") != "rlfleet.agent_episodes.v1":
        raise ValueError(f"{ckpt_path}: not an agent-episode checkpoint")
    done = {(i, s) for i, s in ckpt.get("completed", [])}
    shards: list[str] = list(ckpt.get("shards", []))
    total = len(rows) * n
    if total > MAX_EPISODES:
        raise ValueError(f"{len(rows)} rows x n={n} is more than {MAX_EPISODES} episodes")
    todo = [(i, r, s) for i, r in rows for s in range(n) if (i, s) not in done]
    run = secrets.token_hex(4)  # a fresh id per run: a crashed run's partial episodes never mix in
    lock = threading.Lock()
    pending: list[Trajectories] = []
    pending_keys: list[tuple[int, int]] = []
    failed: dict[str, str] = {}

    def save_checkpoint() -> None:
        body = {"format": "rlfleet.agent_episodes.v1", "total": total,
                "completed": sorted([list(k) for k in done]), "failed": failed,
                "shards": shards}
        _write_atomic(ckpt_path, (json.dumps(body) + "\n").encode())

    def flush() -> None:
        if not pending_keys:
            return
        name = f"shard_{len(shards):05d}.safetensors"
        save_trajectories(concat_trajectories(pending), out / name)
        shards.append(name)
        done.update(pending_keys)
        for i, s in pending_keys:
            failed.pop(f"{i}.{s}", None)
        pending.clear()
        pending_keys.clear()
        save_checkpoint()

    def one(index: int, row: dict[str, Any], sample: int) -> None:
        eid = f"run{run}.{index}.{sample}"
        messages = row[messages_key]
        meta = {k: v for k, v in row.items() if k not in (messages_key, "index")}
        session = EpisodeSession(client, eid, template, row, messages, options, seed)
        agent(session, row)
        episode = client.get_episode(eid, remove=True)
        t = _episode_rows(episode, index, sample, messages, meta)
        with lock:
            pending.append(t)
            pending_keys.append((index, sample))
            if len(pending_keys) >= save_batch_size:
                flush()

    with ThreadPoolExecutor(concurrency) as pool:
        futures: dict[Future[None], tuple[int, int]] = {}
        it = iter(todo)
        for index, row, sample in it:
            futures[pool.submit(one, index, row, sample)] = (index, sample)
            if len(futures) >= 2 * concurrency:
                break
        while futures:
            finished, _ = wait(list(futures), return_when=FIRST_COMPLETED)
            for f in finished:
                index, sample = futures.pop(f)
                err = f.exception()
                if err is not None:
                    with lock:
                        failed[f"{index}.{sample}"] = f"{type(err).__name__}: {err}"
                nxt = next(it, None)
                if nxt is not None:
                    futures[pool.submit(one, nxt[0], nxt[1], nxt[2])] = (nxt[0], nxt[2])
    with lock:
        flush()
        save_checkpoint()
    summary: dict[str, Any] = {"episodes": total, "done": len(done), "failed": len(failed),
                               "out": str(out)}
    if merge and len(done) == total:
        merged = concat_trajectories([load_trajectories_with_turns(out / s) for s in shards])
        order = sorted(range(len(merged)), key=lambda k: (int(merged.index[k]),
                                                          int(merged.sample[k]),
                                                          merged.metadata[k].get("branch", 0)))
        merged = concat_trajectories([_take(merged, k) for k in order])
        save_trajectories(merged, out / "trajectories.safetensors")
        tmp = out / "trajectories.zip.tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.write(out / "trajectories.safetensors", "trajectories.safetensors")
            zf.write(ckpt_path, "checkpoint.json")
        tmp.replace(out / "trajectories.zip")
        summary["samples"] = len(merged)
    return summary


def load_trajectories_with_turns(path: Union[str, Path]) -> Trajectories:
    """load_trajectories plus the num_turns / raw_prompt metadata columns this module writes."""
    t = load_trajectories(path)
    data = Path(path).read_bytes()
    hlen = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + hlen]).get("__metadata__", {})
    if "num_turns" in meta:
        t.num_turns = np.array(json.loads(meta["num_turns"]), dtype=np.int64)
    if "raw_prompt" in meta:
        t.raw_prompt = json.loads(meta["raw_prompt"])
    return t


def _take(t: Trajectories, k: int) -> Trajectories:
    b, e = int(t.offsets[k]), int(t.offsets[k + 1])
    return Trajectories(
        offsets=np.array([0, e - b], dtype=np.int64), tokens=t.tokens[b:e],
        loss_mask=t.loss_mask[b:e], rollout_logprobs=t.rollout_logprobs[b:e],
        weight_versions=t.weight_versions[b:e], index=t.index[k:k + 1],
        sample=t.sample[k:k + 1], group=t.group[k:k + 1], prompt_len=t.prompt_len[k:k + 1],
        attempts=t.attempts[k:k + 1], weight_version=t.weight_version[k:k + 1],
        status=[t.status[k]], finish_reason=[t.finish_reason[k]], metadata=[t.metadata[k]],
        num_turns=t.num_turns[k:k + 1] if t.num_turns is not None else None,
        raw_prompt=[t.raw_prompt[k]] if t.raw_prompt is not None else None)
