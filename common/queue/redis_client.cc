#include "common/queue/redis_client.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/hash.h"
#include "common/logging.h"

namespace kforge {

namespace {

bool IsNoScript(const redisReply& r) {
  return r.type == REDIS_REPLY_ERROR &&
         absl::StartsWith(absl::string_view(r.str, r.len), "NOSCRIPT");
}

}  // namespace

void RedisReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }
void RedisClient::ContextDeleter::operator()(redisContext* c) const { redisFree(c); }

std::string RedisString(const redisReply& r) { return std::string(r.str, r.len); }

absl::Status RedisReplyError(const redisReply& r, const std::string& command) {
  if (r.type != REDIS_REPLY_ERROR) return absl::OkStatus();
  const std::string msg = RedisString(r);
  if (absl::StartsWith(msg, "NOGROUP")) return absl::FailedPreconditionError(msg);
  return absl::InternalError(absl::StrCat("redis ", command, ": ", msg));
}

bool IsRedisNoGroup(const absl::Status& st) {
  return absl::IsFailedPrecondition(st) && absl::StartsWith(st.message(), "NOGROUP");
}

absl::StatusOr<RedisAddress> ParseRedisUrl(const std::string& url) {
  // What is wrong, with the URL as it may be shown (its password cut out).
  const auto bad = [&url](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue URL \"", RedactUrlPassword(url), "\": ", why));
  };
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "redis://"))
    return bad("expected redis://[[user]:password@]host:port[/db]");
  RedisAddress a;
  if (size_t at = rest.rfind('@'); at != absl::string_view::npos && at < rest.find('/')) {
    const absl::string_view userinfo = rest.substr(0, at);
    const size_t colon = userinfo.find(':');
    a.user = std::string(userinfo.substr(0, colon));
    if (colon != absl::string_view::npos) a.password = std::string(userinfo.substr(colon + 1));
    if (a.password.empty()) {  // redis://secret@host: the password alone
      a.password = a.user;
      a.user.clear();
    }
    rest.remove_prefix(at + 1);
  }
  absl::string_view hostport = rest;
  if (size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    hostport = rest.substr(0, slash);
    absl::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!absl::SimpleAtoi(db, &a.db) || a.db < 0))
      return bad("the database must be a number");
  }
  const size_t colon = hostport.rfind(':');
  a.host = std::string(hostport.substr(0, colon));
  if (colon != absl::string_view::npos &&
      (!absl::SimpleAtoi(hostport.substr(colon + 1), &a.port) || a.port <= 0 || a.port > 65535)) {
    return bad("bad port");
  }
  if (a.host.empty()) return bad("no host");
  return a;
}

RedisClient::RedisClient(RedisAddress address, RedisClientOptions options,
                         const std::vector<const char*>& scripts, Logger log)
    : address_(std::move(address)), options_(std::move(options)), log_(std::move(log)) {
  for (const char* script : scripts) script_shas_.emplace(script, Sha1Hex(script));
}

RedisClient::~RedisClient() = default;

int64_t RedisClient::DataLosses() {
  std::lock_guard<std::mutex> lock(mu_);
  return data_losses_;
}

absl::StatusOr<RedisClient::Context> RedisClient::NewConnection() {
  auto tv = [](double s) {
    timeval t{};
    t.tv_sec = static_cast<time_t>(s);
    t.tv_usec = static_cast<suseconds_t>((s - std::floor(s)) * 1e6);
    return t;
  };
  Context c(redisConnectWithTimeout(address_.host.c_str(), address_.port, tv(2.0)));
  if (c == nullptr) return absl::UnavailableError("redis: cannot allocate a connection");
  if (c->err != 0) {
    return absl::UnavailableError(
        absl::StrCat("redis at ", address_.host, ":", address_.port, ": ", c->errstr));
  }
  redisSetTimeout(c.get(), tv(options_.socket_timeout_seconds));
  if (!address_.password.empty()) {
    RedisReply r(static_cast<redisReply*>(
        address_.user.empty()
            ? redisCommand(c.get(), "AUTH %b", address_.password.data(), address_.password.size())
            : redisCommand(c.get(), "AUTH %b %b", address_.user.data(), address_.user.size(),
                           address_.password.data(), address_.password.size())));
    if (r == nullptr)
      return absl::UnavailableError(
          absl::StrCat("redis at ", address_.host, ":", address_.port, ": AUTH got no answer"));
    if (r->type == REDIS_REPLY_ERROR) {
      // The server's words (WRONGPASS, ...) name no secret.
      return absl::UnauthenticatedError(
          absl::StrCat("redis at ", address_.host, ":", address_.port,
                       ": AUTH refused: ", std::string(r->str, r->len)));
    }
  }
  if (address_.db != 0) {
    const std::string db = absl::StrCat(address_.db);
    RedisReply r(static_cast<redisReply*>(redisCommand(c.get(), "SELECT %s", db.c_str())));
    if (r == nullptr || r->type == REDIS_REPLY_ERROR) {
      return absl::UnavailableError(absl::StrCat("redis: SELECT ", db, " failed"));
    }
  }
  // Every new connection (the first, and each after a broken one) reads the server's epoch
  // marker, a random value set once: a server that answers without ours lost its data.
  const std::string& key = options_.epoch_key;
  std::random_device rd;
  const std::string fresh =
      absl::StrCat(absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8),
                   absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8));
  RedisReply set(static_cast<redisReply*>(
      redisCommand(c.get(), "SET %b %b NX", key.data(), key.size(), fresh.data(), fresh.size())));
  RedisReply get(static_cast<redisReply*>(redisCommand(c.get(), "GET %b", key.data(), key.size())));
  if (get != nullptr && get->type == REDIS_REPLY_ERROR &&
      absl::StartsWith(RedisString(*get), "NOAUTH")) {
    return absl::UnauthenticatedError(
        absl::StrCat("redis at ", address_.host, ":", address_.port,
                     " wants a password: give queue.password_file (or "
                     "redis://:PASSWORD@host:port)"));
  }
  if (set == nullptr || get == nullptr || get->type != REDIS_REPLY_STRING) {
    return absl::UnavailableError(absl::StrCat("redis at ", address_.host, ":", address_.port,
                                               ": cannot read the epoch marker"));
  }
  const std::string epoch(get->str, get->len);
  std::lock_guard<std::mutex> lock(mu_);
  if (epoch_.empty()) {
    epoch_ = epoch;
  } else if (epoch != epoch_) {
    epoch_ = epoch;
    ++data_losses_;
    log_->warn(
        "redis at {}:{} came back without its data (epoch marker changed): queued work and unread "
        "results "
        "are gone",
        address_.host, address_.port);
  }
  return c;
}

