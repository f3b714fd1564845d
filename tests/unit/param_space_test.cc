#include "common/param_space.h"

#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kforge/v1/problem.pb.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;

struct ParamDecl {
  std::string name;
  std::vector<int64_t> values;
};

v1::Problem MakeProblem(const std::vector<ParamDecl>& params,
                        const std::vector<std::string>& constraints,
                        const std::vector<std::vector<std::pair<std::string, int64_t>>>& sets = {
                            {{"N", 256}}}) {
  v1::Problem p;
  p.set_name("p");
  p.set_backend(v1::BACKEND_OPENCL);
  int i = 0;
  for (const auto& sizes : sets) {
    v1::SizeSet* s = p.add_size_sets();
    s->set_name(i++ == 0 ? "default" : "set" + std::to_string(i));
    s->set_bench(true);
    for (const auto& [k, v] : sizes) (*s->mutable_sizes())[k] = v;
  }
  for (const auto& d : params) {
    v1::Param* prm = p.mutable_seed()->add_params();
    prm->set_name(d.name);
    for (int64_t v : d.values) prm->add_values(v);
  }
  for (const auto& c : constraints) p.mutable_seed()->add_constraints(c);
  return p;
}

ParamSpace MustCreate(const v1::Problem& p) {
  auto s = ParamSpace::Create(p);
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

TEST(ParamSpaceTest, NoParams) {
  ParamSpace s = MustCreate(MakeProblem({}, {}));
  EXPECT_EQ(s.TotalAssignments(), 1);
  EXPECT_TRUE(s.Decode(0).empty());
  auto [count, exact] = s.CountValid(100);
  EXPECT_EQ(count, 1);
  EXPECT_TRUE(exact);
  auto d = s.DefaultAssignment();
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->empty());
}

TEST(ParamSpaceTest, TotalAssignmentsIsTheProduct) {
  ParamSpace s = MustCreate(MakeProblem({{"A", {1, 2, 3}}, {"B", {1, 2}}, {"C", {5, 6, 7, 8}}}, {}));
  EXPECT_EQ(s.TotalAssignments(), 24);
  ASSERT_EQ(s.params().size(), 3u);
  EXPECT_EQ(s.params()[0].name(), "A");
  EXPECT_EQ(s.constraint_count(), 0u);
}

TEST(ParamSpaceTest, TotalAssignmentsSaturates) {
  std::vector<ParamDecl> params;
  std::vector<int64_t> values;
  for (int64_t v = 0; v < 1000; ++v) values.push_back(v);
  for (int i = 0; i < 8; ++i) params.push_back({"P" + std::to_string(i), values});  // 1000^8
  ParamSpace s = MustCreate(MakeProblem(params, {}));
  EXPECT_EQ(s.TotalAssignments(), std::numeric_limits<int64_t>::max());
  // Counting is bounded by the limit and says it is not exact.
  auto [count, exact] = s.CountValid(50);
  EXPECT_EQ(count, 50);
  EXPECT_FALSE(exact);
}

TEST(ParamSpaceTest, DecodeIsMixedRadixFirstParamSlowest) {
  ParamSpace s = MustCreate(MakeProblem({{"A", {10, 20}}, {"B", {1, 2, 3}}}, {}));
  const std::vector<ParamAssignment> want = {
      {{"A", 10}, {"B", 1}}, {{"A", 10}, {"B", 2}}, {{"A", 10}, {"B", 3}},
      {{"A", 20}, {"B", 1}}, {{"A", 20}, {"B", 2}}, {{"A", 20}, {"B", 3}},
  };
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(s.Decode(i), want[i]) << i;
}

TEST(ParamSpaceTest, DecodeCoversEveryAssignmentOnce) {
  ParamSpace s = MustCreate(MakeProblem({{"A", {1, 2, 3}}, {"B", {4, 5}}, {"C", {6, 7, 8, 9}}}, {}));
  std::set<ParamAssignment> seen;
  for (int64_t i = 0; i < s.TotalAssignments(); ++i) seen.insert(s.Decode(i));
  EXPECT_EQ(seen.size(), 24u);
}

