#pragma once

// Time is injected: production code takes a Clock&, tests pass a FakeClock.

#include <chrono>
#include <cmath>
#include <cstdint>

#include "google/protobuf/timestamp.pb.h"

namespace kforge {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary origin; never goes backwards.
  virtual double MonotonicSeconds() = 0;
  // Wall time, seconds since the Unix epoch (timestamps in records).
  virtual double WallSeconds() = 0;
};

class RealClock final : public Clock {
 public:
  double MonotonicSeconds() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  double WallSeconds() override {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
};

class FakeClock final : public Clock {
 public:
  explicit FakeClock(double start = 1000) : now_(start), wall_(1.7e9) {}
  double MonotonicSeconds() override { return now_; }
  double WallSeconds() override { return wall_ + now_; }
  void Advance(double s) { now_ += s; }

 private:
  double now_;
  double wall_;
};

// A record's timestamp from wall seconds (Clock::WallSeconds).
inline void SetTimestamp(google::protobuf::Timestamp* t, double wall_seconds) {
  t->set_seconds(static_cast<int64_t>(wall_seconds));
  t->set_nanos(static_cast<int32_t>((wall_seconds - std::floor(wall_seconds)) * 1e9));
}

}  // namespace kforge
