// Property tests of the parametric mutator over problems built in code: every child is a
// declared, valid, unseen assignment; neighbour moves stay close; the space is used up before
// anything is proposed twice; crossover mixes the parents; results are deterministic per seed.

#include "services/llm-proxy/parametric_mutator.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kforge/v1/llm_proxy.pb.h"
#include "kforge/v1/problem.pb.h"

namespace kforge::llm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Knob {
  std::string name;
  std::vector<int64_t> values;
};

using Sizes = std::map<std::string, int64_t>;

v1::Problem MakeProblem(const std::string& name, const std::vector<Knob>& knobs,
                        const std::vector<std::string>& constraints, const std::vector<Sizes>& size_sets = {{{"N", 256}}}) {
  v1::Problem p;
  p.set_name(name);
  p.set_backend(v1::BACKEND_OPENCL);
  for (size_t i = 0; i < size_sets.size(); ++i) {
    v1::SizeSet* s = p.add_size_sets();
    s->set_name(absl::StrCat("set", i));
    s->set_bench(true);
    for (const auto& [k, v] : size_sets[i]) (*s->mutable_sizes())[k] = v;
  }
  v1::KernelSpec* seed = p.mutable_seed();
  seed->set_source_file("seed.cl");
  seed->set_source(absl::StrCat("kernel void ", name, "(global float* x, int N) { x[get_global_id(0)] = 0; }\n"));
  v1::Launch* l = seed->add_launches();
  l->set_kernel(name);
  l->add_global("N");
  l->add_args("x");
  l->add_args("N");
  for (const auto& k : knobs) {
    v1::Param* prm = seed->add_params();
    prm->set_name(k.name);
    for (int64_t v : k.values) prm->add_values(v);
  }
  for (const auto& c : constraints) seed->add_constraints(c);
  p.set_content_hash(HashProblem(p));
  return p;
}

// A problem together with everything the checks need to know about its space.
struct Fixture {
  v1::Problem problem;
  ParamSpace space;
  v1::Candidate seed;                            // at the default assignment
  std::vector<ParamAssignment> valid;            // every valid assignment
  std::map<ParamAssignment, std::string> hash;   // content hash of each valid assignment's candidate

  static Fixture Make(v1::Problem problem) {
    auto space = ParamSpace::Create(problem);
    EXPECT_TRUE(space.ok()) << space.status();
    Fixture f{problem, *std::move(space), {}, {}, {}};
    auto def = f.space.DefaultAssignment();
    EXPECT_TRUE(def.has_value());
    f.seed = MakeSeedCandidate(problem, def.value_or(ParamAssignment{}));
    f.seed.set_id("seed");
    f.seed.set_job_id("job-1");
    for (int64_t i = 0; i < f.space.TotalAssignments(); ++i) {
      ParamAssignment a = f.space.Decode(i);
      auto ok = f.space.IsValid(a);
      if (ok.ok() && *ok) {
        f.valid.push_back(a);
        f.hash[a] = f.HashOf(a);
      }
    }
    return f;
  }

  // The content hash a candidate of this problem with these params has.
  std::string HashOf(const ParamAssignment& a) const { return WithParams(seed, a).content_hash(); }

  // A parent candidate at `a` (as the engine would hold it: with an id).
  v1::Candidate Parent(const ParamAssignment& a, const std::string& id) const {
    v1::Candidate c = WithParams(seed, a);
    c.set_id(id);
    return c;
  }

  std::vector<int> Indices(const ParamAssignment& a) const {
    auto idx = space.ValueIndices(a);
    EXPECT_TRUE(idx.has_value()) << FormatParams(a);
    return idx.value_or(std::vector<int>(space.params().size(), 0));
  }
};

ParamAssignment ParamsOf(const v1::Candidate& c) { return ParamAssignment(c.params().begin(), c.params().end()); }

v1::MutateRequest Request(const v1::Problem& problem, const std::vector<v1::Candidate>& parents, uint64_t seed,
                          int count = 1, const std::string& strategy = "") {
  v1::MutateRequest r;
  r.set_job_id("job-1");
  *r.mutable_problem() = problem;
  for (const auto& p : parents) *r.add_parents()->mutable_candidate() = p;
  r.set_seed(seed);
  r.set_count(count);
  r.set_strategy(strategy);
  return r;
}

SeenFn SeenIn(const std::set<std::string>& seen) {
  return [&seen](const std::string& h) { return seen.contains(h); };
}

// The four problems the properties run over.
v1::Problem TiledProblem() {
  // 5 * 4 * 3 * 2 = 120 points, constraints on two size sets.
  return MakeProblem("tiled", {{"TILE", {4, 8, 16, 32, 64}}, {"WPT", {1, 2, 4, 8}}, {"VEC", {1, 2, 4}}, {"UNROLL", {0, 1}}},
                     {"TILE % WPT == 0", "TILE / WPT >= 2", "N % (TILE * VEC) == 0"}, {{{"N", 512}}, {{"N", 128}}});
}
v1::Problem GridProblem() {
  // 10 x 10, unconstrained: room for neighbour moves in every direction.
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 10; ++i) v.push_back(i * 3);
  return MakeProblem("grid", {{"X", v}, {"Y", v}}, {});
}
v1::Problem WideProblem() {
  // Five knobs (more than three can change at once), one of them fixed, with a coupling constraint.
  return MakeProblem("wide",
                     {{"A", {1, 2, 3, 4}}, {"B", {1, 2, 3, 4}}, {"C", {0, 1, 2}}, {"FIXED", {7}}, {"D", {1, 2, 3}},
                      {"E", {8, 16}}},
                     {"A + B <= 7", "FIXED == 7"});
}
v1::Problem TinyProblem() {
  // 2 x 2 with A <= B: three valid points.
  return MakeProblem("tiny", {{"A", {1, 2}}, {"B", {1, 2}}}, {"A <= B"});
}

// Whether some single-knob change of `parent` (any distance) is valid and not in `seen`.
bool HasUnseenSingleKnobMove(const Fixture& f, const ParamAssignment& parent, const std::set<std::string>& seen,
                             int max_distance) {
  const std::vector<int> idx = f.Indices(parent);
  for (size_t p = 0; p < idx.size(); ++p) {
    for (int v = 0; v < f.space.params()[p].values_size(); ++v) {
      if (v == idx[p] || std::abs(v - idx[p]) > max_distance) continue;
      std::vector<int> next = idx;
      next[p] = v;
      auto it = f.hash.find(f.space.FromIndices(next));
      if (it != f.hash.end() && !seen.contains(it->second)) return true;
    }
  }
  return false;
}

// How far one random neighbour draw moves a knob with n declared values: P(k) ~ 1/k for
// k <= max(2, n / 3) (parametric_mutator.cc). Two positions for knobs of up to eight values.
int MaxRandomStep(int n) { return std::max(2, n / 3); }

