// The sandbox's jail, tried from inside a sandbox process (kforge-test-jail-probe, started by the
// worker's Sandbox as kforge-sandbox is and jailed by the same JailSelf): no network of any kind,
// no signal to the worker, no shared memory outside, no /etc/shadow, and an unprivileged user when
// the worker is root. And the jail fails closed: with sandbox.require_jail, a kforge-sandbox that
// cannot jail itself serves nothing, and a kforge-gpu-worker whose sandboxes cannot refuses to
// start, saying why.

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "services/gpu-worker/child_process.h"
#include "services/gpu-worker/framing.h"
#include "services/gpu-worker/sandbox.h"
#include "services/gpu-worker/sandbox_jail.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

// A loopback TCP listener and an abstract unix listener a jailed process must not reach.
struct Listeners {
  Listeners() {
    tcp = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(tcp, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(tcp, 8), 0);
    socklen_t len = sizeof(a);
    getsockname(tcp, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    abstract_name = absl::StrCat("kforge-jail-test-", getpid());
    unix_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un u{};
    u.sun_family = AF_UNIX;
    std::memcpy(u.sun_path + 1, abstract_name.data(), abstract_name.size());
    EXPECT_EQ(bind(unix_fd, reinterpret_cast<sockaddr*>(&u),
                   static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract_name.size())),
              0);
    EXPECT_EQ(listen(unix_fd, 8), 0);
  }
  ~Listeners() {
    close(tcp);
    close(unix_fd);
  }
  int tcp = -1, unix_fd = -1, port = 0;
  std::string abstract_name;
};

// What the probe reported: "tcp=refused;udp=refused;...;uid=65534".
std::map<std::string, std::string> Probe(bool jail, int port, const std::string& abstract_name) {
  setenv("KFORGE_PROBE_TCP_PORT", absl::StrCat(port).c_str(), 1);
  setenv("KFORGE_PROBE_ABSTRACT", abstract_name.c_str(), 1);
  setenv("KFORGE_PROBE_PARENT_PID", absl::StrCat(getpid()).c_str(), 1);
  SandboxOptions opts;
  opts.binary = testing::BinaryDir() + "/tests/kforge-test-jail-probe";
  opts.restrict_files = jail;
  opts.env_allow.push_back("KFORGE_PROBE_*");
  Sandbox sb(opts, v1::BACKEND_OPENCL);
  absl::StatusOr<v1::HelloResponse> hello = sb.EnsureStarted();
  EXPECT_TRUE(hello.ok()) << hello.status();
  std::map<std::string, std::string> out;
  if (!hello.ok()) return out;
  EXPECT_EQ(hello->jailed(), jail) << hello->jail_message();
  for (absl::string_view kv : absl::StrSplit(hello->unavailable_reason(), ';', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (parts.size() == 2) out[parts[0]] = parts[1];
  }
  return out;
}

TEST(SandboxJailTest, AJailedSandboxReachesNoNetworkNoSignalNoSharedMemoryOutside) {
  Listeners l;
  const auto got = Probe(/*jail=*/true, l.port, l.abstract_name);
  for (const char* what : {"tcp", "udp", "abstract", "shm", "sysv", "kill", "shadow"}) {
    EXPECT_EQ(got.count(what) ? got.at(what) : "missing", "refused") << what;
  }
  // Kernels' runtimes may still start processes (PoCL runs the linker).
  EXPECT_EQ(got.count("fork") ? got.at("fork") : "", "ALLOWED");
  if (geteuid() == 0) {
    EXPECT_NE(got.count("uid") ? got.at("uid") : "0", "0") << "a root worker's sandbox stays root";
  }
}

TEST(SandboxJailTest, TheProbeCanTellWithoutAJail) {
  // The same probe unjailed: the attempts above are real (a probe that could do nothing would pass
  // the test above whatever the jail did).
  Listeners l;
  const auto got = Probe(/*jail=*/false, l.port, l.abstract_name);
  for (const char* what : {"tcp", "udp", "abstract", "shm", "sysv"}) {
    EXPECT_EQ(got.count(what) ? got.at(what) : "missing", "ALLOWED") << what;
  }
}

TEST(SandboxJailTest, WithoutForkOnlyThreadsStart) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!ApplySeccompJail(/*allow_fork=*/false).ok()) _exit(10);
    std::thread t([] {});  // threads still start
    t.join();
    const pid_t child = fork();
    if (child == 0) _exit(0);
    _exit(child < 0 && errno == EPERM ? 0 : 11);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Runs `program` with Landlock's syscalls failing as on a kernel without it (a seccomp filter the
