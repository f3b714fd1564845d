#include "common/kt_cache.h"

#include <zlib.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

using ::kforge::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A small Kernel Tuner cache: two tunable parameters, 2 x 3 configurations of which four are
// recorded (three ok, one failed to compile), two absent (invalid by the tuner's restrictions).
constexpr char kCacheJson[] = R"({
  "device_name": "NVIDIA A100-SXM4-40GB",
  "kernel_name": "matmul_kernel",
  "problem_size": [4096, 4096],
  "tune_params_keys": ["block_size_x", "tile"],
  "tune_params": {"block_size_x": [32, 64], "tile": [1, 2, 4]},
  "objective": "time",
  "cache": {
    "32,1": {"block_size_x": 32, "tile": 1, "time": 2.5, "times": [2.4, 2.6],
             "compile_time": 110.0, "benchmark_time": 12.5},
    "32,2": {"block_size_x": 32, "tile": 2, "time": 1.25, "compile_time": 95.5,
             "benchmark_time": 7.0},
    "64, 2": {"block_size_x": 64, "tile": 2, "time": 3.0},
    "64,4": {"block_size_x": 64, "tile": 4, "time": "CompilationFailedConfig",
             "compile_time": 40.0}
  }
})";

std::string WriteGzip(const TempDir& dir, const std::string& rel, const std::string& contents) {
  const std::string path = dir.Write(rel, "");
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  if (f == nullptr) return path;
  EXPECT_EQ(gzwrite(f, contents.data(), static_cast<unsigned>(contents.size())),
            static_cast<int>(contents.size()));
  EXPECT_EQ(gzclose(f), Z_OK);
  return path;
}

void CheckSampleCache(const KtCache& c) {
  EXPECT_EQ(c.device_name, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(c.kernel_name, "matmul_kernel");
  EXPECT_THAT(c.keys, ElementsAre("block_size_x", "tile"));
  ASSERT_EQ(c.values.size(), 2u);
  EXPECT_THAT(c.values[0], ElementsAre(32, 64));
  EXPECT_THAT(c.values[1], ElementsAre(1, 2, 4));
  EXPECT_EQ(c.entries.size(), 4u);
  EXPECT_EQ(c.ValidCount(), 3u);
  ASSERT_TRUE(c.OptimumMs().has_value());
  EXPECT_DOUBLE_EQ(*c.OptimumMs(), 1.25);

  auto ok = c.Find({{"block_size_x", 32}, {"tile", 1}});
  ASSERT_TRUE(ok.has_value());
  EXPECT_TRUE(ok->ok);
  EXPECT_DOUBLE_EQ(ok->time_ms, 2.5);
  EXPECT_DOUBLE_EQ(ok->compile_ms, 110.0);
  EXPECT_DOUBLE_EQ(ok->benchmark_ms, 12.5);
  EXPECT_TRUE(ok->failure.empty());

  // The file's key had a space in it; the entry is found by its values.
  auto spaced = c.Find({{"block_size_x", 64}, {"tile", 2}});
  ASSERT_TRUE(spaced.has_value());
  EXPECT_TRUE(spaced->ok);
  EXPECT_DOUBLE_EQ(spaced->time_ms, 3.0);

  auto failed = c.Find({{"block_size_x", 64}, {"tile", 4}});
  ASSERT_TRUE(failed.has_value());
  EXPECT_FALSE(failed->ok);
  EXPECT_EQ(failed->failure, "CompilationFailedConfig");
  EXPECT_DOUBLE_EQ(failed->compile_ms, 40.0);

  EXPECT_FALSE(c.Find({{"block_size_x", 64}, {"tile", 1}}).has_value());  // not recorded
  EXPECT_FALSE(c.Find({{"block_size_x", 32}}).has_value());               // incomplete
  EXPECT_FALSE(c.Find({{"block_size_x", 128}, {"tile", 1}}).has_value());
  // Extra names in the assignment are ignored.
  EXPECT_TRUE(c.Find({{"block_size_x", 32}, {"tile", 2}, {"other", 9}}).has_value());
}

TEST(KtCacheTest, LoadsPlainJson) {
  TempDir dir;
  const std::string path = dir.Write("cache.json", kCacheJson);
  auto c = LoadKtCache(path);
  ASSERT_TRUE(c.ok()) << c.status();
  CheckSampleCache(*c);
}

TEST(KtCacheTest, LoadsGzippedJson) {
  TempDir dir;
  const std::string path = WriteGzip(dir, "cache.json.gz", kCacheJson);
  // Really compressed: the file does not start with '{'.
  EXPECT_EQ(dir.Read("cache.json.gz").substr(0, 2), "\x1f\x8b");
  auto c = LoadKtCache(path);
  ASSERT_TRUE(c.ok()) << c.status();
  CheckSampleCache(*c);
}

TEST(KtCacheTest, ReadMaybeGzipFile) {
  TempDir dir;
  const std::string text = std::string("hello\nworld\0binary", 18) + std::string(200000, 'x');
  const std::string plain = dir.Write("plain.txt", text);
  const std::string gz = WriteGzip(dir, "packed.gz", text);
  auto a = ReadMaybeGzipFile(plain);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, text);
  auto b = ReadMaybeGzipFile(gz);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, text);
  auto missing = ReadMaybeGzipFile(dir.path() + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nope"));
}

