#include "tests/testutil/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace kforge::testing {

namespace {

// Reads a child's stdout and stderr into *out and *err (at most `cap` bytes each) until both
// close, or until `limit_seconds` after `start` pass (a negative limit: no limit); false then.
// Closes both descriptors either way.
bool DrainOutput(int out_fd, int err_fd, std::string* out, std::string* err,
                 std::chrono::steady_clock::time_point start, double limit_seconds, size_t cap) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* sinks[2] = {out, err};
  int open_fds = 2;
  bool in_time = true;
  char buf[8192];
  while (open_fds > 0) {
    int wait_ms = -1;
    if (limit_seconds >= 0) {
      const double left =
          limit_seconds - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (left <= 0) {
        in_time = false;
        break;
      }
      wait_ms = static_cast<int>(std::min(left, 1.0) * 1000) + 1;
    }
    if (poll(fds, 2, wait_ms) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        if (sinks[i]->size() < cap) sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  return in_time;
}

}  // namespace

RunResult RunProgram(const std::string& program, const std::vector<std::string>& args,
                     const std::vector<std::string>& extra_env) {
  RunResult r;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : extra_env) putenv(const_cast<char*>(e.c_str()));
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  DrainOutput(out_pipe[0], err_pipe[0], &r.out, &r.err, std::chrono::steady_clock::now(), /*limit_seconds=*/-1,
              std::string::npos);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// ---------------------------------------------------------------------------------------------
// A subprocess with a time limit. It runs in its own process group, killed whole when the limit
// passes and after it exits (a sandbox left behind by a crash goes with it).

std::string Outcome::Describe() const {
  std::string s = timed_out ? "timed out"
                  : exited  ? absl::StrCat("exit ", exit_code)
                            : absl::StrCat("signal ", signal, " (", strsignal(signal), ")");
  absl::StrAppend(&s, " after ", seconds, " s");
  auto tail = [](const std::string& t) { return t.size() > 3000 ? "..." + t.substr(t.size() - 3000) : t; };
  absl::StrAppend(&s, "\n--- stderr (tail):\n", tail(err), "\n--- stdout (tail):\n", tail(out));
  return s;
}

Outcome RunWithLimit(const std::vector<std::string>& args, double limit_seconds) {
  Outcome o;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) return o;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(out_pipe[1]);
  close(err_pipe[1]);
  // The first 4 MiB of each stream.
  o.timed_out = !DrainOutput(out_pipe[0], err_pipe[0], &o.out, &o.err, start, limit_seconds, size_t{4} << 20);
  if (o.timed_out) kill(-pid, SIGKILL);
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int status = 0;
  // The pipes closed: the process is exiting (or killed). Wait for it, within the limit too.
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (elapsed() > limit_seconds + 5) {
      o.timed_out = true;
      kill(-pid, SIGKILL);
    }
    usleep(2000);
  }
  kill(-pid, SIGKILL);  // whatever it left behind
  o.seconds = elapsed();
  o.exited = WIFEXITED(status);
  o.exit_code = o.exited ? WEXITSTATUS(status) : -1;
  o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return o;
}

std::string JudgeKforgeExit(const Outcome& o, const std::string& cmd) {
  if (o.timed_out) return absl::StrCat(cmd, " did not finish in time: ", o.Describe());
  if (!o.exited) return absl::StrCat(cmd, " was killed by a signal: ", o.Describe());
  if (o.exit_code != 0 && o.exit_code != 1 && o.exit_code != 2) {
    return absl::StrCat(cmd, " exited with an unexpected code: ", o.Describe());
  }
  return "";
}

}  // namespace kforge::testing
