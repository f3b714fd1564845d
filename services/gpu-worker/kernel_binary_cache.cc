#include "services/gpu-worker/kernel_binary_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/hash.h"

namespace kforge::worker {

namespace fs = std::filesystem;

namespace {

constexpr absl::string_view kFormat = "kforge-kernel-binary-1";

}  // namespace

absl::StatusOr<std::unique_ptr<KernelBinaryCache>> KernelBinaryCache::Open(const std::string& dir,
                                                                          int64_t max_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat("kernel binary cache ", dir, " cannot be created: ", ec.message()));
  }
  // The worker's own: sandboxes (another user) neither read nor write it.
  fs::permissions(dir, fs::perms::owner_all, ec);
  return std::unique_ptr<KernelBinaryCache>(new KernelBinaryCache(dir, max_bytes));
}

std::string KernelBinaryCache::PathOf(absl::string_view key) const {
  return absl::StrCat(dir_, "/", Sha256Hex(key), ".bin");
}

bool KernelBinaryCache::Contains(absl::string_view key) const {
  std::error_code ec;
  return fs::is_regular_file(PathOf(key), ec);
}

std::optional<std::string> KernelBinaryCache::Get(absl::string_view key) {
  const std::string path = PathOf(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "<format> <key hash> <size> <sha256 of the bytes>\n<bytes>"
  const size_t eol = file.find('\n');
  std::vector<absl::string_view> header;
  if (eol != std::string::npos) header = absl::StrSplit(absl::string_view(file).substr(0, eol), ' ');
  int64_t size = -1;
  const bool ok = header.size() == 4 && header[0] == kFormat && header[1] == Sha256Hex(key) &&
                  absl::SimpleAtoi(header[2], &size) && size == static_cast<int64_t>(file.size() - eol - 1) &&
                  header[3] == Sha256Hex(absl::string_view(file).substr(eol + 1));
  if (!ok) {
    std::error_code ec;
    fs::remove(path, ec);  // damaged (a disk, a crash mid-rename cannot: see Put): the next Put rewrites it
    return std::nullopt;
  }
  return file.substr(eol + 1);
}

absl::Status KernelBinaryCache::Put(absl::string_view key, absl::string_view bytes) {
  const std::string path = PathOf(key);
  const std::string header =
      absl::StrCat(kFormat, " ", Sha256Hex(key), " ", bytes.size(), " ", Sha256Hex(bytes), "\n");
  static std::atomic<uint64_t> next_tmp{0};  // writers of one process never share a temporary file
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", next_tmp.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << header << bytes;
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return absl::UnavailableError(absl::StrCat("kernel binary cache: cannot write ", tmp));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return absl::UnavailableError(absl::StrCat("kernel binary cache: cannot store ", path));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (total_bytes_ >= 0) total_bytes_ += static_cast<int64_t>(header.size() + bytes.size());
  if (total_bytes_ < 0 || total_bytes_ > max_bytes_) Trim();
  return absl::OkStatus();
}

void KernelBinaryCache::Trim() {
  struct Entry {
    fs::file_time_type time;
    int64_t bytes;
    fs::path path;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->path().filename().string().find(".bin.tmp.") != std::string::npos) {
      // A write that a killed process left behind (one in progress is seconds old).
      std::error_code e1;
      if (now - it->last_write_time(e1) > std::chrono::minutes(10) && !e1) fs::remove(it->path(), e1);
      continue;
    }
    if (it->path().extension() != ".bin") continue;
    std::error_code e2;
    const auto size = static_cast<int64_t>(it->file_size(e2));
    const auto time = it->last_write_time(e2);
    if (e2) continue;
    entries.push_back({time, size, it->path()});
    total += size;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= max_bytes_) break;
    std::error_code e3;
    if (fs::remove(e.path, e3)) total -= e.bytes;
  }
  total_bytes_ = total;
}

}  // namespace kforge::worker
