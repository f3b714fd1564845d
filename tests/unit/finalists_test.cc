// The finalists' re-measurement as logic without I/O: what a worker's side-by-side timing makes
// the job's confirmation, and when an earlier job's timing of the same finalists stands for ours.

#include "services/coordinator/finalists.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge::coordinator {
namespace {

using ::testing::HasSubstr;

// An engine holding ok candidates with these speedups (the first is the seed).
class FinalistsTest : public ::testing::Test {
 protected:
  void Add(const std::string& id, double speedup, const std::string& reused_from_job = "",
           const std::string& reused_from_candidate = "") {
    v1::EvaluationResult r = OkResult(id);
    r.set_speedup(speedup);
    r.set_reused_from_job(reused_from_job);
    r.set_reused_from_candidate(reused_from_candidate);
    Ingest(id, r);
  }
  static v1::EvaluationResult OkResult(const std::string& id) {
    v1::EvaluationResult r;
    r.set_job_id("job");
    r.set_candidate_id(id);
    r.set_outcome(v1::OUTCOME_OK);
    return r;
  }
  // The next candidate of the job, evaluated so.
  void Ingest(const std::string& id, const v1::EvaluationResult& r) {
    v1::Candidate c;
    c.set_id(id);
    c.set_job_id("job");
    c.set_sequence(next_sequence_++);
    engine_.Ingest(c, r);
  }
  std::vector<const Member*> Members(const std::vector<std::string>& ids) const {
    std::vector<const Member*> out;
    for (const auto& id : ids) out.push_back(engine_.Find(id));
    return out;
  }
  static v1::FinalistTiming Timing(const std::string& id, double speedup,
                                   v1::Outcome outcome = v1::OUTCOME_OK) {
    v1::FinalistTiming t;
    t.set_candidate_id(id);
    t.set_outcome(outcome);
    t.set_speedup(speedup);
    return t;
  }
  // A worker's answer: the finalists fastest first.
  static v1::EvaluationResult ReMeasured(const std::vector<v1::FinalistTiming>& timings) {
    v1::EvaluationResult r;
    r.set_outcome(v1::OUTCOME_OK);
    r.set_worker_id("w7");
    for (const auto& t : timings) *r.mutable_confirmation()->add_finalists() = t;
    return r;
  }

  // One size set's timing: the candidate's median in [low, high] ms over `samples`, against a
  // reference of 10 ms in [ref_low, ref_high].
  static v1::SizeSetTiming SetTiming(const std::string& set, double low, double median, double high, int samples = 20,
                                     double ref_low = 9.9, double ref_high = 10.1) {
    v1::SizeSetTiming t;
    t.set_size_set(set);
    v1::TimingStats* c = t.mutable_candidate();
    c->set_median_seconds(median * 1e-3);
    c->set_median_low_seconds(low * 1e-3);
    c->set_median_high_seconds(high * 1e-3);
    c->set_p20_seconds(low * 1e-3);
    c->set_p80_seconds(high * 1e-3);
    c->set_min_seconds(low * 0.99e-3);
    c->set_samples(samples);
    v1::TimingStats* r = t.mutable_reference();
    r->set_median_seconds(10e-3);
    r->set_median_low_seconds(ref_low * 1e-3);
    r->set_median_high_seconds(ref_high * 1e-3);
    r->set_p20_seconds(ref_low * 1e-3);
    r->set_p80_seconds(ref_high * 1e-3);
    r->set_samples(20);
    t.set_speedup(10 / median);
    return t;
  }
  // An ok candidate benchmarked by `worker` on the device class "opencl:cpu".
  void AddTimed(const std::string& id, const std::vector<v1::SizeSetTiming>& timings, const std::string& worker = "w1") {
    v1::EvaluationResult r = OkResult(id);
    r.set_worker_id(worker);
    r.mutable_device()->set_device_class("opencl:cpu");
    double log_sum = 0;
    for (const auto& t : timings) {
      *r.add_timings() = t;
      log_sum += std::log(t.speedup());
    }
    r.set_speedup(std::exp(log_sum / static_cast<double>(timings.size())));
    Ingest(id, r);
  }

