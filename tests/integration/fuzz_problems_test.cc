// Seeded, bounded fuzzing of the real `kforge` binary with hostile problem folders and launch
// plans: mutated copies of the examples (lines deleted, duplicated, swapped; scalars replaced by
// huge, negative, zero, NaN, very long, invalid UTF-8 or NUL values; deep nesting; shapes that
// overflow or divide by zero; unknown dtypes; CR line endings and BOMs; long whitespace and
// 40 KB #error lines in the kernel sources). `kforge validate` runs on every case and
// `kforge eval` on a bounded subset; each must end with exit 0, 1 or 2 within its time limit,
// never by a signal, and the two commands must agree on what is bad input (exit 2).
//
// Every case is made from a fixed seed: a failure prints the case, its seed and its mutations.
// Reproduce one with KFORGE_FUZZ_CASE=N (the case number) and keep its folder with
// KFORGE_FUZZ_KEEP=1.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/problem_loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"

extern char** environ;

namespace kforge {
namespace {

namespace fs = std::filesystem;

using ::kforge::testing::BinaryDir;
using ::kforge::testing::Outcome;
using ::kforge::testing::RunWithLimit;
using ::kforge::testing::SourceDir;
using ::kforge::testing::TempDir;

constexpr uint64_t kSeed = 20261201;
constexpr int kProblemCases = 200;
constexpr int kPlanCases = 60;
// `kforge eval` runs that get past the input checks (and so start a sandbox and compile):
// about a second each on PoCL, a few at most on a loaded machine.
constexpr int kMaxDeviceEvals = 8;
constexpr int kMaxPlanDeviceEvals = 6;
constexpr double kValidateLimitSeconds = 30;
constexpr double kEvalLimitSeconds = 90;

std::string Kforge() { return BinaryDir() + "/cli/kforge"; }

// ---------------------------------------------------------------------------------------------
// Mutations.

using Rng = std::mt19937_64;

size_t Pick(Rng& rng, size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); }

// Values that have broken parsers before.
std::vector<std::string> HostileScalars() {
  return {"0",
          "-1",
          "-9223372036854775808",
          "9223372036854775807",
          "4611686018427387904",  // 2^62
          "1152921504606846976",  // 2^60
          "99999999999999999999999",
          "1e308",
          "-1e308",
          "1e-320",
          ".nan",
          "NaN",
          "inf",
          "-.inf",
          "0x10",
          "\"\"",
          "~",
          "[]",
          "{}",
          "\"N / 0\"",
          "\"9223372036854775807 * 2\"",
          "\"1000000000 * 1000000000\"",
          "\"-(-9223372036854775807 - 1)\"",
          "\"ceil_div(1, 0)\"",
          "f128",
          "\"uniform(-1e308, 1e308)\"",
          "\"normal(0, 1e308)\"",
          "\"randint(-1e300, 1e300)\"",
          "\"constant(nan)\"",
          "\"arange(0, 1e300)\"",
          std::string(30000, 'a'),
          "\"" + std::string(100000, 'x') + "\"",
          "\"" + std::string(50000, ' ') + "\"",
          "\"" + std::string(20000, '(') + "\"",
          "\"\xff\xfe\"",
          "ab\xc3",
          "\"\xed\xa0\x80\"",
          "\"a\\0b\"",
          std::string("a\0b", 3),
          "\"\\x01\\x7f\"",
          "&anchor 1",
          "*nothing",
          "!!binary aGVsbG8=",
          "\"" + std::string(4000, '1') + "\"",
          "[" + std::string(20000, '[') + "1" + std::string(20000, ']') + "]"};
}

// Spans of `text` that hold a scalar value: after ": ", "[", "{" or ", " up to the next
// delimiter on the same line.
std::vector<std::pair<size_t, size_t>> ValueSpans(const std::string& text) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    size_t start = std::string::npos;
    if (text[i] == ':' && text[i + 1] == ' ') start = i + 2;
    if (text[i] == '[' || text[i] == '{') start = i + 1;
    if (text[i] == ',' && text[i + 1] == ' ') start = i + 2;
    if (start == std::string::npos || start >= text.size()) continue;
    size_t end = start;
    bool quoted = text[start] == '"';
    if (quoted) {
      end = text.find('"', start + 1);
      if (end == std::string::npos) continue;
      ++end;
    } else {
      while (end < text.size() &&
             std::string_view(",]}\n#").find(text[end]) == std::string_view::npos)
        ++end;
    }
    if (end > start) out.emplace_back(start, end - start);
  }
  return out;
}

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n'); }
std::string Join(const std::vector<std::string>& lines) { return absl::StrJoin(lines, "\n"); }

