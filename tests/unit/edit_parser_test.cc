// Model replies as they really come: prose around blocks, fences with and without language
// tags, CRLF, several edits, a new launch plan, truncation, and edits that do not apply.

#include "services/llm-proxy/edit_parser.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge::llm {
namespace {

using ::testing::HasSubstr;

constexpr char kParent[] =
    "__kernel void add(__global const float* a, __global float* c, int n) {\n"
    "  int i = get_global_id(0);\n"
    "  if (i < n) c[i] = a[i];\n"
    "}\n";

TEST(EditParserTest, EditsInsideAFenceWithProseAround) {
  const std::string reply =
      "I will unroll the loop. Here is the change:\n\n```c\n<<<<<<< SEARCH\n  if (i < n) c[i] = a[i];\n=======\n"
      "  if (i < n) c[i] = 2.0f * a[i];\n>>>>>>> REPLACE\n```\nThis should be faster.\n";
  auto r = ParseModelReply(reply);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->edits.size(), 1u);
  EXPECT_FALSE(r->whole_source.has_value());
  EXPECT_EQ(r->edits[0].line, 4);
  auto applied = ApplyEdits(kParent, r->edits);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, HasSubstr("c[i] = 2.0f * a[i];"));
  EXPECT_THAT(*applied, ::testing::Not(HasSubstr("c[i] = a[i];")));
}

TEST(EditParserTest, CrlfAndSeveralEditsAndALaunchPlan) {
  const std::string reply =
      "<<<<<<< SEARCH\r\n  int i = get_global_id(0);\r\n=======\r\n  int i = get_global_id(0) * 2;\r\n>>>>>>> REPLACE\r\n"
      "<<<<<<< SEARCH\r\n  if (i < n) c[i] = a[i];\r\n=======\r\n  if (i < n) { c[i] = a[i]; c[i + 1] = a[i + 1]; }\r\n"
      ">>>>>>> REPLACE\r\n\r\n```yaml\r\nlaunches:\r\n  - {kernel: add, global: [\"N / 2\"], args: [a, c, N]}\r\n```\r\n";
  auto r = ParseModelReply(reply);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->edits.size(), 2u);
  ASSERT_TRUE(r->launch_plan_yaml.has_value());
  EXPECT_THAT(*r->launch_plan_yaml, HasSubstr("launches:"));
  EXPECT_EQ(r->launch_plan_yaml->find('\r'), std::string::npos);
  auto applied = ApplyEdits(kParent, r->edits);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_THAT(*applied, HasSubstr("get_global_id(0) * 2"));
  EXPECT_THAT(*applied, HasSubstr("c[i + 1] = a[i + 1];"));
}

TEST(EditParserTest, WholeFileWithOrWithoutLanguageTag) {
  for (const char* fence : {"```", "```opencl", "```cuda", "``` c++"}) {
    const std::string reply = std::string("Rewritten kernel:\n") + fence + "\n" + kParent + "```\n";
    auto r = ParseModelReply(reply);
    ASSERT_TRUE(r.ok()) << fence << ": " << r.status();
    ASSERT_TRUE(r->whole_source.has_value()) << fence;
    EXPECT_EQ(*r->whole_source, kParent);
    EXPECT_TRUE(r->edits.empty());
  }
}

TEST(EditParserTest, UnusableRepliesSayWhy) {
  struct Case {
    std::string reply;
    std::string message;
  } cases[] = {
      {"I think the kernel is already optimal.", "no SEARCH/REPLACE edits and no code block"},
      {"<<<<<<< SEARCH\nfoo\n>>>>>>> REPLACE\n", "line 1: SEARCH block has no ======= separator"},
      {"text\n<<<<<<< SEARCH\nfoo\n=======\nbar\n", "line 2: SEARCH block is not closed"},
      {"```c\n__kernel void f() {\n", "code block is not closed"},
      {"```c\nint a;\n```\n```c\nint b;\n```\n", "line 4: more than one code block"},
      {"<<<<<<< SEARCH\n\n=======\nx\n>>>>>>> REPLACE\n", "SEARCH text is empty"},
      {"```c\n\n```\n", "code block is empty"},
  };
  for (const auto& c : cases) {
    auto r = ParseModelReply(c.reply);
    ASSERT_FALSE(r.ok()) << c.reply;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.reply;
  }
}

TEST(EditParserTest, EditsThatDoNotApplyAreReportedPrecisely) {
  auto missing = ApplyEdits(kParent, {Edit{"c[i] = b[i];", "x", 7}});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("edit 1 (reply line 7): SEARCH text not found"));
  const std::string twice = "x = 1;\nx = 1;\n";
  auto ambiguous = ApplyEdits(twice, {Edit{"x = 1;", "x = 2;", 3}});
  ASSERT_FALSE(ambiguous.ok());
  EXPECT_THAT(std::string(ambiguous.status().message()), HasSubstr("occurs more than once"));
}

TEST(EditParserTest, IndentationDifferencesStillApplyLineWise) {
  // The model re-indented the SEARCH text; it still matches exactly one place line by line.
  auto r = ApplyEdits(kParent, {Edit{"    int i = get_global_id(0);   \n      if (i < n) c[i] = a[i];",
                                     "  int i = get_global_id(0);\n  if (i < n) c[i] = a[i] + 1.0f;", 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, HasSubstr("a[i] + 1.0f"));
  EXPECT_THAT(*r, HasSubstr("__kernel void add"));
}

TEST(EditParserTest, PlanOnlyReply) {
  auto r = ParseModelReply("Use bigger groups:\n```yaml\nlaunches:\n  - {kernel: add, global: [N], local: [256], args: [a, c, N]}\n```\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->edits.empty());
  EXPECT_FALSE(r->whole_source.has_value());
  EXPECT_TRUE(r->launch_plan_yaml.has_value());
}

}  // namespace
}  // namespace kforge::llm
