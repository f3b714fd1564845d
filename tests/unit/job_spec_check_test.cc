// CheckJobSpec: every number of a job spec bounded and finite at submit, with the field named.

#include "services/coordinator/job_spec_check.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kforge::coordinator {
namespace {

v1::JobSpec Valid() {
  v1::JobSpec spec;
  spec.mutable_budget()->set_max_candidates(100);
  return spec;
}

struct Case {
  std::string field;  // what the error must name
  std::function<void(v1::JobSpec&)> set;
};

TEST(JobSpecCheckTest, EveryOutOfBoundsNumberIsRefusedNamingItsField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {"evolution.islands", [](v1::JobSpec& s) { s.mutable_evolution()->set_islands(2147483647); }},
      {"evolution.islands", [](v1::JobSpec& s) { s.mutable_evolution()->set_islands(-1); }},
      {"evolution.warmup_explore", [](v1::JobSpec& s) { s.mutable_evolution()->set_warmup_explore(2147483647); }},
      {"evolution.migration_interval",
       [](v1::JobSpec& s) { s.mutable_evolution()->set_migration_interval(-2147483647 - 1); }},
      {"evolution.max_in_flight", [](v1::JobSpec& s) { s.mutable_evolution()->set_max_in_flight(2000000000); }},
      {"evolution.exploit_ratio", [=](v1::JobSpec& s) { s.mutable_evolution()->set_exploit_ratio(nan); }},
      {"evolution.explore_ratio", [=](v1::JobSpec& s) { s.mutable_evolution()->set_explore_ratio(inf); }},
      {"evolution.crossover_ratio", [](v1::JobSpec& s) { s.mutable_evolution()->set_crossover_ratio(1.5); }},
      {"evolution.llm_probability", [](v1::JobSpec& s) { s.mutable_evolution()->set_llm_probability(-5); }},
      {"evolution.screen_children", [](v1::JobSpec& s) { s.mutable_evolution()->set_screen_children(100000); }},
      {"exploit_ratio + explore_ratio", [](v1::JobSpec& s) {
         s.mutable_evolution()->set_exploit_ratio(0.7);
         s.mutable_evolution()->set_explore_ratio(0.7);
       }},
      {"priority", [](v1::JobSpec& s) { s.set_priority(-2147483647 - 1); }},
      {"budget.max_candidates", [](v1::JobSpec& s) { s.mutable_budget()->set_max_candidates(-1); }},
      {"budget.max_candidates", [](v1::JobSpec& s) { s.mutable_budget()->set_max_candidates(int64_t{1} << 40); }},
      {"budget.max_wall_seconds", [=](v1::JobSpec& s) { s.mutable_budget()->set_max_wall_seconds(nan); }},
      {"budget.max_wall_seconds", [=](v1::JobSpec& s) { s.mutable_budget()->set_max_wall_seconds(-inf); }},
      {"budget.max_llm_cost_usd", [=](v1::JobSpec& s) { s.mutable_budget()->set_max_llm_cost_usd(nan); }},
      {"budget.max_llm_tokens", [](v1::JobSpec& s) { s.mutable_budget()->set_max_llm_tokens(-3); }},
      {"budget.target_speedup", [=](v1::JobSpec& s) { s.mutable_budget()->set_target_speedup(inf); }},
      {"budget.patience", [](v1::JobSpec& s) { s.mutable_budget()->set_patience(-1); }},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = Valid();
    c.set(spec);
    const absl::Status st = CheckJobSpec(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << c.field << ": " << st;
    EXPECT_NE(st.message().find(c.field), absl::string_view::npos) << st.message();
  }
}

TEST(JobSpecCheckTest, ANanWallTimeIsNoBudget) {
  v1::JobSpec spec;
  spec.mutable_budget()->set_max_wall_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_TRUE(absl::IsInvalidArgument(CheckJobSpec(spec)));
  spec.mutable_budget()->set_max_wall_seconds(0);
  const absl::Status none = CheckJobSpec(spec);
  EXPECT_NE(none.message().find("needs a budget"), absl::string_view::npos) << none;
}

TEST(JobSpecCheckTest, SpecsWithinBoundsPass) {
  v1::JobSpec spec = Valid();
  spec.mutable_evolution()->set_islands(kMaxIslands);
  spec.mutable_evolution()->set_max_in_flight(64);
  spec.mutable_evolution()->set_llm_probability(1);
  spec.mutable_evolution()->set_exploit_ratio(0.5);
  spec.mutable_evolution()->set_explore_ratio(0.5);
  spec.set_priority(-kMaxPriority);
  spec.mutable_budget()->set_max_wall_seconds(3600);
  EXPECT_TRUE(CheckJobSpec(spec).ok()) << CheckJobSpec(spec);
  EXPECT_TRUE(CheckJobSpec(Valid()).ok());
}

}  // namespace
}  // namespace kforge::coordinator
