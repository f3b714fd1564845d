#include "services/llm-proxy/variant_memo.h"

namespace kforge::llm {

std::shared_ptr<VariantMemo::Table> VariantMemo::For(const std::string& base) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Table>& t = by_base_[base];
  if (t == nullptr) t.reset(new Table(generation_));
  return t;
}

const VariantMemo::Variant* VariantMemo::Find(Table& table, const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto v = table.variants_.find(key);
  return v == table.variants_.end() ? nullptr : &v->second;
}

const VariantMemo::Variant* VariantMemo::Put(Table& table, const std::string& key,
                                             Variant&& variant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_entries_ == 0 || table.generation_ != generation_) return &variant;
  if (entries_ >= max_entries_) {  // starting over is simple, and costs only tries done again
    by_base_.clear();
    entries_ = 0;
    ++generation_;
    return &variant;
  }
  auto [it, inserted] = table.variants_.try_emplace(key, std::move(variant));
  if (inserted) ++entries_;
  return &it->second;
}

size_t VariantMemo::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void VariantMemo::KeyOf(const std::vector<int>& positions, std::string* key) {
  key->clear();
  for (int p : positions) {
    auto v = static_cast<uint32_t>(p);
    while (v >= 0x80) {  // LEB128: unambiguous for any count of positions
      key->push_back(static_cast<char>(0x80 | (v & 0x7f)));
      v >>= 7;
    }
    key->push_back(static_cast<char>(v));
  }
}

}  // namespace kforge::llm
