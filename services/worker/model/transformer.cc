#include "services/worker/model/transformer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::model {

int64_t Transformer::KvBytesPerSlot(const model_io::ModelConfig& c, model_io::DType kv_dtype) {
  return c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim *
         model_io::DTypeSize(kv_dtype);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(
    const model_io::ModelConfig& config, Backend* backend, int64_t num_kv_slots, bool use_graphs,
    model_io::DType kv_dtype) {
  if (num_kv_slots <= 0) return absl::InvalidArgumentError("num_kv_slots must be positive");
  if (!model_io::IsFloatWeightDType(kv_dtype)) {
    return absl::InvalidArgumentError("the KV cache dtype must be F32, BF16 or F16");
  }
  auto t = std::unique_ptr<Transformer>(new Transformer(config, backend, num_kv_slots));
  t->use_graphs_ = use_graphs && backend->supports_graphs();
  t->kv_dtype_ = kv_dtype;
  t->num_moe_layers_ = static_cast<int64_t>(config.MoeLayers().size());
  // One slot past the end is the scratch slot that graph padding tokens write.
  const int64_t layer_bytes = (num_kv_slots + 1) * config.num_key_value_heads * config.head_dim *
                              model_io::DTypeSize(kv_dtype);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    ASSIGN_OR_RETURN(DeviceBuffer k, backend->AllocateKvCache(layer_bytes));
    ASSIGN_OR_RETURN(DeviceBuffer v, backend->AllocateKvCache(layer_bytes));
    t->k_cache_.push_back(std::move(k));
    t->v_cache_.push_back(std::move(v));
  }
  return t;
}

std::vector<absl::Span<const uint8_t>> Transformer::KvCacheBytes() const {
  std::vector<absl::Span<const uint8_t>> out;
  for (const std::vector<DeviceBuffer>* cache : {&k_cache_, &v_cache_}) {
    for (const DeviceBuffer& b : *cache) {
      out.emplace_back(static_cast<const uint8_t*>(b.data()), static_cast<size_t>(b.bytes()));
    }
  }
  return out;
}

absl::Status Transformer::Reserve(DeviceBuffer* buffer, int64_t bytes) {
  if (buffer->data() != nullptr && buffer->bytes() >= bytes) return absl::OkStatus();
  if (!graphs_.empty()) {
    // Captured graphs hold the old address.
    backend_->DropGraphs();
    graphs_.clear();
  }
  const int64_t grown = std::max<int64_t>(bytes, buffer->bytes() + buffer->bytes() / 2);
  ASSIGN_OR_RETURN(*buffer, backend_->Allocate(std::max<int64_t>(grown, 64)));
  return absl::OkStatus();
}

absl::Status Transformer::Validate(const ForwardInput& in) const {
  const int64_t max_pos = config_.max_position_embeddings;
  for (size_t i = 0; i < in.seqs.size(); ++i) {
    const SequenceInput& s = in.seqs[i];
    const std::string where = absl::StrCat("seqs[", i, "]");
    if (s.token_ids.empty()) return absl::InvalidArgumentError(where + ".token_ids is empty");
    if (s.start_pos < 0) return absl::InvalidArgumentError(where + ".start_pos is negative");
    const int64_t end =
        static_cast<int64_t>(s.start_pos) + static_cast<int64_t>(s.token_ids.size());
    if (end > max_pos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": positions up to ", end - 1, " exceed the context of ", max_pos, " tokens"));
    }
    if (static_cast<int64_t>(s.kv_slots.size()) != end) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".kv_slots has ", s.kv_slots.size(),
                       " entries, expected start_pos + tokens = ", end));
    }
    for (size_t j = 0; j < s.kv_slots.size(); ++j) {
      if (s.kv_slots[j] < 0 || s.kv_slots[j] >= num_kv_slots_) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".kv_slots[", j,
                                                       "] = ", s.kv_slots[j], " out of range [0, ",
                                                       num_kv_slots_, ")"));
      }
    }
    for (size_t j = 0; j < s.token_ids.size(); ++j) {
      if (s.token_ids[j] < 0 || s.token_ids[j] >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".token_ids[", j,
                                                       "] = ", s.token_ids[j], " out of range [0, ",
                                                       config_.vocab_size, ")"));
      }
    }
    if (s.logits != LogitsMode::kNone && s.logits != LogitsMode::kLast &&
        s.logits != LogitsMode::kAll) {
      return absl::InvalidArgumentError(where + ".logits is not a LogitsMode");
    }
  }
  return absl::OkStatus();
}

