#include "common/expr.h"

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

std::string Msg(const absl::Status& st) { return std::string(st.message()); }

// Parses and evaluates; fails the test on any error.
int64_t Eval(const std::string& text, const Bindings& env = {}) {
  auto e = Expr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  if (!e.ok()) return -999999;
  auto v = e->Evaluate(env);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  if (!v.ok()) return -999999;
  return *v;
}

absl::Status ParseError(const std::string& text) {
  auto e = Expr::Parse(text);
  if (e.ok()) return absl::OkStatus();
  return e.status();
}

absl::Status EvalError(const std::string& text, const Bindings& env = {}) {
  auto e = Expr::Parse(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.status();
  if (!e.ok()) return e.status();
  auto v = e->Evaluate(env);
  if (v.ok()) return absl::OkStatus();
  return v.status();
}

// The "column C" a parse error reports, or -1.
int ErrorColumn(const absl::Status& st) {
  const std::string msg(st.message());
  if (msg.rfind("column ", 0) != 0) return -1;
  const size_t colon = msg.find(':');
  int col = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(msg.substr(7, colon - 7), &col)) return -1;
  return col;
}

// ---------------------------------------------------------------------------------------------
// Parsing and evaluation.

TEST(ExprTest, Literals) {
  EXPECT_EQ(Eval("0"), 0);
  EXPECT_EQ(Eval("42"), 42);
  EXPECT_EQ(Eval("  7  "), 7);
  EXPECT_EQ(Eval("007"), 7);
  EXPECT_EQ(Eval("9223372036854775807"), kMax);
}

TEST(ExprTest, Precedence) {
  EXPECT_EQ(Eval("2 + 3 * 4"), 14);
  EXPECT_EQ(Eval("(2 + 3) * 4"), 20);
  EXPECT_EQ(Eval("2 * 3 + 4"), 10);
  EXPECT_EQ(Eval("10 - 4 - 3"), 3);    // left-associative
  EXPECT_EQ(Eval("100 / 10 / 5"), 2);  // left-associative
  EXPECT_EQ(Eval("100 / (10 / 5)"), 50);
  EXPECT_EQ(Eval("7 - 2 * 3 % 4"), 5);  // 2*3=6, 6%4=2, 7-2
  EXPECT_EQ(Eval("2 * 3 % 4"), 2);      // (2*3)%4, not 2*(3%4)=6
  EXPECT_EQ(Eval("1 + 2 < 4"), 1);      // arithmetic binds tighter than comparison
  EXPECT_EQ(Eval("1 + (2 < 4)"), 2);
  EXPECT_EQ(Eval("1 < 2 && 3 < 2"), 0);
  EXPECT_EQ(Eval("1 || 0 && 0"), 1);    // && binds tighter than ||
  EXPECT_EQ(Eval("(1 || 0) && 0"), 0);
  EXPECT_EQ(Eval("0 && 0 || 1"), 1);
  EXPECT_EQ(Eval("((((3))))"), 3);
  EXPECT_EQ(Eval("2*3+4*5"), 26);
  EXPECT_EQ(Eval("\t2\n*\n3 "), 6);
}

TEST(ExprTest, DivisionAndModuloTruncateLikeC) {
  EXPECT_EQ(Eval("7 / 2"), 3);
  EXPECT_EQ(Eval("-7 / 2"), -3);
  EXPECT_EQ(Eval("7 / -2"), -3);
  EXPECT_EQ(Eval("-7 / -2"), 3);
  EXPECT_EQ(Eval("7 % 3"), 1);
  EXPECT_EQ(Eval("-7 % 3"), -1);  // sign of the dividend
  EXPECT_EQ(Eval("7 % -3"), 1);
  EXPECT_EQ(Eval("-7 % -3"), -1);
  EXPECT_EQ(Eval("6 % 3"), 0);
  EXPECT_EQ(Eval("0 / 5"), 0);
}

