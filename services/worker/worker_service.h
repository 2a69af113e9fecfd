// rl.v1.Worker on the worker: the generation data plane. Translates protos ⇄ engine requests;
// Generate streams chunks through a ServerWriteReactor (one write in flight, a queue behind
// it) and aborts the engine request when the client cancels or disconnects.
// docs/life-of-a-request.md follows one request through every layer, with file names.
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "common/auth.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/worker/generate_host.h"

namespace rl::worker {

class WorkerService final : public rl::v1::Worker::CallbackService {
 public:
  // What GetLoad reports of the process: `instance_id`, random per start (the router sees a
  // restart between two health checks), and `weights_sha256`, the digest of the weights served
  // when one is known (empty function or "": unknown; it must not hash the model).
  struct Identity {
    std::string instance_id;
    std::function<std::string()> weights_sha256;
  };

  WorkerService(GenerateHost* server, const BearerAuth* auth, Identity identity = {})
      : server_(server), auth_(auth), identity_(std::move(identity)) {}

  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const rl::v1::AbortRequest* request,
                                  rl::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const rl::v1::GetLoadRequest* request,
                                    rl::v1::GetLoadResponse* response) override;

 private:
  GenerateHost* server_;
  const BearerAuth* auth_;
  const Identity identity_;
};

}  // namespace rl::worker
