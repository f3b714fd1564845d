#pragma once

// The WorkQueue contract: one suite of behaviours every WorkQueue backend must show (the
// in-process MemoryWorkQueue now, Redis Streams later). A backend's test file defines a
// QueueFactory and instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Memory, QueueContractTest,
//                            ::testing::Values(kforge::testing::QueueBackend{"Memory", [] {
//                              return std::make_unique<MyFactory>();
//                            }}),
//                            kforge::testing::QueueBackendName);
//
// A factory is made afresh for every test (nullptr skips the test: the backend cannot run here,
// e.g. no redis-server). The header defines the tests themselves: include it
// in exactly one source file per test binary.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/queue/work_queue.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kforge/v1/evaluation.pb.h"

namespace kforge::testing {

// Produces fresh, empty queues of one backend and controls the time their leases follow.
class QueueFactory {
 public:
  virtual ~QueueFactory() = default;
  // A new queue, sharing nothing with earlier ones.
  virtual std::unique_ptr<WorkQueue> NewQueue(const WorkQueueOptions& options) = 0;
  // Another queue object on the backend of the last NewQueue (what a restarted coordinator
  // connects to); nullptr when the backend lives inside the queue object.
  virtual std::unique_ptr<WorkQueue> NewQueueOnSameBackend(const WorkQueueOptions& options) = 0;
  // Lets `seconds` pass for lease expiry and result redelivery (a fake clock's advance, or a
  // real wait). Only called while no other thread is using the queue.
  virtual void AdvanceTime(double seconds) = 0;
};

struct QueueBackend {
  std::string name;
  std::function<std::unique_ptr<QueueFactory>()> make_factory;
};

inline std::string QueueBackendName(const ::testing::TestParamInfo<QueueBackend>& info) {
  return info.param.name;
}

inline v1::EvaluationRequest MakeQueueRequest(const std::string& job_id, const std::string& request_id) {
  v1::EvaluationRequest r;
  r.set_request_id(request_id);
  r.set_job_id(job_id);
  r.set_seed(7);
  r.mutable_candidate()->set_id(absl::StrCat("cand-", request_id));
  r.mutable_candidate()->set_job_id(job_id);
  r.mutable_problem()->set_name("matmul");
  r.set_attempt(1);
  return r;
}

inline v1::EvaluationResult ResultFor(const WorkItem& item, double speedup = 1.0) {
  v1::EvaluationResult r;
  r.set_request_id(item.request.request_id());
  r.set_job_id(item.request.job_id());
  r.set_candidate_id(item.request.candidate().id());
  r.set_outcome(v1::OUTCOME_OK);
  r.set_speedup(speedup);
  return r;
}

class QueueContractTest : public ::testing::TestWithParam<QueueBackend> {
 protected:
  static constexpr double kLease = 30;      // seconds of (fake or real) time
  static constexpr double kRedeliver = 60;  // result redelivery delay
  static constexpr int kMaxDeliveries = 3;

  static WorkQueueOptions Options() {
    return {.lease_seconds = kLease, .max_deliveries = kMaxDeliveries, .result_redelivery_seconds = kRedeliver};
  }

  void SetUp() override {
    factory_ = GetParam().make_factory();
    if (factory_ == nullptr) GTEST_SKIP() << GetParam().name << ": the backend cannot run here";
    queue_ = factory_->NewQueue(Options());
    ASSERT_NE(queue_, nullptr);
  }
  void TearDown() override {
    if (queue_) queue_->Close();
    queue_.reset();
    factory_.reset();
  }

  WorkQueue& queue() { return *queue_; }

  void MustEnqueue(const std::string& stream, const v1::EvaluationRequest& r) {
    ASSERT_TRUE(queue().Enqueue(stream, r).ok()) << r.request_id();
  }
  // The next item of the stream; fails the test if none comes within a second.
  // j1's r1, r2 and r3 queued, evaluated and their results delivered (not acknowledged): their
  // ack tokens by request id.
  void DeliverThree(std::map<std::string, std::string>* tokens) {
    for (const char* id : {"r1", "r2", "r3"}) MustEnqueue("opencl", MakeQueueRequest("j1", id));
    for (int i = 0; i < 3; ++i) {
      WorkItem item = MustDequeue("opencl");
      ASSERT_TRUE(queue().Complete("opencl", item, ResultFor(item)).ok());
    }
    for (int i = 0; i < 3; ++i) {
      auto d = NextDelivery("j1");
      ASSERT_TRUE(d.has_value());
      (*tokens)[d->result.request_id()] = d->ack_token;
    }
  }

