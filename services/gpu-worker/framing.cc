#include "services/gpu-worker/framing.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace kforge::worker {

int64_t MonotonicMillis() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

namespace {

absl::Status WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    // send() with MSG_NOSIGNAL so a dead peer is an error, not SIGPIPE; plain write() for pipes.
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == ENOTSOCK) w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("write failed: ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg, bool zero_after_write) {
  std::string body;
  absl::Cleanup zero = [&] {
    if (zero_after_write) explicit_bzero(body.data(), body.size());
  };
  if (!msg.SerializeToString(&body)) return absl::InternalError("cannot serialise frame");
  if (body.size() > kMaxFrameBytes) return absl::ResourceExhaustedError("frame too large");
  const uint32_t n = static_cast<uint32_t>(body.size());
  unsigned char header[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                             static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  // Two writes rather than one concatenated copy: frames carry buffers of tens of MB.
  absl::Status st = WriteAll(fd, reinterpret_cast<const char*>(header), sizeof(header));
  if (st.ok()) st = WriteAll(fd, body.data(), body.size());
  return st;
}

absl::Status ReadFull(int fd, void* buf, size_t n, int64_t deadline_ms) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (deadline_ms >= 0) {
      const int64_t left = deadline_ms - MonotonicMillis();
      if (left <= 0) return absl::DeadlineExceededError("timed out");
      pollfd pfd{fd, POLLIN, 0};
      int r = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return absl::UnavailableError(absl::StrCat("poll failed: ", std::strerror(errno)));
      if (r == 0) return absl::DeadlineExceededError("timed out");
    }
    ssize_t got = read(fd, p, n);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("read failed: ", std::strerror(errno)));
    }
    if (got == 0) return absl::NotFoundError("end of stream");
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status ReadFrameUntil(int fd, google::protobuf::MessageLite* msg, int64_t deadline_ms) {
  unsigned char header[4];
  absl::Status st = ReadFull(fd, header, 4, deadline_ms);
  if (!st.ok()) return st;
  const uint32_t n = header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
  if (n > kMaxFrameBytes) return absl::DataLossError("frame length out of range");
  std::string body(n, '\0');
  st = ReadFull(fd, body.data(), n, deadline_ms);
  if (!st.ok()) return st.code() == absl::StatusCode::kNotFound ? absl::DataLossError("truncated frame") : st;
  if (!msg->ParseFromString(body)) return absl::DataLossError("malformed frame");
  return absl::OkStatus();
}

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg) { return ReadFrameUntil(fd, msg, -1); }

}  // namespace kforge::worker
