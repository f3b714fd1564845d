#include "common/yaml_reader.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

using ::kforge::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Msg(const absl::Status& st) { return std::string(st.message()); }

YamlNode MustLoad(const std::string& text, const std::string& name = "t.yaml") {
  auto n = LoadYamlString(text, name);
  EXPECT_TRUE(n.ok()) << n.status();
  if (!n.ok()) return YamlNode(YAML::Node(), name, "", YAML::Mark());
  return *n;
}

constexpr char kDoc[] =
    "name: matmul\n"            // line 1
    "sizes: {M: 256, N: 7}\n"   // line 2
    "list:\n"                   // line 3
    "  - 1\n"                   // line 4
    "  - two\n"                 // line 5
    "  - {k: v}\n"              // line 6
    "nested:\n"                 // line 7
    "  inner:\n"                // line 8
    "    deep: 2.5\n"           // line 9
    "flags: {a: true, b: off, c: Yes, d: maybe}\n"  // line 10
    "empty:\n";                 // line 11

TEST(YamlReaderTest, KindsAndDefined) {
  YamlNode root = MustLoad(kDoc);
  EXPECT_TRUE(root.defined());
  EXPECT_TRUE(root.is_map());
  EXPECT_TRUE(root.Child("list").is_seq());
  EXPECT_TRUE(root.Child("name").is_scalar());
  EXPECT_FALSE(root.Child("empty").defined());    // null
  EXPECT_FALSE(root.Child("missing").defined());  // absent
  EXPECT_FALSE(root.Child("name").Child("x").defined());  // child of a scalar
}

TEST(YamlReaderTest, PathsAndLocations) {
  YamlNode root = MustLoad(kDoc);
  YamlNode name = root.Child("name");
  EXPECT_EQ(name.path(), "name");
  EXPECT_EQ(name.file(), "t.yaml");
  EXPECT_EQ(name.line(), 1);
  EXPECT_EQ(name.column(), 7);
  EXPECT_EQ(name.Where(), "t.yaml:1:7: name");

  YamlNode n = root.Child("sizes").Child("N");
  EXPECT_EQ(n.path(), "sizes.N");
  EXPECT_EQ(n.line(), 2);
  EXPECT_EQ(n.column(), 20);

  YamlNode deep = root.Child("nested").Child("inner").Child("deep");
  EXPECT_EQ(deep.path(), "nested.inner.deep");
  EXPECT_EQ(deep.line(), 9);
  EXPECT_EQ(deep.column(), 11);
  EXPECT_EQ(Msg(deep.Error("too deep")), "t.yaml:9:11: nested.inner.deep: too deep");
  EXPECT_EQ(deep.Error("x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(YamlReaderTest, MissingChildIsLocatedAtItsParent) {
  YamlNode root = MustLoad(kDoc);
  YamlNode missing = root.Child("nested").Child("inner").Child("nope");
  EXPECT_FALSE(missing.defined());
  EXPECT_EQ(missing.path(), "nested.inner.nope");
  EXPECT_EQ(missing.line(), 9);  // the inner map starts at "deep" on line 9
  EXPECT_THAT(Msg(missing.Error("missing field")), StartsWith("t.yaml:9:5: nested.inner.nope: "));
  // A missing top-level key is located at the document.
  EXPECT_THAT(Msg(root.Child("absent").Error("missing")), StartsWith("t.yaml:1:1: absent: "));
  auto s = root.Child("absent").AsString();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(Msg(s.status()), HasSubstr("absent: missing value"));
}

TEST(YamlReaderTest, EntriesInFileOrder) {
  YamlNode root = MustLoad("z: 1\na: 2\nm:\n  q: 3\n");
  auto entries = root.Entries();
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].first, "z");
  EXPECT_EQ((*entries)[1].first, "a");
  EXPECT_EQ((*entries)[2].first, "m");
  EXPECT_EQ((*entries)[1].second.path(), "a");
  EXPECT_EQ((*entries)[1].second.line(), 2);
  auto inner = (*entries)[2].second.Entries();
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ((*inner)[0].second.path(), "m.q");

  auto not_map = root.Child("a").Entries();
  ASSERT_FALSE(not_map.ok());
  EXPECT_THAT(Msg(not_map.status()), StartsWith("t.yaml:2:4: a: expected a map"));
}