TEST(ParamSpaceTest, ValueIndicesAndFromIndicesRoundTrip) {
  ParamSpace s = MustCreate(MakeProblem({{"TILE", {8, 16, 32}}, {"WPT", {1, 2, 4, 8}}}, {}));
  for (int64_t i = 0; i < s.TotalAssignments(); ++i) {
    const ParamAssignment a = s.Decode(i);
    auto idx = s.ValueIndices(a);
    ASSERT_TRUE(idx.has_value());
    EXPECT_EQ(s.FromIndices(*idx), a);
  }
  auto idx = s.ValueIndices({{"TILE", 32}, {"WPT", 2}});
  ASSERT_TRUE(idx.has_value());
  EXPECT_EQ(*idx, (std::vector<int>{2, 1}));
  // Undeclared value, missing param, extra param.
  EXPECT_FALSE(s.ValueIndices({{"TILE", 12}, {"WPT", 2}}).has_value());
  EXPECT_FALSE(s.ValueIndices({{"TILE", 8}}).has_value());
  EXPECT_FALSE(s.ValueIndices({{"TILE", 8}, {"WPT", 2}, {"X", 1}}).has_value());
  EXPECT_FALSE(s.ValueIndices({{"TILE", 8}, {"XPT", 2}}).has_value());
}

TEST(ParamSpaceTest, IsValidChecksDeclaredValuesAndConstraints) {
  ParamSpace s = MustCreate(MakeProblem({{"TILE", {8, 16, 32}}, {"WPT", {1, 2, 4, 8}}},
                                        {"TILE % WPT == 0", "TILE * TILE / WPT <= 256"}));
  EXPECT_EQ(s.constraint_count(), 2u);
  EXPECT_TRUE(*s.IsValid({{"TILE", 16}, {"WPT", 1}}));
  EXPECT_TRUE(*s.IsValid({{"TILE", 32}, {"WPT", 4}}));
  EXPECT_FALSE(*s.IsValid({{"TILE", 32}, {"WPT", 2}}));   // 512 > 256
  EXPECT_FALSE(*s.IsValid({{"TILE", 12}, {"WPT", 1}}));   // undeclared value
  EXPECT_FALSE(*s.IsValid({{"TILE", 16}}));               // incomplete
  EXPECT_TRUE(*s.Holds(0, {{"TILE", 32}, {"WPT", 2}}));
  EXPECT_FALSE(*s.Holds(1, {{"TILE", 32}, {"WPT", 2}}));
}

TEST(ParamSpaceTest, ConstraintsMustHoldOnEverySizeSet) {
  ParamSpace s = MustCreate(MakeProblem({{"T", {1, 2, 4, 8}}}, {"N % T == 0"},
                                        {{{"N", 64}}, {{"N", 12}}}));
  EXPECT_TRUE(*s.IsValid({{"T", 4}}));
  EXPECT_FALSE(*s.IsValid({{"T", 8}}));  // 64 % 8 == 0 but 12 % 8 != 0
  auto [count, exact] = s.CountValid(1000);
  EXPECT_EQ(count, 3);
  EXPECT_TRUE(exact);
}

TEST(ParamSpaceTest, ValidAssignmentsAreListedInEnumerationOrderUpToACount) {
  ParamSpace s =
      MustCreate(MakeProblem({{"T", {1, 2, 4, 8}}}, {"N % T == 0"}, {{{"N", 64}}, {{"N", 12}}}));
  const std::vector<ParamAssignment> all = {{{"T", 1}}, {{"T", 2}}, {{"T", 4}}};
  EXPECT_EQ(s.ValidAssignments(), all);
  EXPECT_EQ(s.ValidAssignments(2), std::vector<ParamAssignment>(all.begin(), all.begin() + 2));
  EXPECT_TRUE(s.ValidAssignments(0).empty());
}

TEST(ParamSpaceTest, ConstraintsSeeDefines) {
  v1::Problem p = MakeProblem({{"T", {8, 16, 32}}}, {"T <= LIMIT"});
  (*p.mutable_seed()->mutable_defines())["LIMIT"] = 16;
  ParamSpace s = MustCreate(p);
  EXPECT_TRUE(*s.IsValid({{"T", 16}}));
  EXPECT_FALSE(*s.IsValid({{"T", 32}}));
}

