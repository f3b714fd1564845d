// The evolution engine on synthetic candidates and results: determinism of parent selection,
// the mutation seed, best tracking, damping of prolific parents, ring migration and the seed's
// place on every island.

#include "services/coordinator/evolution_engine.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge::coordinator {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

v1::Candidate Cand(const std::string& id, int64_t seq, int island, std::map<std::string, int64_t> params,
                   v1::MutatorKind kind = v1::MUTATOR_KIND_PARAMETRIC, std::vector<std::string> parents = {}) {
  v1::Candidate c;
  c.set_id(id);
  c.set_job_id("job");
  c.set_sequence(seq);
  c.set_island(island);
  c.set_mutator(kind);
  for (const auto& [k, v] : params) (*c.mutable_params())[k] = v;
  for (const auto& p : parents) c.add_parent_ids(p);
  return c;
}

v1::EvaluationResult Ok(const std::string& id, double speedup) {
  v1::EvaluationResult r;
  r.set_job_id("job");
  r.set_candidate_id(id);
  r.set_outcome(v1::OUTCOME_OK);
  r.set_speedup(speedup);
  return r;
}

v1::EvaluationResult Failed(const std::string& id, v1::Outcome outcome = v1::OUTCOME_COMPILE_ERROR) {
  v1::EvaluationResult r;
  r.set_job_id("job");
  r.set_candidate_id(id);
  r.set_outcome(outcome);
  return r;
}

// A printable digest of a selection, for comparing two engines.
std::string Describe(const Selection& s) {
  std::vector<std::string> parents, insp;
  for (const Member* m : s.parents) parents.push_back(m->candidate.id());
  for (const Member* m : s.inspirations) insp.push_back(m->candidate.id());
  return absl::StrCat("island=", s.island, " strategy=", s.strategy, " parents=[", absl::StrJoin(parents, ","),
                      "] inspirations=[", absl::StrJoin(insp, ","), "]");
}

// One synthetic evaluation: what a job would feed the engine.
struct Event {
  v1::Candidate candidate;
  v1::EvaluationResult result;
};

// A synthetic ingest sequence that does not depend on any engine: a seed, then candidates on
// round-robin islands with random knobs, random parents among earlier ids, ~25% failures.
std::vector<Event> SyntheticFeed(uint64_t feed_seed, int n, int islands) {
  std::mt19937_64 rng(feed_seed);
  std::uniform_int_distribution<int64_t> knob(0, 15);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<Event> out;
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) {
    const std::string id = absl::StrCat("c", i);
    Event e;
    const std::map<std::string, int64_t> params = {{"A", knob(rng)}, {"B", knob(rng)}, {"C", knob(rng)}};
    if (i == 0) {
      e.candidate = Cand(id, 0, 0, params, v1::MUTATOR_KIND_SEED);
      e.result = Ok(id, 1.0);
    } else {
      std::vector<std::string> parents = {ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)]};
      if (u(rng) < 0.1) parents.push_back(ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)]);
      e.candidate = Cand(id, i, i % islands, params, v1::MUTATOR_KIND_PARAMETRIC, parents);
      e.result = u(rng) < 0.25 ? Failed(id) : Ok(id, 0.2 + 3.0 * u(rng));
    }
    ids.push_back(id);
    out.push_back(std::move(e));
  }
  return out;
}

// Feeds `feed` into the engine, calling Select(k) before ingesting candidate k (k >= 1), the way
// the job runner does with one slot; returns the selections' digests.
std::vector<std::string> Replay(EvolutionEngine& engine, const std::vector<Event>& feed) {
  std::vector<std::string> out;
  for (size_t k = 0; k < feed.size(); ++k) {
    if (k > 0) out.push_back(Describe(engine.Select(static_cast<int64_t>(k))));
    engine.Ingest(feed[k].candidate, feed[k].result);
  }
  return out;
}

// A closed loop, as in a job: the seed c0 (A=3, B=3), then children c1..c(n-1), each with its
// selection's parents' knobs (the last parent's win) and A and B moved by -2..2 from the
// proposal's mutation seed, evaluated by `evaluate` (which may draw from that seed too). Returns
// each selection's digest and the search's lead after its child.
using Evaluate = std::function<v1::EvaluationResult(const std::string& id, std::map<std::string, int64_t>& params,
                                                    std::mt19937_64& rng)>;