TEST(YamlReaderTest, NonScalarKeysAreRejected) {
  YamlNode root = MustLoad("? [a, b]\n: 1\n");
  auto entries = root.Entries();
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(Msg(entries.status()), HasSubstr("map keys must be plain names"));
}

TEST(YamlReaderTest, Items) {
  YamlNode root = MustLoad(kDoc);
  auto items = root.Child("list").Items();
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 3u);
  EXPECT_EQ((*items)[0].path(), "list[0]");
  EXPECT_EQ((*items)[1].path(), "list[1]");
  EXPECT_EQ((*items)[1].line(), 5);
  EXPECT_EQ((*items)[1].column(), 5);
  EXPECT_EQ(*(*items)[1].AsString(), "two");
  EXPECT_EQ((*items)[2].Child("k").path(), "list[2].k");
  EXPECT_EQ(*(*items)[0].AsInt64(), 1);

  // A scalar is a one-item list only when allowed.
  auto one = root.Child("name").Items(/*allow_scalar=*/true);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ(*(*one)[0].AsString(), "matmul");
  auto refused = root.Child("name").Items();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(Msg(refused.status()), StartsWith("t.yaml:1:7: name: expected a list"));
  EXPECT_FALSE(root.Child("sizes").Items(true).ok());  // a map is never a list

  auto empty = MustLoad("l: []\n").Child("l").Items();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(YamlReaderTest, AsString) {
  YamlNode root = MustLoad("a: hello world\nb: '  quoted '\nc: [1]\nd: 12\n");
  EXPECT_EQ(*root.Child("a").AsString(), "hello world");
  EXPECT_EQ(*root.Child("b").AsString(), "  quoted ");
  EXPECT_EQ(*root.Child("d").AsString(), "12");
  auto list = root.Child("c").AsString();
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(Msg(list.status()), HasSubstr("c: expected a single value, not a list or map"));
  auto missing = root.Child("zz").AsString();
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Msg(missing.status()), HasSubstr("zz: missing value"));
}

TEST(YamlReaderTest, AsInt64) {
  YamlNode root = MustLoad(
      "a: 42\nb: -7\nc: 9223372036854775807\nd: 9223372036854775808\ne: 1.5\nf: abc\ng: 1e3\n"
      "h: '64'\n");
  EXPECT_EQ(*root.Child("a").AsInt64(), 42);
  EXPECT_EQ(*root.Child("b").AsInt64(), -7);
  EXPECT_EQ(*root.Child("c").AsInt64(), 9223372036854775807);
  EXPECT_EQ(*root.Child("h").AsInt64(), 64);
  for (const char* k : {"d", "e", "f", "g"}) {
    auto v = root.Child(k).AsInt64();
    ASSERT_FALSE(v.ok()) << k;
    EXPECT_THAT(Msg(v.status()), HasSubstr(std::string(k) + ": expected an integer")) << k;
  }
  auto f = root.Child("f").AsInt64();
  EXPECT_THAT(Msg(f.status()), StartsWith("t.yaml:6:4: f: expected an integer, got 'abc'"));
}

TEST(YamlReaderTest, AsDouble) {
  YamlNode root = MustLoad("a: 1.5\nb: 1e-3\nc: -2\nd: .inf\ne: nan\nf: x1\n");
  EXPECT_DOUBLE_EQ(*root.Child("a").AsDouble(), 1.5);
  EXPECT_DOUBLE_EQ(*root.Child("b").AsDouble(), 1e-3);
  EXPECT_DOUBLE_EQ(*root.Child("c").AsDouble(), -2);
  for (const char* k : {"d", "e", "f"}) {
    auto v = root.Child(k).AsDouble();
    ASSERT_FALSE(v.ok()) << k;
    EXPECT_THAT(Msg(v.status()), HasSubstr("expected a finite number")) << k;
  }
}

TEST(YamlReaderTest, AsBool) {
  YamlNode root = MustLoad(kDoc);
  YamlNode flags = root.Child("flags");
  EXPECT_TRUE(*flags.Child("a").AsBool());
  EXPECT_FALSE(*flags.Child("b").AsBool());
  EXPECT_TRUE(*flags.Child("c").AsBool());
  auto d = flags.Child("d").AsBool();
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(Msg(d.status()), HasSubstr("flags.d: expected true or false, got 'maybe'"));
}

