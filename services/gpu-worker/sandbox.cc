#include "services/gpu-worker/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "common/hash.h"
#include "common/status_macros.h"
#include "services/gpu-worker/child_process.h"
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
  KF_ASSIGN_OR_RETURN(const ChildUser user,
                      PrepareChild(options_.binary, options_.run_as_uid, "kforge-sandbox", &work_dir_));
  std::vector<std::string> extra_env;
  std::vector<std::string> cache_dirs;
  if (!options_.runtime_cache_dir.empty()) {
    // The child's user must reach the folder (root's home is closed to others): else one of the
    // same name under /var/tmp, kept across processes as well.
    std::string cache_root = options_.runtime_cache_dir;
    if (!ReachableBy(cache_root, user)) {
      cache_root = absl::StrCat("/var/tmp/kforge-runtime-cache/", Sha256Hex(cache_root).substr(0, 16));
    }
    for (const auto& [var, sub] : {std::pair{"POCL_CACHE_DIR", "pocl"}, std::pair{"CUDA_CACHE_PATH", "cuda"}}) {
      const std::string dir = absl::StrCat(cache_root, "/", sub);
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) {
        return absl::FailedPreconditionError(
            absl::StrCat("runtime cache folder ", dir, " cannot be created: ", ec.message()));
      }
      fs::permissions(dir, fs::perms::owner_all, ec);  // the child's own, like its folder
      KF_RETURN_IF_ERROR(GiveToChild(dir, user));
      // The cache folders win over the worker's own environment.
      extra_env.push_back(absl::StrCat(var, "=", dir));
      cache_dirs.push_back(dir);
    }
  }
  ChildSpec spec;
  // A root worker's build may lie where the sandbox's user cannot reach it (root's home).
  KF_ASSIGN_OR_RETURN(spec.binary, ReachableCopy(options_.binary, user));
  spec.env = ChildEnvironment(work_dir_, options_.env_allow, extra_env);
  spec.args = {"--backend", backend_ == v1::BACKEND_CUDA ? "cuda" : "opencl"};
  if (options_.require_jail) spec.args.emplace_back("--require-jail");
  if (options_.restrict_files) {
    spec.args.emplace_back("--jail");
    for (const auto& p : options_.read_paths) {
      spec.args.emplace_back("--read");
      spec.args.push_back(p);
    }
    for (const auto& p : cache_dirs) {
      spec.args.emplace_back("--write");
      spec.args.push_back(p);
    }
  }
  spec.work_dir = work_dir_;
  // The CUDA driver reserves address space far beyond any physical memory.
  if (backend_ != v1::BACKEND_CUDA) spec.address_space_bytes = options_.memory_limit_mb << 20;
  spec.user = user;
  KF_ASSIGN_OR_RETURN(Child child, StartChild(spec));
  pid_ = child.pid;
  arena_ = ArenaMapping();  // a new child makes its own
  fd_ = child.fd;
  drain_stop_ = false;
  output_budget_ = options_.max_output_bytes;
  drain_ = std::thread([this, fd = child.err_fd] { DrainOutput(fd); });
  ++generation_;
  return absl::OkStatus();
}

std::string Sandbox::Reap(bool kill_first) {
  if (pid_ <= 0) return "not running";
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  int code = -1;
  const std::string how = ReapChild(pid_, kill_first, &code);
  pid_ = -1;
  StopDrain();
  if (code == 4) return "device reported a sticky error; sandbox restarted";
  return absl::StrCat("sandbox ", how);
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
  // The child bounds its own CPU time per request too: a worker that started it as another user may
  // not move its limit (LimitCpu needs CAP_SYS_RESOURCE then).
  v1::SandboxRequest cpu;
  if (options_.cpu_seconds_per_timeout_second > 0) {
    cpu.set_cpu_limit_seconds(timeout_seconds * options_.cpu_seconds_per_timeout_second);
  }
  bytes_sent_ += static_cast<int64_t>(request.ByteSizeLong() + cpu.ByteSizeLong()) + 4;  // + the length prefix
  if (absl::Status st = WriteFrame(fd_, request, false, {}, &cpu); !st.ok()) {
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