  WorkItem MustDequeue(const std::string& stream, const std::string& consumer = "w1") {
    auto item = queue().Dequeue(stream, consumer, 1.0);
    EXPECT_TRUE(item.ok()) << item.status();
    if (!item.ok() || !item->has_value()) {
      ADD_FAILURE() << "nothing dequeued from " << stream;
      return WorkItem{};
    }
    return **item;
  }
  // Whether the stream delivers nothing within `timeout` seconds.
  bool DequeuesNothing(const std::string& stream, double timeout = 0.05) {
    auto item = queue().Dequeue(stream, "probe", timeout);
    EXPECT_TRUE(item.ok()) << item.status();
    if (item.ok() && item->has_value()) {
      ADD_FAILURE() << "unexpected item " << (*item)->request.request_id() << " attempt " << (*item)->attempt;
      return false;
    }
    return true;
  }
  // The job's next result, acknowledged at once.
  std::optional<v1::EvaluationResult> NextResult(const std::string& job_id, double timeout = 1.0) {
    auto d = NextDelivery(job_id, timeout);
    if (!d.has_value()) return std::nullopt;
    EXPECT_TRUE(queue().AckResult(job_id, d->ack_token).ok());
    return d->result;
  }
  // The job's next result, not acknowledged.
  std::optional<ResultDelivery> NextDelivery(const std::string& job_id, double timeout = 1.0, WorkQueue* q = nullptr) {
    auto r = (q != nullptr ? *q : queue()).NextResult(job_id, timeout);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::nullopt;
  }

  std::unique_ptr<QueueFactory> factory_;
  std::unique_ptr<WorkQueue> queue_;
};

using ::testing::ElementsAre;

TEST_P(QueueContractTest, DequeueIsFifoPerStream) {
  for (const char* id : {"r1", "r2", "r3", "r4"}) MustEnqueue("opencl", MakeQueueRequest("j1", id));
  std::vector<std::string> ids;
  std::set<std::string> deliveries;
  for (int i = 0; i < 4; ++i) {
    WorkItem item = MustDequeue("opencl");
    ids.push_back(item.request.request_id());
    EXPECT_EQ(item.attempt, 1);
    EXPECT_EQ(item.request.attempt(), 1);
    EXPECT_FALSE(item.delivery_id.empty());
    deliveries.insert(item.delivery_id);
  }
  EXPECT_THAT(ids, ElementsAre("r1", "r2", "r3", "r4"));
  EXPECT_EQ(deliveries.size(), 4u) << "delivery ids must be distinct";
  EXPECT_TRUE(DequeuesNothing("opencl"));
}

TEST_P(QueueContractTest, DequeuedRequestIsTheEnqueuedOne) {
  v1::EvaluationRequest r = MakeQueueRequest("j1", "r1");
  r.set_timeout_seconds(12.5);
  (*r.mutable_candidate()->mutable_params())["TILE"] = 16;
  MustEnqueue("cuda:NVIDIA H200", r);
  WorkItem item = MustDequeue("cuda:NVIDIA H200");
  EXPECT_EQ(item.request.request_id(), "r1");
  EXPECT_EQ(item.request.job_id(), "j1");
  EXPECT_EQ(item.request.seed(), 7u);
  EXPECT_DOUBLE_EQ(item.request.timeout_seconds(), 12.5);
  EXPECT_EQ(item.request.candidate().params().at("TILE"), 16);
  EXPECT_EQ(item.request.problem().name(), "matmul");
}

TEST_P(QueueContractTest, StreamsAreIndependent) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "o1"));
  MustEnqueue("cuda", MakeQueueRequest("j1", "c1"));
  MustEnqueue("opencl", MakeQueueRequest("j2", "o2"));
  EXPECT_TRUE(DequeuesNothing("replay"));
  EXPECT_EQ(MustDequeue("cuda").request.request_id(), "c1");
  EXPECT_TRUE(DequeuesNothing("cuda"));
  EXPECT_EQ(MustDequeue("opencl").request.request_id(), "o1");
  EXPECT_EQ(MustDequeue("opencl").request.request_id(), "o2");
  EXPECT_TRUE(DequeuesNothing("opencl"));
}

TEST_P(QueueContractTest, DequeueTimesOutWithNothing) {
  const auto start = std::chrono::steady_clock::now();
  auto item = queue().Dequeue("opencl", "w1", 0.2);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(item.ok()) << item.status();
  EXPECT_FALSE(item->has_value());
  EXPECT_GE(waited, 0.15);
  EXPECT_LT(waited, 5.0);

  // A zero timeout polls.
  const auto start0 = std::chrono::steady_clock::now();
  item = queue().Dequeue("opencl", "w1", 0);
  ASSERT_TRUE(item.ok()) << item.status();
  EXPECT_FALSE(item->has_value());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start0).count(), 1.0);
}