struct Diff {
  int changed = 0;          // params that differ
  int max_step = 0;         // largest position change of one param
  bool within_step = true;  // every param moved at most MaxRandomStep positions
};
Diff Distance(const Fixture& f, const ParamAssignment& a, const ParamAssignment& b) {
  const std::vector<int> ia = f.Indices(a), ib = f.Indices(b);
  Diff d;
  for (size_t i = 0; i < ia.size(); ++i) {
    if (ia[i] != ib[i]) {
      ++d.changed;
      const int step = std::abs(ia[i] - ib[i]);
      d.max_step = std::max(d.max_step, step);
      if (step > MaxRandomStep(f.space.params()[i].values_size())) d.within_step = false;
    }
  }
  return d;
}

// ---- the randomised properties -------------------------------------------------------------

// One randomised scenario: parents drawn from the valid points, a random share of the space
// already seen (always the parents), a random count and strategy. Checks every property that
// must hold for any scenario; returns the number of children checked.
int CheckScenario(const Fixture& f, ParametricMutator& mutator, std::mt19937_64& rng, const ValidityFn& extra,
                  const std::string& label) {
  std::uniform_int_distribution<size_t> pick(0, f.valid.size() - 1);
  std::uniform_real_distribution<double> u(0, 1);
  const ParamAssignment a1 = f.valid[pick(rng)];
  const ParamAssignment a2 = f.valid[pick(rng)];
  const bool two_parents = f.valid.size() > 1 && a1 != a2 && u(rng) < 0.3;
  std::vector<v1::Candidate> parents = {f.Parent(a1, "p1")};
  if (two_parents) parents.push_back(f.Parent(a2, "p2"));

  static constexpr double kSeenShare[] = {0.0, 0.3, 0.7, 0.95, 1.0};
  const double share = kSeenShare[rng() % std::size(kSeenShare)];
  std::set<std::string> seen = {"not-a-real-hash"};
  for (const auto& p : parents) seen.insert(p.content_hash());
  for (const auto& [a, h] : f.hash) {
    if (u(rng) < share) seen.insert(h);
  }
  static constexpr int kCounts[] = {1, 1, 2, 3, 5};
  const int count = kCounts[rng() % std::size(kCounts)];
  static const char* const kStrategies[] = {"", "explore", "exploit", "perturb", "global"};
  const std::string strategy = kStrategies[rng() % std::size(kStrategies)];
  const uint64_t seed = rng();

  // Unseen points the mutator may propose.
  int available = 0;
  for (const auto& [a, h] : f.hash) {
    if (!seen.contains(h) && (!extra || extra(a))) ++available;
  }

  const std::string where = absl::StrCat(label, " seed=", seed, " count=", count, " strategy='", strategy,
                                         "' parents=", parents.size(), " p1=", FormatParams(a1),
                                         " seen_share=", share);
  const v1::MutateRequest req = Request(f.problem, parents, seed, count, strategy);
  auto resp = mutator.Mutate(req, SeenIn(seen));
  EXPECT_TRUE(resp.ok()) << where << ": " << resp.status();
  if (!resp.ok()) return 0;

  // The space is used up before fewer than `count` children come back, and only then.
  const int want = std::min(count, available);
  EXPECT_EQ(resp->children_size(), want) << where;
  if (want < count) {
    EXPECT_THAT(resp->message(), HasSubstr("exhausted")) << where;
  } else {
    EXPECT_EQ(resp->message(), "") << where;
  }

  std::set<std::string> local;  // earlier children of this call count as seen for later ones
  for (const v1::Candidate& c : resp->children()) {
    const ParamAssignment params = ParamsOf(c);
    const std::string what = absl::StrCat(where, " child=", FormatParams(params), " note='", c.note(), "'");
    if (!f.space.ValueIndices(params).has_value()) {
      ADD_FAILURE() << what << ": undeclared value";
      return 0;
    }
    auto valid = f.space.IsValid(params);
    EXPECT_TRUE(valid.ok() && *valid) << what << ": violates a constraint " << valid.status();
    if (extra) {
      EXPECT_TRUE(extra(params)) << what << ": rejected by the validity filter";
    }
    EXPECT_EQ(c.content_hash(), HashCandidate(c)) << what;
    EXPECT_FALSE(seen.contains(c.content_hash())) << what << ": re-proposes a seen candidate";
    EXPECT_TRUE(local.insert(c.content_hash()).second) << what << ": duplicate within one response";
    EXPECT_EQ(c.mutator(), v1::MUTATOR_KIND_PARAMETRIC) << what;
    EXPECT_EQ(c.job_id(), "job-1") << what;
    EXPECT_EQ(c.source(), f.seed.source()) << what;
    if (two_parents) {
      EXPECT_THAT(c.parent_ids(), ElementsAre("p1", "p2")) << what;
    } else {
      EXPECT_THAT(c.parent_ids(), ElementsAre("p1")) << what;
    }
    if (two_parents && c.note() == "crossover") {
      for (const auto& [k, v] : params) {
        EXPECT_TRUE(v == a1.at(k) || v == a2.at(k)) << what << ": " << k << " from neither parent";
      }
    }

    // Neighbour moves (single parent, "exploit"): while any single-knob change is still unseen
    // the child is a neighbour (at most three knobs changed), and while a one-step change is
    // unseen, no knob moved farther than a random neighbour draw goes (two positions for knobs
    // of up to eight values).
    if (!two_parents && strategy == "exploit") {
      std::set<std::string> seen_now = seen;
      for (const auto& h : local) seen_now.insert(h);
      seen_now.erase(c.content_hash());
      std::set<std::string> seen_before = seen_now;  // what the mutator knew for this child
      auto valid_extra = [&](const std::set<std::string>& s) {
        if (!extra) return s;
        std::set<std::string> out = s;
        for (const auto& [a, h] : f.hash) {
          if (!extra(a)) out.insert(h);
        }
        return out;
      };
      seen_before = valid_extra(seen_before);
      const Diff d = Distance(f, a1, params);
      if (HasUnseenSingleKnobMove(f, a1, seen_before, 1 << 20)) {
        EXPECT_EQ(c.note(), "neighbour") << what;
        EXPECT_LE(d.changed, 3) << what;
      }
      if (HasUnseenSingleKnobMove(f, a1, seen_before, 1)) {
        EXPECT_TRUE(d.within_step) << what << ": moved " << d.max_step << " positions";
      }
    }
  }

  // Determinism: the same request against a fresh mutator gives the same children.
  ParametricMutator again({}, extra);
  auto resp2 = again.Mutate(req, SeenIn(seen));
  EXPECT_TRUE(resp2.ok());
  if (resp2.ok()) {
    EXPECT_EQ(resp2->children_size(), resp->children_size()) << where;
    for (int i = 0; i < std::min(resp->children_size(), resp2->children_size()); ++i) {
      EXPECT_EQ(resp2->children(i).content_hash(), resp->children(i).content_hash()) << where << " child " << i;
      EXPECT_EQ(resp2->children(i).note(), resp->children(i).note()) << where << " child " << i;
    }
  }
  return resp->children_size();
}

class MutatorPropertyTest : public ::testing::TestWithParam<int> {};

