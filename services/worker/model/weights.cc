#include "services/worker/model/weights.h"

#include <atomic>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/file_read.h"
#include "common/status.h"

namespace rl::model {

namespace {

using model_io::DType;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

const WeightTensor* Weights::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<TensorInfo> Weights::List() const {
  std::vector<TensorInfo> out;
  for (const auto& [name, t] : tensors_) {
    out.push_back({name, model_io::DTypeName(t.dtype), t.shape});
  }
  return out;
}

void Weights::Visit(
    const std::function<void(const TensorInfo&, absl::Span<const uint8_t>)>& fn) const {
  for (const auto& [name, t] : tensors_) {
    fn({name, model_io::DTypeName(t.dtype), t.shape},
       absl::Span<const uint8_t>(static_cast<const uint8_t*>(t.data),
                                 static_cast<size_t>(t.num_bytes)));
  }
}

Weights::Weights() {
  static std::atomic<uint64_t> next{1};
  serial_ = next.fetch_add(1);
}

int64_t Weights::TotalBytes() const {
  int64_t total = 0;
  for (const auto& [name, t] : tensors_) total += t.num_bytes;
  return total;
}

void Weights::ReserveUpdateBuffers() const {
  model_io::ReserveSpareBuffers(checkpoint_.file_sizes());
}

int64_t Weights::BytesPerToken() const {
  int64_t total = TotalBytes();
  if (embed_ != lm_head_) {
    // Only one embedding row is read per token.
    total -= embed_->num_bytes - embed_->num_bytes / embed_->shape[0];
  }
  return total;
}

absl::Status Weights::Update(const TensorInfo& info, absl::Span<const uint8_t> bytes) {
  auto it = tensors_.find(info.name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("update weight: no tensor named '", info.name, "'"));
  }
  WeightTensor& t = it->second;
  if (info.shape != t.shape) {
    return absl::InvalidArgumentError(absl::StrCat("update weight '", info.name, "': shape ",
                                                   ShapeString(info.shape), ", expected ",
                                                   ShapeString(t.shape)));
  }
  std::optional<DType> src = model_io::ParseDType(info.dtype);
  if (!src || !model_io::IsFloatWeightDType(*src)) {
    return absl::InvalidArgumentError(absl::StrCat("update weight '", info.name, "': dtype '",
                                                   info.dtype, "' (want F32, BF16 or F16)"));
  }
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  if (static_cast<int64_t>(bytes.size()) != numel * model_io::DTypeSize(*src)) {
    return absl::InvalidArgumentError(absl::StrCat("update weight '", info.name,
                                                   "': ", bytes.size(), " bytes, expected ",
                                                   numel * model_io::DTypeSize(*src)));
  }
  auto buffer = std::make_unique<uint8_t[]>(static_cast<size_t>(t.num_bytes));
  if (*src == t.dtype) {
    std::memcpy(buffer.get(), bytes.data(), bytes.size());
  } else {
    std::vector<float> f32(static_cast<size_t>(numel));
    model_io::ConvertToF32(*src, bytes.data(), numel, f32.data());
    model_io::ConvertFromF32(f32.data(), numel, t.dtype, buffer.get());
  }
  t.data = buffer.get();
  owned_[info.name] = std::move(buffer);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Weights>> WeightsFromCheckpoint(model_io::Checkpoint checkpoint,
                                                               const model_io::ModelConfig& c) {
  auto w = std::unique_ptr<Weights>(new Weights());
  w->config_ = c;
  w->checkpoint_ = std::move(checkpoint);
  Weights* raw = w.get();
  return Weights::Build(std::move(w),
                        [raw](const std::string& name) { return raw->checkpoint_.Find(name); });
}

absl::StatusOr<std::unique_ptr<Weights>> WeightsFromOwnedTensors(std::vector<OwnedTensor> tensors,
                                                                 const model_io::ModelConfig& c) {
  auto w = std::unique_ptr<Weights>(new Weights());
  w->config_ = c;
  auto views = std::make_shared<std::map<std::string, model_io::TensorView>>();
  for (OwnedTensor& t : tensors) {
    const std::optional<DType> dtype = model_io::ParseDType(t.info.dtype);
    if (!dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: tensor '", t.info.name, "' has dtype ", t.info.dtype));
    }
    const absl::StatusOr<int64_t> numel = model_io::CheckedNumElements(t.info.shape);
    if (!numel.ok() || *numel * model_io::DTypeSize(*dtype) != t.num_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor '", t.info.name, "' has ",
                                                     t.num_bytes, " bytes for its shape"));
    }
    model_io::TensorView v;
    v.name = t.info.name;
    v.dtype = *dtype;
    v.shape = t.info.shape;
    v.data = absl::Span<const uint8_t>(t.data, static_cast<size_t>(t.num_bytes));
    (*views)[t.info.name] = std::move(v);
  }
  absl::StatusOr<std::unique_ptr<Weights>> out =
      Weights::Build(std::move(w), [views](const std::string& name) -> const model_io::TensorView* {
        auto it = views->find(name);
        return it == views->end() ? nullptr : &it->second;
      });
  if (!out.ok()) return out;
  // Keep the arenas of the served tensors only: one that holds nothing the architecture uses, or
  // only tensors Build copied for alignment, is released here (at the return, with `tensors`);
  // an arena stays whole while any tensor of it is served, and is kept once.
  Weights& built = **out;
  std::set<const void*> kept;
  for (const OwnedTensor& t : tensors) {
    if (t.owner == nullptr || !built.tensors_.contains(t.info.name) ||
        built.owned_.contains(t.info.name)) {
      continue;
    }
    if (kept.insert(t.owner.get()).second) built.arenas_.push_back(t.owner);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Weights>> Weights::Build(
    std::unique_ptr<Weights> w,
    const std::function<const model_io::TensorView*(const std::string&)>& find) {
  const model_io::ModelConfig& c = w->config_;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;

  auto need = [&](const std::string& name,
                  std::vector<int64_t> shape) -> absl::StatusOr<const WeightTensor*> {
    const model_io::TensorView* v = find(name);
    if (v == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights: missing tensor '", name, "' (expected shape ", ShapeString(shape), ")"));
    }
    if (v->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor '", name, "' has shape ",
                                                     ShapeString(v->shape), ", expected ",
                                                     ShapeString(shape)));
    }
    if (!model_io::IsFloatWeightDType(v->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor '", name, "' has dtype ",
                                                     model_io::DTypeName(v->dtype),
                                                     ", expected F32, BF16 or F16"));
    }
    WeightTensor t;
    t.name = name;
    t.dtype = v->dtype;
    t.shape = v->shape;
    t.num_bytes = static_cast<int64_t>(v->data.size());
    t.data = v->data.data();
    if (reinterpret_cast<uintptr_t>(t.data) % model_io::DTypeSize(t.dtype) != 0) {
      auto copy = std::make_unique<uint8_t[]>(v->data.size());
      std::memcpy(copy.get(), v->data.data(), v->data.size());
      t.data = copy.get();
      w->owned_[name] = std::move(copy);
    }
    auto [it, inserted] = w->tensors_.emplace(name, std::move(t));
    return &it->second;
  };

  ASSIGN_OR_RETURN(w->embed_, need("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights lw;
    ASSIGN_OR_RETURN(lw.input_norm, need(p + "input_layernorm.weight", {c.hidden_size}));
    ASSIGN_OR_RETURN(lw.q_proj, need(p + "self_attn.q_proj.weight", {q_dim, c.hidden_size}));
    ASSIGN_OR_RETURN(lw.k_proj, need(p + "self_attn.k_proj.weight", {kv_dim, c.hidden_size}));
    ASSIGN_OR_RETURN(lw.v_proj, need(p + "self_attn.v_proj.weight", {kv_dim, c.hidden_size}));
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(lw.q_bias, need(p + "self_attn.q_proj.bias", {q_dim}));
      ASSIGN_OR_RETURN(lw.k_bias, need(p + "self_attn.k_proj.bias", {kv_dim}));
      ASSIGN_OR_RETURN(lw.v_bias, need(p + "self_attn.v_proj.bias", {kv_dim}));
    }
    if (c.qk_norm) {
      ASSIGN_OR_RETURN(lw.q_norm, need(p + "self_attn.q_norm.weight", {c.head_dim}));
      ASSIGN_OR_RETURN(lw.k_norm, need(p + "self_attn.k_norm.weight", {c.head_dim}));
    }
    ASSIGN_OR_RETURN(lw.o_proj, need(p + "self_attn.o_proj.weight", {c.hidden_size, q_dim}));
    ASSIGN_OR_RETURN(lw.post_norm, need(p + "post_attention_layernorm.weight", {c.hidden_size}));
    if (c.IsMoeLayer(l)) {
      ASSIGN_OR_RETURN(lw.router, need(p + "mlp.gate.weight", {c.num_experts, c.hidden_size}));
      const int64_t inter = c.moe_intermediate_size;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        ASSIGN_OR_RETURN(const WeightTensor* g,
                         need(ep + "gate_proj.weight", {inter, c.hidden_size}));
        ASSIGN_OR_RETURN(const WeightTensor* u,
                         need(ep + "up_proj.weight", {inter, c.hidden_size}));
        ASSIGN_OR_RETURN(const WeightTensor* d,
                         need(ep + "down_proj.weight", {c.hidden_size, inter}));
        for (const WeightTensor* t : {g, u, d}) {
          const DType want = lw.expert_gate.empty() ? g->dtype : lw.expert_gate[0]->dtype;
          if (t->dtype != want) {
            return absl::InvalidArgumentError(absl::StrCat(
                "weights: tensor '", t->name, "' has dtype ", model_io::DTypeName(t->dtype),
                ", expected ", model_io::DTypeName(want), " like the layer's other experts"));
          }
        }
        lw.expert_gate.push_back(g);
        lw.expert_up.push_back(u);
        lw.expert_down.push_back(d);
      }
    } else {
      ASSIGN_OR_RETURN(lw.gate_proj,
                       need(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}));
      ASSIGN_OR_RETURN(lw.up_proj,
                       need(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}));
      ASSIGN_OR_RETURN(lw.down_proj,
                       need(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}));
    }
    w->layers_.push_back(lw);
  }
  ASSIGN_OR_RETURN(w->final_norm_, need("model.norm.weight", {c.hidden_size}));
  if (c.tie_word_embeddings) {
    w->lm_head_ = w->embed_;
  } else {
    ASSIGN_OR_RETURN(w->lm_head_, need("lm_head.weight", {c.vocab_size, c.hidden_size}));
  }
  return w;
}