// Replaces the first "KEY: [" list's first item (or a "KEY: value") found after `anchor`.
bool ReplaceAfter(std::string& text, const std::string& anchor, const std::string& key,
                  const std::string& value) {
  const size_t a = text.find(anchor);
  if (a == std::string::npos) return false;
  const size_t k = text.find(key + ": ", a);
  if (k == std::string::npos) return false;
  const size_t start = k + key.size() + 2;
  size_t end = start;
  int depth = 0;
  while (end < text.size()) {
    const char c = text[end];
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') {
      if (depth == 0) break;
      --depth;
    }
    if ((c == ',' || c == '\n') && depth == 0) break;
    ++end;
    if (depth == 0 && (c == ']' || c == '}')) break;
  }
  text.replace(start, end - start, value);
  return true;
}

struct Folder {
  std::string yaml;
  std::vector<std::pair<std::string, std::string>> sources;  // file name, text
  bool replay = false;
};

// One mutation of the folder; returns its description.
using Mutation = std::function<std::string(Folder&, Rng&)>;

std::vector<Mutation> YamlMutations() {
  std::vector<Mutation> m;
  m.push_back([](Folder& f, Rng& rng) {
    auto lines = Lines(f.yaml);
    const size_t i = Pick(rng, lines.size());
    const std::string what = absl::StrCat("delete line ", i + 1, ": ", lines[i].substr(0, 60));
    lines.erase(lines.begin() + static_cast<ptrdiff_t>(i));
    f.yaml = Join(lines);
    return what;
  });
  m.push_back([](Folder& f, Rng& rng) {
    auto lines = Lines(f.yaml);
    const size_t i = Pick(rng, lines.size());
    lines.insert(lines.begin() + static_cast<ptrdiff_t>(i), lines[i]);
    f.yaml = Join(lines);
    return absl::StrCat("duplicate line ", i + 1);
  });
  m.push_back([](Folder& f, Rng& rng) {
    auto lines = Lines(f.yaml);
    const size_t i = Pick(rng, lines.size()), j = Pick(rng, lines.size());
    std::swap(lines[i], lines[j]);
    f.yaml = Join(lines);
    return absl::StrCat("swap lines ", i + 1, " and ", j + 1);
  });
  auto scalar = [](Folder& f, Rng& rng) {
    const auto spans = ValueSpans(f.yaml);
    if (spans.empty()) return std::string("no scalar to replace");
    const auto [pos, len] = spans[Pick(rng, spans.size())];
    const auto values = HostileScalars();
    const size_t v = Pick(rng, values.size());
    const std::string what =
        absl::StrCat("replace '", f.yaml.substr(pos, std::min<size_t>(len, 40)), "' at byte ", pos,
                     " with hostile value #", v, " (", values[v].size(),
                     " bytes: ", absl::CEscape(values[v].substr(0, 30)), ")");
    f.yaml.replace(pos, len, values[v]);
    return what;
  };
  m.push_back(scalar);
  m.push_back(scalar);  // the most productive: twice the weight
  m.push_back([](Folder& f, Rng& rng) {
    const char* const shapes[] = {"[1000000000, 1000000000]",
                                  "[\"N / 0\"]",
                                  "[\"M / 0\", 1]",
                                  "[0]",
                                  "[-1]",
                                  "[4611686018427387904, 4]",
                                  "[\"9223372036854775807 + 1\"]",
                                  "[1152921504606846976]",
                                  "[268435456, 16]",
                                  "[]",
                                  "[1, 1, 1, 1, 1, 1, 1, 1]"};
    const std::string s = shapes[Pick(rng, std::size(shapes))];
    if (!ReplaceAfter(f.yaml, "buffers:", "shape", s)) return std::string("no shape");
    return absl::StrCat("first buffer shape := ", s);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const dtypes[] = {"f128", "float", "\"\"", "F32", "i32 ", "u8\xff",
                                  "bf16", "f16",   "u8",   "i64", "f64"};
    const std::string d = dtypes[Pick(rng, std::size(dtypes))];
    if (!ReplaceAfter(f.yaml, "buffers:", "dtype", d)) return std::string("no dtype");
    return absl::StrCat("first buffer dtype := ", absl::CEscape(d));
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const values[] = {"1e308", ".nan", "-0",  "0",         "1e-320",
                                  "inf",   "100",  "101", "1000000000"};
    const char* const keys[] = {"atol", "rtol", "trials"};
    const std::string k = keys[Pick(rng, 3)], v = values[Pick(rng, std::size(values))];
    if (!ReplaceAfter(f.yaml, "check:", k, v)) return std::string("no check");
    return absl::StrCat("check.", k, " := ", v);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const sizes[] = {"0", "-5", "4611686018427387904", "2147483648", "65536", "1", "3"};
    const std::string v = sizes[Pick(rng, std::size(sizes))];
    // The first "NAME: digits" after "sizes:".
    const size_t at = f.yaml.find("sizes:");
    if (at == std::string::npos) return std::string("no sizes");
    size_t pos = at + 6;
    while ((pos = f.yaml.find(": ", pos)) != std::string::npos &&
           !std::isdigit(static_cast<unsigned char>(f.yaml[pos + 2])))
      ++pos;
    if (pos == std::string::npos) return std::string("no size");
    size_t end = pos + 2;
    while (end < f.yaml.size() && std::isdigit(static_cast<unsigned char>(f.yaml[end]))) ++end;
    f.yaml.replace(pos + 2, end - pos - 2, v);
    return absl::StrCat("a size := ", v);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const std::string fills[] = {"\"uniform(-1e308, 1e308)\"",
                                 "\"constant(1e308)\"",
                                 "\"randint(-1e300, 1e300)\"",
                                 "\"normal(0, 1e308)\"",
                                 "\"arange(1e308, 1e308)\"",
                                 "\"uniform(nan, 1)\"",
                                 "\"uniform(" + std::string(30000, ' ') + "0, 1)\"",
                                 "\"zeros\"",
                                 "\"constant(-0)\""};
    const std::string v = fills[Pick(rng, std::size(fills))];
    if (!ReplaceAfter(f.yaml, "buffers:", "fill", v)) return std::string("no fill");
    return absl::StrCat("first fill := ", v.substr(0, 40));
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const names[] = {"", "kernel", "main", "matmul_ref", "a b"};
    std::string v = names[Pick(rng, std::size(names))];
    if (Pick(rng, 2) == 0) v = std::string(30000, 'k');
    if (!ReplaceAfter(f.yaml, "seed:", "kernel", v)) return std::string("no kernel");
    return absl::StrCat("seed kernel := '", v.substr(0, 20), "' (", v.size(), " bytes)");
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const globals[] = {"[\"N / 0\"]",
                                   "[0]",
                                   "[-64]",
                                   "[1000000000000]",
                                   "[\"9223372036854775807 + 1\"]",
                                   "[1, 1, 1, 1]",
                                   "[]",
                                   "[\"ceil_div(N, 0)\"]"};
    const std::string v = globals[Pick(rng, std::size(globals))];
    const char* const anchor = Pick(rng, 2) == 0 ? "reference:" : "seed:";
    if (!ReplaceAfter(f.yaml, anchor, "global", v)) return std::string("no global");
    return absl::StrCat(anchor, " first global := ", v);
  });
  m.push_back([](Folder& f, Rng& rng) {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::string deep_map = [] {
      std::string s;
      for (int i = 0; i < 20000; ++i) s += "{a: ";
      return s + "1" + std::string(20000, '}');
    }();
    f.yaml += Pick(rng, 2) == 0 ? "\nextra: " + deep + "\n" : "\nextra: " + deep_map + "\n";
    return std::string("append a field nested 100,000 / 20,000 deep");
  });
  m.push_back([](Folder& f, Rng& rng) {
    switch (Pick(rng, 7)) {
      case 0:
        f.yaml = absl::StrReplaceAll(f.yaml, {{"\n", "\r"}});
        return std::string("CR line endings");
      case 1:
        f.yaml = absl::StrReplaceAll(f.yaml, {{"\n", "\r\n"}});
        return std::string("CRLF line endings");
      case 2:
        f.yaml = "\xef\xbb\xbf" + f.yaml;
        return std::string("UTF-8 BOM");
      case 3:
        f.yaml = "\xff\xfe" + f.yaml;
        return std::string("UTF-16 BOM before UTF-8 text");
      case 4:
        f.yaml.resize(Pick(rng, f.yaml.size()));
        return absl::StrCat("truncated to ", f.yaml.size(), " bytes");
      case 5:
        f.yaml.insert(Pick(rng, f.yaml.size()), std::string("\0\0\0", 3));
        return std::string("NUL bytes inserted");
      default:
        f.yaml = absl::StrReplaceAll(f.yaml, {{"  ", "\t"}});
        return std::string("tabs for indentation");
    }
  });
  m.push_back([](Folder& f, Rng& rng) {
    const std::string v =
        Pick(rng, 2) == 0 ? std::string(30000, 'n') : "n" + std::string(30000, '!');
    if (!ReplaceAfter(f.yaml, "", "name", v)) return std::string("no name");
    return absl::StrCat("name := ", v.size(), " bytes");
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const descs[] = {"\"caf\xe9\"", "\"\xc0\xaf\"", "x\xff",
                                 "\"ok \xc3\xa9\xe6\x97\xa5\""};
    const std::string v = descs[Pick(rng, std::size(descs))];
    const size_t pos = f.yaml.find("description:");
    const size_t end = f.yaml.find('\n', pos);
    if (pos == std::string::npos) return std::string("no description");
    // Replace only the first line: folded descriptions keep their continuation lines.
    f.yaml.replace(pos, end - pos, "description: " + v);
    return absl::StrCat("description := ", absl::CEscape(v));
  });
  return m;
}

