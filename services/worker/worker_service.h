// rl.v1.Worker on the worker: the generation data plane. Translates protos ⇄ engine requests;
// streams chunks with a ServerWriteReactor and aborts the request when the client cancels.
#pragma once

#include "common/auth.h"
#include "rl/v1/worker.grpc.pb.h"

namespace rl::worker {

class WorkerServer;

class WorkerService final : public rl::v1::Worker::CallbackService {
 public:
  WorkerService(WorkerServer* server, const BearerAuth* auth) : server_(server), auth_(auth) {}

 private:
  WorkerServer* server_;
  const BearerAuth* auth_;
};

}  // namespace rl::worker
