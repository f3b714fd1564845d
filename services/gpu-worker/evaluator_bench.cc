// Evaluator::Run's benchmark stage: the reference and the candidate timed in the same sandbox
// lifetime, how many samples each takes (adaptive, capped for slow kernels, raced against the
// job's best), and the finalists' rounds' sampling (see evaluator.h for the options).

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/gpu-worker/evaluator_run.h"
#include "services/gpu-worker/sample_stats.h"

namespace kforge::worker {

namespace {

// A candidate whose fastest validation run took this many times the job's best time on a size set
// is not benchmarked there (racing on).
constexpr double kSkipBenchmarkFactor = 4;

}  // namespace

v1::TimingStats TimingStatsOf(std::vector<double> s) {
  v1::TimingStats t;
  if (s.empty()) return t;
  std::sort(s.begin(), s.end());
  t.set_median_seconds(SortedMedian(s));
  t.set_min_seconds(s.front());
  t.set_p20_seconds(SortedQuantile(s, 0.2));
  t.set_p80_seconds(SortedQuantile(s, 0.8));
  t.set_samples(static_cast<int32_t>(s.size()));
  const auto [lo, hi] = MedianIntervalRanks(s.size());
  t.set_median_low_seconds(s[lo]);
  t.set_median_high_seconds(s[hi]);
  return t;
}

absl::StatusOr<v1::TimingStats> Evaluator::Run::ReferenceTiming(int set,
                                                                const std::vector<int>& indices) {
  if (data_->ref_timing_generation != ReferenceGeneration()) {
    data_->ref_timing.clear();
    data_->compiled_timing.clear();
    data_->compile_failed.clear();
    data_->ref_timing_generation = ReferenceGeneration();
  }
  if (auto it = data_->ref_timing.find(set); it != data_->ref_timing.end()) return it->second;
  const Sampling sampling = Capped(ReferenceSampling(), ReferenceRunSeconds(set));
  KF_ASSIGN_OR_RETURN(std::vector<double> samples, TimeReference(set, indices, sampling));
  return data_->ref_timing[set] = TimingStatsOf(std::move(samples));
}

void Evaluator::Run::Benchmark() {
  auto& clock = ev_.clock_;
  // Stage 4: benchmark reference and candidate in this sandbox lifetime, rotating inputs, then
  // validate what the last timed run wrote.
  const double t0 = clock.MonotonicSeconds();
  double log_sum = 0;
  int bench_sets = 0;
  double compiled_log_sum = 0;
  int compiled_sets = 0;
  for (int set = 0; set < p_.size_sets_size(); ++set) {
    if (!p_.size_sets(set).bench()) continue;
    auto indices = BenchIndices(set);
    if (!indices.ok()) {
      EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_INFRA_ERROR,
               std::string(indices.status().message()));
      return;
    }
    auto ref = ReferenceTiming(set, *indices);
    if (!ref.ok()) {
      EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_INFRA_ERROR,
               std::string(ref.status().message()));
      return;
    }
    // Racing: the time the job's best would take here, from its speedup over this reference on
    // this size set (the geometric mean over sets when the request has no per-set speedups).
    Sampling sampling = CandidateSampling();
    double best = req_.best_speedup();
    if (auto it = req_.best_set_speedups().find(p_.size_sets(set).name());
        it != req_.best_set_speedups().end() && it->second > 0) {
      best = it->second;
    }
    const double best_seconds = best > 0 ? ref->median_seconds() / best : 0;
    if (best_seconds > 0 && ev_.options_.race_factor > 0) {
      sampling.race_seconds = best_seconds * ev_.options_.race_factor;
      sampling.race_samples = ev_.options_.race_samples;
      if (ev_.options_.race_early_factor > 0) {
        sampling.race_early_seconds = best_seconds * ev_.options_.race_early_factor;
        sampling.race_early_samples = ev_.options_.race_early_samples;
      }
    }
    sampling = Capped(sampling, RunSeconds(set));
    std::vector<double> samples;
    bool raced = false;
    const double fastest =
        set < static_cast<int>(cand_fastest_run_.size()) ? cand_fastest_run_[set] : 0;
    if (sampling.race_seconds > 0 && fastest > kSkipBenchmarkFactor * best_seconds) {
      // Its validation runs were already far slower than the best (a margin for their differences
      // from a timed sample: no warm-up, no cache flush, fresh inputs): not worth a benchmark, its
      // fastest run stands for it. The repeat run the benchmark's last run would have been is
      // made here.
      if (!ValidationRun(set, 0, /*pattern=*/1, v1::STAGE_BENCHMARK, t0)) return;
      samples = {fastest};
      raced = true;
    } else if (!TimeCandidate(set, *indices, sampling, t0, &samples, &raced)) {
      return;
    }
    auto* t = res_.add_timings();
    t->set_size_set(p_.size_sets(set).name());
    *t->mutable_candidate() = TimingStatsOf(std::move(samples));
    *t->mutable_reference() = *ref;
    t->set_raced(raced);
    const double cand = t->candidate().median_seconds();
    t->set_speedup(cand > 0 ? ref->median_seconds() / cand : 0);
    if (t->speedup() > 0) {
      log_sum += std::log(t->speedup());
      ++bench_sets;
    }
    // A PyTorch reference's second baseline: torch.compile, where this torch has it.
    if (torch() && !raced && cand > 0) {
      if (auto compiled = CompiledTiming(set, *indices); compiled.ok() && compiled->median_seconds() > 0) {
        *t->mutable_compiled() = *compiled;
        t->set_speedup_compiled(compiled->median_seconds() / cand);
        compiled_log_sum += std::log(t->speedup_compiled());
        ++compiled_sets;
      }
    }
  }
  res_.set_speedup(bench_sets > 0 ? std::exp(log_sum / bench_sets) : 0);
  if (compiled_sets > 0 && compiled_sets == bench_sets) res_.set_speedup_compiled(std::exp(compiled_log_sum / compiled_sets));
  EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_OK);
  res_.set_outcome(v1::OUTCOME_OK);
  res_.set_total_seconds(clock.MonotonicSeconds() - start_);
}

