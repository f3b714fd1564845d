#pragma once

#include "services/gpu-worker/layer.h"

// Input buffers that stay in the sandbox between runs, so that the same bytes (a problem's input
// sets are the same for every candidate) cross the pipe once per sandbox lifetime instead of on
// every run. Two halves: the sandbox's store, and the worker's record of what the store holds.

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge::worker {

// Sandbox side. Each entry lives in its own mapping, made read-only once filled: a kernel that
// can reach the sandbox's host memory (a GPU with HMM) faults instead of changing the inputs that
// later candidates are judged on.
class ResidentStore {
 public:
  ResidentStore() = default;
  ~ResidentStore();
  ResidentStore(const ResidentStore&) = delete;
  ResidentStore& operator=(const ResidentStore&) = delete;

  // Stores a copy of `bytes` under `key` and returns it. A key already held is refused: views of
  // it may still be in use, and the worker drops a key before it stores it again.
  absl::StatusOr<std::string_view> Put(const std::string& key, std::string_view bytes);
  absl::StatusOr<std::string_view> Get(const std::string& key) const;
  void Drop(const std::string& key);
  int64_t bytes() const;  // held, over all keys

 private:
  struct Region {
    void* addr = nullptr;
    size_t mapped = 0;
    size_t size = 0;
  };
  static void Unmap(const Region& r);

  std::map<std::string, Region> regions_;
};

// Worker side: which keys the current sandbox holds, least recently used first, within a byte
// budget. A new sandbox (another generation) holds nothing.
class ResidentIndex {
 public:
  explicit ResidentIndex(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Whether the sandbox of `generation` already holds `key`; marks it used by the request being
  // built, which pins it until TakeDrops.
  bool Holds(int generation, const std::string& key);
  // Records that the request being built stores `key` (size bytes) in the sandbox of
  // `generation`, and pins it. Least recently used entries that are not pinned are evicted to make
  // room, and queued for TakeDrops. Returns false, recording nothing, when it cannot fit: send the
  // bytes without a key.
  bool Add(int generation, const std::string& key, int64_t size);
  // The request is complete: the keys evicted for it, for RunRequest.drop_resident. Unpins all.
  std::vector<std::string> TakeDrops();
  // A run failed, perhaps part-way through storing its inputs: forget everything, and have the
  // next request drop whatever the sandbox may hold, so every key is sent with its bytes again.
  void Abandon();

 private:
  void Reset(int generation);
  void Forget();  // no key held, none pinned

  int64_t max_bytes_;
  int generation_ = -1;
  int64_t bytes_ = 0;
  std::list<std::pair<std::string, int64_t>> lru_;  // front: least recently used
  std::map<std::string, std::list<std::pair<std::string, int64_t>>::iterator> where_;
  std::vector<std::string> drops_;
  std::set<std::string> pinned_;  // used by the request being built
};

}  // namespace kforge::worker
