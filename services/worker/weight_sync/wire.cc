#include "services/worker/weight_sync/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "rl/v1/weight_sync.pb.h"
#include "services/worker/weight_sync/crc32c.h"

namespace rl::weight_sync {
namespace {

constexpr size_t kMaxString = size_t{1} << 20;
constexpr int kMaxDims = 64;

using Message = rl::v1::WeightSyncMessage;

absl::StatusCode CodeFromWire(int32_t code) {
  if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

const char* KindName(Message::KindCase kind) {
  switch (kind) {
    case Message::kHello:
      return "hello";
    case Message::kWelcome:
      return "welcome";
    case Message::kBucket:
      return "bucket header";
    case Message::kClose:
      return "close";
    case Message::kAck:
      return "ack";
    default:
      return "empty message";
  }
}

// Parses `body` as a WeightSyncMessage of kind `want`. DATA_LOSS when it does not parse (the
// frame's CRC matched, so the peer sent it: not a weight-sync peer, or a bug), INVALID_ARGUMENT
// for another kind of message.
absl::StatusOr<Message> Parse(const std::string& body, Message::KindCase want, const char* what) {
  Message msg;
  if (!msg.ParseFromString(body)) {
    return absl::DataLossError(
        absl::StrCat(what, ": not a weight-sync message (", body.size(), " bytes do not parse)"));
  }
  if (msg.kind_case() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a ", KindName(want), ", got ", KindName(msg.kind_case())));
  }
  return msg;
}

absl::Status CheckProtocol(rl::v1::WeightSyncProtocol protocol, const char* what) {
  if (protocol != kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": protocol version ",
                                                   static_cast<int>(protocol),
                                                   ", this build speaks ", kProtocolVersion));
  }
  return absl::OkStatus();
}

absl::Status CheckString(const std::string& s, const char* what, const char* field) {
  if (s.size() > kMaxString) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", field, " of ", s.size(), " bytes exceeds ", kMaxString));
  }
  return absl::OkStatus();
}

std::string Serialize(const Message& msg) {
  std::string out;
  msg.SerializeToString(&out);
  return out;
}

}  // namespace

absl::StatusOr<BackendId> ParseBackend(const std::string& name) {
  if (name == "tcp") return BackendId::kTcp;
  if (name == "nccl") return BackendId::kNccl;
  return absl::InvalidArgumentError(absl::StrCat("backend: '", name, "' is not one of tcp, nccl"));
}

const char* BackendName(BackendId id) { return id == BackendId::kNccl ? "nccl" : "tcp"; }

std::string EncodeHello(const Hello& hello) {
  Message msg;
  rl::v1::WeightSyncHello* h = msg.mutable_hello();
  h->set_protocol(static_cast<rl::v1::WeightSyncProtocol>(kProtocolVersion));
  h->set_backend(hello.backend == BackendId::kNccl ? rl::v1::GROUP_BACKEND_NCCL
                                                   : rl::v1::GROUP_BACKEND_TCP);
  h->set_rank(hello.rank);
  h->set_world_size(hello.world_size);
  h->set_group_name(hello.group_name);
  return Serialize(msg);
}

absl::StatusOr<Hello> DecodeHello(const std::string& body) {
  ASSIGN_OR_RETURN(Message msg, Parse(body, Message::kHello, "hello"));
  const rl::v1::WeightSyncHello& h = msg.hello();
  RETURN_IF_ERROR(CheckProtocol(h.protocol(), "hello"));
  RETURN_IF_ERROR(CheckString(h.group_name(), "hello", "group_name"));
  Hello hello;
  switch (h.backend()) {
    case rl::v1::GROUP_BACKEND_TCP:
      hello.backend = BackendId::kTcp;
      break;
    case rl::v1::GROUP_BACKEND_NCCL:
      hello.backend = BackendId::kNccl;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("hello: unknown backend ", static_cast<int>(h.backend())));
  }
  hello.rank = h.rank();
  hello.world_size = h.world_size();
  hello.group_name = h.group_name();
  return hello;
}

std::string EncodeWelcome(const Welcome& welcome) {
  Message msg;
  rl::v1::WeightSyncWelcome* w = msg.mutable_welcome();
  w->set_protocol(static_cast<rl::v1::WeightSyncProtocol>(kProtocolVersion));
  w->set_code(static_cast<int32_t>(welcome.code));
  w->set_message(welcome.message);
  w->set_nccl_unique_id(welcome.nccl_unique_id);
  return Serialize(msg);
}