TEST(ExprTest, CeilDiv) {
  EXPECT_EQ(Eval("ceil_div(7, 2)"), 4);
  EXPECT_EQ(Eval("ceil_div(8, 2)"), 4);
  EXPECT_EQ(Eval("ceil_div(1, 16)"), 1);
  EXPECT_EQ(Eval("ceil_div(0, 16)"), 0);
  // Rounds toward +infinity for any signs.
  EXPECT_EQ(Eval("ceil_div(-7, 2)"), -3);
  EXPECT_EQ(Eval("ceil_div(7, -2)"), -3);
  EXPECT_EQ(Eval("ceil_div(-7, -2)"), 4);
  EXPECT_EQ(Eval("ceil_div(-8, 2)"), -4);
  EXPECT_EQ(Eval("ceil_div(-1, 16)"), 0);
  EXPECT_EQ(Eval("ceil_div(9223372036854775807, 2)"), kMax / 2 + 1);
  EXPECT_EQ(Eval("ceil_div(N, TILE) * TILE", {{"N", 100}, {"TILE", 16}}), 112);
  EXPECT_EQ(Eval("ceil_div ( 5 , 2 )"), 3);
}

TEST(ExprTest, MinMaxAreVariadic) {
  EXPECT_EQ(Eval("min(3, 2)"), 2);
  EXPECT_EQ(Eval("max(3, 2)"), 3);
  EXPECT_EQ(Eval("min(5, 3, 9, 4)"), 3);
  EXPECT_EQ(Eval("max(5, 3, 9, 4)"), 9);
  EXPECT_EQ(Eval("min(-1, -5, 2)"), -5);
  EXPECT_EQ(Eval("max(-1, -5, -2)"), -1);
  EXPECT_EQ(Eval("min(max(1, 2), 3) + max(min(4, 5), 0)"), 6);
  EXPECT_EQ(Eval("min(1 + 1, 2 * 2, 10 / 3)"), 2);
}

TEST(ExprTest, Comparisons) {
  EXPECT_EQ(Eval("3 == 3"), 1);
  EXPECT_EQ(Eval("3 == 4"), 0);
  EXPECT_EQ(Eval("3 != 4"), 1);
  EXPECT_EQ(Eval("3 != 3"), 0);
  EXPECT_EQ(Eval("3 < 4"), 1);
  EXPECT_EQ(Eval("4 < 4"), 0);
  EXPECT_EQ(Eval("4 <= 4"), 1);
  EXPECT_EQ(Eval("5 <= 4"), 0);
  EXPECT_EQ(Eval("5 > 4"), 1);
  EXPECT_EQ(Eval("4 > 4"), 0);
  EXPECT_EQ(Eval("4 >= 4"), 1);
  EXPECT_EQ(Eval("3 >= 4"), 0);
  EXPECT_EQ(Eval("3<=4"), 1);
  EXPECT_EQ(Eval("3>=4"), 0);
  EXPECT_EQ(Eval("3!=4"), 1);
  EXPECT_EQ(Eval("-1 < 0"), 1);
}

TEST(ExprTest, LogicalOperatorsGiveZeroOrOne) {
  EXPECT_EQ(Eval("5 && 7"), 1);
  EXPECT_EQ(Eval("5 && 0"), 0);
  EXPECT_EQ(Eval("0 || 9"), 1);
  EXPECT_EQ(Eval("0 || 0"), 0);
  EXPECT_EQ(Eval("!0"), 1);
  EXPECT_EQ(Eval("!5"), 0);
  EXPECT_EQ(Eval("!!5"), 1);
  EXPECT_EQ(Eval("!(1 == 2)"), 1);
  EXPECT_EQ(Eval("-3 || 0"), 1);
}

TEST(ExprTest, ShortCircuitMakesGuardsSafe) {
  const Bindings zero = {{"A", 10}, {"B", 0}};
  const Bindings five = {{"A", 10}, {"B", 5}};
  const Bindings three = {{"A", 10}, {"B", 3}};
  EXPECT_EQ(Eval("B != 0 && A % B == 0", zero), 0);
  EXPECT_EQ(Eval("B != 0 && A % B == 0", five), 1);
  EXPECT_EQ(Eval("B != 0 && A % B == 0", three), 0);
  EXPECT_EQ(Eval("B == 0 || A / B > 1", zero), 1);
  EXPECT_EQ(Eval("B == 0 || A / B > 1", five), 1);
  // A short-circuited operand may even name something undefined.
  EXPECT_EQ(Eval("0 && undefined_name", {}), 0);
  EXPECT_EQ(Eval("1 || undefined_name", {}), 1);
  // ... but without the guard the division is evaluated.
  absl::Status st = EvalError("A % B == 0 && B != 0", zero);
  EXPECT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("division by zero"));
}

