#pragma once

// The Store contract: one suite of behaviours every Store backend must show, run against each
// backend (MemoryStore, SqliteStore, PostgresStore). A backend's test file defines a
// StoreFactory, then instantiates the suite:
//
//   INSTANTIATE_TEST_SUITE_P(Memory, StoreContractTest,
//                            ::testing::Values(kforge::testing::StoreBackend{"Memory", [] {
//                              return std::make_unique<MyFactory>();
//                            }}),
//                            kforge::testing::StoreBackendName);
//
// A factory is made afresh for every test (so it may own a temporary directory or a database
// schema) and is destroyed after the stores it made. The header defines the tests themselves:
// include it in exactly one source file per test binary.
//
// Beyond store.h's comments, the contract pins down: every per-job call on an unknown job is
// NotFound; job order is by creation (updates do not reorder, ids do not matter); dedupe is per
// job; ListJobs after an unknown after_job_id is an empty page (not an error); an update that
// names no version (0) is refused like any other stale one; a fenced write carrying the job's
// current token succeeds.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/store/api_key.h"
#include "common/store/store.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/job.pb.h"
#include "kforge/v1/llm_proxy.pb.h"
#include "kforge/v1/tenant.pb.h"

namespace kforge::testing {

// Produces fresh, empty stores of one backend.
class StoreFactory {
 public:
  virtual ~StoreFactory() = default;
  // A new store that shares nothing with any store made before.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<Store>> NewStore() = 0;
};

// One backend under test: a name for the test names and a way to make its factory.
struct StoreBackend {
  std::string name;
  std::function<std::unique_ptr<StoreFactory>()> make_factory;
};

inline std::string StoreBackendName(const ::testing::TestParamInfo<StoreBackend>& info) {
  return info.param.name;
}

// Protobuf equality (map fields make byte comparison unreliable).
MATCHER_P(EqualsProto, expected, "") {
  std::string diff;
  google::protobuf::util::MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  if (d.Compare(arg, expected)) return true;
  *result_listener << "differs: " << diff;
  return false;
}

// ---- record builders ----------------------------------------------------------------------

inline v1::Job MakeContractJob(const std::string& id, const std::string& tenant = "acme",
                               const std::string& problem_hash = "problem-1",
                               v1::JobState state = v1::JOB_STATE_QUEUED) {
  v1::Job j;
  j.set_id(id);
  j.set_state(state);
  v1::JobSpec* spec = j.mutable_spec();
  spec->set_tenant(tenant);
  spec->set_seed(42);
  spec->set_display_name(absl::StrCat("job ", id));
  spec->mutable_problem()->set_name("matmul");
  spec->mutable_problem()->set_content_hash(problem_hash);
  spec->mutable_budget()->set_max_candidates(100);
  (*j.mutable_progress()->mutable_outcome_counts())["ok"] = 3;
  (*j.mutable_progress()->mutable_outcome_counts())["timeout"] = 1;
  j.mutable_created_at()->set_seconds(1700000000);
  return j;
}

// `job` as the store keeps it at `version`.
inline v1::Job AtVersion(v1::Job job, int64_t version) {
  job.set_version(version);
  return job;
}

inline v1::Job MakeKeyedJob(const std::string& id, const std::string& tenant, const std::string& key) {
  v1::Job j = MakeContractJob(id, tenant);
  j.set_idempotency_key(key);
  return j;
}

inline v1::Candidate MakeContractCandidate(const std::string& job_id, const std::string& id,
                                           const std::string& hash, int64_t sequence) {
  v1::Candidate c;
  c.set_job_id(job_id);
  c.set_id(id);
  c.set_content_hash(hash);
  c.set_sequence(sequence);
  c.set_source(absl::StrCat("kernel void k() { /* ", id, " */ }"));
  (*c.mutable_params())["TILE"] = 16 + sequence;
  (*c.mutable_params())["WPT"] = 4;
  c.set_mutator(v1::MUTATOR_KIND_PARAMETRIC);
  c.set_generation(sequence);
  c.set_note("neighbour");
  return c;
}

inline v1::EvaluationResult MakeContractResult(const std::string& job_id, const std::string& candidate_id,
                                               double speedup) {
  v1::EvaluationResult r;
  r.set_request_id(absl::StrCat("req-", candidate_id));
  r.set_job_id(job_id);
  r.set_candidate_id(candidate_id);
  r.set_outcome(v1::OUTCOME_OK);
  r.set_speedup(speedup);
  r.set_worker_id("worker-1");
  v1::StageResult* st = r.add_stages();
  st->set_stage(v1::STAGE_COMPILE);
  st->set_outcome(v1::OUTCOME_OK);
  return r;
}

inline v1::JobEvent MakeContractEvent(const std::string& job_id, const std::string& message) {
  v1::JobEvent e;
  e.set_job_id(job_id);
  e.set_message(message);
  e.mutable_time()->set_seconds(1700000100);
  return e;
}

inline v1::ModelCall MakeContractModelCall(const std::string& job_id, int64_t proposal) {
  v1::ModelCall m;
  m.set_job_id(job_id);
  m.set_proposal(proposal);
  v1::LlmUsage* u = m.mutable_usage();
  u->set_provider("anthropic");
  u->set_model(absl::StrCat("model-", proposal % 3));
  u->set_input_tokens(1000 + proposal);
  u->set_output_tokens(250 + proposal);
  u->set_cost_usd(0.0125 * static_cast<double>(proposal + 1));
  u->set_latency_seconds(1.5);
  u->set_cache_hit(proposal % 2 == 0);
  u->set_retries(static_cast<int32_t>(proposal % 4));
  if (proposal % 2 == 1) m.set_message("the response had no edit block");
  m.mutable_time()->set_seconds(1700000200 + proposal);
  m.mutable_time()->set_nanos(250000000);
  return m;
}

inline v1::Tenant MakeContractTenant(const std::string& name) {
  v1::Tenant t;
  t.set_name(name);
  t.set_display_name(absl::StrCat("Team ", name));
  t.mutable_quota()->set_max_running_jobs(4);
  t.mutable_quota()->set_max_evaluations_per_hour(5000);
  t.mutable_quota()->set_max_in_flight(64);
  t.mutable_created_at()->set_seconds(1690000000);
  return t;
}

// ---- the suite ----------------------------------------------------------------------------

class StoreContractTest : public ::testing::TestWithParam<StoreBackend> {
 protected:
  void SetUp() override {
    factory_ = GetParam().make_factory();
    ASSERT_NE(factory_, nullptr);
    auto s = factory_->NewStore();
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override {
    store_.reset();  // before the factory that may own its files
    factory_.reset();
  }

  Store& store() { return *store_; }

  void MustCreateJob(const v1::Job& job) {
    auto r = store().CreateJob(job);
    ASSERT_TRUE(r.ok()) << job.id() << ": " << r.status();
  }
  // Reads the job, applies `edit`, writes it back at the version read; returns the new version
  // (-1 on failure, reported).
  int64_t MustUpdate(const std::string& job_id, const std::function<void(v1::Job&)>& edit,
                     int64_t fence = kNoFence) {
    auto job = store().GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return -1;
    edit(*job);
    auto v = store().UpdateJob(*job, fence);
    EXPECT_TRUE(v.ok()) << job_id << ": " << v.status();
    return v.ok() ? *v : -1;
  }
  void MustInsert(const v1::Candidate& c, int64_t fence = kNoFence) {
    auto r = store().InsertCandidate(c, fence);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(*r) << "candidate " << c.id() << " was not inserted";
  }
  JobLease MustClaim(const std::string& job_id, const std::string& owner, double seconds) {
    auto l = store().ClaimJob(job_id, owner, seconds);
    EXPECT_TRUE(l.ok()) << job_id << " by " << owner << ": " << l.status();
    return l.ok() ? *l : JobLease{};
  }
  void MustCreateTenant(const std::string& name) {
    const absl::Status st = store().CreateTenant(MakeContractTenant(name));
    ASSERT_TRUE(st.ok()) << st;
  }
  // Mints a key for `tenant`, stores it and returns the record; the token goes to *token.
  v1::ApiKey MustCreateKey(const std::string& tenant, const std::string& name, std::string* token,
                           bool service = false) {
    auto minted = MintApiKey(tenant, name, service);
    EXPECT_TRUE(minted.ok()) << minted.status();
    if (!minted.ok()) return {};
    minted->record.mutable_created_at()->set_seconds(1700000300);
    const absl::Status st = store().CreateApiKey(minted->record);
    EXPECT_TRUE(st.ok()) << st;
    if (token != nullptr) *token = minted->token;
    return minted->record;
  }
  std::vector<std::string> JobIds(const JobQuery& q) {
    auto jobs = store().ListJobs(q);
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    std::vector<std::string> ids;
    if (jobs.ok()) {
      for (const auto& j : *jobs) ids.push_back(j.id());
    }
    return ids;
  }
  std::vector<std::string> CandidateIds(const std::string& job_id) {
    auto cands = store().ListCandidates(job_id);
    EXPECT_TRUE(cands.ok()) << cands.status();
    std::vector<std::string> ids;
    if (cands.ok()) {
      for (const auto& c : *cands) ids.push_back(c.id());
    }
    return ids;
  }
  std::vector<std::string> EvaluatedIds(const std::string& job_id) {
    auto evals = store().ListEvaluations(job_id);
    EXPECT_TRUE(evals.ok()) << evals.status();
    std::vector<std::string> ids;
    if (evals.ok()) {
      for (const auto& r : *evals) ids.push_back(r.candidate_id());
    }
    return ids;
  }
  std::vector<int64_t> EventSeqs(const std::string& job_id) {
    auto ev = store().ListEvents(job_id, 1, 1000);
    EXPECT_TRUE(ev.ok()) << ev.status();
    std::vector<int64_t> out;
    if (ev.ok()) {
      for (const auto& e : *ev) out.push_back(e.sequence());
    }
    return out;
  }
  std::vector<int64_t> ModelCallSeqs(const std::string& job_id, int64_t from = 1, int limit = 1000) {
    auto calls = store().ListModelCalls(job_id, from, limit);
    EXPECT_TRUE(calls.ok()) << calls.status();
    std::vector<int64_t> out;
    if (calls.ok()) {
      for (const auto& c : *calls) out.push_back(c.sequence());
    }
    return out;
  }

  std::unique_ptr<StoreFactory> factory_;
  std::unique_ptr<Store> store_;
};

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

inline void SleepSeconds(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// -- jobs --

TEST_P(StoreContractTest, FreshStoreIsEmpty) {
  EXPECT_THAT(JobIds({}), IsEmpty());
  EXPECT_EQ(store().GetJob("j1").status().code(), absl::StatusCode::kNotFound);
  auto tenants = store().ListTenants();
  ASSERT_TRUE(tenants.ok()) << tenants.status();
  EXPECT_THAT(*tenants, IsEmpty());
}

TEST_P(StoreContractTest, CreateThenGetRoundTripsTheWholeJob) {
  const v1::Job job = MakeContractJob("j1");
  MustCreateJob(job);
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(job, 1)));
}

TEST_P(StoreContractTest, GetUnknownJobIsNotFound) {
  MustCreateJob(MakeContractJob("j1"));
  EXPECT_EQ(store().GetJob("j2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().GetJob("").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreContractTest, CreateWithTakenIdIsAlreadyExistsAndKeepsTheFirst) {
  const v1::Job first = MakeContractJob("j1", "acme");
  MustCreateJob(first);
  const absl::Status st = store().CreateJob(MakeContractJob("j1", "other-tenant")).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(first, 1)));
  EXPECT_THAT(JobIds({}), ElementsAre("j1"));
}

TEST_P(StoreContractTest, UpdateReplacesTheStoredJob) {
  MustCreateJob(MakeContractJob("j1"));
  v1::Job updated = MakeContractJob("j1");
  updated.set_version(1);
  updated.set_state(v1::JOB_STATE_COMPLETED);
  updated.set_state_reason("budget: max_candidates");
  updated.mutable_progress()->set_best_speedup(2.5);
  updated.mutable_progress()->mutable_outcome_counts()->erase("timeout");
  updated.mutable_best()->set_id("c7");
  auto v = store().UpdateJob(updated, kNoFence);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 2);
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(updated, 2)));
}

