// common/request_limits: every limit at its value (accepted) and one past it (refused with the
// field and the flag named), the flag ranges, checked element counts (rank, negative, overflow),
// server-assigned ids, and errors that never echo unbounded input.
#include "common/request_limits.h"

#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/model_io/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// No error message may grow with the input: a megabyte of client text costs a few hundred bytes
// of message at most.
constexpr size_t kMaxMessageBytes = 512;
constexpr size_t kHuge = 1 << 20;

void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& field,
                   const std::string& flag) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(field));
  if (!flag.empty()) EXPECT_THAT(std::string(s.message()), HasSubstr("--" + flag));
  EXPECT_LE(s.message().size(), kMaxMessageBytes) << s.message().substr(0, 200);
}

void ExpectInvalid(const absl::Status& s, const std::string& field, const std::string& flag = "") {
  ExpectRefused(s, absl::StatusCode::kInvalidArgument, field, flag);
}

// A small set of limits so boundaries are cheap to build.
RequestLimits Small() {
  RequestLimits l;
  l.max_n = 4;
  l.max_prompt_bytes = 100;
  l.max_prompt_tokens = 10;
  l.max_new_tokens = 50;
  l.max_stop_strings = 3;
  l.max_stop_string_bytes = 8;
  l.max_stop_token_ids = 5;
  l.max_top_logprobs = 6;
  l.max_request_id_bytes = 16;
  l.max_tensor_chunk_bytes = 1024;
  l.max_update_bytes = 4096;
  l.max_tensor_rank = 3;
  l.max_address_bytes = 20;
  l.max_path_bytes = 32;
  return l;
}

rl::v1::GenerateRequest Ok() {
  rl::v1::GenerateRequest r;
  r.set_request_id("req-1");
  r.set_text("hello");
  return r;
}

TEST(RequestLimitsTest, DefaultsAreValidAndEveryFlagIsRegistered) {
  RequestLimits l;
  EXPECT_TRUE(ValidateRequestLimits(l).ok());
  FlagSet flags("t");
  RegisterRequestLimitFlags(flags, &l);
  const std::vector<std::string> args = {"t",
                                         "--max-n=2",
                                         "--max-prompt-bytes=3",
                                         "--max-prompt-tokens=4",
                                         "--max-new-tokens-limit=5",
                                         "--max-stop-strings=6",
                                         "--max-stop-string-bytes=7",
                                         "--max-stop-token-ids=8",
                                         "--max-top-logprobs=9",
                                         "--max-request-id-bytes=10",
                                         "--max-tensor-chunk-bytes=2048",
                                         "--max-update-bytes=4096",
                                         "--max-tensor-rank=4",
                                         "--max-address-bytes=64",
                                         "--max-path-bytes=128"};
  ASSERT_TRUE(flags.Parse(args).ok()) << flags.Parse(args).status();
  EXPECT_EQ(l.max_n, 2);
  EXPECT_EQ(l.max_prompt_bytes, 3);
  EXPECT_EQ(l.max_prompt_tokens, 4);
  EXPECT_EQ(l.max_new_tokens, 5);
  EXPECT_EQ(l.max_stop_strings, 6);
  EXPECT_EQ(l.max_stop_string_bytes, 7);
  EXPECT_EQ(l.max_stop_token_ids, 8);
  EXPECT_EQ(l.max_top_logprobs, 9);
  EXPECT_EQ(l.max_request_id_bytes, 10);
  EXPECT_EQ(l.max_tensor_chunk_bytes, 2048);
  EXPECT_EQ(l.max_update_bytes, 4096);
  EXPECT_EQ(l.max_tensor_rank, 4);
  EXPECT_EQ(l.max_address_bytes, 64);
  EXPECT_EQ(l.max_path_bytes, 128);
  EXPECT_TRUE(ValidateRequestLimits(l).ok());
}

