// Re-measuring a job's finalists side by side (Evaluator::ConfirmOnce): each finalist is validated
// again, then every round times the reference and each finalist in turn in one sandbox, so that
// drift and load hit them alike; a finalist's speedup is the median of its per-round speedups,
// each against the reference timed next to it.

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/gpu-worker/evaluator_run.h"
#include "services/gpu-worker/sample_stats.h"

namespace kforge::worker {

namespace {

void Fail(v1::EvaluationResult& res, v1::Outcome outcome, const std::string& message) {
  res.set_outcome(outcome);
  res.set_message(message);
}

}  // namespace

void Evaluator::ConfirmOnce(const v1::EvaluationRequest& req, const std::string& problem_key,
                            v1::EvaluationResult& res) {
  BackendState& st = StateFor(req.problem().backend());
  std::lock_guard<std::mutex> lock(st.mu);
  const int64_t sent = st.sandbox->bytes_sent(), received = st.sandbox->bytes_received();
  const int n = req.confirm().finalists_size();
  const int rounds = req.confirm().rounds() > 0 ? req.confirm().rounds() : 9;

  // One sub-request, result and Run per finalist; a Run is rebuilt when the sandbox restarted
  // (its compiled program went with the old process).
  std::vector<v1::EvaluationRequest> sub(n);
  std::vector<v1::EvaluationResult> sub_res(n);
  std::vector<std::unique_ptr<Run>> runs(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    sub[i] = req;
    sub[i].clear_confirm();
    *sub[i].mutable_candidate() = req.confirm().finalists(i);
  }
  auto prepare = [&](int i) {
    sub_res[i].Clear();
    sub_res[i].set_candidate_id(sub[i].candidate().id());
    runs[i] = std::make_unique<Run>(*this, st, sub[i], problem_key, sub_res[i]);
    alive[i] = runs[i]->Prepare();
  };
  // Prepares every live finalist in the current sandbox; false if it restarted meanwhile (a
  // finalist crashed it), in which case the survivors are prepared again.
  auto prepare_all = [&] {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int generation = st.sandbox->generation();
      for (int i = 0; i < n; ++i) {
        if (alive[i]) prepare(i);
      }
      if (st.sandbox->generation() == generation) return true;
    }
    return false;
  };
  if (!prepare_all()) {
    Fail(res, v1::OUTCOME_INFRA_ERROR, "the sandbox kept restarting while the finalists were prepared");
    return;
  }
  // A round's sampling of the reference, which normalises the finalists' times of that round:
  // about the device time the finalists take in it (2 samples at least, confirm_samples at most:
  // the reference's noise is the smallest in a round), so that a reference much slower than the
  // kernels it judges does not dominate the rounds.
  auto reference_sampling = [&](const Run& ref_run, int set) {
    Run::Sampling s = ref_run.RoundSampling(set, /*reference=*/true);
    double finalists = 0;  // one run of each
    for (int i = 0; i < n; ++i) {
      if (alive[i] && runs[i] != nullptr) finalists += runs[i]->RunSeconds(set);
    }
    const double ref = ref_run.ReferenceRunSeconds(set);
    if (finalists <= 0 || ref <= 0) return s;
    const double fit = std::ceil(finalists * ref_run.RoundSampling(set, /*reference=*/false).max_samples / ref);
    s.max_samples = s.min_samples = static_cast<int>(
        std::clamp(fit, static_cast<double>(std::min(2, s.max_samples)), static_cast<double>(s.max_samples)));
    return s;
  };
  std::vector<int> bench_sets;
  for (int s = 0; s < req.problem().size_sets_size(); ++s) {
    if (req.problem().size_sets(s).bench()) bench_sets.push_back(s);
  }
  std::vector<std::vector<double>> speedups(n), noises(n);
  std::vector<double> ref_noise;
  int restarts = 0;
  for (int r = 0; r < rounds;) {
    const auto lead = std::find(alive.begin(), alive.end(), true);
    if (lead == alive.end()) break;
    Run& ref_run = *runs[lead - alive.begin()];
    const int generation = st.sandbox->generation();
    std::vector<double> log_sum(n, 0), noise_sum(n, 0), round_ref_noise;
    std::vector<bool> timed(n, false);
    bool restarted = false;
    for (int set : bench_sets) {
      auto indices = ref_run.BenchIndices(set);
      absl::StatusOr<std::vector<double>> ref =
          indices.ok() ? ref_run.TimeReference(set, *indices, reference_sampling(ref_run, set))
                       : indices.status();
      if (!ref.ok()) {
        Fail(res, v1::OUTCOME_INFRA_ERROR, absl::StrCat("re-measuring the finalists: ", ref.status().message()));
        return;
      }
      const double ref_median = Median(*ref);
      round_ref_noise.push_back(RelativeSpread(*ref));
      // The finalists' order rotates with the round, so that none is always timed first.
      for (int k = 0; k < n && !restarted; ++k) {
        const int i = (k + r) % n;
        if (!alive[i]) continue;
        std::vector<double> samples;
        bool raced = false;
        if (!runs[i]->TimeCandidate(set, *indices, runs[i]->RoundSampling(set, /*reference=*/false),
                                    clock_.MonotonicSeconds(), &samples, &raced)) {
          alive[i] = false;  // it failed again: out of the ranking, with its reason
          restarted = st.sandbox->generation() != generation;
          continue;
        }
        const double median = Median(samples);
        log_sum[i] += median > 0 && ref_median > 0 ? std::log(ref_median / median) : 0;
        noise_sum[i] += RelativeSpread(samples);
        timed[i] = true;
      }
      if (restarted) break;
    }
    if (restarted) {
      // The programs of the others went with the old sandbox: prepare them again, redo the round.
      if (++restarts > 3 || !prepare_all()) {
        Fail(res, v1::OUTCOME_INFRA_ERROR, "the sandbox kept restarting while the finalists were timed");
        return;
      }
      continue;
    }
    ref_noise.insert(ref_noise.end(), round_ref_noise.begin(), round_ref_noise.end());  // a redone round's do not count
    for (int i = 0; i < n; ++i) {
      if (!alive[i] || !timed[i] || bench_sets.empty()) continue;
      speedups[i].push_back(std::exp(log_sum[i] / static_cast<double>(bench_sets.size())));
      noises[i].push_back(noise_sum[i] / static_cast<double>(bench_sets.size()));
    }
    ++r;
  }

