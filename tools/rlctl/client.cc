#include "tools/rlctl/client.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace rl::rlctl {

Client::Client(const Options& o) : o_(o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(512 << 20);
  args.SetMaxSendMessageSize(512 << 20);
  channel_ = grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args);
}

void Client::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000)));
  if (!o_.api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + o_.api_key);
}

std::string ToJson(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) out = "{}";
  return out;
}

int Fail(const Options& o, const absl::Status& status) {
  const bool usage = status.code() == absl::StatusCode::kInvalidArgument &&
                     absl::StartsWith(status.message(), "usage:");
  if (o.json) {
    Json err = {{"error",
                 {{"code", absl::StatusCodeToString(status.code())},
                  {"message", std::string(status.message())}}}};
    std::cout << err.dump() << "\n";
  } else {
    std::cerr << "rlctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
              << "\n";
  }
  return usage ? 2 : 1;
}

absl::Status Usage(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("usage: ", what));
}

void PrintAdmin(const rl::v1::AdminResponse& r) {
  std::cout << (r.success() ? "ok" : "FAILED") << (r.message().empty() ? "" : ": ") << r.message()
            << " (weight_version " << r.weight_version() << ")\n";
  for (const auto& w : r.results()) {
    std::cout << "  " << w.worker() << "  " << w.code() << "  v" << w.weight_version() << "  "
              << w.message() << (w.left_out() ? "  [left out of routing]" : "") << "\n";
  }
}

int PrintAdminResponse(const Options& o, const grpc::Status& status,
                       const rl::v1::AdminResponse& r) {
  const int rc = Print<rl::v1::AdminResponse>(o, status, r, PrintAdmin);
  return rc == 0 && !r.success() ? 1 : rc;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: '", std::string(part), "' is not an integer"));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace rl::rlctl
