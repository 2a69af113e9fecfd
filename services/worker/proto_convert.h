// Translation between rl.v1 protos and the engine's domain structs. Pure functions, no state.
// Proto defaults: unset optional fields take the documented default (max_new_tokens 128,
// temperature 1, top_p 1, repetition_penalty 1, n 1); values the engine cannot accept are left
// for engine::ValidateRequest, which names the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/model_config.h"
#include "rl/v1/admin.pb.h"
#include "rl/v1/generate.pb.h"
#include "services/worker/control/worker_control.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine/request.h"

namespace rl::worker {

inline constexpr int32_t kDefaultMaxNewTokens = 128;

// The engine request for `proto` with prompt ids already resolved (text prompts are tokenized
// by the caller). `id` is the request id to use.
absl::StatusOr<engine::GenerateRequest> ToEngineRequest(const rl::v1::GenerateRequest& proto,
                                                        std::string id,
                                                        std::vector<int32_t> input_ids);

void ToProto(const engine::TokenLogprob& in, rl::v1::TokenLogprob* out);
rl::v1::FinishReason ToProto(engine::FinishKind kind);
// Fills everything of GenerateFinal but the text (decoded by the caller).
void ToProto(const engine::GenerateResult& in, rl::v1::GenerateFinal* out);
// The R3 arrays of a result that asked for them (raw little-endian bytes and their shape).
void ToProto(const engine::GenerateResult& in, rl::v1::RoutedExperts* out);
void ToProto(const engine::ServerInfo& in, rl::v1::GetServerInfoResponse* out);
// The model's architecture fields of GetModelInfo (FillModelInfo adds path, version, backend,
// parameter count and config JSON).
void ToProto(const model_io::ModelConfig& in, rl::v1::GetModelInfoResponse* out);

// GetModelInfo: the architecture of `config`, then `identity` and the served weight version.
void FillModelInfo(const model_io::ModelConfig& config, const ModelIdentity& identity,
                   int64_t weight_version, rl::v1::GetModelInfoResponse* out);

// GetServerInfo: the engine's snapshot `engine`, then `worker`.
void FillServerInfo(const engine::ServerInfo& engine, const WorkerInfo& worker,
                    rl::v1::GetServerInfoResponse* out);

absl::StatusOr<engine::PauseMode> FromProto(rl::v1::PauseMode mode);
rl::v1::PauseMode ToProto(engine::PauseMode mode);

}  // namespace rl::worker
