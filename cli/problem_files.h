#pragma once

// What `kforge submit` sends of a problem folder: its files by relative path. The coordinator
// loads them with the same loader as `kforge validate`.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace kforge::cli {

// At most this many bytes in all, and this many files.
inline constexpr int64_t kMaxProblemFilesBytes = int64_t{64} << 20;
inline constexpr int kMaxProblemFiles = 4096;

// The files of a problem folder by relative path ('/'-separated), for
// SubmitJobRequest.problem_files: every regular file, in subfolders too, except hidden ones (a name
// starting with '.'). At most max_bytes in all and kMaxProblemFiles files; InvalidArgument naming
// the folder otherwise.
[[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> ReadProblemFiles(
    const std::string& dir, int64_t max_bytes = kMaxProblemFilesBytes);

}  // namespace kforge::cli