namespace {

// The F32 copy of a 16-bit tensor (LM head, MoE router), converted on the host.
absl::Status UploadF32(const WeightTensor& src, Backend* backend, DeviceBuffer* buffer,
                       WeightTensor* out) {
  int64_t numel = 1;
  for (int64_t d : src.shape) numel *= d;
  std::vector<float> f32(static_cast<size_t>(numel));
  model_io::ConvertToF32(src.dtype, src.data, numel, f32.data());
  if (buffer->data() == nullptr) {
    ASSIGN_OR_RETURN(*buffer, backend->Allocate(numel * static_cast<int64_t>(sizeof(float))));
  }
  RETURN_IF_ERROR(backend->CopyToDevice(buffer->data(), f32.data(),
                                        numel * static_cast<int64_t>(sizeof(float))));
  *out = src;
  out->name = src.name + ".f32";
  out->dtype = DType::kF32;
  out->num_bytes = numel * static_cast<int64_t>(sizeof(float));
  out->data = buffer->data();
  return absl::OkStatus();
}

}  // namespace

// MirrorWeights (`upload`) or AllocateMirror (not: the memory only, F32 copies included).
absl::StatusOr<std::unique_ptr<Weights>> MirrorImpl(const Weights& host, Backend* backend,
                                                    bool fp32_lm_head, bool fp32_router,
                                                    bool upload) {
  if (backend == nullptr) return absl::InvalidArgumentError("MirrorWeights: null backend");
  auto m = std::unique_ptr<Weights>(new Weights());
  m->config_ = host.config_;
  for (const auto& [name, t] : host.tensors_) {
    ASSIGN_OR_RETURN(DeviceBuffer buffer, backend->Allocate(t.num_bytes));
    if (upload) RETURN_IF_ERROR(backend->CopyToDevice(buffer.data(), t.data, t.num_bytes));
    WeightTensor d = t;
    d.data = buffer.data();
    m->device_buffers_.push_back(std::move(buffer));
    m->tensors_.emplace(name, std::move(d));
  }
  const auto relink = [&](const WeightTensor* p) -> const WeightTensor* {
    return p == nullptr ? nullptr : &m->tensors_.at(p->name);
  };
  // A 16-bit tensor replaced by its FP32 copy (kept in f32_copies_ under the source's name).
  const auto f32_copy = [&](const WeightTensor* src) -> absl::StatusOr<const WeightTensor*> {
    if (src->dtype == DType::kF32) return relink(src);
    Weights::F32Copy& copy = m->f32_copies_[src->name];
    copy.tensor = std::make_unique<WeightTensor>();
    if (!upload) {
      const int64_t bytes =
          (src->num_bytes / model_io::DTypeSize(src->dtype)) * static_cast<int64_t>(sizeof(float));
      ASSIGN_OR_RETURN(copy.buffer, backend->Allocate(bytes));
      *copy.tensor = *src;
      copy.tensor->name = src->name + ".f32";
      copy.tensor->dtype = DType::kF32;
      copy.tensor->num_bytes = bytes;
      copy.tensor->data = copy.buffer.data();
      return copy.tensor.get();
    }
    RETURN_IF_ERROR(UploadF32(*src, backend, &copy.buffer, copy.tensor.get()));
    return copy.tensor.get();
  };
  m->embed_ = relink(host.embed_);
  m->lm_head_ = relink(host.lm_head_);
  m->final_norm_ = relink(host.final_norm_);
  for (const LayerWeights& hl : host.layers_) {
    LayerWeights l;
    for (auto [dst, src] : {std::pair{&l.input_norm, hl.input_norm},
                            {&l.q_proj, hl.q_proj},
                            {&l.k_proj, hl.k_proj},
                            {&l.v_proj, hl.v_proj},
                            {&l.q_bias, hl.q_bias},
                            {&l.k_bias, hl.k_bias},
                            {&l.v_bias, hl.v_bias},
                            {&l.q_norm, hl.q_norm},
                            {&l.k_norm, hl.k_norm},
                            {&l.o_proj, hl.o_proj},
                            {&l.post_norm, hl.post_norm},
                            {&l.gate_proj, hl.gate_proj},
                            {&l.up_proj, hl.up_proj},
                            {&l.down_proj, hl.down_proj},
                            {&l.router, hl.router}}) {
      *dst = relink(src);
    }
    for (auto [dst, src] : {std::pair{&l.expert_gate, &hl.expert_gate},
                            {&l.expert_up, &hl.expert_up},
                            {&l.expert_down, &hl.expert_down}}) {
      for (const WeightTensor* t : *src) dst->push_back(relink(t));
    }
    if (fp32_router && hl.router != nullptr) {
      ASSIGN_OR_RETURN(l.router, f32_copy(hl.router));
    }
    m->layers_.push_back(std::move(l));
  }
  if (fp32_lm_head) {
    ASSIGN_OR_RETURN(m->lm_head_, f32_copy(host.lm_head_));
  }
  return m;
}

