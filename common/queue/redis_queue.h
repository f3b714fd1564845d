#pragma once

// WorkQueue on Redis Streams (the cluster backend). Layout, under a key prefix:
//   <p>w:<stream>      a work stream per device class; consumer group "workers" (XADD,
//                      XREADGROUP, XACK). Expired leases are reclaimed with XAUTOCLAIM (min idle =
//                      the lease); ExtendLease resets the idle time (XCLAIM JUSTID); the delivery
//                      count (XPENDING) is the attempt and drives the poison rule.
//   <p>r:<job>         a result stream per job; consumer group "coordinators", read with
//                      XREADGROUP by the coordinator's consumer name and acknowledged (XACK + XDEL)
//                      by AckResult; an unacknowledged result is reclaimed (XAUTOCLAIM) after
//                      result_redelivery_seconds, and a new queue with the same consumer name
//                      re-reads its pending results first.
//   <p>p:<sha256>      a problem, stored once per job (and after a data loss): work entries carry
//                      only its key, and a worker keeps the last few it read.
//   <p>c:<candidate>   Enqueue's idempotency key (with an expiry): the entry id while queued or in
//                      flight, then "r:<result entry id>" while its result is owed (until
//                      AckResult; each result entry names its candidate key in field "ck").
//   <p>j:<job>         a hash of the job's queued entries (for PurgeJob).
//   <p>workers         a hash of worker id -> "<unix ms>:<status>" (Heartbeat); entries older
//                      than worker_ttl_seconds are dropped when listed.
//   <p>epoch           a random marker set once; a server that comes back without it restarted
//                      without its data (DataLosses counts those).
// Multi-key updates run as Lua scripts, so a call retried after a dropped connection is safe.
// A dropped connection is re-established with backoff; a call that cannot reach Redis within
// reconnect_timeout_seconds fails as Unavailable. Standalone Redis (the scripts touch keys they
// do not declare, which Redis Cluster refuses).
//
// Thread-safety: every method may be called from any number of threads at once (each call
// borrows a connection from a pool). Blocking reads wait in slices of at most 100 ms, so Close
// wakes every waiter promptly.

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "common/queue/redis_client.h"
#include "common/queue/work_queue.h"
#include "google/protobuf/message_lite.h"

namespace kforge {

struct RedisQueueOptions {
  WorkQueueOptions queue;
  std::string key_prefix = "kforge:";
  // AUTH with this password (a server with requirepass or ACL users); overrides the URL's, which
  // would show in process listings. Never logged.
  std::string password;
  std::string coordinator = "coordinator";     // this process's consumer name for results
  double reconnect_timeout_seconds = 10;       // then a call fails as Unavailable
  double io_timeout_seconds = 5;               // one command's socket timeout
  double candidate_key_ttl_seconds = 7 * 24 * 3600;
};

class RedisWorkQueue final : public WorkQueue {
 public:
  // Connects (once, to check the server answers) and returns the queue.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RedisWorkQueue>> Connect(const std::string& url,
                                                                               RedisQueueOptions options,
                                                                               Logger log);
  ~RedisWorkQueue() override;
  RedisWorkQueue(const RedisWorkQueue&) = delete;
  RedisWorkQueue& operator=(const RedisWorkQueue&) = delete;

  absl::Status Enqueue(const std::string& stream, const v1::EvaluationRequest& request) override;
  // One pipelined round trip for the lot (and one more for those whose problem had to be stored
  // again).
  absl::Status EnqueueBatch(const std::string& stream, const std::vector<v1::EvaluationRequest>& requests) override;
  absl::StatusOr<std::optional<WorkItem>> Dequeue(const std::string& stream, const std::string& consumer,
                                                  double timeout_seconds) override;
  absl::Status ExtendLease(const std::string& stream, const WorkItem& item) override;
  absl::Status Release(const std::string& stream, const WorkItem& item) override;
  absl::Status Complete(const std::string& stream, const WorkItem& item, const v1::EvaluationResult& result) override;
  absl::StatusOr<std::optional<ResultDelivery>> NextResult(const std::string& job_id,
                                                           double timeout_seconds) override;
  // NextResult, then what its read brought along: no round trip looks for more.
  absl::StatusOr<std::vector<ResultDelivery>> NextResults(const std::string& job_id, size_t max,
                                                          double timeout_seconds) override;
  absl::Status AckResult(const std::string& job_id, const std::string& ack_token) override;
  // One round trip (XACK + XDEL of every token).
  absl::Status AckResults(const std::string& job_id, const std::vector<std::string>& ack_tokens) override;
  // The acknowledgement rides in the enqueue's pipelined round trip.
  absl::Status EnqueueBatchAndAck(const std::string& stream,
                                  const std::vector<v1::EvaluationRequest>& requests,
                                  const std::string& job_id,
                                  const std::vector<std::string>& ack_tokens,
                                  absl::Status* ack_status) override;
  absl::Status PurgeJob(const std::string& job_id) override;
  absl::Status Heartbeat(const v1::WorkerStatus& status) override;
  absl::StatusOr<std::vector<v1::WorkerStatus>> ListWorkers() override;
  int64_t DataLosses() override;
  absl::StatusOr<std::vector<StreamStats>> Stats() override;
  void Close() override;