TEST_P(StoreContractTest, UpdateUnknownJobIsNotFoundAndCreatesNothing) {
  const absl::Status st = store().UpdateJob(AtVersion(MakeContractJob("ghost"), 1), kNoFence).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(store().GetJob("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(JobIds({}), IsEmpty());
}

TEST_P(StoreContractTest, ListJobsIsNewestFirst) {
  for (const char* id : {"b", "c", "a", "e", "d"}) MustCreateJob(MakeContractJob(id));
  EXPECT_THAT(JobIds({}), ElementsAre("d", "e", "a", "c", "b"));
}

TEST_P(StoreContractTest, ListJobsOrderIsByCreationNotByUpdate) {
  for (const char* id : {"j1", "j2", "j3"}) MustCreateJob(MakeContractJob(id));
  EXPECT_EQ(MustUpdate("j1", [](v1::Job& j) { j.set_state(v1::JOB_STATE_RUNNING); }), 2);
  EXPECT_THAT(JobIds({}), ElementsAre("j3", "j2", "j1"));
}

TEST_P(StoreContractTest, ListJobsFiltersByTenant) {
  MustCreateJob(MakeContractJob("a1", "acme"));
  MustCreateJob(MakeContractJob("o1", "other"));
  MustCreateJob(MakeContractJob("a2", "acme"));
  JobQuery q;
  q.tenant = "acme";
  EXPECT_THAT(JobIds(q), ElementsAre("a2", "a1"));
  q.tenant = "other";
  EXPECT_THAT(JobIds(q), ElementsAre("o1"));
  q.tenant = "nobody";
  EXPECT_THAT(JobIds(q), IsEmpty());
}

TEST_P(StoreContractTest, ListJobsFiltersByProblemHash) {
  MustCreateJob(MakeContractJob("p1a", "acme", "hash-1"));
  MustCreateJob(MakeContractJob("p2", "acme", "hash-2"));
  MustCreateJob(MakeContractJob("p1b", "other", "hash-1"));
  JobQuery q;
  q.problem_hash = "hash-1";
  EXPECT_THAT(JobIds(q), ElementsAre("p1b", "p1a"));
  q.problem_hash = "hash-2";
  EXPECT_THAT(JobIds(q), ElementsAre("p2"));
  q.problem_hash = "hash-3";
  EXPECT_THAT(JobIds(q), IsEmpty());
}

// Jobs of one kernel on other devices and shapes: the seed's source and knob names make the key,
// not the sizes or the problem's hash.
TEST_P(StoreContractTest, ListJobsFiltersByKernelKey) {
  auto with_kernel = [](v1::Job j, const std::string& source, const std::string& knob, int64_t size) {
    v1::Problem* p = j.mutable_spec()->mutable_problem();
    p->mutable_seed()->set_source(source);
    p->mutable_seed()->add_params()->set_name(knob);
    (*p->add_size_sets()->mutable_sizes())["N"] = size;
    return j;
  };
  MustCreateJob(with_kernel(MakeContractJob("k1", "acme", "hash-1"), "kernel void f() {}", "TILE", 1024));
  MustCreateJob(with_kernel(MakeContractJob("k2", "acme", "hash-2"), "kernel void f() {}", "TILE", 4096));
  MustCreateJob(with_kernel(MakeContractJob("k3", "acme", "hash-3"), "kernel void g() {}", "TILE", 1024));
  MustCreateJob(with_kernel(MakeContractJob("k4", "acme", "hash-4"), "kernel void f() {}", "BLOCK", 1024));
  MustCreateJob(with_kernel(MakeContractJob("k5", "other", "hash-1"), "kernel void f() {}", "TILE", 1024));
  JobQuery q;
  q.tenant = "acme";
  q.kernel_key = HashKernel(with_kernel(MakeContractJob("x"), "kernel void f() {}", "TILE", 8).spec().problem());
  EXPECT_THAT(JobIds(q), ElementsAre("k2", "k1"));
  q.tenant = "";
  EXPECT_THAT(JobIds(q), ElementsAre("k5", "k2", "k1"));
  q.kernel_key = "no-such-kernel";
  EXPECT_THAT(JobIds(q), IsEmpty());
}

TEST_P(StoreContractTest, ListJobsFiltersByStateAndSeesUpdates) {
  MustCreateJob(MakeContractJob("q1", "acme", "h", v1::JOB_STATE_QUEUED));
  MustCreateJob(MakeContractJob("r1", "acme", "h", v1::JOB_STATE_RUNNING));
  MustCreateJob(MakeContractJob("q2", "acme", "h", v1::JOB_STATE_QUEUED));
  JobQuery q;
  q.state = v1::JOB_STATE_QUEUED;
  EXPECT_THAT(JobIds(q), ElementsAre("q2", "q1"));
  q.state = v1::JOB_STATE_RUNNING;
  EXPECT_THAT(JobIds(q), ElementsAre("r1"));

  // The state filter follows UpdateJob.
  EXPECT_EQ(MustUpdate("q1", [](v1::Job& j) { j.set_state(v1::JOB_STATE_RUNNING); }), 2);
  EXPECT_THAT(JobIds(q), ElementsAre("r1", "q1"));
  q.state = v1::JOB_STATE_QUEUED;
  EXPECT_THAT(JobIds(q), ElementsAre("q2"));
  q.state = v1::JOB_STATE_FAILED;
  EXPECT_THAT(JobIds(q), IsEmpty());
}

TEST_P(StoreContractTest, CountJobsCountsEveryTenantsStatesAndFollowsUpdates) {
  auto empty = store().CountJobs();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(*empty, IsEmpty());
  MustCreateJob(MakeContractJob("q1", "acme", "h", v1::JOB_STATE_QUEUED));
  MustCreateJob(MakeContractJob("q2", "globex", "h", v1::JOB_STATE_QUEUED));
  MustCreateJob(MakeContractJob("r1", "acme", "h", v1::JOB_STATE_RUNNING));
  auto counts = store().CountJobs();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts, (JobCounts{{{"acme", v1::JOB_STATE_QUEUED}, 1},
                                {{"globex", v1::JOB_STATE_QUEUED}, 1},
                                {{"acme", v1::JOB_STATE_RUNNING}, 1}}));
  MustUpdate("q1", [](v1::Job& j) { j.set_state(v1::JOB_STATE_COMPLETED); });
  counts = store().CountJobs();
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(*counts, (JobCounts{{{"globex", v1::JOB_STATE_QUEUED}, 1},
                                {{"acme", v1::JOB_STATE_RUNNING}, 1},
                                {{"acme", v1::JOB_STATE_COMPLETED}, 1}}));
}

TEST_P(StoreContractTest, ListJobsCombinesFilters) {
  MustCreateJob(MakeContractJob("1", "acme", "h1", v1::JOB_STATE_RUNNING));
  MustCreateJob(MakeContractJob("2", "acme", "h2", v1::JOB_STATE_RUNNING));
  MustCreateJob(MakeContractJob("3", "other", "h1", v1::JOB_STATE_RUNNING));
  MustCreateJob(MakeContractJob("4", "acme", "h1", v1::JOB_STATE_QUEUED));
  MustCreateJob(MakeContractJob("5", "acme", "h1", v1::JOB_STATE_RUNNING));
  JobQuery q;
  q.tenant = "acme";
  q.problem_hash = "h1";
  q.state = v1::JOB_STATE_RUNNING;
  EXPECT_THAT(JobIds(q), ElementsAre("5", "1"));
}

TEST_P(StoreContractTest, ListJobsLimitKeepsTheNewest) {
  for (int i = 0; i < 6; ++i) MustCreateJob(MakeContractJob(absl::StrCat("j", i), i % 2 == 0 ? "even" : "odd"));
  JobQuery q;
  q.limit = 2;
  EXPECT_THAT(JobIds(q), ElementsAre("j5", "j4"));
  q.limit = 1;
  EXPECT_THAT(JobIds(q), ElementsAre("j5"));
  q.limit = 100;
  EXPECT_EQ(JobIds(q).size(), 6u);
  // The limit applies after filtering.
  q.tenant = "even";
  q.limit = 2;
  EXPECT_THAT(JobIds(q), ElementsAre("j4", "j2"));
}

// -- job versions --

TEST_P(StoreContractTest, CreateJobReturnsTheStoredJobAtVersionOne) {
  v1::Job job = MakeContractJob("j1");
  job.set_version(7);  // ignored: the store numbers versions
  auto created = store().CreateJob(job);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_THAT(*created, EqualsProto(AtVersion(job, 1)));
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->version(), 1);
  auto listed = store().ListJobs({});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].version(), 1);
}

