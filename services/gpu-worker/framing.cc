#include "services/gpu-worker/framing.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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

// Sends the length prefix with the descriptors attached: the reader's recvmsg of the prefix
// collects them, and the stream cannot merge them into another frame's bytes.
absl::Status WriteHeader(int fd, const unsigned char* header, size_t n, absl::Span<const int> fds) {
  if (fds.empty()) return WriteAll(fd, reinterpret_cast<const char*>(header), n);
  if (fds.size() > static_cast<size_t>(kMaxFrameFds))
    return absl::InvalidArgumentError("too many descriptors for one frame");
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameFds)] = {};
  iovec iov{const_cast<unsigned char*>(header), n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t w;
  do {
    w = sendmsg(fd, &m, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w < 0) return absl::UnavailableError(absl::StrCat("sendmsg failed: ", std::strerror(errno)));
  // The descriptors went with the first byte; the rest of the prefix, if any, follows plainly.
  return WriteAll(fd, reinterpret_cast<const char*>(header) + w, n - static_cast<size_t>(w));
}

// Waits until fd is readable or the deadline passes (deadline_ms < 0: never).
absl::Status AwaitReadable(int fd, int64_t deadline_ms) {
  while (deadline_ms >= 0) {
    const int64_t left = deadline_ms - MonotonicMillis();
    if (left <= 0) return absl::DeadlineExceededError("timed out");
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::UnavailableError(absl::StrCat("poll failed: ", std::strerror(errno)));
    if (r == 0) return absl::DeadlineExceededError("timed out");
    break;
  }
  return absl::OkStatus();
}

// ReadFull for the length prefix, collecting the descriptors that come with it.
absl::Status ReadHeader(int fd, unsigned char* header, size_t n, int64_t deadline_ms,
                        std::vector<OwnedFd>* fds, int max_fds) {
  if (fds == nullptr) return ReadFull(fd, header, n, deadline_ms);
  bool truncated = false;
  while (n > 0) {
    if (absl::Status st = AwaitReadable(fd, deadline_ms); !st.ok()) return st;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFrameFds)];
    iovec iov{header, n};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    // Room for what may still come: the kernel closes the rest and flags the truncation.
    const int room = std::clamp(max_fds - static_cast<int>(fds->size()), 0, kMaxFrameFds);
    m.msg_controllen = room > 0 ? CMSG_SPACE(sizeof(int) * static_cast<size_t>(room)) : 0;
    if (room == 0) m.msg_control = nullptr;
    ssize_t got = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("recvmsg failed: ", std::strerror(errno)));
    }
    // Whatever arrived is owned (and closed) from here on, even when the frame is refused.
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->emplace_back(received);
      }
    }
    truncated |= (m.msg_flags & MSG_CTRUNC) != 0;
    if (got == 0) return absl::NotFoundError("end of stream");
    header += got;
    n -= static_cast<size_t>(got);
  }
  if (truncated || fds->size() > static_cast<size_t>(max_fds)) {
    return absl::DataLossError(
        absl::StrCat("a frame came with more than ", max_fds, " descriptors"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg, bool zero_after_write,
                        absl::Span<const int> fds, const google::protobuf::MessageLite* merged) {
  std::string body;
  absl::Cleanup zero = [&] {
    if (zero_after_write) explicit_bzero(body.data(), body.size());
  };
  if (!msg.SerializeToString(&body)) return absl::InternalError("cannot serialise frame");
  if (merged != nullptr && !merged->AppendToString(&body)) return absl::InternalError("cannot serialise frame");
  if (body.size() > kMaxFrameBytes) return absl::ResourceExhaustedError("frame too large");
  const uint32_t n = static_cast<uint32_t>(body.size());
  unsigned char header[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                             static_cast<unsigned char>(n >> 16),
                             static_cast<unsigned char>(n >> 24)};
  // Two writes rather than one concatenated copy: frames carry buffers of tens of MB.
  absl::Status st = WriteHeader(fd, header, sizeof(header), fds);
  if (st.ok()) st = WriteAll(fd, body.data(), body.size());
  return st;
}

absl::Status ReadFull(int fd, void* buf, size_t n, int64_t deadline_ms) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (absl::Status st = AwaitReadable(fd, deadline_ms); !st.ok()) return st;
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

absl::Status ReadFrameUntil(int fd, google::protobuf::MessageLite* msg, int64_t deadline_ms,
                            std::vector<OwnedFd>* fds, int max_fds) {
  unsigned char header[4];
  absl::Status st = ReadHeader(fd, header, 4, deadline_ms, fds, max_fds);
  if (!st.ok()) return st;
  const uint32_t n =
      header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
  if (n > kMaxFrameBytes) return absl::DataLossError("frame length out of range");
  std::string body(n, '\0');
  st = ReadFull(fd, body.data(), n, deadline_ms);
  if (!st.ok())
    return st.code() == absl::StatusCode::kNotFound ? absl::DataLossError("truncated frame") : st;
  if (!msg->ParseFromString(body)) return absl::DataLossError("malformed frame");
  return absl::OkStatus();
}

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg) {
  return ReadFrameUntil(fd, msg, -1);
}

}  // namespace kforge::worker
