// The surrogate model and the child screener on synthetic spaces: fits that interpolate, grow
// uncertain away from the data and find the relevant knob; errors for malformed input; the
// screener's choice of the child the model favours, its refusal to use a model without data or
// across kernel variants, and its determinism.

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/coordinator/screener.h"
#include "services/coordinator/surrogate.h"

namespace kforge::coordinator {
namespace {

// Objective over two knobs of 8 positions: only knob 0 matters, best at position 5.
double Bowl(const std::vector<int>& p) { return std::abs(p[0] - 5) * 0.3; }

TEST(SurrogateTest, InterpolatesAndIsUncertainAwayFromData) {
  Surrogate s({8, 8});
  std::vector<std::vector<int>> x;
  std::vector<double> y;
  for (int a = 0; a < 8; a += 2) {
    for (int b = 0; b < 8; b += 3) {
      x.push_back({a, b});
      y.push_back(Bowl({a, b}));
    }
  }
  ASSERT_TRUE(s.Fit(x, y).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    const auto p = s.Predict(x[i]);
    EXPECT_NEAR(p.mean, y[i], 0.2) << "at point " << i;
  }
  // Odd positions of knob 0 were never observed: more uncertain than an observed point.
  EXPECT_GT(s.Predict({5, 1}).sd, s.Predict({4, 0}).sd);
  // The model ranks the true optimum's region above the far end.
  EXPECT_LT(s.Predict({5, 2}).mean, s.Predict({0, 2}).mean);
}

TEST(SurrogateTest, PrefersTheKnobThatExplainsTheData) {
  // Knob 0 decides everything, knob 1 is noise: predictions must follow knob 0 even for an
  // unseen value of knob 1.
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> pos(0, 7);
  Surrogate s({8, 8});
  std::vector<std::vector<int>> x;
  std::vector<double> y;
  for (int i = 0; i < 40; ++i) {
    std::vector<int> p = {pos(rng), pos(rng) % 7};  // knob 1 never takes position 7
    x.push_back(p);
    y.push_back(Bowl(p));
  }
  ASSERT_TRUE(s.Fit(x, y).ok());
  EXPECT_LT(s.Predict({5, 7}).mean, s.Predict({1, 7}).mean);
  EXPECT_LT(s.Predict({5, 7}).mean, s.Predict({0, 3}).mean);
}

TEST(SurrogateTest, RejectsMalformedInput) {
  Surrogate s({4, 4});
  EXPECT_FALSE(s.Fit({{0, 0}, {1, 1}}, {1.0}).ok());   // sizes differ
  EXPECT_FALSE(s.Fit({{0, 0}}, {1.0}).ok());           // one point
  EXPECT_FALSE(s.Fit({{0}, {1}}, {1.0, 2.0}).ok());    // too few knobs
  EXPECT_TRUE(s.Fit({{0, 0}, {1, 1}}, {1.0, 2.0}).ok());
}

TEST(SurrogateTest, KeepsTheBestPointsWhenCapped) {
  Surrogate s({16, 16}, {}, {.max_points = 20});
  std::vector<std::vector<int>> x;
  std::vector<double> y;
  for (int a = 0; a < 16; ++a) {
    for (int b = 0; b < 4; ++b) {
      x.push_back({a, b});
      y.push_back(a == 9 && b == 2 ? -5.0 : 1.0 + 0.01 * a);
    }
  }
  ASSERT_TRUE(s.Fit(x, y).ok());
  // The best point (first in value order) survives the cap: the model still knows it.
  EXPECT_LT(s.Predict({9, 2}).mean, 0.0);
}

TEST(SurrogateTest, TheGlobalDrawShapeExtrapolatesATrend) {
  // Time falls steadily along knob 0, observed at positions 0..5 only; knob 1 does not matter.
  std::vector<std::vector<int>> x;
  std::vector<double> y;
  for (int a = 0; a <= 5; ++a) {
    for (int b : {0, 3, 6}) {
      x.push_back({a, b});
      y.push_back(-0.3 * a);
    }
  }
  Surrogate trend({8, 8}, {}, {.fixed_shape = Surrogate::kGlobalDrawShape});
  Surrogate hamming({8, 8}, {}, {.fixed_shape = Surrogate::kHammingShape});
  ASSERT_TRUE(trend.Fit(x, y).ok());
  ASSERT_TRUE(hamming.Fit(x, y).ok());
  // The unseen end of the range: the trend carries on; a similarity kernel reverts to the mean.
  EXPECT_LT(trend.Predict({7, 1}).mean, trend.Predict({5, 1}).mean);
  EXPECT_GT(hamming.Predict({7, 1}).mean, hamming.Predict({5, 1}).mean);
  // Still uncertain there, and still interpolating where it has data.
  EXPECT_GT(trend.Predict({7, 1}).sd, trend.Predict({3, 3}).sd);
  EXPECT_NEAR(trend.Predict({3, 3}).mean, -0.9, 0.2);

  Surrogate unknown({8, 8}, {}, {.fixed_shape = Surrogate::kGlobalDrawShape + 1});
  EXPECT_FALSE(unknown.Fit(x, y).ok()) << "a shape index past the last";
}

v1::Problem TwoKnobProblem() {
  v1::Problem p;
  p.set_name("p");
  p.set_backend(v1::BACKEND_OPENCL);
  auto* s = p.add_size_sets();
  s->set_name("default");
  s->set_bench(true);
  (*s->mutable_sizes())["N"] = 64;
  for (const std::string name : {"A", "B"}) {
    auto* prm = p.mutable_seed()->add_params();
    prm->set_name(name);
    for (int64_t v : {1, 2, 4, 8, 16, 32, 64, 128}) prm->add_values(v);
  }
  return p;
}

v1::Candidate Child(int64_t a, int64_t b, const std::string& source = "kernel") {
  v1::Candidate c;
  c.set_source(source);
  (*c.mutable_params())["A"] = a;
  (*c.mutable_params())["B"] = b;
  return c;
}

v1::EvaluationResult Result(v1::Outcome outcome, double speedup = 0) {
  v1::EvaluationResult r;
  r.set_outcome(outcome);
  r.set_speedup(speedup);
  return r;
}

class ScreenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto space = ParamSpace::Create(TwoKnobProblem());
    ASSERT_TRUE(space.ok()) << space.status();
    space_ = std::make_unique<ParamSpace>(*std::move(space));
  }
  // Speedup peaks at A = 32 (position 5), whatever B.
  void Observe(Screener& s, int n) {
    const int64_t values[] = {1, 2, 4, 8, 16, 32, 64, 128};
    for (int i = 0; i < n; ++i) {
      const int a = (i * 3) % 8;
      const int b = (i * 5) % 8;
      s.Record(Child(values[a], values[b]), Result(v1::OUTCOME_OK, 4.0 / (1.0 + std::abs(a - 5))));
    }
  }
  std::unique_ptr<ParamSpace> space_;
};