TEST_P(StoreContractTest, EveryUpdateBumpsTheVersionByOne) {
  MustCreateJob(MakeContractJob("j1"));
  auto read = store().GetJob("j1");
  ASSERT_TRUE(read.ok()) << read.status();
  v1::Job job = *read;
  job.set_state(v1::JOB_STATE_RUNNING);
  auto v2 = store().UpdateJob(job, kNoFence);
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(*v2, 2);
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(job, 2)));
  auto listed = store().ListJobs({});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].version(), 2);

  // The job as read back names the version the next update must carry.
  got->set_state(v1::JOB_STATE_COMPLETED);
  auto v3 = store().UpdateJob(*got, kNoFence);
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(*v3, 3);
  auto again = store().GetJob("j1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->version(), 3);
  EXPECT_EQ(again->state(), v1::JOB_STATE_COMPLETED);
}

TEST_P(StoreContractTest, UpdateNamingAStaleVersionIsAbortedAndChangesNothing) {
  MustCreateJob(MakeContractJob("j1"));
  auto read = store().GetJob("j1");
  ASSERT_TRUE(read.ok()) << read.status();
  v1::Job first = *read;
  first.set_state(v1::JOB_STATE_RUNNING);
  ASSERT_EQ(store().UpdateJob(first, kNoFence).value_or(-1), 2);

  // A second writer that read version 1 too.
  v1::Job late = *read;
  late.set_state(v1::JOB_STATE_FAILED);
  late.set_state_reason("late writer");
  auto st = store().UpdateJob(late, kNoFence);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kAborted) << st.status();
  // A version from the future is no better.
  v1::Job ahead = AtVersion(first, 5);
  ahead.set_state(v1::JOB_STATE_CANCELLED);
  st = store().UpdateJob(ahead, kNoFence);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kAborted) << st.status();

  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(first, 2)));
  JobQuery q;
  q.state = v1::JOB_STATE_FAILED;
  EXPECT_THAT(JobIds(q), IsEmpty());
}

TEST_P(StoreContractTest, UpdateNamingNoVersionIsAbortedLikeAnyStaleOne) {
  MustCreateJob(MakeContractJob("j1"));
  v1::Job blind = MakeContractJob("j1");  // version 0: a blind replace
  blind.set_state(v1::JOB_STATE_CANCELLED);
  auto st = store().UpdateJob(blind, kNoFence);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kAborted) << st.status();
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(AtVersion(MakeContractJob("j1"), 1)));
}

// -- idempotent submits --

TEST_P(StoreContractTest, ARetriedCreateWithTheSameKeyReturnsTheFirstJob) {
  const v1::Job first = MakeKeyedJob("j1", "acme", "submit-42");
  auto a = store().CreateJob(first);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, EqualsProto(AtVersion(first, 1)));
  v1::Job retry = MakeKeyedJob("j2", "acme", "submit-42");
  retry.mutable_spec()->set_display_name("the retry");
  auto b = store().CreateJob(retry);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, EqualsProto(AtVersion(first, 1)));
  EXPECT_EQ(store().GetJob("j2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(JobIds({}), ElementsAre("j1"));
}

TEST_P(StoreContractTest, ARetriedCreateReturnsTheFirstJobAsStoredNow) {
  MustCreateJob(MakeKeyedJob("j1", "acme", "submit-42"));
  ASSERT_EQ(MustUpdate("j1", [](v1::Job& j) { j.set_state(v1::JOB_STATE_RUNNING); }), 2);
  auto b = store().CreateJob(MakeKeyedJob("j2", "acme", "submit-42"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id(), "j1");
  EXPECT_EQ(b->version(), 2);
  EXPECT_EQ(b->state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(JobIds({}), ElementsAre("j1"));
}

TEST_P(StoreContractTest, IdempotencyKeysArePerTenant) {
  auto a = store().CreateJob(MakeKeyedJob("a1", "acme", "submit-42"));
  auto b = store().CreateJob(MakeKeyedJob("o1", "other", "submit-42"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->id(), "a1");
  EXPECT_EQ(b->id(), "o1");
  EXPECT_THAT(JobIds({}), ElementsAre("o1", "a1"));
  // Each tenant's key still dedupes within the tenant.
  auto again = store().CreateJob(MakeKeyedJob("o2", "other", "submit-42"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), "o1");
  EXPECT_THAT(JobIds({}), ElementsAre("o1", "a1"));
}

TEST_P(StoreContractTest, AnEmptyIdempotencyKeyNeverDedupes) {
  for (const char* id : {"j1", "j2", "j3"}) {
    auto r = store().CreateJob(MakeKeyedJob(id, "acme", ""));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->id(), id);
  }
  EXPECT_THAT(JobIds({}), ElementsAre("j3", "j2", "j1"));
}

// -- paging --

TEST_P(StoreContractTest, ListJobsPagesWithAfterJobIdCoveringEveryJobOnce) {
  // Ids out of alphabetical order: pages follow creation, not ids.
  for (const char* id : {"m", "c", "x", "a", "q"}) MustCreateJob(MakeContractJob(id));
  JobQuery q;
  q.limit = 2;
  std::vector<std::vector<std::string>> pages;
  for (int i = 0; i < 6; ++i) {
    pages.push_back(JobIds(q));
    if (pages.back().empty()) break;
    q.after_job_id = pages.back().back();
  }
  EXPECT_THAT(pages, ElementsAre(ElementsAre("q", "a"), ElementsAre("x", "c"), ElementsAre("m"), IsEmpty()));
}

TEST_P(StoreContractTest, ListJobsPagingCombinesWithFilters) {
  MustCreateJob(MakeContractJob("a1", "acme"));
  MustCreateJob(MakeContractJob("o1", "other"));
  MustCreateJob(MakeContractJob("a2", "acme"));
  MustCreateJob(MakeContractJob("o2", "other"));
  MustCreateJob(MakeContractJob("a3", "acme"));
  JobQuery q;
  q.tenant = "acme";
  q.after_job_id = "a3";
  EXPECT_THAT(JobIds(q), ElementsAre("a2", "a1"));
  // The cursor may name a job the filter leaves out: it still marks a point in creation order.
  q.after_job_id = "o2";
  EXPECT_THAT(JobIds(q), ElementsAre("a2", "a1"));
  q.after_job_id = "o1";
  EXPECT_THAT(JobIds(q), ElementsAre("a1"));
  q.after_job_id = "a2";
  q.limit = 1;
  EXPECT_THAT(JobIds(q), ElementsAre("a1"));
}

TEST_P(StoreContractTest, ListJobsAfterAnUnknownJobIsAnEmptyList) {
  for (const char* id : {"j1", "j2", "j3"}) MustCreateJob(MakeContractJob(id));
  JobQuery q;
  q.after_job_id = "ghost";
  EXPECT_THAT(JobIds(q), IsEmpty());
}

// -- leases --

TEST_P(StoreContractTest, ClaimingAFreshJobGivesAPositiveTokenAndReclaimingKeepsIt) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease a = MustClaim("j1", "coord-a", 60);
  EXPECT_EQ(a.owner, "coord-a");
  EXPECT_GT(a.token, 0);
  const JobLease again = MustClaim("j1", "coord-a", 60);
  EXPECT_EQ(again.owner, "coord-a");
  EXPECT_EQ(again.token, a.token);
}

TEST_P(StoreContractTest, AnotherOwnerCannotClaimALiveLease) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease a = MustClaim("j1", "coord-a", 60);
  auto b = store().ClaimJob("j1", "coord-b", 60);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  // The refused claim took nothing from the holder.
  EXPECT_TRUE(store().RenewJobLease("j1", a, 60).ok());
  EXPECT_EQ(MustClaim("j1", "coord-a", 60).token, a.token);
  EXPECT_EQ(store().ClaimJob("j1", "coord-b", 60).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(StoreContractTest, AnExpiredLeaseIsTakenOverWithALargerToken) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease a = MustClaim("j1", "coord-a", 0.3);
  ASSERT_GT(a.token, 0);
  SleepSeconds(0.5);
  const JobLease b = MustClaim("j1", "coord-b", 60);
  EXPECT_EQ(b.owner, "coord-b");
  EXPECT_GT(b.token, a.token);
  // The old owner has lost it: it can neither renew, reclaim nor release.
  absl::Status st = store().RenewJobLease("j1", a, 60);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_EQ(store().ClaimJob("j1", "coord-a", 60).status().code(), absl::StatusCode::kFailedPrecondition);
  st = store().ReleaseJob("j1", a);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  // ... and none of that disturbed the new owner.
  EXPECT_TRUE(store().RenewJobLease("j1", b, 60).ok());
  EXPECT_EQ(MustClaim("j1", "coord-b", 60).token, b.token);
}

TEST_P(StoreContractTest, RenewingKeepsALeaseAlivePastItsFirstExpiry) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease a = MustClaim("j1", "coord-a", 0.3);
  const absl::Status st = store().RenewJobLease("j1", a, 60);
  ASSERT_TRUE(st.ok()) << st;
  SleepSeconds(0.5);
  EXPECT_EQ(store().ClaimJob("j1", "coord-b", 60).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MustClaim("j1", "coord-a", 60).token, a.token);
}

TEST_P(StoreContractTest, ReleaseLetsAnotherOwnerClaimAtOnceWithALargerToken) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease a = MustClaim("j1", "coord-a", 60);
  const absl::Status st = store().ReleaseJob("j1", a);
  ASSERT_TRUE(st.ok()) << st;
  const JobLease b = MustClaim("j1", "coord-b", 60);
  EXPECT_EQ(b.owner, "coord-b");
  EXPECT_GT(b.token, a.token);
  EXPECT_EQ(store().RenewJobLease("j1", a, 60).code(), absl::StatusCode::kFailedPrecondition);
  // And back: every change of owner grows the token.
  ASSERT_TRUE(store().ReleaseJob("j1", b).ok());
  const JobLease a2 = MustClaim("j1", "coord-a", 60);
  EXPECT_GT(a2.token, b.token);
}