TEST(RequestLimitsTest, EveryFlagIsRangeCheckedAtBothEnds) {
  struct Case {
    const char* flag;
    int64_t RequestLimits::*field;
    int64_t lo;
    int64_t hi;
  };
  const Case cases[] = {
      {"max-n", &RequestLimits::max_n, 1, 4096},
      {"max-prompt-bytes", &RequestLimits::max_prompt_bytes, 1, int64_t{1} << 30},
      {"max-prompt-tokens", &RequestLimits::max_prompt_tokens, 1, int64_t{1} << 26},
      {"max-new-tokens-limit", &RequestLimits::max_new_tokens, 1, int64_t{1} << 26},
      {"max-stop-strings", &RequestLimits::max_stop_strings, 0, 4096},
      {"max-stop-string-bytes", &RequestLimits::max_stop_string_bytes, 1, 1 << 20},
      {"max-stop-token-ids", &RequestLimits::max_stop_token_ids, 0, 1 << 20},
      {"max-top-logprobs", &RequestLimits::max_top_logprobs, 0, 1024},
      {"max-request-id-bytes", &RequestLimits::max_request_id_bytes, 1, 1 << 16},
      {"max-tensor-chunk-bytes", &RequestLimits::max_tensor_chunk_bytes, 1024, int64_t{2} << 30},
      {"max-update-bytes", &RequestLimits::max_update_bytes, 1024, int64_t{1} << 50},
      {"max-tensor-rank", &RequestLimits::max_tensor_rank, 1, 64},
      {"max-address-bytes", &RequestLimits::max_address_bytes, 8, 1 << 16},
      {"max-path-bytes", &RequestLimits::max_path_bytes, 16, 1 << 16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    for (int64_t v : {c.lo, c.hi}) {
      RequestLimits l;
      l.*c.field = v;
      EXPECT_TRUE(ValidateRequestLimits(l).ok()) << v;
    }
    for (int64_t v : {c.lo - 1, c.hi + 1, int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
      if (v >= c.lo && v <= c.hi) continue;
      RequestLimits l;
      l.*c.field = v;
      const absl::Status s = ValidateRequestLimits(l);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << v;
      EXPECT_THAT(std::string(s.message()), StartsWith(std::string("--") + c.flag + ":")) << v;
    }
  }
}

TEST(RequestLimitsTest, QuoteForErrorKeepsAFewBytesEscapedAndCutOnUtf8) {
  EXPECT_EQ(QuoteForError("abc"), "'abc'");
  EXPECT_EQ(QuoteForError(""), "''");
  EXPECT_EQ(QuoteForError("a\nb'\\"), "'a\\x0ab\\x27\\x5c'");
  EXPECT_EQ(QuoteForError(std::string(48, 'x')), "'" + std::string(48, 'x') + "'");
  EXPECT_EQ(QuoteForError(std::string(49, 'x')), "'" + std::string(48, 'x') + "'... (49 bytes)");
  const std::string huge(10 << 20, 'y');
  EXPECT_LE(QuoteForError(huge).size(), 80u);
  EXPECT_THAT(QuoteForError(huge), HasSubstr("(10485760 bytes)"));
  // "é" is two bytes: a cut in its middle backs up before it.
  EXPECT_EQ(QuoteForError("ab\xc3\xa9z", 3), "'ab'... (5 bytes)");
  EXPECT_EQ(QuoteForError("ab\xc3\xa9z", 4), "'ab\xc3\xa9'... (5 bytes)");
}

TEST(RequestLimitsTest, AValidRequestPasses) {
  EXPECT_TRUE(CheckGenerateRequest(Ok(), Small()).ok());
  EXPECT_TRUE(CheckGenerateRequest(rl::v1::GenerateRequest(), Small()).ok());
}

TEST(RequestLimitsTest, RequestIdBytesAndReservedPrefix) {
  const RequestLimits l = Small();
  rl::v1::GenerateRequest r = Ok();
  r.set_request_id(std::string(16, 'i'));
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.set_request_id(std::string(17, 'i'));
  ExpectInvalid(CheckGenerateRequest(r, l), "request_id", "max-request-id-bytes");
  r.set_request_id(std::string(kHuge, 'i'));
  ExpectInvalid(CheckGenerateRequest(r, l), "request_id", "max-request-id-bytes");
  r.set_request_id(std::string(kServerRequestIdPrefix) + "0123");
  ExpectInvalid(CheckGenerateRequest(r, l), "reserved");
  // The router's prefix is the router's business: the shared check lets it through.
  r.set_request_id(std::string(kRouterRequestIdPrefix) + "0123");
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
}

TEST(RequestLimitsTest, PromptBytesAndTokens) {
  const RequestLimits l = Small();
  rl::v1::GenerateRequest r = Ok();
  r.set_text(std::string(100, 't'));
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.set_text(std::string(101, 't'));
  ExpectInvalid(CheckGenerateRequest(r, l), "text", "max-prompt-bytes");
  r.set_text(std::string(kHuge, 't'));
  ExpectInvalid(CheckGenerateRequest(r, l), "text", "max-prompt-bytes");

  for (int i = 0; i < 10; ++i) r.mutable_input_ids()->add_ids(i);
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.mutable_input_ids()->add_ids(10);
  ExpectInvalid(CheckGenerateRequest(r, l), "prompt", "max-prompt-tokens");

  EXPECT_TRUE(CheckPromptTokens(10, l).ok());
  ExpectInvalid(CheckPromptTokens(11, l), "prompt", "max-prompt-tokens");
  ExpectInvalid(CheckPromptTokens(std::numeric_limits<int64_t>::max(), l), "prompt",
                "max-prompt-tokens");
}

TEST(RequestLimitsTest, NumberOfSamples) {
  const RequestLimits l = Small();
  rl::v1::GenerateRequest r = Ok();
  for (int n : {1, 4}) {
    r.mutable_sampling_params()->set_n(n);
    EXPECT_TRUE(CheckGenerateRequest(r, l).ok()) << n;
  }
  for (int n : {5, 2147483647}) {
    r.mutable_sampling_params()->set_n(n);
    ExpectInvalid(CheckGenerateRequest(r, l), "n:", "max-n");
  }
  for (int n : {0, -1, -2147483647 - 1}) {
    r.mutable_sampling_params()->set_n(n);
    ExpectInvalid(CheckGenerateRequest(r, l), "n:", "max-n");
  }
}

TEST(RequestLimitsTest, MaxNewTokensAgainstTheLimitAndTheContext) {
  const RequestLimits l = Small();
  rl::v1::GenerateRequest r = Ok();
  r.mutable_sampling_params()->set_max_new_tokens(0);
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.mutable_sampling_params()->set_max_new_tokens(50);
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.mutable_sampling_params()->set_max_new_tokens(51);
  ExpectRefused(CheckGenerateRequest(r, l), absl::StatusCode::kResourceExhausted, "max_new_tokens",
                "max-new-tokens-limit");
  r.mutable_sampling_params()->set_max_new_tokens(2147483647);
  ExpectRefused(CheckGenerateRequest(r, l), absl::StatusCode::kResourceExhausted, "max_new_tokens",
                "max-new-tokens-limit");
  r.mutable_sampling_params()->set_max_new_tokens(-1);
  ExpectInvalid(CheckGenerateRequest(r, l), "max_new_tokens");
  // The model's context bounds it too (a worker passes it).
  r.mutable_sampling_params()->set_max_new_tokens(32);
  EXPECT_TRUE(CheckGenerateRequest(r, l, /*context_len=*/32).ok());
  r.mutable_sampling_params()->set_max_new_tokens(33);
  ExpectRefused(CheckGenerateRequest(r, l, 32), absl::StatusCode::kResourceExhausted, "context",
                "");
  EXPECT_TRUE(CheckGenerateRequest(r, l, /*context_len=*/0).ok());
}

TEST(RequestLimitsTest, StopStringsAndStopTokenIds) {
  const RequestLimits l = Small();
  rl::v1::GenerateRequest r = Ok();
  rl::v1::SamplingParams* sp = r.mutable_sampling_params();
  for (int i = 0; i < 3; ++i) sp->add_stop(std::string(8, 's'));
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  sp->add_stop("s");
  ExpectInvalid(CheckGenerateRequest(r, l), "stop", "max-stop-strings");
  sp->clear_stop();
  sp->add_stop("ok");
  sp->add_stop(std::string(9, 's'));
  ExpectInvalid(CheckGenerateRequest(r, l), "stop[1]", "max-stop-string-bytes");
  sp->clear_stop();
  sp->add_stop(std::string(kHuge, 's'));
  ExpectInvalid(CheckGenerateRequest(r, l), "stop[0]", "max-stop-string-bytes");
  sp->clear_stop();
  for (int i = 0; i < 5; ++i) sp->add_stop_token_ids(i);
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  sp->add_stop_token_ids(5);
  ExpectInvalid(CheckGenerateRequest(r, l), "stop_token_ids", "max-stop-token-ids");
}

TEST(RequestLimitsTest, LogprobFields) {
  const RequestLimits l = Small();
  rl::v1::GenerateRequest r = Ok();
  r.set_top_logprobs_num(1);
  ExpectInvalid(CheckGenerateRequest(r, l), "top_logprobs_num");
  r.set_top_logprobs_num(0);
  r.set_logprob_start_len(0);
  ExpectInvalid(CheckGenerateRequest(r, l), "logprob_start_len");
  r.set_return_logprob(true);
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.set_top_logprobs_num(6);
  EXPECT_TRUE(CheckGenerateRequest(r, l).ok());
  r.set_top_logprobs_num(7);
  ExpectInvalid(CheckGenerateRequest(r, l), "top_logprobs_num", "max-top-logprobs");
  r.set_top_logprobs_num(-1);
  ExpectInvalid(CheckGenerateRequest(r, l), "top_logprobs_num");
}

TEST(RequestLimitsTest, AddressAndPath) {
  const RequestLimits l = Small();
  EXPECT_TRUE(CheckAddress(std::string(20, 'a'), l).ok());
  ExpectInvalid(CheckAddress(std::string(21, 'a'), l), "address", "max-address-bytes");
  ExpectInvalid(CheckAddress(std::string(kHuge, 'a'), l), "address", "max-address-bytes");
  ExpectInvalid(CheckAddress("", l), "address");

  EXPECT_TRUE(CheckPath("model_path", std::string(32, 'p'), l).ok());
  EXPECT_TRUE(CheckPath("model_path", "", l).ok());  // emptiness is the caller's rule
  ExpectInvalid(CheckPath("model_path", std::string(33, 'p'), l), "model_path", "max-path-bytes");
  ExpectInvalid(CheckPath("model_path", std::string(kHuge, 'p'), l), "model_path",
                "max-path-bytes");
  ExpectInvalid(CheckPath("model_path", std::string("a\0b", 3), l), "NUL");
}

TEST(RequestLimitsTest, CheckedNumElementsRankNegativeAndOverflow) {
  int64_t n = -1;
  EXPECT_TRUE(CheckedNumElements({}, 3, &n).ok());
  EXPECT_EQ(n, 1);
  EXPECT_TRUE(CheckedNumElements({2, 3, 4}, 3, &n).ok());
  EXPECT_EQ(n, 24);
  EXPECT_TRUE(CheckedNumElements({0, int64_t{1} << 62, 7}, 3, &n).ok());
  EXPECT_EQ(n, 0);
  ExpectInvalid(CheckedNumElements({1, 1, 1, 1}, 3, &n), "rank 4", "max-tensor-rank");
  ExpectInvalid(CheckedNumElements({2, -3}, 3, &n), "shape[1]: -3 is negative");
  // Exactly 2^62 is the largest count accepted; one more element overflows.
  EXPECT_TRUE(CheckedNumElements({int64_t{1} << 31, int64_t{1} << 31}, 3, &n).ok());
  EXPECT_EQ(n, int64_t{1} << 62);
  ExpectInvalid(CheckedNumElements({int64_t{1} << 31, (int64_t{1} << 31) + 1}, 3, &n),
                "overflows at dimension 1");
  // A product that would wrap int64 (2^33 * 2^33 * 2^33) is caught, not wrapped.
  ExpectInvalid(CheckedNumElements({int64_t{1} << 33, int64_t{1} << 33, int64_t{1} << 33}, 3, &n),
                "overflows at dimension 1");
  ExpectInvalid(CheckedNumElements({std::numeric_limits<int64_t>::max(), 2}, 3, &n),
                "overflows at dimension 0");
  // The shared helper behind it (also used by the safetensors reader).
  EXPECT_EQ(model_io::CheckedNumElements(std::vector<int64_t>{5, 6}).value(), 30);
  EXPECT_FALSE(model_io::CheckedNumElements(std::vector<int64_t>{-1}).ok());
}

rl::v1::TensorChunk Chunk(std::vector<int64_t> shape, const std::string& dtype = "F32",
                          size_t data_bytes = 16) {
  rl::v1::TensorChunk c;
  c.set_name("model.norm.weight");
  c.set_dtype(dtype);
  for (int64_t d : shape) c.add_shape(d);
  c.set_data(std::string(data_bytes, '\0'));
  return c;
}

TEST(RequestLimitsTest, TensorChunkHeaders) {
  const RequestLimits l = Small();
  int64_t bytes = -1;
  EXPECT_TRUE(CheckTensorChunk(Chunk({4}), l, &bytes).ok());
  EXPECT_EQ(bytes, 16);
  EXPECT_TRUE(CheckTensorChunk(Chunk({2, 4}, "BF16"), l, &bytes).ok());
  EXPECT_EQ(bytes, 16);

  rl::v1::TensorChunk c = Chunk({4});
  c.set_name("");
  ExpectInvalid(CheckTensorChunk(c, l, &bytes), "chunk.name");
  c.set_name(std::string(1024, 'n'));
  EXPECT_TRUE(CheckTensorChunk(c, l, &bytes).ok());
  c.set_name(std::string(1025, 'n'));
  ExpectInvalid(CheckTensorChunk(c, l, &bytes), "chunk.name");
  c.set_name(std::string(kHuge, 'n'));
  ExpectInvalid(CheckTensorChunk(c, l, &bytes), "chunk.name");

  ExpectInvalid(CheckTensorChunk(Chunk({4}, "I64"), l, &bytes), "chunk.dtype");
  ExpectInvalid(CheckTensorChunk(Chunk({4}, "nope"), l, &bytes), "chunk.dtype");
  ExpectInvalid(CheckTensorChunk(Chunk({4}, std::string(kHuge, 'd')), l, &bytes), "chunk.dtype");

  // Data of one chunk: at most --max-tensor-chunk-bytes.
  EXPECT_TRUE(CheckTensorChunk(Chunk({256}, "F32", 1024), l, &bytes).ok());
  ExpectInvalid(CheckTensorChunk(Chunk({512}, "F32", 1025), l, &bytes), "chunk.data",
                "max-tensor-chunk-bytes");

  // Rank, negative dims, overflow.
  ExpectInvalid(CheckTensorChunk(Chunk({1, 1, 1, 1}), l, &bytes), "rank", "max-tensor-rank");
  ExpectInvalid(CheckTensorChunk(Chunk({-4}), l, &bytes), "negative");
  ExpectInvalid(CheckTensorChunk(Chunk({int64_t{1} << 40, int64_t{1} << 40}), l, &bytes),
                "overflows");

  // The whole tensor: at most --max-update-bytes (4096 = 1024 F32 = 2048 BF16), checked by
  // division so a count just under the overflow bound cannot wrap the byte size.
  EXPECT_TRUE(CheckTensorChunk(Chunk({1024}), l, &bytes).ok());
  EXPECT_EQ(bytes, 4096);
  ExpectInvalid(CheckTensorChunk(Chunk({1025}), l, &bytes), "chunk.shape", "max-update-bytes");
  EXPECT_TRUE(CheckTensorChunk(Chunk({2048}, "F16"), l, &bytes).ok());
  ExpectInvalid(CheckTensorChunk(Chunk({2049}, "F16"), l, &bytes), "chunk.shape",
                "max-update-bytes");
  ExpectInvalid(CheckTensorChunk(Chunk({int64_t{1} << 62}), l, &bytes), "chunk.shape",
                "max-update-bytes");
  rl::v1::TensorChunk huge_name = Chunk({1 << 20});
  huge_name.set_name(std::string(1000, 'n'));
  ExpectInvalid(CheckTensorChunk(huge_name, l, &bytes), "chunk.shape", "max-update-bytes");
}

TEST(RequestLimitsTest, ServerIdsAreUniqueUnguessableAndInTheirOwnNamespace) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = NewServerRequestId();
    EXPECT_THAT(id, StartsWith(kServerRequestIdPrefix));
    EXPECT_EQ(id.size(), std::string(kServerRequestIdPrefix).size() + 32);  // 128 bits in hex
    EXPECT_TRUE(seen.insert(id).second) << id;
    // A client may never send one back as its own id.
    rl::v1::GenerateRequest r = Ok();
    r.set_request_id(id);
    EXPECT_FALSE(CheckGenerateRequest(r, RequestLimits()).ok());
  }
  EXPECT_THAT(NewServerRequestId(kRouterRequestIdPrefix), StartsWith(kRouterRequestIdPrefix));
}

}  // namespace
}  // namespace rl
