// rlctl's `workers` command: the router's worker pool (rl.v1.Router's worker RPCs, adopt
// included) and the resync of one worker (Admin.UpdateWeightsFromDisk with `workers`).
#include <iostream>
#include <string>
#include <vector>

#include "tools/rlctl/commands.h"

namespace rl::rlctl {

int Workers(const Options& o, const Client& c, const std::vector<std::string>& args) {
  const std::string sub = args.size() > 1 ? args[1] : "list";
  auto stub = c.router();
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  rl::v1::WorkerListResponse resp;
  grpc::Status status;
  const bool needs_addr = sub != "list";
  if (needs_addr && args.size() < 3) return Fail(o, Usage("workers " + sub + " ADDR"));
  if (sub == "resync") {
    // Brings workers (stale, or disabled with partial weights) to the fleet's version from a
    // folder: Admin.UpdateWeightsFromDisk with `workers` (docs/router-admin.md).
    if (o.from_disk.empty()) return Fail(o, Usage("workers resync ADDR... --from-disk DIR"));
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(o.from_disk);
    if (o.version >= 0) req.set_weight_version(o.version);
    req.set_abort_all_requests(o.abort_all);
    for (size_t i = 2; i < args.size(); ++i) req.add_workers(args[i]);
    rl::v1::AdminResponse admin_resp;
    // success: false (refused or failed on the worker) exits 1, as every admin command.
    return PrintAdminResponse(o, c.admin()->UpdateWeightsFromDisk(&ctx, req, &admin_resp),
                              admin_resp);
  }
  if (sub == "list") {
    status = stub->ListWorkers(&ctx, rl::v1::ListWorkersRequest(), &resp);
  } else if (sub == "add") {
    rl::v1::AddWorkerRequest req;
    req.set_address(args[2]);
    req.set_allow_unreachable(o.allow_unreachable);
    status = stub->AddWorker(&ctx, req, &resp);
  } else if (sub == "remove") {
    rl::v1::RemoveWorkerRequest req;
    req.set_address(args[2]);
    status = stub->RemoveWorker(&ctx, req, &resp);
  } else if (sub == "adopt") {
    // The operator's decision on a worker ahead of the fleet's version: its version becomes the
    // fleet's (--from-disk: the folder that holds it, from which the others catch up).
    rl::v1::AdoptWorkerVersionRequest req;
    req.set_address(args[2]);
    req.set_model_path(o.from_disk);
    status = stub->AdoptWorkerVersion(&ctx, req, &resp);
  } else if (sub == "enable" || sub == "disable") {
    rl::v1::SetWorkerEnabledRequest req;
    req.set_address(args[2]);
    req.set_enabled(sub == "enable");
    status = stub->SetWorkerEnabled(&ctx, req, &resp);
  } else {
    return Fail(o,
                Usage("workers list|add ADDR [--allow-unreachable]|remove ADDR|enable ADDR|"
                      "disable ADDR|resync ADDR... --from-disk DIR|adopt ADDR [--from-disk DIR]"));
  }
  return Print<rl::v1::WorkerListResponse>(o, status, resp, [](const auto& r) {
    for (const auto& w : r.workers()) {
      std::cout << w.address() << "  " << rl::v1::WorkerState_Name(w.state())
                << (w.enabled() ? "" : "  disabled") << "  in_flight " << w.in_flight() << "  v"
                << w.weight_version() << (w.version_mismatch() ? "  VERSION MISMATCH" : "")
                << (w.reason().empty() ? "" : "  (" + w.reason() + ")") << "\n";
    }
    if (!r.fleet_weight_source().empty()) {
      std::cout << "fleet weights: v" << r.fleet_weight_version() << " from "
                << r.fleet_weight_source() << "\n";
    }
  });
}

}  // namespace rl::rlctl