absl::StatusOr<std::unique_ptr<Weights>> MirrorWeights(const Weights& host, Backend* backend,
                                                       bool fp32_lm_head, bool fp32_router) {
  return MirrorImpl(host, backend, fp32_lm_head, fp32_router, /*upload=*/true);
}

absl::StatusOr<std::unique_ptr<Weights>> AllocateMirror(const Weights& host, Backend* backend,
                                                        bool fp32_lm_head, bool fp32_router) {
  return MirrorImpl(host, backend, fp32_lm_head, fp32_router, /*upload=*/false);
}

absl::Status CopyMirror(const Weights& from, Backend* backend, Weights* to) {
  if (backend == nullptr || to == nullptr) {
    return absl::InvalidArgumentError("CopyMirror: null backend or mirror");
  }
  if (from.tensors_.size() != to->tensors_.size() ||
      from.f32_copies_.size() != to->f32_copies_.size()) {
    return absl::InternalError("CopyMirror: the mirrors hold different tensors");
  }
  for (const auto& [name, t] : from.tensors_) {
    auto it = to->tensors_.find(name);
    if (it == to->tensors_.end() || it->second.num_bytes != t.num_bytes) {
      return absl::InternalError(absl::StrCat("CopyMirror: tensor '", name, "' differs"));
    }
  }
  for (const auto& [name, c] : from.f32_copies_) {
    auto it = to->f32_copies_.find(name);
    if (it == to->f32_copies_.end() || it->second.tensor->num_bytes != c.tensor->num_bytes) {
      return absl::InternalError(absl::StrCat("CopyMirror: the FP32 copy of '", name, "' differs"));
    }
  }
  // Checked whole before the first byte moves: a refusal changes nothing.
  for (const auto& [name, t] : from.tensors_) {
    RETURN_IF_ERROR(
        backend->CopyOnDevice(const_cast<void*>(to->tensors_.at(name).data), t.data, t.num_bytes));
  }
  for (const auto& [name, c] : from.f32_copies_) {
    RETURN_IF_ERROR(backend->CopyOnDevice(to->f32_copies_.at(name).buffer.data(), c.buffer.data(),
                                          c.tensor->num_bytes));
  }
  return absl::OkStatus();
}

