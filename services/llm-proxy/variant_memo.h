#pragma once

// What the parametric mutator learnt about the knob variants it tried: whether each is valid and
// its content hash. Both follow from the space and the parent's source and plan alone, so they
// hold for every job on the problem; only whether a variant was seen belongs to a job. Once a
// job has used up its best parent's neighbourhood, every proposal tries the same variants again:
// the memo turns those tries into lookups. Bounded: it starts over once it holds max_entries.
// Thread-safe (a coordinator's jobs share one mutator).

#include <cstddef>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace kforge::llm {

class VariantMemo {
 public:
  struct Variant {
    bool valid = false;
    std::string hash;  // the content hash; empty when invalid
  };

  explicit VariantMemo(size_t max_entries) : max_entries_(max_entries) {}
  VariantMemo(const VariantMemo&) = delete;
  VariantMemo& operator=(const VariantMemo&) = delete;

  // `base`: what the variants share (the space's key and the parent's CandidateHasher::BaseKey);
  // `params`: the variant's ParamsText. False when not known.
  bool Find(const std::string& base, const std::string& params, Variant* out) const;
  void Put(const std::string& base, const std::string& params, const Variant& variant);
  size_t size() const;

 private:
  const size_t max_entries_;
  mutable std::mutex mu_;
  size_t entries_ = 0;
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, Variant>> by_base_;
};

}  // namespace kforge::llm
