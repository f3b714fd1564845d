// CheckProblem: every example passes; crafted problems are refused with the field named; and the
// UTF-8 helpers that guard text crossing a trust boundary.

#include <filesystem>
#include <limits>
#include <string>

#include "common/problem_check.h"
#include "common/problem_loader.h"
#include "common/utf8.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

v1::Problem Example(const std::string& rel) {
  auto p = LoadProblem(testing::SourceDir() + "/examples/" + rel);
  EXPECT_TRUE(p.ok()) << rel << ": " << p.status();
  return p.ok() ? *p : v1::Problem();
}

TEST(ProblemCheckTest, EveryExamplePasses) {
  for (const char* kind : {"opencl", "cuda", "replay"}) {
    for (const auto& e : std::filesystem::directory_iterator(testing::SourceDir() + "/examples/" + kind)) {
      if (!std::filesystem::exists(e.path() / "problem.yaml")) continue;
      const v1::Problem p = Example(std::string(kind) + "/" + e.path().filename().string());
      EXPECT_TRUE(CheckProblem(p, ProblemLimits()).ok()) << e.path() << ": " << CheckProblem(p, ProblemLimits());
    }
  }
}

TEST(ProblemCheckTest, CraftedProblemsNameTheField) {
  const v1::Problem good = Example("opencl/transpose");
  struct Case {
    const char* want;  // in the message
    std::function<void(v1::Problem&)> mutate;
  };
  const std::vector<Case> cases = {
      {"buffers[0] (", [](auto& p) { p.mutable_buffers(0)->set_dtype(static_cast<v1::DType>(42)); }},
      {".shape in size set 0", [](auto& p) { p.mutable_buffers(0)->set_shape(0, "N / 0"); }},
      {"per-buffer limit", [](auto& p) { p.mutable_buffers(0)->set_shape(0, "1099511627776"); }},
      {"shape overflows", [](auto& p) { p.mutable_buffers(0)->set_shape(0, "1152921504606846976"); }},
      {"check.atol", [](auto& p) { p.mutable_check()->set_atol(std::numeric_limits<double>::quiet_NaN()); }},
      {"check.rtol", [](auto& p) { p.mutable_check()->set_rtol(-1); }},
      {"check.trials", [](auto& p) { p.mutable_check()->set_trials(1 << 20); }},
      {"description", [](auto& p) { p.set_description("bad \xC3\x28 text"); }},
      {"name", [](auto& p) { p.set_name(std::string(30000, 'n')); }},
      {"backend", [](auto& p) { p.set_backend(static_cast<v1::Backend>(9)); }},
      {"seed.params[0].values", [](auto& p) { p.mutable_seed()->mutable_params(0)->clear_values(); }},
      {"reference.source", [](auto& p) { p.mutable_reference()->set_source(std::string("a\0b", 3)); }},
      {"already defined", [](auto& p) { *p.add_buffers() = p.buffers(0); }},
  };
  for (const auto& c : cases) {
    v1::Problem p = good;
    c.mutate(p);
    absl::Status st = CheckProblem(p, ProblemLimits());
    ASSERT_FALSE(st.ok()) << c.want;
    EXPECT_NE(std::string(st.message()).find(c.want), std::string::npos) << st;
    EXPECT_LE(st.message().size(), 400u) << st;
  }
}

TEST(Utf8Test, ValidityAndRepair) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  for (const char* bad : {"\xC3", "\xC3\x28", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF", "\x80"}) {
    EXPECT_FALSE(IsValidUtf8(bad)) << bad;
    EXPECT_TRUE(IsValidUtf8(SanitizeUtf8(std::string("x") + bad + "y")));
  }
  EXPECT_EQ(SanitizeUtf8("a\xFF" "b"), "a?b");
  EXPECT_EQ(Quoted("short"), "'short'");
  const std::string q = Quoted(std::string(200000, 'z'));
  EXPECT_LT(q.size(), 120u);
  EXPECT_NE(q.find("200000 bytes"), std::string::npos);
  // Cut on a character boundary.
  std::string euros;
  for (int i = 0; i < 100; ++i) euros += "\xE2\x82\xAC";
  EXPECT_TRUE(IsValidUtf8(Quoted(euros)));
}

}  // namespace
}  // namespace kforge
