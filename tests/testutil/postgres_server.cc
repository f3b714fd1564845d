#include "tests/testutil/postgres_server.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testutil/background_process.h"

namespace kforge::testing {

namespace fs = std::filesystem;

std::string PostgresServer::BinDir() {
  std::error_code ec;
  std::string best;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const fs::path bin = e.path() / "bin";
    if (fs::exists(bin / "initdb") && fs::exists(bin / "postgres")) {
      if (best.empty() || bin.string() > best) best = bin.string();
    }
  }
  return best;
}

PostgresServer::PostgresServer() : bin_(BinDir()) {
  char tmpl[] = "/tmp/kforge-pg-XXXXXX";
  if (mkdtemp(tmpl) != nullptr) dir_ = tmpl;
}

PostgresServer::~PostgresServer() {
  Stop();
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
}

absl::Status PostgresServer::RunAsServerUser(const std::vector<std::string>& argv, bool wait, pid_t* pid) const {
  uid_t uid = 0;
  gid_t gid = 0;
  if (geteuid() == 0) {
    const passwd* pw = getpwnam("nobody");
    if (pw == nullptr) return absl::FailedPreconditionError("running as root and there is no user 'nobody'");
    uid = pw->pw_uid;
    gid = pw->pw_gid;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) return absl::InternalError("fork failed");
  if (child == 0) {
    setpgid(0, 0);
    if (uid != 0) {
      if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(126);
    }
    if (wait) {  // initdb, psql: quiet
      if (freopen("/dev/null", "w", stdout) == nullptr) _exit(125);
    } else {
      // The server outlives this call: it must not hold the test's output pipes open (a test
      // runner waits for them to close).
      const std::string log = dir_ + "/postgres.log";
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd < 0) _exit(125);
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  if (pid != nullptr) *pid = child;
  if (!wait) return absl::OkStatus();
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(argv[0], " failed (status ", status, ")"));
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::Start() {
  if (bin_.empty()) return absl::FailedPreconditionError("PostgreSQL is not installed (scripts/install-deps.sh)");
  if (dir_.empty()) return absl::InternalError("no temporary folder");
  if (!initialised_) {
    std::error_code ec;
    fs::create_directories(dir_ + "/data", ec);
    if (geteuid() == 0) {
      const passwd* pw = getpwnam("nobody");
      if (pw != nullptr) {
        for (const auto& p : {dir_, dir_ + "/data"}) {
          if (chown(p.c_str(), pw->pw_uid, pw->pw_gid) != 0) return absl::InternalError("chown failed");
        }
      }
    }
    chmod((dir_ + "/data").c_str(), 0700);
    if (absl::Status st = RunAsServerUser({bin_ + "/initdb", "-D", dir_ + "/data", "-U", "kforge", "--auth=trust",
                                           "-E", "UTF8", "--no-sync", "--locale=C"},
                                          /*wait=*/true, nullptr);
        !st.ok()) {
      return st;
    }
    initialised_ = true;
    port_ = FreePort();
  }
  if (absl::Status st = RunAsServerUser({bin_ + "/postgres", "-D", dir_ + "/data", "-p", std::to_string(port_),
                                         "-k", dir_, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                                         "-c", "full_page_writes=off", "-c", "max_connections=200"},
                                        /*wait=*/false, &pid_);
      !st.ok()) {
    return st;
  }
  // Ready when pg_isready says so.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    pid_t p = -1;
    if (RunAsServerUser({bin_ + "/pg_isready", "-q", "-h", "127.0.0.1", "-p", std::to_string(port_), "-U", "kforge"},
                        true, &p)
            .ok()) {
      return absl::OkStatus();
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError("postgres exited while starting");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError("postgres did not accept connections within 30 s");
}

void PostgresServer::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGINT);  // fast shutdown: rolls back open transactions, disconnects clients
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

absl::Status PostgresServer::Restart() {
  Stop();
  return Start();
}

std::string PostgresServer::Url(const std::string& database) const {
  return absl::StrCat("postgresql://kforge@127.0.0.1:", port_, "/", database);
}

absl::Status PostgresServer::Sql(const std::string& sql, const std::string& database) const {
  return RunAsServerUser({bin_ + "/psql", "-q", "-h", "127.0.0.1", "-p", std::to_string(port_), "-U", "kforge",
                          "-d", database, "-v", "ON_ERROR_STOP=1", "-c", sql},
                         /*wait=*/true, nullptr);
}

}  // namespace kforge::testing