// child inherits, and everything it starts).
testing::RunResult RunWithoutLandlock(const std::string& program, const std::vector<std::string>& args,
                                      const std::string& stdin_bytes) {
  int in[2], out[2], err[2];
  EXPECT_EQ(pipe(in), 0);
  EXPECT_EQ(pipe(out), 0);
  EXPECT_EQ(pipe(err), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
    std::vector<sock_filter> f = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_landlock_create_ruleset, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    sock_fprog prog{.len = static_cast<unsigned short>(f.size()), .filter = f.data()};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
      _exit(120);
    }
    std::vector<char*> argv = {const_cast<char*>(program.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    alarm(120);  // survives the exec: a program that should have stopped cannot hang the test
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  EXPECT_EQ(write(in[1], stdin_bytes.data(), stdin_bytes.size()), static_cast<ssize_t>(stdin_bytes.size()));
  close(in[1]);
  testing::RunResult r;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) r.out.append(buf, static_cast<size_t>(n));
  for (ssize_t n; (n = read(err[0], buf, sizeof(buf))) > 0;) r.err.append(buf, static_cast<size_t>(n));
  close(out[0]);
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(SandboxJailTest, ARequiredJailThatCannotBeAppliedStopsTheSandbox) {
  testing::TempDir dir;
  // One hello, as the worker sends it.
  v1::SandboxRequest hello;
  hello.mutable_hello()->set_backend(v1::BACKEND_OPENCL);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  ASSERT_TRUE(WriteFrame(p[1], hello).ok());
  close(p[1]);
  std::string frame;
  char buf[256];
  for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) > 0;) frame.append(buf, static_cast<size_t>(n));
  close(p[0]);
  const std::string sandbox = testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox";
  const testing::RunResult r = RunWithoutLandlock(sandbox, {"--jail", "--require-jail"}, frame);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_NE(r.out.find("cannot jail itself"), std::string::npos) << r.out;
  // Not required: it serves on, and its hello says it is not jailed.
  const testing::RunResult lax = RunWithoutLandlock(sandbox, {"--jail"}, frame);
  EXPECT_EQ(lax.exit_code, 0) << lax.err;
  EXPECT_NE(lax.err.find("not jailed"), std::string::npos) << lax.err;
}

TEST(SandboxJailTest, AWorkerThatRequiresAJailItCannotHaveRefusesToStart) {
  testing::TempDir dir;
  const std::string config = dir.Write("worker.yaml",
                                       "worker: {backends: opencl}\n"
                                       "server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\"}\n"
                                       "sandbox: {require_jail: true}\n");
  const testing::RunResult r =
      RunWithoutLandlock(testing::BinaryDir() + "/services/gpu-worker/kforge-gpu-worker", {"--config", config}, "");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("sandbox.require_jail is on"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Landlock"), std::string::npos) << r.err;
}

// A root worker built in a folder closed to others (a checkout in /root): its sandboxes run as
// nobody, who cannot reach the binary there. They start from a copy that nobody can read and
// only root can write, made once and reused.
TEST(SandboxJailTest, ARootWorkerBuiltInAClosedFolderStillStartsItsSandboxes) {
  if (geteuid() != 0) GTEST_SKIP() << "the sandboxes change user only under a root worker";
  testing::TempDir dir;
  const std::string closed = dir.path() + "/closed";
  std::filesystem::create_directories(closed + "/bin");
  const std::string binary = closed + "/bin/kforge-sandbox";
  std::filesystem::copy_file(testing::BinaryDir() + "/services/gpu-worker/kforge-sandbox", binary);
  ASSERT_EQ(chmod(closed.c_str(), 0700), 0);
  const ChildUser nobody = ChildUserFor(-1);
  ASSERT_FALSE(ReachableBy(binary, nobody));
  absl::StatusOr<std::string> copy = ReachableCopy(binary, nobody);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->rfind("/var/tmp/kforge-reachable/", 0), 0u) << *copy;
  EXPECT_TRUE(ReachableBy(*copy, nobody));
  struct stat st {};
  ASSERT_EQ(stat(copy->c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  EXPECT_EQ(*ReachableCopy(binary, nobody), *copy) << "made once";

  SandboxOptions opts;
  opts.binary = binary;
  Sandbox sb(opts, v1::BACKEND_OPENCL);
  absl::StatusOr<v1::HelloResponse> hello = sb.EnsureStarted();
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_TRUE(hello->jailed()) << hello->jail_message();
  // A folder (the kforge_torch package) is copied whole; a changed file makes a new copy.
  dir.Write("closed/pkg/a.py", "x = 1\n");
  dir.Write("closed/pkg/sub/b.py", "y = 2\n");
  absl::StatusOr<std::string> pkg = ReachableCopy(closed + "/pkg", nobody);
  ASSERT_TRUE(pkg.ok()) << pkg.status();
  EXPECT_TRUE(std::filesystem::exists(*pkg + "/sub/b.py"));
  dir.Write("closed/pkg/a.py", "x = 10\n");
  absl::StatusOr<std::string> again = ReachableCopy(closed + "/pkg", nobody);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(*again, *pkg);
  for (const std::string& made : {*copy, *pkg, *again}) {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(made).parent_path(), ec);
  }
}

}  // namespace
}  // namespace kforge::worker