v1::Problem ProblemNumber(int i) {
  switch (i) {
    case 0: return TiledProblem();
    case 1: return GridProblem();
    case 2: return WideProblem();
    default: return TinyProblem();
  }
}

TEST_P(MutatorPropertyTest, ChildrenAreDeclaredValidUnseenAndDistinct) {
  const Fixture f = Fixture::Make(ProblemNumber(GetParam()));
  ASSERT_GT(f.valid.size(), 1u);
  ParametricMutator mutator;  // one instance across calls: its space cache is exercised too
  std::mt19937_64 rng(1234 + GetParam());
  int children = 0;
  for (int trial = 0; trial < 1500 && !::testing::Test::HasFailure(); ++trial) {
    children += CheckScenario(f, mutator, rng, nullptr, absl::StrCat(f.problem.name(), " trial ", trial));
  }
  EXPECT_GT(children, 150);  // the tiny space often has nothing left; the others plenty
}

TEST_P(MutatorPropertyTest, ValidityFilterIsHonoured) {
  const Fixture f = Fixture::Make(ProblemNumber(GetParam()));
  // Reject every assignment whose first knob takes its second declared value.
  const v1::Param& first = f.space.params()[0];
  ASSERT_GE(first.values_size(), 2);
  const std::string knob = first.name();
  const int64_t banned = first.values(1);
  ValidityFn extra = [knob, banned](const ParamAssignment& a) { return a.at(knob) != banned; };
  ParametricMutator mutator({}, extra);
  std::mt19937_64 rng(99 + GetParam());
  int children = 0;
  for (int trial = 0; trial < 600 && !::testing::Test::HasFailure(); ++trial) {
    children += CheckScenario(f, mutator, rng, extra, absl::StrCat(f.problem.name(), " filtered trial ", trial));
  }
  EXPECT_GT(children, 60);
}

INSTANTIATE_TEST_SUITE_P(Problems, MutatorPropertyTest, ::testing::Range(0, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return ProblemNumber(info.param).name(); });

// A whole job's worth of proposals: each child becomes seen and a parent; nothing repeats until
// the space is used up, then the mutator says so.
TEST(ParametricMutatorTest, AJobWalksTheWholeSpaceWithoutRepeats) {
  for (const v1::Problem& problem : {TiledProblem(), WideProblem(), TinyProblem()}) {
    const Fixture f = Fixture::Make(problem);
    ParametricMutator mutator;
    std::set<std::string> seen = {f.seed.content_hash()};
    std::vector<v1::Candidate> pool = {f.seed};
    std::mt19937_64 rng(5);
    int calls = 0;
    while (true) {
      ASSERT_LT(++calls, 10000) << problem.name();
      std::vector<v1::Candidate> parents = {pool[rng() % pool.size()]};
      if (rng() % 4 == 0) parents.push_back(pool[rng() % pool.size()]);
      static const char* const kStrategies[] = {"", "explore", "exploit"};
      auto resp = mutator.Mutate(Request(problem, parents, rng(), 1 + rng() % 3, kStrategies[rng() % 3]), SeenIn(seen));
      ASSERT_TRUE(resp.ok()) << resp.status();
      for (const auto& c : resp->children()) {
        ASSERT_TRUE(seen.insert(c.content_hash()).second) << problem.name() << ": repeated " << FormatParams(ParamsOf(c));
        v1::Candidate child = c;
        child.set_id(absl::StrCat("c", seen.size()));
        pool.push_back(child);
      }
      if (!resp->message().empty()) {
        EXPECT_THAT(resp->message(), HasSubstr("exhausted"));
        break;
      }
    }
    EXPECT_EQ(seen.size(), f.valid.size()) << problem.name() << ": stopped before the space was used up";
    // Exhausted stays exhausted.
    auto resp = mutator.Mutate(Request(problem, {f.seed}, 1, 3), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->children_size(), 0);
    EXPECT_THAT(resp->message(), HasSubstr("exhausted"));
  }
}

// ---- neighbour moves -----------------------------------------------------------------------

TEST(ParametricMutatorTest, ExploitStaysNextToTheParent) {
  const Fixture f = Fixture::Make(GridProblem());
  const ParamAssignment centre = {{"X", 15}, {"Y", 15}};  // index 5, 5
  const v1::Candidate parent = f.Parent(centre, "p");
  const std::set<std::string> seen = {parent.content_hash()};
  ParametricMutator mutator;
  std::map<int, int> changed_histogram, step_histogram;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, "exploit"), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 1);
    const Diff d = Distance(f, centre, ParamsOf(resp->children(0)));
    ASSERT_GE(d.changed, 1) << "seed " << seed;
    ASSERT_LE(d.changed, 2) << "seed " << seed;  // the grid has two knobs
    ASSERT_LE(d.max_step, MaxRandomStep(10)) << "seed " << seed;
    EXPECT_EQ(resp->children(0).note(), "neighbour");
    ++changed_histogram[d.changed];
    ++step_histogram[d.max_step];
  }
  // Mostly one knob at a time, sometimes two; mostly short steps.
  EXPECT_GT(changed_histogram[1], changed_histogram[2]);
  EXPECT_GT(changed_histogram[2], 0);
  EXPECT_GT(step_histogram[1], step_histogram[2]);
  EXPECT_GT(step_histogram[2], step_histogram[3]);
}

TEST(ParametricMutatorTest, SizeKnobsAtAPowerOfTwoStepAlongTheirPowersOfTwo) {
  // BX: 16 values, five of them powers of two; TILE: 1..4 has only three, so it steps by positions.
  std::vector<int64_t> bx;
  for (int64_t v = 16; v <= 256; v += 16) bx.push_back(v);
  const Fixture f = Fixture::Make(MakeProblem("sizes", {{"BX", bx}, {"TILE", {1, 2, 3, 4}}}, {}));
  const ParamAssignment centre = {{"BX", 64}, {"TILE", 2}};
  const v1::Candidate parent = f.Parent(centre, "p");
  const std::set<std::string> seen = {parent.content_hash()};
  for (double chance : {0.0, ParametricOptions().power_of_two_moves, 1.0}) {
    ParametricMutator mutator({.power_of_two_moves = chance});
    std::map<int64_t, int> bx_seen, tile_seen;
    for (uint64_t seed = 0; seed < 1000; ++seed) {
      auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, "exploit"), SeenIn(seen));
      ASSERT_TRUE(resp.ok()) << resp.status();
      ASSERT_EQ(resp->children_size(), 1);
      const ParamAssignment child = ParamsOf(resp->children(0));
      ++bx_seen[child.at("BX")];
      ++tile_seen[child.at("TILE")];
    }
    std::set<int64_t> bx_values;
    for (const auto& [v, n] : bx_seen) bx_values.insert(v);
    if (chance == 1.0) {
      // x2, x4, /2, /4 from 64 (or no change to BX).
      EXPECT_THAT(bx_values, ::testing::IsSubsetOf({16, 32, 64, 128, 256})) << "chance " << chance;
      EXPECT_GT(bx_seen[256], 0);
    } else if (chance > 0) {  // the default: both kinds of move
      EXPECT_GT(bx_seen[256], 0);
      EXPECT_GT(bx_seen[48] + bx_seen[80], 0);
    } else {
      EXPECT_GT(bx_seen[48] + bx_seen[80], 0);  // one position away
      EXPECT_EQ(bx_seen[256], 0);               // 12 positions away: beyond a third of the range
    }
    EXPECT_GT(tile_seen[3], 0) << "chance " << chance;
  }
}

