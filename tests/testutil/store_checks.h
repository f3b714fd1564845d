#pragma once

// Assertions about what a store holds, shared by the coordinator's tests.

#include <set>
#include <string>

#include "common/store/store.h"
#include "gtest/gtest.h"

namespace kforge::testing {

// Every candidate of the job has exactly one evaluation, and there is no other evaluation.
inline void ExpectOneEvaluationPerCandidate(Store& store, const std::string& job_id) {
  auto cands = store.ListCandidates(job_id);
  auto evals = store.ListEvaluations(job_id);
  ASSERT_TRUE(cands.ok() && evals.ok());
  std::multiset<std::string> evaluated;
  for (const auto& e : *evals) evaluated.insert(e.candidate_id());
  for (const auto& c : *cands) EXPECT_EQ(evaluated.count(c.id()), 1u) << job_id << " " << c.id();
  EXPECT_EQ(cands->size(), evals->size()) << job_id;
}

}  // namespace kforge::testing