TEST(ExprTest, UnaryOperators) {
  EXPECT_EQ(Eval("-3"), -3);
  EXPECT_EQ(Eval("- -3"), 3);
  EXPECT_EQ(Eval("--3"), 3);
  EXPECT_EQ(Eval("2 - -3"), 5);
  EXPECT_EQ(Eval("2--3"), 5);
  EXPECT_EQ(Eval("-2 * 3"), -6);
  EXPECT_EQ(Eval("-(2 + 3)"), -5);
  EXPECT_EQ(Eval("-N", {{"N", 4}}), -4);
  EXPECT_EQ(Eval("+4"), 4);
  EXPECT_EQ(Eval("2 * -3"), -6);
  EXPECT_EQ(Eval("-2 % 3"), -2);  // (-2) % 3 as in C
  EXPECT_EQ(Eval("-9223372036854775807 - 1"), kMin);
  EXPECT_EQ(Eval("!-1"), 0);
  EXPECT_EQ(Eval("-!0"), -1);
}

TEST(ExprTest, NamesAreBound) {
  const Bindings env = {{"M", 256}, {"N", 100}, {"TILE", 16}, {"WPT", 4}, {"_x1", 2}};
  EXPECT_EQ(Eval("N / WPT", env), 25);
  EXPECT_EQ(Eval("TILE % WPT == 0", env), 1);
  EXPECT_EQ(Eval("TILE * TILE / WPT <= 256", env), 1);
  EXPECT_EQ(Eval("ceil_div(N, TILE) * (TILE / WPT)", env), 28);
  EXPECT_EQ(Eval("_x1 * M", env), 512);
}

TEST(ExprTest, CopiesShareAndKeepText) {
  auto e = Expr::Parse(" M * 2 ");
  ASSERT_TRUE(e.ok()) << e.status();
  Expr copy = *e;
  EXPECT_EQ(copy.text(), " M * 2 ");
  EXPECT_EQ(*copy.Evaluate({{"M", 21}}), 42);
  EXPECT_EQ(*e->Evaluate({{"M", 5}}), 10);
}

// ---------------------------------------------------------------------------------------------
// Parse errors carry the column.

TEST(ExprParseErrorTest, MissingOperandColumn) {
  absl::Status st = ParseError("2 + * 3");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), StartsWith("column 5:"));
  EXPECT_THAT(Msg(st), HasSubstr("'*'"));
}

TEST(ExprParseErrorTest, UnknownFunction) {
  absl::Status st = ParseError("1 + foo(2)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 5:"));
  EXPECT_THAT(Msg(st), HasSubstr("unknown function 'foo'"));
  EXPECT_THAT(Msg(st), HasSubstr("ceil_div"));

  st = ParseError("floor_div(4, 2)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 1:"));
}

TEST(ExprParseErrorTest, MissingCloseParen) {
  absl::Status st = ParseError("(1 + 2");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 7:"));
  EXPECT_THAT(Msg(st), HasSubstr("')'"));

  st = ParseError("min(1, 2");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 9:"));
  EXPECT_THAT(Msg(st), HasSubstr("')'"));

  st = ParseError("(1 + 2]");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 7:"));
}

TEST(ExprParseErrorTest, TrailingGarbage) {
  absl::Status st = ParseError("1 2");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 3:"));
  EXPECT_THAT(Msg(st), HasSubstr("'2'"));

  st = ParseError("N)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 2:"));

  st = ParseError("a = b");  // '=' alone is not an operator
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 3:"));

  st = ParseError("a & b");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 3:"));
}

TEST(ExprParseErrorTest, Empty) {
  for (const char* text : {"", "   "}) {
    absl::Status st = ParseError(text);
    ASSERT_FALSE(st.ok()) << "'" << text << "'";
    EXPECT_THAT(Msg(st), HasSubstr("empty expression"));
    EXPECT_GE(ErrorColumn(st), 1);
  }
  EXPECT_THAT(Msg(ParseError("")), StartsWith("column 1:"));
  EXPECT_THAT(Msg(ParseError("()")), StartsWith("column 2:"));
}

