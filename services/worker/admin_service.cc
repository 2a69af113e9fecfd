#include "services/worker/admin_service.h"

#include "common/grpc_status.h"
#include "services/worker/worker_server.h"

namespace rl::worker {
namespace {

// Finishes a unary call with `status` (OK or the error).
grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* AdminService::GetModelInfo(grpc::CallbackServerContext* context,
                                                     const rl::v1::GetModelInfoRequest*,
                                                     rl::v1::GetModelInfoResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  server_->FillModelInfo(response);
  return Finish(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetServerInfo(grpc::CallbackServerContext* context,
                                                      const rl::v1::GetServerInfoRequest*,
                                                      rl::v1::GetServerInfoResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  server_->FillServerInfo(response);
  return Finish(context, absl::OkStatus());
}

}  // namespace rl::worker