bool Transformer::GraphEligible(const ForwardInput& in) const {
  if (!use_graphs_ || config_.IsMoe() || in.seqs.empty() ||
      static_cast<int64_t>(in.seqs.size()) > kGraphBatchSizes.back()) {
    return false;
  }
  for (const SequenceInput& s : in.seqs) {
    if (s.token_ids.size() != 1 || s.logits != LogitsMode::kLast) return false;
  }
  return true;
}

absl::Status Transformer::Forward(const Weights& w, const ForwardInput& in, ForwardOutput* out) {
  RETURN_IF_ERROR(Validate(in));
  const model_io::ModelConfig& c = config_;
  const int64_t half = rope_.half_dim();

  // ---- Step plan (host) ----
  h_ids_.clear();
  h_write_slots_.clear();
  h_context_len_.clear();
  h_slot_begin_.clear();
  h_slots_.clear();
  h_logit_rows_.clear();
  h_cos_.clear();
  h_sin_.clear();
  out->vocab_size = c.vocab_size;
  out->row_begin.assign(1, 0);
  for (const SequenceInput& s : in.seqs) {
    const int32_t begin = static_cast<int32_t>(h_slots_.size());
    h_slots_.insert(h_slots_.end(), s.kv_slots.begin(), s.kv_slots.end());
    const int32_t first_token = static_cast<int32_t>(h_ids_.size());
    const int32_t n = static_cast<int32_t>(s.token_ids.size());
    const int64_t seq_len = s.start_pos + static_cast<int64_t>(n);
    for (int32_t i = 0; i < n; ++i) {
      h_ids_.push_back(s.token_ids[static_cast<size_t>(i)]);
      h_write_slots_.push_back(s.kv_slots[static_cast<size_t>(s.start_pos + i)]);
      h_context_len_.push_back(s.start_pos + i + 1);
      h_slot_begin_.push_back(begin);
      h_cos_.resize(h_cos_.size() + static_cast<size_t>(half));
      h_sin_.resize(h_sin_.size() + static_cast<size_t>(half));
      rope_.Fill(s.start_pos + i, seq_len, &h_cos_[h_cos_.size() - half],
                 &h_sin_[h_sin_.size() - half]);
    }
    if (s.logits == LogitsMode::kLast) {
      h_logit_rows_.push_back(first_token + n - 1);
    } else if (s.logits == LogitsMode::kAll) {
      for (int32_t i = 0; i < n; ++i) h_logit_rows_.push_back(first_token + i);
    }
    out->row_begin.push_back(static_cast<int64_t>(h_logit_rows_.size()));
  }
  const int64_t num_real_rows = static_cast<int64_t>(h_logit_rows_.size());
  out->logits.assign(static_cast<size_t>(num_real_rows * c.vocab_size), 0.0f);
  if (h_ids_.empty()) return absl::OkStatus();
  int64_t batch_max_context = *std::max_element(h_context_len_.begin(), h_context_len_.end());

  // ---- Decode steps replay a CUDA graph captured for (padded batch, attention splits) ----
  const bool graph = GraphEligible(in);
  GraphKey key{0, 0};
  if (graph) {
    const int64_t real = static_cast<int64_t>(in.seqs.size());
    const int64_t bucket =
        *std::lower_bound(kGraphBatchSizes.begin(), kGraphBatchSizes.end(), real);
    // Padding tokens write the scratch slot and attend to it alone; their rows are dropped.
    const int32_t scratch_entry = static_cast<int32_t>(h_slots_.size());
    h_slots_.push_back(static_cast<int32_t>(num_kv_slots_));
    for (int64_t t = real; t < bucket; ++t) {
      h_ids_.push_back(0);
      h_write_slots_.push_back(static_cast<int32_t>(num_kv_slots_));
      h_context_len_.push_back(1);
      h_slot_begin_.push_back(scratch_entry);
      h_cos_.resize(h_cos_.size() + static_cast<size_t>(half));
      h_sin_.resize(h_sin_.size() + static_cast<size_t>(half));
      rope_.Fill(0, 1, &h_cos_[h_cos_.size() - half], &h_sin_[h_sin_.size() - half]);
      h_logit_rows_.push_back(static_cast<int32_t>(t));
    }
    // The attention grid covers a power-of-two number of splits (the kernel skips the empty
    // ones), so one graph serves every context up to that length.
    int64_t splits = 1;
    while (splits * kGraphContextQuantum < batch_max_context) splits *= 2;
    batch_max_context = splits * kGraphContextQuantum;
    key = {bucket, splits};
  }
  const int64_t num_tokens = static_cast<int64_t>(h_ids_.size());
  const int64_t num_rows = static_cast<int64_t>(h_logit_rows_.size());

  // ---- Buffers (fixed addresses between graph captures) and the plan upload ----
  RETURN_IF_ERROR(ReserveAll(num_tokens, num_rows));
  const int64_t f = sizeof(float);
  const int64_t i32 = sizeof(int32_t);
  RETURN_IF_ERROR(backend_->CopyToDevice(ids_.data(), h_ids_.data(), num_tokens * i32));
  RETURN_IF_ERROR(
      backend_->CopyToDevice(write_slots_.data(), h_write_slots_.data(), num_tokens * i32));
  RETURN_IF_ERROR(
      backend_->CopyToDevice(context_len_.data(), h_context_len_.data(), num_tokens * i32));
  RETURN_IF_ERROR(
      backend_->CopyToDevice(slot_begin_.data(), h_slot_begin_.data(), num_tokens * i32));
  RETURN_IF_ERROR(backend_->CopyToDevice(slots_.data(), h_slots_.data(),
                                         static_cast<int64_t>(h_slots_.size()) * i32));
  RETURN_IF_ERROR(backend_->CopyToDevice(logit_rows_.data(), h_logit_rows_.data(), num_rows * i32));
  RETURN_IF_ERROR(backend_->CopyToDevice(cos_.data(), h_cos_.data(), num_tokens * half * f));
  RETURN_IF_ERROR(backend_->CopyToDevice(sin_.data(), h_sin_.data(), num_tokens * half * f));

  if (graph) {
    RETURN_IF_ERROR(RunGraph(w, key, batch_max_context));
  } else {
    RETURN_IF_ERROR(Compute(w, num_tokens, num_rows, batch_max_context));
  }
  out->routed_experts.clear();
  out->routed_weights.clear();
  if (in.return_routing && num_moe_layers_ > 0) RETURN_IF_ERROR(CopyRouting(num_tokens, out));
  if (num_real_rows == 0) return absl::OkStatus();
  return backend_->CopyToHost(out->logits.data(), logits_.data(), num_real_rows * c.vocab_size * f);
}