absl::StatusOr<Welcome> DecodeWelcome(const std::string& body) {
  ASSIGN_OR_RETURN(Message msg, Parse(body, Message::kWelcome, "welcome"));
  const rl::v1::WeightSyncWelcome& w = msg.welcome();
  RETURN_IF_ERROR(CheckProtocol(w.protocol(), "welcome"));
  RETURN_IF_ERROR(CheckString(w.message(), "welcome", "message"));
  RETURN_IF_ERROR(CheckString(w.nccl_unique_id(), "welcome", "nccl_unique_id"));
  Welcome welcome;
  welcome.code = CodeFromWire(w.code());
  welcome.message = w.message();
  welcome.nccl_unique_id = w.nccl_unique_id();
  return welcome;
}

absl::StatusOr<BucketHeader> MakeBucketHeader(std::vector<TensorSpec> tensors) {
  BucketHeader header;
  for (const TensorSpec& spec : tensors) {
    ASSIGN_OR_RETURN(int64_t bytes, TensorBytes(spec));
    if (bytes > INT64_MAX - header.payload_bytes) {
      return absl::InvalidArgumentError("bucket: total size overflows int64");
    }
    header.tensor_bytes.push_back(bytes);
    header.payload_bytes += bytes;
  }
  header.tensors = std::move(tensors);
  return header;
}

std::string EncodeFrame(const Frame& frame) {
  Message msg;
  if (frame.kind == FrameKind::kClose) {
    msg.mutable_close()->set_seq(frame.seq);
    return Serialize(msg);
  }
  rl::v1::WeightSyncBucket* b = msg.mutable_bucket();
  b->set_seq(frame.seq);
  for (size_t i = 0; i < frame.bucket.tensors.size(); ++i) {
    const TensorSpec& spec = frame.bucket.tensors[i];
    rl::v1::WeightSyncTensor* t = b->add_tensors();
    t->set_name(spec.name);
    t->set_dtype(spec.dtype);
    t->mutable_shape()->Assign(spec.shape.begin(), spec.shape.end());
    t->set_bytes(static_cast<uint64_t>(frame.bucket.tensor_bytes[i]));
  }
  b->set_payload_bytes(static_cast<uint64_t>(frame.bucket.payload_bytes));
  b->set_payload_crc32c(frame.bucket.payload_crc32c);
  return Serialize(msg);
}

absl::StatusOr<Frame> DecodeFrame(const std::string& body) {
  Message msg;
  if (!msg.ParseFromString(body)) {
    return absl::DataLossError(absl::StrCat("bucket header: not a weight-sync message (",
                                            body.size(), " bytes do not parse)"));
  }
  Frame frame;
  if (msg.kind_case() == Message::kClose) {
    frame.kind = FrameKind::kClose;
    frame.seq = msg.close().seq();
    return frame;
  }
  if (msg.kind_case() != Message::kBucket) {
    return absl::DataLossError(
        absl::StrCat("bucket header: unexpected ", KindName(msg.kind_case())));
  }
  const rl::v1::WeightSyncBucket& b = msg.bucket();
  frame.kind = FrameKind::kBucket;
  frame.seq = b.seq();
  std::vector<TensorSpec> tensors;
  tensors.reserve(static_cast<size_t>(b.tensors_size()));
  for (const rl::v1::WeightSyncTensor& t : b.tensors()) {
    RETURN_IF_ERROR(CheckString(t.name(), "bucket header", "tensor name"));
    if (t.shape_size() > kMaxDims) {
      return absl::DataLossError(absl::StrCat("bucket header: tensor '", t.name().substr(0, 64),
                                              "' has ", t.shape_size(), " dimensions"));
    }
    tensors.push_back(
        {t.name(), t.dtype(), std::vector<int64_t>(t.shape().begin(), t.shape().end())});
  }
  auto header = MakeBucketHeader(std::move(tensors));
  if (!header.ok()) {
    return absl::DataLossError(absl::StrCat("bucket header: sender announced an invalid tensor: ",
                                            header.status().message()));
  }
  for (int i = 0; i < b.tensors_size(); ++i) {
    const uint64_t announced = b.tensors(i).bytes();
    if (announced != static_cast<uint64_t>(header->tensor_bytes[static_cast<size_t>(i)])) {
      return absl::DataLossError(absl::StrCat(
          "bucket header: tensor '", header->tensors[static_cast<size_t>(i)].name, "' announces ",
          announced, " bytes, its ", DescribeSpec(header->tensors[static_cast<size_t>(i)]),
          " needs ", header->tensor_bytes[static_cast<size_t>(i)]));
    }
  }
  if (b.payload_bytes() != static_cast<uint64_t>(header->payload_bytes)) {
    return absl::DataLossError(absl::StrCat("bucket header: payload of ", b.payload_bytes(),
                                            " bytes, its tensors sum to ", header->payload_bytes));
  }
  header->payload_crc32c = b.payload_crc32c();
  frame.bucket = *std::move(header);
  return frame;
}

