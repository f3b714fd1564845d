#pragma once

#include "services/gpu-worker/layer.h"

// Length-prefixed protobuf frames over a file descriptor (the worker <-> sandbox pipe).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "google/protobuf/message_lite.h"
#include "services/gpu-worker/shared_output.h"

namespace kforge::worker {

inline constexpr uint32_t kMaxFrameBytes = 1u << 30;
// Descriptors one frame may carry (shared outputs, see shared_output.h).
inline constexpr int kMaxFrameFds = 64;

// `zero_after_write`: the serialised copy is zeroed before it is freed (frames carrying results).
// `fds` travel with the frame's length prefix (SCM_RIGHTS; `fd` must be a Unix socket then).
// `merged`, when given, is serialised after `msg` in the same frame: the reader parses the two as
// one message with `merged`'s fields merged in (protobuf's rule for concatenated encodings), so a
// caller can add a field to a large message without copying it.
[[nodiscard]] absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg,
                                      bool zero_after_write = false,
                                      absl::Span<const int> fds = {},
                                      const google::protobuf::MessageLite* merged = nullptr);
// Blocks until a whole frame arrives. NotFound on a clean end of stream.
[[nodiscard]] absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg);

// Reads exactly n bytes, giving up at deadline_ms (CLOCK_MONOTONIC milliseconds; <0 = never).
// DeadlineExceeded on timeout, NotFound on end of stream.
[[nodiscard]] absl::Status ReadFull(int fd, void* buf, size_t n, int64_t deadline_ms);
// `fds`, when given, receives the descriptors that came with the frame, at most `max_fds` (more
// refuse the frame: DataLoss); without it any that came are closed.
[[nodiscard]] absl::Status ReadFrameUntil(int fd, google::protobuf::MessageLite* msg,
                                          int64_t deadline_ms, std::vector<OwnedFd>* fds = nullptr,
                                          int max_fds = kMaxFrameFds);

int64_t MonotonicMillis();

}  // namespace kforge::worker