absl::Status Transformer::ReserveAll(int64_t num_tokens, int64_t num_rows) {
  const model_io::ModelConfig& c = config_;
  const int64_t half = rope_.half_dim();
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  const int64_t f = sizeof(float);
  const int64_t i32 = sizeof(int32_t);
  const int64_t rows = std::max<int64_t>(1, num_rows);
  RETURN_IF_ERROR(Reserve(&ids_, num_tokens * i32));
  RETURN_IF_ERROR(Reserve(&write_slots_, num_tokens * i32));
  RETURN_IF_ERROR(Reserve(&context_len_, num_tokens * i32));
  RETURN_IF_ERROR(Reserve(&slot_begin_, num_tokens * i32));
  RETURN_IF_ERROR(Reserve(&slots_, static_cast<int64_t>(h_slots_.size()) * i32));
  RETURN_IF_ERROR(Reserve(&logit_rows_, rows * i32));
  RETURN_IF_ERROR(Reserve(&cos_, num_tokens * half * f));
  RETURN_IF_ERROR(Reserve(&sin_, num_tokens * half * f));
  RETURN_IF_ERROR(Reserve(&x_, num_tokens * hidden * f));
  RETURN_IF_ERROR(Reserve(&h_, num_tokens * hidden * f));
  RETURN_IF_ERROR(Reserve(&q_, num_tokens * q_dim * f));
  RETURN_IF_ERROR(Reserve(&k_, num_tokens * kv_dim * f));
  RETURN_IF_ERROR(Reserve(&v_, num_tokens * kv_dim * f));
  RETURN_IF_ERROR(Reserve(&attn_, num_tokens * q_dim * f));
  RETURN_IF_ERROR(Reserve(&gate_, num_tokens * c.intermediate_size * f));
  RETURN_IF_ERROR(Reserve(&up_, num_tokens * c.intermediate_size * f));
  RETURN_IF_ERROR(Reserve(&final_, rows * hidden * f));
  RETURN_IF_ERROR(Reserve(&logits_, rows * c.vocab_size * f));
  if (num_moe_layers_ > 0) {
    const int64_t routes = num_moe_layers_ * num_tokens * c.num_experts_per_tok;
    RETURN_IF_ERROR(Reserve(&router_logits_, num_tokens * c.num_experts * f));
    RETURN_IF_ERROR(Reserve(&route_ids_, routes * i32));
    RETURN_IF_ERROR(Reserve(&route_weights_, routes * f));
    RETURN_IF_ERROR(Reserve(&moe_out_, num_tokens * hidden * f));
  }
  return Reserve(&workspace_, backend_->num_threads() * c.max_position_embeddings * f);
}