TEST(ExprParseErrorTest, EndOfExpression) {
  absl::Status st = ParseError("1 +");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 4:"));
  EXPECT_THAT(Msg(st), HasSubstr("end of expression"));
}

TEST(ExprParseErrorTest, LiteralOverflow) {
  // INT64_MAX + 1.
  const std::string text = "1 + 9223372036854775808";
  absl::Status st = ParseError(text);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("integer literal too large"));
  // The column points into the literal (columns 5 to 23).
  const int col = ErrorColumn(st);
  EXPECT_GE(col, 5) << st;
  EXPECT_LE(col, 23) << st;

  EXPECT_FALSE(ParseError("99999999999999999999999999").ok());
  // INT64_MIN cannot be written as a literal; -INT64_MAX can.
  EXPECT_FALSE(ParseError("-9223372036854775808").ok());
  EXPECT_TRUE(ParseError("-9223372036854775807").ok());
}

TEST(ExprParseErrorTest, NonIntegerLiterals) {
  absl::Status st = ParseError("1.5");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 2:"));
  EXPECT_THAT(Msg(st), HasSubstr("integers only"));

  st = ParseError("2 * 3x");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 6:"));
}

TEST(ExprParseErrorTest, FunctionArity) {
  absl::Status st = ParseError("ceil_div(1)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 1:"));
  EXPECT_THAT(Msg(st), HasSubstr("ceil_div takes 2 arguments, got 1"));

  st = ParseError("2 * ceil_div(1, 2, 3)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 5:"));
  EXPECT_THAT(Msg(st), HasSubstr("got 3"));

  st = ParseError("min(4)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("min takes at least 2 arguments, got 1"));

  st = ParseError("max()");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("got 0"));

  st = ParseError("min(1,)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 7:"));

  st = ParseError("min(1 2)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith("column 7:"));
  EXPECT_THAT(Msg(st), HasSubstr("','"));
}

TEST(ExprParseErrorTest, TooDeepNesting) {
  const std::string deep_parens = std::string(1000, '(') + "1" + std::string(1000, ')');
  absl::Status st = ParseError(deep_parens);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("nested too deeply"));
  EXPECT_GE(ErrorColumn(st), 1);

  EXPECT_THAT(Msg(ParseError(std::string(1000, '-') + "1")), HasSubstr("nested too deeply"));
  std::string calls;
  for (int i = 0; i < 500; ++i) calls += "min(1, ";
  calls += "1";
  for (int i = 0; i < 500; ++i) calls += ")";
  EXPECT_THAT(Msg(ParseError(calls)), HasSubstr("nested too deeply"));

  // Moderate nesting is fine.
  const std::string ok = std::string(50, '(') + "1" + std::string(50, ')');
  EXPECT_EQ(Eval(ok), 1);
}

TEST(ExprParseErrorTest, HostileInputIsRefusedWithShortMessages) {
  // 100,000 nested parentheses: refused for its length before any recursion.
  const std::string deep = std::string(100000, '(') + "1" + std::string(100000, ')');
  absl::Status st = ParseError(deep);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("longer than"));
  // Within the length, nesting is bounded.
  EXPECT_THAT(Msg(ParseError(std::string(2000, '(') + "1" + std::string(2000, ')'))),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(Msg(ParseError(std::string(4000, '!') + "1")), HasSubstr("nested too deeply"));
  // Long names are cut in messages.
  const std::string name(4000, 'f');
  st = ParseError(name + "(1, 2)");
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st),
              HasSubstr("unknown function '" + std::string(80, 'f') + "'... (4000 bytes)"));
  EXPECT_LT(Msg(st).size(), 300u);
  auto v = EvaluateExpr(std::string(5000, 'x'), {});
  ASSERT_FALSE(v.ok());
  EXPECT_LT(Msg(v.status()).size(), 300u);
  v = EvaluateExpr(name, {});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(Msg(v.status()),
              HasSubstr("undefined name '" + std::string(80, 'f') + "'... (4000 bytes)"));
  EXPECT_LT(Msg(v.status()).size(), 400u);
  // A byte that is not printable is shown escaped.
  EXPECT_THAT(Msg(ParseError("1 + \x01")), HasSubstr("'\\x01'"));
}

