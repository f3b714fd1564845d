// The WorkQueue contract run against RedisWorkQueue on a real redis-server (leases scaled down to
// real fractions of a second), and the faults Redis brings: restarts with and without its data,
// a server that stays away, and a consumer that dies mid-item. Skipped where redis-server is not
// installed.

#include "common/queue/redis_queue.h"

#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/queue/lease_extender.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/redis_server.h"
#include "tests/unit/queue_contract.h"

namespace kforge::testing {
namespace {

Logger TestLog() { return MakeLogger("redis-queue-test", spdlog::level::err); }

// A server per factory; each NewQueue gets its own key prefix. Contract seconds are kScale real
// seconds.
class RedisQueueFactory final : public QueueFactory {
 public:
  static constexpr double kScale = 0.03;

  std::unique_ptr<WorkQueue> NewQueue(const WorkQueueOptions& options) override {
    if (!server_.running() && !server_.Start()) {
      ADD_FAILURE() << server_.error();
      return nullptr;
    }
    prefix_ = "t" + std::to_string(++queues_) + ":";
    return NewQueueOnSameBackend(options);
  }
  std::unique_ptr<WorkQueue> NewQueueOnSameBackend(const WorkQueueOptions& options) override {
    RedisQueueOptions ro;
    ro.queue = options;
    ro.queue.lease_seconds *= kScale;
    ro.queue.result_redelivery_seconds *= kScale;
    ro.queue.worker_ttl_seconds *= kScale;
    ro.key_prefix = prefix_;
    ro.reconnect_timeout_seconds = 5;
    auto q = RedisWorkQueue::Connect(server_.url(), ro, TestLog());
    if (!q.ok()) {
      ADD_FAILURE() << q.status();
      return nullptr;
    }
    return *std::move(q);
  }
  void AdvanceTime(double seconds) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds * kScale));
  }

 private:
  RedisServer server_;
  int queues_ = 0;
  std::string prefix_;
};

INSTANTIATE_TEST_SUITE_P(Backends, QueueContractTest,
                         ::testing::Values(QueueBackend{"Redis",
                                                        []() -> std::unique_ptr<QueueFactory> {
                                                          if (!RedisServer::Available()) return nullptr;
                                                          return std::make_unique<RedisQueueFactory>();
                                                        }}),
                         QueueBackendName);

TEST(RedisUrlTest, Parses) {
  auto a = ParseRedisUrl("redis://127.0.0.1:6380/2");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 2);
  auto b = ParseRedisUrl("redis://cache");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "cache");
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->db, 0);
  for (const char* bad : {"cache:6379", "redis://", "redis://h:0", "redis://h:x", "redis://h:1/x", "http://h:1"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseRedisUrl(bad).status())) << bad;
  }
  // Credentials: ":password", "user:password", or the password alone.
  auto c = ParseRedisUrl("redis://:s3cret@cache:6380/1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "cache");
  EXPECT_EQ(c->port, 6380);
  EXPECT_EQ(c->user, "");
  EXPECT_EQ(c->password, "s3cret");
  auto d = ParseRedisUrl("redis://kforge:p@ss@cache");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->user, "kforge");
  EXPECT_EQ(d->password, "p@ss");
  EXPECT_EQ(d->host, "cache");
  // A refused URL does not echo its password.
  auto e = ParseRedisUrl("redis://:s3cret@cache:x");
  EXPECT_TRUE(absl::IsInvalidArgument(e.status()));
  EXPECT_THAT(std::string(e.status().message()), ::testing::Not(::testing::HasSubstr("s3cret")));
}

