#include "services/gpu-worker/child_process.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
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
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/status_macros.h"

extern char** environ;

namespace kforge::worker {

namespace fs = std::filesystem;

ChildUser ChildUserFor(int64_t run_as_uid) {
  ChildUser u;
  u.drop = geteuid() == 0 && run_as_uid != 0;
  if (!u.drop) return u;
  u.uid = run_as_uid > 0 ? static_cast<uid_t>(run_as_uid) : 65534;
  u.gid = u.uid;
  const passwd* pw = run_as_uid > 0 ? getpwuid(u.uid) : getpwnam("nobody");
  if (pw != nullptr) {
    u.uid = pw->pw_uid;
    u.gid = pw->pw_gid;
  }
  return u;
}

bool ReachableBy(const std::string& path, const ChildUser& user) {
  if (!user.drop) return true;
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  for (fs::path at = p; !at.empty(); at = at.parent_path()) {
    struct stat st {};
    if (stat(at.c_str(), &st) == 0) {
      const bool x = st.st_uid == user.uid   ? (st.st_mode & S_IXUSR) != 0
                     : st.st_gid == user.gid ? (st.st_mode & S_IXGRP) != 0
                                             : (st.st_mode & S_IXOTH) != 0;
      if (!x) return false;
    }
    if (at == at.root_path()) break;
  }
  return true;
}

absl::StatusOr<std::string> ReachableCopy(const std::string& path, const ChildUser& user) {
  if (ReachableBy(path, user)) return path;
  std::error_code ec;
  const fs::path from = fs::absolute(path, ec);
  // What the copy must match: every file's name, size and time.
  std::string identity = from.string();
  std::vector<fs::path> files;
  if (fs::is_directory(from, ec)) {
    for (auto it = fs::recursive_directory_iterator(from, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_regular_file(ec) && it->path().filename() != "__pycache__" &&
          it->path().string().find("/__pycache__/") == std::string::npos) {
        files.push_back(it->path());
      }
    }
  } else {
    files.push_back(from);
  }
  if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    struct stat st {};
    if (stat(f.c_str(), &st) != 0) return absl::FailedPreconditionError(absl::StrCat("cannot read ", f.string()));
    absl::StrAppend(&identity, "|", f.lexically_relative(from).string(), ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                    st.st_mtim.tv_nsec);
  }
  // The shared root: root's and closed to writers other than root (a folder someone else made
  // there first would let them swap the binary a sandbox runs).
  const fs::path root = "/var/tmp/kforge-reachable";
  fs::create_directories(root, ec);
  struct stat rs {};
  if (stat(root.c_str(), &rs) != 0 || rs.st_uid != 0 || (rs.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(root.string(), " must be a folder of root's that only root may write"));
  }
  chmod(root.c_str(), 0755);
  const std::string hash = Sha256Hex(identity);
  const fs::path dest = root / hash.substr(0, 24);
  const fs::path target = dest / from.filename();
  if (fs::exists(target, ec)) return target.string();
  const fs::path staging = root / absl::StrCat(".staging-", getpid(), "-", hash.substr(0, 8));
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  fs::copy(from, staging / from.filename(),
           fs::copy_options::recursive | fs::copy_options::copy_symlinks, ec);
  if (ec) {
    fs::remove_all(staging, ec);
    return absl::FailedPreconditionError(absl::StrCat("cannot copy ", path, " where the sandbox's user can read it"));
  }
  // Readable (and, for folders and executables, searchable) by all; writable by root alone.
  for (auto it = fs::recursive_directory_iterator(staging, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    struct stat st {};
    if (lstat(it->path().c_str(), &st) != 0 || S_ISLNK(st.st_mode)) continue;
    const bool x = S_ISDIR(st.st_mode) || (st.st_mode & S_IXUSR) != 0;
    chmod(it->path().c_str(), x ? 0755 : 0644);
  }
  chmod(staging.c_str(), 0755);
  fs::rename(staging, dest, ec);
  if (ec) {
    // Another process made it first: theirs is the same files.
    fs::remove_all(staging, ec);
    if (!fs::exists(target)) return absl::FailedPreconditionError(absl::StrCat("cannot place a copy of ", path));
  }
  return target.string();
}

namespace {

// Folders "<prefix>-<pid>-*" under `tmp` whose process no longer exists.
void RemoveStaleWorkDirs(const std::string& tmp, const std::string& prefix) {
  std::error_code ec;
  const std::string lead = prefix + "-";
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (!absl::StartsWith(name, lead)) continue;
    const size_t dash = name.find('-', lead.size());
    if (dash == std::string::npos) continue;
    pid_t owner = 0;
    if (!absl::SimpleAtoi(name.substr(lead.size(), dash - lead.size()), &owner) || owner <= 0) continue;
    if (kill(owner, 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

}  // namespace

absl::StatusOr<ChildUser> PrepareChild(const std::string& binary, int64_t run_as_uid, const std::string& prefix,
                                       std::string* work_dir) {
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox binary ", binary, " is missing or not executable (set KFORGE_SANDBOX_BINARY)"));
  }
  const ChildUser user = ChildUserFor(run_as_uid);
  if (work_dir->empty()) {
    KF_ASSIGN_OR_RETURN(*work_dir, MakeChildWorkDir(prefix, user));
  }
  return user;
}

absl::StatusOr<std::string> MakeChildWorkDir(const std::string& prefix, const ChildUser& user) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmp_dir = tmp && *tmp ? tmp : "/tmp";
  if (!ReachableBy(tmp_dir, user)) tmp_dir = "/tmp";
  RemoveStaleWorkDirs(tmp_dir, prefix);
  std::string tmpl = absl::StrCat(tmp_dir, "/", prefix, "-", getpid(), "-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp failed: ", std::strerror(errno)));
  }
  if (absl::Status st = GiveToChild(tmpl, user); !st.ok()) {
    std::error_code ec;
    fs::remove_all(tmpl, ec);
    return st;
  }
  return tmpl;
}