std::vector<std::string> ClosedLoop(EvolutionEngine& e, const v1::EvaluationResult& seed_result, int n,
                                    const Evaluate& evaluate) {
  std::vector<std::string> trace;
  e.Ingest(Cand("c0", 0, 0, {{"A", 3}, {"B", 3}}, v1::MUTATOR_KIND_SEED), seed_result);
  for (int64_t k = 1; k < n; ++k) {
    Selection s = e.Select(k);
    std::mt19937_64 rng(e.MutationSeed(k));
    std::vector<std::string> parents;
    std::map<std::string, int64_t> params = {{"A", 0}, {"B", 0}};
    for (const Member* m : s.parents) {
      parents.push_back(m->candidate.id());
      for (const auto& [key, v] : m->candidate.params()) params[key] = v;
    }
    params["A"] += static_cast<int64_t>(rng() % 5) - 2;
    params["B"] += static_cast<int64_t>(rng() % 5) - 2;
    const std::string id = absl::StrCat("c", k);
    v1::EvaluationResult r = evaluate(id, params, rng);
    e.Ingest(Cand(id, k, s.island, params, v1::MUTATOR_KIND_PARAMETRIC, parents), r);
    trace.push_back(absl::StrCat(Describe(s), " lead=", e.lead()->candidate.id()));
  }
  return trace;
}