TEST_P(QueueContractTest, DequeueWakesWhenAnItemArrives) {
  std::optional<WorkItem> got;
  std::thread consumer([&] {
    auto item = queue().Dequeue("opencl", "w1", 10.0);
    if (item.ok()) got = *item;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  MustEnqueue("opencl", MakeQueueRequest("j1", "late"));
  consumer.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->request.request_id(), "late");
}

TEST_P(QueueContractTest, CompletePublishesToTheRequestsJobOnly) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  MustEnqueue("opencl", MakeQueueRequest("j2", "r2"));
  WorkItem a = MustDequeue("opencl");
  WorkItem b = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", a, ResultFor(a, 1.5)).ok());
  // Nothing for j2 yet, and nothing for a job that never had work.
  EXPECT_FALSE(NextResult("j2", 0.05).has_value());
  EXPECT_FALSE(NextResult("j3", 0.05).has_value());
  auto r1 = NextResult("j1");
  ASSERT_TRUE(r1.has_value());
  EXPECT_EQ(r1->request_id(), "r1");
  EXPECT_DOUBLE_EQ(r1->speedup(), 1.5);
  // Each result is delivered once.
  EXPECT_FALSE(NextResult("j1", 0.05).has_value());

  ASSERT_TRUE(queue().Complete("opencl", b, ResultFor(b, 2.0)).ok());
  EXPECT_FALSE(NextResult("j1", 0.05).has_value());
  auto r2 = NextResult("j2");
  ASSERT_TRUE(r2.has_value());
  EXPECT_EQ(r2->request_id(), "r2");
}

TEST_P(QueueContractTest, ResultsOfAJobComeInCompletionOrder) {
  for (const char* id : {"r1", "r2", "r3"}) MustEnqueue("opencl", MakeQueueRequest("j1", id));
  WorkItem i1 = MustDequeue("opencl");
  WorkItem i2 = MustDequeue("opencl");
  WorkItem i3 = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", i3, ResultFor(i3)).ok());
  ASSERT_TRUE(queue().Complete("opencl", i1, ResultFor(i1)).ok());
  ASSERT_TRUE(queue().Complete("opencl", i2, ResultFor(i2)).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto r = NextResult("j1");
    ASSERT_TRUE(r.has_value());
    ids.push_back(r->request_id());
  }
  EXPECT_THAT(ids, ElementsAre("r3", "r1", "r2"));
}

TEST_P(QueueContractTest, NextResultTimesOutWithNothing) {
  const auto start = std::chrono::steady_clock::now();
  auto r = queue().NextResult("j1", 0.2);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value());
  EXPECT_GE(waited, 0.15);
  EXPECT_LT(waited, 5.0);
}

TEST_P(QueueContractTest, NextResultWakesWhenAResultArrives) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem item = MustDequeue("opencl");
  std::optional<v1::EvaluationResult> got;
  std::thread waiter([&] {
    auto r = queue().NextResult("j1", 10.0);
    if (r.ok() && r->has_value()) got = (*r)->result;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(queue().Complete("opencl", item, ResultFor(item)).ok());
  waiter.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->request_id(), "r1");
}

TEST_P(QueueContractTest, UncompletedItemIsRedeliveredAfterTheLease) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem first = MustDequeue("opencl", "dying-worker");
  EXPECT_EQ(first.attempt, 1);
  // Within the lease nobody else gets it.
  factory_->AdvanceTime(kLease / 2);
  EXPECT_TRUE(DequeuesNothing("opencl"));
  factory_->AdvanceTime(kLease / 2 + 1);
  WorkItem second = MustDequeue("opencl", "w2");
  EXPECT_EQ(second.request.request_id(), "r1");
  EXPECT_EQ(second.attempt, 2);
  EXPECT_EQ(second.request.attempt(), 2);
  EXPECT_NE(second.delivery_id, first.delivery_id);
  EXPECT_TRUE(DequeuesNothing("opencl"));
  // And again, if the second worker dies too.
  factory_->AdvanceTime(kLease + 1);
  WorkItem third = MustDequeue("opencl", "w3");
  EXPECT_EQ(third.request.request_id(), "r1");
  EXPECT_EQ(third.attempt, 3);
  EXPECT_EQ(third.request.attempt(), 3);
  ASSERT_TRUE(queue().Complete("opencl", third, ResultFor(third)).ok());
  factory_->AdvanceTime(kLease * 3);
  EXPECT_TRUE(DequeuesNothing("opencl"));
}

TEST_P(QueueContractTest, CompletedItemIsNotRedelivered) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem item = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", item, ResultFor(item)).ok());
  factory_->AdvanceTime(kLease * 2);
  EXPECT_TRUE(DequeuesNothing("opencl"));
  ASSERT_TRUE(NextResult("j1").has_value());
  EXPECT_FALSE(NextResult("j1", 0.05).has_value());
}

TEST_P(QueueContractTest, LateCompletionOfARedeliveredItemPublishesTwice) {
  // A slow worker's lease expires, the item goes to a second worker, and both finish. The queue
  // publishes both results; it is result ingestion (Store::PutEvaluation, idempotent per
  // candidate) that keeps only one.
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem slow = MustDequeue("opencl", "slow");
  factory_->AdvanceTime(kLease + 1);
  WorkItem retry = MustDequeue("opencl", "fast");
  ASSERT_EQ(retry.attempt, 2);
  ASSERT_TRUE(queue().Complete("opencl", retry, ResultFor(retry, 2.0)).ok());
  ASSERT_TRUE(queue().Complete("opencl", slow, ResultFor(slow, 1.0)).ok());
  auto a = NextResult("j1");
  auto b = NextResult("j1");
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(a->request_id(), "r1");
  EXPECT_EQ(b->request_id(), "r1");
  EXPECT_EQ(a->candidate_id(), b->candidate_id());
  EXPECT_FALSE(NextResult("j1", 0.05).has_value());
  // Neither completion leaves the item pending.
  factory_->AdvanceTime(kLease * 2);
  EXPECT_TRUE(DequeuesNothing("opencl"));
}

