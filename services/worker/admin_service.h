// rl.v1.Admin on the worker: translates protos ⇄ domain calls on the WorkerServer. Every call is
// checked against the admin key first. Calls not built yet answer UNIMPLEMENTED (the default of
// the generated CallbackService).
#pragma once

#include "common/auth.h"
#include "rl/v1/admin.grpc.pb.h"

namespace rl::worker {

class WorkerServer;

class AdminService final : public rl::v1::Admin::CallbackService {
 public:
  AdminService(WorkerServer* server, const BearerAuth* auth) : server_(server), auth_(auth) {}

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const rl::v1::GetModelInfoRequest* request,
                                         rl::v1::GetModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const rl::v1::GetServerInfoRequest* request,
                                          rl::v1::GetServerInfoResponse* response) override;

 private:
  WorkerServer* server_;
  const BearerAuth* auth_;
};

}  // namespace rl::worker
