// The warm start through the real job runner: replay problems of one kernel recorded on two
// devices, the parametric mutator and a worker thread per job, MemoryStore. A job on the second
// device finds the first device's job in the store, says so, proposes its best first and never
// takes its timings as its own; `cold` starts from nothing.

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/kt_cache.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/queue/memory_queue.h"
#include "common/queue/stream.h"
#include "common/store/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/job_runner.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/queue_worker.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "tests/integration/replay_fixture.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

using ::kforge::testing::SynthCacheJson;
using ::kforge::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The synthetic space recorded on `device`, every time multiplied by `scale` (a slower GPU ranks
// the configurations alike).
std::string WriteDevice(const TempDir& dir, const std::string& device, double scale) {
  nlohmann::json j = nlohmann::json::parse(SynthCacheJson());
  j["device_name"] = device;
  for (auto& [key, rec] : j["cache"].items()) {
    if (rec["time"].is_number()) rec["time"] = rec["time"].get<double>() * scale;
  }
  const std::string rel = absl::StrCat("synth-", device.substr(device.size() - 1));
  dir.Write(rel + "/cache.json", j.dump());
  dir.Write(rel + "/problem.yaml",
            absl::StrCat("name: synth\nbackend: replay\ndescription: the synthetic kernel on ",
                         device, "\nreplay: {cache: cache.json}\n"));
  return dir.path() + "/" + rel;
}

class WarmStartJobTest : public ::testing::Test {
 protected:
  v1::Problem Load(const std::string& folder) {
    auto p = LoadProblem(folder);
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  }
  // Submits a job of `problem` to `store`.
  std::string Submit(Store& store, const v1::Problem& problem, int64_t budget, bool cold) {
    MemoryWorkQueue queue(clock_, 3600);
    llm::ParametricMutator mutator({}, nullptr);
    coordinator::JobRunner runner(store, queue, mutator, clock_, log_, {});
    v1::JobSpec spec;
    *spec.mutable_problem() = problem;
    spec.mutable_budget()->set_max_candidates(budget);
    spec.set_seed(7);
    spec.set_cold(cold);
    spec.set_tenant("acme");
    auto job = runner.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }
  // Runs (or resumes) a job with one worker, to its end or until `stop_after` evaluations.
  v1::Job RunJob(Store& store, const v1::Problem& problem, const std::string& id,
                 int warm_proposals, int64_t stop_after = 0) {
    MemoryWorkQueue queue(clock_, 3600);
    auto validity = ReplayValidity(problem);
    EXPECT_TRUE(validity.ok());
    llm::ParametricMutator mutator({}, *validity);
    coordinator::JobRunnerOptions options{.slots = 1, .poll_seconds = 0.02};
    options.warm_proposals = warm_proposals;
    coordinator::JobRunner runner(store, queue, mutator, clock_, log_, options);
    worker::Evaluator evaluator(worker::EvaluatorOptions{}, clock_, log_);
    std::atomic<bool> stop{false}, worker_stop{false};
    std::thread worker([&] {
      worker::QueueWorker w(queue, evaluator, StreamFor(problem), "w", log_);
      w.Run(worker_stop);
    });
    auto done = runner.Run(id, stop, [&](const coordinator::Progress& p) {
      if (stop_after > 0 && p.evaluations >= stop_after) stop = true;
    });
    worker_stop = true;
    queue.Close();
    worker.join();
    EXPECT_TRUE(done.ok()) << done.status();
    return done.ok() ? *done : v1::Job{};
  }
  v1::Job Run(const v1::Problem& problem, int64_t budget, bool cold, int warm_proposals) {
    return RunJob(store_, problem, Submit(store_, problem, budget, cold), warm_proposals);
  }
  std::vector<std::string> Trace(Store& store, const std::string& id) {
    std::vector<std::string> out;
    auto cands = store.ListCandidates(id);
    EXPECT_TRUE(cands.ok());
    for (const auto& c : *cands)
      out.push_back(FormatParams(ParamAssignment(c.params().begin(), c.params().end())));
    return out;
  }
  std::vector<v1::Candidate> Candidates(const v1::Job& job) {
    auto c = store_.ListCandidates(job.id());
    EXPECT_TRUE(c.ok());
    return *c;
  }
  RealClock clock_;
  Logger log_ = MakeLogger("warm-start-test", spdlog::level::err);
  MemoryStore store_;
  TempDir dir_;
};

TEST_F(WarmStartJobTest, AJobOnAnotherDeviceStartsFromTheFirstDevicesBestAndMeasuresItsOwn) {
  const v1::Problem a = Load(WriteDevice(dir_, "GPU A", 1.0));
  const v1::Problem b = Load(WriteDevice(dir_, "GPU B", 2.0));
  ASSERT_NE(a.content_hash(), b.content_hash());

  const v1::Job first = Run(a, 30, /*cold=*/false, /*warm_proposals=*/2);
  EXPECT_EQ(first.warm_start(), "") << "nothing in the store yet";
  // The first job's two best configurations, fastest first.
  auto evals = store_.ListEvaluations(first.id());
  ASSERT_TRUE(evals.ok());
  std::vector<std::pair<double, std::string>> by_speed;
  for (const auto& e : *evals) {
    if (e.outcome() == v1::OUTCOME_OK) by_speed.emplace_back(-e.speedup(), e.candidate_id());
  }
  std::sort(by_speed.begin(), by_speed.end());
  ASSERT_GE(by_speed.size(), 2u);
  std::vector<v1::Candidate> first_cands = Candidates(first);
  auto params_of = [&](const std::string& id) {
    for (const auto& c : first_cands) {
      if (c.id() == id) return ParamAssignment(c.params().begin(), c.params().end());
    }
    return ParamAssignment{};
  };

  const v1::Job warm = Run(b, 10, /*cold=*/false, /*warm_proposals=*/2);
  EXPECT_EQ(warm.warm_start(), absl::StrCat("warm start: ", evals->size(),
                                            " evaluations from 1 earlier job on GPU A"));
  const std::vector<v1::Candidate> cands = Candidates(warm);
  ASSERT_GE(cands.size(), 4u);
  for (int i : {1, 2}) {
    EXPECT_THAT(cands[i].note(), StartsWith("warm start")) << i;
    EXPECT_EQ(ParamAssignment(cands[i].params().begin(), cands[i].params().end()),
              params_of(by_speed[static_cast<size_t>(i - 1)].second))
        << i;
  }
  EXPECT_THAT(cands[3].note(), ::testing::Not(StartsWith("warm start")));
  // Measured here: GPU B's times, none of GPU A's taken over.
  auto warm_evals = store_.ListEvaluations(warm.id());
  ASSERT_TRUE(warm_evals.ok());
  EXPECT_EQ(warm_evals->size(), 10u);
  for (const auto& e : *warm_evals) {
    EXPECT_EQ(e.device().name(), "GPU B");
    EXPECT_EQ(e.reused_from_job(), "");
  }
  // The job's events say where it started from.
  auto events = store_.ListEvents(warm.id(), 1, 100);
  ASSERT_TRUE(events.ok());
  bool said = false;
  for (const auto& ev : *events) said = said || absl::StartsWith(ev.message(), "warm start: ");
  EXPECT_TRUE(said);

  // Cold: nothing looked up, nothing proposed from it.
  const v1::Job cold = Run(b, 6, /*cold=*/true, /*warm_proposals=*/2);
  EXPECT_EQ(cold.warm_start(), "");
  for (const auto& c : Candidates(cold))
    EXPECT_THAT(c.note(), ::testing::Not(HasSubstr("warm start")));

  // GPU A again: its own earlier run is left to reuse (the device is not known when the job
  // begins, so no run of the same problem counts); GPU B's two jobs are its history.
  const v1::Job again = Run(a, 4, /*cold=*/false, /*warm_proposals=*/1);
  EXPECT_THAT(again.warm_start(),
              StartsWith("warm start: 16 evaluations from 2 earlier jobs on GPU B"));
}

// A job resumed after the store gained history keeps the history it began with: it proposes what
// an uninterrupted run does.
TEST_F(WarmStartJobTest, AResumedJobKeepsTheHistoryItBeganWith) {
  const v1::Problem a = Load(WriteDevice(dir_, "GPU A", 1.0));
  const v1::Problem b = Load(WriteDevice(dir_, "GPU B", 2.0));
  const v1::Problem c = Load(WriteDevice(dir_, "GPU C", 0.5));
  MemoryStore reference;
  for (Store* s : {static_cast<Store*>(&reference), static_cast<Store*>(&store_)}) {
    RunJob(*s, a, Submit(*s, a, 20, false), 2);
  }
  // GPU C's job is older than GPU B's but has not run when B's begins: it is not history then.
  const std::string on_c = Submit(store_, c, 20, true);
  const std::string ref_id = Submit(reference, b, 24, false);
  const v1::Job want = RunJob(reference, b, ref_id, 2);
  ASSERT_EQ(want.state(), v1::JOB_STATE_COMPLETED);
  const std::string id = Submit(store_, b, 24, false);
  const v1::Job stopped = RunJob(store_, b, id, 2, /*stop_after=*/6);
  ASSERT_EQ(stopped.state(), v1::JOB_STATE_INTERRUPTED);
  EXPECT_EQ(stopped.warm_start(), want.warm_start());
  ASSERT_EQ(RunJob(store_, c, on_c, 2).state(), v1::JOB_STATE_COMPLETED);
  const v1::Job resumed = RunJob(store_, b, id, 2);
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_COMPLETED);
  EXPECT_EQ(resumed.warm_start(), want.warm_start());
  ASSERT_EQ(resumed.warm_start_sources_size(), 1);
  EXPECT_EQ(Trace(store_, id), Trace(reference, ref_id));
  // A job begun now sees GPU C's job too.
  EXPECT_THAT(Run(b, 4, false, 1).warm_start(), HasSubstr("from 2 earlier jobs on GPU C, GPU A"));
}

}  // namespace
}  // namespace kforge
