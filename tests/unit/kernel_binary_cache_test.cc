// The worker's kernel binary cache on its own: what it returns, what it refuses (a damaged file, a
// file of another key), and what it keeps within its size.

#include "services/gpu-worker/kernel_binary_cache.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge::worker {
namespace {

namespace fs = std::filesystem;

int CountFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".bin" ? 1 : 0;
  return n;
}

std::string OnlyFile(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) return e.path().string();
  return "";
}

TEST(KernelBinaryCacheTest, ReturnsWhatWasStoredUnderItsKeyOnly) {
  testing::TempDir tmp;
  auto cache = KernelBinaryCache::Open(tmp.path() + "/bin", 1 << 20);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_FALSE((*cache)->Get("k1").has_value());
  const std::string binary("\x7f" "ELF\0\x01\x02 binary", 14);
  ASSERT_TRUE((*cache)->Put("k1", binary).ok());
  ASSERT_TRUE((*cache)->Get("k1").has_value());
  EXPECT_EQ(*(*cache)->Get("k1"), binary);
  EXPECT_FALSE((*cache)->Get("k2").has_value());
  // Another instance (a restarted worker) sees it; the folder is the worker's alone.
  auto again = KernelBinaryCache::Open(tmp.path() + "/bin", 1 << 20);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*(*again)->Get("k1"), binary);
  EXPECT_EQ(fs::status(tmp.path() + "/bin").permissions() & fs::perms::all, fs::perms::owner_all);
  // Replacing keeps one file.
  ASSERT_TRUE((*cache)->Put("k1", "newer").ok());
  EXPECT_EQ(*(*cache)->Get("k1"), "newer");
  EXPECT_EQ(CountFiles(tmp.path() + "/bin"), 1);
}

TEST(KernelBinaryCacheTest, ADamagedOrMisplacedFileIsAMissAndGoes) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/bin";
  auto cache = KernelBinaryCache::Open(dir, 1 << 20);
  ASSERT_TRUE(cache.ok());
  ASSERT_TRUE((*cache)->Put("k1", std::string(1000, 'x')).ok());
  const std::string file = OnlyFile(dir);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f << "y";  // one byte of the binary changed
  }
  EXPECT_FALSE((*cache)->Get("k1").has_value());
  EXPECT_FALSE(fs::exists(file)) << "a damaged file is removed";
  // Truncated.
  ASSERT_TRUE((*cache)->Put("k1", std::string(1000, 'x')).ok());
  fs::resize_file(file, 500);
  EXPECT_FALSE((*cache)->Get("k1").has_value());
  // Another key's file under this key's name.
  ASSERT_TRUE((*cache)->Put("k2", "two").ok());
  const std::string k2 = OnlyFile(dir);
  ASSERT_TRUE((*cache)->Put("k3", "three").ok());
  std::string k3;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().string() != k2) k3 = e.path().string();
  }
  fs::copy_file(k2, k3, fs::copy_options::overwrite_existing);
  EXPECT_FALSE((*cache)->Get("k3").has_value());
  EXPECT_EQ(*(*cache)->Get("k2"), "two");
}

TEST(KernelBinaryCacheTest, KeepsTheNewestWithinItsSize) {
  testing::TempDir tmp;
  const std::string dir = tmp.path() + "/bin";
  auto cache = KernelBinaryCache::Open(dir, 2500);  // two 1000-byte binaries and their headers
  ASSERT_TRUE(cache.ok());
  for (const char* k : {"k1", "k2", "k3"}) {
    ASSERT_TRUE((*cache)->Put(k, std::string(1000, k[1])).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // distinct write times
  }
  EXPECT_FALSE((*cache)->Get("k1").has_value()) << "the oldest went";
  EXPECT_TRUE((*cache)->Get("k2").has_value());
  EXPECT_TRUE((*cache)->Get("k3").has_value());
  EXPECT_EQ(CountFiles(dir), 2);
}

TEST(KernelBinaryCacheTest, AFolderThatCannotBeMadeIsAnError) {
  testing::TempDir tmp;
  std::ofstream(tmp.path() + "/file") << "x";
  EXPECT_FALSE(KernelBinaryCache::Open(tmp.path() + "/file/bin", 1 << 20).ok());
}

}  // namespace
}  // namespace kforge::worker
