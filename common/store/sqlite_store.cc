#include "common/hash.h"
#include "common/store/sqlite_store.h"

#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/store/record.h"
#include "common/store/sqlite_schema.h"
#include "common/store/sqlite_statement.h"

namespace kforge {

using sqlite::CollectRows;
using sqlite::Stmt;

namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A job row (body, version) back to its message: the version lives in its column.
absl::StatusOr<v1::Job> JobFromRow(Stmt& s) {
  auto j = ParseRecord<v1::Job>(s.ColumnBlob(0), "job");
  if (j.ok()) j->set_version(s.ColumnInt(1));
  return j;
}

}  // namespace

int SqliteStore::LatestSchemaVersion() { return static_cast<int>(sqlite::Migrations().size()); }

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
        absl::StrCat(sqlite::Migrations()[version_],
                     "; UPDATE schema_version SET version = ", version_ + 1, ";");
    if (absl::Status st = Exec(sql); !st.ok()) {
      return fail(absl::InternalError(
          absl::StrCat("migration to schema version ", version_ + 1, " failed: ", st.message())));
    }
    ++version_;
  }
  if (absl::Status st = Exec("COMMIT"); !st.ok()) return fail(st);
  return absl::OkStatus();
}

template <typename T, typename Fn>
absl::StatusOr<T> SqliteStore::InTransaction(Fn fn) {
  if (absl::Status st = Exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  absl::StatusOr<T> r = fn();
  if (r.ok()) {
    if (absl::Status st = Exec("COMMIT"); st.ok()) return r;
    else r = st;
  }
  if (absl::Status st = Exec("ROLLBACK"); !st.ok()) return st;
  return r;
}

bool SqliteStore::JobExists(const std::string& job_id) {
  Stmt s(db_, "SELECT 1 FROM jobs WHERE id = ?");
  s.Text(1, job_id);
  return s.Step() == SQLITE_ROW;
}

absl::Status SqliteStore::CheckWritable(const std::string& job_id, int64_t fence) {
  Stmt s(db_, "SELECT lease_token FROM jobs WHERE id = ?");
  s.Text(1, job_id);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return NoJobError(job_id);
  if (rc != SQLITE_ROW) return Error("read job lease");
  if (fence != kNoFence && s.ColumnInt(0) != fence) return StaleFenceError(job_id, fence, s.ColumnInt(0));
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> SqliteStore::CreateJob(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<v1::Job>([&]() -> absl::StatusOr<v1::Job> {
    if (!job.idempotency_key().empty()) {
      Stmt q(db_, "SELECT body, version FROM jobs WHERE tenant = ? AND idempotency_key = ?");
      q.Text(1, job.spec().tenant()).Text(2, job.idempotency_key());
      if (q.Step() == SQLITE_ROW) return JobFromRow(q);
    }
    v1::Job stored = job;
    stored.set_version(1);
    Stmt s(db_,
           "INSERT INTO jobs (id, tenant, problem_hash, state, created_order, body, idempotency_key, kernel_key) "
           "VALUES (?, ?, ?, ?, (SELECT COALESCE(MAX(created_order), 0) + 1 FROM jobs), ?, ?, ?)");
    s.Text(1, job.id()).Text(2, job.spec().tenant()).Text(3, job.spec().problem().content_hash()).Int(4, job.state())
        .Blob(5, stored.SerializeAsString()).Text(6, job.idempotency_key()).Text(7, HashKernel(job.spec().problem()));
    const int rc = s.Step();
    if (rc == SQLITE_CONSTRAINT) return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " exists"));
    if (rc != SQLITE_DONE) return Error("insert job");
    return stored;
  });
}

absl::StatusOr<v1::Job> SqliteStore::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT body, version FROM jobs WHERE id = ?");
  s.Text(1, id);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return NoJobError(id);
  if (rc != SQLITE_ROW) return Error("get job");
  return JobFromRow(s);
}