// A space with one size knob (BX: 16 values, five of them powers of two) and a small tile.
Fixture SizesFixture() {
  std::vector<int64_t> bx;
  for (int64_t v = 16; v <= 256; v += 16) bx.push_back(v);
  return Fixture::Make(MakeProblem("sizes", {{"BX", bx}, {"TILE", {1, 2, 3, 4}}}, {}));
}

// The share of 400 single-child draws under `strategy` whose BX is a power of two.
double PowerOfTwoShare(const Fixture& f, ParametricMutator& mutator, const std::string& strategy,
                       std::set<int64_t>* values = nullptr) {
  const v1::Candidate parent = f.Parent({{"BX", 64}, {"TILE", 2}}, "p");
  const std::set<std::string> seen = {parent.content_hash()};
  int powers = 0;
  constexpr int kDraws = 400;
  for (uint64_t seed = 0; seed < kDraws; ++seed) {
    auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, strategy), SeenIn(seen));
    EXPECT_TRUE(resp.ok()) << resp.status();
    if (!resp.ok() || resp->children_size() != 1) return -1;
    const int64_t bx = ParamsOf(resp->children(0)).at("BX");
    if (std::has_single_bit(static_cast<uint64_t>(bx))) ++powers;
    if (values != nullptr) values->insert(bx);
  }
  return static_cast<double>(powers) / kDraws;
}

TEST(ParametricMutatorTest, RandomDrawsFavourTheSizeKnobsPowersOfTwo) {
  const Fixture f = SizesFixture();
  ParametricMutator mutator;
  // Jumps always take a power of two; resets half the time, else any of the 16 values (5 of
  // which are powers of two): 0.5 + 0.5 * 5/16 = 0.66 expected.
  EXPECT_EQ(PowerOfTwoShare(f, mutator, "global"), 1.0);
  EXPECT_EQ(PowerOfTwoShare(f, mutator, "perturb"), 1.0);
  std::set<int64_t> reset_values;
  const double reset_share = PowerOfTwoShare(f, mutator, "explore", &reset_values);
  EXPECT_GT(reset_share, 0.56);
  EXPECT_LT(reset_share, 0.76);
  EXPECT_EQ(reset_values.size(), 16u) << "resets still reach every value";

  // Without the prior, draws are uniform: 5/16 = 0.31 expected.
  ParametricMutator plain({.power_of_two_jumps = 0, .power_of_two_resets = 0});
  for (const char* strategy : {"global", "perturb", "explore"}) {
    const double share = PowerOfTwoShare(f, plain, strategy);
    EXPECT_GT(share, 0.2) << strategy;
    EXPECT_LT(share, 0.42) << strategy;
  }
}

TEST(ParametricMutatorTest, RandomDrawsFavourTheEndsOfASizeKnobsRange) {
  // A tile of 1, 2, 4, 6, .., 20: five powers of two, and an upper end that is not one.
  const Fixture f = Fixture::Make(MakeProblem(
      "ends", {{"TILE", {1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20}}, {"MODE", {0, 1, 2}}}, {}));
  const v1::Candidate parent = f.Parent({{"TILE", 6}, {"MODE", 1}}, "p");
  const std::set<std::string> seen = {parent.content_hash()};
  auto tiles_drawn = [&](ParametricMutator& mutator) {
    std::map<int64_t, int> tiles;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, "global"), SeenIn(seen));
      EXPECT_TRUE(resp.ok()) << resp.status();
      if (resp.ok() && resp->children_size() == 1) ++tiles[ParamsOf(resp->children(0)).at("TILE")];
    }
    return tiles;
  };
  ParametricMutator mutator;
  const std::map<int64_t, int> favoured = tiles_drawn(mutator);
  for (const auto& [tile, n] : favoured) {
    EXPECT_TRUE(std::has_single_bit(static_cast<uint64_t>(tile)) || tile == 20)
        << tile << " drawn " << n << " times";
  }
  // Six favoured values, about 50 draws each.
  EXPECT_GT(favoured.count(20) ? favoured.at(20) : 0, 25);
  ParametricMutator plain({.power_of_two_jumps = 0, .power_of_two_resets = 0});
  EXPECT_EQ(tiles_drawn(plain).size(), 11u) << "without the prior every value is drawn";
}

TEST(ParametricMutatorTest, AGlobalDrawGoesOnOnceThePowersOfTwoAreUsedUp) {
  const Fixture f = SizesFixture();
  std::set<std::string> seen;
  int left = 0;
  for (const auto& [a, h] : f.hash) {
    if (std::has_single_bit(static_cast<uint64_t>(a.at("BX")))) {
      seen.insert(h);
    } else {
      ++left;
    }
  }
  const v1::Candidate parent = f.Parent({{"BX", 64}, {"TILE", 2}}, "p");
  ParametricMutator mutator;
  auto resp = mutator.Mutate(Request(f.problem, {parent}, 7, left + 5, "global"), SeenIn(seen));
  ASSERT_TRUE(resp.ok()) << resp.status();
  // Every unseen point, none twice, and then the space is reported used up.
  EXPECT_EQ(resp->children_size(), left);
  std::set<ParamAssignment> distinct;
  for (const auto& c : resp->children()) {
    EXPECT_FALSE(std::has_single_bit(static_cast<uint64_t>(ParamsOf(c).at("BX"))));
    distinct.insert(ParamsOf(c));
  }
  EXPECT_EQ(distinct.size(), static_cast<size_t>(left));
  EXPECT_THAT(resp->message(), HasSubstr("exhausted"));
}

TEST(ParametricMutatorTest, ExploitChangesAtMostThreeKnobs) {
  // Six knobs, none constrained but the fixed one: random neighbour draws touch 1 to 3 knobs.
  const Fixture f = Fixture::Make(
      MakeProblem("six", {{"A", {1, 2, 3, 4, 5}}, {"B", {1, 2, 3, 4, 5}}, {"C", {1, 2, 3, 4, 5}}, {"D", {1, 2, 3, 4, 5}},
                          {"E", {1, 2, 3, 4, 5}}, {"F", {1, 2, 3, 4, 5}}},
                  {}));
  const ParamAssignment mid = {{"A", 3}, {"B", 3}, {"C", 3}, {"D", 3}, {"E", 3}, {"F", 3}};
  const v1::Candidate parent = f.Parent(mid, "p");
  const std::set<std::string> seen = {parent.content_hash()};
  ParametricMutator mutator;
  std::map<int, int> changed_histogram;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, "exploit"), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 1);
    const Diff d = Distance(f, mid, ParamsOf(resp->children(0)));
    ASSERT_GE(d.changed, 1) << "seed " << seed;
    ASSERT_LE(d.changed, 3) << "seed " << seed;
    ASSERT_LE(d.max_step, 2) << "seed " << seed;
    ++changed_histogram[d.changed];
  }
  EXPECT_GT(changed_histogram[3], 0);
}