TEST_P(QueueContractTest, CloseWakesABlockedDequeue) {
  std::atomic<bool> returned{false};
  std::optional<absl::StatusOr<std::optional<WorkItem>>> got;
  std::thread consumer([&] {
    got = queue().Dequeue("opencl", "w1", 30.0);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(returned.load());
  const auto start = std::chrono::steady_clock::now();
  queue().Close();
  consumer.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status();
  EXPECT_FALSE((*got)->has_value());
}

TEST_P(QueueContractTest, CloseWakesABlockedNextResult) {
  std::atomic<bool> returned{false};
  std::optional<absl::StatusOr<std::optional<ResultDelivery>>> got;
  std::thread waiter([&] {
    got = queue().NextResult("j1", 30.0);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(returned.load());
  const auto start = std::chrono::steady_clock::now();
  queue().Close();
  waiter.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok()) << got->status();
  EXPECT_FALSE((*got)->has_value());
}

TEST_P(QueueContractTest, AfterCloseCallsReturnAtOnce) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  queue().Close();
  const auto start = std::chrono::steady_clock::now();
  auto item = queue().Dequeue("opencl", "w1", 30.0);
  auto result = queue().NextResult("j1", 30.0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  ASSERT_TRUE(item.ok()) << item.status();
  EXPECT_FALSE(item->has_value());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->has_value());
}

TEST_P(QueueContractTest, ConcurrentConsumersGetDistinctItems) {
  constexpr int kItems = 300;
  constexpr int kConsumers = 5;
  for (int i = 0; i < kItems; ++i) MustEnqueue("opencl", MakeQueueRequest(i % 2 ? "j1" : "j2", absl::StrCat("r", i)));
  std::mutex mu;
  std::map<std::string, int> deliveries;  // request id -> times delivered
  std::atomic<int> errors{0};
  std::vector<std::thread> consumers;
  for (int c = 0; c < kConsumers; ++c) {
    consumers.emplace_back([&, c] {
      const std::string name = absl::StrCat("w", c);
      while (true) {
        auto item = queue().Dequeue("opencl", name, 0.3);
        if (!item.ok()) {
          ++errors;
          return;
        }
        if (!item->has_value()) return;  // drained
        {
          std::lock_guard<std::mutex> lock(mu);
          ++deliveries[(*item)->request.request_id()];
        }
        if ((*item)->attempt != 1) ++errors;
        if (!queue().Complete("opencl", **item, ResultFor(**item)).ok()) ++errors;
      }
    });
  }
  for (auto& t : consumers) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(deliveries.size(), static_cast<size_t>(kItems));
  for (const auto& [id, n] : deliveries) EXPECT_EQ(n, 1) << id << " delivered " << n << " times";
  // Every result reached its job exactly once.
  std::set<std::string> results;
  for (const char* job : {"j1", "j2"}) {
    while (auto r = NextResult(job, 0.05)) {
      EXPECT_EQ(r->job_id(), job);
      EXPECT_TRUE(results.insert(r->request_id()).second) << "duplicate result " << r->request_id();
    }
  }
  EXPECT_EQ(results.size(), static_cast<size_t>(kItems));
}

TEST_P(QueueContractTest, ConcurrentProducersAndConsumersLoseNothing) {
  constexpr int kProducers = 3;
  constexpr int kPerProducer = 100;
  constexpr int kConsumers = 3;
  std::mutex mu;
  std::map<std::string, int> deliveries;
  std::atomic<int> errors{0};
  std::atomic<int> produced_done{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        if (!queue().Enqueue("opencl", MakeQueueRequest("j1", absl::StrCat("p", p, "-", i))).ok()) ++errors;
      }
      ++produced_done;
    });
  }
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&, c] {
      const std::string name = absl::StrCat("w", c);
      while (true) {
        // Read before waiting: an empty wait after every producer finished means drained.
        const bool all_produced = produced_done.load() == kProducers;
        auto item = queue().Dequeue("opencl", name, 0.3);
        if (!item.ok()) {
          ++errors;
          return;
        }
        if (!item->has_value()) {
          if (all_produced) return;
          continue;
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          ++deliveries[(*item)->request.request_id()];
        }
        if (!queue().Complete("opencl", **item, ResultFor(**item)).ok()) ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(deliveries.size(), static_cast<size_t>(kProducers * kPerProducer));
  for (const auto& [id, n] : deliveries) EXPECT_EQ(n, 1) << id;
}

// ---------------------------------------------------------------------------------------------
// Idempotent enqueue, leases extended, acknowledged results, purge, poison.

TEST_P(QueueContractTest, EnqueueIsIdempotentPerCandidateWhileQueuedOrInFlight) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));  // a resumed job re-dispatching
  MustEnqueue("opencl", MakeQueueRequest("j2", "r1"));  // the same candidate id in another job
  WorkItem a = MustDequeue("opencl");
  WorkItem b = MustDequeue("opencl");
  EXPECT_EQ(a.request.job_id(), "j1");
  EXPECT_EQ(b.request.job_id(), "j2");
  EXPECT_TRUE(DequeuesNothing("opencl"));
  // In flight: still not queued again, on any stream.
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  EXPECT_TRUE(DequeuesNothing("opencl"));
  // Lease expired, waiting for redelivery: one delivery only.
  factory_->AdvanceTime(kLease + 1);
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  std::map<std::string, WorkItem> redelivered;  // by job
  for (int i = 0; i < 2; ++i) {
    WorkItem item = MustDequeue("opencl", "w2");
    EXPECT_EQ(item.attempt, 2);
    redelivered[item.request.job_id()] = item;
  }
  ASSERT_EQ(redelivered.size(), 2u);
  EXPECT_TRUE(DequeuesNothing("opencl"));
  const WorkItem again = redelivered["j1"];
  // Completed, its result owed (published, not acknowledged): a coordinator that restarted before
  // storing it reads the result; the candidate is not queued again.
  ASSERT_TRUE(queue().Complete("opencl", again, ResultFor(again)).ok());
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  EXPECT_TRUE(DequeuesNothing("opencl"));
  // Acknowledged (stored): a later enqueue is a new dispatch.
  auto owed = NextResult("j1");
  ASSERT_TRUE(owed.has_value());
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem fresh = MustDequeue("opencl");
  EXPECT_EQ(fresh.request.job_id(), "j1");
  EXPECT_EQ(fresh.attempt, 1);
}

