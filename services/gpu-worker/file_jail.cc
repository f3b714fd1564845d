#include "services/gpu-worker/file_jail.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace kforge::worker {

namespace {

constexpr uint64_t kFileRead = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_EXECUTE;
constexpr uint64_t kDirRead = kFileRead | LANDLOCK_ACCESS_FS_READ_DIR;
constexpr uint64_t kFileWrite = kFileRead | LANDLOCK_ACCESS_FS_WRITE_FILE;
constexpr uint64_t kDirWrite = kDirRead | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                               LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                               LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                               LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                               LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
// Every right of ABI 1: what the ruleset governs (anything not granted below is refused).
constexpr uint64_t kAbi1 = kDirWrite;
// Newer than Debian 12's headers: ABI 3's truncate right, ABI 4's TCP rights, ABI 6's scopes.
constexpr uint64_t kAccessFsTruncate = 1ULL << 14;
constexpr uint64_t kAccessNetBindTcp = 1ULL << 0;
constexpr uint64_t kAccessNetConnectTcp = 1ULL << 1;
constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0;
constexpr uint64_t kScopeSignal = 1ULL << 1;

// landlock_ruleset_attr as of ABI 6; the kernel is told how much of it it knows.
struct RulesetAttr {
  uint64_t handled_access_fs = 0;
  uint64_t handled_access_net = 0;
  uint64_t scoped = 0;
};

// Every entry of /dev but the shared-memory and message-queue file systems.
std::vector<std::string> DeviceNodes() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = e.path().filename().string();
    // Links (/dev/stderr, /dev/fd) lead to this process's descriptors, not to device nodes.
    if (name == "shm" || name == "mqueue" || e.is_symlink(ec)) continue;
    out.push_back(e.path().string());
  }
  return out;
}

}  // namespace

int LandlockAbi() {
  const long v = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return v < 0 ? 0 : static_cast<int>(v);
}

FileJail SandboxJail(v1::Backend backend, const std::string& work_dir,
                     const std::vector<std::string>& extra_read,
                     const std::vector<std::string>& extra_write) {
  FileJail j;
  // Libraries, tools (PoCL runs the system linker), the CUDA toolkit under /usr/local and /opt.
  j.read_only = {"/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/opt",
                 // The dynamic loader's cache and the OpenCL ICD list; nothing else of /etc.
                 "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/OpenCL",
                 // Topology the runtimes read (hwloc, the CUDA driver), and this process's own /proc.
                 "/sys", "/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat"};
  if (backend == v1::BACKEND_CUDA) {
    // The NVIDIA driver's own /proc entries and the kernel settings it consults.
    for (const char* p : {"/proc/driver", "/proc/devices", "/proc/modules", "/proc/sys/vm",
                          "/etc/nvidia", "/run/nvidia-persistenced", "/var/run/nvidia-persistenced"}) {
      j.read_only.emplace_back(p);
    }
  }
  j.read_only.insert(j.read_only.end(), extra_read.begin(), extra_read.end());
  // Device nodes (GPUs, /dev/null, /dev/urandom; not /dev/shm) and the sandbox's own folder,
  // which is its HOME and TMPDIR (the OpenCL runtime's kernel cache lives there).
  j.read_write = DeviceNodes();
  j.read_write.push_back(work_dir);
  j.read_write.insert(j.read_write.end(), extra_write.begin(), extra_write.end());
  return j;
}

absl::Status ApplyFileJail(const FileJail& jail, LandlockApplied* applied) {
  const int abi = LandlockAbi();
  if (abi <= 0) {
    return absl::UnavailableError(absl::StrCat("Landlock is not available on this kernel (",
                                               std::strerror(errno), ")"));
  }
  uint64_t handled = kAbi1;
#ifdef LANDLOCK_ACCESS_FS_REFER
  if (abi >= 2) handled |= LANDLOCK_ACCESS_FS_REFER;
#endif
  if (abi >= 3) handled |= kAccessFsTruncate;
  RulesetAttr attr;
  attr.handled_access_fs = handled;
  size_t attr_size = sizeof(uint64_t);
  LandlockApplied got{.abi = abi};
  if (abi >= 4) {
    attr_size = 2 * sizeof(uint64_t);
    // Handled with no rule granting any port: every TCP bind and connect is refused.
    if (jail.deny_tcp) attr.handled_access_net = kAccessNetBindTcp | kAccessNetConnectTcp;
    got.tcp = jail.deny_tcp;
  }
  if (abi >= 6) {
    attr_size = sizeof(RulesetAttr);
    if (jail.scope_signals_and_sockets) attr.scoped = kScopeAbstractUnixSocket | kScopeSignal;
    got.scoped = jail.scope_signals_and_sockets;
  }
  const int ruleset = static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0));
  if (ruleset < 0) {
    return absl::InternalError(absl::StrCat("landlock_create_ruleset: ", std::strerror(errno)));
  }
  auto add = [&](const std::string& path, bool write) -> absl::Status {
    const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) return absl::OkStatus();  // not on this machine
    struct stat st {};
    fstat(fd, &st);
    const bool dir = S_ISDIR(st.st_mode);
    landlock_path_beneath_attr rule{};
    rule.parent_fd = fd;
    rule.allowed_access = (dir ? (write ? kDirWrite : kDirRead) : (write ? kFileWrite : kFileRead)) & handled;
    if (write && abi >= 3) rule.allowed_access |= kAccessFsTruncate;
#ifdef LANDLOCK_ACCESS_FS_REFER
    if (write && dir && abi >= 2) rule.allowed_access |= LANDLOCK_ACCESS_FS_REFER;
#endif
    const long r = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    const int err = errno;
    close(fd);
    if (r < 0) return absl::InternalError(absl::StrCat("landlock_add_rule ", path, ": ", std::strerror(err)));
    return absl::OkStatus();
  };
  absl::Status st;
  for (const auto& p : jail.read_only) {
    if (st.ok()) st = add(p, false);
  }
  for (const auto& p : jail.read_write) {
    if (st.ok()) st = add(p, true);
  }
  if (st.ok() && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    st = absl::InternalError(absl::StrCat("PR_SET_NO_NEW_PRIVS: ", std::strerror(errno)));
  }
  if (st.ok() && syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    st = absl::InternalError(absl::StrCat("landlock_restrict_self: ", std::strerror(errno)));
  }
  close(ruleset);
  if (st.ok() && applied != nullptr) *applied = got;
  return st;
}

}  // namespace kforge::worker