TEST(RedisAuthTest, AServerWithAPasswordTakesOnlyThatPassword) {
  if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kAbsent;
  RedisServer server(/*appendonly=*/false, "queue-secret");
  ASSERT_TRUE(server.Start()) << server.error();
  RedisQueueOptions ro;
  ro.reconnect_timeout_seconds = 2;
  // No password: refused at once with what to do, not retried until the reconnect deadline.
  const auto t0 = std::chrono::steady_clock::now();
  auto none = RedisWorkQueue::Connect(server.url(), ro, TestLog());
  EXPECT_TRUE(absl::IsUnauthenticated(none.status())) << none.status();
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr("queue.password_file"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  ro.password = "wrong";
  auto wrong = RedisWorkQueue::Connect(server.url(), ro, TestLog());
  EXPECT_TRUE(absl::IsUnauthenticated(wrong.status())) << wrong.status();
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::HasSubstr("AUTH refused"));
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::Not(::testing::HasSubstr("wrong")));
  // The right one, from the options or from the URL: the queue works.
  for (const bool in_url : {false, true}) {
    RedisQueueOptions good = ro;
    good.password = in_url ? "" : "queue-secret";
    const std::string url =
        in_url ? absl::StrCat("redis://:queue-secret@127.0.0.1:", server.port()) : server.url();
    auto q = RedisWorkQueue::Connect(url, good, TestLog());
    ASSERT_TRUE(q.ok()) << q.status();
    v1::EvaluationRequest req;
    req.set_job_id(in_url ? "job-url" : "job-opt");
    req.mutable_candidate()->set_id("c1");
    ASSERT_TRUE((*q)->Enqueue("opencl", req).ok());
    auto item = (*q)->Dequeue("opencl", "w", 2);
    ASSERT_TRUE(item.ok()) << item.status();
    ASSERT_TRUE(item->has_value());
    EXPECT_EQ((*item)->request.job_id(), req.job_id());
  }
}

class RedisQueueFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::Available()) GTEST_SKIP() << RedisServer::kAbsent;
  }
  std::unique_ptr<RedisWorkQueue> Connect(const RedisServer& server, double lease, double reconnect = 5) {
    RedisQueueOptions ro;
    ro.queue.lease_seconds = lease;
    ro.queue.result_redelivery_seconds = 60;
    ro.reconnect_timeout_seconds = reconnect;
    auto q = RedisWorkQueue::Connect(server.url(), ro, TestLog());
    EXPECT_TRUE(q.ok()) << q.status();
    return q.ok() ? *std::move(q) : nullptr;
  }
  static std::optional<WorkItem> Take(WorkQueue& q, const std::string& consumer, double timeout = 2.0) {
    auto item = q.Dequeue("opencl", consumer, timeout);
    EXPECT_TRUE(item.ok()) << item.status();
    return item.ok() ? *item : std::nullopt;
  }
};

TEST_F(RedisQueueFaultTest, RestartWithItsDataKeepsQueuedPendingAndPublished) {
  RedisServer server(/*appendonly=*/true);
  ASSERT_TRUE(server.Start()) << server.error();
  auto q = Connect(server, /*lease=*/1.0);
  ASSERT_NE(q, nullptr);
  for (const char* id : {"r1", "r2", "r3"}) ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", id)).ok());
  auto in_flight = Take(*q, "w1");  // its worker never finishes
  ASSERT_TRUE(in_flight.has_value());
  auto done = Take(*q, "w1");
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE(q->Complete("opencl", *done, ResultFor(*done)).ok());

  ASSERT_TRUE(server.Restart()) << server.error();

  // The same queue object reconnects; the queued item, the published result, the idempotency
  // keys and the lease all survived.
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r3")).ok());  // still queued: no second copy
  EXPECT_EQ(q->DataLosses(), 0) << "the server kept its data";
  auto queued = Take(*q, "w2");
  ASSERT_TRUE(queued.has_value());
  EXPECT_EQ(queued->request.request_id(), "r3");
  EXPECT_EQ(queued->attempt, 1);
  ASSERT_TRUE(q->Complete("opencl", *queued, ResultFor(*queued)).ok());  // or its lease ends below
  auto result = q->NextResult("j1", 2.0);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->has_value());
  EXPECT_EQ((*result)->result.request_id(), "r2");
  ASSERT_TRUE(q->AckResult("j1", (*result)->ack_token).ok());
  auto again = Take(*q, "w2", 3.0);  // r1 after its lease
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->request.request_id(), "r1");
  EXPECT_EQ(again->attempt, 2);
  auto nothing = q->Dequeue("opencl", "w2", 0.2);
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(nothing->has_value());
}

