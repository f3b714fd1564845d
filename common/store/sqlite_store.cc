#include "common/store/sqlite_store.h"

#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/store/record.h"
#include "absl/strings/str_join.h"

namespace kforge {

namespace {

// Each entry moves the schema from version i to i + 1. Never edit a shipped entry: append.
const char* const kMigrations[] = {
    R"(CREATE TABLE jobs (
         id TEXT PRIMARY KEY,
         tenant TEXT NOT NULL,
         problem_hash TEXT NOT NULL,
         state INTEGER NOT NULL,
         created_order INTEGER NOT NULL,
         body BLOB NOT NULL);
       CREATE INDEX jobs_problem ON jobs(problem_hash);
       CREATE TABLE candidates (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         id TEXT NOT NULL,
         content_hash TEXT NOT NULL,
         sequence INTEGER NOT NULL,
         body BLOB NOT NULL,
         PRIMARY KEY (job_id, id),
         UNIQUE (job_id, content_hash));
       CREATE TABLE evaluations (
         job_id TEXT NOT NULL,
         candidate_id TEXT NOT NULL,
         outcome INTEGER NOT NULL,
         speedup REAL NOT NULL,
         body BLOB NOT NULL,
         PRIMARY KEY (job_id, candidate_id),
         FOREIGN KEY (job_id, candidate_id) REFERENCES candidates(job_id, id));
       CREATE TABLE events (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         sequence INTEGER NOT NULL,
         body BLOB NOT NULL,
         PRIMARY KEY (job_id, sequence));)",
};

// A prepared statement that finalises itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
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
    return std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(s_, i)));
  }
  int64_t ColumnInt(int i) const { return sqlite3_column_int64(s_, i); }
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
absl::StatusOr<std::vector<Msg>> CollectRows(Stmt& s, const char* what, sqlite3* db, const std::string& path) {
  std::vector<Msg> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    auto m = ParseRecord<Msg>(s.ColumnBlob(0), what);
    if (!m.ok()) return m.status();
    out.push_back(*std::move(m));
  }
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat(path, ": reading ", what, " rows: ", sqlite3_errmsg(db)));
  }
  return out;
}

}  // namespace

int SqliteStore::LatestSchemaVersion() { return static_cast<int>(std::size(kMigrations)); }

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path) {
  // SQLite takes "" for a private temporary database, deleted on close: nothing would be kept.
  if (path.empty()) {
    return absl::InvalidArgumentError("database path is empty (give a file, or \":memory:\")");
  }
  std::error_code ec;
  const bool existing = path != ":memory:" && std::filesystem::exists(path, ec) &&
                        std::filesystem::file_size(path, ec) > 0 && !ec;
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat(path, ": cannot open database: ", msg));
  }
  std::unique_ptr<SqliteStore> s(new SqliteStore(db, path));
  sqlite3_busy_timeout(db, 10000);
  if (existing) {
    if (absl::Status st = s->QuickCheck(); !st.ok()) return st;
  }
  if (path != ":memory:") {
    // Switching to WAL needs an exclusive lock and does not always wait on the busy handler:
    // retry while another connection is opening the same file.
    int rc2 = SQLITE_BUSY;
    for (int i = 0; i < 1000 && (rc2 == SQLITE_BUSY || rc2 == SQLITE_LOCKED); ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      rc2 = sqlite3_exec(db, "PRAGMA journal_mode=WAL", nullptr, nullptr, nullptr);
    }
    if (rc2 != SQLITE_OK) return s->Error("set journal mode");
  }
  if (absl::Status st = s->Exec("PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL"); !st.ok()) return st;
  if (absl::Status st = s->Migrate(); !st.ok()) return st;
  return s;
}

SqliteStore::~SqliteStore() { sqlite3_close(db_); }