TEST_F(ScreenerTest, PicksTheChildTheModelFavours) {
  Screener s(*space_, {.exploration = 0});
  Observe(s, 12);
  const v1::Candidate far = Child(1, 4), near = Child(32, 2), mid = Child(8, 16);
  EXPECT_EQ(s.Choose({&far, &near, &mid}, 1), 1);
  EXPECT_EQ(s.Choose({&mid, &far, &near}, 2), 2);
}

TEST_F(ScreenerTest, GlobalDrawsHaveTheirOwnModelAndNoise) {
  Screener calm(*space_, {.exploration = 0, .global_exploration = 0});
  Observe(calm, 12);
  const v1::Candidate far = Child(1, 4), near = Child(32, 2), mid = Child(8, 16);
  // The plain kernel also knows where the data peaks.
  EXPECT_EQ(calm.Choose({&far, &near, &mid}, 1, ScreenScope::kGlobal), 1);
  // Noise is set per scope: loud global draws vary with the seed, local ones stay put.
  Screener loud(*space_, {.exploration = 0, .global_exploration = 50});
  Observe(loud, 12);
  std::set<int> global, local;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    global.insert(loud.Choose({&far, &near, &mid}, seed, ScreenScope::kGlobal));
    local.insert(loud.Choose({&far, &near, &mid}, seed));
  }
  EXPECT_GT(global.size(), 1u);
  EXPECT_EQ(local, std::set<int>{1});
}