TEST(ExprParseErrorTest, ComparisonOperatorsAreNotSplit) {
  // "<" must not take the first half of "<=" and leave "=" behind, and "!=" is not "!" "=".
  EXPECT_TRUE(ParseError("1 <= 2").ok());
  EXPECT_TRUE(ParseError("1 != 2").ok());
  EXPECT_FALSE(ParseError("1 < = 2").ok());
  EXPECT_FALSE(ParseError("1 ! = 2").ok());
  EXPECT_FALSE(ParseError("1 << 2").ok());
  EXPECT_FALSE(ParseError("!= 2").ok());
}

// A very long but flat expression is not "nested", yet every binary operator adds a level to the
// tree. Parsing, evaluating and destroying it must not overflow the stack: either it works or
// Parse refuses it cleanly. Run in a child process so that a crash fails only this test.
// Exit code 0 when the chain parses and evaluates right or is refused cleanly.
int ParseLongChain(int terms) {
  std::string text = "1";
  for (int i = 1; i < terms; ++i) text += "+1";
  {
    auto e = Expr::Parse(text);
    if (e.ok()) {
      auto v = e->Evaluate({});
      if (!v.ok() || *v != terms) return 3;
    }
  }  // the tree is destroyed here
  return 0;
}

TEST(ExprDeathTest, LongFlatChainDoesNotCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::_Exit(ParseLongChain(100000)), ::testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------------------------------------
// Evaluation errors.

TEST(ExprEvalErrorTest, UndefinedName) {
  absl::Status st = EvalError("M * Q", {{"M", 3}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(st), HasSubstr("undefined name 'Q'"));
}

TEST(ExprEvalErrorTest, DivisionByZero) {
  for (const char* text : {"1 / 0", "1 % 0", "ceil_div(1, 0)", "N / (N - N)"}) {
    absl::Status st = EvalError(text, {{"N", 4}});
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(Msg(st), HasSubstr("division by zero")) << text;
  }
}

TEST(ExprEvalErrorTest, Overflow) {
  const Bindings env = {{"big", kMax}, {"small", kMin}};
  for (const char* text : {"9223372036854775807 + 1", "-9223372036854775807 - 2", "big * 2",
                           "small - 1", "-small", "small / -1", "small % -1",
                           "ceil_div(small, -1)", "4294967296 * 4294967296", "big + big",
                           "-(-9223372036854775807 - 1)"}) {
    absl::Status st = EvalError(text, env);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << text << ": " << st;
    EXPECT_THAT(Msg(st), HasSubstr("overflow")) << text;
  }
  // Just inside the range is fine.
  EXPECT_EQ(Eval("big - 1 + 1", env), kMax);
  EXPECT_EQ(Eval("small + 1 - 1", env), kMin);
  EXPECT_EQ(Eval("3037000499 * 3037000499"), int64_t{3037000499} * 3037000499);
}

TEST(ExprEvalErrorTest, EvaluateExprMentionsTheText) {
  auto v = EvaluateExpr("M / Z", {{"M", 4}, {"Z", 0}});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(v.status()), HasSubstr("'M / Z'"));
  EXPECT_THAT(Msg(v.status()), HasSubstr("division by zero"));

  v = EvaluateExpr("M +", {});
  ASSERT_FALSE(v.ok());
  EXPECT_THAT(Msg(v.status()), HasSubstr("'M +'"));
  EXPECT_THAT(Msg(v.status()), HasSubstr("column 4"));

  v = EvaluateExpr("Q", {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(v.status()), HasSubstr("'Q'"));

  v = EvaluateExpr("ceil_div(M, 3)", {{"M", 10}});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 4);
}

TEST(ExprTest, Names) {
  auto e = Expr::Parse("ceil_div(N, TILE) * (TILE / WPT) + min(M, 3, K) - 2");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_THAT(e->Names(), UnorderedElementsAre("N", "TILE", "WPT", "M", "K"));

  // Names in a short-circuited operand count too: they must all be defined somewhere.
  e = Expr::Parse("B != 0 && A % B == 0 || !C");
  ASSERT_TRUE(e.ok());
  EXPECT_THAT(e->Names(), UnorderedElementsAre("A", "B", "C"));

  e = Expr::Parse("1 + 2");
  ASSERT_TRUE(e.ok());
  EXPECT_TRUE(e->Names().empty());

  // Function names are not names.
  e = Expr::Parse("max(x, 1)");
  ASSERT_TRUE(e.ok());
  EXPECT_THAT(e->Names(), UnorderedElementsAre("x"));
}

// ---------------------------------------------------------------------------------------------
// Fuzz: random expression trees rendered to text, evaluated by an independent reference.

enum class Kind { kValue, kDivZero, kOverflow };

struct RefResult {
  Kind kind = Kind::kValue;
  int64_t value = 0;
};

__extension__ typedef __int128 I128;

RefResult Fits(I128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    return {Kind::kOverflow, 0};
  }
  return {Kind::kValue, static_cast<int64_t>(v)};
}

