// rlctl's offline commands over the C++ tokenizer (no server involved).
#pragma once

#include "absl/status/status.h"
#include "services/admin/rlctl_commands.h"

namespace rl::rlctl {

// tokenize: with --text prints the ids of the text (a JSON array, or {"ids": [...]} with
// --json); without --text reads stdin and prints one JSON array of ids per line.
absl::Status Tokenize(const Options& options);
// detokenize: with --ids prints the text; without, reads one JSON array of ids per stdin line
// and prints the text of each (JSON strings with --json).
absl::Status Detokenize(const Options& options);

}  // namespace rl::rlctl
