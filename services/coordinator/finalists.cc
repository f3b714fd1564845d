#include "services/coordinator/finalists.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace kforge::coordinator {

std::string ConfirmedWinner(const v1::Confirmation& c, const EvolutionEngine& engine) {
  if (c.finalists_size() == 0) return "";
  const v1::FinalistTiming& first = c.finalists(0);
  if (first.outcome() != v1::OUTCOME_OK || engine.Find(first.candidate_id()) == nullptr) return "";
  return first.candidate_id();
}

std::string ReusedFromOneJob(const std::vector<const Member*>& finalists) {
  if (finalists.empty()) return "";
  const std::string& from = finalists.front()->result.reused_from_job();
  for (const Member* m : finalists) {
    if (m->result.reused_from_job() != from) return "";
  }
  return from;
}

bool SameFinalists(const v1::Confirmation& c, const std::vector<const Member*>& top) {
  if (c.finalists_size() == 0 || c.finalists_size() != static_cast<int>(top.size())) return false;
  std::set<std::string> measured;
  for (const auto& f : c.finalists()) measured.insert(f.candidate_id());
  for (const Member* m : top) {
    if (!measured.contains(m->candidate.id())) return false;
  }
  return true;
}

std::string ConfirmationName(const std::string& job_id, int64_t evaluations, bool final) {
  return absl::StrFormat("%s-confirm%06d%s", job_id, evaluations, final ? "e" : "c");
}

std::optional<ConfirmationOutcome> ConfirmationFrom(const v1::EvaluationResult& r, bool final,
                                                    int64_t sent_at,
                                                    const EvolutionEngine& engine) {
  const bool failed = r.outcome() != v1::OUTCOME_OK || !r.has_confirmation() ||
                      r.confirmation().finalists_size() == 0;
  if (failed && !final) return std::nullopt;
  ConfirmationOutcome out;
  v1::Confirmation& c = out.confirmation;
  if (failed) {
    // The job still ends, with the best as the search measured it, and says why (with no
    // interval: an earlier checkpoint's need not be of the best now).
    c.set_note(absl::StrCat(
        "the finalists were not re-measured: ",
        r.outcome() == v1::OUTCOME_OK ? "the worker does not re-measure finalists" : r.message()));
  } else {
    c = r.confirmation();
    for (auto& f : *c.mutable_finalists()) {
      if (const Member* m = engine.Find(f.candidate_id())) f.set_first_speedup(m->fitness);
    }
    out.best = ConfirmedWinner(c, engine);
    const Member* best = engine.best();
    if (!out.best.empty() && best != nullptr && out.best != best->candidate.id()) {
      const v1::FinalistTiming& first = c.finalists(0);
      std::string note = c.note();
      absl::StrAppend(
          &note, note.empty() ? "" : "; ", "re-ranked: ", out.best,
          absl::StrFormat(" (%.3gx, first measured %.3gx) is faster than ", first.speedup(),
                          first.first_speedup()),
          best->candidate.id(),
          absl::StrFormat(" (first measured %.3gx) when timed side by side", best->fitness));
      c.set_note(note);
    }
  }
  c.set_evaluations(sent_at);
  c.set_worker_id(r.worker_id());
  return out;
}

namespace {

// The speedup interval of one size set's timing: the candidate's median interval against the
// reference's (its median alone when `same_reference`: the noise of a timing both share cancels).
struct SetInterval {
  double low = 0;
  double high = 0;
};
SetInterval SpeedupInterval(const v1::SizeSetTiming& t, bool same_reference) {
  const v1::TimingStats& ref = t.reference();
  const v1::TimingStats& cand = t.candidate();
  const double ref_low = same_reference ? ref.median_seconds() : ref.median_low_seconds();
  const double ref_high = same_reference ? ref.median_seconds() : ref.median_high_seconds();
  if (cand.median_low_seconds() <= 0 || cand.median_high_seconds() <= 0 || ref_low <= 0) return {};
  return {ref_low / cand.median_high_seconds(), ref_high / cand.median_low_seconds()};
}

// (p80 - p20) / median: how noisy one measurement was (0 when it has no median).
double Spread(const v1::TimingStats& t) {
  return t.median_seconds() > 0 ? (t.p80_seconds() - t.p20_seconds()) / t.median_seconds() : 0;
}

const v1::SizeSetTiming* TimingOf(const v1::EvaluationResult& r, const std::string& size_set) {
  for (const auto& t : r.timings()) {
    if (t.size_set() == size_set) return &t;
  }
  return nullptr;
}

// Whether `best` is faster than `other` beyond both intervals (and the drift margin) on every size
// set best was timed on.
bool SeparatedOnEverySet(const v1::EvaluationResult& best, const v1::EvaluationResult& other) {
  if (best.timings_size() == 0) return false;
  for (const v1::SizeSetTiming& b : best.timings()) {
    const v1::SizeSetTiming* o = TimingOf(other, b.size_set());
    // Fewer than 5 samples of the best: its interval is its range, too narrow to stand on.
    if (o == nullptr || b.candidate().samples() < 5) return false;
    const bool same_reference = best.worker_id() == other.worker_id() &&
                                b.reference().SerializeAsString() == o->reference().SerializeAsString();
    const SetInterval bi = SpeedupInterval(b, same_reference);
    const SetInterval oi = SpeedupInterval(*o, same_reference);
    if (bi.low <= 0 || oi.high <= 0 || bi.low <= oi.high * (1 + kDriftMargin)) return false;
  }
  return true;
}

}  // namespace