std::string EncodeAck(const Ack& ack) {
  Message msg;
  rl::v1::WeightSyncAck* a = msg.mutable_ack();
  a->set_seq(ack.seq);
  a->set_code(static_cast<int32_t>(ack.code));
  a->set_message(ack.message);
  return Serialize(msg);
}

absl::StatusOr<Ack> DecodeAck(const std::string& body) {
  Message msg;
  if (!msg.ParseFromString(body)) {
    return absl::DataLossError(
        absl::StrCat("ack: not a weight-sync message (", body.size(), " bytes do not parse)"));
  }
  if (msg.kind_case() != Message::kAck) {
    return absl::DataLossError(absl::StrCat("ack: unexpected ", KindName(msg.kind_case())));
  }
  RETURN_IF_ERROR(CheckString(msg.ack().message(), "ack", "message"));
  Ack ack;
  ack.seq = msg.ack().seq();
  ack.code = CodeFromWire(msg.ack().code());
  ack.message = msg.ack().message();
  return ack;
}

absl::Status MatchBucket(const std::vector<TensorSpec>& expected, const BucketHeader& got) {
  if (expected.size() != got.tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket mismatch: metadata lists ", expected.size(), " tensors, the sender broadcast ",
        got.tensors.size(),
        got.tensors.empty() ? "" : absl::StrCat(" (first: '", got.tensors[0].name, "')")));
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorSpec& e = expected[i];
    const TensorSpec& g = got.tensors[i];
    if (e.name != g.name || e.dtype != g.dtype || e.shape != g.shape) {
      const char* field = e.name != g.name ? "name" : e.dtype != g.dtype ? "dtype" : "shape";
      return absl::InvalidArgumentError(absl::StrCat("bucket mismatch at tensor ", i, " (", field,
                                                     "): metadata says ", DescribeSpec(e),
                                                     ", the sender broadcast ", DescribeSpec(g)));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteMessage(const Socket& socket, const std::string& body,
                          std::chrono::milliseconds stall, const std::string& what) {
  uint32_t prefix[2] = {
      static_cast<uint32_t>(body.size()),
      Crc32cExtend(0, reinterpret_cast<const uint8_t*>(body.data()), body.size())};
  return SendAll(
      socket,
      {absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(prefix), sizeof(prefix)),
       absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), body.size())},
      stall, what);
}

absl::StatusOr<std::string> ReadMessage(const Socket& socket, std::chrono::milliseconds stall,
                                        const std::string& what, bool* started) {
  uint32_t prefix[2];
  size_t got = 0;
  absl::Status st = RecvAll(socket, reinterpret_cast<uint8_t*>(prefix), sizeof(prefix), stall, what,
                            nullptr, &got);
  if (started != nullptr) *started = got > 0;
  if (!st.ok()) return st;
  if (prefix[0] > kMaxMessageBytes) {
    return absl::DataLossError(absl::StrCat(what, ": message of ", prefix[0], " bytes exceeds the ",
                                            kMaxMessageBytes,
                                            "-byte cap (not a weight-sync peer?)"));
  }
  std::string body(prefix[0], '\0');
  RETURN_IF_ERROR(
      RecvAll(socket, reinterpret_cast<uint8_t*>(body.data()), body.size(), stall, what));
  uint32_t crc = Crc32cExtend(0, reinterpret_cast<const uint8_t*>(body.data()), body.size());
  if (crc != prefix[1]) {
    return absl::DataLossError(absl::StrCat(what, ": message checksum mismatch"));
  }
  return body;
}

}  // namespace rl::weight_sync
