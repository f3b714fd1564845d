#include "services/coordinator/job_spec_check.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kforge::coordinator {

namespace {

constexpr int64_t kMaxCandidates = 10'000'000;
constexpr double kMaxWallSeconds = 90.0 * 24 * 3600;  // 90 days
constexpr int64_t kMaxLlmTokens = int64_t{1'000'000'000'000};
constexpr double kMaxLlmCostUsd = 1e6;
constexpr double kMaxTargetSpeedup = 1e6;
constexpr int64_t kMaxMigrationInterval = 1'000'000;
constexpr int64_t kMaxWarmupExplore = 100'000;

absl::Status IntIn(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, " must be in [", lo, ", ", hi, "], got ", value));
}

absl::Status RealIn(absl::string_view field, double value, double lo, double hi) {
  if (!std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat("spec.", field, " must be a finite number, got ", value));
  }
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, " must be in [", lo, ", ", hi, "], got ", value));
}

}  // namespace

absl::Status CheckJobSpec(const v1::JobSpec& spec) {
  const v1::Budget& b = spec.budget();
  KF_RETURN_IF_ERROR(IntIn("budget.max_candidates", b.max_candidates(), 0, kMaxCandidates));
  KF_RETURN_IF_ERROR(RealIn("budget.max_wall_seconds", b.max_wall_seconds(), 0, kMaxWallSeconds));
  KF_RETURN_IF_ERROR(IntIn("budget.max_llm_tokens", b.max_llm_tokens(), 0, kMaxLlmTokens));
  KF_RETURN_IF_ERROR(RealIn("budget.max_llm_cost_usd", b.max_llm_cost_usd(), 0, kMaxLlmCostUsd));
  KF_RETURN_IF_ERROR(RealIn("budget.target_speedup", b.target_speedup(), 0, kMaxTargetSpeedup));
  KF_RETURN_IF_ERROR(IntIn("budget.patience", b.patience(), 0, kMaxCandidates));
  if (b.max_candidates() == 0 && b.max_wall_seconds() == 0 && b.target_speedup() == 0 && b.patience() == 0) {
    return absl::InvalidArgumentError(
        "a job needs a budget: spec.budget.max_candidates, max_wall_seconds, target_speedup or patience");
  }
  const v1::EvolutionConfig& e = spec.evolution();
  KF_RETURN_IF_ERROR(IntIn("evolution.islands", e.islands(), 0, kMaxIslands));
  KF_RETURN_IF_ERROR(IntIn("evolution.migration_interval", e.migration_interval(), 0, kMaxMigrationInterval));
  KF_RETURN_IF_ERROR(IntIn("evolution.max_in_flight", e.max_in_flight(), 0, kMaxInFlightPerJob));
  KF_RETURN_IF_ERROR(RealIn("evolution.exploit_ratio", e.exploit_ratio(), 0, 1));
  KF_RETURN_IF_ERROR(RealIn("evolution.explore_ratio", e.explore_ratio(), 0, 1));
  if (e.exploit_ratio() + e.explore_ratio() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("spec.evolution.exploit_ratio + explore_ratio must be at most 1, got ",
                                                   e.exploit_ratio() + e.explore_ratio()));
  }
  KF_RETURN_IF_ERROR(RealIn("evolution.llm_probability", e.llm_probability(), 0, 1));
  KF_RETURN_IF_ERROR(IntIn("evolution.warmup_explore", e.warmup_explore(), 0, kMaxWarmupExplore));
  KF_RETURN_IF_ERROR(RealIn("evolution.crossover_ratio", e.crossover_ratio(), 0, 1));
  KF_RETURN_IF_ERROR(IntIn("evolution.screen_children", e.screen_children(), 0, kMaxScreenChildren));
  KF_RETURN_IF_ERROR(IntIn("priority", spec.priority(), -kMaxPriority, kMaxPriority));
  return absl::OkStatus();
}

}  // namespace kforge::coordinator
