// rlctl's plumbing shared by every command family: the gRPC channel to --target (deadline and
// bearer key per call), and the printing of answers and errors (human-readable, or exactly one
// JSON object with --json). Exit statuses: 0 success, 1 a failed call, 2 bad usage.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc_status.h"
#include "google/protobuf/message.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "nlohmann/json.hpp"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "rl/v1/worker.grpc.pb.h"
#include "tools/rlctl/options.h"

namespace rl::rlctl {

using Json = nlohmann::json;

// One channel to `options.target`; stubs are cheap and made per call.
class Client {
 public:
  explicit Client(const Options& o);
  // Sets the call's deadline (--timeout) and the bearer key (when given).
  void Prepare(grpc::ClientContext* ctx) const;
  std::unique_ptr<rl::v1::Admin::Stub> admin() const { return rl::v1::Admin::NewStub(channel_); }
  std::unique_ptr<rl::v1::Router::Stub> router() const { return rl::v1::Router::NewStub(channel_); }
  std::unique_ptr<rl::v1::Worker::Stub> worker() const { return rl::v1::Worker::NewStub(channel_); }
  std::unique_ptr<grpc::health::v1::Health::Stub> health() const {
    return grpc::health::v1::Health::NewStub(channel_);
  }

 private:
  const Options& o_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A message as JSON with every field and the proto field names ("{}" when it cannot print).
std::string ToJson(const google::protobuf::Message& m);

// Prints an error (as {"error": {...}} with --json) and returns exit status 1 (2 for usage).
int Fail(const Options& o, const absl::Status& status);

// INVALID_ARGUMENT "usage: WHAT" (Fail turns it into exit status 2).
absl::Status Usage(const std::string& what);

// Prints a call's response: JSON, or the human form from `human` (default: the JSON
// pretty-printed); a failed call goes to Fail.
template <typename Response>
int Print(const Options& o, const grpc::Status& status, const Response& response,
          const std::function<void(const Response&)>& human = nullptr) {
  if (!status.ok()) return Fail(o, FromGrpcStatus(status));
  if (o.json || !human) {
    const std::string text = ToJson(response);
    std::cout << (o.json ? text : Json::parse(text).dump(2)) << "\n";
  } else {
    human(response);
  }
  return 0;
}

// An AdminResponse in the human form: the outcome, then one line per worker.
void PrintAdmin(const rl::v1::AdminResponse& r);

// An admin call whose answer says success: false (a broadcast that failed on some worker)
// failed: the answer is printed as usual and the exit status is 1.
int PrintAdminResponse(const Options& o, const grpc::Status& status,
                       const rl::v1::AdminResponse& r);

// One Admin call answered with an AdminResponse: calls `method` of the Admin stub with `req`
// under the client's deadline and key, prints the answer, returns the exit code.
template <typename Request>
int AdminCall(const Options& o, const Client& c, const Request& req,
              grpc::Status (rl::v1::Admin::Stub::*method)(grpc::ClientContext*, const Request&,
                                                          rl::v1::AdminResponse*)) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::AdminResponse resp;
  return PrintAdminResponse(o, (c.admin().get()->*method)(&ctx, req, &resp), resp);
}

// "1,2,3" as ids; INVALID_ARGUMENT naming the part that is not an integer.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text);

}  // namespace rl::rlctl