absl::StatusOr<int64_t> SqliteStore::UpdateJob(const v1::Job& job, int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<int64_t>([&]() -> absl::StatusOr<int64_t> {
    if (absl::Status st = CheckWritable(job.id(), fence); !st.ok()) return st;
    v1::Job stored = job;
    stored.set_version(job.version() + 1);
    Stmt s(db_, "UPDATE jobs SET state = ?, body = ?, version = version + 1 WHERE id = ? AND version = ?");
    s.Int(1, job.state()).Blob(2, stored.SerializeAsString()).Text(3, job.id()).Int(4, job.version());
    if (s.Step() != SQLITE_DONE) return Error("update job");
    if (sqlite3_changes(db_) > 0) return stored.version();
    Stmt v(db_, "SELECT version FROM jobs WHERE id = ?");
    v.Text(1, job.id());
    if (v.Step() != SQLITE_ROW) return NoJobError(job.id());
    return VersionConflictError(job.id(), job.version(), v.ColumnInt(0));
  });
}

absl::StatusOr<JobCounts> SqliteStore::CountJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT tenant, state, count(*) FROM jobs GROUP BY tenant, state");
  JobCounts out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    out[{s.ColumnText(0), static_cast<v1::JobState>(s.ColumnInt(1))}] = s.ColumnInt(2);
  }
  if (rc != SQLITE_DONE) return Error("count jobs");
  return out;
}

absl::StatusOr<std::vector<v1::Job>> SqliteStore::ListJobs(const JobQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT body, version FROM jobs WHERE (?1 = '' OR tenant = ?1) AND (?2 = '' OR problem_hash = ?2) AND "
         "(?6 = '' OR kernel_key = ?6) AND (?3 = 0 OR state = ?3) AND (?5 = '' OR created_order < COALESCE((SELECT created_order FROM jobs "
         "WHERE id = ?5), 0)) ORDER BY created_order DESC LIMIT ?4");
  s.Text(1, q.tenant).Text(2, q.problem_hash).Int(3, q.state).Int(4, q.limit).Text(5, q.after_job_id).Text(6, q.kernel_key);
  std::vector<v1::Job> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    auto j = JobFromRow(s);
    if (!j.ok()) return j.status();
    out.push_back(*std::move(j));
  }
  if (rc != SQLITE_DONE) return Error("list jobs");
  return out;
}

absl::StatusOr<JobLease> SqliteStore::ClaimJob(const std::string& job_id, const std::string& owner,
                                               double lease_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<JobLease>([&]() -> absl::StatusOr<JobLease> {
    const double now = NowSeconds();
    Stmt q(db_, "SELECT lease_owner, lease_token, lease_expires FROM jobs WHERE id = ?");
    q.Text(1, job_id);
    const int rc = q.Step();
    if (rc == SQLITE_DONE) return NoJobError(job_id);
    if (rc != SQLITE_ROW) return Error("read job lease");
    const std::string current = q.ColumnText(0);
    int64_t token = q.ColumnInt(1);
    if (!current.empty() && current != owner && q.ColumnReal(2) > now) return LeaseHeldError(job_id, current);
    if (current != owner) ++token;
    Stmt u(db_, "UPDATE jobs SET lease_owner = ?, lease_token = ?, lease_expires = ? WHERE id = ?");
    u.Text(1, owner).Int(2, token).Real(3, now + lease_seconds).Text(4, job_id);
    if (u.Step() != SQLITE_DONE) return Error("claim job");
    return JobLease{owner, token};
  });
}

absl::Status SqliteStore::RenewJobLease(const std::string& job_id, const JobLease& lease, double lease_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt u(db_, "UPDATE jobs SET lease_expires = ? WHERE id = ? AND lease_owner = ? AND lease_token = ?");
  u.Real(1, NowSeconds() + lease_seconds).Text(2, job_id).Text(3, lease.owner).Int(4, lease.token);
  if (u.Step() != SQLITE_DONE) return Error("renew job lease");
  if (sqlite3_changes(db_) > 0) return absl::OkStatus();
  return JobExists(job_id) ? LeaseLostError(job_id, lease.token) : NoJobError(job_id);
}

absl::Status SqliteStore::ReleaseJob(const std::string& job_id, const JobLease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt u(db_, "UPDATE jobs SET lease_owner = '', lease_expires = 0 WHERE id = ? AND lease_owner = ? AND lease_token = ?");
  u.Text(1, job_id).Text(2, lease.owner).Int(3, lease.token);
  if (u.Step() != SQLITE_DONE) return Error("release job");
  if (sqlite3_changes(db_) > 0) return absl::OkStatus();
  return JobExists(job_id) ? LeaseLostError(job_id, lease.token) : NoJobError(job_id);
}