  EvolutionEngine engine_{7, EngineOptions{}};
  int64_t next_sequence_ = 0;
};

TEST_F(FinalistsTest, SameFinalistsIgnoresOrderAndNeedsEveryOne) {
  Add("a", 1.0);
  Add("b", 2.0);
  Add("c", 3.0);
  v1::Confirmation c;
  *c.add_finalists() = Timing("c", 3.1);
  *c.add_finalists() = Timing("b", 2.1);
  EXPECT_TRUE(SameFinalists(c, Members({"b", "c"})));
  EXPECT_FALSE(SameFinalists(c, Members({"a", "c"})));
  EXPECT_FALSE(SameFinalists(c, Members({"a", "b", "c"})));
  EXPECT_FALSE(SameFinalists(v1::Confirmation(), {}));
}

TEST_F(FinalistsTest, TheRequestIsNamedAfterTheJobTheCountAndWhen) {
  EXPECT_EQ(ConfirmationName("j1", 42, /*final=*/true), "j1-confirm000042e");
  EXPECT_EQ(ConfirmationName("j1", 42, /*final=*/false), "j1-confirm000042c");
}

TEST_F(FinalistsTest, ASideBySideTimingThatReRanksTheBestSaysSo) {
  Add("a", 1.0);
  Add("b", 5.0);  // the search's best
  Add("c", 4.0);
  auto out = ConfirmationFrom(ReMeasured({Timing("c", 4.4), Timing("b", 4.1)}), /*final=*/true, 30,
                              engine_);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->best, "c");
  const v1::Confirmation& c = out->confirmation;
  EXPECT_EQ(c.evaluations(), 30);
  EXPECT_EQ(c.worker_id(), "w7");
  EXPECT_DOUBLE_EQ(c.finalists(0).first_speedup(), 4.0);
  EXPECT_DOUBLE_EQ(c.finalists(1).first_speedup(), 5.0);
  EXPECT_THAT(c.note(), HasSubstr("re-ranked: c (4.4x, first measured 4x) is faster than b"));
}

TEST_F(FinalistsTest, ATimingThatKeepsTheBestAddsNoNote) {
  Add("a", 1.0);
  Add("b", 5.0);
  auto out = ConfirmationFrom(ReMeasured({Timing("b", 4.9), Timing("a", 1.0)}), /*final=*/false, 12,
                              engine_);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->best, "b");
  EXPECT_EQ(out->confirmation.note(), "");
}

TEST_F(FinalistsTest, AFirstFinalistThatFailedAgainIsNobodysWin) {
  Add("a", 1.0);
  Add("b", 5.0);
  auto out = ConfirmationFrom(ReMeasured({Timing("b", 0, v1::OUTCOME_WRONG_ANSWER)}),
                              /*final=*/true, 3, engine_);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->best, "");
}

TEST_F(FinalistsTest, AFailedReMeasurementEndsWithWhyAndAtACheckpointChangesNothing) {
  Add("a", 2.0);
  v1::EvaluationResult failed;
  failed.set_outcome(v1::OUTCOME_TIMEOUT);
  failed.set_message("the worker timed out");
  failed.set_worker_id("w2");
  EXPECT_FALSE(ConfirmationFrom(failed, /*final=*/false, 10, engine_).has_value());
  auto out = ConfirmationFrom(failed, /*final=*/true, 10, engine_);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->best, "");
  EXPECT_EQ(out->confirmation.note(), "the finalists were not re-measured: the worker timed out");
  EXPECT_EQ(out->confirmation.finalists_size(), 0);
  EXPECT_EQ(out->confirmation.evaluations(), 10);

  v1::EvaluationResult silent;  // ok, but no re-measurement in it (an older worker)
  silent.set_outcome(v1::OUTCOME_OK);
  out = ConfirmationFrom(silent, /*final=*/true, 10, engine_);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(out->confirmation.note(), HasSubstr("the worker does not re-measure finalists"));
}

// This job's x and y are the earlier job's e1 and e2, reused.
class BorrowedTest : public FinalistsTest {
 protected:
  void SetUp() override {
    Add("seed", 1.0);
    Add("x", 3.0, "earlier", "e1");
    Add("y", 2.0, "earlier", "e2");
    earlier_.set_id("earlier");
    v1::Confirmation* c = earlier_.mutable_confirmation();
    *c->add_finalists() = Timing("e2", 2.2);
    *c->add_finalists() = Timing("e1", 2.1);
    c->mutable_device()->set_device_class("h200");
    c->set_note("re-ranked: e2 is faster than e1");
    c->set_evaluations(500);
  }
  v1::Job earlier_;
};