// Truncating division done by hand on magnitudes, so that the reference does not simply reuse
// the same C++ operators in the same way as the code under test.
I128 TruncDiv(I128 a, I128 b) {
  const bool neg = (a < 0) != (b < 0);
  const I128 q = (a < 0 ? -a : a) / (b < 0 ? -b : b);
  return neg ? -q : q;
}

I128 FloorDiv(I128 a, I128 b) {
  I128 q = TruncDiv(a, b);
  if (q * b != a && ((a < 0) != (b < 0))) q -= 1;
  return q;
}

struct Tree {
  enum Op { kNum, kName, kNeg, kPos, kNot, kBin, kCall } op = kNum;
  std::string tok;  // binary operator or function name
  int64_t num = 0;
  std::string name;
  std::vector<Tree> kids;
};

int Prec(const std::string& op) {
  if (op == "||") return 1;
  if (op == "&&") return 2;
  if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=") return 3;
  if (op == "+" || op == "-") return 4;
  return 5;  // * / %
}

constexpr int kUnaryPrec = 6;
constexpr int kAtomPrec = 7;

int TreePrec(const Tree& t) {
  switch (t.op) {
    case Tree::kBin: return Prec(t.tok);
    case Tree::kNeg:
    case Tree::kPos:
    case Tree::kNot: return kUnaryPrec;
    default: return kAtomPrec;
  }
}

class Fuzzer {
 public:
  explicit Fuzzer(uint32_t seed) : rng_(seed) {}

  const Bindings& env() const { return env_; }

  Tree Gen(int depth) {
    if (depth <= 0 || Chance(0.25)) return Leaf();
    const int pick = Int(0, 99);
    Tree t;
    if (pick < 12) {
      t.op = Pick<Tree::Op>({Tree::kNeg, Tree::kNeg, Tree::kPos, Tree::kNot});
      t.kids.push_back(Gen(depth - 1));
    } else if (pick < 27) {
      t.op = Tree::kCall;
      t.tok = Pick<std::string>({"ceil_div", "min", "max"});
      const int n = t.tok == "ceil_div" ? 2 : Int(2, 4);
      for (int i = 0; i < n; ++i) t.kids.push_back(Gen(depth - 1));
    } else {
      t.op = Tree::kBin;
      t.tok = Pick<std::string>({"+", "-", "*", "/", "%", "+", "-", "*", "==", "!=", "<", "<=",
                                 ">", ">=", "&&", "||"});
      t.kids.push_back(Gen(depth - 1));
      t.kids.push_back(Gen(depth - 1));
    }
    return t;
  }

