"""Typed request options and results of the generation API (rl.v1)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from rlfleet._stubs import generate_pb2

FINISH_REASONS = {0: "unspecified", 1: "stop", 2: "length", 3: "abort", 4: "stale"}


@dataclass
class SamplingParams:
    """rl.v1.SamplingParams; None leaves a field unset (the server's default)."""
    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    seed: Optional[int] = None
    stop_token_ids: Optional[list[int]] = None
    stop: Optional[list[str]] = None
    ignore_eos: Optional[bool] = None
    n: Optional[int] = None
    include_stop_str_in_output: Optional[bool] = None

    def to_proto(self) -> "generate_pb2.SamplingParams":
        p = generate_pb2.SamplingParams()
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if isinstance(v, (list, tuple)):
                getattr(p, f.name).extend(v)
            else:
                setattr(p, f.name, v)
        return p


def build_generate_request(text: Optional[str] = None,
                           input_ids: Optional[Sequence[int]] = None, *,
                           sampling: Optional[SamplingParams] = None,
                           request_id: str = "", return_logprob: bool = False,
                           top_logprobs_num: int = 0, logprob_start_len: Optional[int] = None,
                           logprobs_at_temperature_one: bool = False,
                           stream: Optional[bool] = None, return_trajectory: bool = False,
                           return_routed_experts: bool = False,
                           return_expert_weights: bool = False,
                           routed_experts_start_len: Optional[int] = None,
                           min_weight_version: Optional[int] = None,
                           exact_weight_version: Optional[int] = None,
                           max_version_lag: Optional[int] = None,
                           routing_key: str = "", group_id: str = "", episode_id: str = "",
                           resume_from: Any = None,
                           **sampling_kwargs: Any) -> "generate_pb2.GenerateRequest":
    """Every rl.v1.GenerateRequest field; sampling fields as `sampling=` or keyword arguments.
    Router only: `routing_key` / `group_id` place related requests on one worker under
    --policy affinity (docs/routing.md); `episode_id` records the turn in an agent episode
    (docs/episodes.md). `min_weight_version` / `exact_weight_version`: the weight versions the
    request accepts (the fleet never serves it with others; UNAVAILABLE when none serves one
    within the deadline). `max_version_lag`: the staleness bound, the request ends with
    finish_reason "stale" and its partial output once the weight version moved more than this
    past its dispatch version (-1: no bound; None: the fleet's default). `resume_from` continues
    an earlier partial sample within its budget (docs/weight-updates.md, "Resume"): a request
    id the router keeps (no prompt then), or the earlier GenerateResult (or a dict with
    output_ids, output_logprobs, weight_version_segments) with the original prompt; the
    sampling's max_new_tokens is the ORIGINAL budget."""
    by_id = isinstance(resume_from, str)
    if by_id and (text is not None or input_ids is not None):
        raise ValueError("resume_from=<request id>: leave the prompt out (the router keeps it)")
    if not by_id and (text is None) == (input_ids is None):
        raise ValueError("exactly one of text or input_ids is required")
    if sampling is None:
        sampling = SamplingParams()
    unknown = set(sampling_kwargs) - {f.name for f in fields(SamplingParams)}
    if unknown:
        raise TypeError(f"unknown sampling parameters: {sorted(unknown)}")
    for k, v in sampling_kwargs.items():
        setattr(sampling, k, v)
    req = generate_pb2.GenerateRequest(
        request_id=request_id, sampling_params=sampling.to_proto(),
        return_logprob=return_logprob, top_logprobs_num=top_logprobs_num,
        logprobs_at_temperature_one=logprobs_at_temperature_one,
        return_trajectory=return_trajectory, return_routed_experts=return_routed_experts,
        return_expert_weights=return_expert_weights, routing_key=routing_key, group_id=group_id,
        episode_id=episode_id)
    if routed_experts_start_len is not None:
        req.routed_experts_start_len = routed_experts_start_len
    if text is not None:
        req.text = text
    elif input_ids is not None:
        req.input_ids.ids.extend(int(i) for i in input_ids)
    if logprob_start_len is not None:
        req.logprob_start_len = logprob_start_len
    if stream is not None:
        req.stream = stream
    if min_weight_version is not None:
        req.min_weight_version = min_weight_version
    if exact_weight_version is not None:
        req.exact_weight_version = exact_weight_version
    if max_version_lag is not None:
        req.max_version_lag = max_version_lag
    if resume_from is not None:
        _set_resume_from(req, resume_from)
    return req


def _set_resume_from(req: Any, resume_from: Any) -> None:
    """GenerateRequest.resume_from from a request id, a GenerateResult or a dict."""
    rf = req.resume_from
    if isinstance(resume_from, str):
        if not resume_from:
            raise ValueError("resume_from: an empty request id")
        rf.request_id = resume_from
        return
    if isinstance(resume_from, dict):
        ids = list(resume_from.get("output_ids", []))
        logprobs = [float(x) for x in resume_from.get("output_logprobs", [])]
        segments = list(resume_from.get("weight_version_segments", []))
    else:  # a GenerateResult (or anything shaped like one)
        ids = list(resume_from.output_ids)
        logprobs = [float(getattr(p, "logprob", p)) for p in resume_from.output_logprobs]
        segments = list(resume_from.weight_version_segments)
    if not ids:
        raise ValueError("resume_from: the earlier sample has no output tokens")
    rf.output_ids.extend(int(i) for i in ids)
    rf.output_logprobs.extend(logprobs)
    for version, n in segments:
        rf.weight_version_segments.add(weight_version=int(version), num_tokens=int(n))


@dataclass
class TopLogprob:
    token_id: int
    logprob: float


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[TopLogprob] = field(default_factory=list)

    @staticmethod
    def from_proto(p: Any) -> "TokenLogprob":
        return TokenLogprob(p.token_id, p.logprob, [TopLogprob(t.token_id, t.logprob)
                                                     for t in p.top])


@dataclass
class Trajectory:
    tokens: list[int]
    loss_mask: list[int]
    rollout_logp: list[float]
    weight_version: int
    token_weight_versions: list[int]

    @staticmethod
    def from_proto(p: Any) -> "Trajectory":
        return Trajectory(list(p.tokens), list(p.loss_mask), list(p.rollout_logp),
                          p.weight_version, list(p.token_weight_versions))


@dataclass
class RoutedExperts:
    """R3: the experts every processed token was routed to (rl.v1.RoutedExperts)."""
    shape: tuple[int, int, int]  # (tokens, MoE layers, top_k)
    start_pos: int               # position of the first token in prompt + output
    expert_ids_bytes: bytes      # int32 little-endian, row-major `shape`
    expert_weights_bytes: bytes  # float32, same shape (empty unless return_expert_weights)

    def expert_ids(self) -> "np.ndarray[Any, np.dtype[np.int32]]":
        return np.frombuffer(self.expert_ids_bytes, dtype="<i4").reshape(self.shape)

    def expert_weights(self) -> "Optional[np.ndarray[Any, np.dtype[np.float32]]]":
        if not self.expert_weights_bytes:
            return None
        return np.frombuffer(self.expert_weights_bytes, dtype="<f4").reshape(self.shape)

    @staticmethod
    def from_proto(p: Any) -> "RoutedExperts":
        shape = tuple(int(d) for d in p.shape)
        if len(shape) != 3:
            raise ValueError(f"routed_experts: shape {list(shape)} is not [tokens, layers, top_k]")
        return RoutedExperts((shape[0], shape[1], shape[2]), p.start_pos, p.expert_ids,
                             p.expert_weights)


@dataclass
class Chunk:
    """An incremental piece of a streamed generation."""
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob]