TEST_F(RedisQueueFaultTest, RestartWithoutDataReportsWhatItCan) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto q = Connect(server, /*lease=*/1.0);
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r1")).ok());
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r2")).ok());
  auto in_flight = Take(*q, "w1");
  ASSERT_TRUE(in_flight.has_value());
  auto unread = q->NextResult("j1", 0);  // the result stream and its group exist before the loss
  ASSERT_TRUE(unread.ok()) << unread.status();

  server.Stop(9);
  ASSERT_TRUE(server.Start()) << server.error();  // empty

  // The in-flight item's lease is gone; its result is still published and read.
  EXPECT_TRUE(absl::IsFailedPrecondition(q->ExtendLease("opencl", *in_flight)));
  EXPECT_EQ(q->DataLosses(), 1) << "the reconnect found the epoch marker gone";
  ASSERT_TRUE(q->Complete("opencl", *in_flight, ResultFor(*in_flight)).ok());
  auto r = q->NextResult("j1", 2.0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->result.request_id(), "r1");
  ASSERT_TRUE(q->AckResult("j1", (*r)->ack_token).ok());
  // The queued item is lost: nothing to deliver, no error.
  auto none = q->Dequeue("opencl", "w1", 0.3);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  // The coordinator re-dispatches every candidate without an evaluation; enqueue accepts it.
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r2")).ok());
  auto redispatched = Take(*q, "w1");
  ASSERT_TRUE(redispatched.has_value());
  EXPECT_EQ(redispatched->request.request_id(), "r2");
  EXPECT_TRUE(q->PurgeJob("j1").ok());
}

TEST_F(RedisQueueFaultTest, ACallWaitsForAServerThatComesBack) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto q = Connect(server, /*lease=*/30, /*reconnect=*/10);
  ASSERT_NE(q, nullptr);
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r1")).ok());
  server.Stop();
  std::thread restarter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_TRUE(server.Start()) << server.error();
  });
  const auto start = std::chrono::steady_clock::now();
  absl::Status st = q->Enqueue("opencl", MakeQueueRequest("j1", "r2"));
  restarter.join();
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.3);
  auto item = Take(*q, "w1");
  ASSERT_TRUE(item.has_value());
  EXPECT_EQ(item->request.request_id(), "r2");  // r1 was lost with the unsaved data
}

TEST_F(RedisQueueFaultTest, AServerThatStaysAwayFailsAsUnavailable) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto q = Connect(server, /*lease=*/30, /*reconnect=*/0.5);
  ASSERT_NE(q, nullptr);
  server.Stop(9);
  const auto start = std::chrono::steady_clock::now();
  auto item = q->Dequeue("opencl", "w1", 5.0);
  EXPECT_TRUE(absl::IsUnavailable(item.status())) << item.status();
  EXPECT_TRUE(absl::IsUnavailable(q->Enqueue("opencl", MakeQueueRequest("j1", "r1"))));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_TRUE(absl::IsUnavailable(RedisWorkQueue::Connect(server.url(), {.reconnect_timeout_seconds = 0.2},
                                                          TestLog()).status()));
}