std::vector<Mutation> SourceMutations() {
  std::vector<Mutation> m;
  m.push_back([](Folder& f, Rng& rng) {
    if (f.sources.empty()) return std::string("no source");
    auto& [name, text] = f.sources[Pick(rng, f.sources.size())];
    switch (Pick(rng, 8)) {
      case 0:
        text = "#error " + std::string(40000, 'e') + "\n" + text;
        return absl::StrCat(name, ": 40 KB #error line");
      case 1: {
        const size_t paren = text.find('(');
        if (paren == std::string::npos) return std::string("no paren");
        text.insert(paren, std::string(500000, Pick(rng, 2) == 0 ? ' ' : '\n'));
        return absl::StrCat(name, ": 500 KB whitespace before the first '('");
      }
      case 2:
        text.insert(Pick(rng, text.size()), "\xff");
        return absl::StrCat(name, ": invalid UTF-8 byte");
      case 3:
        text = absl::StrReplaceAll(text, {{"\n", "\r"}});
        return absl::StrCat(name, ": CR line endings");
      case 4:
        text = "\xef\xbb\xbf" + text;
        return absl::StrCat(name, ": UTF-8 BOM");
      case 5:
        text.clear();
        return absl::StrCat(name, ": empty");
      case 6:
        text = "#include \"/dev/zero\"\n" + text;
        return absl::StrCat(name, ": #include /dev/zero");
      default:
        text += std::string(1 << 20, ' ');
        return absl::StrCat(name, ": over 1 MB");
    }
  });
  return m;
}