absl::Status RefreshMirror(const Weights& host, const std::string& name, Backend* backend,
                           Weights* mirror) {
  if (backend == nullptr || mirror == nullptr) {
    return absl::InvalidArgumentError("RefreshMirror: null backend or mirror");
  }
  if (!name.empty() && !host.tensors_.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("RefreshMirror: no tensor '", name, "'"));
  }
  // One tensor: found by name, not by a walk over every tensor (a staged copy refreshes them
  // one by one).
  const auto begin = name.empty() ? host.tensors_.begin() : host.tensors_.find(name);
  const auto end = name.empty() ? host.tensors_.end() : std::next(begin);
  for (auto h = begin; h != end; ++h) {
    const std::string& tensor_name = h->first;
    const WeightTensor& t = h->second;
    auto it = mirror->tensors_.find(tensor_name);
    if (it == mirror->tensors_.end() || it->second.num_bytes != t.num_bytes ||
        it->second.dtype != t.dtype) {
      return absl::InternalError(
          absl::StrCat("RefreshMirror: tensor '", tensor_name, "' does not match the mirror"));
    }
    RETURN_IF_ERROR(backend->CopyToDevice(const_cast<void*>(it->second.data), t.data, t.num_bytes));
    if (auto copy = mirror->f32_copies_.find(tensor_name); copy != mirror->f32_copies_.end()) {
      RETURN_IF_ERROR(UploadF32(t, backend, &copy->second.buffer, copy->second.tensor.get()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameArchitecture(const model_io::ModelConfig& a, const model_io::ModelConfig& b) {
  if (a.vocab_size != b.vocab_size || a.hidden_size != b.hidden_size ||
      a.intermediate_size != b.intermediate_size || a.num_hidden_layers != b.num_hidden_layers ||
      a.num_attention_heads != b.num_attention_heads ||
      a.num_key_value_heads != b.num_key_value_heads || a.head_dim != b.head_dim ||
      a.tie_word_embeddings != b.tie_word_embeddings || a.attention_bias != b.attention_bias ||
      a.qk_norm != b.qk_norm || a.num_experts != b.num_experts ||
      a.num_experts_per_tok != b.num_experts_per_tok ||
      a.moe_intermediate_size != b.moe_intermediate_size || a.norm_topk_prob != b.norm_topk_prob ||
      a.MoeLayers() != b.MoeLayers()) {
    return absl::InvalidArgumentError("weights were loaded for another architecture");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Weights>> LoadWeights(const std::string& model_dir,
                                                     const model_io::ModelConfig& config) {
  ASSIGN_OR_RETURN(model_io::Checkpoint ckpt, model_io::OpenCheckpoint(model_dir));
  return WeightsFromCheckpoint(std::move(ckpt), config);
}

}  // namespace rl::model