// Every point a random neighbour draw can reach from `centre` (up to three knobs, each moved at
// most MaxRandomStep) plus every single-knob change.
std::vector<ParamAssignment> Reach(const Fixture& f, const ParamAssignment& centre) {
  std::vector<ParamAssignment> out;
  for (const auto& a : f.valid) {
    const Diff d = Distance(f, centre, a);
    if (d.changed == 0) continue;
    if ((d.changed <= 3 && d.within_step) || d.changed == 1) out.push_back(a);
  }
  return out;
}

TEST(ParametricMutatorTest, TheLastUnseenNeighbourIsProposedBeforeAnythingFarther) {
  const Fixture f = Fixture::Make(GridProblem());
  const ParamAssignment centre = {{"X", 15}, {"Y", 15}};  // index 5, 5
  const v1::Candidate parent = f.Parent(centre, "p");
  // One step, two steps, and on the other knob.
  for (const ParamAssignment& target :
       {ParamAssignment{{"X", 18}, {"Y", 15}}, ParamAssignment{{"X", 15}, {"Y", 9}}, ParamAssignment{{"X", 9}, {"Y", 15}}}) {
    std::set<std::string> seen = {parent.content_hash()};
    for (const auto& a : Reach(f, centre)) {
      if (a != target) seen.insert(f.hash.at(a));
    }
    // Plenty of unseen points remain far away (corners, for instance).
    ASSERT_FALSE(seen.contains(f.hash.at({{"X", 0}, {"Y", 0}})));
    ParametricOptions no_reset;
    no_reset.reset_probability = 0;
    for (const std::string strategy : {"exploit", ""}) {
      ParametricMutator mutator(strategy.empty() ? no_reset : ParametricOptions{});
      for (uint64_t seed = 0; seed < 300; ++seed) {
        auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, strategy), SeenIn(seen));
        ASSERT_TRUE(resp.ok()) << resp.status();
        ASSERT_EQ(resp->children_size(), 1);
        ASSERT_EQ(ParamsOf(resp->children(0)), target)
            << "target " << FormatParams(target) << " strategy '" << strategy << "' seed " << seed << ": got "
            << FormatParams(ParamsOf(resp->children(0))) << " (" << resp->children(0).note() << ")";
        EXPECT_EQ(resp->children(0).note(), "neighbour");
        EXPECT_FALSE(resp->neighbours_used_up());
      }
    }
  }
}

TEST(ParametricMutatorTest, TheLastUnseenNeighbourIsFoundUnderConstraints) {
  const Fixture f = Fixture::Make(TiledProblem());
  const ParamAssignment centre = {{"TILE", 16}, {"WPT", 2}, {"VEC", 2}, {"UNROLL", 0}};
  ASSERT_TRUE(f.hash.contains(centre));
  const v1::Candidate parent = f.Parent(centre, "p");
  const std::vector<ParamAssignment> reach = Reach(f, centre);
  ASSERT_GT(reach.size(), 5u);
  for (const ParamAssignment& target : reach) {
    if (Distance(f, centre, target).changed != 1 || Distance(f, centre, target).max_step != 1) continue;
    std::set<std::string> seen = {parent.content_hash()};
    for (const auto& a : reach) {
      if (a != target) seen.insert(f.hash.at(a));
    }
    ParametricMutator mutator;
    for (uint64_t seed = 0; seed < 100; ++seed) {
      auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, "exploit"), SeenIn(seen));
      ASSERT_TRUE(resp.ok()) << resp.status();
      ASSERT_EQ(resp->children_size(), 1);
      ASSERT_EQ(ParamsOf(resp->children(0)), target) << "target " << FormatParams(target) << " seed " << seed;
    }
  }
}

TEST(ParametricMutatorTest, WithNoNeighbourLeftExploitFallsBackToAReset) {
  const Fixture f = Fixture::Make(GridProblem());
  const ParamAssignment centre = {{"X", 15}, {"Y", 15}};
  const v1::Candidate parent = f.Parent(centre, "p");
  std::set<std::string> seen = {parent.content_hash()};
  for (const auto& a : Reach(f, centre)) seen.insert(f.hash.at(a));
  ParametricMutator mutator;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    auto resp = mutator.Mutate(Request(f.problem, {parent}, seed, 1, "exploit"), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 1);
    EXPECT_FALSE(seen.contains(resp->children(0).content_hash()));
    EXPECT_THAT(resp->children(0).note(), HasSubstr("random reset"));
    EXPECT_TRUE(resp->neighbours_used_up());
  }
}

// ---- exhaustion ----------------------------------------------------------------------------

TEST(ParametricMutatorTest, ExhaustingASmallSpace) {
  const Fixture f = Fixture::Make(TinyProblem());
  ASSERT_EQ(f.valid.size(), 3u);
  ParametricMutator mutator;
  std::set<std::string> seen = {f.seed.content_hash()};
  // Asking for more than is left: what is left, and a message.
  auto all = mutator.Mutate(Request(f.problem, {f.seed}, 7, 10), SeenIn(seen));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->children_size(), 2);
  EXPECT_THAT(all->message(), HasSubstr("exhausted"));

  // One at a time: two children, then nothing.
  for (int i = 0; i < 2; ++i) {
    auto resp = mutator.Mutate(Request(f.problem, {f.seed}, 100 + i, 1), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 1) << i;
    EXPECT_EQ(resp->message(), "");
    EXPECT_TRUE(seen.insert(resp->children(0).content_hash()).second);
  }
  for (const std::string strategy : {"", "explore", "exploit"}) {
    auto resp = mutator.Mutate(Request(f.problem, {f.seed}, 200, 1, strategy), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->children_size(), 0) << strategy;
    EXPECT_THAT(resp->message(), HasSubstr("exhausted")) << strategy;
  }
}

TEST(ParametricMutatorTest, ASpaceOfOnePointIsExhaustedAtOnce) {
  const Fixture f = Fixture::Make(MakeProblem("fixed", {{"A", {4}}, {"B", {2}}}, {}));
  ParametricMutator mutator;
  std::set<std::string> seen = {f.seed.content_hash()};
  auto resp = mutator.Mutate(Request(f.problem, {f.seed}, 1, 1), SeenIn(seen));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->children_size(), 0);
  EXPECT_THAT(resp->message(), HasSubstr("exhausted"));
}