@dataclass
class GenerateResult:
    """rl.v1.GenerateFinal with its stream's request id and completion index."""
    request_id: str
    index: int
    finish_reason: str
    output_ids: list[int]
    text: str
    output_logprobs: list[TokenLogprob]
    prompt_logprobs: list[TokenLogprob]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: int
    dispatch_weight_version: int
    weight_version_segments: list[tuple[int, int]]  # (weight_version, num_tokens)
    matched_token_id: int
    matched_stop: str
    abort_message: str
    worker: str
    attempts: int
    queue_us: int
    ttft_us: int
    total_us: int
    trajectory: Optional[Trajectory]
    routed_experts: Optional[RoutedExperts] = None
    # An in-flight update (keep_kv) crossed it: the prefix KV came from an older version.
    kv_from_older_version: bool = False
    oldest_kv_weight_version: int = 0
    # A resumed sample (resume_from): its leading output tokens that came from the earlier
    # part, and the earlier request's id when resumed by id.
    resumed_tokens: int = 0
    resumed_from_request_id: str = ""

    def token_weight_versions(self) -> list[int]:
        """The weight version of every output token (segments expanded; weight_version for
        every token when the server sent no segments)."""
        if not self.weight_version_segments:
            return [self.weight_version] * len(self.output_ids)
        out: list[int] = []
        for version, n in self.weight_version_segments:
            out.extend([version] * n)
        return out

    @staticmethod
    def from_proto(msg: Any) -> "GenerateResult":
        f = msg.final
        return GenerateResult(
            request_id=msg.request_id, index=msg.index,
            finish_reason=FINISH_REASONS.get(f.finish_reason, str(f.finish_reason)),
            output_ids=list(f.output_ids), text=f.text,
            output_logprobs=[TokenLogprob.from_proto(p) for p in f.output_logprobs],
            prompt_logprobs=[TokenLogprob.from_proto(p) for p in f.prompt_logprobs],
            prompt_tokens=f.prompt_tokens, completion_tokens=f.completion_tokens,
            cached_tokens=f.cached_tokens, weight_version=f.weight_version,
            dispatch_weight_version=f.dispatch_weight_version,
            weight_version_segments=[(s.weight_version, s.num_tokens)
                                     for s in f.weight_version_segments],
            matched_token_id=f.matched_token_id, matched_stop=f.matched_stop,
            abort_message=f.abort_message, worker=f.worker, attempts=f.attempts,
            queue_us=f.timings.queue_us, ttft_us=f.timings.ttft_us, total_us=f.timings.total_us,
            trajectory=Trajectory.from_proto(f.trajectory) if f.HasField("trajectory") else None,
            routed_experts=(RoutedExperts.from_proto(f.routed_experts)
                            if f.HasField("routed_experts") else None),
            kv_from_older_version=f.kv_from_older_version,
            oldest_kv_weight_version=f.oldest_kv_weight_version,
            resumed_tokens=f.resumed_tokens,
            resumed_from_request_id=f.resumed_from_request_id)