absl::Status SqliteStore::QuickCheck() {
  // Overwritten pages can go unnoticed until a query reads them (or forever, returning wrong
  // rows): check the whole file's structure once, before anything else touches it.
  Stmt q(db_, "PRAGMA quick_check(10)");
  std::vector<std::string> problems;
  int rc = q.ok() ? SQLITE_ROW : sqlite3_errcode(db_);
  if (q.ok()) {
    while ((rc = q.Step()) == SQLITE_ROW) {
      std::string line = q.ColumnText(0);
      if (line != "ok") problems.push_back(std::move(line));
    }
  }
  if (rc == SQLITE_DONE && problems.empty()) return absl::OkStatus();
  std::string detail = problems.empty() ? sqlite3_errmsg(db_) : absl::StrJoin(problems, "; ");
  if (detail.size() > 500) detail = absl::StrCat(detail.substr(0, 500), "...");
  return absl::DataLossError(
      absl::StrCat(path_, ": the database is damaged (PRAGMA quick_check: ", detail,
                   "); restore it from a copy or start a new one with --db"));
}

absl::Status SqliteStore::Error(const char* what) const {
  return absl::InternalError(absl::StrCat(path_, ": ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status SqliteStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err != nullptr ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat(path_, ": ", msg));
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Migrate() {
  // One write transaction from reading the version to the last migration: connections opening
  // the same new file at once queue on the write lock (busy timeout) instead of racing.
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  auto fail = [this](absl::Status st) {
    (void)Exec("ROLLBACK");
    return st;
  };
  if (absl::Status st = Exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"); !st.ok()) {
    return fail(st);
  }
  {
    Stmt q(db_, "SELECT version FROM schema_version");
    if (q.Step() == SQLITE_ROW) {
      version_ = static_cast<int>(q.ColumnInt(0));
    } else {
      if (absl::Status st = Exec("INSERT INTO schema_version VALUES (0)"); !st.ok()) return fail(st);
    }
  }
  if (version_ > LatestSchemaVersion()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(path_, ": database schema version ", version_,
                                                           " is newer than this kforge understands (",
                                                           LatestSchemaVersion(), ")")));
  }
  while (version_ < LatestSchemaVersion()) {
    const std::string sql =
        absl::StrCat(kMigrations[version_], "; UPDATE schema_version SET version = ", version_ + 1, ";");
    if (absl::Status st = Exec(sql); !st.ok()) {
      return fail(absl::InternalError(
          absl::StrCat("migration to schema version ", version_ + 1, " failed: ", st.message())));
    }
    ++version_;
  }
  if (absl::Status st = Exec("COMMIT"); !st.ok()) return fail(st);
  return absl::OkStatus();
}

absl::Status SqliteStore::CreateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "INSERT INTO jobs (id, tenant, problem_hash, state, created_order, body) VALUES (?, ?, ?, ?, "
         "(SELECT COALESCE(MAX(created_order), 0) + 1 FROM jobs), ?)");
  s.Text(1, job.id()).Text(2, job.spec().tenant()).Text(3, job.spec().problem().content_hash()).Int(4, job.state())
      .Blob(5, job.SerializeAsString());
  const int rc = s.Step();
  if (rc == SQLITE_CONSTRAINT) return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " exists"));
  if (rc != SQLITE_DONE) return Error("insert job");
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> SqliteStore::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT body FROM jobs WHERE id = ?");
  s.Text(1, id);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (rc != SQLITE_ROW) return Error("get job");
  return ParseRecord<v1::Job>(s.ColumnBlob(0), "job");
}

absl::Status SqliteStore::UpdateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "UPDATE jobs SET state = ?, body = ? WHERE id = ?");
  s.Int(1, job.state()).Blob(2, job.SerializeAsString()).Text(3, job.id());
  if (s.Step() != SQLITE_DONE) return Error("update job");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", job.id()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> SqliteStore::ListJobs(const JobQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT body FROM jobs WHERE (?1 = '' OR tenant = ?1) AND (?2 = '' OR problem_hash = ?2) AND "
         "(?3 = 0 OR state = ?3) ORDER BY created_order DESC LIMIT ?4");
  s.Text(1, q.tenant).Text(2, q.problem_hash).Int(3, q.state).Int(4, q.limit);
  return CollectRows<v1::Job>(s, "job", db_, path_);
}

bool SqliteStore::JobExists(const std::string& job_id) {
  Stmt s(db_, "SELECT 1 FROM jobs WHERE id = ?");
  s.Text(1, job_id);
  return s.Step() == SQLITE_ROW;
}

