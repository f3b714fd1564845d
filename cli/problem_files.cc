#include "cli/problem_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kforge::cli {

namespace fs = std::filesystem;

absl::StatusOr<std::map<std::string, std::string>> ReadProblemFiles(const std::string& dir,
                                                                    int64_t max_bytes) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a folder"));
  std::map<std::string, std::string> files;
  int64_t total = 0;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
    const fs::path& path = it->path();
    if (absl::StartsWith(path.filename().string(), ".")) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;  // folders are walked; sockets, devices skipped
    const std::string rel = fs::relative(path, dir, ec).generic_string();
    if (ec) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", ec.message()));
    if (static_cast<int>(files.size()) >= kMaxProblemFiles) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": more than ", kMaxProblemFiles,
                       " files; a submit carries the problem folder, so keep "
                       "only the problem's files in it"));
    }
    const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", ec.message()));
    if (total + size > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the problem folder holds more than %d MiB (at %s); a submit carries "
                          "at most %d MiB of "
                          "files, so keep only the problem's files in it",
                          dir, max_bytes >> 20, rel, max_bytes >> 20));
    }
    std::ifstream in(path, std::ios::binary);
    std::ostringstream body;
    body << in.rdbuf();
    if (!in && !in.eof())
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", path.string()));
    std::string bytes = std::move(body).str();
    if (static_cast<int64_t>(bytes.size()) != size) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), " changed while it was read"));
    }
    total += size;
    files.emplace(rel, std::move(bytes));
  }
  if (!files.contains("problem.yaml")) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no problem.yaml"));
  }
  return files;
}

}  // namespace kforge::cli