TEST_P(QueueContractTest, AResultOwedToARestartedCoordinatorIsReadNotEvaluatedAgain) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem item = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", item, ResultFor(item, 2.5)).ok());
  // The coordinator died before reading (or before storing) the result; its successor, which
  // finds no evaluation in the store, dispatches the candidate again.
  std::unique_ptr<WorkQueue> restarted = factory_->NewQueueOnSameBackend(Options());
  WorkQueue& q = restarted != nullptr ? *restarted : queue();
  ASSERT_TRUE(q.Enqueue("opencl", MakeQueueRequest("j1", "r1")).ok());
  EXPECT_TRUE(DequeuesNothing("opencl"));
  auto d = NextDelivery("j1", 1.0, &q);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->result.speedup(), 2.5);
  ASSERT_TRUE(q.AckResult("j1", d->ack_token).ok());
  if (restarted != nullptr) restarted->Close();
}

TEST_P(QueueContractTest, AReleasedItemGoesToAnotherWorkerAtOnceAsADelivery) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem first = MustDequeue("opencl", "draining");
  EXPECT_TRUE(DequeuesNothing("opencl"));
  ASSERT_TRUE(queue().Release("opencl", first).ok());
  WorkItem second = MustDequeue("opencl", "w2");  // well within the lease
  EXPECT_EQ(second.request.request_id(), "r1");
  EXPECT_EQ(second.attempt, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(queue().Release("opencl", first)));  // not its lease now
  EXPECT_TRUE(absl::IsFailedPrecondition(queue().ExtendLease("opencl", first)));
  ASSERT_TRUE(queue().Complete("opencl", second, ResultFor(second)).ok());
  auto r = NextResult("j1");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->outcome(), v1::OUTCOME_OK);
  // Released by every worker it reaches, it ends like any item delivered too often.
  MustEnqueue("opencl", MakeQueueRequest("j1", "r2"));
  for (int attempt = 1; attempt <= kMaxDeliveries; ++attempt) {
    WorkItem item = MustDequeue("opencl", absl::StrCat("busy-", attempt));
    EXPECT_EQ(item.attempt, attempt);
    ASSERT_TRUE(queue().Release("opencl", item).ok());
  }
  EXPECT_TRUE(DequeuesNothing("opencl"));
  auto poisoned = NextResult("j1");
  ASSERT_TRUE(poisoned.has_value());
  EXPECT_EQ(poisoned->outcome(), v1::OUTCOME_INFRA_ERROR);
}

TEST_P(QueueContractTest, ExtendedLeaseIsNotRedelivered) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem item = MustDequeue("opencl", "slow");
  factory_->AdvanceTime(kLease * 2 / 3);
  ASSERT_TRUE(queue().ExtendLease("opencl", item).ok());
  factory_->AdvanceTime(kLease * 2 / 3);  // past the first lease, within the extended one
  EXPECT_TRUE(DequeuesNothing("opencl"));
  ASSERT_TRUE(queue().ExtendLease("opencl", item).ok());
  factory_->AdvanceTime(kLease * 2 / 3);
  EXPECT_TRUE(DequeuesNothing("opencl"));
  // The worker dies: the item comes back within a lease of its last extension.
  factory_->AdvanceTime(kLease / 2);
  WorkItem again = MustDequeue("opencl", "w2");
  EXPECT_EQ(again.request.request_id(), "r1");
  EXPECT_EQ(again.attempt, 2);
}