absl::StatusOr<std::vector<bool>> SqliteStore::InsertCandidates(const std::string& job_id,
                                                                absl::Span<const v1::Candidate> candidates,
                                                                int64_t fence) {
  if (absl::Status st = CheckCandidatesJob(job_id, candidates); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<std::vector<bool>>([&]() -> absl::StatusOr<std::vector<bool>> {
    if (absl::Status st = CheckWritable(job_id, fence); !st.ok()) return st;
    return InsertCandidateRows(candidates);
  });
}

absl::StatusOr<std::vector<bool>> SqliteStore::InsertCandidateRows(
    absl::Span<const v1::Candidate> candidates) {
  std::vector<bool> out;
  out.reserve(candidates.size());
  for (const auto& c : candidates) {
    Stmt s(db_,
           "INSERT OR IGNORE INTO candidates (job_id, id, content_hash, sequence, body) VALUES (?, "
           "?, ?, ?, ?)");
    s.Text(1, c.job_id())
        .Text(2, c.id())
        .Text(3, c.content_hash())
        .Int(4, c.sequence())
        .Blob(5, c.SerializeAsString());
    if (s.Step() != SQLITE_DONE) return Error("insert candidate");
    out.push_back(sqlite3_changes(db_) > 0);
  }
  return out;
}

absl::StatusOr<std::vector<v1::Candidate>> SqliteStore::ListCandidates(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(job_id)) return NoJobError(job_id);
  Stmt s(db_, "SELECT body FROM candidates WHERE job_id = ? ORDER BY sequence");
  s.Text(1, job_id);
  return CollectRows<v1::Candidate>(s, "candidate", db_, path_);
}

absl::StatusOr<std::vector<PutOutcome>> SqliteStore::PutEvaluations(const std::string& job_id,
                                                                    const std::vector<v1::EvaluationResult>& results,
                                                                    int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<std::vector<PutOutcome>>([&]() -> absl::StatusOr<std::vector<PutOutcome>> {
    if (absl::Status st = CheckWritable(job_id, fence); !st.ok()) return st;
    return PutEvaluationRows(job_id, results);
  });
}

absl::StatusOr<std::vector<PutOutcome>> SqliteStore::PutEvaluationRows(
    const std::string& job_id, const std::vector<v1::EvaluationResult>& results) {
  std::vector<PutOutcome> out;
  out.reserve(results.size());
  for (const auto& r : results) {
    Stmt c(db_, "SELECT 1 FROM candidates WHERE job_id = ? AND id = ?");
    c.Text(1, job_id).Text(2, r.candidate_id());
    if (r.job_id() != job_id || c.Step() != SQLITE_ROW) {
      out.push_back(PutOutcome::kUnknownCandidate);
      continue;
    }
    Stmt s(db_,
           "INSERT OR IGNORE INTO evaluations (job_id, candidate_id, outcome, speedup, body) "
           "VALUES (?, ?, ?, ?, ?)");
    s.Text(1, job_id)
        .Text(2, r.candidate_id())
        .Int(3, r.outcome())
        .Real(4, r.speedup())
        .Blob(5, r.SerializeAsString());
    if (s.Step() != SQLITE_DONE) return Error("insert evaluation");
    out.push_back(sqlite3_changes(db_) > 0 ? PutOutcome::kStored : PutOutcome::kDuplicate);
  }
  return out;
}

absl::StatusOr<StepOutcome> SqliteStore::PutEvaluationsAndCandidates(
    const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
    absl::Span<const v1::Candidate> candidates, int64_t fence) {
  if (absl::Status st = CheckCandidatesJob(job_id, candidates); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<StepOutcome>([&]() -> absl::StatusOr<StepOutcome> {
    if (absl::Status st = CheckWritable(job_id, fence); !st.ok()) return st;
    StepOutcome out;
    KF_ASSIGN_OR_RETURN(out.evaluations, PutEvaluationRows(job_id, results));
    KF_ASSIGN_OR_RETURN(out.candidates, InsertCandidateRows(candidates));
    return out;
  });
}

absl::StatusOr<std::vector<v1::EvaluationResult>> SqliteStore::ListEvaluations(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!JobExists(job_id)) return NoJobError(job_id);
  Stmt s(db_,
         "SELECT e.body FROM evaluations e JOIN candidates c ON c.job_id = e.job_id AND c.id = e.candidate_id "
         "WHERE e.job_id = ? ORDER BY c.sequence");
  s.Text(1, job_id);
  return CollectRows<v1::EvaluationResult>(s, "evaluation", db_, path_);
}