std::vector<const Member*> Contenders(const std::vector<const Member*>& finalists) {
  if (finalists.size() < 2) return finalists;
  const v1::EvaluationResult& best = finalists.front()->result;
  for (const Member* m : finalists) {
    const v1::EvaluationResult& r = m->result;
    if (r.outcome() != v1::OUTCOME_OK || !r.reused_from_job().empty() ||
        r.device().device_class() != best.device().device_class()) {
      return finalists;
    }
  }
  std::vector<const Member*> out = {finalists.front()};
  for (size_t i = 1; i < finalists.size(); ++i) {
    if (!SeparatedOnEverySet(best, finalists[i]->result)) out.push_back(finalists[i]);
  }
  return out;
}

v1::FinalistTiming BenchmarkedFinalist(const Member& m) {
  const v1::EvaluationResult& r = m.result;
  v1::FinalistTiming f;
  f.set_candidate_id(m.candidate.id());
  f.set_outcome(v1::OUTCOME_OK);
  f.set_speedup(r.speedup());
  f.set_first_speedup(m.fitness);
  double log_low = 0, log_high = 0, noise = 0;
  int sets = 0;
  for (const v1::SizeSetTiming& t : r.timings()) {
    const SetInterval i = SpeedupInterval(t, /*same_reference=*/false);
    if (i.low <= 0) continue;
    log_low += std::log(i.low);
    log_high += std::log(i.high);
    noise += Spread(t.candidate());
    ++sets;
  }
  if (sets > 0) {
    f.set_speedup_low(std::exp(log_low / sets));
    f.set_speedup_high(std::exp(log_high / sets));
    f.set_noise(noise / sets);
  }
  return f;
}

std::optional<ConfirmationOutcome> BenchmarkConfirmation(const std::vector<const Member*>& finalists,
                                                         int64_t evaluations) {
  if (finalists.size() < 2 || Contenders(finalists).size() != 1) return std::nullopt;
  const v1::EvaluationResult& best = finalists.front()->result;
  ConfirmationOutcome out;
  v1::Confirmation& c = out.confirmation;
  for (const Member* m : finalists) *c.add_finalists() = BenchmarkedFinalist(*m);
  c.set_reference_noise(Spread(best.timings(0).reference()));
  c.set_separated(true);
  c.set_note(absl::StrCat("not re-measured: the finalists' own benchmarks already rank ", finalists.front()->candidate.id(),
                          " first beyond their ~95% intervals"));
  c.set_evaluations(evaluations);
  c.set_worker_id(best.worker_id());
  *c.mutable_device() = best.device();
  out.best = finalists.front()->candidate.id();
  return out;
}

std::optional<ConfirmationOutcome> BorrowedConfirmation(const v1::Job& earlier,
                                                        const std::vector<const Member*>& finalists,
                                                        const std::string& device_class,
                                                        int64_t evaluations,
                                                        const EvolutionEngine& engine) {
  if (finalists.empty() || !earlier.has_confirmation()) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> renames;  // its candidate ids -> ours
  for (const Member* m : finalists) {
    if (m->result.reused_from_job() != earlier.id()) return std::nullopt;
    renames.emplace_back(m->result.reused_from_candidate(), m->candidate.id());
  }
  ConfirmationOutcome out;
  v1::Confirmation& c = out.confirmation;
  c = earlier.confirmation();
  if (c.finalists_size() != static_cast<int>(renames.size()) ||
      c.device().device_class() != device_class) {
    return std::nullopt;
  }
  for (auto& f : *c.mutable_finalists()) {
    auto it = std::find_if(renames.begin(), renames.end(),
                           [&](const auto& r) { return r.first == f.candidate_id(); });
    if (it == renames.end()) return std::nullopt;  // it re-measured other candidates
    f.set_candidate_id(it->second);
  }
  c.set_note(absl::StrReplaceAll(c.note(), renames));
  c.set_reused_from_job(earlier.id());
  c.set_evaluations(evaluations);
  out.best = ConfirmedWinner(c, engine);
  return out;
}

}  // namespace kforge::coordinator
