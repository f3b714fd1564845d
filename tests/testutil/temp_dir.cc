#include "absl/strings/string_view.h"
#include "tests/testutil/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace kforge::testing {

namespace fs = std::filesystem;

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kforge-test-XXXXXX";
  char* made = mkdtemp(tmpl.data());
  if (made == nullptr) ADD_FAILURE() << "mkdtemp failed for " << tmpl;
  path_ = tmpl;
  // Sandboxes started by a root worker run as an unprivileged user, which must reach the folders
  // a test hands them (runtime caches, read paths).
  std::error_code ec;
  fs::permissions(path_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec, ec);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::Write(absl::string_view rel, absl::string_view contents) const {
  const fs::path p = fs::path(path_) / std::string(rel);
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << contents;
  return p.string();
}

std::string TempDir::CopyTree(const std::string& from, absl::string_view rel) const {
  const fs::path to = fs::path(path_) / std::string(rel);
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  return to.string();
}

std::string TempDir::Read(absl::string_view rel) const {
  std::ifstream in(fs::path(path_) / std::string(rel), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

#ifndef KFORGE_SOURCE_DIR
#define KFORGE_SOURCE_DIR "."
#endif
#ifndef KFORGE_BINARY_DIR
#define KFORGE_BINARY_DIR "."
#endif

// Overridable so that test binaries built here can run from a copy elsewhere (the GPU check
// carries them to another machine).
std::string SourceDir() {
  const char* v = std::getenv("KFORGE_TEST_SOURCE_DIR");
  return v != nullptr && *v ? v : KFORGE_SOURCE_DIR;
}
std::string BinaryDir() {
  const char* v = std::getenv("KFORGE_TEST_BINARY_DIR");
  return v != nullptr && *v ? v : KFORGE_BINARY_DIR;
}

bool CorruptMiddleSqlitePage(std::string& bytes, unsigned char pattern) {
  if (bytes.size() < 100) return false;
  size_t page = (static_cast<unsigned char>(bytes[16]) << 8) | static_cast<unsigned char>(bytes[17]);
  if (page == 1) page = 65536;
  const size_t pages = bytes.size() / page;
  if (pages < 3) return false;
  for (size_t i = 0; i < page; ++i) bytes[(pages / 2) * page + i] = static_cast<char>(pattern ^ (i * 13));
  return true;
}

}  // namespace kforge::testing
