// rl.v1.Worker on the worker: the generation data plane. Translates protos ⇄ engine requests;
// Generate streams chunks through a ServerWriteReactor (one write in flight, a queue behind
// it) and aborts the engine request when the client cancels or disconnects.
// docs/life-of-a-request.md follows one request through every layer, with file names.
#pragma once

#include "common/auth.h"
#include "rl/v1/worker.grpc.pb.h"
#include "services/worker/generate_host.h"

namespace rl::worker {

class WorkerService final : public rl::v1::Worker::CallbackService {
 public:
  WorkerService(GenerateHost* server, const BearerAuth* auth) : server_(server), auth_(auth) {}

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
};

}  // namespace rl::worker
