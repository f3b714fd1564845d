#include "tests/testutil/redis_server.h"

#include <filesystem>

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace kforge::testing {

namespace {

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Sends one command; true when the reply is not an error.
bool RedisCommand(int port, const char* command, std::string* reply_text = nullptr,
                  const std::string& password = "") {
  timeval tv{0, 500000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr) return false;
  bool ok = false;
  if (c->err == 0) {
    redisSetTimeout(c, tv);
    if (!password.empty()) {
      auto* a = static_cast<redisReply*>(redisCommand(c, "AUTH %b", password.data(), password.size()));
      if (a != nullptr) freeReplyObject(a);
    }
    auto* r = static_cast<redisReply*>(redisCommand(c, command));
    if (r != nullptr) {
      ok = r->type != REDIS_REPLY_ERROR;
      if (reply_text != nullptr && r->str != nullptr) *reply_text = std::string(r->str, r->len);
      freeReplyObject(r);
    }
  }
  redisFree(c);
  return ok;
}

}  // namespace

bool RedisServer::Available() { return !FindOnPath("redis-server").empty(); }

RedisServer::~RedisServer() { Stop(9); }

bool RedisServer::Start() {
  if (process_ != nullptr) return true;
  if (port_ != 0) return StartOn(port_);
  // A port that was free a moment ago may be taken by the time the server binds: try a few.
  for (int i = 0; i < 3; ++i) {
    if (StartOn(FreePort())) return true;
  }
  return false;
}

bool RedisServer::StartOn(int port) {
  const std::string binary = FindOnPath("redis-server");
  if (binary.empty()) {
    error_ = kAbsent;
    return false;
  }
  std::vector<std::string> args = {"--port", std::to_string(port), "--bind", "127.0.0.1", "--dir", dir_.path(),
                                   "--save", "", "--appendonly", appendonly_ ? "yes" : "no",
                                   "--logfile", dir_.path() + "/redis.log", "--daemonize", "no",
                                   "--protected-mode", "no"};
  if (appendonly_) args.insert(args.end(), {"--appendfsync", "always"});
  if (!password_.empty()) args.insert(args.end(), {"--requirepass", password_});
  process_ = std::make_unique<BackgroundProcess>(binary, args);
  if (!process_->started()) {
    process_.reset();
    error_ = "cannot start " + binary;
    return false;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    std::string pong;
    if (RedisCommand(port, "PING", &pong, password_) && pong == "PONG") {
      // An appendonly server answers PING while it still loads its data: wait for that too.
      std::string info;
      if (!appendonly_ || (RedisCommand(port, "INFO persistence", &info, password_) &&
                           info.find("loading:0") != std::string::npos)) {
        port_ = port;
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream log(dir_.path() + "/redis.log");
  std::stringstream text;
  text << log.rdbuf();
  error_ = "redis-server on port " + std::to_string(port) + " did not answer PING within 10 s; its log:\n" +
           text.str();
  process_.reset();  // kills it
  return false;
}

void RedisServer::Stop(int signal) {
  if (process_ == nullptr) return;
  process_->Kill(signal);
  process_.reset();
}

bool RedisServer::RestartEmpty() {
  Stop(9);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path(), ec)) {
    if (entry.path().filename() != "redis.log") std::filesystem::remove_all(entry.path(), ec);
  }
  return Start();
}

bool RedisServer::Flush() { return running() && RedisCommand(port_, "FLUSHALL", nullptr, password_); }

}  // namespace kforge::testing