TEST_F(RedisQueueFaultTest, AConsumerKilledMidItemLosesItToAnotherAndOneResultIsIngested) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  constexpr double kLease = 0.6;
  auto coordinator = Connect(server, kLease);
  ASSERT_NE(coordinator, nullptr);
  MemoryStore store;
  v1::Job job;
  job.set_id("j1");
  ASSERT_TRUE(store.CreateJob(job).ok());
  v1::EvaluationRequest req = MakeQueueRequest("j1", "r1");
  v1::Candidate cand = req.candidate();
  cand.set_content_hash("h1");
  ASSERT_TRUE(store.InsertCandidate(cand, kNoFence).value_or(false));
  ASSERT_TRUE(coordinator->Enqueue("opencl", req).ok());

  // Worker A: its own connections, extending its lease every lease / 3 while it "evaluates".
  auto a_queue = Connect(server, kLease);
  ASSERT_NE(a_queue, nullptr);
  auto a = std::make_unique<LeaseExtendingQueue>(*a_queue, kLease / 3, TestLog());
  auto a_item = a->Dequeue("opencl", "worker-a", 2.0);
  ASSERT_TRUE(a_item.ok() && a_item->has_value());
  // Worker B finds nothing while A is alive, for several leases.
  auto b_queue = Connect(server, kLease);
  ASSERT_NE(b_queue, nullptr);
  auto none = b_queue->Dequeue("opencl", "worker-b", 3 * kLease);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value()) << "a live worker's extended lease was taken";
  // A dies mid-item: its extensions and connections stop.
  a.reset();
  a_queue.reset();
  const auto died = std::chrono::steady_clock::now();
  auto b_item = b_queue->Dequeue("opencl", "worker-b", 5 * kLease);
  ASSERT_TRUE(b_item.ok()) << b_item.status();
  ASSERT_TRUE(b_item->has_value());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - died).count(), 2 * kLease + 0.5);
  EXPECT_EQ((*b_item)->attempt, 2);
  ASSERT_TRUE(b_queue->Complete("opencl", **b_item, ResultFor(**b_item, 2.0)).ok());

  int delivered = 0, stored = 0;
  while (true) {
    auto r = coordinator->NextResult("j1", 0.5);
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->has_value()) break;
    ++delivered;
    auto put = store.PutEvaluation((*r)->result, kNoFence);
    ASSERT_TRUE(put.ok()) << put.status();
    stored += *put ? 1 : 0;
    ASSERT_TRUE(coordinator->AckResult("j1", (*r)->ack_token).ok());
  }
  EXPECT_EQ(delivered, 1);
  EXPECT_EQ(stored, 1);
  auto evals = store.ListEvaluations("j1");
  ASSERT_TRUE(evals.ok());
  EXPECT_EQ(evals->size(), 1u);
  auto after = b_queue->Dequeue("opencl", "worker-b", 3 * kLease);
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
}

// INFO memory's used_memory, in bytes (0 if unreadable).
size_t RedisInfoMemory(int port) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (c == nullptr || c->err != 0) {
    redisFree(c);
    return 0;
  }
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO memory"));
  size_t used = 0;
  if (r != nullptr && r->type == REDIS_REPLY_STRING) {
    const std::string text(r->str, r->len);
    const size_t at = text.find("used_memory:");
    if (at != std::string::npos) used = std::stoull(text.substr(at + 12));
  }
  freeReplyObject(r);
  redisFree(c);
  return used;
}

// Runs one command on a fresh connection; its reply as text ("" if none).
std::string RedisRaw(int port, const char* command) {
  redisContext* c = redisConnect("127.0.0.1", port);
  if (c == nullptr || c->err != 0) {
    redisFree(c);
    return "";
  }
  auto* r = static_cast<redisReply*>(redisCommand(c, command));
  std::string out = r != nullptr && r->str != nullptr ? std::string(r->str, r->len) : "";
  freeReplyObject(r);
  redisFree(c);
  return out;
}

// INFO commandstats' successful calls of `command` (calls less failed and rejected ones).
int64_t RedisCallsThatRan(int port, const std::string& command) {
  const std::string text = RedisRaw(port, "INFO commandstats");
  const size_t at = text.find("cmdstat_" + command + ":");
  if (at == std::string::npos) return 0;
  const std::string line = text.substr(at, text.find('\n', at) - at);
  int64_t calls = 0, failed = 0, rejected = 0;
  for (absl::string_view field : absl::StrSplit(line.substr(line.find(':') + 1), ',')) {
    std::pair<std::string, std::string> kv = absl::StrSplit(field, '=');
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(kv.second), &v)) continue;
    if (kv.first == "calls") calls = v;
    if (kv.first == "failed_calls") failed = v;
    if (kv.first == "rejected_calls") rejected = v;
  }
  return calls - failed - rejected;
}