TEST(ParametricMutatorTest, AFilterThatRejectsEverythingExhausts) {
  const Fixture f = Fixture::Make(TiledProblem());
  ParametricMutator mutator({}, [](const ParamAssignment&) { return false; });
  auto resp = mutator.Mutate(Request(f.problem, {f.seed}, 1, 2), SeenIn({}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->children_size(), 0);
  EXPECT_THAT(resp->message(), HasSubstr("exhausted"));
}

// ---- crossover -----------------------------------------------------------------------------

TEST(ParametricMutatorTest, CrossoverTakesEachKnobFromAParent) {
  const Fixture f = Fixture::Make(MakeProblem(
      "cross", {{"A", {1, 2, 3, 4}}, {"B", {1, 2, 3, 4}}, {"C", {1, 2, 3, 4}}, {"D", {1, 2, 3, 4}}}, {}));
  const ParamAssignment a1 = {{"A", 1}, {"B", 1}, {"C", 1}, {"D", 1}};
  const ParamAssignment a2 = {{"A", 4}, {"B", 4}, {"C", 4}, {"D", 4}};
  const v1::Candidate p1 = f.Parent(a1, "p1"), p2 = f.Parent(a2, "p2");
  const std::set<std::string> seen = {p1.content_hash(), p2.content_hash()};
  ParametricMutator mutator;
  std::map<std::string, std::set<int64_t>> taken;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    for (const std::string strategy : {"", "explore", "exploit"}) {
      auto resp = mutator.Mutate(Request(f.problem, {p1, p2}, seed, 1, strategy), SeenIn(seen));
      ASSERT_TRUE(resp.ok()) << resp.status();
      ASSERT_EQ(resp->children_size(), 1);
      const v1::Candidate& c = resp->children(0);
      EXPECT_EQ(c.note(), "crossover") << "seed " << seed;
      EXPECT_THAT(c.parent_ids(), ElementsAre("p1", "p2"));
      for (const auto& [k, v] : ParamsOf(c)) {
        ASSERT_TRUE(v == 1 || v == 4) << k << "=" << v << " seed " << seed;
        taken[k].insert(v);
      }
    }
  }
  for (const auto& [k, vals] : taken) EXPECT_EQ(vals.size(), 2u) << k << " always came from one parent";
}

TEST(ParametricMutatorTest, CrossoverChildrenAreValid) {
  // A + B <= 5 forbids mixing A=4 with B=3 or 4.
  const Fixture f =
      Fixture::Make(MakeProblem("crossc", {{"A", {1, 2, 3, 4}}, {"B", {1, 2, 3, 4}}, {"C", {1, 2}}}, {"A + B <= 5"}));
  const ParamAssignment a1 = {{"A", 4}, {"B", 1}, {"C", 1}};
  const ParamAssignment a2 = {{"A", 1}, {"B", 4}, {"C", 2}};
  const v1::Candidate p1 = f.Parent(a1, "p1"), p2 = f.Parent(a2, "p2");
  const std::set<std::string> seen = {p1.content_hash(), p2.content_hash()};
  ParametricMutator mutator;
  int crossovers = 0;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    auto resp = mutator.Mutate(Request(f.problem, {p1, p2}, seed, 1), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 1);
    const ParamAssignment child = ParamsOf(resp->children(0));
    auto valid = f.space.IsValid(child);
    ASSERT_TRUE(valid.ok() && *valid) << FormatParams(child);
    if (resp->children(0).note() == "crossover") {
      ++crossovers;
      for (const auto& [k, v] : child) EXPECT_TRUE(v == a1.at(k) || v == a2.at(k)) << FormatParams(child);
      EXPECT_FALSE(child.at("A") == 4 && child.at("B") == 4);
    }
  }
  EXPECT_GT(crossovers, 400);
}

// ---- determinism and errors ----------------------------------------------------------------

TEST(ParametricMutatorTest, SameSeedSameChildren) {
  const Fixture f = Fixture::Make(TiledProblem());
  std::set<std::string> seen = {f.seed.content_hash()};
  std::set<std::string> distinct_first;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (const std::string strategy : {"", "explore", "exploit"}) {
      ParametricMutator m1, m2;
      const v1::MutateRequest req = Request(f.problem, {f.seed}, seed, 4, strategy);
      auto r1 = m1.Mutate(req, SeenIn(seen));
      auto r2 = m2.Mutate(req, SeenIn(seen));
      auto r3 = m1.Mutate(req, SeenIn(seen));  // the same instance again: no hidden state
      ASSERT_TRUE(r1.ok() && r2.ok() && r3.ok());
      ASSERT_EQ(r1->children_size(), 4);
      for (const auto* other : {&*r2, &*r3}) {
        ASSERT_EQ(other->children_size(), r1->children_size());
        for (int i = 0; i < r1->children_size(); ++i) {
          EXPECT_EQ(other->children(i).content_hash(), r1->children(i).content_hash()) << "seed " << seed;
          EXPECT_EQ(other->children(i).note(), r1->children(i).note());
        }
      }
      distinct_first.insert(r1->children(0).content_hash());
    }
  }
  EXPECT_GT(distinct_first.size(), 5u) << "different seeds should explore different children";
}

TEST(ParametricMutatorTest, NoParentIsAnError) {
  const Fixture f = Fixture::Make(TinyProblem());
  ParametricMutator mutator;
  auto resp = mutator.Mutate(Request(f.problem, {}, 1), SeenIn({}));
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument);
}

// A PyTorch problem no template fits has no seed: no parent is no error, just no child, and the
// message says only a model writes the first kernel.
TEST(ParametricMutatorTest, ASeedlessPytorchProblemGetsNoChildAndWhy) {
  Fixture f = Fixture::Make(TinyProblem());
  f.problem.mutable_reference()->mutable_pytorch()->set_source("class Model: pass");
  ParametricMutator mutator;
  auto resp = mutator.Mutate(Request(f.problem, {}, 1), SeenIn({}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_TRUE(resp->children().empty());
  EXPECT_THAT(resp->message(), ::testing::HasSubstr("only a model writes its first kernel"));
}

TEST(ParametricMutatorTest, AnUnparsableConstraintIsAnError) {
  const v1::Problem p = MakeProblem("broken", {{"A", {1, 2}}}, {"A <= "});
  v1::Candidate seed = MakeSeedCandidate(p, {{"A", 1}});
  seed.set_id("seed");
  ParametricMutator mutator;
  auto resp = mutator.Mutate(Request(p, {seed}, 1), SeenIn({}));
  EXPECT_FALSE(resp.ok());
}

TEST(ParametricMutatorTest, AParentOutsideTheDeclaredValuesStillGetsValidChildren) {
  const Fixture f = Fixture::Make(TiledProblem());
  v1::Candidate odd = f.seed;
  (*odd.mutable_params())["TILE"] = 12;  // not declared
  odd.set_content_hash(HashCandidate(odd));
  ParametricMutator mutator;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    auto resp = mutator.Mutate(Request(f.problem, {odd}, seed, 2, "exploit"), SeenIn({odd.content_hash()}));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 2);
    for (const auto& c : resp->children()) {
      auto valid = f.space.IsValid(ParamsOf(c));
      EXPECT_TRUE(valid.ok() && *valid) << FormatParams(ParamsOf(c));
    }
  }
}

