// RedisWorkQueue, the workers' side: taking an item from a work stream (a new one, or one whose
// lease expired), extending its lease, and publishing its result (see redis_queue.h); and the
// workers' heartbeats.

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/queue/redis_queue.h"
#include "common/queue/redis_scripts.h"
#include "common/queue/redis_streams.h"
#include "common/status_macros.h"

namespace kforge {

using redis_scripts::kExtendScript;
using redis_scripts::kFinishScript;
using redis_scripts::kReleaseScript;
using redis_streams::EntryField;
using redis_streams::FirstReadEntry;
using redis_streams::kSliceSeconds;
using redis_streams::kWorkers;
using redis_streams::Millis;
using redis_streams::ParseDeliveryId;

absl::StatusOr<std::shared_ptr<const v1::Problem>> RedisWorkQueue::FetchProblem(
    const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, p] : problems_) {
      if (k == key) return p;
    }
  }
  auto r = redis_.Command({"GET", key});
  if (!r.ok()) return r.status();
  if ((*r)->type != REDIS_REPLY_STRING)
    return absl::NotFoundError(absl::StrCat("problem ", key, " is gone"));
  auto p = std::make_shared<v1::Problem>();
  if (!p->ParseFromString(RedisString(**r)))
    return absl::DataLossError(absl::StrCat("problem ", key, " does not parse"));
  std::lock_guard<std::mutex> lock(mu_);
  problems_.emplace_front(key, p);
  if (problems_.size() > kCachedProblems) problems_.pop_back();
  return std::shared_ptr<const v1::Problem>(p);
}

absl::StatusOr<std::optional<WorkItem>> RedisWorkQueue::ItemFromEntry(const std::string& key,
                                                                      const redisReply& entry,
                                                                      const std::string& consumer,
                                                                      int deliveries) {
  std::string id;
  WorkItem item;
  if (!ParseEntry(key, entry, "req", kWorkers, "entry", item.request, &id)) {
    return std::optional<WorkItem>();
  }
  item.attempt = deliveries;
  item.request.set_attempt(deliveries);
  item.delivery_id = absl::StrCat(id, "/", deliveries);
  item.consumer = consumer;
  std::string unused, problem_key;
  if (EntryField(entry, "prob", &unused, &problem_key)) {
    absl::StatusOr<std::shared_ptr<const v1::Problem>> problem = FetchProblem(problem_key);
    if (!problem.ok()) {
      if (absl::IsUnavailable(problem.status())) return problem.status();
      // The problem expired or is damaged: the candidate cannot be evaluated; say so to its job.
      log_->error("stream {}: entry {}: {}", key, id, problem.status().message());
      v1::EvaluationResult r = PoisonResult(item.request, deliveries);
      r.set_message(
          absl::StrCat("the queue lost the candidate's problem: ", problem.status().message()));
      if (auto done = Finish(key, id, deliveries, item.request, r); !done.ok())
        return done.status();
      return std::optional<WorkItem>();
    }
    *item.request.mutable_problem() = **problem;
  }
  return std::optional<WorkItem>(std::move(item));
}

