// UpdateWeightsFromTensor streams in tests: the messages of a complete stream (the options in
// the first message, the chunks, the explicit end with its counts in the last one) and a sender
// over a synchronous stub. A stream without its end is never applied (docs/weight-updates.md),
// so tests that mean a complete stream send it through these.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "rl/v1/admin.grpc.pb.h"

namespace rl::testing {

// The end of a stream carrying `chunks`: distinct names and data bytes.
inline rl::v1::TensorStreamEnd StreamEnd(const std::vector<rl::v1::TensorChunk>& chunks) {
  std::set<std::string> names;
  int64_t bytes = 0;
  for (const auto& c : chunks) {
    names.insert(c.name());
    bytes += static_cast<int64_t>(c.data().size());
  }
  rl::v1::TensorStreamEnd end;
  end.set_num_tensors(static_cast<int64_t>(names.size()));
  end.set_num_bytes(bytes);
  return end;
}

// One message per chunk, `options` (its option fields) in the first, the end in the last (a
// message of its own when there is no chunk).
inline std::vector<rl::v1::UpdateWeightsFromTensorRequest> StreamMessages(
    const std::vector<rl::v1::TensorChunk>& chunks,
    const rl::v1::UpdateWeightsFromTensorRequest& options = {}) {
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> out;
  for (const auto& c : chunks) {
    rl::v1::UpdateWeightsFromTensorRequest m;
    if (out.empty()) m = options;
    *m.mutable_chunk() = c;
    out.push_back(std::move(m));
  }
  if (out.empty()) out.push_back(options);
  *out.back().mutable_end() = StreamEnd(chunks);
  return out;
}

// A chunk of `name` holding `data` at `offset`.
inline rl::v1::TensorChunk Chunk(const std::string& name, const std::vector<int64_t>& shape,
                                 const std::string& dtype, std::string data, uint64_t offset = 0) {
  rl::v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(dtype);
  for (int64_t d : shape) c.add_shape(d);
  c.set_offset(offset);
  c.set_data(std::move(data));
  return c;
}

// Writes `messages`, half-closes, returns the call's status.
inline grpc::Status SendMessages(
    rl::v1::Admin::StubInterface& stub, grpc::ClientContext* ctx,
    const std::vector<rl::v1::UpdateWeightsFromTensorRequest>& messages,
    rl::v1::AdminResponse* resp) {
  auto writer = stub.UpdateWeightsFromTensor(ctx, resp);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

// A complete stream of `chunks` (StreamMessages).
inline grpc::Status SendTensorStream(rl::v1::Admin::StubInterface& stub, grpc::ClientContext* ctx,
                                     const std::vector<rl::v1::TensorChunk>& chunks,
                                     rl::v1::AdminResponse* resp,
                                     const rl::v1::UpdateWeightsFromTensorRequest& options = {}) {
  return SendMessages(stub, ctx, StreamMessages(chunks, options), resp);
}

}  // namespace rl::testing
