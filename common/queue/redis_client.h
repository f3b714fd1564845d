#pragma once

// A Redis client for the queue: a pool of hiredis connections, each call on one borrowed
// connection, reconnecting with backoff when the server goes away, scripts sent by their SHA-1
// (EVALSHA) and in full again where the server lacks them, and a check on every new connection
// that the server still holds its data (an epoch marker, set once).
//
// Thread-safety: every method may be called from any number of threads at once.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/logging.h"

struct redisContext;
struct redisReply;

namespace kforge {

// host, port, database and credentials of a `redis://[[user]:password@]host:port[/db]` URL.
struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // an ACL user (Redis 6+); "" = the default user
  std::string password;  // "" = no AUTH
};

[[nodiscard]] absl::StatusOr<RedisAddress> ParseRedisUrl(const std::string& url);

struct RedisReplyDeleter {
  void operator()(redisReply* r) const;
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

struct RedisClientOptions {
  double reconnect_timeout_seconds = 10;  // then a call fails as Unavailable
  double socket_timeout_seconds = 5;      // one command's, blocking reads included
  // The key of the epoch marker, a random value set once (SET NX): a server that answers
  // without the value this client saw first came back without its data (DataLosses counts those).
  std::string epoch_key = "epoch";
};

class RedisClient {
 public:
  // `scripts`: the Lua texts that EVAL calls send; they go by their SHA-1.
  RedisClient(RedisAddress address, RedisClientOptions options,
              const std::vector<const char*>& scripts, Logger log);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command, reconnecting with backoff on I/O errors; an error reply is a Status
  // (NOGROUP ones FailedPrecondition, see IsRedisNoGroup).
  [[nodiscard]] absl::StatusOr<RedisReply> Command(const std::vector<std::string>& args);
  // Sends the commands in one go and reads their replies (an error reply is returned as a reply:
  // see RedisReplyError), reconnecting with backoff on I/O errors and sending them all again then:
  // only for commands that are safe to repeat.
  [[nodiscard]] absl::StatusOr<std::vector<RedisReply>> Pipeline(
      const std::vector<std::vector<std::string>>& commands);

  // How many times the server was found without its data.
  int64_t DataLosses();
  // Calls that cannot reach the server fail at once (Cancelled) instead of retrying.
  void Close() { closed_.store(true); }
  bool closed() const { return closed_.load(); }

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const;
  };
  using Context = std::unique_ptr<redisContext, ContextDeleter>;

  absl::StatusOr<Context> NewConnection();
  // Pipeline's round trip; `by_sha`: known scripts by their SHA-1.
  absl::StatusOr<std::vector<RedisReply>> Send(
      const std::vector<std::vector<std::string>>& commands, bool by_sha);

  const RedisAddress address_;
  const RedisClientOptions options_;
  Logger log_;
  std::atomic<bool> closed_{false};
  std::map<std::string, std::string, std::less<>> script_shas_;  // script -> SHA-1 (set once)
  std::mutex mu_;
  std::vector<Context> idle_;  // the connection pool
  std::string epoch_;          // the server's epoch marker as last seen
  int64_t data_losses_ = 0;
};

// A string or status reply's text.
std::string RedisString(const redisReply& r);
// An error reply as a Status (NOGROUP ones FailedPrecondition, see IsRedisNoGroup); OK otherwise.
absl::Status RedisReplyError(const redisReply& r, const std::string& command);
// A status from a command on a stream or group that does not exist (yet).
bool IsRedisNoGroup(const absl::Status& st);

}  // namespace kforge
