#include "services/gpu-worker/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/gpu-worker/framing.h"

extern char** environ;

namespace kforge::worker {

namespace fs = std::filesystem;

std::string FindSandboxBinary() {
  if (const char* v = std::getenv("KFORGE_SANDBOX_BINARY"); v != nullptr && *v) return v;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& p : {dir / "kforge-sandbox", dir / "../services/gpu-worker/kforge-sandbox",
                              dir / "../../services/gpu-worker/kforge-sandbox",
                              dir / "../libexec/kforge-sandbox"}) {
      if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
    }
  }
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string p(path);
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      const fs::path cand = fs::path(p.substr(start, end - start)) / "kforge-sandbox";
      if (fs::is_regular_file(cand, ec)) return cand.string();
      start = end + 1;
    }
  }
  return "kforge-sandbox";
}

Sandbox::Sandbox(SandboxOptions options, v1::Backend backend)
    : options_(std::move(options)), backend_(backend) {
  if (options_.binary.empty()) options_.binary = FindSandboxBinary();
}

namespace {

// Removes the folders that sandboxes of dead worker processes left behind (a worker killed with
// -9 cannot clean up after itself). Only folders named after a process that no longer exists.
void RemoveStaleWorkDirs(const std::string& tmp) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    constexpr absl::string_view kPrefix = "kforge-sandbox-";
    if (!absl::StartsWith(name, kPrefix)) continue;
    const size_t dash = name.find('-', kPrefix.size());
    if (dash == std::string::npos) continue;
    pid_t owner = 0;
    if (!absl::SimpleAtoi(name.substr(kPrefix.size(), dash - kPrefix.size()), &owner) || owner <= 0) continue;
    if (kill(owner, 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

// The ranges a run's buffers name in the arena lie inside it.
absl::Status CheckArenaRanges(const v1::SandboxResponse& response, size_t arena_size) {
  if (!response.has_run()) return absl::OkStatus();
  for (const auto& b : response.run().buffers()) {
    if (b.arena_bytes() == 0) continue;
    const int64_t off = b.arena_offset(), len = b.arena_bytes();
    if (off < 0 || len < 0 || static_cast<uint64_t>(len) > arena_size ||
        static_cast<uint64_t>(off) > arena_size - static_cast<uint64_t>(len)) {
      return absl::InvalidArgumentError(absl::StrCat("buffer '", b.name(), "' names arena bytes [",
                                                     off, ", +", len, ") of an arena of ",
                                                     arena_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Sandbox::~Sandbox() {
  Kill();
  if (!work_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(work_dir_, ec);
  }
}

absl::Status Sandbox::Spawn() {
  if (access(options_.binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("sandbox binary ", options_.binary,
                                                      " is missing or not executable (set KFORGE_SANDBOX_BINARY)"));
  }
  if (work_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    const std::string tmp_dir = tmp && *tmp ? tmp : "/tmp";
    RemoveStaleWorkDirs(tmp_dir);
    std::string tmpl = absl::StrCat(tmp_dir, "/kforge-sandbox-", getpid(), "-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp failed: ", std::strerror(errno)));
    }
    work_dir_ = tmpl;
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings = {absl::StrCat("HOME=", work_dir_), absl::StrCat("TMPDIR=", work_dir_)};
  std::vector<std::string> cache_dirs;
  if (!options_.runtime_cache_dir.empty()) {
    for (const auto& [var, sub] : {std::pair{"POCL_CACHE_DIR", "pocl"}, std::pair{"CUDA_CACHE_PATH", "cuda"}}) {
      const std::string dir = absl::StrCat(options_.runtime_cache_dir, "/", sub);
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) {
        return absl::FailedPreconditionError(
            absl::StrCat("runtime cache folder ", dir, " cannot be created: ", ec.message()));
      }
      fs::permissions(dir, fs::perms::owner_all, ec);  // the worker's own, like the sandbox folder
      env_strings.push_back(absl::StrCat(var, "=", dir));
      cache_dirs.push_back(dir);
    }
  }
  bool have_path = false;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    // The cache folders set above win over the worker's own environment.
    if (!cache_dirs.empty() && (key == "POCL_CACHE_DIR" || key == "CUDA_CACHE_PATH")) continue;
    for (const auto& allow : options_.env_allow) {
      const bool match = absl::EndsWith(allow, "*") ? absl::StartsWith(key, allow.substr(0, allow.size() - 1))
                                                     : key == allow;
      if (match) {
        env_strings.push_back(kv);
        have_path = have_path || key == "PATH";
        break;
      }
    }
  }
  if (!have_path) env_strings.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string binary = options_.binary;
  std::vector<std::string> args = {binary, "--backend", backend_ == v1::BACKEND_CUDA ? "cuda" : "opencl"};
  if (options_.restrict_files) {
    args.emplace_back("--jail");
    for (const auto& p : options_.read_paths) {
      args.emplace_back("--read");
      args.push_back(p);
    }
    for (const auto& p : cache_dirs) {
      args.emplace_back("--write");
      args.push_back(p);
    }
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("socketpair failed: ", std::strerror(errno)));
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(sv[0]);
    close(sv[1]);
    return absl::InternalError(absl::StrCat("pipe failed: ", std::strerror(errno)));
  }
  rlimit as{static_cast<rlim_t>(options_.memory_limit_mb) << 20, static_cast<rlim_t>(options_.memory_limit_mb) << 20};
  rlimit core{0, 0};
  const bool limit_address_space = backend_ != v1::BACKEND_CUDA;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("fork failed: ", std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);  // own process group: the watchdog kills the whole group
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);
    dup2(sv[1], 0);
    dup2(sv[1], 1);
    dup2(out[1], 2);
    // No inherited descriptors beyond stdin/stdout/stderr.
    syscall(SYS_close_range, 3U, ~0U, 0U);
    setrlimit(RLIMIT_CORE, &core);
    if (options_.memory_limit_mb > 0 && limit_address_space) setrlimit(RLIMIT_AS, &as);
    if (chdir(work_dir_.c_str()) != 0) _exit(126);
    signal(SIGPIPE, SIG_DFL);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(sv[1]);
  close(out[1]);
  pid_ = pid;
  arena_ = ArenaMapping();  // a new child makes its own
  fd_ = sv[0];
  drain_stop_ = false;
  output_budget_ = options_.max_output_bytes;
  drain_ = std::thread([this, fd = out[0]] { DrainOutput(fd); });
  ++generation_;
  return absl::OkStatus();
}

std::string Sandbox::Reap(bool kill_first) {
  if (pid_ <= 0) return "not running";
  if (kill_first) kill(-pid_, SIGKILL);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (!kill_first) kill(-pid_, SIGKILL);  // stray grandchildren of a crashed child
  pid_ = -1;
  StopDrain();
  if (r < 0) return "lost track of the sandbox process";
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return absl::StrCat("sandbox killed by signal SIG", name != nullptr ? name : std::to_string(sig));
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (code == 127) return "sandbox binary could not be started";
    if (code == 4) return "device reported a sticky error; sandbox restarted";
    return absl::StrCat("sandbox exited with status ", code);
  }
  return "sandbox ended";
}

void Sandbox::LimitCpu(double timeout_seconds) {
  if (options_.cpu_seconds_per_timeout_second <= 0 || pid_ <= 0) return;
  // utime and stime are fields 14 and 15 of /proc/PID/stat, in clock ticks; the command name
  // (field 2) may hold spaces, so count from the closing parenthesis.
  std::ifstream in(absl::StrCat("/proc/", pid_.load(), "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return;
  std::istringstream fields(stat.substr(close + 2));
  std::string skip;
  for (int i = 3; i < 14; ++i) fields >> skip;
  unsigned long long utime = 0, stime = 0;
  fields >> utime >> stime;
  const double used = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  const rlim_t soft = static_cast<rlim_t>(used + timeout_seconds * options_.cpu_seconds_per_timeout_second + 5);
  // Only the soft limit moves. Raising a hard limit needs CAP_SYS_RESOURCE, which a worker in a
  // container lacks: a hard limit set once could not follow, and would end the sandbox after its
  // first few minutes of work. SIGXCPU at the soft limit ends a spinning kernel; a sandbox that
  // catches it still meets the wall-clock watchdog.
  rlimit old{};
  if (prlimit(pid_, RLIMIT_CPU, nullptr, &old) != 0) return;
  const rlimit lim{std::min(soft, old.rlim_max), old.rlim_max};
  prlimit(pid_, RLIMIT_CPU, &lim, nullptr);
}

void Sandbox::Kill() {
  if (pid_ > 0) Reap(/*kill_first=*/true);
}

void Sandbox::Interrupt() {
  const pid_t pid = pid_.load();
  if (pid > 0) kill(-pid, SIGKILL);
}

void Sandbox::DrainOutput(int fd) {
  char buf[16384];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, 200);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) {
      if (drain_stop_) break;
      continue;
    }
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    const int64_t allowed = std::min<int64_t>(n, std::max<int64_t>(output_budget_.fetch_sub(n), 0));
    if (allowed > 0) (void)!write(2, buf, static_cast<size_t>(allowed));
    if (allowed < n) output_dropped_ += n - allowed;
  }
  close(fd);
}

void Sandbox::StopDrain() {
  drain_stop_ = true;
  if (drain_.joinable()) drain_.join();
  drain_stop_ = false;
}

absl::StatusOr<v1::HelloResponse> Sandbox::EnsureStarted() {
  if (pid_ > 0) return hello_;
  const int64_t t0 = MonotonicMillis();
  if (absl::Status st = Spawn(); !st.ok()) return st;
  v1::SandboxRequest req;
  req.mutable_hello()->set_backend(backend_);
  if (absl::Status st = WriteFrame(fd_, req); !st.ok()) {
    const std::string why = Reap(true);
    return absl::UnavailableError(absl::StrCat("cannot start ", options_.binary, ": ", why));
  }
  v1::SandboxResponse resp;
  const int64_t deadline = MonotonicMillis() + static_cast<int64_t>(options_.start_timeout_seconds * 1000);
  if (absl::Status st = ReadFrameUntil(fd_, &resp, deadline); !st.ok()) {
    const std::string why = Reap(true);
    return absl::UnavailableError(absl::StrCat("sandbox ", options_.binary, " did not start: ", why));
  }
  hello_ = resp.hello();
  last_start_seconds_ = (MonotonicMillis() - t0) / 1000.0;
  return hello_;
}

absl::Status Sandbox::AcceptArena(const std::vector<OwnedFd>& fds,
                                  const v1::SandboxResponse& response) {
  absl::Status st;
  if (fds.size() == 1) {
    auto mapped = ArenaMapping::Map(fds[0], static_cast<size_t>(options_.max_output_arena_bytes));
    if (mapped.ok()) {
      arena_ = *std::move(mapped);
    } else {
      st = mapped.status();
    }
  }
  if (st.ok()) st = CheckArenaRanges(response, arena_.bytes().size());
  return st.ok() ? st : absl::DataLossError(st.message());
}

Sandbox::CallResult Sandbox::Call(const v1::SandboxRequest& request, double timeout_seconds) {
  CallResult out;
  auto hello = EnsureStarted();
  if (!hello.ok()) {
    out.message = std::string(hello.status().message());
    return out;
  }
  if (!hello->available()) {
    out.message = hello->unavailable_reason();
    return out;
  }
  LimitCpu(timeout_seconds);
  if (const int64_t dropped = output_dropped_.exchange(0); dropped > 0) {
    output_dropped_total_ += dropped;
    const std::string line = absl::StrCat("kforge-sandbox: dropped ", dropped, " bytes of output past the cap of ",
                                          options_.max_output_bytes, " per request\n");
    (void)!write(2, line.data(), line.size());
  }
  output_budget_ = options_.max_output_bytes;
  bytes_sent_ += static_cast<int64_t>(request.ByteSizeLong()) + 4;  // + the length prefix
  if (absl::Status st = WriteFrame(fd_, request); !st.ok()) {
    out.status = CallStatus::kCrashed;
    out.message = Reap(false);
    return out;
  }
  const int64_t deadline = MonotonicMillis() + static_cast<int64_t>(timeout_seconds * 1000);
  std::vector<OwnedFd> fds;
  absl::Status st = ReadFrameUntil(fd_, &out.response, deadline, &fds, /*max_fds=*/1);
  if (absl::IsDeadlineExceeded(st)) {
    Reap(/*kill_first=*/true);
    out.status = CallStatus::kTimeout;
    out.message = absl::StrCat("no answer within ", timeout_seconds, " s; sandbox killed");
    return out;
  }
  if (st.ok()) st = AcceptArena(fds, out.response);
  if (absl::IsDataLoss(st)) {
    // A live child that answers nonsense (a malformed frame, too many descriptors, outputs sent
    // wrongly) is broken or subverted: killed, not trusted again.
    Reap(/*kill_first=*/true);
    out.status = CallStatus::kCrashed;
    out.message = absl::StrCat("sandbox protocol error: ", st.message());
    out.response.Clear();
    return out;
  }
  if (!st.ok()) {
    out.status = CallStatus::kCrashed;
    out.message = Reap(false);
    if (absl::StrContains(out.message, "SIGXCPU")) {
      // Our own CPU-time backstop (LimitCpu): the request ran too long, a timeout, not a crash
      // that a fresh sandbox might not repeat.
      out.status = CallStatus::kTimeout;
      out.message = "CPU time limit of the request exceeded (SIGXCPU); sandbox killed";
    }
    return out;
  }
  out.arena = arena_.bytes();
  bytes_received_ += static_cast<int64_t>(out.response.ByteSizeLong()) + 4;
  if (out.response.has_run()) {
    for (const auto& b : out.response.run().buffers()) bytes_received_ += b.arena_bytes();
  }
  if (!out.response.error().empty()) {
    out.message = out.response.error();
    return out;
  }
  out.status = CallStatus::kOk;
  // A sandbox that reported a sticky device error exits right after: collect it now.
  if (out.response.has_run() && out.response.run().outcome() == v1::OUTCOME_CRASHED) Reap(false);
  return out;
}

}  // namespace kforge::worker
