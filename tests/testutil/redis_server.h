#pragma once

// A throwaway redis-server for tests: on a free loopback port, with its files in a temporary
// folder, stopped (and the folder removed) when the object goes away. Without persistence by
// default; with `appendonly` its data survives Restart().
//
//   RedisServer redis;
//   if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kAbsent;
//   ASSERT_TRUE(redis.Start()) << redis.error();
//   ... redis.url() ...

#include <memory>
#include <string>

#include "tests/testutil/background_process.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::testing {

class RedisServer {
 public:
  static constexpr char kAbsent[] = "redis-server is not installed (apt-get install redis-server); skipped";
  // Whether a redis-server binary is on PATH.
  static bool Available();

  // `password`: the server requires it (requirepass).
  explicit RedisServer(bool appendonly = false, std::string password = "")
      : appendonly_(appendonly), password_(std::move(password)) {}
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts the server and waits until it answers PING; the first start picks the port, later
  // ones (after Stop) reuse it and the folder. False (see error()) when it does not come up.
  [[nodiscard]] bool Start();
  // SIGTERM: a clean shutdown (an appendonly server writes its data); SIGKILL: a crash.
  void Stop(int signal = 15);
  [[nodiscard]] bool Restart() {
    Stop();
    return Start();
  }
  // A crash that loses the data (SIGKILL, its files removed), then a start on the same port.
  [[nodiscard]] bool RestartEmpty();
  // Removes every key (FLUSHALL); false when the server does not answer.
  bool Flush();

  bool running() const { return process_ != nullptr; }
  int port() const { return port_; }
  pid_t pid() const { return process_ != nullptr ? process_->pid() : -1; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  const std::string& dir() const { return dir_.path(); }
  const std::string& error() const { return error_; }

 private:
  bool StartOn(int port);

  const bool appendonly_;
  const std::string password_;
  TempDir dir_;
  int port_ = 0;
  std::unique_ptr<BackgroundProcess> process_;
  std::string error_;
};

}  // namespace kforge::testing
