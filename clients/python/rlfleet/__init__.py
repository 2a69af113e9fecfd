"""rlfleet: the trainer-side package of the rollout fleet.

    from rlfleet import Client, Trajectories
    with Client("127.0.0.1:50051") as c:
        group = c.generate(text="Once upon a time", n=4, max_new_tokens=16,
                           return_logprob=True, return_trajectory=True)   # Generations
        c.update_weights_from_tensor(model.named_parameters(), weight_version=step)
        c.release_memory(); ...; c.resume_memory()
    batch = Trajectories.from_results([group]).to_dataproto(pad_token_id=0)["batch"]

Every call raises rlfleet.FleetError on failure (in-band `success=false` included). The gRPC
stubs are generated from protos/ when the package is built (pip install clients/python); the
trajectory loader and the tensor helpers need only numpy (torch, pyarrow, jinja2 optional).
"""

from typing import TYPE_CHECKING, Any

from rlfleet.tensors import WeightTensor, rank_sha256, read_safetensors, tensor_sha256
from rlfleet.episodes import episodes_to_dataproto
from rlfleet.trajectories import Trajectories, load_trajectories

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers
    from rlfleet._progress import PushProgress
    from rlfleet.agent_runs import EpisodeSession, collect_agent_episodes
    from rlfleet.async_client import AsyncClient, AsyncWeightsGroup
    from rlfleet.client import Client
    from rlfleet.errors import FleetError, WorkerOutcome
    from rlfleet.prompts import ChatTemplate, prepare_prompt_set
    from rlfleet.types import (Chunk, Episode, EpisodeSample, EpisodeTurn, GenerateResult,
                               Generations, SamplingParams, TokenLogprob, Trajectory,
                               build_generate_request)
    from rlfleet.weight_group import WeightsGroup
    from rlfleet.weight_sync import Bucket, TcpWeightSender, plan_buckets

_LAZY = {
    "FleetError": "rlfleet.errors",
    "WorkerOutcome": "rlfleet.errors",
    "Client": "rlfleet.client",
    "AsyncClient": "rlfleet.async_client",
    "AsyncWeightsGroup": "rlfleet.async_client",
    "WeightsGroup": "rlfleet.weight_group",
    "TcpWeightSender": "rlfleet.weight_sync",
    "Bucket": "rlfleet.weight_sync",
    "plan_buckets": "rlfleet.weight_sync",
    "PushProgress": "rlfleet._progress",
    "SamplingParams": "rlfleet.types",
    "GenerateResult": "rlfleet.types",
    "Generations": "rlfleet.types",
    "Chunk": "rlfleet.types",
    "TokenLogprob": "rlfleet.types",
    "Trajectory": "rlfleet.types",
    "build_generate_request": "rlfleet.types",
    "Episode": "rlfleet.types",
    "EpisodeTurn": "rlfleet.types",
    "EpisodeSample": "rlfleet.types",
    "prepare_prompt_set": "rlfleet.prompts",
    "ChatTemplate": "rlfleet.prompts",
    "collect_agent_episodes": "rlfleet.agent_runs",
    "EpisodeSession": "rlfleet.agent_runs",
}


def __getattr__(name: str) -> Any:
    # The gRPC parts load lazily, so reading trajectories needs neither grpc nor the stubs.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    import importlib
    return getattr(importlib.import_module(module), name)


__all__ = ["Client", "AsyncClient", "WeightsGroup", "AsyncWeightsGroup", "TcpWeightSender",
           "Bucket", "plan_buckets", "PushProgress", "FleetError", "WorkerOutcome",
           "WeightTensor", "read_safetensors", "tensor_sha256", "rank_sha256", "SamplingParams",
           "GenerateResult", "Generations", "Chunk", "TokenLogprob", "Trajectory",
           "Trajectories", "load_trajectories", "prepare_prompt_set", "ChatTemplate",
           "build_generate_request", "Episode", "EpisodeTurn", "EpisodeSample",
           "episodes_to_dataproto", "collect_agent_episodes", "EpisodeSession"]