TEST(KtCacheTest, MissingFileNamesTheFile) {
  TempDir dir;
  auto c = LoadKtCache(dir.path() + "/absent.json", "absent.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()), ::testing::StartsWith("absent.json: "));
}

TEST(KtCacheTest, TruncatedGzipIsAnError) {
  TempDir dir;
  WriteGzip(dir, "full.gz", kCacheJson);
  const std::string bytes = dir.Read("full.gz");
  const std::string path = dir.Write("cut.json.gz", bytes.substr(0, bytes.size() / 2));
  auto c = LoadKtCache(path, "cut.json.gz");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), ::testing::StartsWith("cut.json.gz: "));
}

struct BadCase {
  const char* name;
  std::string json;
  const char* want;  // substring of the message
};

class KtCacheBadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(KtCacheBadTest, ClearError) {
  const BadCase& bc = GetParam();
  TempDir dir;
  for (bool gz : {false, true}) {
    const std::string path =
        gz ? WriteGzip(dir, "bad.json.gz", bc.json) : dir.Write("bad.json", bc.json);
    auto c = LoadKtCache(path, "tuning/bad.json");
    ASSERT_FALSE(c.ok()) << bc.name << (gz ? " (gzip)" : "");
    const std::string msg(c.status().message());
    EXPECT_THAT(msg, ::testing::StartsWith("tuning/bad.json: ")) << bc.name;
    EXPECT_THAT(msg, HasSubstr(bc.want)) << bc.name;
    // Without a display name the path is used.
    auto d = LoadKtCache(path);
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(std::string(d.status().message()), ::testing::StartsWith(path + ": "));
  }
}

const std::string kKeys = R"("tune_params_keys": ["x"], "tune_params": {"x": [1, 2]})";

INSTANTIATE_TEST_SUITE_P(
    Malformed, KtCacheBadTest,
    ::testing::Values(
        BadCase{"not_json", "{\"cache\": {", "not valid JSON"},
        BadCase{"empty_file", "", "not valid JSON"},
        BadCase{"array", "[1, 2, 3]", "top level must be an object"},
        BadCase{"no_keys", R"({"tune_params": {"x": [1]}, "cache": {}})", "tune_params_keys"},
        BadCase{"keys_not_list", R"({"tune_params_keys": "x", "tune_params": {"x": [1]}})",
                "tune_params_keys"},
        BadCase{"no_params", R"({"tune_params_keys": ["x"], "cache": {}})",
                "missing tune_params"},
        BadCase{"key_not_string",
                R"({"tune_params_keys": [1], "tune_params": {"x": [1]}, "cache": {}})",
                "tune_params_keys must hold strings"},
        BadCase{"param_missing",
                R"({"tune_params_keys": ["x", "y"], "tune_params": {"x": [1]}, "cache": {}})",
                "tune_params.y is missing or empty"},
        BadCase{"param_empty",
                R"({"tune_params_keys": ["x"], "tune_params": {"x": []}, "cache": {}})",
                "tune_params.x is missing or empty"},
        BadCase{"param_float",
                R"({"tune_params_keys": ["x"], "tune_params": {"x": [1, 1.5]}, "cache": {}})",
                "only integer values"},
        BadCase{"param_string",
                R"({"tune_params_keys": ["x"], "tune_params": {"x": ["a"]}, "cache": {}})",
                "only integer values"},
        BadCase{"no_cache", "{" + kKeys + "}", "missing cache"},
        BadCase{"cache_not_object", "{" + kKeys + R"(, "cache": [1])" + "}", "missing cache"},
        BadCase{"entry_not_object", "{" + kKeys + R"(, "cache": {"1": 5})" + "}",
                "cache['1'] is not an object"},
        BadCase{"entry_lacks_param", "{" + kKeys + R"(, "cache": {"1": {"time": 1.0}})" + "}",
                "cache['1'] lacks integer parameter x"},
        BadCase{"entry_param_not_int",
                "{" + kKeys + R"(, "cache": {"1": {"x": "1", "time": 1.0}})" + "}",
                "cache['1'] lacks integer parameter x"},
        BadCase{"entry_no_time", "{" + kKeys + R"(, "cache": {"1": {"x": 1}})" + "}",
                "cache['1'] has no time"},
        BadCase{"entry_time_null", "{" + kKeys + R"(, "cache": {"1": {"x": 1, "time": null}})" + "}",
                "cache['1'] has no time"},
        BadCase{"empty_cache", "{" + kKeys + R"(, "cache": {}})", "cache is empty"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kforge