TEST_F(ScreenerTest, AnOracleRanksChildrenByItsCostsWithoutAnyHistory) {
  // Cost = |A - 8|; B = 1 stands for a child that would fail.
  Screener s(*space_, {.oracle = [](const v1::Candidate& c) -> std::optional<double> {
                         if (c.params().at("B") == 1) return std::nullopt;
                         return std::abs(static_cast<double>(c.params().at("A") - 8));
                       }});
  const v1::Candidate far = Child(128, 2), near = Child(4, 2), failing = Child(8, 1), exact = Child(8, 2);
  EXPECT_EQ(s.Choose({&far, &near}, 1), 1);
  EXPECT_EQ(s.Choose({&failing, &far}, 1), 1);
  EXPECT_EQ(s.Choose({&far, &failing, &exact, &near}, 1, ScreenScope::kGlobal), 2);
  // A model-written child of another variant is ranked the same way.
  const v1::Candidate other = Child(16, 2, "other");
  EXPECT_EQ(s.Choose({&far, &other}, 1), 1);
}

TEST_F(ScreenerTest, AnOracleThatKnowsNoChildDefersToTheModel) {
  bool knows = false;
  Screener s(*space_, {.exploration = 0,
                       .oracle = [&knows](const v1::Candidate& c) -> std::optional<double> {
                         if (!knows) return std::nullopt;
                         return static_cast<double>(c.params().at("A"));  // smallest A first
                       }});
  Observe(s, 12);
  const v1::Candidate far = Child(1, 4), near = Child(32, 2);
  EXPECT_EQ(s.Choose({&far, &near}, 1), 1);  // the model: the data peak at A = 32
  knows = true;
  EXPECT_EQ(s.Choose({&far, &near}, 1), 0);
}

// A history of the same kernel elsewhere: cost = |A - peak| (+ B / 1000, so that no two tie).
WarmStart HistoryPeakingAt(int64_t peak, const std::string& device = "GPU A") {
  PriorRun run{.job_id = "earlier", .device = device};
  for (int64_t a : {1, 2, 4, 8, 16, 32, 64, 128}) {
    for (int64_t b : {1, 2, 4, 8}) {
      run.points.push_back({{{"A", a}, {"B", b}}, std::abs(std::log2(static_cast<double>(a)) -
                                                           std::log2(static_cast<double>(peak))) + b / 1000.0});
    }
  }
  return WarmStart{.runs = {run}};
}

TEST_F(ScreenerTest, BeforeItsOwnModelTheHistoryRanksTheSeedsChildren) {
  Screener s(*space_, {.exploration = 0});
  s.SetPrior(Child(1, 1), HistoryPeakingAt(8));
  const v1::Candidate far = Child(128, 2), near = Child(16, 2), best = Child(8, 1);
  EXPECT_EQ(s.Choose({&far, &near}, 1), 1);
  EXPECT_EQ(s.Choose({&far, &best, &near}, 1), 1);
  // A model-written variant (another source) is not the history's kernel: no ranking.
  const v1::Candidate other_far = Child(128, 2, "other"), other_near = Child(16, 2, "other");
  EXPECT_EQ(s.Choose({&other_far, &other_near}, 1), 0);
  // Without a history, nothing ranks the children yet.
  Screener cold(*space_, {.exploration = 0});
  EXPECT_EQ(cold.Choose({&far, &near}, 1), 0);
}

TEST_F(ScreenerTest, AHistoryThatAgreesSteersTheModelWhereItHasNoData) {
  // The job has measured A = 1..8 only, faster as A grows; the history agrees there and knows
  // that the peak is at A = 64. Beyond its data, the job's own model prefers the nearest step.
  auto observe = [](Screener& s) {
    for (int64_t a : {1, 2, 4, 8}) {
      for (int64_t b : {1, 4, 16}) s.Record(Child(a, b), Result(v1::OUTCOME_OK, static_cast<double>(a) + b / 100.0));
    }
  };
  Screener with(*space_, {.exploration = 0});
  with.SetPrior(Child(1, 1), HistoryPeakingAt(64));
  Screener without(*space_, {.exploration = 0});
  observe(with);
  observe(without);
  const v1::Candidate next = Child(16, 2), peak = Child(64, 2);
  EXPECT_EQ(with.Choose({&next, &peak}, 1), 1);
  EXPECT_EQ(with.Choose({&peak, &next}, 1), 0);
  EXPECT_EQ(without.Choose({&next, &peak}, 1), 0);
}

