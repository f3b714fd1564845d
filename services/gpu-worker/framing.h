#pragma once

// Length-prefixed protobuf frames over a file descriptor (the worker <-> sandbox pipe).

#include <cstdint>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace kforge::worker {

inline constexpr uint32_t kMaxFrameBytes = 1u << 30;

// `zero_after_write`: the serialised copy is zeroed before it is freed (frames carrying results).
[[nodiscard]] absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg,
                                      bool zero_after_write = false);
// Blocks until a whole frame arrives. NotFound on a clean end of stream.
[[nodiscard]] absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg);

// Reads exactly n bytes, giving up at deadline_ms (CLOCK_MONOTONIC milliseconds; <0 = never).
// DeadlineExceeded on timeout, NotFound on end of stream.
[[nodiscard]] absl::Status ReadFull(int fd, void* buf, size_t n, int64_t deadline_ms);
[[nodiscard]] absl::Status ReadFrameUntil(int fd, google::protobuf::MessageLite* msg, int64_t deadline_ms);

int64_t MonotonicMillis();

}  // namespace kforge::worker
