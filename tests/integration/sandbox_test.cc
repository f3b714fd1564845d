// The sandbox process itself: what it inherits (no secrets in its environment, no descriptors
// of the worker), the resource limits it runs under, and its empty working folder.

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "services/gpu-worker/sandbox.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

namespace fs = std::filesystem;

std::string ReadProc(pid_t pid, const std::string& what) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + what, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string LimitLine(const std::string& limits, const std::string& name) {
  std::istringstream in(limits);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) == 0) return line;
  }
  return "";
}

TEST(SandboxTest, InheritsNoSecretsNoDescriptorsAndRunsUnderLimits) {
  testing::TempDir dir;
  const std::string secret_path = dir.Write("secret.txt", "worker-private");
  // A descriptor the worker holds without O_CLOEXEC, and a secret in the worker's environment.
  const int leaked = open(secret_path.c_str(), O_RDONLY);
  ASSERT_GE(leaked, 0);
  setenv("KFORGE_TEST_DATABASE_PASSWORD", "hunter2", 1);

  SandboxOptions opts;
  opts.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
  Sandbox sb(opts, v1::BACKEND_OPENCL);
  auto hello = sb.EnsureStarted();
  ASSERT_TRUE(hello.ok()) << hello.status();
  ASSERT_TRUE(sb.running());
  const pid_t pid = sb.pid();

  const std::string env = ReadProc(pid, "environ");
  EXPECT_EQ(env.find("hunter2"), std::string::npos);
  EXPECT_EQ(env.find("KFORGE_TEST_DATABASE_PASSWORD"), std::string::npos);
  EXPECT_NE(env.find("HOME="), std::string::npos);

  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(e.path(), ec);
    EXPECT_NE(target.string(), secret_path) << "fd " << e.path().filename() << " leaked into the sandbox";
  }
  // stdin/stdout are the frame socket, not the worker's terminal or files.
  EXPECT_EQ(fs::read_symlink("/proc/" + std::to_string(pid) + "/fd/0").string().rfind("socket:", 0), 0u);

  // Its working folder is its own, empty of the worker's files.
  const fs::path cwd = fs::read_symlink("/proc/" + std::to_string(pid) + "/cwd");
  EXPECT_NE(cwd, fs::current_path());
  EXPECT_FALSE(fs::exists(cwd / "secret.txt"));

  // Limits: no core dumps, bounded address space (OpenCL), and after a request a CPU-time bound.
  v1::SandboxRequest req;
  req.mutable_hello()->set_backend(v1::BACKEND_OPENCL);
  Sandbox::CallResult r = sb.Call(req, 10);
  ASSERT_EQ(r.status, Sandbox::CallStatus::kOk) << r.message;
  const std::string limits = ReadProc(pid, "limits");
  EXPECT_NE(LimitLine(limits, "Max core file size").find(" 0 "), std::string::npos) << limits;
  EXPECT_NE(LimitLine(limits, "Max address space").find(std::to_string(16384ull << 20)), std::string::npos) << limits;
  // The CPU-time bound is the soft limit, moved before every request (a hard limit could not be
  // raised again without CAP_SYS_RESOURCE: it would end a busy sandbox after a few minutes).
  auto soft_cpu = [&] {
    std::istringstream fields(LimitLine(ReadProc(pid, "limits"), "Max cpu time").substr(26));
    std::string soft;
    fields >> soft;
    return soft;
  };
  const std::string first = soft_cpu();
  ASSERT_NE(first, "unlimited") << limits;
  ASSERT_EQ(sb.Call(req, 100).status, Sandbox::CallStatus::kOk);
  EXPECT_GT(std::stoll(soft_cpu()), std::stoll(first)) << ReadProc(pid, "limits");

  close(leaked);
  unsetenv("KFORGE_TEST_DATABASE_PASSWORD");
}