absl::Status GiveToChild(const std::string& dir, const ChildUser& user) {
  if (!user.drop) return absl::OkStatus();
  if (chown(dir.c_str(), user.uid, user.gid) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot give the folder ", dir, " to uid ", user.uid, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::vector<std::string> ChildEnvironment(const std::string& work_dir, const std::vector<std::string>& allow,
                                          const std::vector<std::string>& extra) {
  // A user name too: the child's uid (65534 for a root worker) may have no passwd entry, and
  // Python's getpass.getuser(), which torch calls while importing its compiler, reads these first.
  std::vector<std::string> env = {absl::StrCat("HOME=", work_dir), absl::StrCat("TMPDIR=", work_dir), "USER=kforge",
                                  "LOGNAME=kforge"};
  env.insert(env.end(), extra.begin(), extra.end());
  auto set_by_extra = [&](const std::string& key) {
    for (const auto& kv : extra) {
      if (kv.compare(0, key.size() + 1, key + "=") == 0) return true;
    }
    return false;
  };
  bool have_path = set_by_extra("PATH");
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (set_by_extra(key)) continue;
    for (const auto& a : allow) {
      const bool match = absl::EndsWith(a, "*") ? absl::StartsWith(key, a.substr(0, a.size() - 1)) : key == a;
      if (match) {
        env.push_back(kv);
        have_path = have_path || key == "PATH";
        break;
      }
    }
  }
  if (!have_path) env.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  return env;
}

absl::StatusOr<Child> StartChild(const ChildSpec& spec) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env = spec.env;
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string binary = spec.binary;
  std::vector<std::string> args = {binary};
  args.insert(args.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string work_dir = spec.work_dir;
  const ChildUser user = spec.user;

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
  const rlimit as{static_cast<rlim_t>(spec.address_space_bytes), static_cast<rlim_t>(spec.address_space_bytes)};
  const rlimit core{0, 0};
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
    if (user.drop && (setgroups(0, nullptr) != 0 || setgid(user.gid) != 0 || setuid(user.uid) != 0)) _exit(124);
    // After the change of user, which clears it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);
    dup2(sv[1], 0);
    dup2(sv[1], 1);
    dup2(out[1], 2);
    // No inherited descriptors beyond stdin/stdout/stderr.
    syscall(SYS_close_range, 3U, ~0U, 0U);
    setrlimit(RLIMIT_CORE, &core);
    if (spec.address_space_bytes > 0) setrlimit(RLIMIT_AS, &as);
    if (chdir(work_dir.c_str()) != 0) _exit(126);
    signal(SIGPIPE, SIG_DFL);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(sv[1]);
  close(out[1]);
  return Child{.pid = pid, .fd = sv[0], .err_fd = out[0]};
}

std::string ReapChild(pid_t pid, bool kill_first, int* exit_code) {
  if (exit_code != nullptr) *exit_code = -1;
  if (pid <= 0) return "not running";
  if (kill_first) kill(-pid, SIGKILL);
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (!kill_first) kill(-pid, SIGKILL);  // stray grandchildren of a crashed child
  if (r < 0) return "lost track of the process";
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return absl::StrCat("killed by signal SIG", name != nullptr ? name : std::to_string(sig));
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (exit_code != nullptr) *exit_code = code;
    if (code == 127) return "binary could not be started";
    if (code == 124) return "could not switch to its unprivileged user";
    if (code == 126) return "could not enter its folder";
    return absl::StrCat("exited with status ", code);
  }
  return "ended";
}

}  // namespace kforge::worker