absl::StatusOr<std::vector<int>> Evaluator::Run::BenchIndices(int set) {
  std::vector<int> indices;
  for (int i = 0; i < std::max(1, ev_.options_.bench_input_sets); ++i) {
    KF_RETURN_IF_ERROR(EnsureReference(set, i));
    indices.push_back(i);
  }
  return indices;
}

Evaluator::Run::Sampling Evaluator::Run::ReferenceSampling() const {
  const EvaluatorOptions& o = ev_.options_;
  return Sampling{.warmup = o.warmup,
                  .min_samples = o.min_samples,
                  .max_samples = o.max_samples,
                  .min_seconds = o.min_bench_seconds,
                  .target_rel_error = o.reference_rel_error};
}

Evaluator::Run::Sampling Evaluator::Run::Capped(Sampling s, double run_seconds) const {
  // A kernel that takes seconds per run gets fewer samples (at least 3) rather than a timeout: its
  // validation run said how long one takes.
  const double cap = ev_.options_.max_bench_seconds;
  if (run_seconds <= 0 || cap <= 0) return s;
  const double fit = std::floor(cap / run_seconds);
  if (fit < s.max_samples) {
    s.max_samples = static_cast<int>(std::max(3.0, fit));
    s.min_samples = std::min(s.min_samples, s.max_samples);
    s.race_samples = std::min(s.race_samples, s.max_samples);
    s.race_early_samples = std::min(s.race_early_samples, s.max_samples);
  }
  if (run_seconds * s.warmup > cap / 2) s.warmup = std::min(s.warmup, 1);
  return s;
}

Evaluator::Run::Sampling Evaluator::Run::RoundSampling(int set, bool reference) const {
  Sampling s{.warmup = 1,
             .min_samples = ev_.options_.confirm_samples,
             .max_samples = ev_.options_.confirm_samples};
  const double run_seconds = reference ? ReferenceRunSeconds(set) : RunSeconds(set);
  const double cap = ev_.options_.max_bench_seconds / 3;
  if (run_seconds > 0 && run_seconds * (s.max_samples + s.warmup) > cap) {
    s.max_samples = s.min_samples = static_cast<int>(std::max(1.0, std::floor(cap / run_seconds)));
    s.warmup = run_seconds * (s.max_samples + 1) > cap ? 0 : 1;
  }
  return s;
}

double Evaluator::Run::ReferenceRunSeconds(int set) const {
  auto it = data_->ref_run_seconds.find(set);
  return it == data_->ref_run_seconds.end() ? 0 : it->second;
}

Evaluator::Run::Sampling Evaluator::Run::CandidateSampling() const {
  Sampling s = ReferenceSampling();
  s.target_rel_error = ev_.options_.bench_rel_error;
  // The candidate's validation runs, on the same input sets, have just warmed its code: one
  // warm-up run re-warms the data.
  s.warmup = std::min(s.warmup, 1);
  return s;
}

absl::StatusOr<std::vector<double>> Evaluator::Run::TimeReference(int set,
                                                                  const std::vector<int>& indices,
                                                                  const Sampling& sampling) {
  if (torch()) return TimeTorch(set, indices, sampling, "eager");
  std::vector<v1::BufferSet> sets;
  for (int i : indices)
    sets.push_back(BuildSet(set, i, {}, 0, /*inputs_only=*/i != indices[0], /*resident=*/true));
  auto r = RunCalls(data_->ref_program, ref_calls_[set], std::move(sets), &sampling);
  if (!RunSucceeded(r)) {
    return absl::UnavailableError(
        absl::StrCat("reference benchmark: ", r.message, r.response.run().message()));
  }
  return std::vector<double>(r.response.run().samples_seconds().begin(),
                             r.response.run().samples_seconds().end());
}

bool Evaluator::Run::TimeCandidate(int set, const std::vector<int>& indices,
                                   const Sampling& sampling, double t0,
                                   std::vector<double>* samples, bool* raced) {
  std::vector<v1::BufferSet> sets;
  for (int i : indices) {
    sets.push_back(BuildSet(set, i, cand_scratch_[set], /*pattern=*/1, /*inputs_only=*/i != indices[0],
                            /*resident=*/true));
  }
  auto r = RunCalls(cand_program_, cand_calls_[set], std::move(sets), &sampling);
  if (!RunSucceeded(r)) {
    EndRunFailure(v1::STAGE_BENCHMARK, t0, r);
    return false;
  }
  const auto& run = r.response.run();
  if (!Check(set, indices[run.last_set()], r, /*pattern=*/1, "stale")) {
    const auto& e = res_.errors();
    EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_WRONG_ANSWER,
             absl::StrCat(e.check(), ": the last timed run left wrong results in ", e.buffer(),
                          " (size set ", e.size_set(), "): ", e.mismatches(), " elements wrong"));
    return false;
  }
  samples->assign(run.samples_seconds().begin(), run.samples_seconds().end());
  *raced = run.raced();
  return true;
}

}  // namespace kforge::worker