// A worker killed with -9 leaves its sandboxes' folders behind; the next worker removes the
// folders of processes that no longer exist, and only those.
TEST(SandboxTest, FoldersOfDeadWorkersAreRemoved) {
  testing::TempDir tmp;
  const std::string stale = tmp.path() + "/kforge-sandbox-999999999-abcdef";
  const std::string live = tmp.path() + "/kforge-sandbox-" + std::to_string(getppid()) + "-abcdef";
  const std::string other = tmp.path() + "/kforge-sandbox-notapid";
  for (const auto& d : {stale, live, other}) fs::create_directories(d + "/sub");
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", tmp.path().c_str(), 1);
  {
    SandboxOptions opts;
    opts.binary = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
    Sandbox sb(opts, v1::BACKEND_OPENCL);
    ASSERT_TRUE(sb.EnsureStarted().ok());
    EXPECT_EQ(sb.work_dir().rfind(tmp.path() + "/kforge-sandbox-" + std::to_string(getpid()) + "-", 0), 0u)
        << sb.work_dir();
  }
  if (old != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
}

TEST(SandboxTest, MissingBinaryIsAClearError) {
  SandboxOptions opts;
  opts.binary = "/nonexistent/kforge-sandbox";
  Sandbox sb(opts, v1::BACKEND_OPENCL);
  auto hello = sb.EnsureStarted();
  ASSERT_FALSE(hello.ok());
  EXPECT_NE(std::string(hello.status().message()).find("/nonexistent/kforge-sandbox"), std::string::npos)
      << hello.status();
}

// Results in the output arena are accepted only as the protocol says: one sealed arena, every
// buffer's range inside it. Anything else is a sandbox not to be trusted again: killed, the call
// crashed, nothing of its answer kept.
TEST(SandboxTest, ArenaOutputsAreAcceptedOnlyFromASealedArenaAndInsideIt) {
  auto open_fds = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const int fds_before = open_fds();
  struct Case {
    const char* mode;
    const char* why;  // in the message; "" = accepted
  };
  for (const Case& c :
       {Case{"honest", ""}, Case{"unsealed", "not sealed"},
        Case{"out-of-range", "names arena bytes [4093, +7) of an arena of 4096"},
        Case{"huge-offset", "names arena bytes [9223372036854775807, +7)"},
        Case{"no-arena", "of an arena of 0"}, Case{"two-files", "more than 1 descriptors"}}) {
    SCOPED_TRACE(c.mode);
    setenv("KFORGE_FAKE_SANDBOX", c.mode, 1);
    SandboxOptions opts;
    opts.binary = testing::BinaryDir() + "/tests/kforge-test-fake-sandbox";
    opts.restrict_files = false;
    opts.env_allow.push_back("KFORGE_FAKE_SANDBOX");
    Sandbox sb(opts, v1::BACKEND_OPENCL);
    v1::SandboxRequest req;
    req.mutable_run()->set_share_outputs_min_bytes(1);
    for (int call = 0; call < 2; ++call) {
      Sandbox::CallResult r = sb.Call(req, 10);
      if (std::string(c.why).empty()) {
        // The second response sends no arena: the first one's is used again.
        ASSERT_EQ(r.status, Sandbox::CallStatus::kOk) << r.message;
        ASSERT_EQ(r.response.run().buffers_size(), 1);
        EXPECT_EQ(r.Bytes(r.response.run().buffers(0)), "answers");
        EXPECT_TRUE(sb.running());
      } else {
        EXPECT_EQ(r.status, Sandbox::CallStatus::kCrashed);
        EXPECT_NE(r.message.find("protocol error"), std::string::npos) << r.message;
        EXPECT_NE(r.message.find(c.why), std::string::npos) << r.message;
        EXPECT_EQ(r.response.run().buffers_size(), 0) << "nothing of the answer is kept";
        EXPECT_FALSE(sb.running()) << "the sandbox was killed";
        break;
      }
    }
  }
  unsetenv("KFORGE_FAKE_SANDBOX");
  EXPECT_EQ(open_fds(), fds_before) << "every file a sandbox sent is closed again";
}

}  // namespace
}  // namespace kforge::worker