TEST(YamlReaderTest, CheckKeys) {
  YamlNode root = MustLoad("a: 1\nb: 2\nbogus: 3\n");
  EXPECT_TRUE(root.CheckKeys({"a", "b", "bogus"}).ok());
  EXPECT_TRUE(root.CheckKeys({"a", "b", "bogus", "unused"}).ok());
  absl::Status st = root.CheckKeys({"a", "b"});
  ASSERT_FALSE(st.ok());
  // Located at the key itself.
  EXPECT_EQ(Msg(st), "t.yaml:3:1: bogus: unknown key 'bogus' (allowed: a, b)");

  YamlNode nested = MustLoad("outer:\n  x: 1\n  y: 2\n").Child("outer");
  st = nested.CheckKeys({"x"});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(Msg(st), "t.yaml:3:3: outer.y: unknown key 'y' (allowed: x)");

  EXPECT_FALSE(MustLoad("- 1\n").CheckKeys({"a"}).ok());
}

TEST(YamlReaderTest, SyntaxErrorsCarryLineAndColumn) {
  auto bad = LoadYamlString("a: 1\nb: [1, 2\nc: 3\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()), ::testing::ContainsRegex("^bad\\.yaml:[0-9]+:[0-9]+: invalid YAML: "));

  auto tab = LoadYamlString("a:\n  b: 1\n c: 2\n", "indent.yaml");
  ASSERT_FALSE(tab.ok());
  EXPECT_THAT(Msg(tab.status()), StartsWith("indent.yaml:3:"));

  auto flow = LoadYamlString("a: {b: 1, c: 2\n", "flow.yaml");
  ASSERT_FALSE(flow.ok());
  EXPECT_THAT(Msg(flow.status()), StartsWith("flow.yaml:"));
}

TEST(YamlReaderTest, LoadYamlFile) {
  TempDir dir;
  const std::string path = dir.Write("x.yaml", "k: v\n");
  auto n = LoadYamlFile(path);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->file(), path);
  EXPECT_EQ(*n->Child("k").AsString(), "v");
  EXPECT_THAT(Msg(n->Child("k").Error("e")), StartsWith(path + ":1:4: k: "));

  auto named = LoadYamlFile(path, "shown.yaml");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->Child("k").Where(), "shown.yaml:1:4: k");

  auto missing = LoadYamlFile(dir.path() + "/none.yaml", "none.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), StartsWith("none.yaml: cannot open"));

  const std::string bad = dir.Write("bad.yaml", "a: [\n");
  auto b = LoadYamlFile(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(Msg(b.status()), StartsWith(bad + ":"));
}

TEST(YamlReaderTest, EmptyDocumentIsUndefined) {
  YamlNode root = MustLoad("");
  EXPECT_FALSE(root.defined());
  EXPECT_FALSE(root.is_map());
  EXPECT_FALSE(root.Child("a").defined());
}

// ---------------------------------------------------------------------------------------------
// Hostile input.

TEST(YamlReaderHostileTest, DeepNestingIsRefusedClearly) {
  // yaml-cpp recurses per level and stops at 500: each form, 100,000 deep, is an error that
  // says what is wrong (yaml-cpp's own message is "bad file").
  std::string maps;
  for (int i = 0; i < 100000; ++i) maps += "{a: ";
  std::string dashes;
  for (int i = 0; i < 100000; ++i) dashes += "- ";
  std::string indented;
  for (int i = 0; i < 2000; ++i) indented += std::string(i, ' ') + "a:\n";
  for (const std::string& text :
       {"a: " + std::string(100000, '[') + "1" + std::string(100000, ']') + "\n",
        maps + "1" + std::string(100000, '}'), dashes + "1\n",
        indented + std::string(2000, ' ') + "1\n"}) {
    auto n = LoadYamlString(text, "deep.yaml");
    ASSERT_FALSE(n.ok());
    EXPECT_THAT(Msg(n.status()), StartsWith("deep.yaml:"));
    EXPECT_THAT(Msg(n.status()),
                HasSubstr("invalid YAML: nested too deeply (more than 499 levels)"));
  }
  // 400 levels are fine.
  auto ok =
      LoadYamlString("a: " + std::string(400, '[') + "1" + std::string(400, ']') + "\n", "ok.yaml");
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(YamlReaderHostileTest, OversizedInputIsRefused) {
  auto n = LoadYamlString(std::string(kMaxYamlBytes + 1, ' '), "big.yaml");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(Msg(n.status()), StartsWith("big.yaml: larger than 16777216 bytes"));
  // A device that never ends is read only up to the limit.
  auto z = LoadYamlFile("/dev/zero", "zero.yaml");
  ASSERT_FALSE(z.ok());
  EXPECT_THAT(Msg(z.status()), StartsWith("zero.yaml: larger than"));
}

TEST(YamlReaderHostileTest, Utf8Validation) {
  EXPECT_EQ(FirstInvalidUtf8(""), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("plain ascii\n\t"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("\xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82\xf4\x8f\xbf\xbf"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8(std::string("nul\0inside", 10)), std::nullopt);  // NUL is valid UTF-8
  EXPECT_EQ(FirstInvalidUtf8("ab\xff"), 2u);                                  // never valid
  EXPECT_EQ(FirstInvalidUtf8("a\x80"), 1u);                 // lone continuation byte
  EXPECT_EQ(FirstInvalidUtf8("a\xc3"), 1u);                 // cut short
  EXPECT_EQ(FirstInvalidUtf8("\xc3("), 0u);                 // not a continuation
  EXPECT_EQ(FirstInvalidUtf8("\xc0\xaf"), 0u);              // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xe0\x80\xaf"), 0u);          // overlong
  EXPECT_EQ(FirstInvalidUtf8("x\xed\xa0\x80"), 1u);         // surrogate U+D800
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xf8\x88\x80\x80\x80"), 0u);  // five-byte form
  const std::string big = std::string(1 << 20, 'a') + "\xfe";
  EXPECT_EQ(FirstInvalidUtf8(big), size_t{1} << 20);
}

TEST(YamlReaderHostileTest, EchoValueEscapesAndCuts) {
  EXPECT_EQ(EchoValue("f17"), "f17");
  EXPECT_EQ(EchoValue("a\nb\tc\rd\x01\x7f"), "a\\nb\\tc\\rd\\x01\\x7f");
  EXPECT_EQ(EchoValue("caf\xc3\xa9 \xff"), "caf\xc3\xa9 \\xff");  // valid UTF-8 kept
  EXPECT_EQ(EchoValue(std::string(100, 'x')), std::string(80, 'x') + "... (100 bytes)");
  EXPECT_EQ(EchoValue(std::string(1000000, 'x')).size(),
            80 + std::string("... (1000000 bytes)").size());
  // Never cut inside a character: 79 bytes, then a 2-byte character crossing byte 80.
  EXPECT_EQ(EchoValue(std::string(79, 'x') + "\xc3\xa9" + "yyy"),
            std::string(79, 'x') + "\xc3\xa9... (84 bytes)");
  EXPECT_EQ(Quoted("f17"), "'f17'");
  EXPECT_EQ(Quoted(std::string(81, 'q')), "'" + std::string(80, 'q') + "'... (81 bytes)");
}

TEST(YamlReaderHostileTest, StringsAndKeysMustBeUtf8) {
  YamlNode root =
      MustLoad("name: \"ok\"\nbad: ab\xff\nlong: " + std::string(100000, 'z') + "\xfe\n\xc3: 1\n");
  EXPECT_EQ(*root.Child("name").AsString(), "ok");
  auto bad = root.Child("bad").AsString();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(Msg(bad.status()),
            "t.yaml:2:6: bad: invalid UTF-8 at byte 2 of the value (0xff): 'ab\\xff'");
  auto lng = root.Child("long").AsString();
  ASSERT_FALSE(lng.ok());
  EXPECT_THAT(Msg(lng.status()), HasSubstr("invalid UTF-8 at byte 100000 of the value (0xfe)"));
  EXPECT_LT(Msg(lng.status()).size(), 300u);
  // A number or a bool reads its text first: the same check.
  EXPECT_FALSE(root.Child("bad").AsInt64().ok());
  auto entries = root.Entries();
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(Msg(entries.status()), HasSubstr("map key '\\xc3' is not valid UTF-8"));
  auto keys = root.CheckKeys({"name", "bad", "long"});
  ASSERT_FALSE(keys.ok());
  EXPECT_THAT(Msg(keys), HasSubstr("unknown key '\\xc3'"));
  // Long bad numbers are cut in messages.
  YamlNode num = MustLoad("n: " + std::string(50000, '9') + "x\n");
  auto n = num.Child("n").AsInt64();
  ASSERT_FALSE(n.ok());
  EXPECT_LT(Msg(n.status()).size(), 300u);
  EXPECT_THAT(Msg(n.status()), HasSubstr("... (50001 bytes)"));
}

}  // namespace
}  // namespace kforge