std::vector<Mutation> ReplayMutations() {
  std::vector<Mutation> m;
  m.push_back([](Folder& f, Rng& rng) {
    const char* const caches[] = {
        "/dev/zero",     "../../../../../../dev/zero", "\"\"", ".", "/etc/passwd", "problem.yaml",
        "\"\xff.json\"", "nonexistent.json.gz"};
    const std::string v = caches[Pick(rng, std::size(caches))];
    if (!ReplaceAfter(f.yaml, "replay:", "{cache", v) &&
        !ReplaceAfter(f.yaml, "replay:", "cache", v)) {
      return std::string("no cache");
    }
    return absl::StrCat("replay cache := ", absl::CEscape(v));
  });
  m.push_back([](Folder& f, Rng& rng) {
    const char* const seeds[] = {
        "seed: {params: {block_size_x: [0]}}", "seed: {constraints: [\"block_size_x / 0\"]}",
        "seed: {constraints: [\"1 / (block_size_x - block_size_x)\"]}",
        "seed: {params: {nope: [1]}}", "seed: {params: {block_size_x: [32, 32]}}"};
    const std::string v = seeds[Pick(rng, std::size(seeds))];
    f.yaml += "\n" + v + "\n";
    return absl::StrCat("append ", v);
  });
  return m;
}

