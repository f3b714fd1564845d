#pragma once

#include "absl/strings/string_view.h"
#include <string>
#include <string_view>

namespace kforge::testing {

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Writes `contents` to path()/rel, creating parent folders; returns the full path.
  std::string Write(absl::string_view rel, absl::string_view contents) const;
  // Copies a folder tree into path()/rel.
  std::string CopyTree(const std::string& from, absl::string_view rel) const;
  std::string Read(absl::string_view rel) const;

 private:
  std::string path_;
};

// Overwrites the middle page of a SQLite database file's bytes (its page size is in the header)
// with a pattern: what a disk that lost a write leaves. Returns false when the file is too small.
bool CorruptMiddleSqlitePage(std::string& bytes, unsigned char pattern);

// The repository checkout the tests were built from.
std::string SourceDir();
std::string BinaryDir();

}  // namespace kforge::testing
