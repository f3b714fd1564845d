#pragma once

// A server started by a test: runs in the background with stdout captured line by line, and is
// killed (with its process group) when the object goes away.

#include <sys/types.h>

#include <string>
#include <vector>

namespace kforge::testing {

class BackgroundProcess {
 public:
  BackgroundProcess(const std::string& program, const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env = {});
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // The next stdout line that starts with `prefix`, waiting up to timeout_seconds ("" on timeout
  // or exit).
  std::string WaitForLine(const std::string& prefix, double timeout_seconds);
  // Signals the process (and its group) and waits for it; returns what Wait returns.
  int Kill(int signal = 9);
  // Waits for the process to exit; returns its exit code (-1 when killed by a signal).
  int Wait();

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

// GET http://127.0.0.1:port/path; returns the body ("" on failure), with the status in *status.
std::string HttpGet(int port, const std::string& path, int* status = nullptr);

}  // namespace kforge::testing
