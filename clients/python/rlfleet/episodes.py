"""Agent episodes (Router.GetEpisode, docs/episodes.md) laid out as verl's DataProto batch.

One row per branch sample. The prompt is the tokens of the branch's first turn's prompt (the
conversation the episode started from), left-padded to P; the response is everything after it
(every model turn, and the tool results and user turns between them), right-padded to R, with
`response_mask` = the router's loss mask (1 exactly on generated tokens, so tool and user tokens
inside the response are masked out), `rollout_log_probs` (0 where unknown or padding) and
`rollout_weight_versions` (-1 on padding); `input_ids`, `attention_mask`, `position_ids` as in
rlfleet.trajectories. Non-tensor fields: `__num_turns__` (model turns on the branch),
`raw_prompt` (the messages the caller started the episode from, when given), `episode_id`,
`uid` (the episode: a GRPO group when one episode is sampled several times is the caller's
choice), `finish_reason` (of the branch's last turn). Needs only numpy.

R3: when every sample carries routed experts (Client.get_episode with return_routed_experts),
the batch gains `routed_experts`, int32 [N, P + R, MoE layers, top_k] aligned with `input_ids`
(token t's experts at t's column; -1 where a token has none: padding, tokens before the
routing's start_pos, and the last token, never fed back), and with expert weights
`routed_expert_weights`, float32, same shape (0 where none). Samples whose routings differ in
[layers, top_k] are a ValueError; a batch where some samples have routing and others not too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

import numpy as np

from rlfleet.trajectories import pack_dataproto_batch

if TYPE_CHECKING:
    from rlfleet.types import Episode


def episodes_to_dataproto(episodes: Iterable[Episode], pad_token_id: int = 0,
                          raw_prompts: Optional[Mapping[str, object]] = None,
                          max_prompt_length: Optional[int] = None,
                          max_response_length: Optional[int] = None) -> dict[str, Any]:
    """{"batch": {...}, "non_tensor_batch": {...}, "meta_info": {}} for every sample of every
    episode (rlfleet.types.Episode, as Client.get_episode returns). A sample longer than a given
    maximum is a ValueError."""
    rows = []
    for e in episodes:
        for s in e.samples:
            if not s.turns:
                raise ValueError(f"episode {e.episode_id}: a sample with no turns")
            root = e.turns[s.turns[0]]
            t = s.trajectory
            n = len(t.tokens)
            if not (len(t.loss_mask) == len(t.rollout_logp) == len(t.token_weight_versions) == n):
                raise ValueError(f"episode {e.episode_id}: trajectory columns differ in length")
            if not 0 <= root.prompt_tokens <= n:
                raise ValueError(f"episode {e.episode_id}: prompt longer than the trajectory")
            rows.append((e, s, root.prompt_tokens))
    plens = [p for _, _, p in rows]
    rlens = [len(s.trajectory.tokens) - p for _, s, p in rows]
    P = max(plens, default=0) if max_prompt_length is None else max_prompt_length
    R = max(rlens, default=0) if max_response_length is None else max_response_length
    for (e, _, _), pl, rl in zip(rows, plens, rlens):
        if pl > P or rl > R:
            raise ValueError(f"episode {e.episode_id}: {pl} prompt / {rl} response tokens, more "
                             f"than {P} / {R}")
    n = len(rows)
    batch = pack_dataproto_batch(
        [(s.trajectory.tokens[:pl], s.trajectory.tokens[pl:], s.trajectory.loss_mask[pl:],
          s.trajectory.rollout_logp[pl:], s.trajectory.token_weight_versions[pl:])
         for _, s, pl in rows], P, R, pad_token_id)
    routed = [s.routed_experts for _, s, _ in rows]
    if any(r is not None for r in routed):
        if any(r is None for r in routed):
            raise ValueError("routed experts: some samples have them and others not (ask "
                             "get_episode with return_routed_experts for every episode)")
        batch.update(_routing_columns(rows, P, R))
    raw = raw_prompts or {}
    raw_prompt = np.empty(n, dtype=object)  # element by element: messages stay Python lists
    for r, (e, _, _) in enumerate(rows):
        raw_prompt[r] = raw.get(e.episode_id)
    non_tensor = {
        "__num_turns__": np.array([len(s.turns) for _, s, _ in rows], dtype=np.int64),
        "raw_prompt": raw_prompt,
        "episode_id": np.array([e.episode_id for e, _, _ in rows], dtype=object),
        "uid": np.array([e.episode_id for e, _, _ in rows], dtype=object),
        "finish_reason": np.array([e.turns[s.turns[-1]].finish_reason for e, s, _ in rows],
                                  dtype=object),
    }
    return {"batch": batch, "non_tensor_batch": non_tensor, "meta_info": {}}


def _routing_columns(rows: list[Any], P: int, R: int) -> dict[str, np.ndarray]:
    """`routed_experts` (and `routed_expert_weights` when every sample has weights) aligned with
    input_ids: prompt token i of a prompt of length pl at column P - pl + i, response token j at
    P + j."""
    shapes = {s.routed_experts.shape[1:] for _, s, _ in rows}
    if len(shapes) != 1:
        raise ValueError(f"routed experts: samples differ in [layers, top_k]: {sorted(shapes)}")
    layers, top_k = shapes.pop()
    n = len(rows)
    ids = np.full((n, P + R, layers, top_k), -1, dtype=np.int32)
    with_weights = all(s.routed_experts.expert_weights_bytes for _, s, _ in rows)
    weights = np.zeros((n, P + R, layers, top_k), dtype=np.float32) if with_weights else None
    for r, (e, s, pl) in enumerate(rows):
        re = s.routed_experts
        start, count = re.start_pos, re.shape[0]
        if start < 0 or start + count > len(s.trajectory.tokens):
            raise ValueError(f"episode {e.episode_id}: routed experts for tokens [{start}, "
                             f"{start + count}) of a {len(s.trajectory.tokens)}-token sample")
        col = P - pl + start  # the column of trajectory token `start`
        ids[r, col:col + count] = re.expert_ids()
        if weights is not None:
            w = re.expert_weights()
            assert w is not None
            weights[r, col:col + count] = w
    out = {"routed_experts": ids}
    if weights is not None:
        out["routed_expert_weights"] = weights
    return out
