#pragma once

#include "services/llm-proxy/layer.h"

// What the parametric mutator learnt about the knob variants it tried: whether each is valid and
// its content hash. Both follow from the space and the parent's source and plan alone, so they
// hold for every job on the problem; only whether a variant was seen belongs to a job. Once a
// job has used up its best parent's neighbourhood, every proposal tries the same variants again:
// the memo turns those tries into lookups. Bounded: it starts over once it holds max_entries.
// Thread-safe (a coordinator's jobs share one mutator).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"

namespace kforge::llm {

class VariantMemo {
 public:
  struct Variant {
    bool valid = false;
    std::string hash;  // the content hash; empty when invalid
  };
  // The variants of one base (a space and a parent): a call resolves it once and then looks its
  // tries up by their knob positions alone.
  class Table;

  explicit VariantMemo(size_t max_entries) : max_entries_(max_entries) {}
  VariantMemo(const VariantMemo&) = delete;
  VariantMemo& operator=(const VariantMemo&) = delete;

  // `base`: what the variants share (the space's key and the parent's CandidateHasher::BaseKey).
  std::shared_ptr<Table> For(const std::string& base);
  // The variant at `key` (KeyOf its value positions), or null when not known. The pointer stays
  // valid while the caller holds `table`.
  const Variant* Find(Table& table, const std::string& key) const;
  // Remembers `variant` at `key` and returns where it now lives (`variant` itself when the memo
  // started over since `table` was resolved: a stale table takes no more entries).
  const Variant* Put(Table& table, const std::string& key, Variant&& variant);
  size_t size() const;

  // A variant's key: its value positions, packed (a handful of bytes for usual spaces, so the key
  // needs no allocation).
  static void KeyOf(const std::vector<int>& positions, std::string* key);

 private:
  const size_t max_entries_;
  mutable std::mutex mu_;
  size_t entries_ = 0;
  uint64_t generation_ = 0;  // bumped when the memo starts over
  absl::flat_hash_map<std::string, std::shared_ptr<Table>> by_base_;
};

class VariantMemo::Table {
 private:
  friend class VariantMemo;
  explicit Table(uint64_t generation) : generation_(generation) {}
  const uint64_t generation_;
  // Node-based: a found variant does not move when other calls add to the table.
  absl::node_hash_map<std::string, Variant> variants_;
};

}  // namespace kforge::llm
