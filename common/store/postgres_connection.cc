#include "common/store/postgres_connection.h"

namespace kforge {

std::unique_ptr<PostgresStore::Conn> PostgresStore::Take(absl::Status* error) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || open_ < options_.pool_size; });
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    ++open_;
  }
  try {
    return std::make_unique<Conn>(url_);
  } catch (const std::exception& e) {
    *error = absl::UnavailableError(absl::StrCat(display_, ": cannot connect: ", e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  --open_;
  cv_.notify_one();
  return nullptr;
}

void PostgresStore::Give(std::unique_ptr<Conn> c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (c != nullptr && c->c.is_open()) {
    idle_.push_back(std::move(c));
  } else {
    --open_;
  }
  cv_.notify_one();
}

}  // namespace kforge