// The queue's scripts go by their SHA-1 (the server neither reads nor hashes their text again);
// a server that has forgotten them gets them in full once more, and each call still runs once.
TEST_F(RedisQueueFaultTest, ScriptsGoByTheirShaAndComeBackWhenTheServerForgetsThem) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto q = Connect(server, /*lease=*/30.0);
  ASSERT_NE(q, nullptr);
  for (const char* id : {"r1", "r2"})
    ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", id)).ok());
  EXPECT_GT(RedisCallsThatRan(server.port(), "evalsha"), 0);
  ASSERT_EQ(RedisRaw(server.port(), "SCRIPT FLUSH"), "OK");
  // Each script the server lacks now: enqueue (a repeat of r2 adds nothing), finish, acknowledge.
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r2")).ok());
  ASSERT_TRUE(q->Enqueue("opencl", MakeQueueRequest("j1", "r3")).ok());
  std::set<std::string> taken;
  for (int i = 0; i < 3; ++i) {
    auto item = Take(*q, "w1");
    ASSERT_TRUE(item.has_value()) << i;
    taken.insert(item->request.request_id());
    ASSERT_TRUE(q->Complete("opencl", *item, ResultFor(*item)).ok());
    if (i == 0) {
      ASSERT_EQ(RedisRaw(server.port(), "SCRIPT FLUSH"), "OK");
    }
  }
  EXPECT_THAT(taken, ::testing::ElementsAre("r1", "r2", "r3"));
  auto none = q->Dequeue("opencl", "w1", 0.2);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value()) << "a script sent twice ran twice";
  auto results = q->NextResults("j1", 10, 2.0);
  ASSERT_TRUE(results.ok()) << results.status();
  std::vector<std::string> tokens;
  while (results.ok() && tokens.size() < 3 && !results->empty()) {
    for (const auto& r : *results) tokens.push_back(r.ack_token);
    if (tokens.size() < 3) results = q->NextResults("j1", 10, 2.0);
  }
  ASSERT_EQ(tokens.size(), 3u);
  ASSERT_EQ(RedisRaw(server.port(), "SCRIPT FLUSH"), "OK");
  ASSERT_TRUE(q->AckResults("j1", tokens).ok());
  auto after = q->NextResults("j1", 10, 0.3);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->empty());
  EXPECT_GT(RedisCallsThatRan(server.port(), "eval"), 0) << "a forgotten script was sent in full";
}

TEST_F(RedisQueueFaultTest, AProblemCrossesOnceAndEveryItemGetsItBack) {
  RedisServer server;
  ASSERT_TRUE(server.Start()) << server.error();
  auto q = Connect(server, /*lease=*/30);
  ASSERT_NE(q, nullptr);
  constexpr int kItems = 20;
  const std::string big(200000, 'k');  // a problem's sources
  const size_t before = RedisInfoMemory(server.port());
  for (int i = 0; i < kItems; ++i) {
    v1::EvaluationRequest r = MakeQueueRequest("j1", absl::StrCat("r", i));
    r.mutable_problem()->set_description(big);
    ASSERT_TRUE(q->Enqueue("opencl", r).ok());
  }
  // The work stream holds small entries; the problem is stored once. (Copied into each entry it
  // would take 20 times its size; the server's buffers that carried it, its scripts and the
  // stream's own take about twice its size.)
  const size_t used = RedisInfoMemory(server.port()) - before;
  EXPECT_LT(used, 5 * big.size()) << "the problem was copied into the entries";
  EXPECT_GT(used, big.size()) << "the problem is stored once";
  auto other = Connect(server, /*lease=*/30);  // a worker: its own connections and cache
  ASSERT_NE(other, nullptr);
  for (int i = 0; i < kItems; ++i) {
    auto item = Take(*other, "w1");
    ASSERT_TRUE(item.has_value());
    EXPECT_EQ(item->request.problem().description().size(), big.size());
  }
}

}  // namespace
}  // namespace kforge::testing