EngineOptions Opts(int islands = 3, int migration_interval = 10) {
  EngineOptions o;
  o.islands = islands;
  o.migration_interval = migration_interval;
  o.budget = 200;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Determinism.

TEST(EvolutionEngineTest, SameSeedAndInputsGiveTheSameSelections) {
  for (uint64_t feed_seed = 1; feed_seed <= 12; ++feed_seed) {
    for (int islands : {1, 2, 3}) {
      const auto feed = SyntheticFeed(feed_seed, 150, islands);
      const uint64_t seed = feed_seed * 7919;
      EvolutionEngine a(seed, Opts(islands, 7));
      EvolutionEngine b(seed, Opts(islands, 7));
      const auto sa = Replay(a, feed);
      const auto sb = Replay(b, feed);
      ASSERT_EQ(sa, sb) << "feed " << feed_seed << " islands " << islands;
      EXPECT_EQ(a.best()->candidate.id(), b.best()->candidate.id());
      EXPECT_EQ(a.migrations(), b.migrations());
      for (int i = 0; i < islands; ++i) EXPECT_EQ(a.IslandMemberIds(i), b.IslandMemberIds(i));
    }
  }
}

TEST(EvolutionEngineTest, ClosedLoopIsDeterministic) {
  // The children depend on the selections (parents, island) and the mutation seed, as in a job.
  auto run = [](uint64_t seed) {
    EvolutionEngine e(seed, Opts(2, 5));
    return ClosedLoop(e, Ok("c0", 1.0), 120, [](const std::string& id, std::map<std::string, int64_t>& params,
                                                 std::mt19937_64& rng) {
      const double speed = 4.0 / (1.0 + 0.1 * std::abs(params["A"] - 9) + 0.1 * std::abs(params["B"] + 4));
      return rng() % 5 == 0 ? Failed(id) : Ok(id, speed);
    });
  };
  const auto a = run(5);
  EXPECT_EQ(a, run(5));
  EXPECT_NE(a, run(6));
}

// A timed device: each candidate's fitness is measured with noise, within the interval its result
// carries. Two runs whose measurements differ only by that noise choose the same parents and
// inspirations throughout (members noise cannot tell apart are taken in candidate order), while
// the same values without intervals (taken at face value) do not: the noise would decide.
TEST(EvolutionEngineTest, MeasurementsThatDifferOnlyByTheirNoiseGiveTheSameSelections) {
  auto timed_ok = [](const std::string& id, double speedup, double rel, bool intervals) {
    v1::EvaluationResult r = Ok(id, speedup);
    auto* t = r.add_timings();
    t->set_size_set("main");
    t->set_speedup(speedup);
    auto* c = t->mutable_candidate();
    c->set_median_seconds(1e-3 / speedup);
    c->set_samples(10);
    if (intervals) {
      c->set_median_low_seconds(c->median_seconds() * (1 - rel));
      c->set_median_high_seconds(c->median_seconds() * (1 + rel));
    }
    return r;
  };
  auto run = [&](uint64_t noise_seed, bool intervals) {
    EvolutionEngine e(5, Opts(2, 5));
    std::mt19937_64 noise(noise_seed);
    std::uniform_real_distribution<double> jitter(-0.015, 0.015);
    return ClosedLoop(e, timed_ok("c0", 1.0, 0.02, intervals), 150,
                      [&](const std::string& id, std::map<std::string, int64_t>& params, std::mt19937_64&) {
                        // Plateaus 25% apart: many candidates equally fast, each level far beyond the noise.
                        const int64_t level = std::clamp<int64_t>(
                            6 - (std::abs(params["A"] - 9) + std::abs(params["B"] + 4)) / 3, 0, 6);
                        const double measured = std::pow(1.25, static_cast<double>(level)) * (1 + jitter(noise));
                        return timed_ok(id, measured, 0.02, intervals);
                      });
  };
  const auto first = run(1, true);
  for (uint64_t noise_seed : {2, 3, 4}) {
    const auto again = run(noise_seed, true);
    ASSERT_EQ(first.size(), again.size());
    for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(first[i], again[i]) << "proposal " << i + 1 << ", noise " << noise_seed;
  }
  EXPECT_NE(run(1, false), run(2, false)) << "without intervals the noise should have decided somewhere";
}

// What noise cannot separate is ordered by candidate; what it can, by fitness.
TEST(EvolutionEngineTest, OrderBeyondNoiseTakesTiesInCandidateOrder) {
  auto member = [](int64_t seq, double f, double rel) {
    Member m;
    m.candidate.set_id(absl::StrCat("m", seq));
    m.candidate.set_sequence(seq);
    m.fitness = f;
    if (rel > 0) {
      m.fitness_low = f * (1 - rel);
      m.fitness_high = f * (1 + rel);
    }
    return m;
  };
  const Member a = member(1, 1.00, 0.02), b = member(2, 1.03, 0.02), c = member(3, 1.50, 0.02), d = member(4, 1.49, 0.02);
  std::vector<const Member*> v = {&a, &b, &c, &d};
  OrderBeyondNoise(v);
  std::vector<int64_t> seqs;
  for (const Member* m : v) seqs.push_back(m->candidate.sequence());
  EXPECT_THAT(seqs, ElementsAre(3, 4, 1, 2));
  EXPECT_TRUE(FitterBeyondNoise(c, b));
  EXPECT_FALSE(FitterBeyondNoise(b, a));  // 3% apart, within both intervals and the drift margin
  // Untimed (a replay's recorded times): the fitness alone decides.
  const Member e = member(5, 1.00, 0), f = member(6, 1.03, 0);
  EXPECT_TRUE(FitterBeyondNoise(f, e));
}

TEST(EvolutionEngineTest, DifferentSeedsDiffer) {
  const auto feed = SyntheticFeed(3, 150, 2);
  EvolutionEngine a(1, Opts(2));
  EvolutionEngine b(2, Opts(2));
  EXPECT_NE(Replay(a, feed), Replay(b, feed));
}

TEST(EvolutionEngineTest, SelectIsRepeatableAndLeavesNoTrace) {
  const auto feed = SyntheticFeed(9, 60, 2);
  EvolutionEngine a(11, Opts(2));
  EvolutionEngine b(11, Opts(2));
  for (const auto& e : feed) {
    a.Ingest(e.candidate, e.result);
    b.Ingest(e.candidate, e.result);
  }
  // Asking `a` many times (a resumed runner may re-ask) changes nothing for later answers.
  for (int64_t k = 60; k < 200; ++k) {
    const std::string first = Describe(a.Select(k));
    EXPECT_EQ(first, Describe(a.Select(k)));
    EXPECT_EQ(first, Describe(a.Select(k)));
  }
  for (int64_t k = 60; k < 200; ++k) EXPECT_EQ(Describe(a.Select(k)), Describe(b.Select(k))) << k;
}

// ---------------------------------------------------------------------------------------------
// The mutation seed.

TEST(EvolutionEngineTest, MutationSeedIsStable) {
  EvolutionEngine a(1, Opts());
  EvolutionEngine b(1, Opts(1, 3));  // options do not matter
  std::set<uint64_t> seen;
  for (int64_t k = 0; k < 500; ++k) {
    EXPECT_EQ(a.MutationSeed(k), b.MutationSeed(k));
    EXPECT_TRUE(seen.insert(a.MutationSeed(k)).second) << "repeated mutation seed at " << k;
  }
  // State does not enter it.
  const uint64_t before = a.MutationSeed(5);
  a.Ingest(Cand("c0", 0, 0, {{"A", 1}}, v1::MUTATOR_KIND_SEED), Ok("c0", 1.0));
  EXPECT_EQ(a.MutationSeed(5), before);
  // Golden values: sha256("<seed>/mutate/<sequence>"), first 64 bits. A resumed job relies on the
  // same numbers, so a change here breaks resuming jobs stored by an older build.
  EXPECT_EQ(EvolutionEngine(1, Opts()).MutationSeed(5), 0xf0c1240790615541ULL);
  EXPECT_EQ(EvolutionEngine(42, Opts()).MutationSeed(0), 0xd6dc253ddb9b5c7aULL);
  EXPECT_NE(EvolutionEngine(2, Opts()).MutationSeed(5), a.MutationSeed(5));
}

// ---------------------------------------------------------------------------------------------
// Best tracking.

TEST(EvolutionEngineTest, TracksBestAndEvaluationsSinceImprovement) {
  EvolutionEngine e(1, Opts(2));
  EXPECT_EQ(e.best(), nullptr);
  EXPECT_EQ(e.evaluations(), 0);
  EXPECT_EQ(e.since_improvement(), 0);

  // Before any ok result: no parents, explore.
  Selection s0 = e.Select(1);
  EXPECT_TRUE(s0.parents.empty());
  EXPECT_EQ(s0.strategy, "explore");

  e.Ingest(Cand("seed", 0, 0, {{"A", 1}, {"B", 1}}, v1::MUTATOR_KIND_SEED), Failed("seed", v1::OUTCOME_REJECTED));
  EXPECT_EQ(e.best(), nullptr);
  EXPECT_EQ(e.since_improvement(), 1);

  e.Ingest(Cand("a", 1, 1, {{"A", 2}, {"B", 1}}), Ok("a", 1.0));
  ASSERT_NE(e.best(), nullptr);
  EXPECT_EQ(e.best()->candidate.id(), "a");
  EXPECT_EQ(e.since_improvement(), 0);

  e.Ingest(Cand("b", 2, 0, {{"A", 3}, {"B", 1}}), Ok("b", 2.0));
  EXPECT_EQ(e.best()->candidate.id(), "b");
  EXPECT_DOUBLE_EQ(e.best()->fitness, 2.0);
  EXPECT_EQ(e.since_improvement(), 0);

  e.Ingest(Cand("c", 3, 1, {{"A", 4}, {"B", 1}}), Ok("c", 1.5));
  EXPECT_EQ(e.since_improvement(), 1);
  e.Ingest(Cand("d", 4, 0, {{"A", 5}, {"B", 1}}), Ok("d", 2.0));  // a tie is no improvement
  EXPECT_EQ(e.best()->candidate.id(), "b");
  EXPECT_EQ(e.since_improvement(), 2);
  e.Ingest(Cand("f", 5, 1, {{"A", 6}, {"B", 1}}), Failed("f"));
  e.Ingest(Cand("g", 6, 0, {{"A", 7}, {"B", 1}}), Failed("g", v1::OUTCOME_WRONG_ANSWER));
  // An "ok" without a speedup is not a member.
  e.Ingest(Cand("h", 7, 1, {{"A", 8}, {"B", 1}}), Ok("h", 0.0));
  EXPECT_EQ(e.best()->candidate.id(), "b");
  EXPECT_EQ(e.since_improvement(), 5);
  EXPECT_EQ(e.evaluations(), 8);

  e.Ingest(Cand("i", 8, 1, {{"A", 9}, {"B", 1}}), Ok("i", 3.5));
  EXPECT_EQ(e.best()->candidate.id(), "i");
  EXPECT_EQ(e.since_improvement(), 0);
  EXPECT_EQ(e.evaluations(), 9);
  for (int i = 0; i < 2; ++i) {
    for (const auto& id : e.IslandMemberIds(i)) EXPECT_NE(id, "h");
  }
}

// ---------------------------------------------------------------------------------------------
// Damping.

TEST(EvolutionEngineTest, ParentsWithManyChildrenAreChosenLess) {
  // One island; "a" is a strong runner-up behind the best "d". In one engine "a" already has 40
  // (failed) children, in the other the same number of failed children belong to an unknown
  // parent. "d" comes last so that the engine is not in its stagnation mode.
  auto build = [](const std::string& busy_parent) {
    EngineOptions o = Opts(1, 0);
    o.warmup_explore = 1;
    auto e = std::make_unique<EvolutionEngine>(77, o);
    e->Ingest(Cand("seed", 0, 0, {{"A", 0}, {"B", 0}}, v1::MUTATOR_KIND_SEED), Ok("seed", 1.0));
    e->Ingest(Cand("a", 1, 0, {{"A", 1}, {"B", 1}}), Ok("a", 2.0));
    e->Ingest(Cand("b", 2, 0, {{"A", 2}, {"B", 2}}), Ok("b", 1.9));
    e->Ingest(Cand("c", 3, 0, {{"A", 3}, {"B", 3}}), Ok("c", 1.2));
    for (int i = 0; i < 40; ++i) {
      const std::string id = absl::StrCat("k", i);
      e->Ingest(Cand(id, 4 + i, 0, {{"A", 10 + i}, {"B", 0}}, v1::MUTATOR_KIND_PARAMETRIC, {busy_parent}),
                Failed(id));
    }
    e->Ingest(Cand("d", 44, 0, {{"A", 4}, {"B", 4}}), Ok("d", 2.5));
    return e;
  };
  auto damped = build("a");
  auto control = build("ghost");
  ASSERT_EQ(damped->best()->candidate.id(), "d");
  ASSERT_EQ(damped->since_improvement(), 0);
  ASSERT_EQ(damped->evaluations(), control->evaluations());
  auto count = [](EvolutionEngine& e, const std::string& id) {
    int n = 0;
    for (int64_t k = 100; k < 2100; ++k) {
      Selection s = e.Select(k);
      if (!s.parents.empty() && s.parents.front()->candidate.id() == id) ++n;
    }
    return n;
  };
  const int with_children = count(*damped, "a");
  const int without = count(*control, "a");
  EXPECT_GT(without, 200) << "a strong runner-up should be a frequent parent without damping";
  EXPECT_LT(with_children, without * 0.6) << "with 40 children: " << with_children << ", without: " << without;
  EXPECT_GT(with_children, 0) << "damping should not exclude a parent entirely";
  // The others gain what "a" loses.
  EXPECT_GT(count(*damped, "b"), count(*control, "b"));
}

// ---------------------------------------------------------------------------------------------
// Islands and migration.

TEST(EvolutionEngineTest, SeedGoesToEveryIsland) {
  EvolutionEngine e(3, Opts(4));
  ASSERT_EQ(e.island_count(), 4);
  e.Ingest(Cand("seed", 0, 2, {{"A", 1}, {"B", 2}}, v1::MUTATOR_KIND_SEED), Ok("seed", 1.0));
  for (int i = 0; i < 4; ++i) {
    EXPECT_THAT(e.IslandMemberIds(i), ElementsAre("seed")) << "island " << i;
    Selection s = e.Select(i + 4);  // sequence % islands == island
    EXPECT_EQ(s.island, i);
    ASSERT_EQ(s.parents.size(), 1u);
    EXPECT_EQ(s.parents[0]->candidate.id(), "seed");
  }
  // A non-seed candidate stays on its island.
  e.Ingest(Cand("x", 1, 2, {{"A", 2}, {"B", 2}}), Ok("x", 1.5));
  EXPECT_THAT(e.IslandMemberIds(2), UnorderedElementsAre("seed", "x"));
  for (int i : {0, 1, 3}) EXPECT_THAT(e.IslandMemberIds(i), ElementsAre("seed"));
  // Out-of-range islands are clamped, not dropped.
  e.Ingest(Cand("y", 2, 9, {{"A", 3}, {"B", 2}}), Ok("y", 1.1));
  EXPECT_THAT(e.IslandMemberIds(3), Contains("y"));
  e.Ingest(Cand("z", 3, -1, {{"A", 4}, {"B", 2}}), Ok("z", 1.1));
  EXPECT_THAT(e.IslandMemberIds(0), Contains("z"));
}

TEST(EvolutionEngineTest, RingMigrationCopiesEachBestOnceAtTheInterval) {
  EvolutionEngine e(1, Opts(3, 4));
  e.Ingest(Cand("a0", 0, 0, {{"A", 0}, {"B", 0}}), Ok("a0", 1.0));
  e.Ingest(Cand("a1", 1, 1, {{"A", 1}, {"B", 1}}), Ok("a1", 2.0));
  e.Ingest(Cand("a2", 2, 2, {{"A", 2}, {"B", 2}}), Ok("a2", 3.0));
  EXPECT_EQ(e.migrations(), 0);
  EXPECT_THAT(e.IslandMemberIds(0), ElementsAre("a0"));
  EXPECT_THAT(e.IslandMemberIds(1), ElementsAre("a1"));
  EXPECT_THAT(e.IslandMemberIds(2), ElementsAre("a2"));

  // The 4th evaluation (a failure counts too) triggers the ring: 0 -> 1 -> 2 -> 0.
  e.Ingest(Cand("f3", 3, 0, {{"A", 3}, {"B", 3}}), Failed("f3"));
  EXPECT_EQ(e.migrations(), 3);
  EXPECT_THAT(e.IslandMemberIds(0), UnorderedElementsAre("a0", "a2"));
  EXPECT_THAT(e.IslandMemberIds(1), UnorderedElementsAre("a1", "a0"));
  EXPECT_THAT(e.IslandMemberIds(2), UnorderedElementsAre("a2", "a1"));

  // Nothing between intervals.
  for (int i = 4; i < 7; ++i) {
    const std::string id = absl::StrCat("f", i);
    e.Ingest(Cand(id, i, i % 3, {{"A", i}, {"B", i}}), Failed(id));
  }
  EXPECT_EQ(e.migrations(), 3);
  // 8th evaluation: bests are a2 (island 0), a1 (island 1), a2 (island 2). Only a2 -> island 1 is
  // new; a1 is already on island 2 and a2 already on island 0.
  e.Ingest(Cand("f7", 7, 1, {{"A", 7}, {"B", 7}}), Failed("f7"));
  EXPECT_EQ(e.migrations(), 4);
  EXPECT_THAT(e.IslandMemberIds(0), UnorderedElementsAre("a0", "a2"));
  EXPECT_THAT(e.IslandMemberIds(1), UnorderedElementsAre("a1", "a0", "a2"));
  EXPECT_THAT(e.IslandMemberIds(2), UnorderedElementsAre("a2", "a1"));

  // Converged: every island's best is a2, which is everywhere; later rings copy nothing.
  for (int i = 8; i < 40; ++i) {
    const std::string id = absl::StrCat("f", i);
    e.Ingest(Cand(id, i, i % 3, {{"A", i}, {"B", i}}), Failed(id));
  }
  EXPECT_EQ(e.migrations(), 4);
  EXPECT_EQ(e.IslandMemberIds(0).size(), 2u);
  EXPECT_EQ(e.IslandMemberIds(1).size(), 3u);
  EXPECT_EQ(e.IslandMemberIds(2).size(), 2u);
}

TEST(EvolutionEngineTest, MigrationNeverDuplicatesMembers) {
  // A long random feed on 4 islands with frequent migration: every island's members are unique
  // (IslandMemberIds is a set; compare with the elites seen through Select), each migration adds
  // exactly one member somewhere, and members only ever come from ingestion or migration.
  const int islands = 4;
  EvolutionEngine e(21, Opts(islands, 3));
  const auto feed = SyntheticFeed(17, 300, islands);
  std::set<std::string> ok_ids;
  size_t total_before = 0;
  int64_t migrations_before = 0;
  for (size_t k = 0; k < feed.size(); ++k) {
    const auto& ev = feed[k];
    e.Ingest(ev.candidate, ev.result);
    const bool ok = ev.result.outcome() == v1::OUTCOME_OK && ev.result.speedup() > 0;
    if (ok) ok_ids.insert(ev.candidate.id());
    size_t total = 0;
    for (int i = 0; i < islands; ++i) {
      const auto ids = e.IslandMemberIds(i);
      EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
      for (const auto& id : ids) EXPECT_TRUE(ok_ids.contains(id)) << id;
      total += ids.size();
    }
    const size_t added_by_ingest =
        !ok ? 0 : ev.candidate.mutator() == v1::MUTATOR_KIND_SEED ? static_cast<size_t>(islands) : 1;
    EXPECT_EQ(total, total_before + added_by_ingest + static_cast<size_t>(e.migrations() - migrations_before))
        << "at evaluation " << k + 1;
    if ((k + 1) % 3 != 0) {
      EXPECT_EQ(e.migrations(), migrations_before) << "migration off the interval";
    }
    total_before = total;
    migrations_before = e.migrations();
    // Selected parents and inspirations are members of the selected island (or the global best).
    Selection s = e.Select(static_cast<int64_t>(k + 1));
    const auto ids = e.IslandMemberIds(s.island);
    for (const Member* m : s.parents) EXPECT_THAT(ids, Contains(m->candidate.id()));
    std::set<const Member*> distinct(s.parents.begin(), s.parents.end());
    EXPECT_EQ(distinct.size(), s.parents.size()) << "crossover with itself";
    for (const Member* m : s.inspirations) {
      EXPECT_TRUE(m == e.best() || std::find(ids.begin(), ids.end(), m->candidate.id()) != ids.end());
      EXPECT_NE(m, s.parents.front());
    }
  }
  EXPECT_GT(e.migrations(), 0);
}

TEST(EvolutionEngineTest, WarmupAsksForExploration) {
  EngineOptions o = Opts(2);
  o.budget = 100;  // auto warm-up: a tenth of the budget, 4..16 -> 10
  EvolutionEngine e(8, o);
  e.Ingest(Cand("seed", 0, 0, {{"A", 0}, {"B", 0}}, v1::MUTATOR_KIND_SEED), Ok("seed", 1.0));
  e.Ingest(Cand("a", 1, 0, {{"A", 1}, {"B", 0}}), Ok("a", 2.0));
  for (int64_t k = 1; k <= 10; ++k) {
    Selection s = e.Select(k);
    EXPECT_EQ(s.strategy, "explore") << k;
    ASSERT_EQ(s.parents.size(), 1u);
    EXPECT_EQ(s.parents[0]->candidate.id(), s.island == 0 ? "a" : "seed") << k;
  }
  std::set<std::string> strategies;
  for (int64_t k = 11; k < 400; ++k) strategies.insert(e.Select(k).strategy);
  EXPECT_THAT(strategies, Contains("exploit"));
}

TEST(EvolutionEngineTest, AShareOfProposalsAfterTheWarmupAreGlobalDrawsFromTheBest) {
  auto global_from_best = [](double ratio) -> int {
    EngineOptions o = Opts(2);
    o.budget = 100;  // warm-up: 10 proposals
    o.global_ratio = ratio;
    EvolutionEngine e(8, o);
    e.Ingest(Cand("seed", 0, 0, {{"A", 0}, {"B", 0}}, v1::MUTATOR_KIND_SEED), Ok("seed", 1.0));
    e.Ingest(Cand("a", 1, 0, {{"A", 1}, {"B", 0}}), Ok("a", 2.0));
    int global = 0;
    for (int64_t k = 1; k <= 10; ++k) EXPECT_EQ(e.Select(k).strategy, "explore") << k;
    for (int64_t k = 11; k < 1011; ++k) {
      Selection s = e.Select(k);
      if (s.strategy != "global") continue;
      ++global;
      EXPECT_FALSE(s.stalled) << "only two evaluations: nothing has stalled";
      EXPECT_THAT(s.parents, ElementsAre(e.best())) << k;
    }
    return global;
  };
  EXPECT_EQ(global_from_best(0), 0);
  const int global = global_from_best(0.15);
  EXPECT_GT(global, 100) << "about 150 of 1000";
  EXPECT_LT(global, 200) << "about 150 of 1000";
  EXPECT_EQ(global_from_best(1), 1000);
}

TEST(EvolutionEngineTest, TheGlobalShareHasItsOwnRandomStream) {
  // Every proposal that is not a global draw is what the engine without the share would choose.
  auto make = [](double ratio) {
    EngineOptions o = Opts(2);
    o.budget = 100;
    o.global_ratio = ratio;
    auto e = std::make_unique<EvolutionEngine>(5, o);
    for (int i = 0; i < 8; ++i) {
      e->Ingest(Cand(absl::StrCat("c", i), i, i % 2, {{"A", i}, {"B", i % 3}}),
                Ok(absl::StrCat("c", i), 1.0 + i));
    }
    return e;
  };
  auto with = make(0.15), without = make(0);
  int global = 0;
  for (int64_t k = 11; k < 300; ++k) {
    const Selection s = with->Select(k);
    if (s.strategy == "global") {
      ++global;
      continue;
    }
    EXPECT_EQ(Describe(s), Describe(without->Select(k))) << k;
  }
  EXPECT_GT(global, 0);
}

TEST(EvolutionEngineTest, AStalledSearchAlternatesPerturbationsAndGlobalDraws) {
  EngineOptions o = Opts(1);
  o.budget = 100;
  o.global_ratio = 0;
  EvolutionEngine e(3, o);
  e.Ingest(Cand("best", 0, 0, {{"A", 0}, {"B", 0}}, v1::MUTATOR_KIND_SEED), Ok("best", 5.0));
  for (int i = 1; i <= 12; ++i) {
    e.Ingest(Cand(absl::StrCat("w", i), i, 0, {{"A", i}, {"B", 1}}), Ok(absl::StrCat("w", i), 1.0));
  }
  ASSERT_GE(e.since_improvement(), 12);
  std::map<std::string, int> stalled;
  for (int64_t k = 11; k < 41; ++k) {
    const Selection s = e.Select(k);
    EXPECT_EQ(s.stalled, k % 3 == 0) << k;
    if (!s.stalled) {
      EXPECT_NE(s.strategy, "global") << k;
      continue;
    }
    ++stalled[s.strategy];
    EXPECT_EQ(s.strategy, (k / 3) % 2 == 0 ? "perturb" : "global") << k;
    EXPECT_THAT(s.parents, ElementsAre(e.best())) << "the island's best, here the job's";
  }
  EXPECT_EQ(stalled["perturb"], 5);
  EXPECT_EQ(stalled["global"], 5);
}

TEST(EvolutionEngineTest, OptionsFromConfig) {
  v1::EvolutionConfig c;
  v1::Budget b;
  b.set_max_candidates(321);
  EngineOptions o = OptionsFromConfig(c, b);
  EXPECT_EQ(o.islands, 2);
  EXPECT_EQ(o.migration_interval, 25);
  EXPECT_EQ(o.budget, 321);
  EXPECT_DOUBLE_EQ(o.global_ratio, 0.15);
  c.set_screen_children(1);
  EXPECT_DOUBLE_EQ(OptionsFromConfig(c, b).global_ratio, 0)
      << "without screening a global draw is one random point";
  c.set_islands(5);
  c.set_migration_interval(7);
  c.set_exploit_ratio(0.3);
  c.set_explore_ratio(0.4);
  c.set_warmup_explore(3);
  c.set_crossover_ratio(0.25);
  o = OptionsFromConfig(c, b);
  EXPECT_EQ(o.warmup_explore, 3);
  EXPECT_DOUBLE_EQ(o.crossover_ratio, 0.25);
  EXPECT_EQ(o.islands, 5);
  EXPECT_EQ(o.migration_interval, 7);
  EXPECT_DOUBLE_EQ(o.exploit_ratio, 0.3);
  EXPECT_DOUBLE_EQ(o.explore_ratio, 0.4);
  EXPECT_EQ(EvolutionEngine(1, o).island_count(), 5);
}

}  // namespace
}  // namespace kforge::coordinator
