// The warm start's parts without a job: ranking the history, the prior's per-run weights and
// ranks, and which earlier evaluations the store lookup takes (MemoryStore).

#include "services/coordinator/warm_start.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

PriorPoint Point(int64_t a, int64_t b, std::optional<double> cost) {
  return {{{"A", a}, {"B", b}}, cost};
}

v1::Problem Kernel(const std::string& source = "kernel void f() {}", int64_t size = 64) {
  v1::Problem p;
  p.set_name("p");
  p.set_backend(v1::BACKEND_OPENCL);
  p.set_description(absl::StrCat("size ", size));
  auto* s = p.add_size_sets();
  s->set_name("default");
  s->set_bench(true);
  (*s->mutable_sizes())["N"] = size;
  p.mutable_seed()->set_source(source);
  for (const std::string name : {"A", "B"}) {
    auto* prm = p.mutable_seed()->add_params();
    prm->set_name(name);
    for (int64_t v : {1, 2, 4, 8}) prm->add_values(v);
  }
  p.set_content_hash(HashProblem(p));
  return p;
}

TEST(WarmStartTest, RankedOrdersByMeanRelativeRankWithFailuresLast) {
  // Run 1 (a fast GPU): (1,1) 1 ms < (2,2) 2 ms < (4,4) 8 ms; (8,8) fails.
  // Run 2 (four times slower): (2,2) 4 ms < (1,1) 6 ms < (4,4) 30 ms.
  WarmStart warm{.runs = {{.job_id = "j1",
                           .device = "A100",
                           .points = {Point(1, 1, 1), Point(2, 2, 2), Point(4, 4, 8),
                                      Point(8, 8, std::nullopt)}},
                          {.job_id = "j2",
                           .device = "W7800",
                           .points = {Point(2, 2, 4), Point(1, 1, 6), Point(4, 4, 30)}}}};
  const std::vector<ParamAssignment> ranked = warm.Ranked();
  ASSERT_EQ(ranked.size(), 4u);
  // (1,1): 0 and 0.5 -> 0.25; (2,2): 0.5 and 0 -> 0.25 (a tie: first seen first); (4,4): 1;
  // (8,8): 1.
  EXPECT_EQ(ranked[0], (ParamAssignment{{"A", 1}, {"B", 1}}));
  EXPECT_EQ(ranked[1], (ParamAssignment{{"A", 2}, {"B", 2}}));
  EXPECT_EQ(ranked[2], (ParamAssignment{{"A", 4}, {"B", 4}}));
  EXPECT_EQ(ranked[3], (ParamAssignment{{"A", 8}, {"B", 8}}));
  EXPECT_EQ(warm.evaluations(), 7);
  EXPECT_EQ(warm.Summary(), "warm start: 7 evaluations from 2 earlier jobs on A100, W7800");
  warm.runs[1].device = "A100";
  warm.runs[1].other_shape = true;
  EXPECT_EQ(warm.Summary(),
            "warm start: 7 evaluations from 2 earlier jobs on A100 (1 of another shape)");
  EXPECT_EQ(WarmStart{}.Summary(), "");
}