TEST_F(ScreenerTest, AHistoryThatDisagreesWithTheJobsOwnMeasurementsWeighsNothing) {
  // The history peaks at A = 1, the job's measurements at A = 32: once they can be compared, the
  // screener chooses as it would without a history, whatever the children and the seed.
  Screener with(*space_, {.exploration = 1});
  with.SetPrior(Child(1, 1), HistoryPeakingAt(1));
  Screener without(*space_, {.exploration = 1});
  Observe(with, 12);
  Observe(without, 12);
  const v1::Candidate a = Child(1, 4), b = Child(32, 2), c = Child(8, 16), d = Child(2, 1);
  for (uint64_t seed = 0; seed < 20; ++seed) {
    EXPECT_EQ(with.Choose({&a, &b, &c, &d}, seed), without.Choose({&a, &b, &c, &d}, seed)) << seed;
    EXPECT_EQ(with.Choose({&d, &a}, seed, ScreenScope::kGlobal), without.Choose({&d, &a}, seed, ScreenScope::kGlobal))
        << seed;
  }
}

TEST_F(ScreenerTest, NoModelWithoutEnoughData) {
  Screener s(*space_, {.min_points = 4, .exploration = 0});
  const v1::Candidate far = Child(1, 4), near = Child(32, 2);
  EXPECT_EQ(s.Choose({&far, &near}, 1), 0);
  Observe(s, 3);
  EXPECT_EQ(s.Choose({&far, &near}, 1), 0);
  // Failures and infrastructure errors are not successful points.
  s.Record(Child(2, 2), Result(v1::OUTCOME_COMPILE_ERROR));
  s.Record(Child(4, 4), Result(v1::OUTCOME_INFRA_ERROR));
  EXPECT_EQ(s.Choose({&far, &near}, 1), 0);
  Observe(s, 8);
  EXPECT_EQ(s.Choose({&far, &near}, 1), 1);
}

TEST_F(ScreenerTest, DoesNotBorrowTimingsAcrossVariants) {
  Screener s(*space_, {.exploration = 0});
  Observe(s, 12);
  // A model-written kernel with other source has no history of its own.
  const v1::Candidate far = Child(1, 4, "other"), near = Child(32, 2, "other");
  EXPECT_EQ(s.Choose({&far, &near}, 1), 0);
  // A child whose source differs only in a comment is the same variant, so it is screened.
  const v1::Candidate plain_far = Child(1, 4), commented_near = Child(32, 2, "kernel // tuned");
  EXPECT_EQ(s.Choose({&plain_far, &commented_near}, 1), 1);
  // Children of different variants are never ranked against each other.
  const v1::Candidate mixed_far = Child(1, 4), mixed_near = Child(32, 2, "other");
  EXPECT_EQ(s.Choose({&mixed_far, &mixed_near}, 1), 0);
}

TEST_F(ScreenerTest, FailuresCountAsTheWorstTime) {
  Screener s(*space_, {.exploration = 0});
  Observe(s, 12);
  // A = 128 ran once at 1.33x, A = 4 at 1.0x: the model prefers A = 128 ...
  const v1::Candidate risky = Child(128, 8), plain = Child(4, 8);
  EXPECT_EQ(s.Choose({&risky, &plain}, 3), 0);
  // ... until most children near A = 128 fail: then it steers away from there.
  for (int64_t b : {1, 4, 16, 64, 128}) s.Record(Child(128, b), Result(v1::OUTCOME_WRONG_ANSWER));
  EXPECT_EQ(s.Choose({&risky, &plain}, 3), 1);
}

TEST_F(ScreenerTest, SameInputsSameChoiceAndTheSeedMatters) {
  Screener a(*space_), b(*space_);
  Observe(a, 10);
  Observe(b, 10);
  std::vector<v1::Candidate> kids;
  for (int64_t v : {1, 2, 4, 8, 16, 64, 128}) kids.push_back(Child(v, v));
  std::vector<const v1::Candidate*> ptrs;
  for (const auto& k : kids) ptrs.push_back(&k);
  std::map<int, int> chosen;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const int c = a.Choose(ptrs, seed);
    EXPECT_EQ(c, b.Choose(ptrs, seed)) << "seed " << seed;
    ++chosen[c];
  }
  // Thompson noise: with seven uncertain children, the choice is not always the same one.
  EXPECT_GT(chosen.size(), 1u);
}

}  // namespace
}  // namespace kforge::coordinator
