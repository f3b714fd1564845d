#include "common/queue/redis_queue.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/queue/redis_scripts.h"
#include "common/queue/redis_streams.h"
#include "common/status_macros.h"

namespace kforge {

namespace {

using redis_scripts::kAckScript;
using redis_scripts::kEnqueueScript;
using redis_scripts::kExtendScript;
using redis_scripts::kFinishScript;
using redis_scripts::kForgetWorkerScript;
using redis_scripts::kPurgeScript;
using redis_scripts::kReleaseScript;
using redis_scripts::kStatsScript;
using redis_streams::EntryField;
using redis_streams::FirstReadEntry;
using redis_streams::kCoordinators;
using redis_streams::kSliceSeconds;
using redis_streams::kWorkers;
using redis_streams::Millis;
using redis_streams::ReadEntries;

constexpr int kReadAhead = 64;         // results read per XREADGROUP

}  // namespace

absl::StatusOr<std::unique_ptr<RedisWorkQueue>> RedisWorkQueue::Connect(const std::string& url,
                                                                        RedisQueueOptions options, Logger log) {
  auto address = ParseRedisUrl(url);
  if (!address.ok()) return address.status();
  if (!(options.queue.lease_seconds > 0) || options.queue.max_deliveries < 1 ||
      !(options.queue.result_redelivery_seconds > 0)) {
    return absl::InvalidArgumentError("queue options: lease and redelivery must be positive, max_deliveries >= 1");
  }
  if (!options.password.empty()) address->password = options.password;
  std::unique_ptr<RedisWorkQueue> q(new RedisWorkQueue(*std::move(address), std::move(options), std::move(log)));
  auto ping = q->redis_.Command({"PING"});
  if (!ping.ok()) return ping.status();
  return q;
}

RedisWorkQueue::RedisWorkQueue(RedisAddress address, RedisQueueOptions options, Logger log)
    : options_(std::move(options)),
      log_(log),
      redis_(
          std::move(address),
          RedisClientOptions{.reconnect_timeout_seconds = options_.reconnect_timeout_seconds,
                             .socket_timeout_seconds = options_.io_timeout_seconds + kSliceSeconds,
                             .epoch_key = options_.key_prefix + "epoch"},
          {kForgetWorkerScript, kStatsScript, kAckScript, kEnqueueScript, kFinishScript,
           kExtendScript, kReleaseScript, kPurgeScript},
          std::move(log)) {}

RedisWorkQueue::~RedisWorkQueue() = default;

int64_t RedisWorkQueue::DataLosses() { return redis_.DataLosses(); }

absl::Status RedisWorkQueue::EnsureGroup(const std::string& key, const std::string& group) {
  auto r = redis_.Command({"XGROUP", "CREATE", key, group, "0", "MKSTREAM"});
  if (!r.ok() && !absl::StrContains(r.status().message(), "BUSYGROUP")) return r.status();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisWorkQueue::StoreProblem(const v1::EvaluationRequest& request, bool again) {
  const std::string job = request.job_id();
  const int64_t losses = redis_.DataLosses();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = problem_keys_.find(job);
    if (!again && it != problem_keys_.end() && it->second.second == losses) return it->second.first;
  }
  const std::string bytes = request.problem().SerializeAsString();
  const std::string key = absl::StrCat(options_.key_prefix, "p:", Sha256Hex(bytes));
  auto r = redis_.Command(
      {"SET", key, bytes, "PX", absl::StrCat(Millis(options_.candidate_key_ttl_seconds))});
  if (!r.ok()) return r.status();
  std::lock_guard<std::mutex> lock(mu_);
  problem_keys_[job] = {key, losses};  // sent again after a data loss
  return key;
}

absl::Status RedisWorkQueue::Enqueue(const std::string& stream, const v1::EvaluationRequest& request) {
  return EnqueueMany(stream, {&request});
}

namespace {

std::vector<const v1::EvaluationRequest*> Pointers(
    const std::vector<v1::EvaluationRequest>& requests) {
  std::vector<const v1::EvaluationRequest*> all;
  all.reserve(requests.size());
  for (const auto& r : requests) all.push_back(&r);
  return all;
}

}  // namespace

absl::Status RedisWorkQueue::EnqueueBatch(const std::string& stream,
                                          const std::vector<v1::EvaluationRequest>& requests) {
  return EnqueueMany(stream, Pointers(requests));
}

absl::Status RedisWorkQueue::EnqueueBatchAndAck(const std::string& stream,
                                                const std::vector<v1::EvaluationRequest>& requests,
                                                const std::string& job_id,
                                                const std::vector<std::string>& ack_tokens,
                                                absl::Status* ack_status) {
  AcksAlong along{.commands = AckCommands(job_id, ack_tokens)};
  absl::Status enqueued =
      EnqueueMany(stream, Pointers(requests), ack_tokens.empty() ? nullptr : &along);
  // Not sent when the enqueue sent nothing (no requests, or it failed before its round trip).
  *ack_status = along.sent ? along.status : AckResults(job_id, ack_tokens);
  return enqueued;
}

absl::Status RedisWorkQueue::EnqueueMany(const std::string& stream,
                                         const std::vector<const v1::EvaluationRequest*>& requests,
                                         AcksAlong* along) {
  if (requests.empty()) return absl::OkStatus();
  if (redis_.closed()) return absl::CancelledError("queue closed");
  // The problem travels once (a key of its own); each entry names it. The script refuses an
  // entry whose problem is not there (it expired, or Redis lost it): store it again, then retry.
  std::vector<std::string> payloads;
  payloads.reserve(requests.size());
  for (const v1::EvaluationRequest* request : requests) {
    v1::EvaluationRequest slim = *request;
    slim.clear_problem();
    if (!slim.SerializeToString(&payloads.emplace_back())) return absl::InternalError("cannot serialise the request");
  }
  std::vector<size_t> todo(requests.size());
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = i;
  const std::string ttl = absl::StrCat(Millis(options_.candidate_key_ttl_seconds));
  for (int attempt = 0; attempt < 2 && !todo.empty(); ++attempt) {
    std::set<std::string> stored_again;  // jobs whose problem this attempt stored again
    std::vector<std::vector<std::string>> commands;
    commands.reserve(todo.size());
    for (size_t i : todo) {
      const v1::EvaluationRequest& request = *requests[i];
      absl::StatusOr<std::string> problem_key =
          StoreProblem(request, /*again=*/attempt > 0 && stored_again.insert(request.job_id()).second);
      if (!problem_key.ok()) return problem_key.status();
      commands.push_back({"EVAL", kEnqueueScript, "4", CandidateKeyOf(request), WorkKey(stream),
                          JobKey(request.job_id()), *problem_key, payloads[i], ttl});
    }
    // The acknowledgements go after the requests (those are what a worker waits for), once.
    const bool with_acks = along != nullptr && !along->sent;
    if (with_acks) commands.insert(commands.end(), along->commands.begin(), along->commands.end());
    absl::StatusOr<std::vector<RedisReply>> replies = redis_.Pipeline(commands);
    if (with_acks) {
      along->sent = true;
      along->status = replies.status();
      for (size_t k = todo.size(); replies.ok() && along->status.ok() && k < replies->size(); ++k) {
        along->status = RedisReplyError(*(*replies)[k], "EVAL");
      }
    }
    if (!replies.ok()) return replies.status();
    std::vector<size_t> again;
    for (size_t k = 0; k < todo.size(); ++k) {
      const redisReply& r = *(*replies)[k];
      if (absl::Status st = RedisReplyError(r, "EVAL"); !st.ok()) return st;
      if (r.type == REDIS_REPLY_INTEGER && r.integer == -1) again.push_back(todo[k]);
    }
    todo = std::move(again);
  }
  if (!todo.empty()) return absl::UnavailableError("redis keeps losing the problem of this request");
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ResultDelivery>> RedisWorkQueue::ResultFromReply(const std::string& key,
                                                                              const redisReply& entry) {
  std::string id;
  ResultDelivery d;
  if (!ParseEntry(key, entry, "res", kCoordinators, "result", d.result, &id)) {
    return std::optional<ResultDelivery>();
  }
  d.ack_token = id;
  return std::optional<ResultDelivery>(std::move(d));
}

bool RedisWorkQueue::ParseEntry(const std::string& key, const redisReply& entry, const char* field,
                                const char* group, const char* what,
                                google::protobuf::MessageLite& message, std::string* id) {
  std::string payload;
  if (EntryField(entry, field, id, &payload) && message.ParseFromString(payload)) return true;
  // Dropped rather than handed out (or read back) forever.
  log_->error("stream {}: dropping malformed {} {}", key, what, *id);
  if (!id->empty()) {
    (void)redis_.Command({"XACK", key, group, *id});
    (void)redis_.Command({"XDEL", key, *id});
  }
  return false;
}

absl::StatusOr<std::optional<ResultDelivery>> RedisWorkQueue::NextResult(const std::string& job_id,
                                                                         double timeout_seconds) {
  const std::string key = ResultKey(job_id);
  const std::string& me = options_.coordinator;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(0.0, timeout_seconds));
  while (true) {
    if (redis_.closed()) return std::optional<ResultDelivery>();
    // 1. Results an earlier queue with this consumer name read and never acknowledged.
    std::string cursor;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto [it, fresh] = history_cursor_.try_emplace(job_id, "0");
      cursor = it->second;
    }
    if (!cursor.empty()) {
      auto r = redis_.Command(
          {"XREADGROUP", "GROUP", kCoordinators, me, "COUNT", "1", "STREAMS", key, cursor});
      if (IsRedisNoGroup(r.status())) {
        if (absl::Status st = EnsureGroup(key, kCoordinators); !st.ok()) return st;
        continue;
      }
      if (!r.ok()) return r.status();
      const redisReply* entry = FirstReadEntry(**r);
      std::string id, unused;
      const bool got = entry != nullptr && entry->type == REDIS_REPLY_ARRAY && entry->elements >= 1 &&
                       entry->element[0]->type == REDIS_REPLY_STRING;
      if (got) id = RedisString(*entry->element[0]);
      {
        std::lock_guard<std::mutex> lock(mu_);
        history_cursor_[job_id] = id;  // "" ends the re-reading
      }
      if (got) {
        // Restart its redelivery clock, then hand it out.
        (void)redis_.Command({"XCLAIM", key, kCoordinators, me, "0", id, "JUSTID"});
        auto d = ResultFromReply(key, *entry);
        if (!d.ok() || d->has_value()) return d;
      }
      continue;
    }
    // 2. Results read ahead by an earlier call (already pending under this consumer).
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = read_ahead_.find(job_id);
      if (it != read_ahead_.end() && !it->second.empty()) {
        ResultDelivery d = std::move(it->second.front());
        it->second.pop_front();
        return std::optional<ResultDelivery>(std::move(d));
      }
    }
    // 3. Results handed out (by any coordinator) and not acknowledged in time: looked for a few
    // times per redelivery period, not on every call (it costs a round trip).
    bool reclaim = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      auto& last = last_reclaim_[job_id];
      if (now - last >= std::chrono::duration<double>(options_.queue.result_redelivery_seconds / 4)) {
        last = std::chrono::time_point_cast<std::chrono::steady_clock::duration>(now);
        reclaim = true;
      }
    }
    std::string claim_cursor = "0-0";
    while (reclaim) {
      auto r = redis_.Command({"XAUTOCLAIM", key, kCoordinators, me,
                               absl::StrCat(Millis(options_.queue.result_redelivery_seconds)),
                               claim_cursor, "COUNT", "1"});
      if (IsRedisNoGroup(r.status())) break;  // created below
      if (!r.ok()) return r.status();
      const redisReply& reply = **r;
      if (reply.type != REDIS_REPLY_ARRAY || reply.elements < 2) return absl::InternalError("redis XAUTOCLAIM: bad reply");
      claim_cursor = RedisString(*reply.element[0]);
      const redisReply& entries = *reply.element[1];
      if (entries.type == REDIS_REPLY_ARRAY && entries.elements > 0) {
        auto d = ResultFromReply(key, *entries.element[0]);
        if (!d.ok() || d->has_value()) return d;
      }
      if (claim_cursor == "0-0") break;
    }
    // 4. New results, several at a time: the rest wait in read_ahead_ for the next calls.
    const double left = std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count();
    std::vector<std::string> args = {"XREADGROUP", "GROUP", kCoordinators, me, "COUNT", absl::StrCat(kReadAhead)};
    if (left > 0) args.insert(args.end(), {"BLOCK", absl::StrCat(Millis(std::min(left, kSliceSeconds)))});
    args.insert(args.end(), {"STREAMS", key, ">"});
    auto r = redis_.Command(args);
    if (IsRedisNoGroup(r.status())) {
      if (absl::Status st = EnsureGroup(key, kCoordinators); !st.ok()) return st;
      continue;
    }
    if (!r.ok()) return r.status();
    if (const redisReply* entries = ReadEntries(**r); entries != nullptr) {
      std::deque<ResultDelivery> got;
      for (size_t i = 0; i < entries->elements; ++i) {
        auto d = ResultFromReply(key, *entries->element[i]);
        if (!d.ok()) return d.status();
        if (d->has_value()) got.push_back(**std::move(d));
      }
      if (got.empty()) continue;
      ResultDelivery first = std::move(got.front());
      got.pop_front();
      if (!got.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        auto& ahead = read_ahead_[job_id];
        for (auto& d : got) ahead.push_back(std::move(d));
      }
      return std::optional<ResultDelivery>(std::move(first));
    }
    if (left <= 0 || std::chrono::steady_clock::now() >= until) return std::optional<ResultDelivery>();
  }
}

