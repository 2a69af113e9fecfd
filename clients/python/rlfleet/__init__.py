"""rlfleet: the trainer-side package of the rollout fleet.

    from rlfleet import Client, AsyncClient, SamplingParams, load_trajectories
    with Client("127.0.0.1:50051") as c:
        r = c.generate(text="Once upon a time", max_new_tokens=16, return_logprob=True,
                       top_logprobs_num=5, logprobs_at_temperature_one=True)
        print(r.output_ids, r.token_weight_versions())
    batch = load_trajectories("out/").to_dataproto(pad_token_id=0)["batch"]

The gRPC stubs are generated from protos/ when the package is built (pip install
clients/python); the trajectory loader needs only numpy (torch and pyarrow are optional).
"""

from rlfleet.episodes import episodes_to_dataproto  # noqa: F401
from rlfleet.trajectories import Trajectories, load_trajectories  # noqa: F401


def __getattr__(name):
    # The gRPC parts load lazily, so reading trajectories needs neither grpc nor the stubs.
    if name in ("Client", "AsyncClient"):
        from rlfleet import client
        return getattr(client, name)
    if name in ("SamplingParams", "GenerateResult", "Chunk", "TokenLogprob", "Trajectory",
                "build_generate_request", "Episode", "EpisodeTurn", "EpisodeSample"):
        from rlfleet import types
        return getattr(types, name)
    if name in ("prepare_prompt_set", "ChatTemplate"):
        from rlfleet import prompts
        return getattr(prompts, name)
    raise AttributeError(name)


__all__ = ["Client", "AsyncClient", "SamplingParams", "GenerateResult", "Chunk", "TokenLogprob",
           "Trajectory", "Trajectories", "load_trajectories", "prepare_prompt_set",
           "ChatTemplate", "build_generate_request", "Episode", "EpisodeTurn", "EpisodeSample",
           "episodes_to_dataproto"]
