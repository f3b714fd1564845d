// The finalists' re-measurement as logic without I/O: what a worker's side-by-side timing makes
// the job's confirmation, and when an earlier job's timing of the same finalists stands for ours.

#include "services/coordinator/finalists.h"

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
    v1::Candidate c;
    c.set_id(id);
    c.set_job_id("job");
    c.set_sequence(next_sequence_++);
    v1::EvaluationResult r;
    r.set_job_id("job");
    r.set_candidate_id(id);
    r.set_outcome(v1::OUTCOME_OK);
    r.set_speedup(speedup);
    r.set_reused_from_job(reused_from_job);
    r.set_reused_from_candidate(reused_from_candidate);
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

}  // namespace
}  // namespace kforge::coordinator