TEST_P(QueueContractTest, ExtendingALostLeaseFails) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem first = MustDequeue("opencl", "w1");
  factory_->AdvanceTime(kLease + 1);
  WorkItem second = MustDequeue("opencl", "w2");
  ASSERT_EQ(second.attempt, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(queue().ExtendLease("opencl", first)));
  EXPECT_TRUE(queue().ExtendLease("opencl", second).ok());
  ASSERT_TRUE(queue().Complete("opencl", second, ResultFor(second)).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(queue().ExtendLease("opencl", second)));
}

TEST_P(QueueContractTest, ItemDeliveredMaxTimesWithoutAResultEndsAsInfraError) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  for (int attempt = 1; attempt <= kMaxDeliveries; ++attempt) {
    WorkItem item = MustDequeue("opencl", absl::StrCat("dying-", attempt));
    EXPECT_EQ(item.attempt, attempt);
    factory_->AdvanceTime(kLease + 1);
  }
  EXPECT_TRUE(DequeuesNothing("opencl"));
  auto r = NextResult("j1");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request_id(), "r1");
  EXPECT_EQ(r->candidate_id(), "cand-r1");
  EXPECT_EQ(r->outcome(), v1::OUTCOME_INFRA_ERROR);
  EXPECT_THAT(r->message(), ::testing::HasSubstr("delivered 3 times without a result"));
  factory_->AdvanceTime(kLease * 2);
  EXPECT_TRUE(DequeuesNothing("opencl"));
  EXPECT_FALSE(NextResult("j1", 0.05).has_value());
}

TEST_P(QueueContractTest, UnacknowledgedResultIsDeliveredAgain) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  MustEnqueue("opencl", MakeQueueRequest("j1", "r2"));
  WorkItem a = MustDequeue("opencl");
  WorkItem b = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", a, ResultFor(a)).ok());
  ASSERT_TRUE(queue().Complete("opencl", b, ResultFor(b)).ok());
  auto first = NextDelivery("j1");  // the coordinator dies before storing it
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->result.request_id(), "r1");
  EXPECT_FALSE(first->ack_token.empty());
  auto second = NextDelivery("j1");
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->result.request_id(), "r2");
  ASSERT_TRUE(queue().AckResult("j1", second->ack_token).ok());
  EXPECT_FALSE(NextDelivery("j1", 0.05).has_value()) << "not before the redelivery delay";
  factory_->AdvanceTime(kRedeliver + 1);
  auto again = NextDelivery("j1");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->result.request_id(), "r1");
  ASSERT_TRUE(queue().AckResult("j1", again->ack_token).ok());
  factory_->AdvanceTime(kRedeliver * 2);
  EXPECT_FALSE(NextDelivery("j1", 0.05).has_value());
}

TEST_P(QueueContractTest, EnqueueBatchQueuesEachInOrderOnceOnly) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  const std::vector<v1::EvaluationRequest> batch = {MakeQueueRequest("j1", "r1"), MakeQueueRequest("j1", "r2"),
                                                    MakeQueueRequest("j2", "r3"), MakeQueueRequest("j1", "r2")};
  ASSERT_TRUE(queue().EnqueueBatch("opencl", batch).ok());
  ASSERT_TRUE(queue().EnqueueBatch("opencl", {}).ok());
  std::vector<std::string> got;
  for (int i = 0; i < 3; ++i) {
    WorkItem item = MustDequeue("opencl");
    got.push_back(item.request.job_id() + "/" + item.request.request_id());
    EXPECT_EQ(item.attempt, 1);
  }
  EXPECT_THAT(got, ElementsAre("j1/r1", "j1/r2", "j2/r3"));
  EXPECT_TRUE(DequeuesNothing("opencl"));
}

TEST_P(QueueContractTest, AckResultsAcknowledgesEachTokenGiven) {
  std::map<std::string, std::string> tokens;  // request id -> ack token
  ASSERT_NO_FATAL_FAILURE(DeliverThree(&tokens));
  ASSERT_EQ(tokens.size(), 3u);
  ASSERT_TRUE(queue().AckResults("j1", {tokens["r1"], tokens["r3"]}).ok());
  ASSERT_TRUE(queue().AckResults("j1", {}).ok());
  factory_->AdvanceTime(kRedeliver + 1);
  auto again = NextDelivery("j1");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->result.request_id(), "r2");
  ASSERT_TRUE(queue().AckResults("j1", {again->ack_token}).ok());
  factory_->AdvanceTime(kRedeliver * 2);
  EXPECT_FALSE(NextDelivery("j1", 0.05).has_value());
}

