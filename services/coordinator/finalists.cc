#include "services/coordinator/finalists.h"

#include <algorithm>
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