Folder ReadFolder(const std::string& dir) {
  Folder f;
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  f.yaml = read(fs::path(dir) / "problem.yaml");
  for (const char* src : {"reference.cl", "seed.cl"}) {
    if (fs::exists(fs::path(dir) / src)) f.sources.emplace_back(src, read(fs::path(dir) / src));
  }
  f.replay = f.yaml.find("backend: replay") != std::string::npos;
  return f;
}

void WriteFolder(const TempDir& tmp, const std::string& rel, const Folder& f) {
  tmp.Write(rel + "/problem.yaml", f.yaml);
  for (const auto& [name, text] : f.sources) tmp.Write(rel + "/" + name, text);
}

std::vector<std::string> Examples() {
  std::vector<std::string> out;
  for (const char* e :
       {"opencl/matmul", "opencl/reduce", "opencl/softmax", "opencl/transpose", "replay/pnpoly"}) {
    out.push_back(SourceDir() + "/examples/" + e);
  }
  return out;
}

int OnlyCase() {
  const char* only = std::getenv("KFORGE_FUZZ_CASE");
  return only != nullptr && *only != '\0' ? std::atoi(only) : -1;
}

bool Keep() {
  const char* keep = std::getenv("KFORGE_FUZZ_KEEP");
  return keep != nullptr && *keep == '1';
}

// A bad-input message from `kforge validate` must name a file, a line and a column, and be short.
std::string JudgeMessage(const Outcome& o, const std::string& dir) {
  if (o.exit_code != 2) return "";
  const std::string prefix = "kforge validate: " + dir + "/";
  if (o.err.rfind(prefix, 0) != 0) {
    return "the message does not start with the folder's file: " + o.Describe();
  }
  size_t i = o.err.find(':', prefix.size());
  auto digits = [&](size_t at) {
    size_t j = at;
    while (j < o.err.size() && std::isdigit(static_cast<unsigned char>(o.err[j]))) ++j;
    return j;
  };
  if (i == std::string::npos) return "no location in the message: " + o.Describe();
  const size_t line_end = digits(i + 1);
  if (line_end == i + 1 || o.err[line_end] != ':') return "no line in the message: " + o.Describe();
  const size_t col_end = digits(line_end + 1);
  if (col_end == line_end + 1 || o.err.compare(col_end, 2, ": ") != 0) {
    return "no column in the message: " + o.Describe();
  }
  if (o.err.size() > 3000) {
    return absl::StrCat("message of ", o.err.size(), " bytes: ", o.Describe());
  }
  return "";
}

class FuzzProblemsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(Kforge())) << Kforge();
    // The evaluator needs the sandbox next to the worker binaries.
    kforge_ = Kforge();
  }

  std::string kforge_;
  TempDir tmp_;
};

TEST_F(FuzzProblemsTest, MutatedProblemFolders) {
  const auto yaml_mutations = YamlMutations();
  const auto source_mutations = SourceMutations();
  const auto replay_mutations = ReplayMutations();
  const auto examples = Examples();
  const int only = OnlyCase();
  int device_evals = 0, validated = 0, refused = 0;
  for (int c = 0; c < kProblemCases; ++c) {
    if (only >= 0 && c != only) continue;
    Rng rng(kSeed + static_cast<uint64_t>(c));
    const std::string example = examples[Pick(rng, examples.size())];
    Folder f = ReadFolder(example);
    std::vector<std::string> applied;
    const size_t count = 1 + Pick(rng, 3);
    for (size_t k = 0; k < count; ++k) {
      const size_t kind = Pick(rng, 10);
      if (kind < 7) {
        applied.push_back(yaml_mutations[Pick(rng, yaml_mutations.size())](f, rng));
      } else if (f.replay) {
        applied.push_back(replay_mutations[Pick(rng, replay_mutations.size())](f, rng));
      } else {
        applied.push_back(source_mutations[Pick(rng, source_mutations.size())](f, rng));
      }
    }
    const std::string rel = absl::StrCat("case", c);
    tmp_.CopyTree(example, rel);  // the cache and licence files of a replay example
    WriteFolder(tmp_, rel, f);
    const std::string dir = tmp_.path() + "/" + rel;
    const std::string context = absl::StrCat(
        "case ", c, " (seed ", kSeed, " + ", c, ", KFORGE_FUZZ_CASE=", c, "), from ", example,
        "\n  mutations:\n    ", absl::StrJoin(applied, "\n    "), "\n  folder: ", dir);

    const Outcome v = RunWithLimit({kforge_, "validate", dir}, kValidateLimitSeconds);
    std::string bad = testing::JudgeKforgeExit(v, "kforge validate");
    if (bad.empty()) bad = JudgeMessage(v, dir);
    EXPECT_EQ(bad, "") << context;
    if (!bad.empty() || !v.exited) continue;

    // Folders that validate reach the evaluator (a bounded number of them); refused ones are
    // refused by eval too, with exit 2, before any device work.
    const bool device = v.exit_code == 0;
    if (device && device_evals >= kMaxDeviceEvals) continue;
    const Outcome e = RunWithLimit({kforge_, "eval", dir, "--timeout", "10"}, kEvalLimitSeconds);
    bad = testing::JudgeKforgeExit(e, "kforge eval");
    if (bad.empty() && (v.exit_code == 2) != (e.exit_code == 2)) {
      bad = absl::StrCat("validate exited ", v.exit_code, " but eval ", e.exit_code, ": ",
                         e.Describe(), "\n--- validate: ", v.Describe());
    }
    EXPECT_EQ(bad, "") << context;
    if (device) {
      ++device_evals;
      ++validated;
    } else {
      ++refused;
    }
    if (Keep() && !bad.empty()) std::cerr << "kept " << dir << "\n";
  }
  std::cerr << "fuzz: " << kProblemCases << " problem cases; eval ran on " << validated
            << " valid and " << refused << " refused folders\n";
  if (Keep()) {
    std::cerr << "KFORGE_FUZZ_KEEP=1: copying the cases to " << tmp_.path() << "-kept\n";
    fs::copy(tmp_.path(), tmp_.path() + "-kept", fs::copy_options::recursive);
  }
}