TEST_F(BorrowedTest, TheEarlierJobsTimingIsRenamedToOurCandidates) {
  const auto finalists = Members({"x", "y"});
  EXPECT_EQ(ReusedFromOneJob(finalists), "earlier");
  auto out = BorrowedConfirmation(earlier_, finalists, "h200", 40, engine_);
  ASSERT_TRUE(out.has_value());
  const v1::Confirmation& c = out->confirmation;
  EXPECT_EQ(c.finalists(0).candidate_id(), "y");
  EXPECT_EQ(c.finalists(1).candidate_id(), "x");
  EXPECT_EQ(c.note(), "re-ranked: y is faster than x");
  EXPECT_EQ(c.reused_from_job(), "earlier");
  EXPECT_EQ(c.evaluations(), 40);
  EXPECT_EQ(out->best, "y");
}

TEST_F(BorrowedTest, ItStandsForOursOnlyWhenItTimedExactlyOursOnOurDevice) {
  EXPECT_FALSE(
      BorrowedConfirmation(earlier_, Members({"x", "y"}), "a100", 40, engine_).has_value());
  EXPECT_FALSE(BorrowedConfirmation(earlier_, Members({"x"}), "h200", 40, engine_).has_value());
  EXPECT_FALSE(
      BorrowedConfirmation(earlier_, Members({"x", "seed"}), "h200", 40, engine_).has_value());
  v1::Job other = earlier_;
  other.mutable_confirmation()->mutable_finalists(1)->set_candidate_id("e9");  // timed another
  EXPECT_FALSE(BorrowedConfirmation(other, Members({"x", "y"}), "h200", 40, engine_).has_value());
  other.clear_confirmation();
  EXPECT_FALSE(BorrowedConfirmation(other, Members({"x", "y"}), "h200", 40, engine_).has_value());
}

TEST_F(BorrowedTest, FinalistsFromSeveralJobsHaveNoOneEarlierJob) {
  EXPECT_EQ(ReusedFromOneJob(Members({"x", "seed"})), "");
  EXPECT_EQ(ReusedFromOneJob(Members({"seed"})), "");
  EXPECT_EQ(ReusedFromOneJob({}), "");
}

// Finalists whose own benchmarks (one worker, one timing of the reference) already rank the best
// beyond their intervals need no re-measurement: the confirmation says so, with rounds 0.
TEST_F(FinalistsTest, BenchmarksThatSeparateTheBestConfirmItWithoutAReMeasurement) {
  AddTimed("best", {SetTiming("default", 1.00, 1.01, 1.02)});
  AddTimed("next", {SetTiming("default", 1.10, 1.12, 1.15)});
  AddTimed("slow", {SetTiming("default", 4.0, 4.1, 4.3, /*samples=*/3)});  // raced: few samples
  std::optional<ConfirmationOutcome> c = BenchmarkConfirmation(Members({"best", "next", "slow"}), 40);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->best, "best");
  const v1::Confirmation& conf = c->confirmation;
  EXPECT_TRUE(conf.separated());
  EXPECT_EQ(conf.evaluations(), 40);
  EXPECT_EQ(conf.worker_id(), "w1");
  EXPECT_THAT(conf.note(), HasSubstr("not re-measured"));
  ASSERT_EQ(conf.finalists_size(), 3);
  const v1::FinalistTiming& first = conf.finalists(0);
  EXPECT_EQ(first.candidate_id(), "best");
  EXPECT_EQ(first.rounds(), 0);
  EXPECT_EQ(first.outcome(), v1::OUTCOME_OK);
  // The reported interval holds the reference's noise too: 9.9 / 1.02 to 10.1 / 1.00.
  EXPECT_NEAR(first.speedup_low(), 9.9 / 1.02, 1e-9);
  EXPECT_NEAR(first.speedup_high(), 10.1 / 1.00, 1e-9);
  EXPECT_NEAR(first.speedup(), 10 / 1.01, 1e-9);
  EXPECT_EQ(conf.finalists(1).candidate_id(), "next");
}

TEST_F(FinalistsTest, OverlappingBenchmarksLeaveItToTheReMeasurement) {
  AddTimed("best", {SetTiming("default", 1.00, 1.01, 1.06)});
  AddTimed("next", {SetTiming("default", 1.05, 1.07, 1.10)});
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "next"}), 40).has_value());
}

