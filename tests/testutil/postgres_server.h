#pragma once

// A real PostgreSQL server for tests: initdb into a temporary folder, then `postgres` on a free
// loopback port, stopped (and the folder removed) on destruction. PostgreSQL refuses to run as
// root; as root (CI) the server runs as the unprivileged user `nobody`.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kforge::testing {

class PostgresServer {
 public:
  PostgresServer();
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // The folder holding initdb and postgres (Debian: /usr/lib/postgresql/N/bin); "" when absent.
  static std::string BinDir();

  // initdb (once) and start; waits until the server accepts connections.
  [[nodiscard]] absl::Status Start();
  // Fast shutdown (SIGINT), waiting for the process to exit.
  void Stop();
  [[nodiscard]] absl::Status Restart();

  int port() const { return port_; }
  // The postmaster's process id (-1 when stopped): its children are the backends.
  pid_t pid() const { return pid_; }
  // postgresql://kforge@127.0.0.1:PORT/DB
  std::string Url(const std::string& database = "postgres") const;
  // Runs one SQL statement with psql as the superuser.
  [[nodiscard]] absl::Status Sql(const std::string& sql, const std::string& database = "postgres") const;

 private:
  absl::Status RunAsServerUser(const std::vector<std::string>& argv, bool wait, pid_t* pid) const;

  std::string dir_;
  std::string bin_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool initialised_ = false;
};

}  // namespace kforge::testing
