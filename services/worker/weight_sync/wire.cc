#include "services/worker/weight_sync/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "services/worker/weight_sync/crc32c.h"

namespace rl::weight_sync {
namespace {

constexpr uint8_t kAckKind = 3;
constexpr uint32_t kMaxString = 1u << 20;
constexpr uint32_t kMaxDims = 64;

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(v); }
  void U32(uint32_t v) { Raw(v); }
  void I32(int32_t v) { Raw(v); }
  void U64(uint64_t v) { Raw(v); }
  void I64(int64_t v) { Raw(v); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string Take() { return std::move(out_); }

 private:
  template <typename T>
  void Raw(T v) {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "wire format is little-endian");
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  std::string out_;
};

class Reader {
 public:
  Reader(const std::string& in, const char* what) : in_(in), what_(what) {}

  absl::StatusOr<uint8_t> U8() { return Raw<uint8_t>(); }
  absl::StatusOr<uint16_t> U16() { return Raw<uint16_t>(); }
  absl::StatusOr<uint32_t> U32() { return Raw<uint32_t>(); }
  absl::StatusOr<int32_t> I32() { return Raw<int32_t>(); }
  absl::StatusOr<uint64_t> U64() { return Raw<uint64_t>(); }
  absl::StatusOr<int64_t> I64() { return Raw<int64_t>(); }
  absl::StatusOr<std::string> Str() {
    ASSIGN_OR_RETURN(uint32_t n, U32());
    if (n > kMaxString || n > in_.size() - pos_) return Truncated();
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  absl::Status Done() const {
    if (pos_ != in_.size()) {
      return absl::DataLossError(
          absl::StrCat(what_, ": ", in_.size() - pos_, " trailing bytes in message"));
    }
    return absl::OkStatus();
  }
  absl::Status Header() {
    ASSIGN_OR_RETURN(uint32_t magic, U32());
    if (magic != kMagic) {
      return absl::InvalidArgumentError(absl::StrCat(
          what_, ": bad protocol magic 0x", absl::Hex(magic), " (not a weight-sync peer)"));
    }
    ASSIGN_OR_RETURN(uint16_t version, U16());
    if (version != kProtocolVersion) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": protocol version ", version,
                                                     ", this build speaks ", kProtocolVersion));
    }
    return absl::OkStatus();
  }

 private:
  template <typename T>
  absl::StatusOr<T> Raw() {
    if (sizeof(T) > in_.size() - pos_) return Truncated();
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  absl::Status Truncated() const {
    return absl::DataLossError(absl::StrCat(what_, ": truncated message"));
  }

  const std::string& in_;
  const char* what_;
  size_t pos_ = 0;
};