TEST_P(QueueContractTest, EnqueueBatchAndAckQueuesTheRequestsAndAcknowledgesTheTokens) {
  std::map<std::string, std::string> tokens;  // request id -> ack token
  ASSERT_NO_FATAL_FAILURE(DeliverThree(&tokens));
  absl::Status acked = absl::UnknownError("not set");
  ASSERT_TRUE(queue()
                  .EnqueueBatchAndAck("opencl", {MakeQueueRequest("j1", "r4")}, "j1",
                                      {tokens["r1"], tokens["r3"]}, &acked)
                  .ok());
  EXPECT_TRUE(acked.ok()) << acked;
  // Nothing to send: the tokens are still acknowledged; no tokens: the requests still go.
  acked = absl::UnknownError("not set");
  ASSERT_TRUE(queue().EnqueueBatchAndAck("opencl", {}, "j1", {}, &acked).ok());
  EXPECT_TRUE(acked.ok()) << acked;
  acked = absl::UnknownError("not set");
  ASSERT_TRUE(
      queue().EnqueueBatchAndAck("opencl", {MakeQueueRequest("j1", "r5")}, "j1", {}, &acked).ok());
  EXPECT_TRUE(acked.ok()) << acked;
  std::vector<std::string> got;
  for (int i = 0; i < 2; ++i) got.push_back(MustDequeue("opencl").request.request_id());
  EXPECT_THAT(got, ElementsAre("r4", "r5"));
  factory_->AdvanceTime(kRedeliver + 1);
  auto again = NextDelivery("j1");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->result.request_id(), "r2");
  acked = absl::UnknownError("not set");
  ASSERT_TRUE(queue().EnqueueBatchAndAck("opencl", {}, "j1", {again->ack_token}, &acked).ok());
  EXPECT_TRUE(acked.ok()) << acked;
  factory_->AdvanceTime(kRedeliver * 2);
  EXPECT_FALSE(NextDelivery("j1", 0.05).has_value());
}

TEST_P(QueueContractTest, NextResultsTakesTheResultsAtHandOwedLikeNextResults) {
  EXPECT_TRUE(queue().NextResults("j1", 8, 0.05)->empty());
  for (const char* id : {"r1", "r2", "r3", "r4"}) MustEnqueue("opencl", MakeQueueRequest("j1", id));
  for (int i = 0; i < 4; ++i) {
    WorkItem item = MustDequeue("opencl");
    ASSERT_TRUE(queue().Complete("opencl", item, ResultFor(item)).ok());
  }
  // At most `max` a call, each once, in the order they came; none when `max` is 0.
  EXPECT_TRUE(queue().NextResults("j1", 0, 0.05)->empty());
  std::vector<ResultDelivery> got;
  for (int call = 0; call < 8 && got.size() < 4; ++call) {
    absl::StatusOr<std::vector<ResultDelivery>> some = queue().NextResults("j1", 3, 1.0);
    ASSERT_TRUE(some.ok()) << some.status();
    ASSERT_FALSE(some->empty());
    EXPECT_LE(some->size(), 3u);
    for (auto& d : *some) got.push_back(std::move(d));
  }
  std::vector<std::string> ids;
  for (const auto& d : got) ids.push_back(d.result.request_id());
  EXPECT_THAT(ids, ElementsAre("r1", "r2", "r3", "r4"));
  // Owed until acknowledged: the unacknowledged one comes back, through either call.
  ASSERT_TRUE(
      queue().AckResults("j1", {got[0].ack_token, got[1].ack_token, got[3].ack_token}).ok());
  EXPECT_TRUE(queue().NextResults("j1", 8, 0.05)->empty());
  factory_->AdvanceTime(kRedeliver + 1);
  absl::StatusOr<std::vector<ResultDelivery>> again = queue().NextResults("j1", 8, 1.0);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ((*again)[0].result.request_id(), "r3");
  ASSERT_TRUE(queue().AckResult("j1", (*again)[0].ack_token).ok());
  factory_->AdvanceTime(kRedeliver * 2);
  EXPECT_FALSE(NextDelivery("j1", 0.05).has_value());
}

TEST_P(QueueContractTest, UnacknowledgedResultComesBackOnANewQueue) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  WorkItem a = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", a, ResultFor(a, 3.0)).ok());
  auto lost = NextDelivery("j1");
  ASSERT_TRUE(lost.has_value());
  queue().Close();
  std::unique_ptr<WorkQueue> restarted = factory_->NewQueueOnSameBackend(Options());
  if (restarted == nullptr) GTEST_SKIP() << GetParam().name << ": the backend does not outlive its queue object";
  auto again = NextDelivery("j1", 1.0, restarted.get());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->result.request_id(), "r1");
  EXPECT_DOUBLE_EQ(again->result.speedup(), 3.0);
  ASSERT_TRUE(restarted->AckResult("j1", again->ack_token).ok());
  EXPECT_FALSE(NextDelivery("j1", 0.05, restarted.get()).has_value());
  restarted->Close();
}

TEST_P(QueueContractTest, PurgeJobDropsItsQueuedAndInFlightItems) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  MustEnqueue("opencl", MakeQueueRequest("j1", "r2"));
  MustEnqueue("opencl", MakeQueueRequest("j2", "r3"));
  MustEnqueue("cuda", MakeQueueRequest("j1", "r4"));
  WorkItem in_flight = MustDequeue("opencl");
  ASSERT_EQ(in_flight.request.request_id(), "r1");
  ASSERT_TRUE(queue().PurgeJob("j1").ok());
  WorkItem other = MustDequeue("opencl");
  EXPECT_EQ(other.request.request_id(), "r3");
  ASSERT_TRUE(queue().Complete("opencl", other, ResultFor(other)).ok());
  EXPECT_TRUE(DequeuesNothing("opencl"));
  EXPECT_TRUE(DequeuesNothing("cuda"));
  factory_->AdvanceTime(kLease + 1);
  EXPECT_TRUE(DequeuesNothing("opencl")) << "a purged in-flight item is not redelivered";
  // The job's candidates may be dispatched again (a resubmitted job).
  MustEnqueue("opencl", MakeQueueRequest("j1", "r2"));
  EXPECT_EQ(MustDequeue("opencl").request.request_id(), "r2");
  // Purging a job without work is fine.
  EXPECT_TRUE(queue().PurgeJob("nobody").ok());
}

