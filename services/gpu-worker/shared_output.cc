#include "services/gpu-worker/shared_output.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kforge::worker {

namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;
constexpr size_t kPage = 4096;

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

OwnedFd::~OwnedFd() {
  if (fd_ >= 0) close(fd_);
}

OwnedFd& OwnedFd::operator=(OwnedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.Release();
  }
  return *this;
}

OutputArena::~OutputArena() { Unmap(); }

void OutputArena::Unmap() {
  if (data_ != nullptr) munmap(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
}

absl::Status OutputArena::Reserve(size_t bytes) {
  if (bytes <= capacity_) return absl::OkStatus();
  // Room for somewhat larger runs too, so that sizes creeping up do not remap every time.
  const size_t want = (std::max(bytes, capacity_ + capacity_ / 2) + kPage - 1) / kPage * kPage;
  OwnedFd fd(memfd_create("kforge-outputs", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Errno("memfd_create");
  if (ftruncate(fd.get(), static_cast<off_t>(want)) != 0) return Errno("ftruncate");
  if (fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0)
    return Errno("sealing the output arena");
  // Populated up front: one call instead of a fault per page.
  void* p = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap of the output arena");
  Clear();
  Unmap();
  data_ = static_cast<char*>(p);
  capacity_ = want;
  new_fd_ = std::move(fd);
  return absl::OkStatus();
}

void OutputArena::Clear() {
  if (dirty_ > 0 && data_ != nullptr) explicit_bzero(data_, std::min(dirty_, capacity_));
  dirty_ = 0;
}

OwnedFd OutputArena::TakeNewFile() { return std::move(new_fd_); }

absl::StatusOr<ArenaMapping> ArenaMapping::Map(const OwnedFd& fd, size_t max_bytes) {
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Errno("fstat of the output arena");
  if (!S_ISREG(st.st_mode))
    return absl::InvalidArgumentError("the output arena is not a memory file");
  // A memfd on shmem: not one backed by huge pages, whose pool can run dry under a reader (SIGBUS).
  struct statfs fs {};
  if (fstatfs(fd.get(), &fs) != 0 || fs.f_type != TMPFS_MAGIC) {
    return absl::InvalidArgumentError("the output arena is not a memory file");
  }
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals) {
    return absl::InvalidArgumentError(
        "the output arena is not sealed against shrinking and growing");
  }
  if (st.st_size <= 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an output arena of ", st.st_size, " bytes (1 to ", max_bytes, ")"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  // Not populated: only the ranges runs name are read, and a sandbox could send a sparse file.
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Errno("mmap of the output arena");
  return ArenaMapping(static_cast<const char*>(p), size);
}

void ArenaMapping::Unmap() {
  if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

ArenaMapping::~ArenaMapping() { Unmap(); }

ArenaMapping::ArenaMapping(ArenaMapping&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

ArenaMapping& ArenaMapping::operator=(ArenaMapping&& o) noexcept {
  if (this != &o) {
    Unmap();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

}  // namespace kforge::worker