absl::StatusCode CodeFromWire(uint32_t code) {
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<BackendId> ParseBackend(const std::string& name) {
  if (name == "tcp") return BackendId::kTcp;
  if (name == "nccl") return BackendId::kNccl;
  return absl::InvalidArgumentError(absl::StrCat("backend: '", name, "' is not one of tcp, nccl"));
}

const char* BackendName(BackendId id) { return id == BackendId::kNccl ? "nccl" : "tcp"; }

std::string EncodeHello(const Hello& hello) {
  Writer w;
  w.U32(kMagic);
  w.U16(kProtocolVersion);
  w.U8(static_cast<uint8_t>(hello.backend));
  w.I32(hello.rank);
  w.I32(hello.world_size);
  w.Str(hello.group_name);
  return w.Take();
}

absl::StatusOr<Hello> DecodeHello(const std::string& body) {
  Reader r(body, "hello");
  RETURN_IF_ERROR(r.Header());
  Hello hello;
  ASSIGN_OR_RETURN(uint8_t backend, r.U8());
  if (backend > static_cast<uint8_t>(BackendId::kNccl)) {
    return absl::InvalidArgumentError(absl::StrCat("hello: unknown backend id ", backend));
  }
  hello.backend = static_cast<BackendId>(backend);
  ASSIGN_OR_RETURN(hello.rank, r.I32());
  ASSIGN_OR_RETURN(hello.world_size, r.I32());
  ASSIGN_OR_RETURN(hello.group_name, r.Str());
  RETURN_IF_ERROR(r.Done());
  return hello;
}

std::string EncodeWelcome(const Welcome& welcome) {
  Writer w;
  w.U32(kMagic);
  w.U16(kProtocolVersion);
  w.U32(static_cast<uint32_t>(welcome.code));
  w.Str(welcome.message);
  w.Str(welcome.nccl_unique_id);
  return w.Take();
}

absl::StatusOr<Welcome> DecodeWelcome(const std::string& body) {
  Reader r(body, "welcome");
  RETURN_IF_ERROR(r.Header());
  Welcome welcome;
  ASSIGN_OR_RETURN(uint32_t code, r.U32());
  welcome.code = CodeFromWire(code);
  ASSIGN_OR_RETURN(welcome.message, r.Str());
  ASSIGN_OR_RETURN(welcome.nccl_unique_id, r.Str());
  RETURN_IF_ERROR(r.Done());
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
  Writer w;
  w.U8(static_cast<uint8_t>(frame.kind));
  w.U64(frame.seq);
  if (frame.kind == FrameKind::kBucket) {
    const BucketHeader& b = frame.bucket;
    w.U32(static_cast<uint32_t>(b.tensors.size()));
    for (size_t i = 0; i < b.tensors.size(); ++i) {
      w.Str(b.tensors[i].name);
      w.Str(b.tensors[i].dtype);
      w.U32(static_cast<uint32_t>(b.tensors[i].shape.size()));
      for (int64_t d : b.tensors[i].shape) w.I64(d);
      w.U64(static_cast<uint64_t>(b.tensor_bytes[i]));
    }
    w.U64(static_cast<uint64_t>(b.payload_bytes));
    w.U32(b.payload_crc32c);
  }
  return w.Take();
}

absl::StatusOr<Frame> DecodeFrame(const std::string& body) {
  Reader r(body, "bucket header");
  Frame frame;
  ASSIGN_OR_RETURN(uint8_t kind, r.U8());
  if (kind != static_cast<uint8_t>(FrameKind::kBucket) &&
      kind != static_cast<uint8_t>(FrameKind::kClose)) {
    return absl::DataLossError(absl::StrCat("bucket header: unknown frame kind ", kind));
  }
  frame.kind = static_cast<FrameKind>(kind);
  ASSIGN_OR_RETURN(frame.seq, r.U64());
  if (frame.kind == FrameKind::kClose) {
    RETURN_IF_ERROR(r.Done());
    return frame;
  }
  ASSIGN_OR_RETURN(uint32_t count, r.U32());
  std::vector<TensorSpec> tensors;
  std::vector<int64_t> announced;
  for (uint32_t i = 0; i < count; ++i) {
    TensorSpec spec;
    ASSIGN_OR_RETURN(spec.name, r.Str());
    ASSIGN_OR_RETURN(spec.dtype, r.Str());
    ASSIGN_OR_RETURN(uint32_t ndim, r.U32());
    if (ndim > kMaxDims) {
      return absl::DataLossError(
          absl::StrCat("bucket header: tensor '", spec.name, "' has ", ndim, " dimensions"));
    }
    for (uint32_t d = 0; d < ndim; ++d) {
      ASSIGN_OR_RETURN(int64_t dim, r.I64());
      spec.shape.push_back(dim);
    }
    ASSIGN_OR_RETURN(uint64_t bytes, r.U64());
    announced.push_back(static_cast<int64_t>(bytes));
    tensors.push_back(std::move(spec));
    if (tensors.size() > kMaxMessageBytes / 16) {
      return absl::DataLossError("bucket header: too many tensors");
    }
  }
  ASSIGN_OR_RETURN(uint64_t payload_bytes, r.U64());
  ASSIGN_OR_RETURN(uint32_t crc, r.U32());
  RETURN_IF_ERROR(r.Done());
  auto header = MakeBucketHeader(std::move(tensors));
  if (!header.ok()) {
    return absl::DataLossError(absl::StrCat("bucket header: sender announced an invalid tensor: ",
                                            header.status().message()));
  }
  for (size_t i = 0; i < announced.size(); ++i) {
    if (announced[i] != header->tensor_bytes[i]) {
      return absl::DataLossError(absl::StrCat(
          "bucket header: tensor '", header->tensors[i].name, "' announces ", announced[i],
          " bytes, its ", DescribeSpec(header->tensors[i]), " needs ", header->tensor_bytes[i]));
    }
  }
  if (static_cast<int64_t>(payload_bytes) != header->payload_bytes) {
    return absl::DataLossError(absl::StrCat("bucket header: payload of ", payload_bytes,
                                            " bytes, its tensors sum to ", header->payload_bytes));
  }
  header->payload_crc32c = crc;
  frame.bucket = *std::move(header);
  return frame;
}

std::string EncodeAck(const Ack& ack) {
  Writer w;
  w.U8(kAckKind);
  w.U64(ack.seq);
  w.U32(static_cast<uint32_t>(ack.code));
  w.Str(ack.message);
  return w.Take();
}

absl::StatusOr<Ack> DecodeAck(const std::string& body) {
  Reader r(body, "ack");
  ASSIGN_OR_RETURN(uint8_t kind, r.U8());
  if (kind != kAckKind) return absl::DataLossError(absl::StrCat("ack: unexpected kind ", kind));
  Ack ack;
  ASSIGN_OR_RETURN(ack.seq, r.U64());
  ASSIGN_OR_RETURN(uint32_t code, r.U32());
  ack.code = CodeFromWire(code);
  ASSIGN_OR_RETURN(ack.message, r.Str());
  RETURN_IF_ERROR(r.Done());
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
