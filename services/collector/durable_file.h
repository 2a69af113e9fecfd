// Crash-safe file replacement for the collector's output folder.
//
// WriteFileDurably writes `bytes` to `path` so that after a crash at any instant the path holds
// either its previous content or the new one, never a mix: write PATH.tmp → fsync → rename over
// PATH → fsync of the folder (so the rename itself survives a power cut). Cost: two fsyncs.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rl::collector {

absl::Status WriteFileDurably(const std::string& path, std::string_view bytes);

// Reads a whole file, refusing files larger than `max_bytes` (InvalidArgument naming the path).
absl::StatusOr<std::string> ReadFileBounded(const std::string& path, size_t max_bytes);

}  // namespace rl::collector
