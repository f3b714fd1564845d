#include "services/gpu-worker/resident_inputs.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kforge::worker {

ResidentStore::~ResidentStore() {
  for (const auto& [key, r] : regions_) Unmap(r);
}

void ResidentStore::Unmap(const Region& r) {
  if (r.addr != nullptr) munmap(r.addr, r.mapped);
}

absl::StatusOr<std::string_view> ResidentStore::Put(const std::string& key,
                                                    std::string_view bytes) {
  if (regions_.contains(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat("resident input '", key, "' is already held"));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Region r;
  r.size = bytes.size();
  r.mapped = std::max<size_t>(page, (bytes.size() + page - 1) / page * page);
  void* addr = mmap(nullptr, r.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (addr == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("resident input ", key, ": mmap of ", r.mapped,
                                                     " bytes failed: ", std::strerror(errno)));
  }
  r.addr = addr;
  std::memcpy(addr, bytes.data(), bytes.size());
  if (mprotect(addr, r.mapped, PROT_READ) != 0) {
    const int err = errno;
    Unmap(r);
    return absl::InternalError(
        absl::StrCat("resident input ", key, ": mprotect failed: ", std::strerror(err)));
  }
  regions_[key] = r;
  return std::string_view(static_cast<const char*>(addr), r.size);
}

absl::StatusOr<std::string_view> ResidentStore::Get(const std::string& key) const {
  auto it = regions_.find(key);
  if (it == regions_.end())
    return absl::NotFoundError(absl::StrCat("no resident input '", key, "'"));
  return std::string_view(static_cast<const char*>(it->second.addr), it->second.size);
}

void ResidentStore::Drop(const std::string& key) {
  auto it = regions_.find(key);
  if (it == regions_.end()) return;
  Unmap(it->second);
  regions_.erase(it);
}

int64_t ResidentStore::bytes() const {
  int64_t total = 0;
  for (const auto& [key, r] : regions_) total += static_cast<int64_t>(r.size);
  return total;
}

void ResidentIndex::Forget() {
  bytes_ = 0;
  lru_.clear();
  where_.clear();
  pinned_.clear();
}

void ResidentIndex::Reset(int generation) {
  if (generation == generation_) return;
  generation_ = generation;
  Forget();
  drops_.clear();  // the new sandbox holds nothing to drop
}

bool ResidentIndex::Holds(int generation, const std::string& key) {
  Reset(generation);
  auto it = where_.find(key);
  if (it == where_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second);
  pinned_.insert(key);
  return true;
}

bool ResidentIndex::Add(int generation, const std::string& key, int64_t size) {
  Reset(generation);
  KF_CHECK(!where_.contains(key));  // callers ask Holds first
  int64_t pinned_bytes = 0;
  for (const auto& [k, n] : lru_) {
    if (pinned_.contains(k)) pinned_bytes += n;
  }
  if (size > max_bytes_ - pinned_bytes) return false;
  for (auto it = lru_.begin(); bytes_ + size > max_bytes_;) {
    if (pinned_.contains(it->first)) {
      ++it;
      continue;
    }
    bytes_ -= it->second;
    drops_.push_back(it->first);
    where_.erase(it->first);
    it = lru_.erase(it);
  }
  lru_.emplace_back(key, size);
  where_[key] = std::prev(lru_.end());
  bytes_ += size;
  pinned_.insert(key);
  return true;
}

void ResidentIndex::Abandon() {
  for (const auto& [key, size] : lru_) drops_.push_back(key);
  Forget();
}

std::vector<std::string> ResidentIndex::TakeDrops() {
  std::vector<std::string> out;
  out.swap(drops_);
  pinned_.clear();
  return out;
}

}  // namespace kforge::worker
