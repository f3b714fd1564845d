// kforge-test-jail-probe: started by the worker's Sandbox in place of kforge-sandbox, it jails
// itself exactly as kforge-sandbox does (JailSelf, same arguments) and then tries, from inside the
// jail, what a subverted sandbox would: each attempt's outcome ("refused" or "ALLOWED") goes back
// in its hello's unavailable_reason as "name=outcome;..." for sandbox_jail_test.cc to check.
//   tcp       connect to 127.0.0.1:$KFORGE_PROBE_TCP_PORT
//   udp       send a datagram to 127.0.0.1:$KFORGE_PROBE_TCP_PORT
//   abstract  connect to the abstract unix socket $KFORGE_PROBE_ABSTRACT
//   shm       create a file in /dev/shm
//   sysv      create a System V shared memory segment
//   kill      signal 0 to $KFORGE_PROBE_PARENT_PID (the worker)
//   shadow    read /etc/shadow
//   fork      start a process (refused only with --no-fork)
// and "uid=N", the user it runs as.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kforge/v1/sandbox.pb.h"
#include "services/gpu-worker/framing.h"
#include "services/gpu-worker/sandbox_jail.h"

using namespace kforge;

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

const char* Outcome(bool allowed) { return allowed ? "ALLOWED" : "refused"; }

bool TcpConnects(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

bool UdpSends(int port) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = sendto(fd, "x", 1, 0, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 1;
  close(fd);
  return ok;
}

bool AbstractConnects(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), std::min(name.size(), sizeof(a.sun_path) - 2));
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  close(fd);
  return ok;
}

bool ShmWrites() {
  const std::string path = absl::StrCat("/dev/shm/kforge-jail-probe-", getpid());
  const int fd = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  close(fd);
  unlink(path.c_str());
  return true;
}

bool SysvShm() {
  const int id = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
  if (id < 0) return false;
  shmctl(id, IPC_RMID, nullptr);
  return true;
}

bool Forks() {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  worker::JailOptions jo;
  bool jail = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--jail") jail = true;
    if (a == "--no-fork") jo.allow_fork = false;
    if (a == "--read" && i + 1 < argc) jo.extra_read.emplace_back(argv[++i]);
    if (a == "--write" && i + 1 < argc) jo.extra_write.emplace_back(argv[++i]);
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return 126;
  jo.work_dir = cwd;
  v1::SandboxRequest req;
  if (!worker::ReadFrame(0, &req).ok()) return 0;
  v1::SandboxResponse resp;
  v1::HelloResponse* hello = resp.mutable_hello();
  if (jail) {
    absl::StatusOr<worker::JailReport> r = worker::JailSelf(jo);
    hello->set_jailed(r.ok());
    hello->set_jail_message(r.ok() ? r->summary : std::string(r.status().message()));
  }
  int port = 0, parent = 0;
  (void)absl::SimpleAtoi(Env("KFORGE_PROBE_TCP_PORT"), &port);
  (void)absl::SimpleAtoi(Env("KFORGE_PROBE_PARENT_PID"), &parent);
  const int shadow = open("/etc/shadow", O_RDONLY | O_CLOEXEC);
  if (shadow >= 0) close(shadow);
  hello->set_unavailable_reason(absl::StrCat(
      "tcp=", Outcome(TcpConnects(port)), ";udp=", Outcome(UdpSends(port)),
      ";abstract=", Outcome(AbstractConnects(Env("KFORGE_PROBE_ABSTRACT"))), ";shm=", Outcome(ShmWrites()),
      ";sysv=", Outcome(SysvShm()), ";kill=", Outcome(parent > 0 && kill(parent, 0) == 0),
      ";shadow=", Outcome(shadow >= 0), ";fork=", Outcome(Forks()), ";uid=", getuid()));
  if (!worker::WriteFrame(1, resp, false, {}).ok()) return 1;
  while (worker::ReadFrame(0, &req).ok()) {
  }
  return 0;
}