absl::StatusOr<std::vector<v1::EvaluationResult>> SqliteStore::FindEvaluations(const EvaluationQuery& q) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT e.body FROM candidates c JOIN evaluations e ON e.job_id = c.job_id AND e.candidate_id = c.id "
         "JOIN jobs j ON j.id = c.job_id WHERE c.content_hash = ? AND j.tenant = ? AND j.problem_hash = ? "
         "AND j.id <> ? ORDER BY j.created_order DESC LIMIT ?");
  s.Text(1, q.content_hash).Text(2, q.tenant).Text(3, q.problem_hash).Text(4, q.exclude_job_id).Int(5, q.limit);
  return CollectRows<v1::EvaluationResult>(s, "evaluation", db_, path_);
}

absl::StatusOr<int64_t> SqliteStore::AppendSequenced(const char* table, const std::string& job_id,
                                                     const std::string& body, int64_t fence) {
  return InTransaction<int64_t>([&]() -> absl::StatusOr<int64_t> {
    if (absl::Status st = CheckWritable(job_id, fence); !st.ok()) return st;
    // One statement picks the next sequence and inserts; the sequence lives in its column (the
    // readers copy it into the message).
    const std::string sql = absl::StrCat("INSERT INTO ", table, " (job_id, sequence, body) VALUES (?1, (SELECT "
                                         "COALESCE(MAX(sequence), 0) + 1 FROM ", table,
                                         " WHERE job_id = ?1), ?2) RETURNING sequence");
    Stmt s(db_, sql.c_str());
    s.Text(1, job_id).Blob(2, body);
    if (s.Step() != SQLITE_ROW) return Error("append");
    const int64_t seq = s.ColumnInt(0);
    if (s.Step() != SQLITE_DONE) return Error("append");
    return seq;
  });
}

template <typename Msg>
absl::StatusOr<std::vector<Msg>> SqliteStore::ListSequenced(const char* table, const std::string& job_id,
                                                            int64_t from, int limit) {
  if (!JobExists(job_id)) return NoJobError(job_id);
  const std::string sql = absl::StrCat("SELECT body, sequence FROM ", table,
                                       " WHERE job_id = ? AND sequence >= ? ORDER BY sequence LIMIT ?");
  Stmt s(db_, sql.c_str());
  s.Text(1, job_id).Int(2, from).Int(3, limit);
  std::vector<Msg> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    auto e = ParseRecord<Msg>(s.ColumnBlob(0), table);
    if (!e.ok()) return e.status();
    e->set_sequence(s.ColumnInt(1));
    out.push_back(*std::move(e));
  }
  if (rc != SQLITE_DONE) return Error("list");
  return out;
}

absl::StatusOr<int64_t> SqliteStore::AppendEvent(v1::JobEvent event, int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  event.clear_sequence();
  return AppendSequenced("events", event.job_id(), event.SerializeAsString(), fence);
}

absl::StatusOr<std::vector<v1::JobEvent>> SqliteStore::ListEvents(const std::string& job_id, int64_t from, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  return ListSequenced<v1::JobEvent>("events", job_id, from, limit);
}

absl::StatusOr<int64_t> SqliteStore::AppendModelCall(v1::ModelCall call, int64_t fence) {
  std::lock_guard<std::mutex> lock(mu_);
  call.clear_sequence();
  return AppendSequenced("model_calls", call.job_id(), call.SerializeAsString(), fence);
}

absl::StatusOr<std::vector<v1::ModelCall>> SqliteStore::ListModelCalls(const std::string& job_id, int64_t from,
                                                                       int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  return ListSequenced<v1::ModelCall>("model_calls", job_id, from, limit);
}

