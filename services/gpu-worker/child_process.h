#pragma once

#include "services/gpu-worker/layer.h"

// Starting a jailed child process the way the worker starts every process that runs untrusted
// code (kforge-sandbox, the PyTorch reference): fork + exec with a clean environment, its own
// process group, no inherited descriptors, no core dumps, an address-space limit, its own empty
// working folder, killed with the worker (PDEATHSIG), and, when the worker runs as root, as an
// unprivileged user who owns that folder.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge::worker {

// Who a child runs as.
struct ChildUser {
  bool drop = false;  // change user: this process is root and was not told to keep root
  uid_t uid = 0;
  gid_t gid = 0;
};
// `run_as_uid`: -1 = "nobody" when root, 0 = stay root, else that uid (and its gid).
ChildUser ChildUserFor(int64_t run_as_uid);

// Whether a process of `user` can reach `path`: every folder on the way is searchable by it.
bool ReachableBy(const std::string& path, const ChildUser& user);

// `path` (a file or a folder of files) where a process of `user` can read it: the path itself when
// it can, else a copy under /var/tmp/kforge-reachable/<hash of the path and of its files' names,
// sizes and times>/, owned by root, readable by all and writable by none but root; made once and
// reused while the original is unchanged. For the sandbox binary and the kforge_torch package of
// a root worker whose build or checkout lies in a folder closed to others (root's home).
absl::StatusOr<std::string> ReachableCopy(const std::string& path, const ChildUser& user);

// A fresh working folder "<TMPDIR or /tmp>/<prefix>-<our pid>-XXXXXX" the child's user owns;
// folders of that prefix whose process is gone (a worker killed with -9) are removed first.
absl::StatusOr<std::string> MakeChildWorkDir(const std::string& prefix, const ChildUser& user);

// What every sandboxed child needs before it starts: `binary` is there, the user it runs as
// (ChildUserFor), and its working folder, made on the first call (MakeChildWorkDir with `prefix`)
// and kept in *work_dir after.
absl::StatusOr<ChildUser> PrepareChild(const std::string& binary, int64_t run_as_uid, const std::string& prefix,
                                       std::string* work_dir);

// Gives `dir` to the child's user (when it changes user).
absl::Status GiveToChild(const std::string& dir, const ChildUser& user);

// The child's environment: HOME and TMPDIR its folder, USER and LOGNAME kforge, then `extra`
// ("KEY=value"), then the variables of this process named by `allow` (a trailing '*' matches a
// prefix) whose key `extra` does not set, and a PATH if none came.
std::vector<std::string> ChildEnvironment(const std::string& work_dir, const std::vector<std::string>& allow,
                                          const std::vector<std::string>& extra);

struct ChildSpec {
  std::string binary;
  std::vector<std::string> args;  // argv[1...]
  std::vector<std::string> env;   // "KEY=value", the whole environment
  std::string work_dir;
  int64_t address_space_bytes = 0;  // RLIMIT_AS; 0 = none
  ChildUser user;
};

struct Child {
  pid_t pid = -1;
  int fd = -1;      // our end of the socket that is the child's stdin and stdout
  int err_fd = -1;  // the read end of the child's stderr
};

// Starts it. The child exits 124 when it cannot change user, 126 when it cannot enter its folder
// and 127 when the binary cannot be executed.
absl::StatusOr<Child> StartChild(const ChildSpec& spec);

// Waits for a child (killing its process group first when asked, and any stray member after);
// says how it ended ("killed by signal SIGSEGV", "exited with status 3").
std::string ReapChild(pid_t pid, bool kill_first, int* exit_code = nullptr);

}  // namespace kforge::worker