absl::StatusOr<bool> RedisWorkQueue::Finish(const std::string& key, const std::string& entry_id,
                                            int deliveries, const v1::EvaluationRequest& request,
                                            const v1::EvaluationResult& result) {
  std::string payload;
  if (!result.SerializeToString(&payload))
    return absl::InternalError("cannot serialise the result");
  auto r = redis_.Command({"EVAL", kFinishScript, "4", key, ResultKey(result.job_id()),
                           CandidateKeyOf(request), JobKey(request.job_id()), entry_id, payload,
                           kWorkers, absl::StrCat(deliveries)});
  if (!r.ok()) return r.status();
  return (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1;
}

absl::StatusOr<std::optional<WorkItem>> RedisWorkQueue::ClaimExpired(const std::string& key,
                                                                     const std::string& consumer) {
  std::string cursor = "0-0";
  while (true) {
    auto r =
        redis_.Command({"XAUTOCLAIM", key, kWorkers, consumer,
                        absl::StrCat(Millis(options_.queue.lease_seconds)), cursor, "COUNT", "1"});
    if (!r.ok()) return r.status();
    const redisReply& reply = **r;
    if (reply.type != REDIS_REPLY_ARRAY || reply.elements < 2)
      return absl::InternalError("redis XAUTOCLAIM: bad reply");
    cursor = RedisString(*reply.element[0]);
    const redisReply& entries = *reply.element[1];
    if (entries.type == REDIS_REPLY_ARRAY && entries.elements > 0) {
      const redisReply& entry = *entries.element[0];
      std::string id, payload;
      if (entry.type != REDIS_REPLY_ARRAY || entry.elements < 1) continue;
      id = RedisString(*entry.element[0]);
      auto p = redis_.Command({"XPENDING", key, kWorkers, id, id, "1"});
      if (!p.ok()) return p.status();
      int deliveries = 0;
      if ((*p)->type == REDIS_REPLY_ARRAY && (*p)->elements == 1 &&
          (*p)->element[0]->elements == 4) {
        deliveries = static_cast<int>((*p)->element[0]->element[3]->integer);
      }
      if (deliveries == 0) continue;  // purged meanwhile
      auto item = ItemFromEntry(key, entry, consumer, deliveries);
      if (!item.ok() || !item->has_value()) return item;
      if (deliveries <= options_.queue.max_deliveries) return item;
      // Delivered max_deliveries times without a result: end it.
      const int without_result = deliveries - 1;
      log_->warn(
          "stream {}: candidate {} delivered {} times without a result; completing it as "
          "infra_error",
          key, (*item)->request.candidate().id(), without_result);
      auto done = Finish(key, id, deliveries, (*item)->request,
                         PoisonResult((*item)->request, without_result));
      if (!done.ok()) return done.status();
      continue;
    }
    if (cursor == "0-0") return std::optional<WorkItem>();
  }
}

absl::StatusOr<std::optional<WorkItem>> RedisWorkQueue::Dequeue(const std::string& stream,
                                                                const std::string& consumer,
                                                                double timeout_seconds) {
  const std::string key = WorkKey(stream);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration<double>(std::max(0.0, timeout_seconds));
  while (true) {
    if (redis_.closed()) return std::optional<WorkItem>();
    // Expired leases are looked for a few times per lease, not on every call (it costs a round
    // trip): a dead worker's item goes out again within about 1.25 leases.
    bool claim = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      auto [last, fresh] = last_claim_.try_emplace(key, now);
      if (fresh ||
          now - last->second >= std::chrono::duration<double>(options_.queue.lease_seconds / 4)) {
        last->second = now;
        claim = true;
      }
    }
    if (claim) {
      auto claimed = ClaimExpired(key, consumer);
      if (IsRedisNoGroup(claimed.status())) {
        if (absl::Status st = EnsureGroup(key, kWorkers); !st.ok()) return st;
        continue;
      }
      if (!claimed.ok() || claimed->has_value()) {
        if (claimed.ok()) {  // there may be more: look again on the next call
          std::lock_guard<std::mutex> lock(mu_);
          last_claim_.erase(key);
        }
        return claimed;
      }
    }
    const double left =
        std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count();
    std::vector<std::string> args = {"XREADGROUP", "GROUP", kWorkers, consumer, "COUNT", "1"};
    if (left > 0) {
      args.insert(args.end(), {"BLOCK", absl::StrCat(Millis(std::min(left, kSliceSeconds)))});
    }
    args.insert(args.end(), {"STREAMS", key, ">"});
    auto r = redis_.Command(args);
    if (IsRedisNoGroup(r.status())) {
      if (absl::Status st = EnsureGroup(key, kWorkers); !st.ok()) return st;
      continue;
    }
    if (!r.ok()) return r.status();
    if (const redisReply* entry = FirstReadEntry(**r); entry != nullptr) {
      auto item = ItemFromEntry(key, *entry, consumer, 1);
      if (!item.ok() || item->has_value()) return item;
      continue;
    }
    if (left <= 0 || std::chrono::steady_clock::now() >= until) return std::optional<WorkItem>();
  }
}

absl::Status RedisWorkQueue::ExtendLease(const std::string& stream, const WorkItem& item) {
  std::string id;
  int deliveries = 0;
  if (!ParseDeliveryId(item.delivery_id, &id, &deliveries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed delivery id \"", item.delivery_id, "\""));
  }
  auto r = redis_.Command(
      {"EVAL", kExtendScript, "1", WorkKey(stream), kWorkers, id, absl::StrCat(deliveries)});
  if (!r.ok()) return r.status();
  if ((*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("lease ", item.delivery_id, " on ", stream, " is lost"));
}

absl::Status RedisWorkQueue::Release(const std::string& stream, const WorkItem& item) {
  std::string id;
  int deliveries = 0;
  if (!ParseDeliveryId(item.delivery_id, &id, &deliveries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed delivery id \"", item.delivery_id, "\""));
  }
  auto r = redis_.Command({"EVAL", kReleaseScript, "1", WorkKey(stream), kWorkers, id,
                           absl::StrCat(deliveries), absl::StrCat(Millis(options_.queue.lease_seconds))});
  if (!r.ok()) return r.status();
  if ((*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 1) {
    // Look for expired leases at the next Dequeue, not a quarter lease from now.
    std::lock_guard<std::mutex> lock(mu_);
    last_claim_.erase(WorkKey(stream));
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("lease ", item.delivery_id, " on ", stream, " is lost"));
}

absl::Status RedisWorkQueue::Complete(const std::string& stream, const WorkItem& item,
                                      const v1::EvaluationResult& result) {
  std::string id;
  int deliveries = 0;
  if (!ParseDeliveryId(item.delivery_id, &id, &deliveries)) {
    id = "0-0";  // not a delivery of this queue: publish only
    deliveries = 0;
  }
  auto done = Finish(WorkKey(stream), id, deliveries, item.request, result);
  return done.ok() ? absl::OkStatus() : done.status();
}

absl::Status RedisWorkQueue::Heartbeat(const v1::WorkerStatus& status) {
  const int64_t now_ms = static_cast<int64_t>(
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  auto r = redis_.Command({"HSET", options_.key_prefix + "workers", status.worker_id(),
                           absl::StrCat(now_ms, ":", status.SerializeAsString())});
  return r.ok() ? absl::OkStatus() : r.status();
}

}  // namespace kforge