TEST_P(StoreContractTest, LeasesArePerJob) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  const JobLease a = MustClaim("j1", "coord-a", 60);
  const JobLease b = MustClaim("j2", "coord-b", 60);
  EXPECT_GT(a.token, 0);
  EXPECT_GT(b.token, 0);
  EXPECT_EQ(store().ClaimJob("j2", "coord-a", 60).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store().ClaimJob("j1", "coord-b", 60).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(StoreContractTest, LeasesOfUnknownJobAreNotFound) {
  EXPECT_EQ(store().ClaimJob("ghost", "coord-a", 60).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().RenewJobLease("ghost", JobLease{"coord-a", 1}, 60).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ReleaseJob("ghost", JobLease{"coord-a", 1}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().GetJob("ghost").status().code(), absl::StatusCode::kNotFound);
}

// -- fencing --

TEST_P(StoreContractTest, WritesCarryingTheCurrentTokenSucceed) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease a = MustClaim("j1", "coord-a", 60);
  ASSERT_GT(a.token, 0);
  EXPECT_EQ(MustUpdate("j1", [](v1::Job& j) { j.set_state(v1::JOB_STATE_RUNNING); }, a.token), 2);
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0), a.token);
  auto put = store().PutEvaluations("j1", {MakeContractResult("j1", "c0", 1.5)}, a.token);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_THAT(*put, ElementsAre(PutOutcome::kStored));
  EXPECT_EQ(store().AppendEvent(MakeContractEvent("j1", "started"), a.token).value_or(-1), 1);
  EXPECT_EQ(store().AppendModelCall(MakeContractModelCall("j1", 0), a.token).value_or(-1), 1);
}

TEST_P(StoreContractTest, AfterATakeoverTheOldTokensWritesAreRefusedAndStoreNothing) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const JobLease old_lease = MustClaim("j1", "coord-a", 0.3);
  ASSERT_GT(old_lease.token, 0);
  SleepSeconds(0.5);
  const JobLease new_lease = MustClaim("j1", "coord-b", 60);
  ASSERT_GT(new_lease.token, old_lease.token);
  const int64_t stale = old_lease.token;

  // UpdateJob, at the right version: only the fence is wrong.
  auto job = store().GetJob("j1");
  ASSERT_TRUE(job.ok()) << job.status();
  v1::Job edited = *job;
  edited.set_state(v1::JOB_STATE_FAILED);
  edited.set_state_reason("stale coordinator");
  auto upd = store().UpdateJob(edited, stale);
  EXPECT_EQ(upd.status().code(), absl::StatusCode::kFailedPrecondition) << upd.status();
  auto ins = store().InsertCandidate(MakeContractCandidate("j1", "c1", "h1", 1), stale);
  EXPECT_EQ(ins.status().code(), absl::StatusCode::kFailedPrecondition) << ins.status();
  auto puts = store().PutEvaluations("j1", {MakeContractResult("j1", "c0", 1.5)}, stale);
  EXPECT_EQ(puts.status().code(), absl::StatusCode::kFailedPrecondition) << puts.status();
  auto put = store().PutEvaluation(MakeContractResult("j1", "c0", 1.5), stale);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kFailedPrecondition) << put.status();
  auto ev = store().AppendEvent(MakeContractEvent("j1", "from the past"), stale);
  EXPECT_EQ(ev.status().code(), absl::StatusCode::kFailedPrecondition) << ev.status();
  auto mc = store().AppendModelCall(MakeContractModelCall("j1", 0), stale);
  EXPECT_EQ(mc.status().code(), absl::StatusCode::kFailedPrecondition) << mc.status();

  // Nothing of it was stored.
  auto now = store().GetJob("j1");
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_THAT(*now, EqualsProto(*job));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0"));
  EXPECT_THAT(EvaluatedIds("j1"), IsEmpty());
  EXPECT_THAT(EventSeqs("j1"), IsEmpty());
  EXPECT_THAT(ModelCallSeqs("j1"), IsEmpty());

  // The new owner's token writes, and so does an unfenced writer (a user's cancel, admin tools).
  edited.set_state(v1::JOB_STATE_RUNNING);
  edited.set_state_reason("");
  auto v = store().UpdateJob(edited, new_lease.token);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 2);
  MustInsert(MakeContractCandidate("j1", "c1", "h1", 1), new_lease.token);
  auto p1 = store().PutEvaluations("j1", {MakeContractResult("j1", "c0", 1.5)}, new_lease.token);
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_THAT(*p1, ElementsAre(PutOutcome::kStored));
  EXPECT_EQ(store().AppendEvent(MakeContractEvent("j1", "taken over"), new_lease.token).value_or(-1), 1);
  EXPECT_EQ(store().AppendModelCall(MakeContractModelCall("j1", 1), new_lease.token).value_or(-1), 1);

  EXPECT_EQ(MustUpdate("j1", [](v1::Job& j) { j.set_state(v1::JOB_STATE_CANCELLED); }, kNoFence), 3);
  MustInsert(MakeContractCandidate("j1", "c2", "h2", 2), kNoFence);
  auto p2 = store().PutEvaluations("j1", {MakeContractResult("j1", "c1", 2.5)}, kNoFence);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_THAT(*p2, ElementsAre(PutOutcome::kStored));
  EXPECT_EQ(store().AppendEvent(MakeContractEvent("j1", "cancelled"), kNoFence).value_or(-1), 2);
  EXPECT_EQ(store().AppendModelCall(MakeContractModelCall("j1", 2), kNoFence).value_or(-1), 2);

  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1", "c2"));
  EXPECT_THAT(EvaluatedIds("j1"), ElementsAre("c0", "c1"));
  EXPECT_THAT(EventSeqs("j1"), ElementsAre(1, 2));
  EXPECT_THAT(ModelCallSeqs("j1"), ElementsAre(1, 2));
  auto final_job = store().GetJob("j1");
  ASSERT_TRUE(final_job.ok()) << final_job.status();
  EXPECT_EQ(final_job->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(final_job->version(), 3);
}

// -- candidates --

TEST_P(StoreContractTest, InsertCandidateRoundTrips) {
  MustCreateJob(MakeContractJob("j1"));
  const v1::Candidate c = MakeContractCandidate("j1", "c0", "h0", 0);
  MustInsert(c);
  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_THAT((*got)[0], EqualsProto(c));
}

TEST_P(StoreContractTest, InsertCandidateDedupesByContentHash) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "same-hash", 0));
  auto again = store().InsertCandidate(MakeContractCandidate("j1", "c1", "same-hash", 1), kNoFence);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_THAT((*got)[0], EqualsProto(MakeContractCandidate("j1", "c0", "same-hash", 0)));
  // Nothing of the refused candidate was stored: its id is still free.
  MustInsert(MakeContractCandidate("j1", "c1", "other-hash", 1));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1"));
}

TEST_P(StoreContractTest, InsertCandidateDedupesById) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  auto again = store().InsertCandidate(MakeContractCandidate("j1", "c0", "h-new", 1), kNoFence);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);
  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].content_hash(), "h0");
  // Nothing of the refused candidate was stored: its hash is still free.
  MustInsert(MakeContractCandidate("j1", "c1", "h-new", 1));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1"));
}

TEST_P(StoreContractTest, ReinsertingTheSameCandidateIsIdempotent) {
  MustCreateJob(MakeContractJob("j1"));
  const v1::Candidate c = MakeContractCandidate("j1", "c0", "h0", 0);
  MustInsert(c);
  for (int i = 0; i < 3; ++i) {
    auto again = store().InsertCandidate(c, kNoFence);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_FALSE(*again);
  }
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0"));
}

TEST_P(StoreContractTest, CandidateDedupeIsPerJob) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  // The same hash in another job is a different candidate.
  MustInsert(MakeContractCandidate("j2", "d0", "h0", 0));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0"));
  EXPECT_THAT(CandidateIds("j2"), ElementsAre("d0"));
}

TEST_P(StoreContractTest, ListCandidatesIsInSequenceOrderWhateverTheInsertOrder) {
  MustCreateJob(MakeContractJob("j1"));
  for (int64_t seq : {3, 0, 5, 1, 4, 2}) {
    MustInsert(MakeContractCandidate("j1", absl::StrCat("c", seq), absl::StrCat("h", seq), seq));
  }
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1", "c2", "c3", "c4", "c5"));
  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_THAT((*got)[i], EqualsProto(MakeContractCandidate("j1", absl::StrCat("c", i), absl::StrCat("h", i),
                                                             static_cast<int64_t>(i))));
  }
}

TEST_P(StoreContractTest, ListCandidatesOfAJobWithNoneIsEmpty) {
  MustCreateJob(MakeContractJob("j1"));
  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, IsEmpty());
}

TEST_P(StoreContractTest, CandidatesOfUnknownJobAreNotFound) {
  MustCreateJob(MakeContractJob("j1"));
  EXPECT_EQ(store().InsertCandidate(MakeContractCandidate("ghost", "c0", "h0", 0), kNoFence).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ListCandidates("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(CandidateIds("j1"), IsEmpty());
}

// -- candidate batches --

TEST_P(StoreContractTest, InsertCandidatesReportsAnOutcomePerCandidate) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const std::vector<v1::Candidate> batch = {
      MakeContractCandidate("j1", "c1", "h1", 1),      // new
      MakeContractCandidate("j1", "c2", "h0", 2),      // c0's content hash, stored before
      MakeContractCandidate("j1", "c3", "h3", 3),      // new
      MakeContractCandidate("j1", "c4", "h3", 4),      // c3's content hash, earlier in this batch
      MakeContractCandidate("j1", "c3", "h5", 5),      // c3's id, earlier in this batch
      MakeContractCandidate("j1", "c0", "h6", 6),      // c0's id, stored before
      MakeContractCandidate("j1", "c7", "h7", 7),      // new, after the refusals
      MakeContractCandidate("j1", "c10", "h0", 10),    // c0's content hash: refused
      MakeContractCandidate("j1", "c10", "h10", 11),   // the same id, a new hash: stored
  };
  auto out = store().InsertCandidates("j1", batch, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ElementsAre(true, false, true, false, false, false, true, false, true));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1", "c3", "c7", "c10"));
  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 5u);
  EXPECT_EQ((*got)[4].content_hash(), "h10");
  EXPECT_THAT((*got)[2], EqualsProto(batch[2]));  // the first of the two c3s
  // The refused hashes are still free.
  MustInsert(MakeContractCandidate("j1", "c8", "h5", 8));
  MustInsert(MakeContractCandidate("j1", "c9", "h6", 9));
}

TEST_P(StoreContractTest, InsertCandidatesOfAnEmptyBatchIsOkAndOfAnUnknownJobNotFound) {
  MustCreateJob(MakeContractJob("j1"));
  auto out = store().InsertCandidates("j1", {}, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, IsEmpty());
  EXPECT_EQ(store().InsertCandidates("ghost", {}, kNoFence).status().code(), absl::StatusCode::kNotFound);
  const std::vector<v1::Candidate> ghost = {MakeContractCandidate("ghost", "c0", "h0", 0)};
  EXPECT_EQ(store().InsertCandidates("ghost", ghost, kNoFence).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreContractTest, InsertCandidatesNamingAnotherJobStoresNothing) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  const std::vector<v1::Candidate> batch = {MakeContractCandidate("j1", "c0", "h0", 0),
                                            MakeContractCandidate("j2", "c1", "h1", 1)};
  auto out = store().InsertCandidates("j1", batch, kNoFence);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("c1"));
  EXPECT_THAT(CandidateIds("j1"), IsEmpty());
  EXPECT_THAT(CandidateIds("j2"), IsEmpty());
}