absl::Status SqliteStore::CreateTenant(const v1::Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "INSERT INTO tenants (name, body) VALUES (?, ?)");
  s.Text(1, tenant.name()).Blob(2, tenant.SerializeAsString());
  const int rc = s.Step();
  if (rc == SQLITE_CONSTRAINT) return absl::AlreadyExistsError(absl::StrCat("tenant ", tenant.name(), " exists"));
  if (rc != SQLITE_DONE) return Error("insert tenant");
  return absl::OkStatus();
}

absl::StatusOr<v1::Tenant> SqliteStore::GetTenant(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT body FROM tenants WHERE name = ?");
  s.Text(1, name);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return NoTenantError(name);
  if (rc != SQLITE_ROW) return Error("get tenant");
  return ParseRecord<v1::Tenant>(s.ColumnBlob(0), "tenant");
}

absl::Status SqliteStore::UpdateTenant(const v1::Tenant& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<bool>([&]() -> absl::StatusOr<bool> {
    Stmt q(db_, "SELECT body FROM tenants WHERE name = ?");
    q.Text(1, tenant.name());
    if (q.Step() != SQLITE_ROW) return NoTenantError(tenant.name());
    absl::StatusOr<v1::Tenant> stored = ParseRecord<v1::Tenant>(q.ColumnBlob(0), "tenant");
    if (!stored.ok()) return stored.status();
    stored->set_display_name(tenant.display_name());
    *stored->mutable_quota() = tenant.quota();
    stored->set_share_history(tenant.share_history());
    Stmt u(db_, "UPDATE tenants SET body = ? WHERE name = ?");
    u.Blob(1, stored->SerializeAsString()).Text(2, tenant.name());
    if (u.Step() != SQLITE_DONE) return Error("update tenant");
    return true;
  }).status();
}

absl::StatusOr<std::vector<v1::Tenant>> SqliteStore::ListTenants() {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT body FROM tenants ORDER BY name");
  return CollectRows<v1::Tenant>(s, "tenant", db_, path_);
}

absl::Status SqliteStore::CreateApiKey(const v1::ApiKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return InTransaction<bool>([&]() -> absl::StatusOr<bool> {
    Stmt t(db_, "SELECT 1 FROM tenants WHERE name = ?");
    t.Text(1, key.tenant());
    if (t.Step() != SQLITE_ROW) return NoTenantError(key.tenant());
    Stmt s(db_, "INSERT INTO api_keys (id, tenant, secret_sha256, revoked, body) VALUES (?, ?, ?, ?, ?)");
    s.Text(1, key.id()).Text(2, key.tenant()).Text(3, key.secret_sha256()).Int(4, key.revoked() ? 1 : 0)
        .Blob(5, key.SerializeAsString());
    const int rc = s.Step();
    if (rc == SQLITE_CONSTRAINT) return absl::AlreadyExistsError(absl::StrCat("api key ", key.id(), " exists"));
    if (rc != SQLITE_DONE) return Error("insert api key");
    return true;
  }).status();
}

absl::StatusOr<v1::ApiKey> SqliteStore::FindApiKey(const std::string& secret_sha256) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT body, revoked FROM api_keys WHERE secret_sha256 = ? AND revoked = 0");
  s.Text(1, secret_sha256);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return absl::NotFoundError("no such api key");
  if (rc != SQLITE_ROW) return Error("find api key");
  return ParseRecord<v1::ApiKey>(s.ColumnBlob(0), "api key");
}

absl::StatusOr<std::vector<v1::ApiKey>> SqliteStore::ListApiKeys(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT body, revoked FROM api_keys WHERE tenant = ? ORDER BY id");
  s.Text(1, tenant);
  std::vector<v1::ApiKey> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    auto k = ParseRecord<v1::ApiKey>(s.ColumnBlob(0), "api key");
    if (!k.ok()) return k.status();
    k->set_revoked(s.ColumnInt(1) != 0);
    out.push_back(*std::move(k));
  }
  if (rc != SQLITE_DONE) return Error("list api keys");
  return out;
}

absl::Status SqliteStore::RevokeApiKey(const std::string& key_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt u(db_, "UPDATE api_keys SET revoked = 1 WHERE id = ?");
  u.Text(1, key_id);
  if (u.Step() != SQLITE_DONE) return Error("revoke api key");
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no api key ", key_id));
  return absl::OkStatus();
}

}  // namespace kforge
