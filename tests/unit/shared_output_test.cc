// The output arena (the sandbox's results in a shared memory file) and the frames that carry its
// descriptor: the worker maps only a file nobody can shrink or grow, the sandbox clears what a run
// left, and a frame's descriptors arrive with it, never with another.

#include "services/gpu-worker/shared_output.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "gtest/gtest.h"
#include "kforge/v1/sandbox.pb.h"
#include "services/gpu-worker/framing.h"

namespace kforge::worker {
namespace {

TEST(OutputArenaTest, TheWorkerSeesWhatTheSandboxWroteUntilItIsCleared) {
  OutputArena arena;
  ASSERT_TRUE(arena.Reserve(7).ok());
  OwnedFd fd = arena.TakeNewFile();
  ASSERT_TRUE(fd.valid());
  EXPECT_FALSE(arena.TakeNewFile().valid()) << "handed over once";
  auto m = ArenaMapping::Map(fd, 1 << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  std::memcpy(arena.data(), "answers", 7);
  arena.MarkWritten(7);
  EXPECT_EQ(m->bytes().substr(0, 7), "answers");
  arena.Clear();
  EXPECT_EQ(m->bytes().substr(0, 7), std::string(7, '\0'));

  // Sealed: whoever holds the descriptor can neither shrink nor grow it.
  EXPECT_NE(ftruncate(fd.get(), 1), 0);
  EXPECT_NE(ftruncate(fd.get(), 1 << 20), 0);
}

TEST(OutputArenaTest, GrowingReplacesTheArenaAndClearsTheOldOne) {
  OutputArena arena;
  ASSERT_TRUE(arena.Reserve(100).ok());
  OwnedFd first = arena.TakeNewFile();
  auto old_view = ArenaMapping::Map(first, 1 << 30);
  ASSERT_TRUE(old_view.ok());
  std::memcpy(arena.data(), "secret", 6);
  arena.MarkWritten(6);
  ASSERT_TRUE(arena.Reserve(100).ok());
  EXPECT_FALSE(arena.TakeNewFile().valid()) << "room enough: the same arena";
  ASSERT_TRUE(arena.Reserve(1 << 20).ok());
  OwnedFd second = arena.TakeNewFile();
  ASSERT_TRUE(second.valid());
  EXPECT_GE(arena.capacity(), size_t{1} << 20);
  EXPECT_EQ(old_view->bytes().substr(0, 6), std::string(6, '\0')) << "the old arena was cleared";
}

TEST(OutputArenaTest, FilesASandboxCouldStillResizeAreRefused) {
  // A memory file without seals: the sender could truncate it under the worker's mapping (SIGBUS).
  OwnedFd unsealed(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(unsealed.get(), 4096), 0);
  auto m = ArenaMapping::Map(unsealed, 1 << 20);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("not sealed"), std::string::npos) << m.status();

  // Sealed against shrinking only.
  ASSERT_EQ(fcntl(unsealed.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_FALSE(ArenaMapping::Map(unsealed, 1 << 20).ok());

  // An ordinary file, and a pipe.
  char path[] = "/tmp/kforge-arena-XXXXXX";
  OwnedFd regular(mkstemp(path));
  unlink(path);
  ASSERT_EQ(ftruncate(regular.get(), 4096), 0);
  EXPECT_FALSE(ArenaMapping::Map(regular, 1 << 20).ok());
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  OwnedFd read_end(p[0]), write_end(p[1]);
  auto piped = ArenaMapping::Map(read_end, 1 << 20);
  ASSERT_FALSE(piped.ok());
  EXPECT_NE(piped.status().message().find("not a memory file"), std::string::npos)
      << piped.status();

  // Larger than the caller allows.
  OutputArena arena;
  ASSERT_TRUE(arena.Reserve(8192).ok());
  OwnedFd big = arena.TakeNewFile();
  EXPECT_FALSE(ArenaMapping::Map(big, 4096).ok());
  EXPECT_TRUE(ArenaMapping::Map(big, 8192).ok());
}

class FrameFdsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    a_ = OwnedFd(sv[0]);
    b_ = OwnedFd(sv[1]);
  }
  static OwnedFd Arena() {
    OutputArena arena;
    EXPECT_TRUE(arena.Reserve(10).ok());
    return arena.TakeNewFile();
  }
  OwnedFd a_, b_;
};

TEST_F(FrameFdsTest, DescriptorsArriveWithTheirFrameOnly) {
  OwnedFd one = Arena(), two = Arena();
  v1::SandboxResponse first, second;
  first.set_error("first");
  second.set_error("second");
  ASSERT_TRUE(WriteFrame(a_.get(), first, false, std::vector<int>{one.get(), two.get()}).ok());
  ASSERT_TRUE(WriteFrame(a_.get(), second).ok());

  v1::SandboxResponse got;
  std::vector<OwnedFd> fds;
  ASSERT_TRUE(ReadFrameUntil(b_.get(), &got, -1, &fds).ok());
  EXPECT_EQ(got.error(), "first");
  ASSERT_EQ(fds.size(), 2u);
  EXPECT_TRUE(ArenaMapping::Map(fds[0], 1 << 20).ok());
  EXPECT_NE(fcntl(fds[0].get(), F_GETFD) & FD_CLOEXEC, 0) << "received close-on-exec";

  fds.clear();
  ASSERT_TRUE(ReadFrameUntil(b_.get(), &got, -1, &fds).ok());
  EXPECT_EQ(got.error(), "second");
  EXPECT_TRUE(fds.empty());
}

TEST_F(FrameFdsTest, DescriptorsNobodyAskedForAreDroppedAndTooManyRefuseTheFrame) {
  OwnedFd f = Arena();
  v1::SandboxResponse msg;
  msg.set_error("e");
  // A reader that takes no descriptors still reads the frame; the kernel drops what came along.
  ASSERT_TRUE(WriteFrame(a_.get(), msg, false, std::vector<int>{f.get()}).ok());
  v1::SandboxResponse got;
  ASSERT_TRUE(ReadFrameUntil(b_.get(), &got, -1).ok());
  EXPECT_EQ(got.error(), "e");

  std::vector<int> many(kMaxFrameFds + 1, f.get());
  EXPECT_FALSE(WriteFrame(a_.get(), msg, false, many).ok()) << "the writer refuses";
  // Sent raw, past WriteFrame's check: the reader refuses the frame (and closes them all).
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxFrameFds + 1))] = {};
  unsigned char header[4] = {0, 0, 0, 0};
  iovec iov{header, sizeof(header)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * many.size());
  std::memcpy(CMSG_DATA(c), many.data(), sizeof(int) * many.size());
  ASSERT_EQ(sendmsg(a_.get(), &m, 0), 4);
  std::vector<OwnedFd> fds;
  auto st = ReadFrameUntil(b_.get(), &got, -1, &fds);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
}

}  // namespace
}  // namespace kforge::worker
