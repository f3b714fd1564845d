#pragma once

// The SQLite store's prepared statements: one that finalises itself, and the loop that parses a
// query's rows of serialised records.

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/store/record.h"

namespace kforge::sqlite {

// A prepared statement that finalises itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Text(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Blob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Int(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Real(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  std::string ColumnBlob(int i) const {
    const void* p = sqlite3_column_blob(s_, i);
    return std::string(static_cast<const char*>(p),
                       static_cast<size_t>(sqlite3_column_bytes(s_, i)));
  }
  int64_t ColumnInt(int i) const { return sqlite3_column_int64(s_, i); }
  double ColumnReal(int i) const { return sqlite3_column_double(s_, i); }
  std::string ColumnText(int i) const {
    const unsigned char* p = sqlite3_column_text(s_, i);
    return p == nullptr ? ""
                        : std::string(reinterpret_cast<const char*>(p),
                                      static_cast<size_t>(sqlite3_column_bytes(s_, i)));
  }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

// Steps a query whose first column is a serialised Msg and parses every row.
template <typename Msg>
absl::StatusOr<std::vector<Msg>> CollectRows(Stmt& s, const char* what, sqlite3* db,
                                             const std::string& path) {
  std::vector<Msg> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    auto m = ParseRecord<Msg>(s.ColumnBlob(0), what);
    if (!m.ok()) return m.status();
    out.push_back(*std::move(m));
  }
  if (rc != SQLITE_DONE) {
    return absl::InternalError(
        absl::StrCat(path, ": reading ", what, " rows: ", sqlite3_errmsg(db)));
  }
  return out;
}

}  // namespace kforge::sqlite