def chunk_from_proto(msg: Any) -> Chunk:
    c = msg.chunk
    return Chunk(msg.index, list(c.token_ids), c.text,
                 [TokenLogprob.from_proto(p) for p in c.logprobs])


class Generations(list[GenerateResult]):
    """What `generate` returns for every `n`: the samples of one prompt, ordered by `index`
    (n = 1: a list of one). `one()` is the accessor for the single case."""

    def one(self) -> GenerateResult:
        """The only sample; ValueError when there are several (n > 1) or none."""
        if len(self) != 1:
            raise ValueError(f"one(): {len(self)} samples (n > 1?): index them instead")
        return self[0]

    @property
    def output_ids(self) -> list[list[int]]:
        """Every sample's output token ids."""
        return [r.output_ids for r in self]

    @property
    def texts(self) -> list[str]:
        """Every sample's completion text."""
        return [r.text for r in self]

    @staticmethod
    def of(results: Iterable[GenerateResult]) -> "Generations":
        g = Generations(results)
        g.sort(key=lambda r: r.index)
        return g


@dataclass
class EpisodeTurn:
    """One recorded turn of an agent episode (rl.v1.EpisodeTurn)."""
    request_id: str
    index: int
    parent: int  # the turn whose whole trajectory this turn's prompt extends; -1 for a root
    prompt_tokens: int
    completion_tokens: int
    worker: str
    weight_version: int
    finish_reason: str
    has_routed_experts: bool = False  # R3: the turn's routing was recorded

    @staticmethod
    def from_proto(p: Any) -> "EpisodeTurn":
        return EpisodeTurn(p.request_id, p.index, p.parent, p.prompt_tokens, p.completion_tokens,
                           p.worker, p.weight_version,
                           FINISH_REASONS.get(p.finish_reason, str(p.finish_reason)),
                           p.has_routed_experts)


@dataclass
class EpisodeSample:
    """One branch of an episode: its last turn's trajectory and the turns on it, root first."""
    trajectory: Trajectory
    turns: list[int]
    # R3 (get_episode with return_routed_experts): the branch's routing, trajectory tokens
    # [start_pos, start_pos + shape[0]).
    routed_experts: Optional[RoutedExperts] = None


@dataclass
class Episode:
    """Router.GetEpisode: the turns in the order they ended and one sample per branch."""
    episode_id: str
    turns: list[EpisodeTurn]
    samples: list[EpisodeSample]

    @staticmethod
    def from_proto(p: Any) -> "Episode":
        return Episode(p.episode_id, [EpisodeTurn.from_proto(t) for t in p.turns],
                       [EpisodeSample(Trajectory.from_proto(s.trajectory), list(s.turns),
                                      RoutedExperts.from_proto(s.routed_experts)
                                      if s.HasField("routed_experts") else None)
                        for s in p.samples])