TEST_P(QueueContractTest, PurgeJobDropsItsUndeliveredResults) {
  MustEnqueue("opencl", MakeQueueRequest("j1", "r1"));
  MustEnqueue("opencl", MakeQueueRequest("j2", "r2"));
  WorkItem a = MustDequeue("opencl");
  WorkItem b = MustDequeue("opencl");
  ASSERT_TRUE(queue().Complete("opencl", a, ResultFor(a)).ok());
  ASSERT_TRUE(queue().Complete("opencl", b, ResultFor(b)).ok());
  ASSERT_TRUE(queue().PurgeJob("j1").ok());
  EXPECT_FALSE(NextResult("j1", 0.05).has_value());
  auto r = NextResult("j2");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request_id(), "r2");
}

TEST_P(QueueContractTest, StatsCountQueuedAndLeasedItemsPerStream) {
  auto none = queue().Stats();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  for (const char* id : {"r1", "r2", "r3"}) MustEnqueue("opencl", MakeQueueRequest("j1", id));
  MustEnqueue("cuda", MakeQueueRequest("j1", "r4"));
  WorkItem cuda_item = MustDequeue("cuda");
  MustDequeue("opencl");
  factory_->AdvanceTime(10);
  auto stats = queue().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::map<std::string, StreamStats> by_stream;
  for (const StreamStats& s : *stats) by_stream[s.stream] = s;
  ASSERT_EQ(by_stream.size(), 2u);
  EXPECT_EQ(by_stream["opencl"].depth, 2);
  EXPECT_EQ(by_stream["opencl"].in_flight, 1);
  EXPECT_GT(by_stream["opencl"].oldest_queued_seconds, 0) << "two items have waited";
  EXPECT_EQ(by_stream["cuda"].depth, 0);
  EXPECT_EQ(by_stream["cuda"].in_flight, 1);
  EXPECT_EQ(by_stream["cuda"].oldest_queued_seconds, 0) << "nothing is queued on cuda";
  // A completed item leaves the stream's counts.
  ASSERT_TRUE(queue().Complete("cuda", cuda_item, ResultFor(cuda_item)).ok());
  stats = queue().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const StreamStats& s : *stats) {
    if (s.stream == "cuda") {
      EXPECT_EQ(s.depth + s.in_flight, 0);
    }
  }
}

TEST_P(QueueContractTest, HeartbeatsMakeTheFleetAndQuietWorkersLeaveIt) {
  v1::WorkerStatus a;
  a.set_worker_id("wa");
  a.set_slots(2);
  a.add_streams("opencl");
  a.add_devices()->set_name("Device A");
  v1::WorkerStatus b;
  b.set_worker_id("wb");
  b.set_slots(1);
  ASSERT_TRUE(queue().Heartbeat(a).ok());
  ASSERT_TRUE(queue().Heartbeat(b).ok());
  auto fleet = queue().ListWorkers();
  ASSERT_TRUE(fleet.ok()) << fleet.status();
  ASSERT_EQ(fleet->size(), 2u);
  EXPECT_EQ((*fleet)[0].worker_id(), "wa");
  EXPECT_EQ((*fleet)[0].slots(), 2);
  ASSERT_EQ((*fleet)[0].streams_size(), 1);
  EXPECT_EQ((*fleet)[0].devices(0).name(), "Device A");
  EXPECT_LT((*fleet)[0].seconds_since_heartbeat(), 5);
  EXPECT_EQ((*fleet)[1].worker_id(), "wb");
  // A later heartbeat replaces the earlier one.
  a.set_busy(2);
  ASSERT_TRUE(queue().Heartbeat(a).ok());
  fleet = queue().ListWorkers();
  ASSERT_TRUE(fleet.ok());
  ASSERT_EQ(fleet->size(), 2u);
  EXPECT_EQ((*fleet)[0].busy(), 2);
  // wa goes quiet past the TTL (15 s); wb keeps speaking.
  factory_->AdvanceTime(10);
  ASSERT_TRUE(queue().Heartbeat(b).ok());
  factory_->AdvanceTime(10);
  fleet = queue().ListWorkers();
  ASSERT_TRUE(fleet.ok());
  ASSERT_EQ(fleet->size(), 1u);
  EXPECT_EQ((*fleet)[0].worker_id(), "wb");
  EXPECT_GE((*fleet)[0].seconds_since_heartbeat(), 0);
}

}  // namespace kforge::testing