 private:
  RedisWorkQueue(RedisAddress address, RedisQueueOptions options, Logger log);

  // Commands sent along with an enqueue's first round trip (AckCommands), and how they fared.
  struct AcksAlong {
    std::vector<std::vector<std::string>> commands;
    bool sent = false;
    absl::Status status;  // once sent: the first error of the round trip or of their replies
  };
  // `along`: sent with the first attempt's round trip, when there is one.
  absl::Status EnqueueMany(const std::string& stream,
                           const std::vector<const v1::EvaluationRequest*>& requests,
                           AcksAlong* along = nullptr);
  // AckResults' commands.
  std::vector<std::vector<std::string>> AckCommands(
      const std::string& job_id, const std::vector<std::string>& ack_tokens) const;
  absl::Status EnsureGroup(const std::string& key, const std::string& group);
  // Claims one expired lease of the stream for `consumer`, poisoning any past max_deliveries.
  absl::StatusOr<std::optional<WorkItem>> ClaimExpired(const std::string& key, const std::string& consumer);
  absl::StatusOr<std::optional<WorkItem>> ItemFromEntry(const std::string& key, const redisReply& entry,
                                                        const std::string& consumer, int deliveries);
  // Acknowledges (when `deliveries` is the entry's current delivery count) and publishes.
  absl::StatusOr<bool> Finish(const std::string& key, const std::string& entry_id, int deliveries,
                              const v1::EvaluationRequest& request, const v1::EvaluationResult& result);
  absl::StatusOr<std::optional<ResultDelivery>> ResultFromReply(const std::string& key, const redisReply& reply);
  // Parses `field` of a stream entry into `message`, setting `id`. A malformed entry is not ours
  // to hand out: it is logged as a malformed `what`, acknowledged in `group` and deleted (false).
  bool ParseEntry(const std::string& key, const redisReply& entry, const char* field,
                  const char* group, const char* what, google::protobuf::MessageLite& message,
                  std::string* id);
  // The request's problem under its own key (once per job and process); returns the key.
  absl::StatusOr<std::string> StoreProblem(const v1::EvaluationRequest& request, bool again);
  // A problem by key, from the small local cache or Redis.
  absl::StatusOr<std::shared_ptr<const v1::Problem>> FetchProblem(const std::string& key);

  std::string WorkKey(const std::string& stream) const { return options_.key_prefix + "w:" + stream; }
  std::string ResultKey(const std::string& job_id) const { return options_.key_prefix + "r:" + job_id; }
  std::string CandidateKeyOf(const v1::EvaluationRequest& r) const { return options_.key_prefix + "c:" + CandidateKey(r); }
  std::string JobKey(const std::string& job_id) const { return options_.key_prefix + "j:" + job_id; }

  const RedisQueueOptions options_;
  Logger log_;
  RedisClient redis_;
  std::mutex mu_;  // the state below
  // Per job: results read ahead by NextResult (pending under this consumer) and when expired
  // ones were last looked for.
  std::map<std::string, std::deque<ResultDelivery>> read_ahead_;
  std::map<std::string, std::chrono::steady_clock::time_point> last_reclaim_;
  // Per work stream: when Dequeue last looked for expired leases.
  std::map<std::string, std::chrono::steady_clock::time_point> last_claim_;
  // Per job: where the re-reading of results left pending by an earlier queue stands ("" once done).
  std::map<std::string, std::string> history_cursor_;
  // Problems: the key each job's was stored under (and the data-loss count then), and the last
  // few read, newest first.
  static constexpr size_t kCachedProblems = 16;
  std::map<std::string, std::pair<std::string, int64_t>> problem_keys_;
  std::deque<std::pair<std::string, std::shared_ptr<const v1::Problem>>> problems_;
};

}  // namespace kforge