// Timed against different timings of the reference (another worker), the reference's own interval
// counts: a gap the candidates' intervals alone would call separated is not enough.
TEST_F(FinalistsTest, AnotherWorkersReferenceTimingWidensTheIntervals) {
  AddTimed("best", {SetTiming("default", 1.00, 1.01, 1.02, 20, 9.5, 10.5)});
  AddTimed("next", {SetTiming("default", 1.04, 1.05, 1.06, 20, 9.5, 10.5)}, "w2");
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "next"}), 40).has_value());
  AddTimed("far", {SetTiming("default", 1.40, 1.42, 1.45, 20, 9.5, 10.5)}, "w2");
  EXPECT_TRUE(BenchmarkConfirmation(Members({"best", "far"}), 40).has_value());
  // A gap that another worker's reference timing hides separates against the same worker's same
  // reference timing, once it is wider than the 5% allowed for drift.
  AddTimed("near", {SetTiming("default", 1.08, 1.09, 1.10, 20, 9.5, 10.5)}, "w2");
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "near"}), 40).has_value());
  AddTimed("near-here", {SetTiming("default", 1.08, 1.09, 1.10, 20, 9.5, 10.5)});
  EXPECT_TRUE(BenchmarkConfirmation(Members({"best", "near-here"}), 40).has_value());
  AddTimed("within-drift", {SetTiming("default", 1.04, 1.05, 1.06, 20, 9.5, 10.5)});
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "within-drift"}), 40).has_value());
}

// What still needs the side-by-side rounds: the best and those its benchmark does not already
// beat; a finalist's row as its benchmark timed it.
TEST_F(FinalistsTest, ContendersAreTheBestAndWhatItsBenchmarkDoesNotBeat) {
  AddTimed("best", {SetTiming("default", 1.00, 1.01, 1.04)});
  AddTimed("close", {SetTiming("default", 1.02, 1.03, 1.05)});
  AddTimed("far", {SetTiming("default", 2.0, 2.1, 2.2)});
  std::vector<const Member*> c = Contenders(Members({"best", "close", "far"}));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0]->candidate.id(), "best");
  EXPECT_EQ(c[1]->candidate.id(), "close");
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "close", "far"}), 9).has_value());
  // Without intervals nothing is settled.
  Add("plain", 0.5);
  EXPECT_EQ(Contenders(Members({"best", "far", "plain"})).size(), 3u);
  const v1::FinalistTiming row = BenchmarkedFinalist(*engine_.Find("far"));
  EXPECT_EQ(row.candidate_id(), "far");
  EXPECT_EQ(row.rounds(), 0);
  EXPECT_NEAR(row.speedup_low(), 9.9 / 2.2, 1e-9);
  EXPECT_NEAR(row.speedup_high(), 10.1 / 2.0, 1e-9);
}

TEST_F(FinalistsTest, WhatCannotSeparateDoesNot) {
  AddTimed("best", {SetTiming("default", 1.00, 1.01, 1.02), SetTiming("large", 2.0, 2.02, 2.04)});
  // Slower on one size set only.
  AddTimed("mixed", {SetTiming("default", 1.2, 1.21, 1.22), SetTiming("large", 2.0, 2.03, 2.05)});
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "mixed"}), 9).has_value());
  // Not timed on a size set the best was timed on.
  AddTimed("partial", {SetTiming("default", 1.5, 1.51, 1.52)});
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "partial"}), 9).has_value());
  // A result without intervals (an older worker).
  v1::SizeSetTiming old = SetTiming("default", 1.5, 1.51, 1.52);
  old.mutable_candidate()->clear_median_low_seconds();
  old.mutable_candidate()->clear_median_high_seconds();
  v1::SizeSetTiming old_large = SetTiming("large", 3.0, 3.01, 3.02);
  old_large.mutable_candidate()->clear_median_low_seconds();
  AddTimed("old", {old, old_large});
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "old"}), 9).has_value());
  // One finalist has nothing to be separated from.
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best"}), 9).has_value());
  // A best of a few samples: its range is no interval to stand on.
  AddTimed("few", {SetTiming("default", 0.5, 0.51, 0.52, 4), SetTiming("large", 1.0, 1.01, 1.02, 4)});
  AddTimed("far", {SetTiming("default", 3.0, 3.1, 3.2), SetTiming("large", 6.0, 6.1, 6.2)});
  EXPECT_FALSE(BenchmarkConfirmation(Members({"few", "far"}), 9).has_value());
  EXPECT_TRUE(BenchmarkConfirmation(Members({"best", "far"}), 9).has_value());
  // Reused from another job (its confirmation is borrowed instead), or another device.
  Add("reused", 0.5, "job-old", "c9");
  EXPECT_FALSE(BenchmarkConfirmation(Members({"best", "reused"}), 9).has_value());
}

}  // namespace
}  // namespace kforge::coordinator