TEST(WarmStartTest, PriorWeighsEachRunByHowItOrdersTheJobsOwnMeasurements) {
  auto space = ParamSpace::Create(Kernel());
  ASSERT_TRUE(space.ok()) << space.status();
  // Run "agrees": cost grows with A. Run "reversed": cost falls with A.
  PriorRun agrees{.job_id = "agrees"}, reversed{.job_id = "reversed"};
  for (int64_t a : {1, 2, 4, 8}) {
    for (int64_t b : {1, 2, 4, 8}) {
      agrees.points.push_back(Point(a, b, a * 10.0 + b));
      reversed.points.push_back(Point(a, b, -a * 10.0 + b));
    }
  }
  Prior prior(*space, WarmStart{.runs = {agrees, reversed}});
  ASSERT_EQ(prior.runs(), 2u);
  // The job measured A = 1, 2, 4 at B = 1: faster at smaller A.
  const std::vector<std::vector<int>> points = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  const std::vector<double> cost = {1, 2, 3, 4};
  // Three pairs are too few to judge: every run weighs 1.
  const std::vector<std::vector<int>> three(points.begin(), points.begin() + 3);
  EXPECT_THAT(prior.Weights(three, std::vector<double>(cost.begin(), cost.begin() + 3)),
              ElementsAre(1.0, 1.0));
  EXPECT_THAT(prior.Weights(points, cost), ElementsAre(1.0, 0.0));
  // Ranks: exact points; the reversed run, at weight 0, says nothing.
  EXPECT_EQ(prior.Rank({0, 0}, {1.0, 0.0}), 0.0);
  EXPECT_EQ(prior.Rank({3, 3}, {1.0, 0.0}), 1.0);
  EXPECT_NEAR(*prior.Rank({0, 0}, {1.0, 1.0}), (0.0 + 12.0 / 15) / 2, 1e-9);
  EXPECT_EQ(prior.Rank({0, 0}, {0.0, 0.0}), std::nullopt);
}

TEST(WarmStartTest, ASmallRunAnswersForNearNeighboursOnly) {
  auto space = ParamSpace::Create(Kernel());
  ASSERT_TRUE(space.ok()) << space.status();
  PriorRun run{.job_id = "j", .points = {Point(1, 1, 1), Point(1, 2, 2), Point(2, 1, 3)}};
  Prior prior(*space, WarmStart{.runs = {run}});
  // (1,1) 0, (1,2) 0.5, (2,1) 1. (2,2) is one knob from (1,2) and (2,1): their mean.
  EXPECT_EQ(prior.Rank({1, 1}, {1.0}), 0.75);
  // (8,8) is two knobs from all three: their mean; nothing is three knobs away in two knobs.
  EXPECT_EQ(prior.Rank({3, 3}, {1.0}), 0.5);
  // A point outside this job's space (another shape's value) is dropped from the run.
  PriorRun other{.job_id = "k", .points = {Point(16, 1, 1), Point(1, 1, 2)}};
  EXPECT_TRUE(Prior(*space, WarmStart{.runs = {other}}).empty());
}

class LoadWarmStartTest : public ::testing::Test {
 protected:
  // An earlier job of `problem` on `device` whose seed variants measured `params` -> speedup
  // (0: a compile error); plus a model-written candidate and a reused evaluation, which never
  // count.
  void EarlierJob(const std::string& id, const v1::Problem& problem, const std::string& device,
                  const std::vector<std::pair<std::pair<int64_t, int64_t>, double>>& measured,
                  const std::string& tenant = "acme",
                  v1::JobState state = v1::JOB_STATE_COMPLETED) {
    v1::Job job;
    job.set_id(id);
    job.set_state(state);
    job.mutable_spec()->set_tenant(tenant);
    *job.mutable_spec()->mutable_problem() = problem;
    ASSERT_TRUE(store_.CreateJob(job).ok());
    std::vector<v1::Candidate> cands;
    std::vector<v1::EvaluationResult> results;
    auto add = [&](const std::string& source, int64_t a, int64_t b, v1::Outcome outcome,
                   double speedup, bool reused) {
      v1::Candidate c;
      c.set_id(absl::StrCat(id, "-c", cands.size()));
      c.set_job_id(id);
      c.set_sequence(static_cast<int64_t>(cands.size()));
      c.set_source(source);
      (*c.mutable_params())["A"] = a;
      (*c.mutable_params())["B"] = b;
      c.set_content_hash(HashCandidate(c));
      v1::EvaluationResult r;
      r.set_job_id(id);
      r.set_candidate_id(c.id());
      r.set_request_id(c.id());
      r.set_outcome(outcome);
      r.set_speedup(speedup);
      r.mutable_device()->set_name(device);
      r.mutable_device()->set_device_class(absl::StrCat("class:", device));
      if (reused) r.set_reused_from_job("elsewhere");
      cands.push_back(c);
      results.push_back(r);
    };
    for (const auto& [ab, speedup] : measured) {
      add(problem.seed().source(), ab.first, ab.second,
          speedup > 0 ? v1::OUTCOME_OK : v1::OUTCOME_COMPILE_ERROR, speedup, false);
    }
    add("a model's kernel", 8, 8, v1::OUTCOME_OK, 100, false);
    add(problem.seed().source(), 8, 4, v1::OUTCOME_OK, 100, true);
    add(problem.seed().source(), 4, 8, v1::OUTCOME_TIMEOUT, 0, false);
    ASSERT_TRUE(store_.InsertCandidates(id, cands, kNoFence).ok());
    ASSERT_TRUE(store_.PutEvaluations(id, results, kNoFence).ok());
  }
  MemoryStore store_;
};