  v1::Confirmation& c = *res.mutable_confirmation();
  c.set_worker_id(options_.worker_id);
  c.set_reference_noise(Median(ref_noise));
  for (int i = 0; i < n; ++i) {
    v1::FinalistTiming& f = *c.add_finalists();
    f.set_candidate_id(sub[i].candidate().id());
    if (!alive[i] || speedups[i].empty()) {
      f.set_outcome(sub_res[i].outcome() == v1::OUTCOME_OK || sub_res[i].outcome() == v1::OUTCOME_UNSPECIFIED
                        ? v1::OUTCOME_INFRA_ERROR
                        : sub_res[i].outcome());
      f.set_message(sub_res[i].message().empty() ? "not timed" : sub_res[i].message());
      continue;
    }
    const MedianInterval m = MedianWithInterval(speedups[i]);
    f.set_outcome(v1::OUTCOME_OK);
    f.set_speedup(m.median);
    f.set_speedup_low(m.low);
    f.set_speedup_high(m.high);
    f.set_noise(Median(noises[i]));
    f.set_rounds(static_cast<int32_t>(speedups[i].size()));
    if (!res.has_device()) *res.mutable_device() = sub_res[i].device();
  }
  std::stable_sort(c.mutable_finalists()->begin(), c.mutable_finalists()->end(),
                   [](const v1::FinalistTiming& a, const v1::FinalistTiming& b) {
                     const bool a_ok = a.outcome() == v1::OUTCOME_OK, b_ok = b.outcome() == v1::OUTCOME_OK;
                     if (a_ok != b_ok) return a_ok;
                     return a.speedup() > b.speedup();
                   });
  *c.mutable_device() = res.device();
  int ok = 0;
  bool separated = true;
  std::string overlap;
  for (const auto& f : c.finalists()) {
    if (f.outcome() != v1::OUTCOME_OK) continue;
    if (ok++ > 0 && f.speedup_high() >= c.finalists(0).speedup_low()) {
      separated = false;
      absl::StrAppend(&overlap, overlap.empty() ? "" : ", ", f.candidate_id(),
                      absl::StrFormat(" %.3gx [%.3g, %.3g]", f.speedup(), f.speedup_low(), f.speedup_high()));
    }
  }
  if (ok == 0) {
    Fail(res, c.finalists(0).outcome(), absl::StrCat("no finalist passed again: ", c.finalists(0).message()));
    return;
  }
  c.set_separated(separated);
  if (!separated) {
    const auto& first = c.finalists(0);
    c.set_note(absl::StrCat("the machine was too noisy to separate the finalists: the first, ", first.candidate_id(),
                            absl::StrFormat(" %.3gx [%.3g, %.3g]", first.speedup(), first.speedup_low(),
                                            first.speedup_high()),
                            ", overlaps ", overlap));
  }
  res.set_outcome(v1::OUTCOME_OK);
  res.set_speedup(c.finalists(0).speedup());
  res.set_sandbox_bytes_sent(st.sandbox->bytes_sent() - sent);
  res.set_sandbox_bytes_received(st.sandbox->bytes_received() - received);
  st.TrimHeld(problem_key, options_.max_held_bytes);
}

}  // namespace kforge::worker
