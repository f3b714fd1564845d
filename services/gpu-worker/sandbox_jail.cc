#include "services/gpu-worker/sandbox_jail.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/gpu-worker/file_jail.h"

namespace kforge::worker {

namespace {

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
#error "the sandbox's seccomp filter knows x86-64 and aarch64 only"
#endif

constexpr uint32_t kNr = offsetof(seccomp_data, nr);
constexpr uint32_t kArchOffset = offsetof(seccomp_data, arch);
// The low and high halves of a 64-bit argument (little-endian).
constexpr uint32_t ArgLo(int i) { return offsetof(seccomp_data, args) + 8 * i; }
constexpr uint32_t ArgHi(int i) { return offsetof(seccomp_data, args) + 8 * i + 4; }

sock_filter Stmt(uint16_t code, uint32_t k) { return BPF_STMT(code, k); }
sock_filter Jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) { return BPF_JUMP(code, k, jt, jf); }

// A filter program built in straight blocks: each block tests one syscall and returns, so jump
// offsets stay local.
class Program {
 public:
  Program() {
    code_ = {Stmt(BPF_LD | BPF_W | BPF_ABS, kArchOffset),
             Jump(BPF_JMP | BPF_JEQ | BPF_K, kArch, 1, 0),
             Stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
             // x32 system calls (numbers with bit 30) would pass every test below.
             Stmt(BPF_LD | BPF_W | BPF_ABS, kNr),
             Jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000U, 0, 1),
             Stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS)};
  }
  // `nr` fails with `err`.
  void Deny(long nr, int err) {
    Load();
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1));
    code_.push_back(Stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA)));
  }
  // `nr` is allowed only when argument `arg` is `a` or `b` (as 64-bit values with a zero high
  // half); otherwise it fails with `err`.
  void AllowArgIn(long nr, int arg, uint32_t a, uint32_t b, int err) {
    Load();
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 7));
    code_.push_back(Stmt(BPF_LD | BPF_W | BPF_ABS, ArgHi(arg)));
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 3));
    code_.push_back(Stmt(BPF_LD | BPF_W | BPF_ABS, ArgLo(arg)));
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, a, 2, 0));
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, b, 1, 0));
    code_.push_back(Stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA)));
    code_.push_back(Stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  }
  // `nr` is allowed only when every bit of `mask` is set in argument `arg`'s low half.
  void AllowArgBits(long nr, int arg, uint32_t mask, int err) {
    Load();
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 4));
    code_.push_back(Stmt(BPF_LD | BPF_W | BPF_ABS, ArgLo(arg)));
    code_.push_back(Stmt(BPF_ALU | BPF_AND | BPF_K, mask));
    code_.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, mask, 1, 0));
    code_.push_back(Stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<uint32_t>(err) & SECCOMP_RET_DATA)));
  }
  // The finished program: whatever no block decided is allowed.
  std::vector<sock_filter> Finish() {
    std::vector<sock_filter> code = code_;
    code.push_back(Stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    return code;
  }
  absl::Status Install() {
    std::vector<sock_filter> code = Finish();
    sock_fprog prog{.len = static_cast<unsigned short>(code.size()), .filter = code.data()};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      return absl::InternalError(absl::StrCat("PR_SET_NO_NEW_PRIVS: ", std::strerror(errno)));
    }
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
      return absl::InternalError(absl::StrCat("seccomp: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

 private:
  // Each block starts from the syscall number (a block that loaded an argument left it behind).
  void Load() { code_.push_back(Stmt(BPF_LD | BPF_W | BPF_ABS, kNr)); }
  std::vector<sock_filter> code_;
};

Program SeccompProgram(bool allow_fork) {
  Program p;
  // No new sockets: no network of any kind, no abstract unix socket. The worker's channel is the
  // socket this process inherited.
  p.Deny(SYS_socket, EACCES);
  p.Deny(SYS_socketpair, EACCES);
  // Signals reach this process only (pid 0 is its own process group, which holds only it and
  // what it started).
  const uint32_t self = static_cast<uint32_t>(getpid());
  p.AllowArgIn(SYS_kill, 0, self, 0, EPERM);
  p.AllowArgIn(SYS_tgkill, 0, self, self, EPERM);
  p.AllowArgIn(SYS_rt_sigqueueinfo, 0, self, self, EPERM);
  p.AllowArgIn(SYS_rt_tgsigqueueinfo, 0, self, self, EPERM);
  p.Deny(SYS_tkill, EPERM);
  p.Deny(SYS_pidfd_open, EPERM);
  p.Deny(SYS_pidfd_send_signal, EPERM);
  p.Deny(SYS_pidfd_getfd, EPERM);
  // Other processes' memory and shared memory outside the sandbox.
  p.Deny(SYS_ptrace, EPERM);
  p.Deny(SYS_process_vm_readv, EPERM);
  p.Deny(SYS_process_vm_writev, EPERM);
  for (long nr : {SYS_shmget, SYS_shmat, SYS_shmctl, SYS_semget, SYS_semop, SYS_semctl, SYS_msgget, SYS_msgsnd,
                  SYS_msgrcv, SYS_msgctl, SYS_mq_open, SYS_mq_unlink}) {
    p.Deny(nr, EPERM);
  }
  if (!allow_fork) {
    // Threads only: clone must share the address space and thread group.
    p.AllowArgBits(SYS_clone, 0, CLONE_VM | CLONE_THREAD, EPERM);
    p.Deny(SYS_clone3, ENOSYS);  // glibc falls back to clone
#ifdef SYS_fork
    p.Deny(SYS_fork, EPERM);
    p.Deny(SYS_vfork, EPERM);
#endif
  }
  return p;
}

}  // namespace

absl::Status ApplySeccompJail(bool allow_fork) { return SeccompProgram(allow_fork).Install(); }

namespace {

FileJail FilesOf(const JailOptions& o) {
  FileJail files = SandboxJail(o.backend, o.work_dir, o.extra_read, o.extra_write);
  files.deny_tcp = true;
  files.scope_signals_and_sockets = true;
  return files;
}

std::string Summary(const LandlockApplied& landlock, bool allow_fork) {
  return absl::StrCat("files (Landlock ABI ", landlock.abi, "), network (seccomp", landlock.tcp ? ", Landlock TCP" : "",
                      "), signals and IPC (seccomp", landlock.scoped ? ", Landlock scopes" : "", ")",
                      allow_fork ? "" : ", no fork");
}

}  // namespace

absl::Status JailFiles(const JailOptions& o, LandlockApplied* applied) {
  const absl::Status fs = ApplyFileJail(FilesOf(o), applied);
  if (!fs.ok()) return absl::Status(fs.code(), absl::StrCat("files are not restricted: ", fs.message()));
  return absl::OkStatus();
}

absl::StatusOr<JailReport> JailSelf(const JailOptions& o) {
  LandlockApplied landlock;
  const absl::Status fs = JailFiles(o, &landlock);
  // The filter goes on whatever Landlock said: what can be closed is closed.
  const absl::Status sc = ApplySeccompJail(o.allow_fork);
  if (!fs.ok()) return fs;
  if (!sc.ok()) return absl::Status(sc.code(), absl::StrCat("sockets and signals are not restricted: ", sc.message()));
  return JailReport{.summary = Summary(landlock, o.allow_fork), .landlock_abi = landlock.abi};
}

std::string SeccompPlanJson(const JailOptions& o, const LandlockApplied& files) {
  const std::vector<sock_filter> code = SeccompProgram(o.allow_fork).Finish();
  nlohmann::json plan = {
      {"seccomp", {{"nr", SYS_seccomp},
                   {"filter", absl::BytesToHexString(std::string(reinterpret_cast<const char*>(code.data()),
                                                                 code.size() * sizeof(sock_filter)))}}},
      {"summary", Summary(files, o.allow_fork)}};
  return plan.dump();
}

}  // namespace kforge::worker