// Launch plan files for `kforge eval --launches`: the seed's plan of an example, mutated.
std::string PlanOf(const v1::Problem& p) {
  std::string out = "launches:\n";
  auto list = [](const google::protobuf::RepeatedPtrField<std::string>& xs) {
    std::vector<std::string> q;
    for (const auto& x : xs) q.push_back("\"" + x + "\"");
    return "[" + absl::StrJoin(q, ", ") + "]";
  };
  for (const auto& l : p.seed().launches()) {
    absl::StrAppend(&out, "  - kernel: ", l.kernel(), "\n    global: ", list(l.global()), "\n");
    if (!l.local().empty()) absl::StrAppend(&out, "    local: ", list(l.local()), "\n");
    absl::StrAppend(&out, "    args: ", list(l.args()), "\n");
  }
  if (!p.seed().scratch().empty()) {
    absl::StrAppend(&out, "scratch:\n");
    for (const auto& s : p.seed().scratch()) {
      absl::StrAppend(&out, "  ", s.name(), ": {dtype: f32, shape: ", list(s.shape()), "}\n");
    }
  }
  return out;
}

TEST_F(FuzzProblemsTest, MutatedLaunchPlans) {
  const auto yaml_mutations = YamlMutations();
  std::vector<std::string> examples = Examples();
  examples.pop_back();  // the replay example has no launches
  const int only = OnlyCase();
  int device_evals = 0;
  for (int c = 0; c < kPlanCases; ++c) {
    if (only >= 0 && c != only) continue;
    Rng rng(kSeed * 7 + static_cast<uint64_t>(c));
    const std::string example = examples[Pick(rng, examples.size())];
    auto problem = LoadProblem(example);
    ASSERT_TRUE(problem.ok()) << problem.status();
    Folder f;
    f.yaml = PlanOf(*problem);
    std::vector<std::string> applied;
    const size_t count = 1 + Pick(rng, 2);
    for (size_t k = 0; k < count; ++k) {
      switch (Pick(rng, 4)) {
        case 0: {
          const char* const scratch[] = {
              "[1000000000, 1000000000]", "[\"N / 0\"]", "[0]",
              "[4611686018427387904]",    "[268435456]", "[\"WG * 0 - 1\"]"};
          const std::string s = scratch[Pick(rng, std::size(scratch))];
          f.yaml += absl::StrCat("scratch:\n  extra: {dtype: f64, shape: ", s, "}\n");
          applied.push_back("scratch extra shape := " + s);
          if (f.yaml.find("scratch:\n", 0) != f.yaml.rfind("scratch:\n")) {
            applied.back() += " (scratch twice)";
          }
          break;
        }
        case 1: {
          const char* const locals[] = {"[0]",         "[-1]",      "[1000000000]",
                                        "[\"N / 0\"]", "[1, 1, 1]", "[7]"};
          const std::string s = locals[Pick(rng, std::size(locals))];
          if (ReplaceAfter(f.yaml, "launches:", "local", s)) {
            applied.push_back("first local := " + s);
          }
          break;
        }
        default:
          applied.push_back(yaml_mutations[Pick(rng, yaml_mutations.size())](f, rng));
      }
    }
    const std::string plan = tmp_.Write(absl::StrCat("plan", c, ".yaml"), f.yaml);
    const std::string context = absl::StrCat(
        "plan case ", c, " (seed ", kSeed, " * 7 + ", c, ", KFORGE_FUZZ_CASE=", c, "), from ",
        example, "\n  mutations:\n    ", absl::StrJoin(applied, "\n    "), "\n  plan: ", plan);
    // Every plan is evaluated until the device budget is spent; after that only those that the
    // loader refuses (quick) are.
    if (device_evals >= kMaxPlanDeviceEvals) {
      auto loaded = LoadLaunchPlanFile(*problem, plan);
      if (loaded.ok()) continue;
    }
    const Outcome e = RunWithLimit(
        {kforge_, "eval", example, "--launches", plan, "--timeout", "10"}, kEvalLimitSeconds);
    const std::string bad = testing::JudgeKforgeExit(e, "kforge eval --launches");
    EXPECT_EQ(bad, "") << context;
    if (e.exited && e.exit_code != 2) ++device_evals;
  }
}

}  // namespace
}  // namespace kforge
