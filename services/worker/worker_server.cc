#include "services/worker/worker_server.h"

#include <fstream>
#include <sstream>

#include "common/status.h"
#include "services/worker/admin_service.h"
#include "services/worker/worker_service.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

const char* ArchName(model_io::Arch arch) {
  switch (arch) {
    case model_io::Arch::kLlama:
      return "llama";
    case model_io::Arch::kQwen2:
      return "qwen2";
    case model_io::Arch::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const WorkerConfig& config) {
  RETURN_IF_ERROR(Validate(config));
  std::unique_ptr<WorkerServer> s(new WorkerServer());
  s->config_ = config;
  s->weight_version_ = config.weight_version;
  ASSIGN_OR_RETURN(s->model_config_, model_io::LoadModelConfig(config.model_path));
  {
    std::ifstream in(config.model_path + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    s->config_json_ = text.str();
  }
  spdlog::info("model {}: {} layers, hidden {}, vocab {}, arch {}", config.model_path,
               s->model_config_.num_hidden_layers, s->model_config_.hidden_size,
               s->model_config_.vocab_size, ArchName(s->model_config_.arch));

  s->metrics_.SetGaugeCallback("rl_worker_weight_version", "Version of the served weights.", {},
                               [raw = s.get()] { return static_cast<double>(raw->weight_version()); });
  s->admin_auth_ = std::make_unique<BearerAuth>(config.admin_api_key);
  s->data_auth_ = std::make_unique<BearerAuth>(config.api_key);
  s->admin_service_ = std::make_unique<AdminService>(s.get(), s->admin_auth_.get());
  s->worker_service_ = std::make_unique<WorkerService>(s.get(), s->data_auth_.get());
  ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  ASSIGN_OR_RETURN(s->grpc_, GrpcServer::Start(options, {s->worker_service_.get(), s->admin_service_.get()}));
  if (config.metrics_port >= 0) {
    ASSIGN_OR_RETURN(s->metrics_http_,
                     MetricsHttpServer::Start(config.host, config.metrics_port, &s->metrics_));
  }
  return s;
}

WorkerServer::~WorkerServer() { Shutdown(); }

void WorkerServer::Shutdown() {
  if (grpc_) grpc_->Shutdown();
  if (metrics_http_) metrics_http_->Stop();
}

void WorkerServer::FillModelInfo(rl::v1::GetModelInfoResponse* out) const {
  const model_io::ModelConfig& c = model_config_;
  out->set_model_path(config_.model_path);
  out->set_architecture(c.architecture_name);
  out->set_model_type(c.model_type);
  out->set_vocab_size(c.vocab_size);
  out->set_hidden_size(c.hidden_size);
  out->set_intermediate_size(c.intermediate_size);
  out->set_num_hidden_layers(c.num_hidden_layers);
  out->set_num_attention_heads(c.num_attention_heads);
  out->set_num_key_value_heads(c.num_key_value_heads);
  out->set_head_dim(c.head_dim);
  out->set_max_position_embeddings(c.max_position_embeddings);
  out->set_dtype(c.torch_dtype);
  out->set_weight_version(weight_version());
  out->set_backend("cpu");
  out->set_tie_word_embeddings(c.tie_word_embeddings);
  for (int32_t id : c.eos_token_ids) out->add_eos_token_ids(id);
  out->set_config_json(config_json_);
}

void WorkerServer::FillServerInfo(rl::v1::GetServerInfoResponse* out) const {
  out->set_weight_version(weight_version());
  out->set_backend("cpu");
  out->set_version(RL_VERSION);
}

}  // namespace rl::worker