  std::string Render(const Tree& t) {
    switch (t.op) {
      case Tree::kNum: return absl::StrCat(t.num);
      case Tree::kName: return t.name;
      case Tree::kNeg:
      case Tree::kPos:
      case Tree::kNot: {
        const char* op = t.op == Tree::kNeg ? "-" : t.op == Tree::kPos ? "+" : "!";
        return absl::StrCat(op, Space(), Operand(t.kids[0], kUnaryPrec));
      }
      case Tree::kCall: {
        std::string s = absl::StrCat(t.tok, Chance(0.2) ? " " : "", "(", Space());
        for (size_t i = 0; i < t.kids.size(); ++i) {
          if (i > 0) absl::StrAppend(&s, Space(), ",", Space());
          absl::StrAppend(&s, Operand(t.kids[i], 0));
        }
        return absl::StrCat(s, Space(), ")");
      }
      case Tree::kBin: {
        const int p = Prec(t.tok);
        // Left-associative: the left operand may sit at the same level, the right one not.
        // Comparisons inside comparisons are always parenthesised, so that the test does not
        // depend on whether == and < share a level.
        const int left_min = p == 3 ? 4 : p;
        return absl::StrCat(Operand(t.kids[0], left_min), Space(), t.tok, Space(),
                            Operand(t.kids[1], p + 1));
      }
    }
    return "?";
  }

  // Reference evaluation: children left to right, first error wins, && and || short-circuit.
  RefResult Ref(const Tree& t) {
    switch (t.op) {
      case Tree::kNum: return {Kind::kValue, t.num};
      case Tree::kName: return {Kind::kValue, env_.at(t.name)};
      case Tree::kNeg: {
        RefResult a = Ref(t.kids[0]);
        if (a.kind != Kind::kValue) return a;
        return Fits(-static_cast<I128>(a.value));
      }
      case Tree::kPos: return Ref(t.kids[0]);
      case Tree::kNot: {
        RefResult a = Ref(t.kids[0]);
        if (a.kind != Kind::kValue) return a;
        return {Kind::kValue, a.value == 0 ? 1 : 0};
      }
      case Tree::kCall: {
        std::vector<int64_t> v;
        for (const Tree& k : t.kids) {
          RefResult r = Ref(k);
          if (r.kind != Kind::kValue) return r;
          v.push_back(r.value);
        }
        if (t.tok == "ceil_div") {
          if (v[1] == 0) return {Kind::kDivZero, 0};
          // ceil(a / b) == -floor(-a / b)
          return Fits(-FloorDiv(-static_cast<I128>(v[0]), v[1]));
        }
        int64_t m = v[0];
        for (int64_t x : v) m = t.tok == "min" ? (x < m ? x : m) : (x > m ? x : m);
        return {Kind::kValue, m};
      }
      case Tree::kBin: {
        RefResult a = Ref(t.kids[0]);
        if (a.kind != Kind::kValue) return a;
        if (t.tok == "&&" && a.value == 0) return {Kind::kValue, 0};
        if (t.tok == "||" && a.value != 0) return {Kind::kValue, 1};
        RefResult b = Ref(t.kids[1]);
        if (b.kind != Kind::kValue) return b;
        const I128 x = a.value, y = b.value;
        const std::string& op = t.tok;
        if (op == "&&" || op == "||") return {Kind::kValue, y != 0 ? 1 : 0};
        if (op == "+") return Fits(x + y);
        if (op == "-") return Fits(x - y);
        if (op == "*") return Fits(x * y);
        if (op == "/" || op == "%") {
          if (y == 0) return {Kind::kDivZero, 0};
          const I128 q = TruncDiv(x, y);
          // As in C, x % y is only defined when x / y is representable.
          RefResult qf = Fits(q);
          if (qf.kind != Kind::kValue) return qf;
          return op == "/" ? qf : Fits(x - q * y);
        }
        if (op == "==") return {Kind::kValue, x == y};
        if (op == "!=") return {Kind::kValue, x != y};
        if (op == "<") return {Kind::kValue, x < y};
        if (op == "<=") return {Kind::kValue, x <= y};
        if (op == ">") return {Kind::kValue, x > y};
        if (op == ">=") return {Kind::kValue, x >= y};
        ADD_FAILURE() << "unhandled operator " << op;
        return {};
      }
    }
    return {};
  }

  void CollectNames(const Tree& t, std::set<std::string>& out) {
    if (t.op == Tree::kName) out.insert(t.name);
    for (const Tree& k : t.kids) CollectNames(k, out);
  }

 private:
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  template <typename T>
  T Pick(std::initializer_list<T> items) {
    return *(items.begin() + Int(0, static_cast<int>(items.size()) - 1));
  }