TEST(ParamSpaceTest, EvaluationErrorsAreErrors) {
  ParamSpace s = MustCreate(MakeProblem({{"B", {0, 2}}}, {"N % B == 0"}));
  auto ok = s.IsValid({{"B", 0}});
  ASSERT_FALSE(ok.ok());
  EXPECT_THAT(std::string(ok.status().message()), HasSubstr("N % B == 0"));
  EXPECT_THAT(std::string(ok.status().message()), HasSubstr("division by zero"));
  EXPECT_TRUE(*s.IsValid({{"B", 2}}));
  // Counting treats an error as invalid.
  EXPECT_EQ(s.CountValid(10).first, 1);
  // A guard makes it safe.
  ParamSpace g = MustCreate(MakeProblem({{"B", {0, 2}}}, {"B != 0 && N % B == 0"}));
  auto guarded = g.IsValid({{"B", 0}});
  ASSERT_TRUE(guarded.ok()) << guarded.status();
  EXPECT_FALSE(*guarded);
}

TEST(ParamSpaceTest, CreateRejectsBadConstraint) {
  auto s = ParamSpace::Create(MakeProblem({{"T", {1}}}, {"T > 0", "T +* 2"}));
  ASSERT_FALSE(s.ok());
  const std::string msg(s.status().message());
  EXPECT_THAT(msg, HasSubstr("constraints[1]"));
  EXPECT_THAT(msg, HasSubstr("T +* 2"));
  EXPECT_THAT(msg, HasSubstr("column 4"));
}

TEST(ParamSpaceTest, CountFirstAndDefault) {
  ParamSpace s = MustCreate(MakeProblem({{"TILE", {8, 16, 32}}, {"WPT", {1, 2, 4, 8}}},
                                        {"TILE % WPT == 0", "TILE * TILE / WPT <= 256"}));
  // Brute force.
  int64_t want = 0;
  for (int64_t tile : {8, 16, 32}) {
    for (int64_t wpt : {1, 2, 4, 8}) want += (tile % wpt == 0 && tile * tile / wpt <= 256);
  }
  auto [count, exact] = s.CountValid(1 << 20);
  EXPECT_EQ(count, want);
  EXPECT_TRUE(exact);
  auto [partial, partial_exact] = s.CountValid(4);  // the TILE=8 row: all four valid
  EXPECT_EQ(partial, 4);
  EXPECT_FALSE(partial_exact);

  auto first = s.FirstValid(100);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, (ParamAssignment{{"TILE", 8}, {"WPT", 1}}));
  auto d = s.DefaultAssignment();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, (ParamAssignment{{"TILE", 8}, {"WPT", 1}}));
}

TEST(ParamSpaceTest, DefaultIsDeclaredFirstValuesWhenValid) {
  ParamSpace s = MustCreate(MakeProblem({{"TILE", {32, 8, 16}}, {"WPT", {4, 1}}}, {"TILE % WPT == 0"}));
  auto d = s.DefaultAssignment();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, (ParamAssignment{{"TILE", 32}, {"WPT", 4}}));
}

TEST(ParamSpaceTest, DefaultFallsBackToFirstValid) {
  // The first values (T=64, U=3) violate the constraint (192 > 100); the next assignment in
  // enumeration order, (T=64, U=1), is the first valid one.
  ParamSpace s = MustCreate(MakeProblem({{"T", {64, 8}}, {"U", {3, 1}}}, {"T * U <= 100"}));
  auto d = s.DefaultAssignment();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, (ParamAssignment{{"T", 64}, {"U", 1}}));

  ParamSpace none = MustCreate(MakeProblem({{"T", {1, 2}}}, {"T > 5"}));
  EXPECT_FALSE(none.DefaultAssignment().has_value());
  EXPECT_FALSE(none.FirstValid(100).has_value());
  EXPECT_EQ(none.CountValid(100).first, 0);
}

TEST(ParamSpaceTest, FirstValidRespectsLimit) {
  ParamSpace s = MustCreate(MakeProblem({{"T", {1, 2, 3, 4, 5}}}, {"T == 5"}));
  EXPECT_FALSE(s.FirstValid(4).has_value());
  auto f = s.FirstValid(5);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->at("T"), 5);
  EXPECT_FALSE(s.DefaultAssignment(3).has_value());
}

}  // namespace
}  // namespace kforge