TEST_F(LoadWarmStartTest, TakesTheSameKernelsSeedVariantsOnOtherDevicesAndShapes) {
  const v1::Problem here = Kernel(), bigger = Kernel("kernel void f() {}", 4096);
  ASSERT_NE(here.content_hash(), bigger.content_hash());
  EarlierJob("same-device", here, "A100", {{{1, 1}, 2.0}, {{2, 2}, 3.0}});
  EarlierJob("other-device", here, "W7800", {{{1, 1}, 1.0}, {{2, 2}, 4.0}, {{4, 4}, 0}});
  EarlierJob("other-shape", bigger, "A100", {{{1, 2}, 1.5}, {{2, 1}, 2.5}});
  EarlierJob("other-kernel", Kernel("kernel void g() {}"), "W7800", {{{1, 1}, 9.0}, {{2, 2}, 9.0}});
  EarlierJob("other-tenant", here, "W7800", {{{1, 1}, 9.0}, {{2, 2}, 9.0}}, "globex");
  EarlierJob("too-little", here, "H100", {{{1, 1}, 9.0}});

  auto warm =
      LoadWarmStart(store_, here, {.tenant = "acme", .job_id = "", .device_class = "class:A100"});
  ASSERT_TRUE(warm.ok()) << warm.status();
  std::vector<std::string> jobs;
  for (const PriorRun& r : warm->runs) jobs.push_back(r.job_id);
  EXPECT_THAT(jobs, ElementsAre("other-shape", "other-device"));  // newest first
  const PriorRun& other_device = warm->runs[1];
  EXPECT_EQ(other_device.device, "W7800");
  EXPECT_FALSE(other_device.other_shape);
  ASSERT_EQ(other_device.points.size(),
            3u);  // not the model's kernel, the reused one or the timeout
  EXPECT_NEAR(*other_device.points[1].cost, -std::log(4.0), 1e-12);
  EXPECT_EQ(other_device.points[2].cost, std::nullopt);  // the compile error ranks last
  EXPECT_TRUE(warm->runs[0].other_shape);
  EXPECT_EQ(warm->Summary(),
            "warm start: 5 evaluations from 2 earlier jobs on A100, W7800 (1 of another shape)");

  // With the device not known yet, the same problem's runs are left to reuse, whatever device.
  auto unknown = LoadWarmStart(store_, here, {.tenant = "acme", .job_id = ""});
  ASSERT_TRUE(unknown.ok());
  ASSERT_EQ(unknown->runs.size(), 1u);
  EXPECT_EQ(unknown->runs[0].job_id, "other-shape");
  // The asking job is never its own history; max_jobs bounds the lookup.
  auto own = LoadWarmStart(
      store_, here, {.tenant = "acme", .job_id = "other-shape", .device_class = "class:A100"});
  ASSERT_TRUE(own.ok());
  ASSERT_EQ(own->runs.size(), 1u);
  EXPECT_EQ(own->runs[0].job_id, "other-device");
  auto one = LoadWarmStart(
      store_, here, {.tenant = "acme", .job_id = "", .device_class = "class:A100", .max_jobs = 1});
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->runs.size(), 1u);
  // The asking job's tenant is never "any tenant".
  auto nobody = LoadWarmStart(store_, here, {.tenant = "", .job_id = ""});
  ASSERT_TRUE(nobody.ok());
  EXPECT_TRUE(nobody->empty());
}