TEST(ParametricMutatorTest, OneMutatorServesSeveralProblems) {
  // The mutator caches each problem's space; problems must not leak into each other.
  const Fixture tiled = Fixture::Make(TiledProblem());
  const Fixture grid = Fixture::Make(GridProblem());
  ParametricMutator mutator;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (const Fixture* f : {&tiled, &grid}) {
      auto resp = mutator.Mutate(Request(f->problem, {f->seed}, seed, 2), SeenIn({f->seed.content_hash()}));
      ASSERT_TRUE(resp.ok()) << resp.status();
      for (const auto& c : resp->children()) {
        auto valid = f->space.IsValid(ParamsOf(c));
        EXPECT_TRUE(valid.ok() && *valid) << f->problem.name() << ": " << FormatParams(ParamsOf(c));
      }
    }
  }
}

TEST(ParametricMutatorTest, ProblemsWithoutAContentHashDoNotShareASpace) {
  // The space cache is keyed by the problem's content hash. A request whose problem lacks one
  // (a client that never ran HashProblem) must be refused or served with its own space, never
  // with the space of another problem that also lacked one.
  v1::Problem tiled = TiledProblem(), grid = GridProblem();
  tiled.clear_content_hash();
  grid.clear_content_hash();
  const Fixture ft = Fixture::Make(tiled), fg = Fixture::Make(grid);
  ParametricMutator mutator;
  auto first = mutator.Mutate(Request(tiled, {ft.seed}, 1, 1), SeenIn({ft.seed.content_hash()}));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = mutator.Mutate(Request(grid, {fg.seed}, 1, 3), SeenIn({fg.seed.content_hash()}));
  if (!second.ok()) return;  // refusing is fine
  for (const auto& c : second->children()) {
    auto valid = fg.space.IsValid(ParamsOf(c));
    EXPECT_TRUE(valid.ok() && *valid) << "a grid child with the tiled problem's knobs: " << FormatParams(ParamsOf(c));
  }
}

TEST(ParametricMutatorTest, TheSpaceCacheStaysBounded) {
  // Every distinct space a client sends is parsed and cached; the cache keeps the most recently
  // used few, so a stream of made-up problems cannot grow it without end.
  ParametricMutator mutator({.max_cached_spaces = 4});
  std::vector<v1::Problem> problems;
  for (int i = 0; i < 40; ++i) {
    problems.push_back(MakeProblem(absl::StrCat("p", i), {{"A", {1, 2, 100 + i}}, {"B", {1, 2}}}, {}));
  }
  for (const v1::Problem& p : problems) {
    v1::Candidate seed = MakeSeedCandidate(p, {{"A", 1}, {"B", 1}});
    seed.set_id("seed");
    auto resp = mutator.Mutate(Request(p, {seed}, 1), SeenIn({seed.content_hash()}));
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_LE(mutator.cached_spaces(), 4u);
  }
  EXPECT_EQ(mutator.cached_spaces(), 4u);
  // An evicted problem is parsed again, and right.
  const Fixture f = Fixture::Make(problems.front());
  auto resp = mutator.Mutate(Request(f.problem, {f.seed}, 2, 3), SeenIn({f.seed.content_hash()}));
  ASSERT_TRUE(resp.ok()) << resp.status();
  for (const auto& c : resp->children()) {
    auto valid = f.space.IsValid(ParamsOf(c));
    EXPECT_TRUE(valid.ok() && *valid) << FormatParams(ParamsOf(c));
  }
  EXPECT_EQ(mutator.cached_spaces(), 4u);
}

// ---- the variant memo -----------------------------------------------------------------------

// The memo only saves work: a job proposes exactly what it would without it, whether the memo
// keeps everything, starts over every few entries, or is off.
// The children of a response count as seen, and join the pool of parents (with ids).
void Adopt(const v1::MutateResponse& resp, std::set<std::string>& seen,
           std::vector<v1::Candidate>& pool) {
  for (const auto& c : resp.children()) {
    seen.insert(c.content_hash());
    v1::Candidate child = c;
    child.set_id(absl::StrCat("c", seen.size()));
    pool.push_back(child);
  }
}

TEST(ParametricMutatorTest, TheVariantMemoChangesNoChild) {
  for (const v1::Problem& problem : {TiledProblem(), WideProblem(), GridProblem()}) {
    const Fixture f = Fixture::Make(problem);
    ParametricMutator plain({.max_memo_variants = 0});
    ParametricMutator memo;
    ParametricMutator small({.max_memo_variants = 7});
    std::set<std::string> seen = {f.seed.content_hash()};
    std::vector<v1::Candidate> pool = {f.seed};
    std::mt19937_64 rng(11);
    for (int call = 0; call < 400; ++call) {
      std::vector<v1::Candidate> parents = {pool[rng() % pool.size()]};
      if (rng() % 4 == 0) parents.push_back(pool[rng() % pool.size()]);
      static const char* const kStrategies[] = {"", "explore", "exploit", "perturb"};
      const v1::MutateRequest req =
          Request(problem, parents, rng(), 1 + rng() % 3, kStrategies[rng() % 4]);
      auto want = plain.Mutate(req, SeenIn(seen));
      ASSERT_TRUE(want.ok()) << want.status();
      for (ParametricMutator* m : {&memo, &small}) {
        auto got = m->Mutate(req, SeenIn(seen));
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(got->children_size(), want->children_size())
            << problem.name() << " call " << call;
        for (int i = 0; i < want->children_size(); ++i) {
          EXPECT_EQ(got->children(i).content_hash(), want->children(i).content_hash())
              << problem.name();
          EXPECT_EQ(got->children(i).note(), want->children(i).note());
        }
      }
      EXPECT_EQ(plain.memo_variants(), 0u);
      EXPECT_LE(small.memo_variants(), 7u);
      Adopt(*want, seen, pool);
      if (!want->message().empty()) break;
    }
    EXPECT_GT(memo.memo_variants(), 0u) << problem.name();
  }
}