absl::StatusOr<bool> SqliteStore::InsertCandidate(const v1::Candidate& c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(c.job_id())) return absl::NotFoundError(absl::StrCat("no job ", c.job_id()));
  Stmt s(db_, "INSERT OR IGNORE INTO candidates (job_id, id, content_hash, sequence, body) VALUES (?, ?, ?, ?, ?)");
  s.Text(1, c.job_id()).Text(2, c.id()).Text(3, c.content_hash()).Int(4, c.sequence()).Blob(5, c.SerializeAsString());
  if (s.Step() != SQLITE_DONE) return Error("insert candidate");
  return sqlite3_changes(db_) > 0;
}

absl::StatusOr<std::vector<v1::Candidate>> SqliteStore::ListCandidates(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(job_id)) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  Stmt s(db_, "SELECT body FROM candidates WHERE job_id = ? ORDER BY sequence");
  s.Text(1, job_id);
  return CollectRows<v1::Candidate>(s, "candidate", db_, path_);
}

absl::StatusOr<bool> SqliteStore::PutEvaluation(const v1::EvaluationResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  {
    Stmt c(db_, "SELECT 1 FROM candidates WHERE job_id = ? AND id = ?");
    c.Text(1, r.job_id()).Text(2, r.candidate_id());
    if (c.Step() != SQLITE_ROW) {
      return absl::NotFoundError(absl::StrCat("no candidate ", r.candidate_id(), " in job ", r.job_id()));
    }
  }
  Stmt s(db_, "INSERT OR IGNORE INTO evaluations (job_id, candidate_id, outcome, speedup, body) VALUES (?, ?, ?, ?, ?)");
  s.Text(1, r.job_id()).Text(2, r.candidate_id()).Int(3, r.outcome()).Real(4, r.speedup()).Blob(5, r.SerializeAsString());
  if (s.Step() != SQLITE_DONE) return Error("insert evaluation");
  return sqlite3_changes(db_) > 0;
}

absl::StatusOr<std::vector<v1::EvaluationResult>> SqliteStore::ListEvaluations(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(job_id)) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  Stmt s(db_,
         "SELECT e.body FROM evaluations e JOIN candidates c ON c.job_id = e.job_id AND c.id = e.candidate_id "
         "WHERE e.job_id = ? ORDER BY c.sequence");
  s.Text(1, job_id);
  return CollectRows<v1::EvaluationResult>(s, "evaluation", db_, path_);
}

absl::StatusOr<int64_t> SqliteStore::AppendEvent(v1::JobEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(event.job_id())) return absl::NotFoundError(absl::StrCat("no job ", event.job_id()));
  // One statement picks the next sequence and inserts, so concurrent writers cannot collide;
  // the sequence lives in its column (ListEvents copies it into the message).
  event.clear_sequence();
  Stmt s(db_,
         "INSERT INTO events (job_id, sequence, body) VALUES (?1, (SELECT COALESCE(MAX(sequence), 0) + 1 FROM "
         "events WHERE job_id = ?1), ?2) RETURNING sequence");
  s.Text(1, event.job_id()).Blob(2, event.SerializeAsString());
  if (s.Step() != SQLITE_ROW) return Error("insert event");
  const int64_t seq = s.ColumnInt(0);
  if (s.Step() != SQLITE_DONE) return Error("insert event");
  return seq;
}

absl::StatusOr<std::vector<v1::JobEvent>> SqliteStore::ListEvents(const std::string& job_id, int64_t from, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(job_id)) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  Stmt s(db_, "SELECT body, sequence FROM events WHERE job_id = ? AND sequence >= ? ORDER BY sequence LIMIT ?");
  s.Text(1, job_id).Int(2, from).Int(3, limit);
  std::vector<v1::JobEvent> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    auto e = ParseRecord<v1::JobEvent>(s.ColumnBlob(0), "event");
    if (!e.ok()) return e.status();
    e->set_sequence(s.ColumnInt(1));
    out.push_back(*std::move(e));
  }
  if (rc != SQLITE_DONE) return Error("list events");
  return out;
}

}  // namespace kforge