TEST_F(LoadWarmStartTest, OnlyEndedJobsCountAndASnapshotRebuildsTheSameHistory) {
  const v1::Problem here = Kernel();
  EarlierJob("ended", here, "W7800", {{{1, 1}, 1.0}, {{2, 2}, 4.0}});
  EarlierJob("running", here, "H100", {{{1, 1}, 1.0}, {{2, 2}, 4.0}}, "acme",
             v1::JOB_STATE_RUNNING);
  auto first =
      LoadWarmStart(store_, here, {.tenant = "acme", .job_id = "", .device_class = "class:A100"});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->runs.size(), 1u);
  EXPECT_EQ(first->runs[0].job_id, "ended");
  // Later: more history, and the running job ended. A resumed job asks for its snapshot.
  EarlierJob("later", here, "B200", {{{1, 1}, 1.0}, {{4, 4}, 4.0}});
  auto again = LoadWarmStart(
      store_, here,
      {.from_jobs = {"ended"}, .tenant = "acme", .job_id = "", .device_class = "class:A100"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->Summary(), first->Summary());
  ASSERT_EQ(again->runs.size(), 1u);
  EXPECT_EQ(again->runs[0].points.size(), first->runs[0].points.size());
  // A snapshot naming a job the store lacks is an error (the begin is retried), not a cold start.
  EXPECT_FALSE(LoadWarmStart(store_, here, {.from_jobs = {"gone"}, .tenant = "acme"}).ok());
}

TEST_F(LoadWarmStartTest, TenantsThatPoolTheirHistoryDrawOnEachOthersJobsOnly) {
  const v1::Problem here = Kernel();
  EarlierJob("globex-job", here, "W7800", {{{1, 1}, 1.0}, {{2, 2}, 4.0}}, "globex");
  EarlierJob("initech-job", here, "H100", {{{1, 1}, 1.0}, {{2, 2}, 4.0}}, "initech");
  EarlierJob("acme-job", here, "A100", {{{1, 1}, 1.0}, {{2, 2}, 4.0}}, "acme");
  auto tenant = [this](const std::string& name, bool share) {
    v1::Tenant t;
    t.set_name(name);
    t.set_share_history(share);
    ASSERT_TRUE(store_.CreateTenant(t).ok());
  };
  tenant("acme", false);
  tenant("globex", true);
  tenant("initech", false);
  auto runs = [&](const std::string& who) {
    std::vector<std::string> ids;
    auto warm =
        LoadWarmStart(store_, here, {.tenant = who, .job_id = "", .device_class = "class:B200"});
    EXPECT_TRUE(warm.ok()) << warm.status();
    if (warm.ok()) {
      for (const PriorRun& r : warm->runs)
        ids.push_back(absl::StrCat(r.job_id, r.other_tenant ? " (other)" : ""));
    }
    return ids;
  };
  // acme does not pool: its own job only; globex pools, but nobody else does yet.
  EXPECT_THAT(runs("acme"), ElementsAre("acme-job"));
  EXPECT_THAT(runs("globex"), ElementsAre("globex-job"));
  v1::Tenant acme = *store_.GetTenant("acme");
  acme.set_share_history(true);
  ASSERT_TRUE(store_.UpdateTenant(acme).ok());
  // Both pool now: each draws on the other's job; initech, which does not, is in neither.
  EXPECT_THAT(runs("acme"), ElementsAre("acme-job", "globex-job (other)"));
  EXPECT_THAT(runs("globex"), ElementsAre("acme-job (other)", "globex-job"));
  EXPECT_THAT(runs("initech"), ElementsAre("initech-job"));
  auto warm =
      LoadWarmStart(store_, here, {.tenant = "acme", .job_id = "", .device_class = "class:B200"});
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ(warm->Summary(),
            "warm start: 4 evaluations from 2 earlier jobs on A100, W7800 (1 of another tenant)");
}

}  // namespace
}  // namespace kforge::coordinator