TEST_P(StoreContractTest, InsertCandidatesWithAStaleFenceStoresNoneOfTheBatch) {
  MustCreateJob(MakeContractJob("j1"));
  const JobLease old_lease = MustClaim("j1", "coord-a", 0.2);
  SleepSeconds(0.5);
  const JobLease new_lease = MustClaim("j1", "coord-b", 60);
  const std::vector<v1::Candidate> batch = {MakeContractCandidate("j1", "c0", "h0", 0),
                                            MakeContractCandidate("j1", "c1", "h1", 1)};
  auto stale = store().InsertCandidates("j1", batch, old_lease.token);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  // An empty batch is refused too, as are the evaluations'.
  EXPECT_EQ(store().InsertCandidates("j1", {}, old_lease.token).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store().PutEvaluations("j1", {}, old_lease.token).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(CandidateIds("j1"), IsEmpty());
  auto fresh = store().InsertCandidates("j1", batch, new_lease.token);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_THAT(*fresh, ElementsAre(true, true));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1"));
}

// -- evaluations --

TEST_P(StoreContractTest, PutEvaluationRoundTrips) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const v1::EvaluationResult r = MakeContractResult("j1", "c0", 1.5);
  auto put = store().PutEvaluation(r, kNoFence);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(*put);
  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_THAT((*got)[0], EqualsProto(r));
}

TEST_P(StoreContractTest, PutEvaluationIsIdempotentAndKeepsTheFirst) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const v1::EvaluationResult first = MakeContractResult("j1", "c0", 1.5);
  ASSERT_TRUE(store().PutEvaluation(first, kNoFence).value_or(false));
  // A redelivered (here: different) result for the same candidate changes nothing.
  v1::EvaluationResult second = MakeContractResult("j1", "c0", 9.0);
  second.set_outcome(v1::OUTCOME_TIMEOUT);
  second.set_worker_id("worker-2");
  auto put = store().PutEvaluation(second, kNoFence);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_FALSE(*put);
  put = store().PutEvaluation(first, kNoFence);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_FALSE(*put);
  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_THAT((*got)[0], EqualsProto(first));
}

TEST_P(StoreContractTest, PutEvaluationForUnknownCandidateIsNotFound) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  EXPECT_EQ(store().PutEvaluation(MakeContractResult("j1", "nope", 1.0), kNoFence).status().code(),
            absl::StatusCode::kNotFound);
  // c0 exists, but in j1, not in j2.
  EXPECT_EQ(store().PutEvaluation(MakeContractResult("j2", "c0", 1.0), kNoFence).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().PutEvaluation(MakeContractResult("ghost", "c0", 1.0), kNoFence).status().code(),
            absl::StatusCode::kNotFound);
  for (const char* job : {"j1", "j2"}) {
    auto got = store().ListEvaluations(job);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(*got, IsEmpty()) << job;
  }
  // The failed puts did not use up c0's slot.
  EXPECT_TRUE(store().PutEvaluation(MakeContractResult("j1", "c0", 1.0), kNoFence).value_or(false));
}

TEST_P(StoreContractTest, ListEvaluationsOfUnknownJobIsNotFound) {
  EXPECT_EQ(store().ListEvaluations("ghost").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreContractTest, ListEvaluationsIsInCandidateSequenceOrder) {
  MustCreateJob(MakeContractJob("j1"));
  // Candidates inserted out of sequence order, evaluated in yet another order, one never.
  for (int64_t seq : {2, 0, 3, 1}) {
    MustInsert(MakeContractCandidate("j1", absl::StrCat("c", seq), absl::StrCat("h", seq), seq));
  }
  for (int64_t seq : {3, 1, 0}) {
    ASSERT_TRUE(store()
                    .PutEvaluation(MakeContractResult("j1", absl::StrCat("c", seq), 1.0 + static_cast<double>(seq)),
                                   kNoFence)
                    .value_or(false));
  }
  EXPECT_THAT(EvaluatedIds("j1"), ElementsAre("c0", "c1", "c3"));
}

TEST_P(StoreContractTest, EvaluationsArePerJob) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  MustInsert(MakeContractCandidate("j2", "c0", "h0", 0));  // same id, other job
  ASSERT_TRUE(store().PutEvaluation(MakeContractResult("j1", "c0", 1.0), kNoFence).value_or(false));
  // j2's c0 is a different candidate: its evaluation is not a duplicate.
  ASSERT_TRUE(store().PutEvaluation(MakeContractResult("j2", "c0", 2.0), kNoFence).value_or(false));
  auto e1 = store().ListEvaluations("j1");
  auto e2 = store().ListEvaluations("j2");
  ASSERT_TRUE(e1.ok() && e2.ok());
  ASSERT_EQ(e1->size(), 1u);
  ASSERT_EQ(e2->size(), 1u);
  EXPECT_DOUBLE_EQ((*e1)[0].speedup(), 1.0);
  EXPECT_DOUBLE_EQ((*e2)[0].speedup(), 2.0);
}

TEST_P(StoreContractTest, FindEvaluationsFindsTheSameCandidateInTheTenantsEarlierJobsOnTheProblem) {
  MustCreateJob(MakeContractJob("old"));
  MustCreateJob(MakeContractJob("older-unevaluated"));
  MustCreateJob(MakeContractJob("newer"));
  MustCreateJob(MakeContractJob("other-tenant", "globex"));
  MustCreateJob(MakeContractJob("other-problem", "acme", "problem-2"));
  MustCreateJob(MakeContractJob("asking"));
  for (const char* job : {"old", "older-unevaluated", "newer", "other-tenant", "other-problem", "asking"}) {
    MustInsert(MakeContractCandidate(job, absl::StrCat(job, "-c"), "h-same", 0));
    MustInsert(MakeContractCandidate(job, absl::StrCat(job, "-d"), "h-other", 1));
  }
  for (const char* job : {"old", "newer", "other-tenant", "other-problem", "asking"}) {
    ASSERT_TRUE(store().PutEvaluation(MakeContractResult(job, absl::StrCat(job, "-c"), 2.0), kNoFence).value_or(false));
    ASSERT_TRUE(store().PutEvaluation(MakeContractResult(job, absl::StrCat(job, "-d"), 3.0), kNoFence).value_or(false));
  }
  EvaluationQuery q{.tenant = "acme", .problem_hash = "problem-1", .content_hash = "h-same",
                    .exclude_job_id = "asking"};
  auto found = store().FindEvaluations(q);
  ASSERT_TRUE(found.ok()) << found.status();
  // The newest job first; neither the asking job, another tenant's nor another problem's.
  std::vector<std::string> ids;
  for (const auto& e : *found) ids.push_back(e.candidate_id());
  EXPECT_THAT(ids, ElementsAre("newer-c", "old-c"));
  EXPECT_THAT((*found)[0], EqualsProto(MakeContractResult("newer", "newer-c", 2.0)));
  q.limit = 1;
  found = store().FindEvaluations(q);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].candidate_id(), "newer-c");
  q.content_hash = "h-nobody";
  found = store().FindEvaluations(q);
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->empty());
}

// -- evaluation batches --

TEST_P(StoreContractTest, PutEvaluationsReportsAnOutcomePerResult) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  for (int64_t seq : {0, 1, 2}) {
    MustInsert(MakeContractCandidate("j1", absl::StrCat("c", seq), absl::StrCat("h", seq), seq));
  }
  MustInsert(MakeContractCandidate("j2", "c2", "h2", 0));  // c2 in both jobs
  const v1::EvaluationResult stored_before = MakeContractResult("j1", "c0", 1.0);
  ASSERT_TRUE(store().PutEvaluation(stored_before, kNoFence).value_or(false));

  const v1::EvaluationResult fresh = MakeContractResult("j1", "c1", 2.0);
  const std::vector<v1::EvaluationResult> batch = {
      fresh,                                  // new
      MakeContractResult("j1", "c0", 9.0),    // c0 already has one
      MakeContractResult("j1", "nope", 3.0),  // no such candidate
      MakeContractResult("j2", "c2", 4.0),    // names another job (whose c2 exists, as does j1's)
  };
  auto out = store().PutEvaluations("j1", batch, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ElementsAre(PutOutcome::kStored, PutOutcome::kDuplicate, PutOutcome::kUnknownCandidate,
                                PutOutcome::kUnknownCandidate));

  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_THAT((*got)[0], EqualsProto(stored_before));
  EXPECT_THAT((*got)[1], EqualsProto(fresh));
  // The result that named j2 was stored in neither job.
  EXPECT_THAT(EvaluatedIds("j2"), IsEmpty());
  EXPECT_TRUE(store().PutEvaluation(MakeContractResult("j1", "c2", 5.0), kNoFence).value_or(false));
  EXPECT_TRUE(store().PutEvaluation(MakeContractResult("j2", "c2", 6.0), kNoFence).value_or(false));
}

TEST_P(StoreContractTest, PutEvaluationsOfOneCandidateTwiceInABatchStoresTheFirst) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const v1::EvaluationResult first = MakeContractResult("j1", "c0", 1.0);
  v1::EvaluationResult second = MakeContractResult("j1", "c0", 7.0);
  second.set_worker_id("worker-2");
  auto out = store().PutEvaluations("j1", {first, second}, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, ElementsAre(PutOutcome::kStored, PutOutcome::kDuplicate));
  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_THAT((*got)[0], EqualsProto(first));
}

TEST_P(StoreContractTest, PutEvaluationsOfAnEmptyBatchIsOk) {
  MustCreateJob(MakeContractJob("j1"));
  auto out = store().PutEvaluations("j1", {}, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, IsEmpty());
  EXPECT_THAT(EvaluatedIds("j1"), IsEmpty());
}

// -- a step's evaluations and candidates together --