absl::StatusOr<std::vector<ResultDelivery>> RedisWorkQueue::NextResults(const std::string& job_id,
                                                                        size_t max,
                                                                        double timeout_seconds) {
  std::vector<ResultDelivery> out;
  if (max == 0) return out;
  KF_ASSIGN_OR_RETURN(std::optional<ResultDelivery> first, NextResult(job_id, timeout_seconds));
  if (!first.has_value()) return out;
  out.push_back(*std::move(first));
  // A read for more would mostly come back empty: what arrives meanwhile waits for the next call.
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = read_ahead_.find(job_id); it != read_ahead_.end()) {
    while (out.size() < max && !it->second.empty()) {
      out.push_back(std::move(it->second.front()));
      it->second.pop_front();
    }
  }
  return out;
}

absl::Status RedisWorkQueue::AckResult(const std::string& job_id, const std::string& ack_token) {
  return AckResults(job_id, {ack_token});
}

std::vector<std::vector<std::string>> RedisWorkQueue::AckCommands(
    const std::string& job_id, const std::vector<std::string>& ack_tokens) const {
  // A script call per 1000 tokens (Lua's unpack has a stack limit). A group lost with the
  // server's data has nothing to acknowledge.
  constexpr size_t kPerCall = 1000;
  std::vector<std::vector<std::string>> commands;
  for (size_t begin = 0; begin < ack_tokens.size(); begin += kPerCall) {
    std::vector<std::string>& args = commands.emplace_back(
        std::vector<std::string>{"EVAL", kAckScript, "1", ResultKey(job_id), kCoordinators});
    args.insert(args.end(), ack_tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                ack_tokens.begin() + static_cast<std::ptrdiff_t>(std::min(ack_tokens.size(), begin + kPerCall)));
  }
  return commands;
}

