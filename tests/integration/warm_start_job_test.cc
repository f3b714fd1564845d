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
  // Runs a job of `problem` to its end with one worker.
  v1::Job Run(const v1::Problem& problem, int64_t budget, bool cold, int warm_proposals) {
    MemoryWorkQueue queue(clock_, 3600);
    auto validity = ReplayValidity(problem);
    EXPECT_TRUE(validity.ok());
    llm::ParametricMutator mutator({}, *validity);
    coordinator::JobRunnerOptions options{.slots = 1, .poll_seconds = 0.02};
    options.warm_proposals = warm_proposals;
    coordinator::JobRunner runner(store_, queue, mutator, clock_, log_, options);
    v1::JobSpec spec;
    *spec.mutable_problem() = problem;
    spec.mutable_budget()->set_max_candidates(budget);
    spec.set_seed(7);
    spec.set_cold(cold);
    spec.set_tenant("acme");
    auto job = runner.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    worker::Evaluator evaluator(worker::EvaluatorOptions{}, clock_, log_);
    std::atomic<bool> stop{false}, worker_stop{false};
    std::thread worker([&] {
      worker::QueueWorker w(queue, evaluator, StreamFor(problem), "w", log_);
      w.Run(worker_stop);
    });
    auto done = runner.Run(job->id(), stop);
    worker_stop = true;
    queue.Close();
    worker.join();
    EXPECT_TRUE(done.ok()) << done.status();
    return *done;
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
  ASSERT_GE(cands.size(), 3u);
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

}  // namespace
}  // namespace kforge