TEST_P(StoreContractTest, PutEvaluationsAndCandidatesReportsAnOutcomePerResultAndCandidate) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  for (int64_t seq : {0, 1}) {
    MustInsert(MakeContractCandidate("j1", absl::StrCat("c", seq), absl::StrCat("h", seq), seq));
  }
  MustInsert(MakeContractCandidate("j2", "c1", "h1", 0));
  const v1::EvaluationResult stored_before = MakeContractResult("j1", "c0", 1.0);
  ASSERT_TRUE(store().PutEvaluation(stored_before, kNoFence).value_or(false));
  const v1::EvaluationResult fresh = MakeContractResult("j1", "c1", 2.0);
  const std::vector<v1::EvaluationResult> results = {
      MakeContractResult("j1", "c0", 9.0),  // c0 already has one
      fresh,                                // new
      MakeContractResult("j1", "c1", 7.0),  // c1's again, after the first
      MakeContractResult("j1", "c2", 3.0),  // a candidate of this call: not stored before it
      MakeContractResult("j2", "c1", 4.0),  // names another job
  };
  const std::vector<v1::Candidate> candidates = {
      MakeContractCandidate("j1", "c2", "h2", 2),  // new
      MakeContractCandidate("j1", "c3", "h1", 3),  // c1's content hash, stored before
      MakeContractCandidate("j1", "c2", "h4", 4),  // c2's id, earlier in this call
      MakeContractCandidate("j1", "c5", "h5", 5),  // new
  };
  auto out = store().PutEvaluationsAndCandidates("j1", results, candidates, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->evaluations,
              ElementsAre(PutOutcome::kDuplicate, PutOutcome::kStored, PutOutcome::kDuplicate,
                          PutOutcome::kUnknownCandidate, PutOutcome::kUnknownCandidate));
  EXPECT_THAT(out->candidates, ElementsAre(true, false, false, true));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1", "c2", "c5"));
  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_THAT((*got)[0], EqualsProto(stored_before));
  EXPECT_THAT((*got)[1], EqualsProto(fresh));
  EXPECT_THAT(EvaluatedIds("j2"), IsEmpty());  // the result that named j2 went nowhere
  EXPECT_THAT(EvaluatedIds("j1"), ElementsAre("c0", "c1"));
  // Either part may be empty.
  auto only_results = store().PutEvaluationsAndCandidates(
      "j1", {MakeContractResult("j1", "c2", 5.0)}, {}, kNoFence);
  ASSERT_TRUE(only_results.ok()) << only_results.status();
  EXPECT_THAT(only_results->evaluations, ElementsAre(PutOutcome::kStored));
  EXPECT_THAT(only_results->candidates, IsEmpty());
  const std::vector<v1::Candidate> more = {MakeContractCandidate("j1", "c6", "h6", 6)};
  auto only_candidates = store().PutEvaluationsAndCandidates("j1", {}, more, kNoFence);
  ASSERT_TRUE(only_candidates.ok()) << only_candidates.status();
  EXPECT_THAT(only_candidates->evaluations, IsEmpty());
  EXPECT_THAT(only_candidates->candidates, ElementsAre(true));
  // A result for a candidate the job does not have, beside one it has.
  const std::vector<v1::Candidate> later = {MakeContractCandidate("j1", "c7", "h7", 7)};
  auto unknown = store().PutEvaluationsAndCandidates(
      "j1", {MakeContractResult("j1", "nope", 1.0), MakeContractResult("j1", "c5", 2.0)}, later,
      kNoFence);
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_THAT(unknown->evaluations,
              ElementsAre(PutOutcome::kUnknownCandidate, PutOutcome::kStored));
  EXPECT_THAT(unknown->candidates, ElementsAre(true));
  EXPECT_THAT(EvaluatedIds("j1"), ElementsAre("c0", "c1", "c2", "c5"));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1", "c2", "c5", "c6", "c7"));
}

// Text and bytes that SQL, or an array literal, would have to escape come back as they were.
TEST_P(StoreContractTest, PutEvaluationsAndCandidatesKeepsAwkwardTextAndBytes) {
  MustCreateJob(MakeContractJob("j1"));
  const std::string odd = "a\"b\\c'd,e{f}g h\tNULL \xc3\xa4~z";  // (text columns hold no NUL)
  MustInsert(MakeContractCandidate("j1", odd, "h" + odd, 0));
  v1::EvaluationResult result = MakeContractResult("j1", odd, 1e308);
  result.set_message(std::string("with a \0 inside", 15));
  v1::Candidate next = MakeContractCandidate("j1", odd + "2", "h2" + odd, 1);
  next.set_source(std::string("\0\x01\"\\\\x'{},}\n", 12));
  auto out = store().PutEvaluationsAndCandidates("j1", {result}, {next}, kNoFence);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(out->evaluations, ElementsAre(PutOutcome::kStored));
  EXPECT_THAT(out->candidates, ElementsAre(true));
  auto evaluations = store().ListEvaluations("j1");
  ASSERT_TRUE(evaluations.ok()) << evaluations.status();
  ASSERT_EQ(evaluations->size(), 1u);
  EXPECT_THAT((*evaluations)[0], EqualsProto(result));
  auto candidates = store().ListCandidates("j1");
  ASSERT_TRUE(candidates.ok()) << candidates.status();
  ASSERT_EQ(candidates->size(), 2u);
  EXPECT_THAT((*candidates)[1], EqualsProto(next));
  // Its id and content hash as columns: a second write of them is a duplicate.
  auto again = store().PutEvaluationsAndCandidates(
      "j1", {MakeContractResult("j1", odd + "2", 2.0)},
      {MakeContractCandidate("j1", "c9", "h2" + odd, 2)}, kNoFence);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(again->evaluations, ElementsAre(PutOutcome::kStored));
  EXPECT_THAT(again->candidates, ElementsAre(false));
}

TEST_P(StoreContractTest, PutEvaluationsAndCandidatesRefusedStoresNeither) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const std::vector<v1::EvaluationResult> results = {MakeContractResult("j1", "c0", 1.0)};
  const std::vector<v1::Candidate> candidates = {MakeContractCandidate("j1", "c1", "h1", 1)};
  // A candidate that names another job.
  const std::vector<v1::Candidate> foreign = {MakeContractCandidate("j2", "c2", "h2", 2)};
  auto wrong = store().PutEvaluationsAndCandidates("j1", results, foreign, kNoFence);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
  // An unknown job.
  auto ghost = store().PutEvaluationsAndCandidates(
      "ghost", {MakeContractResult("ghost", "c0", 1.0)},
      {MakeContractCandidate("ghost", "c1", "h1", 1)}, kNoFence);
  EXPECT_EQ(ghost.status().code(), absl::StatusCode::kNotFound) << ghost.status();
  // A stale fence, with or without rows.
  const JobLease old_lease = MustClaim("j1", "coord-a", 0.2);
  SleepSeconds(0.5);
  const JobLease new_lease = MustClaim("j1", "coord-b", 60);
  auto stale = store().PutEvaluationsAndCandidates("j1", results, candidates, old_lease.token);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  EXPECT_EQ(store().PutEvaluationsAndCandidates("j1", {}, {}, old_lease.token).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0"));
  EXPECT_THAT(EvaluatedIds("j1"), IsEmpty());
  auto fresh = store().PutEvaluationsAndCandidates("j1", results, candidates, new_lease.token);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_THAT(fresh->evaluations, ElementsAre(PutOutcome::kStored));
  EXPECT_THAT(fresh->candidates, ElementsAre(true));
  EXPECT_THAT(CandidateIds("j1"), ElementsAre("c0", "c1"));
  EXPECT_THAT(EvaluatedIds("j1"), ElementsAre("c0"));
}

TEST_P(StoreContractTest, PutEvaluationsForUnknownJobIsNotFound) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  auto out = store().PutEvaluations("ghost", {MakeContractResult("ghost", "c0", 1.0)}, kNoFence);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound) << out.status();
  EXPECT_THAT(EvaluatedIds("j1"), IsEmpty());
}

// -- events --

TEST_P(StoreContractTest, EventSequencesStartAtOneAndArePerJob) {
  MustCreateJob(MakeContractJob("a"));
  MustCreateJob(MakeContractJob("b"));
  std::vector<int64_t> a_seqs, b_seqs;
  for (int i = 0; i < 3; ++i) {
    v1::JobEvent e = MakeContractEvent("a", absl::StrCat("a", i));
    e.set_sequence(77);  // ignored: the store assigns
    auto sa = store().AppendEvent(e, kNoFence);
    ASSERT_TRUE(sa.ok()) << sa.status();
    a_seqs.push_back(*sa);
    if (i < 2) {
      auto sb = store().AppendEvent(MakeContractEvent("b", absl::StrCat("b", i)), kNoFence);
      ASSERT_TRUE(sb.ok()) << sb.status();
      b_seqs.push_back(*sb);
    }
  }
  EXPECT_THAT(a_seqs, ElementsAre(1, 2, 3));
  EXPECT_THAT(b_seqs, ElementsAre(1, 2));

  auto a = store().ListEvents("a", 1, 1000);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    v1::JobEvent want = MakeContractEvent("a", absl::StrCat("a", i));
    want.set_sequence(i + 1);
    EXPECT_THAT((*a)[i], EqualsProto(want));
  }
  auto b = store().ListEvents("b", 0, 1000);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[0].message(), "b0");
  EXPECT_EQ((*b)[1].sequence(), 2);
}

