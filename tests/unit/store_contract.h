#pragma once

// The Store contract: one suite of behaviours every Store backend must show, run against each
// backend (MemoryStore, SqliteStore, later PostgreSQL). A backend's test file defines a
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
// NotFound; job order is by creation (updates do not reorder); dedupe is per job.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/store/store.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/job.pb.h"

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

  void MustCreateJob(const v1::Job& job) { ASSERT_TRUE(store().CreateJob(job).ok()) << job.id(); }
  void MustInsert(const v1::Candidate& c) {
    auto r = store().InsertCandidate(c);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(*r) << "candidate " << c.id() << " was not inserted";
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

  std::unique_ptr<StoreFactory> factory_;
  std::unique_ptr<Store> store_;
};

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// -- jobs --

TEST_P(StoreContractTest, FreshStoreIsEmpty) {
  EXPECT_THAT(JobIds({}), IsEmpty());
  EXPECT_EQ(store().GetJob("j1").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreContractTest, CreateThenGetRoundTripsTheWholeJob) {
  const v1::Job job = MakeContractJob("j1");
  MustCreateJob(job);
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(job));
}

TEST_P(StoreContractTest, GetUnknownJobIsNotFound) {
  MustCreateJob(MakeContractJob("j1"));
  EXPECT_EQ(store().GetJob("j2").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().GetJob("").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(StoreContractTest, CreateWithTakenIdIsAlreadyExistsAndKeepsTheFirst) {
  const v1::Job first = MakeContractJob("j1", "acme");
  MustCreateJob(first);
  const absl::Status st = store().CreateJob(MakeContractJob("j1", "other-tenant"));
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(first));
  EXPECT_THAT(JobIds({}), ElementsAre("j1"));
}

TEST_P(StoreContractTest, UpdateReplacesTheStoredJob) {
  MustCreateJob(MakeContractJob("j1"));
  v1::Job updated = MakeContractJob("j1");
  updated.set_state(v1::JOB_STATE_COMPLETED);
  updated.set_state_reason("budget: max_candidates");
  updated.mutable_progress()->set_best_speedup(2.5);
  updated.mutable_progress()->mutable_outcome_counts()->erase("timeout");
  updated.mutable_best()->set_id("c7");
  ASSERT_TRUE(store().UpdateJob(updated).ok());
  auto got = store().GetJob("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, EqualsProto(updated));
}

TEST_P(StoreContractTest, UpdateUnknownJobIsNotFoundAndCreatesNothing) {
  const absl::Status st = store().UpdateJob(MakeContractJob("ghost"));
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
  v1::Job j1 = MakeContractJob("j1");
  j1.set_state(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store().UpdateJob(j1).ok());
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
  v1::Job q1 = MakeContractJob("q1", "acme", "h", v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store().UpdateJob(q1).ok());
  EXPECT_THAT(JobIds(q), ElementsAre("r1", "q1"));
  q.state = v1::JOB_STATE_QUEUED;
  EXPECT_THAT(JobIds(q), ElementsAre("q2"));
  q.state = v1::JOB_STATE_FAILED;
  EXPECT_THAT(JobIds(q), IsEmpty());
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
  auto again = store().InsertCandidate(MakeContractCandidate("j1", "c1", "same-hash", 1));
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
  auto again = store().InsertCandidate(MakeContractCandidate("j1", "c0", "h-new", 1));
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
    auto again = store().InsertCandidate(c);
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
  EXPECT_EQ(store().InsertCandidate(MakeContractCandidate("ghost", "c0", "h0", 0)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ListCandidates("ghost").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(CandidateIds("j1"), IsEmpty());
}

// -- evaluations --

TEST_P(StoreContractTest, PutEvaluationRoundTrips) {
  MustCreateJob(MakeContractJob("j1"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  const v1::EvaluationResult r = MakeContractResult("j1", "c0", 1.5);
  auto put = store().PutEvaluation(r);
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
  ASSERT_TRUE(store().PutEvaluation(first).value_or(false));
  // A redelivered (here: different) result for the same candidate changes nothing.
  v1::EvaluationResult second = MakeContractResult("j1", "c0", 9.0);
  second.set_outcome(v1::OUTCOME_TIMEOUT);
  second.set_worker_id("worker-2");
  auto put = store().PutEvaluation(second);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_FALSE(*put);
  put = store().PutEvaluation(first);
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
  EXPECT_EQ(store().PutEvaluation(MakeContractResult("j1", "nope", 1.0)).status().code(),
            absl::StatusCode::kNotFound);
  // c0 exists, but in j1, not in j2.
  EXPECT_EQ(store().PutEvaluation(MakeContractResult("j2", "c0", 1.0)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store().PutEvaluation(MakeContractResult("ghost", "c0", 1.0)).status().code(),
            absl::StatusCode::kNotFound);
  for (const char* job : {"j1", "j2"}) {
    auto got = store().ListEvaluations(job);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_THAT(*got, IsEmpty()) << job;
  }
  // The failed puts did not use up c0's slot.
  EXPECT_TRUE(store().PutEvaluation(MakeContractResult("j1", "c0", 1.0)).value_or(false));
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
    ASSERT_TRUE(store().PutEvaluation(MakeContractResult("j1", absl::StrCat("c", seq), 1.0 + seq)).value_or(false));
  }
  auto got = store().ListEvaluations("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<std::string> ids;
  for (const auto& r : *got) ids.push_back(r.candidate_id());
  EXPECT_THAT(ids, ElementsAre("c0", "c1", "c3"));
}

TEST_P(StoreContractTest, EvaluationsArePerJob) {
  MustCreateJob(MakeContractJob("j1"));
  MustCreateJob(MakeContractJob("j2"));
  MustInsert(MakeContractCandidate("j1", "c0", "h0", 0));
  MustInsert(MakeContractCandidate("j2", "c0", "h0", 0));  // same id, other job
  ASSERT_TRUE(store().PutEvaluation(MakeContractResult("j1", "c0", 1.0)).value_or(false));
  // j2's c0 is a different candidate: its evaluation is not a duplicate.
  ASSERT_TRUE(store().PutEvaluation(MakeContractResult("j2", "c0", 2.0)).value_or(false));
  auto e1 = store().ListEvaluations("j1");
  auto e2 = store().ListEvaluations("j2");
  ASSERT_TRUE(e1.ok() && e2.ok());
  ASSERT_EQ(e1->size(), 1u);
  ASSERT_EQ(e2->size(), 1u);
  EXPECT_DOUBLE_EQ((*e1)[0].speedup(), 1.0);
  EXPECT_DOUBLE_EQ((*e2)[0].speedup(), 2.0);
}

// -- events --

TEST_P(StoreContractTest, EventSequencesStartAtOneAndArePerJob) {
  MustCreateJob(MakeContractJob("a"));
  MustCreateJob(MakeContractJob("b"));
  std::vector<int64_t> a_seqs, b_seqs;
  for (int i = 0; i < 3; ++i) {
    v1::JobEvent e = MakeContractEvent("a", absl::StrCat("a", i));
    e.set_sequence(77);  // ignored: the store assigns
    auto sa = store().AppendEvent(e);
    ASSERT_TRUE(sa.ok()) << sa.status();
    a_seqs.push_back(*sa);
    if (i < 2) {
      auto sb = store().AppendEvent(MakeContractEvent("b", absl::StrCat("b", i)));
      ASSERT_TRUE(sb.ok()) << sb.status();
      b_seqs.push_back(*sb);
    }
  }
  EXPECT_THAT(a_seqs, ElementsAre(1, 2, 3));
  EXPECT_THAT(b_seqs, ElementsAre(1, 2));

  auto a = store().ListEvents("a", 1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    v1::JobEvent want = MakeContractEvent("a", absl::StrCat("a", i));
    want.set_sequence(i + 1);
    EXPECT_THAT((*a)[i], EqualsProto(want));
  }
  auto b = store().ListEvents("b", 0);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[0].message(), "b0");
  EXPECT_EQ((*b)[1].sequence(), 2);
}

TEST_P(StoreContractTest, ListEventsHonoursFromAndLimit) {
  MustCreateJob(MakeContractJob("j1"));
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(store().AppendEvent(MakeContractEvent("j1", absl::StrCat("m", i))).ok());
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
  // Default limit.
  auto all = store().ListEvents("j1", 4);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
}

TEST_P(StoreContractTest, EventsOfUnknownJobAreNotFound) {
  EXPECT_EQ(store().AppendEvent(MakeContractEvent("ghost", "x")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().ListEvents("ghost", 1).status().code(), absl::StatusCode::kNotFound);
  // A later job of that name starts at 1.
  MustCreateJob(MakeContractJob("ghost"));
  auto s = store().AppendEvent(MakeContractEvent("ghost", "x"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, 1);
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
        auto r = store().InsertCandidate(c);
        if (!r.ok()) {
          ++errors;
        } else if (*r && c.id().starts_with("shared")) {
          ++shared_wins;
        }
        // Events on another job at the same time.
        if (!store().AppendEvent(MakeContractEvent("j2", absl::StrCat(t, ":", i++))).ok()) ++errors;
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
        auto r = store().PutEvaluation(MakeContractResult("j1", absl::StrCat("c", i), 1.0 + t));
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

}  // namespace kforge::testing
