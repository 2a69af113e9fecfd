#include "services/worker/engine/text_decoder.h"

namespace rl::engine {
namespace {

// Each token decoded on its own.
class PerTokenStream final : public TextDecoder::Stream {
 public:
  explicit PerTokenStream(const TextDecoder* decoder) : decoder_(decoder) {}
  std::string Step(int32_t id) override { return decoder_->Decode(absl::MakeConstSpan(&id, 1)); }

 private:
  const TextDecoder* decoder_;
};

}  // namespace

std::unique_ptr<TextDecoder::Stream> TextDecoder::NewStream(absl::Span<const int32_t>) const {
  return std::make_unique<PerTokenStream>(this);
}

}  // namespace rl::engine