TEST_P(StoreContractTest, ListEventsHonoursFromAndLimit) {
  MustCreateJob(MakeContractJob("j1"));
  for (int i = 1; i <= 5; ++i) {
    ASSERT_TRUE(store().AppendEvent(MakeContractEvent("j1", absl::StrCat("m", i)), kNoFence).ok());
  }
  auto seqs = [&](int64_t from, int limit) {
    auto ev = store().ListEvents("j1", from, limit);
    EXPECT_TRUE(ev.ok()) << ev.status();
    std::vector<int64_t> out;
    if (ev.ok()) {
      for (const auto& e : *ev) out.push_back(e.sequence());
    }
    return out;
  };
  EXPECT_THAT(seqs(1, 1000), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(seqs(0, 1000), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(seqs(3, 1000), ElementsAre(3, 4, 5));
  EXPECT_THAT(seqs(2, 2), ElementsAre(2, 3));
  EXPECT_THAT(seqs(5, 10), ElementsAre(5));
  EXPECT_THAT(seqs(6, 10), IsEmpty());
  EXPECT_THAT(seqs(1, 1), ElementsAre(1));
  EXPECT_THAT(seqs(4, 1000), ElementsAre(4, 5));
}

TEST_P(StoreContractTest, EventsOfUnknownJobAreNotFound) {
  EXPECT_EQ(store().AppendEvent(MakeContractEvent("ghost", "x"), kNoFence).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ListEvents("ghost", 1, 1000).status().code(), absl::StatusCode::kNotFound);
  // A later job of that name starts at 1.
  MustCreateJob(MakeContractJob("ghost"));
  auto s = store().AppendEvent(MakeContractEvent("ghost", "x"), kNoFence);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, 1);
}

// -- model calls --

TEST_P(StoreContractTest, ModelCallSequencesStartAtOnePerJobAndRoundTrip) {
  MustCreateJob(MakeContractJob("a"));
  MustCreateJob(MakeContractJob("b"));
  std::vector<int64_t> a_seqs, b_seqs;
  for (int64_t p = 0; p < 3; ++p) {
    v1::ModelCall call = MakeContractModelCall("a", p);
    call.set_sequence(99);  // ignored: the store assigns
    auto sa = store().AppendModelCall(call, kNoFence);
    ASSERT_TRUE(sa.ok()) << sa.status();
    a_seqs.push_back(*sa);
    if (p < 2) {
      auto sb = store().AppendModelCall(MakeContractModelCall("b", 10 + p), kNoFence);
      ASSERT_TRUE(sb.ok()) << sb.status();
      b_seqs.push_back(*sb);
    }
  }
  EXPECT_THAT(a_seqs, ElementsAre(1, 2, 3));
  EXPECT_THAT(b_seqs, ElementsAre(1, 2));

  auto a = store().ListModelCalls("a", 1, 1000);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 3u);
  for (int64_t p = 0; p < 3; ++p) {
    v1::ModelCall want = MakeContractModelCall("a", p);
    want.set_sequence(p + 1);
    EXPECT_THAT((*a)[static_cast<size_t>(p)], EqualsProto(want));
  }
  auto b = store().ListModelCalls("b", 0, 1000);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 2u);
  for (int64_t p = 0; p < 2; ++p) {
    v1::ModelCall want = MakeContractModelCall("b", 10 + p);
    want.set_sequence(p + 1);
    EXPECT_THAT((*b)[static_cast<size_t>(p)], EqualsProto(want));
  }
  // Model calls and events are numbered apart.
  EXPECT_EQ(store().AppendEvent(MakeContractEvent("a", "e"), kNoFence).value_or(-1), 1);
}

TEST_P(StoreContractTest, ListModelCallsHonoursFromAndLimit) {
  MustCreateJob(MakeContractJob("j1"));
  for (int64_t p = 0; p < 5; ++p) ASSERT_TRUE(store().AppendModelCall(MakeContractModelCall("j1", p), kNoFence).ok());
  EXPECT_THAT(ModelCallSeqs("j1", 1, 1000), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(ModelCallSeqs("j1", 0, 1000), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(ModelCallSeqs("j1", 3, 1000), ElementsAre(3, 4, 5));
  EXPECT_THAT(ModelCallSeqs("j1", 2, 2), ElementsAre(2, 3));
  EXPECT_THAT(ModelCallSeqs("j1", 5, 10), ElementsAre(5));
  EXPECT_THAT(ModelCallSeqs("j1", 6, 10), IsEmpty());
  EXPECT_THAT(ModelCallSeqs("j1", 1, 1), ElementsAre(1));
}

TEST_P(StoreContractTest, ModelCallsOfUnknownJobAreNotFound) {
  EXPECT_EQ(store().AppendModelCall(MakeContractModelCall("ghost", 0), kNoFence).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ListModelCalls("ghost", 1, 1000).status().code(), absl::StatusCode::kNotFound);
  MustCreateJob(MakeContractJob("ghost"));
  EXPECT_EQ(store().AppendModelCall(MakeContractModelCall("ghost", 0), kNoFence).value_or(-1), 1);
}

// -- tenants --

TEST_P(StoreContractTest, TenantsRoundTripAndListByName) {
  for (const char* name : {"zeta", "alpha", "mid-1"}) MustCreateTenant(name);
  for (const char* name : {"zeta", "alpha", "mid-1"}) {
    auto got = store().GetTenant(name);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_THAT(*got, EqualsProto(MakeContractTenant(name)));
  }
  auto all = store().ListTenants();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_THAT((*all)[0], EqualsProto(MakeContractTenant("alpha")));
  EXPECT_THAT((*all)[1], EqualsProto(MakeContractTenant("mid-1")));
  EXPECT_THAT((*all)[2], EqualsProto(MakeContractTenant("zeta")));
}

TEST_P(StoreContractTest, CreateTenantWithATakenNameIsAlreadyExistsAndKeepsTheFirst) {
  MustCreateTenant("acme");
  v1::Tenant again = MakeContractTenant("acme");
  again.set_display_name("Impostor");
  const absl::Status st = store().CreateTenant(again);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  auto got = store().GetTenant("acme");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(MakeContractTenant("acme")));
  auto all = store().ListTenants();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 1u);
}

TEST_P(StoreContractTest, UpdateTenantReplacesDisplayNameQuotaAndHistoryPooling) {
  MustCreateTenant("acme");
  MustCreateTenant("other");
  v1::Tenant changed = MakeContractTenant("acme");
  changed.set_display_name("ACME Corp");
  changed.mutable_quota()->set_max_running_jobs(10);
  changed.mutable_quota()->set_max_evaluations_per_hour(0);  // back to the cluster's default
  changed.mutable_quota()->set_max_in_flight(128);
  changed.set_share_history(true);
  const absl::Status st = store().UpdateTenant(changed);
  ASSERT_TRUE(st.ok()) << st;
  auto got = store().GetTenant("acme");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->display_name(), "ACME Corp");
  EXPECT_TRUE(got->share_history());
  EXPECT_EQ(got->quota().max_running_jobs(), 10);
  EXPECT_EQ(got->quota().max_evaluations_per_hour(), 0);
  EXPECT_EQ(got->quota().max_in_flight(), 128);
  EXPECT_THAT(got->created_at(), EqualsProto(MakeContractTenant("acme").created_at()));
  // Only that tenant changed.
  auto other = store().GetTenant("other");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_THAT(*other, EqualsProto(MakeContractTenant("other")));
}

TEST_P(StoreContractTest, UpdateTenantKeepsItsCreationTime) {
  MustCreateTenant("acme");
  v1::Tenant changed = MakeContractTenant("acme");
  changed.set_display_name("ACME Corp");
  changed.mutable_created_at()->set_seconds(1800000000);
  ASSERT_TRUE(store().UpdateTenant(changed).ok());
  auto got = store().GetTenant("acme");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->display_name(), "ACME Corp");
  EXPECT_EQ(got->created_at().seconds(), 1690000000);
}

TEST_P(StoreContractTest, UnknownTenantIsNotFoundForGetAndUpdate) {
  MustCreateTenant("acme");
  EXPECT_EQ(store().GetTenant("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().GetTenant("").status().code(), absl::StatusCode::kNotFound);
  const absl::Status st = store().UpdateTenant(MakeContractTenant("ghost"));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  // The refused update created nothing.
  EXPECT_EQ(store().GetTenant("ghost").status().code(), absl::StatusCode::kNotFound);
  auto all = store().ListTenants();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].name(), "acme");
}

// -- API keys --

TEST_P(StoreContractTest, AnApiKeyIsFoundByTheHashOfItsToken) {
  MustCreateTenant("acme");
  std::string t1, t2;
  const v1::ApiKey k1 = MustCreateKey("acme", "ci", &t1);
  const v1::ApiKey k2 = MustCreateKey("acme", "worker", &t2, /*service=*/true);
  ASSERT_FALSE(t1.empty());
  ASSERT_FALSE(t2.empty());
  auto f1 = store().FindApiKey(ApiKeyHash(t1));
  ASSERT_TRUE(f1.ok()) << f1.status();
  EXPECT_THAT(*f1, EqualsProto(k1));
  auto f2 = store().FindApiKey(ApiKeyHash(t2));
  ASSERT_TRUE(f2.ok()) << f2.status();
  EXPECT_THAT(*f2, EqualsProto(k2));
  EXPECT_TRUE(f2->service());
}

TEST_P(StoreContractTest, TheStoredApiKeyNeverHoldsTheToken) {
  MustCreateTenant("acme");
  std::string token;
  MustCreateKey("acme", "ci", &token);
  ASSERT_FALSE(token.empty());
  const std::string secret = token.substr(token.rfind('_') + 1);
  ASSERT_EQ(secret.size(), 64u);
  std::vector<v1::ApiKey> seen;
  auto found = store().FindApiKey(ApiKeyHash(token));
  ASSERT_TRUE(found.ok()) << found.status();
  seen.push_back(*found);
  auto listed = store().ListApiKeys("acme");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  seen.push_back((*listed)[0]);
  for (const v1::ApiKey& k : seen) {
    EXPECT_EQ(k.secret_sha256(), ApiKeyHash(token));
    const std::string bytes = k.SerializeAsString();
    EXPECT_EQ(bytes.find(secret), std::string::npos) << "the secret is in the stored record";
    EXPECT_EQ(bytes.find(token), std::string::npos) << "the token is in the stored record";
  }
}