  std::string Space() {
    switch (Int(0, 9)) {
      case 0: return "  ";
      case 1: return "\t";
      case 2:
      case 3:
      case 4: return "";
      default: return " ";
    }
  }

  std::string Operand(const Tree& t, int min_prec) {
    std::string s = Render(t);
    if (TreePrec(t) < min_prec || Chance(0.1)) return absl::StrCat("(", Space(), s, Space(), ")");
    return s;
  }

  Tree Leaf() {
    Tree t;
    if (Chance(0.4)) {
      t.op = Tree::kName;
      t.name = names_[Int(0, static_cast<int>(names_.size()) - 1)];
      return t;
    }
    t.op = Tree::kNum;
    const int r = Int(0, 19);
    if (r == 0) {
      t.num = std::numeric_limits<int64_t>::max();
    } else if (r == 1) {
      t.num = std::uniform_int_distribution<int64_t>(0, std::numeric_limits<int64_t>::max())(rng_);
    } else if (r < 5) {
      t.num = Int(0, 2);
    } else {
      t.num = Int(0, 100);
    }
    return t;
  }

  std::mt19937 rng_;
  std::vector<std::string> names_ = {"a", "b", "c", "zero", "one", "big", "small", "h", "N_1"};
  Bindings env_ = {{"a", 7},
                   {"b", -3},
                   {"c", 12},
                   {"zero", 0},
                   {"one", 1},
                   {"big", std::numeric_limits<int64_t>::max()},
                   {"small", std::numeric_limits<int64_t>::min()},
                   {"h", int64_t{1} << 32},
                   {"N_1", 1000003}};
};

TEST(ExprFuzzTest, MatchesReferenceEvaluator) {
  Fuzzer fuzz(20240611);
  int values = 0, div_zero = 0, overflow = 0, failures = 0;
  constexpr int kCases = 20000;
  for (int i = 0; i < kCases && failures < 20; ++i) {
    const Tree tree = fuzz.Gen(1 + i % 6);
    const std::string text = fuzz.Render(tree);
    const RefResult want = fuzz.Ref(tree);

    auto e = Expr::Parse(text);
    if (!e.ok()) {
      ADD_FAILURE() << "case " << i << ": '" << text << "' does not parse: " << e.status();
      ++failures;
      continue;
    }
    std::set<std::string> want_names;
    fuzz.CollectNames(tree, want_names);
    const auto got_names = e->Names();
    if (std::set<std::string>(got_names.begin(), got_names.end()) != want_names) {
      ADD_FAILURE() << "case " << i << ": Names() of '" << text << "' differ";
      ++failures;
    }

    auto got = e->Evaluate(fuzz.env());
    switch (want.kind) {
      case Kind::kValue:
        ++values;
        if (!got.ok() || *got != want.value) {
          ADD_FAILURE() << "case " << i << ": '" << text << "' want " << want.value << ", got "
                        << (got.ok() ? absl::StrCat(*got) : got.status().ToString());
          ++failures;
        }
        break;
      case Kind::kDivZero:
        ++div_zero;
        if (got.ok() || got.status().code() != absl::StatusCode::kInvalidArgument ||
            got.status().message().find("division by zero") == absl::string_view::npos) {
          ADD_FAILURE() << "case " << i << ": '" << text << "' want division by zero, got "
                        << (got.ok() ? absl::StrCat(*got) : got.status().ToString());
          ++failures;
        }
        break;
      case Kind::kOverflow:
        ++overflow;
        if (got.ok() || got.status().code() != absl::StatusCode::kOutOfRange) {
          ADD_FAILURE() << "case " << i << ": '" << text << "' want overflow, got "
                        << (got.ok() ? absl::StrCat(*got) : got.status().ToString());
          ++failures;
        }
        break;
    }
  }
  EXPECT_EQ(failures, 0);
  // The generator must exercise all three outcomes, and mostly produce values.
  EXPECT_GE(values + div_zero + overflow, 5000);
  EXPECT_GE(values, kCases / 2);
  EXPECT_GE(div_zero, 100);
  EXPECT_GE(overflow, 100);
  std::cout << "fuzz: " << values << " values, " << div_zero << " divisions by zero, " << overflow
            << " overflows\n";
}

}  // namespace
}  // namespace kforge
