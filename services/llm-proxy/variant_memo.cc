#include "services/llm-proxy/variant_memo.h"

namespace kforge::llm {

bool VariantMemo::Find(const std::string& base, const std::string& params, Variant* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto b = by_base_.find(base);
  if (b == by_base_.end()) return false;
  auto v = b->second.find(params);
  if (v == b->second.end()) return false;
  out->valid = v->second.valid;
  out->hash = v->second.hash;
  return true;
}

void VariantMemo::Put(const std::string& base, const std::string& params, const Variant& variant) {
  if (max_entries_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_ >= max_entries_) {  // starting over is simple, and costs only tries done again
    by_base_.clear();
    entries_ = 0;
  }
  if (by_base_[base].try_emplace(params, variant).second) ++entries_;
}

size_t VariantMemo::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

}  // namespace kforge::llm