// A caller that says a parent's single-knob variants are used up (because a response said so, and
// its seen set has only grown since) gets the same children: the hint saves lookups, not draws.
// Every parent a response calls used up really is.
TEST(ParametricMutatorTest, TheUsedUpHintIsTrueAndChangesNoChild) {
  for (const v1::Problem& problem : {TiledProblem(), WideProblem(), GridProblem()}) {
    const Fixture f = Fixture::Make(problem);
    ParametricMutator plain, hinted;
    std::set<std::string> seen = {f.seed.content_hash()};
    std::vector<v1::Candidate> pool = {f.seed};
    std::set<std::string> used_up;  // parents' ids
    std::mt19937_64 rng(5);
    int hints = 0;
    for (int call = 0; call < 600; ++call) {
      // Mostly the same few parents, so that their neighbourhoods get used up.
      const size_t few = std::min<size_t>(pool.size(), 3);
      std::vector<v1::Candidate> parents = {
          pool[rng() % 4 == 0 ? rng() % pool.size() : rng() % few]};
      if (rng() % 5 == 0) parents.push_back(pool[rng() % pool.size()]);
      static const char* const kStrategies[] = {"", "exploit", "exploit", "perturb"};
      v1::MutateRequest req =
          Request(problem, parents, rng(), 1 + rng() % 3, kStrategies[rng() % 4]);
      auto want = plain.Mutate(req, SeenIn(seen));
      ASSERT_TRUE(want.ok()) << want.status();
      req.set_neighbours_used_up(used_up.contains(parents[0].id()));
      hints += req.neighbours_used_up();
      auto got = hinted.Mutate(req, SeenIn(seen));
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->children_size(), want->children_size()) << problem.name() << " call " << call;
      for (int i = 0; i < want->children_size(); ++i) {
        EXPECT_EQ(got->children(i).content_hash(), want->children(i).content_hash())
            << problem.name() << " call " << call;
        EXPECT_EQ(got->children(i).note(), want->children(i).note());
      }
      if (want->neighbours_used_up()) {
        const ParamAssignment at = ParamsOf(parents[0]);
        for (const ParamAssignment& a : f.valid) {
          if (Distance(f, at, a).changed != 1) continue;
          EXPECT_TRUE(seen.contains(f.hash.at(a)))
              << problem.name() << " call " << call << ": " << FormatParams(a)
              << " is an unseen neighbour of " << FormatParams(at);
        }
        used_up.insert(parents[0].id());
      }
      EXPECT_TRUE(!req.neighbours_used_up() || got->neighbours_used_up());
      Adopt(*want, seen, pool);
      if (!want->message().empty()) break;
    }
    EXPECT_GT(hints, 5) << problem.name();
  }
}

// A wrong hint (an unseen neighbour remains) costs only that neighbour: the child is still valid
// and unseen.
TEST(ParametricMutatorTest, AWrongUsedUpHintStillGivesAnUnseenChild) {
  const Fixture f = Fixture::Make(GridProblem());
  const ParamAssignment centre = {{"X", 15}, {"Y", 15}};
  const ParamAssignment target = {{"X", 18}, {"Y", 15}};
  const v1::Candidate parent = f.Parent(centre, "p");
  std::set<std::string> seen = {parent.content_hash()};
  for (const auto& a : Reach(f, centre)) {
    if (a != target) seen.insert(f.hash.at(a));
  }
  ParametricMutator mutator;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    v1::MutateRequest req = Request(f.problem, {parent}, seed, 1, "exploit");
    req.set_neighbours_used_up(true);
    auto resp = mutator.Mutate(req, SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
    ASSERT_EQ(resp->children_size(), 1);
    EXPECT_FALSE(seen.contains(resp->children(0).content_hash()));
    EXPECT_TRUE(f.hash.contains(ParamsOf(resp->children(0))));
  }
}

// What the memo holds belongs to one space and one parent source: a parent with other code, or a
// problem with other constraints, gets its own hashes and validity.
TEST(ParametricMutatorTest, TheVariantMemoIsPerSpaceAndParentSource) {
  ParametricMutator mutator;
  const Fixture open =
      Fixture::Make(MakeProblem("grid", {{"A", {1, 2, 3, 4}}, {"B", {1, 2, 3, 4}}}, {}));
  const Fixture closed =
      Fixture::Make(MakeProblem("grid", {{"A", {1, 2, 3, 4}}, {"B", {1, 2, 3, 4}}}, {"A <= B"}));
  // Every variant of the open problem's seed is tried and remembered.
  std::set<std::string> seen = {open.seed.content_hash()};
  for (uint64_t seed = 0; seed < 40; ++seed) {
    auto resp =
        mutator.Mutate(Request(open.problem, {open.seed}, seed, 3, "explore"), SeenIn(seen));
    ASSERT_TRUE(resp.ok()) << resp.status();
  }
  ASSERT_GT(mutator.memo_variants(), 0u);
  // The constrained problem's children satisfy its constraint.
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto resp = mutator.Mutate(Request(closed.problem, {closed.seed}, seed, 3, "explore"),
                               SeenIn({closed.seed.content_hash()}));
    ASSERT_TRUE(resp.ok()) << resp.status();
    for (const auto& c : resp->children()) {
      auto valid = closed.space.IsValid(ParamsOf(c));
      EXPECT_TRUE(valid.ok() && *valid) << FormatParams(ParamsOf(c));
    }
  }
  // A parent with other code: its children's hashes are their own, and a variant its seen set
  // holds under the other source is not taken for seen.
  v1::Candidate rewritten = open.seed;
  rewritten.set_source(
      absl::StrCat(open.seed.source(), "kernel void unused(global float* y) { y[0] = 1; }\n"));
  rewritten.set_content_hash(HashCandidate(rewritten));
  std::set<std::string> seen_old = seen;
  for (const auto& [a, h] : open.hash) seen_old.insert(h);  // every old-source variant
  auto resp = mutator.Mutate(Request(open.problem, {rewritten}, 3, 5), SeenIn(seen_old));
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->children_size(), 5);
  for (const auto& c : resp->children()) {
    EXPECT_EQ(c.content_hash(), HashCandidate(c));
    EXPECT_EQ(c.source(), rewritten.source());
  }
}

TEST(ParametricMutatorTest, AProblemClaimingAnothersHashGetsItsOwnSpace) {
  // The content hash comes from the client: a problem that borrows another's must neither get
  // that problem's cached space nor replace it.
  const Fixture tiled = Fixture::Make(TiledProblem());
  v1::Problem impostor = GridProblem();
  impostor.set_content_hash(tiled.problem.content_hash());
  const Fixture grid = Fixture::Make(impostor);
  ParametricMutator mutator;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    for (const Fixture* f : {&tiled, &grid, &tiled}) {
      auto resp = mutator.Mutate(Request(f->problem, {f->seed}, seed, 2), SeenIn({f->seed.content_hash()}));
      ASSERT_TRUE(resp.ok()) << resp.status();
      for (const auto& c : resp->children()) {
        auto valid = f->space.IsValid(ParamsOf(c));
        EXPECT_TRUE(valid.ok() && *valid) << f->problem.name() << ": " << FormatParams(ParamsOf(c));
      }
    }
  }
}

TEST(ParametricMutatorTest, AKnobWithoutValuesIsAnErrorNotACrash) {
  v1::Problem p = MakeProblem("empty-knob", {{"A", {1, 2}}, {"B", {}}}, {});
  v1::Candidate seed = MakeSeedCandidate(p, {{"A", 1}});
  seed.set_id("seed");
  ParametricMutator mutator;
  for (const std::string strategy : {"", "explore", "global", "perturb", "exploit"}) {
    auto resp = mutator.Mutate(Request(p, {seed}, 1, 4, strategy), SeenIn({}));
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kInvalidArgument) << strategy;
    EXPECT_THAT(resp.status().message(), HasSubstr("'B' has no values"));
  }
}

TEST(ParametricMutatorTest, ACancelledCallStopsWithCancelled) {
  const Fixture f = Fixture::Make(TiledProblem());
  ParametricMutator mutator;
  int checks = 0;
  auto resp = mutator.MutateCancellable(Request(f.problem, {f.seed}, 1, 50), SeenIn({f.seed.content_hash()}),
                                        [&checks] { return ++checks > 3; });
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace kforge::llm
