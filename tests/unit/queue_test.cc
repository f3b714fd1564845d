// The WorkQueue contract run against MemoryWorkQueue (leases on a FakeClock), plus
// MemoryWorkQueue-only behaviour.

#include <chrono>
#include <memory>
#include <thread>
#include <string>

#include "common/clock.h"
#include "common/logging.h"
#include "common/queue/lease_extender.h"
#include "common/queue/memory_queue.h"
#include "common/queue/stream.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/queue_contract.h"

namespace kforge::testing {
namespace {

class MemoryQueueFactory final : public QueueFactory {
 public:
  std::unique_ptr<WorkQueue> NewQueue(const WorkQueueOptions& options) override {
    return std::make_unique<MemoryWorkQueue>(clock_, options);
  }
  std::unique_ptr<WorkQueue> NewQueueOnSameBackend(const WorkQueueOptions&) override { return nullptr; }
  void AdvanceTime(double seconds) override { clock_.Advance(seconds); }

 private:
  FakeClock clock_;
};

INSTANTIATE_TEST_SUITE_P(Backends, QueueContractTest,
                         ::testing::Values(QueueBackend{"Memory", [] { return std::make_unique<MemoryQueueFactory>(); }}),
                         QueueBackendName);

TEST(MemoryWorkQueueTest, PendingCountFollowsLeases) {
  FakeClock clock;
  MemoryWorkQueue q(clock, 10);
  ASSERT_TRUE(q.Enqueue("a", MakeQueueRequest("j1", "r1")).ok());
  ASSERT_TRUE(q.Enqueue("b", MakeQueueRequest("j1", "r2")).ok());
  EXPECT_EQ(q.PendingCount(), 0u);
  auto a = q.Dequeue("a", "w", 0);
  auto b = q.Dequeue("b", "w", 0);
  ASSERT_TRUE(a.ok() && a->has_value());
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ(q.PendingCount(), 2u);
  ASSERT_TRUE(q.Complete("a", **a, ResultFor(**a)).ok());
  EXPECT_EQ(q.PendingCount(), 1u);
  // An expired lease stays pending until a consumer of its stream reclaims it.
  clock.Advance(11);
  EXPECT_EQ(q.PendingCount(), 1u);
  auto again = q.Dequeue("b", "w2", 0);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->attempt, 2);
  EXPECT_EQ(q.PendingCount(), 1u);  // the redelivery is the pending one now
  ASSERT_TRUE(q.Complete("b", **again, ResultFor(**again)).ok());
  EXPECT_EQ(q.PendingCount(), 0u);
}

TEST(MemoryWorkQueueTest, LeaseExpiryIsExactlyAtTheDeadline) {
  FakeClock clock;
  MemoryWorkQueue q(clock, 10);
  ASSERT_TRUE(q.Enqueue("s", MakeQueueRequest("j1", "r1")).ok());
  auto first = q.Dequeue("s", "w", 0);
  ASSERT_TRUE(first.ok() && first->has_value());
  clock.Advance(9.5);
  auto none = q.Dequeue("s", "w", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  clock.Advance(0.5);
  auto again = q.Dequeue("s", "w", 0);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->attempt, 2);
}

TEST(MemoryWorkQueueTest, RedeliveredDuplicateIsDedupedByIngestion) {
  // End to end with a store: the queue publishes both completions, the store keeps one.
  FakeClock clock;
  MemoryWorkQueue q(clock, 10);
  MemoryStore store;
  v1::Job job;
  job.set_id("j1");
  ASSERT_TRUE(store.CreateJob(job).ok());
  v1::EvaluationRequest req = MakeQueueRequest("j1", "r1");
  v1::Candidate cand = req.candidate();
  cand.set_content_hash("h1");
  ASSERT_TRUE(store.InsertCandidate(cand, kNoFence).value_or(false));
  ASSERT_TRUE(q.Enqueue("s", req).ok());

  auto slow = q.Dequeue("s", "slow", 0);
  ASSERT_TRUE(slow.ok() && slow->has_value());
  clock.Advance(11);
  auto fast = q.Dequeue("s", "fast", 0);
  ASSERT_TRUE(fast.ok() && fast->has_value());
  ASSERT_TRUE(q.Complete("s", **fast, ResultFor(**fast, 2.0)).ok());
  ASSERT_TRUE(q.Complete("s", **slow, ResultFor(**slow, 1.0)).ok());

  int stored = 0, results = 0;
  while (true) {
    auto r = q.NextResult("j1", 0.05);
    ASSERT_TRUE(r.ok());
    if (!r->has_value()) break;
    ++results;
    auto put = store.PutEvaluation((*r)->result, kNoFence);
    ASSERT_TRUE(q.AckResult("j1", (*r)->ack_token).ok());
    ASSERT_TRUE(put.ok()) << put.status();
    stored += *put ? 1 : 0;
  }
  EXPECT_EQ(results, 2);
  EXPECT_EQ(stored, 1);
  auto evals = store.ListEvaluations("j1");
  ASSERT_TRUE(evals.ok());
  ASSERT_EQ(evals->size(), 1u);
  EXPECT_DOUBLE_EQ((*evals)[0].speedup(), 2.0);  // the first completion wins
}

TEST(StreamForTest, BackendAndDeviceClass) {
  v1::Problem p;
  p.set_backend(v1::BACKEND_CUDA);
  EXPECT_EQ(StreamFor(p), "cuda");
  EXPECT_EQ(StreamFor(p, "NVIDIA H200"), "cuda:NVIDIA H200");
  p.set_backend(v1::BACKEND_OPENCL);
  EXPECT_EQ(StreamFor(p), "opencl");
  p.set_backend(v1::BACKEND_REPLAY);
  EXPECT_EQ(StreamFor(p, "anything"), "replay");
}

TEST(LeaseExtendingQueueTest, ExtendsHeldItemsUntilCompleted) {
  FakeClock clock;
  MemoryWorkQueue inner(clock, 10);
  LeaseExtendingQueue q(inner, /*interval_seconds=*/0.02, MakeLogger("test", spdlog::level::off));
  ASSERT_TRUE(q.Enqueue("s", MakeQueueRequest("j1", "r1")).ok());
  auto item = q.Dequeue("s", "w", 0);
  ASSERT_TRUE(item.ok() && item->has_value());
  EXPECT_EQ(q.HeldCount(), 1u);
  // Three leases pass in steps; the extender renews the lease in between.
  for (int i = 0; i < 6; ++i) {
    clock.Advance(5);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto probe = inner.Dequeue("s", "other", 0);
  ASSERT_TRUE(probe.ok());
  EXPECT_FALSE(probe->has_value()) << "a held item's lease expired";
  ASSERT_TRUE(q.Complete("s", **item, ResultFor(**item)).ok());
  EXPECT_EQ(q.HeldCount(), 0u);
  clock.Advance(11);
  probe = inner.Dequeue("s", "other", 0);
  ASSERT_TRUE(probe.ok());
  EXPECT_FALSE(probe->has_value());
}

TEST(LeaseExtendingQueueTest, StopsExtendingALostLease) {
  FakeClock clock;
  MemoryWorkQueue inner(clock, 10);
  LeaseExtendingQueue q(inner, /*interval_seconds=*/0.02, MakeLogger("test", spdlog::level::off));
  ASSERT_TRUE(q.Enqueue("s", MakeQueueRequest("j1", "r1")).ok());
  auto item = q.Dequeue("s", "w", 0);
  ASSERT_TRUE(item.ok() && item->has_value());
  ASSERT_TRUE(inner.PurgeJob("j1").ok());  // the lease is gone
  for (int i = 0; i < 50 && q.HeldCount() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(q.HeldCount(), 0u);
}

}  // namespace
}  // namespace kforge::testing