absl::StatusOr<RedisReply> RedisClient::Command(const std::vector<std::string>& args) {
  absl::StatusOr<std::vector<RedisReply>> r = Pipeline({args});
  if (!r.ok()) return r.status();
  RedisReply reply = std::move(r->front());
  if (absl::Status st = RedisReplyError(*reply, args[0]); !st.ok()) return st;
  return reply;
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  absl::StatusOr<std::vector<RedisReply>> replies = Send(commands, /*by_sha=*/true);
  if (!replies.ok()) return replies;
  // A script the server does not hold (it restarted, or its scripts were flushed) ran nowhere:
  // sent again in full, it runs once, and the server holds it again.
  std::vector<size_t> again;
  std::vector<std::vector<std::string>> in_full;
  for (size_t i = 0; i < commands.size(); ++i) {
    if (IsNoScript(*(*replies)[i])) {
      again.push_back(i);
      in_full.push_back(commands[i]);
    }
  }
  if (again.empty()) return replies;
  absl::StatusOr<std::vector<RedisReply>> retried = Send(in_full, /*by_sha=*/false);
  if (!retried.ok()) return retried.status();
  for (size_t k = 0; k < again.size(); ++k) (*replies)[again[k]] = std::move((*retried)[k]);
  return replies;
}

absl::StatusOr<std::vector<RedisReply>> RedisClient::Send(
    const std::vector<std::vector<std::string>>& commands, bool by_sha) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(options_.reconnect_timeout_seconds);
  auto backoff = std::chrono::milliseconds(20);
  std::string last_error;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  while (true) {
    Context c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        c = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (c == nullptr) {
      auto made = NewConnection();
      if (made.ok()) {
        c = *std::move(made);
      } else if (absl::IsUnauthenticated(made.status())) {
        return made.status();  // a password does not become right by waiting
      } else {
        last_error = std::string(made.status().message());
      }
    }
    if (c != nullptr) {
      bool sent = true;
      for (const auto& args : commands) {
        argv.clear();
        lens.clear();
        for (const auto& a : args) {
          argv.push_back(a.data());
          lens.push_back(a.size());
        }
        // A script by its SHA-1: the server neither reads nor hashes its text again.
        if (by_sha && args.size() >= 2 && args[0] == "EVAL") {
          if (auto sha = script_shas_.find(args[1]); sha != script_shas_.end()) {
            argv[0] = "EVALSHA";
            lens[0] = 7;
            argv[1] = sha->second.data();
            lens[1] = sha->second.size();
          }
        }
        if (redisAppendCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(),
                                   lens.data()) != REDIS_OK) {
          sent = false;
          break;
        }
      }
      std::vector<RedisReply> replies;
      replies.reserve(commands.size());
      while (sent && replies.size() < commands.size()) {
        void* raw = nullptr;
        if (redisGetReply(c.get(), &raw) != REDIS_OK || raw == nullptr) break;
        replies.emplace_back(static_cast<redisReply*>(raw));
      }
      if (replies.size() == commands.size()) {
        std::lock_guard<std::mutex> lock(mu_);
        idle_.push_back(std::move(c));
        return replies;
      }
      last_error = absl::StrCat(address_.host, ":", address_.port, ": ", c->errstr);
      // The connection is broken: drop it, and every idle one (a restarted server broke them all).
      std::lock_guard<std::mutex> lock(mu_);
      idle_.clear();
    }
    const std::string& what = commands.front().front();
    if (closed_.load())
      return absl::CancelledError(absl::StrCat("queue closed; redis unreachable: ", last_error));
    if (std::chrono::steady_clock::now() + backoff >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "redis unreachable for ", options_.reconnect_timeout_seconds, " s: ", last_error));
    }
    log_->warn("redis {} failed ({}); reconnecting", what, last_error);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

}  // namespace kforge