absl::Status Transformer::RunGraph(const Weights& w, GraphKey key, int64_t batch_max_context) {
  const int64_t num_tokens = key.first;
  if (graph_weights_ != &w) {
    // Graphs hold the weights' device addresses.
    backend_->DropGraphs();
    graphs_.clear();
    graph_weights_ = &w;
  }
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    absl::Status replayed = backend_->ReplayGraph(it->second);
    if (!absl::IsNotFound(replayed)) return replayed;
    graphs_.clear();  // the backend dropped its graphs (a workspace moved): capture again
  }
  // First time for this shape: run eagerly (which also sizes every workspace the capture will
  // use, so nothing is allocated while capturing), then record the same work.
  RETURN_IF_ERROR(Compute(w, num_tokens, num_tokens, batch_max_context));
  RETURN_IF_ERROR(backend_->BeginGraphCapture());
  absl::Status captured = Compute(w, num_tokens, num_tokens, batch_max_context);
  absl::StatusOr<int> graph = backend_->EndGraphCapture(captured);
  if (!graph.ok()) {
    // This step's logits are already computed; run eagerly from now on.
    use_graphs_ = false;
    return absl::OkStatus();
  }
  graphs_[key] = *graph;
  return absl::OkStatus();
}

absl::Status Transformer::Compute(const Weights& w, int64_t num_tokens, int64_t num_rows,
                                  int64_t batch_max_context) {
  const model_io::ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  kernels::EmbeddingParams emb;
  emb.table = w.embed().data;
  emb.table_dtype = w.embed().dtype;
  emb.ids = ids_.i32();
  emb.out = x_.f32();
  emb.num_tokens = num_tokens;
  emb.num_rows = c.vocab_size;
  emb.dim = hidden;
  RETURN_IF_ERROR(backend_->Embedding(emb));
  RETURN_IF_ERROR(RunLayers(w, num_tokens, batch_max_context));
  if (num_rows == 0) return absl::OkStatus();

  // ---- Final norm and LM head on the rows asked for ----
  RETURN_IF_ERROR(
      backend_->GatherRows(x_.f32(), logit_rows_.i32(), num_rows, hidden, final_.f32()));
  kernels::RmsNormParams norm;
  norm.x = final_.f32();
  norm.w = w.final_norm().data;
  norm.w_dtype = w.final_norm().dtype;
  norm.y = final_.f32();
  norm.rows = num_rows;
  norm.dim = hidden;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  RETURN_IF_ERROR(backend_->RmsNorm(norm));
  kernels::MatmulParams head;
  head.x = final_.f32();
  head.w = w.lm_head().data;
  head.w_dtype = w.lm_head().dtype;
  head.y = logits_.f32();
  head.m = num_rows;
  head.n = c.vocab_size;
  head.k = hidden;
  return backend_->Matmul(head);
}