TEST_P(StoreContractTest, FindApiKeyOfAWrongTokenIsNotFound) {
  MustCreateTenant("acme");
  std::string token;
  MustCreateKey("acme", "ci", &token);
  ASSERT_FALSE(token.empty());
  EXPECT_EQ(store().FindApiKey(ApiKeyHash(token + "x")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().FindApiKey(token).status().code(), absl::StatusCode::kNotFound);  // the token is no hash
  EXPECT_EQ(store().FindApiKey("").status().code(), absl::StatusCode::kNotFound);
  auto unstored = MintApiKey("acme", "never stored", false);
  ASSERT_TRUE(unstored.ok()) << unstored.status();
  EXPECT_EQ(store().FindApiKey(ApiKeyHash(unstored->token)).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreContractTest, ARevokedApiKeyIsNotFoundButStillListed) {
  MustCreateTenant("acme");
  std::string t1, t2;
  v1::ApiKey k1 = MustCreateKey("acme", "ci", &t1);
  v1::ApiKey k2 = MustCreateKey("acme", "laptop", &t2);
  absl::Status st = store().RevokeApiKey(k1.id());
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(store().FindApiKey(ApiKeyHash(t1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store().FindApiKey(ApiKeyHash(t2)).ok());  // only that key
  // Revoking twice is fine and changes nothing more.
  st = store().RevokeApiKey(k1.id());
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(store().FindApiKey(ApiKeyHash(t1)).status().code(), absl::StatusCode::kNotFound);

  k1.set_revoked(true);
  std::vector<v1::ApiKey> want = {k1, k2};
  std::sort(want.begin(), want.end(), [](const v1::ApiKey& a, const v1::ApiKey& b) { return a.id() < b.id(); });
  auto listed = store().ListApiKeys("acme");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_THAT((*listed)[0], EqualsProto(want[0]));
  EXPECT_THAT((*listed)[1], EqualsProto(want[1]));
}

TEST_P(StoreContractTest, RevokingAnUnknownApiKeyIsNotFound) {
  MustCreateTenant("acme");
  std::string token;
  MustCreateKey("acme", "ci", &token);
  const absl::Status st = store().RevokeApiKey("kf_000000000000");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_TRUE(store().FindApiKey(ApiKeyHash(token)).ok());
}

TEST_P(StoreContractTest, AnApiKeyForAnUnknownTenantIsNotFoundAndNotStored) {
  MustCreateTenant("acme");
  auto minted = MintApiKey("ghost", "ci", false);
  ASSERT_TRUE(minted.ok()) << minted.status();
  const absl::Status st = store().CreateApiKey(minted->record);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_EQ(store().FindApiKey(ApiKeyHash(minted->token)).status().code(), absl::StatusCode::kNotFound);
  auto listed = store().ListApiKeys("acme");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(*listed, IsEmpty());
}

TEST_P(StoreContractTest, AnApiKeyWithATakenIdOrHashIsAlreadyExists) {
  MustCreateTenant("acme");
  std::string token;
  const v1::ApiKey first = MustCreateKey("acme", "ci", &token);

  auto other = MintApiKey("acme", "copycat", false);
  ASSERT_TRUE(other.ok()) << other.status();
  v1::ApiKey same_id = other->record;
  same_id.set_id(first.id());
  absl::Status st = store().CreateApiKey(same_id);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  EXPECT_EQ(store().FindApiKey(ApiKeyHash(other->token)).status().code(), absl::StatusCode::kNotFound);

  v1::ApiKey same_hash = other->record;
  same_hash.set_secret_sha256(first.secret_sha256());
  st = store().CreateApiKey(same_hash);
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;

  auto found = store().FindApiKey(ApiKeyHash(token));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_THAT(*found, EqualsProto(first));
  auto listed = store().ListApiKeys("acme");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 1u);
}

TEST_P(StoreContractTest, ListApiKeysIsPerTenantAndById) {
  MustCreateTenant("acme");
  MustCreateTenant("other");
  std::vector<std::string> acme_ids;
  for (int i = 0; i < 4; ++i) acme_ids.push_back(MustCreateKey("acme", absl::StrCat("k", i), nullptr).id());
  const v1::ApiKey theirs = MustCreateKey("other", "theirs", nullptr);
  std::sort(acme_ids.begin(), acme_ids.end());
  auto listed = store().ListApiKeys("acme");
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<std::string> ids;
  for (const auto& k : *listed) ids.push_back(k.id());
  EXPECT_EQ(ids, acme_ids);
  auto other = store().ListApiKeys("other");
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_EQ(other->size(), 1u);
  EXPECT_THAT((*other)[0], EqualsProto(theirs));
}

// -- concurrency --

TEST_P(StoreContractTest, ConcurrentInsertsLoseNothingAndNeverDuplicate) {
  constexpr int kThreads = 6;
  constexpr int kOwn = 40;     // distinct candidates per thread
  constexpr int kShared = 25;  // candidates every thread races to insert
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  std::atomic<int> shared_wins{0}, errors{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    // Each thread's work: its own candidates and the shared ones, in a thread-specific order.
    std::vector<v1::Candidate> work;
    for (int own = 0; own < kOwn; ++own) {
      work.push_back(MakeContractCandidate("j1", absl::StrCat("t", t, "-", own), absl::StrCat("own-h", t, "-", own),
                                           t * 100 + own));
    }
    for (int s = 0; s < kShared; ++s) {
      // Same hash for everyone, different ids: exactly one thread may win each.
      work.push_back(MakeContractCandidate("j1", absl::StrCat("shared", s, "-t", t), absl::StrCat("shared-h", s),
                                           1000 + s));
    }
    std::mt19937 rng(static_cast<unsigned>(t));
    std::shuffle(work.begin(), work.end(), rng);
    threads.emplace_back([&, t, work = std::move(work)] {
      while (!go.load()) std::this_thread::yield();
      int i = 0;
      for (const v1::Candidate& c : work) {
        auto r = store().InsertCandidate(c, kNoFence);
        if (!r.ok()) {
          ++errors;
        } else if (*r && c.id().starts_with("shared")) {
          ++shared_wins;
        }
        // Events on another job at the same time.
        if (!store().AppendEvent(MakeContractEvent("j2", absl::StrCat(t, ":", i++)), kNoFence).ok()) ++errors;
      }
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(shared_wins.load(), kShared);

  auto got = store().ListCandidates("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  std::set<std::string> ids, hashes;
  int shared = 0;
  for (const auto& c : *got) {
    ids.insert(c.id());
    hashes.insert(c.content_hash());
    if (c.id().starts_with("shared")) ++shared;
  }
  EXPECT_EQ(got->size(), static_cast<size_t>(kThreads * kOwn + kShared));
  EXPECT_EQ(ids.size(), got->size());
  EXPECT_EQ(hashes.size(), got->size());
  EXPECT_EQ(shared, kShared);
  for (int t = 0; t < kThreads; ++t) {
    for (int own = 0; own < kOwn; ++own) {
      EXPECT_TRUE(ids.contains(absl::StrCat("t", t, "-", own))) << "lost t" << t << "-" << own;
    }
  }
  EXPECT_TRUE(std::is_sorted(got->begin(), got->end(),
                             [](const auto& a, const auto& b) { return a.sequence() < b.sequence(); }));

  auto events = store().ListEvents("j2", 1, 100000);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), static_cast<size_t>(kThreads * (kOwn + kShared)));
  std::set<std::string> messages;
  for (size_t i = 0; i < events->size(); ++i) {
    EXPECT_EQ((*events)[i].sequence(), static_cast<int64_t>(i + 1));
    messages.insert((*events)[i].message());
  }
  EXPECT_EQ(messages.size(), events->size());
}

TEST_P(StoreContractTest, ConcurrentEvaluationsOfTheSameCandidateStoreOne) {
  constexpr int kThreads = 8;
  constexpr int kCandidates = 30;
  MustCreateJob(MakeContractJob("j1"));
  for (int i = 0; i < kCandidates; ++i) {
    MustInsert(MakeContractCandidate("j1", absl::StrCat("c", i), absl::StrCat("h", i), i));
  }
  std::atomic<int> wins{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCandidates; ++i) {
        auto r = store().PutEvaluation(MakeContractResult("j1", absl::StrCat("c", i), 1.0 + t), kNoFence);
        if (!r.ok()) {
          ++errors;
        } else if (*r) {
          ++wins;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wins.load(), kCandidates);
  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), static_cast<size_t>(kCandidates));
  for (int i = 0; i < kCandidates; ++i) EXPECT_EQ((*got)[i].candidate_id(), absl::StrCat("c", i));
}

TEST_P(StoreContractTest, ConcurrentClaimsOfOneJobHaveExactlyOneWinner) {
  constexpr int kThreads = 8;
  constexpr int kJobs = 5;
  for (int j = 0; j < kJobs; ++j) MustCreateJob(MakeContractJob(absl::StrCat("j", j)));
  for (int j = 0; j < kJobs; ++j) {
    const std::string job_id = absl::StrCat("j", j);
    std::atomic<bool> go{false};
    std::vector<absl::StatusOr<JobLease>> results(kThreads, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        results[t] = store().ClaimJob(job_id, absl::StrCat("coord-", t), 60);
      });
    }
    go = true;
    for (auto& th : threads) th.join();
    int winners = 0;
    std::string winner;
    for (int t = 0; t < kThreads; ++t) {
      if (results[t].ok()) {
        ++winners;
        winner = results[t]->owner;
        EXPECT_EQ(results[t]->owner, absl::StrCat("coord-", t));
        EXPECT_GT(results[t]->token, 0);
      } else {
        EXPECT_EQ(results[t].status().code(), absl::StatusCode::kFailedPrecondition)
            << job_id << " coord-" << t << ": " << results[t].status();
      }
    }
    EXPECT_EQ(winners, 1) << job_id;
    // The lease the store kept is the winner's.
    for (int t = 0; t < kThreads; ++t) {
      const std::string owner = absl::StrCat("coord-", t);
      EXPECT_EQ(store().ClaimJob(job_id, owner, 60).ok(), owner == winner) << job_id << " " << owner;
    }
  }
}

TEST_P(StoreContractTest, ConcurrentReadModifyWriteUpdatesLoseNoIncrement) {
  constexpr int kThreads = 6;
  constexpr int kIncrements = 10;
  MustCreateJob(MakeContractJob("j1"));
  std::mutex mu;
  std::vector<std::string> errors;  // anything but success or Aborted
  auto fail = [&](std::string what) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(std::move(what));
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        for (int attempt = 0;; ++attempt) {
          if (attempt > 10000) return fail("no progress after 10000 attempts");
          auto job = store().GetJob("j1");
          if (!job.ok()) return fail(absl::StrCat("GetJob: ", job.status().ToString()));
          job->mutable_progress()->set_evaluations(job->progress().evaluations() + 1);
          auto v = store().UpdateJob(*job, kNoFence);
          if (v.ok()) break;
          if (v.status().code() != absl::StatusCode::kAborted) {
            return fail(absl::StrCat("UpdateJob: ", v.status().ToString()));
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(errors, IsEmpty());
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->progress().evaluations(), kThreads * kIncrements);
  EXPECT_EQ(got->version(), 1 + kThreads * kIncrements);
}

TEST_P(StoreContractTest, ConcurrentRetriedCreatesWithOneKeyStoreOneJob) {
  constexpr int kThreads = 8;
  std::atomic<bool> go{false};
  std::vector<absl::StatusOr<v1::Job>> results(kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      results[t] = store().CreateJob(MakeKeyedJob(absl::StrCat("j", t), "acme", "submit-42"));
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  const std::vector<std::string> ids = JobIds({});
  ASSERT_EQ(ids.size(), 1u);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << "thread " << t << ": " << results[t].status();
    EXPECT_EQ(results[t]->id(), ids[0]) << "thread " << t;
    EXPECT_EQ(results[t]->version(), 1);
  }
}

}  // namespace kforge::testing