absl::Status RedisWorkQueue::AckResults(const std::string& job_id,
                                        const std::vector<std::string>& ack_tokens) {
  if (ack_tokens.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<RedisReply>> replies =
      redis_.Pipeline(AckCommands(job_id, ack_tokens));  // one round trip
  if (!replies.ok()) return replies.status();
  for (const RedisReply& r : *replies) {
    if (absl::Status st = RedisReplyError(*r, "EVAL"); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status RedisWorkQueue::PurgeJob(const std::string& job_id) {
  auto r = redis_.Command({"EVAL", kPurgeScript, "2", JobKey(job_id), ResultKey(job_id), kWorkers});
  {
    std::lock_guard<std::mutex> lock(mu_);
    history_cursor_.erase(job_id);
    read_ahead_.erase(job_id);
  }
  return r.ok() ? absl::OkStatus() : r.status();
}

void RedisWorkQueue::Close() { redis_.Close(); }

absl::StatusOr<std::vector<v1::WorkerStatus>> RedisWorkQueue::ListWorkers() {
  const std::string key = options_.key_prefix + "workers";
  auto r = redis_.Command({"HGETALL", key});
  if (!r.ok()) return r.status();
  const redisReply& reply = **r;
  const double now_ms =
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::vector<v1::WorkerStatus> out;
  for (size_t i = 0; i + 1 < reply.elements; i += 2) {
    const std::string id = RedisString(*reply.element[i]);
    const std::string value = RedisString(*reply.element[i + 1]);
    const size_t colon = value.find(':');
    int64_t at_ms = 0;
    v1::WorkerStatus st;
    const bool parsed = colon != std::string::npos && absl::SimpleAtoi(value.substr(0, colon), &at_ms) &&
                        st.ParseFromString(value.substr(colon + 1));
    const double age = (now_ms - static_cast<double>(at_ms)) / 1000;
    if (!parsed || age > options_.queue.worker_ttl_seconds) {
      // Gone quiet (or unreadable): forget it, unless it spoke again meanwhile.
      if (absl::Status st2 =
              redis_.Command({"EVAL", kForgetWorkerScript, "1", key, id, value}).status();
          !st2.ok()) {
        return st2;
      }
      continue;
    }
    st.set_seconds_since_heartbeat(std::max(0.0, age));
    out.push_back(std::move(st));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.worker_id() < b.worker_id(); });
  return out;
}

absl::StatusOr<std::vector<StreamStats>> RedisWorkQueue::Stats() {
  const std::string prefix = WorkKey("");
  auto r = redis_.Command({"EVAL", kStatsScript, "0", prefix + "*", kWorkers});
  if (!r.ok()) return r.status();
  std::vector<StreamStats> out;
  const redisReply& reply = **r;
  for (size_t i = 0; i < reply.elements; ++i) {
    const redisReply& row = *reply.element[i];
    if (row.type != REDIS_REPLY_ARRAY || row.elements != 4) return absl::InternalError("redis stats: unexpected reply");
    const std::string key = RedisString(*row.element[0]);
    const int64_t length = row.element[1]->integer, leased = row.element[2]->integer;
    out.push_back({.stream = key.substr(std::min(prefix.size(), key.size())),
                   .depth = std::max<int64_t>(0, length - leased),
                   .in_flight = leased,
                   .oldest_queued_seconds = static_cast<double>(row.element[3]->integer) / 1000});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.stream < b.stream; });
  return out;
}

}  // namespace kforge