absl::Status Transformer::RunLayers(const Weights& w, int64_t num_tokens,
                                    int64_t batch_max_context) {
  const model_io::ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);

  auto norm_params = [&](const float* x, const WeightTensor& wt, int64_t rows, int64_t dim,
                         float* y) {
    kernels::RmsNormParams p;
    p.x = x;
    p.w = wt.data;
    p.w_dtype = wt.dtype;
    p.y = y;
    p.rows = rows;
    p.dim = dim;
    p.eps = eps;
    return p;
  };
  auto norm = [&](const float* x, const WeightTensor& wt, int64_t rows, int64_t dim, float* y) {
    return backend_->RmsNorm(norm_params(x, wt, rows, dim, y));
  };
  // x += delta, then h = RmsNorm(x) with `wt` (one fused pass on device backends).
  auto add_norm = [&](const float* delta, const WeightTensor& wt) {
    return backend_->AddRmsNorm(delta, norm_params(x_.f32(), wt, num_tokens, hidden, h_.f32()));
  };
  auto linear_params = [&](const float* x, const WeightTensor& wt, const WeightTensor* bias,
                           float* y) {
    kernels::MatmulParams p;
    p.x = x;
    p.w = wt.data;
    p.w_dtype = wt.dtype;
    if (bias != nullptr) {
      p.bias = bias->data;
      p.bias_dtype = bias->dtype;
    }
    p.y = y;
    p.m = num_tokens;
    p.n = wt.shape[0];
    p.k = wt.shape[1];
    return p;
  };
  auto linear = [&](const float* x, const WeightTensor& wt, const WeightTensor* bias, float* y) {
    return backend_->Matmul(linear_params(x, wt, bias, y));
  };

  // h = input norm of layer 0; every later norm is fused with the residual add before it.
  RETURN_IF_ERROR(norm(x_.f32(), *w.layer(0).input_norm, num_tokens, hidden, h_.f32()));
  int64_t moe_index = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& lw = w.layer(l);
    const kernels::MatmulParams qkv[] = {linear_params(h_.f32(), *lw.q_proj, lw.q_bias, q_.f32()),
                                         linear_params(h_.f32(), *lw.k_proj, lw.k_bias, k_.f32()),
                                         linear_params(h_.f32(), *lw.v_proj, lw.v_bias, v_.f32())};
    RETURN_IF_ERROR(backend_->MatmulGroup(qkv));
    if (lw.q_norm != nullptr) {
      RETURN_IF_ERROR(
          norm(q_.f32(), *lw.q_norm, num_tokens * c.num_attention_heads, c.head_dim, q_.f32()));
      RETURN_IF_ERROR(
          norm(k_.f32(), *lw.k_norm, num_tokens * c.num_key_value_heads, c.head_dim, k_.f32()));
    }
    kernels::RopeParams rope;
    rope.q = q_.f32();
    rope.k = k_.f32();
    rope.cos = cos_.f32();
    rope.sin = sin_.f32();
    rope.num_tokens = num_tokens;
    rope.num_heads = c.num_attention_heads;
    rope.num_kv_heads = c.num_key_value_heads;
    rope.head_dim = c.head_dim;
    rope.q_stride = q_dim;
    rope.k_stride = kv_dim;
    RETURN_IF_ERROR(backend_->Rope(rope));

    kernels::WriteKvParams kv;
    kv.k = k_.f32();
    kv.v = v_.f32();
    kv.slots = write_slots_.i32();
    kv.k_cache = k_cache_[static_cast<size_t>(l)].data();
    kv.v_cache = v_cache_[static_cast<size_t>(l)].data();
    kv.kv_dtype = kv_dtype_;
    kv.num_tokens = num_tokens;
    kv.kv_dim = kv_dim;
    kv.k_stride = kv_dim;
    kv.v_stride = kv_dim;
    kv.num_slots = num_kv_slots_ + 1;  // with the scratch slot
    RETURN_IF_ERROR(backend_->WriteKv(kv));

    kernels::AttentionParams at;
    at.q = q_.f32();
    at.k_cache = kv.k_cache;
    at.v_cache = kv.v_cache;
    at.kv_dtype = kv_dtype_;
    at.out = attn_.f32();
    at.context_len = context_len_.i32();
    at.slot_begin = slot_begin_.i32();
    at.slots = slots_.i32();
    at.workspace = workspace_.f32();
    at.num_workspaces = backend_->num_threads();
    at.num_tokens = num_tokens;
    at.num_heads = c.num_attention_heads;
    at.num_kv_heads = c.num_key_value_heads;
    at.head_dim = c.head_dim;
    at.q_stride = q_dim;
    at.num_slots = num_kv_slots_ + 1;
    // The slot table's capacity, not this step's entries: a captured graph replays these
    // params while the table's contents (bounded by context_len) change from step to step.
    at.num_slot_entries = slots_.bytes() / static_cast<int64_t>(sizeof(int32_t));
    at.max_context = c.max_position_embeddings;
    at.batch_max_context = batch_max_context;
    at.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    RETURN_IF_ERROR(backend_->Attention(at));

    RETURN_IF_ERROR(linear(attn_.f32(), *lw.o_proj, nullptr, h_.f32()));
    RETURN_IF_ERROR(add_norm(h_.f32(), *lw.post_norm));
    const float* mlp_out = h_.f32();
    if (lw.router != nullptr) {
      RETURN_IF_ERROR(RunMoe(lw, moe_index++, num_tokens));
      mlp_out = moe_out_.f32();
    } else {
      const kernels::MatmulParams gate_up[] = {
          linear_params(h_.f32(), *lw.gate_proj, nullptr, gate_.f32()),
          linear_params(h_.f32(), *lw.up_proj, nullptr, up_.f32())};
      RETURN_IF_ERROR(backend_->MatmulGroup(gate_up));
      kernels::SiluMulParams act;
      act.gate = gate_.f32();
      act.up = up_.f32();
      act.out = gate_.f32();
      act.n = num_tokens * c.intermediate_size;
      RETURN_IF_ERROR(backend_->SiluMul(act));
      RETURN_IF_ERROR(linear(gate_.f32(), *lw.down_proj, nullptr, h_.f32()));
    }
    if (l + 1 < c.num_hidden_layers) {
      RETURN_IF_ERROR(add_norm(mlp_out, *w.layer(l + 1).input_norm));
    } else {
      RETURN_IF_ERROR(backend_->AddInPlace(mlp_out, x_.f32(), num_tokens * hidden));
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::model
