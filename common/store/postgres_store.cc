#include "common/store/postgres_store.h"

#include <chrono>
#include <thread>

#include <pqxx/pqxx>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/store/record.h"

namespace kforge {

namespace {

// Each entry moves the schema from version i to i + 1. Never edit a shipped entry: append.
const char* const kMigrations[] = {
    R"(CREATE TABLE jobs (
         id TEXT PRIMARY KEY,
         tenant TEXT NOT NULL,
         problem_hash TEXT NOT NULL,
         state INTEGER NOT NULL,
         created_order BIGSERIAL NOT NULL,
         body BYTEA NOT NULL);
       CREATE INDEX jobs_tenant_order ON jobs(tenant, created_order DESC);
       CREATE INDEX jobs_problem ON jobs(problem_hash);
       CREATE INDEX jobs_state ON jobs(state);
       CREATE TABLE candidates (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         id TEXT NOT NULL,
         content_hash TEXT NOT NULL,
         sequence BIGINT NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, id),
         UNIQUE (job_id, content_hash));
       CREATE INDEX candidates_sequence ON candidates(job_id, sequence);
       CREATE TABLE evaluations (
         job_id TEXT NOT NULL,
         candidate_id TEXT NOT NULL,
         outcome INTEGER NOT NULL,
         speedup DOUBLE PRECISION NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, candidate_id),
         FOREIGN KEY (job_id, candidate_id) REFERENCES candidates(job_id, id));
       CREATE TABLE events (
         job_id TEXT NOT NULL REFERENCES jobs(id),
         sequence BIGINT NOT NULL,
         body BYTEA NOT NULL,
         PRIMARY KEY (job_id, sequence));)",
};

// Held while migrating: two coordinators starting at once migrate once.
constexpr int64_t kMigrationLock = 0x6b666f7267650001;

}  // namespace

std::string RedactUrlPassword(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t at = url.find('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon) + url.substr(at);
}

namespace {

std::string Bytes(const pqxx::field& f) { return pqxx::binarystring(f).str(); }

template <typename Msg>
absl::StatusOr<std::vector<Msg>> ParseRows(const pqxx::result& r, const char* what) {
  std::vector<Msg> out;
  out.reserve(r.size());
  for (const auto& row : r) {
    auto m = ParseRecord<Msg>(Bytes(row[0]), what);
    if (!m.ok()) return m.status();
    out.push_back(*std::move(m));
  }
  return out;
}

bool JobExists(pqxx::work& w, const std::string& job_id) {
  return !w.exec_params("SELECT 1 FROM jobs WHERE id = $1", job_id).empty();
}

}  // namespace

bool IsPostgresUrl(const std::string& db) {
  return absl::StartsWith(db, "postgresql://") || absl::StartsWith(db, "postgres://");
}

struct PostgresStore::Conn {
  explicit Conn(const std::string& url) : c(url) {}
  pqxx::connection c;
};

int PostgresStore::LatestSchemaVersion() { return static_cast<int>(std::size(kMigrations)); }

PostgresStore::PostgresStore(std::string url, PostgresOptions options)
    : url_(std::move(url)), display_(RedactUrlPassword(url_)), options_(options) {}

PostgresStore::~PostgresStore() = default;

absl::StatusOr<std::unique_ptr<PostgresStore>> PostgresStore::Open(const std::string& url, PostgresOptions options) {
  if (!IsPostgresUrl(url)) {
    return absl::InvalidArgumentError("a PostgreSQL database is named postgresql://user@host:port/db");
  }
  if (options.pool_size < 1) options.pool_size = 1;
  std::unique_ptr<PostgresStore> s(new PostgresStore(url, options));
  if (absl::Status st = s->Migrate(); !st.ok()) return st;
  return s;
}

std::unique_ptr<PostgresStore::Conn> PostgresStore::Take(absl::Status* error) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !idle_.empty() || open_ < options_.pool_size; });
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    ++open_;
  }
  try {
    return std::make_unique<Conn>(url_);
  } catch (const std::exception& e) {
    *error = absl::UnavailableError(absl::StrCat(display_, ": cannot connect: ", e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  --open_;
  cv_.notify_one();
  return nullptr;
}

void PostgresStore::Give(std::unique_ptr<Conn> c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (c != nullptr && c->c.is_open()) {
    idle_.push_back(std::move(c));
  } else {
    --open_;
  }
  cv_.notify_one();
}

template <typename T, typename Fn>
absl::StatusOr<T> PostgresStore::WithTransaction(const char* what, Fn fn, double window_seconds) {
  const double window = window_seconds >= 0 ? window_seconds : options_.reconnect_seconds;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(window);
  double backoff = 0.05;
  absl::Status last;
  for (int attempt = 1;; ++attempt) {
    if (attempt > 1) {
      if (std::chrono::steady_clock::now() >= until) {
        return absl::UnavailableError(absl::StrCat(display_, ": ", what, ": the database did not come back within ",
                                                   options_.reconnect_seconds, " s (", last.message(), ")"));
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 1.0);
    }
    absl::Status take_error;
    std::unique_ptr<Conn> c = Take(&take_error);
    if (c == nullptr) {
      last = take_error;
      continue;
    }
    try {
      pqxx::work w(c->c);
      absl::StatusOr<T> r = fn(w, attempt);
      if (r.ok()) {
        w.commit();
      } else {
        w.abort();
      }
      Give(std::move(c));
      return r;
    } catch (const pqxx::broken_connection& e) {
      last = absl::UnavailableError(e.what());
      c.reset();  // reopened on the next attempt
    } catch (const pqxx::in_doubt_error& e) {
      // The commit may or may not have happened: the retry's idempotence decides.
      last = absl::UnavailableError(e.what());
      c.reset();
    } catch (const pqxx::sql_error& e) {
      // The server refused the statement. A server shutting down (admin_shutdown, 57P01) or
      // not yet accepting (cannot_connect_now, 57P03) is transient; anything else is not.
      const std::string state = e.sqlstate();
      if (absl::StartsWith(state, "57P") || absl::StartsWith(state, "08")) {
        last = absl::UnavailableError(e.what());
        c.reset();
        Give(nullptr);
        continue;
      }
      Give(std::move(c));
      return absl::InternalError(absl::StrCat(display_, ": ", what, ": ", e.what()));
    } catch (const std::exception& e) {
      Give(nullptr);
      return absl::InternalError(absl::StrCat(display_, ": ", what, ": ", e.what()));
    }
    Give(nullptr);
  }
}

absl::Status PostgresStore::Migrate() {
  auto r = WithTransaction<int>("migrate", [](pqxx::work& w, int) -> absl::StatusOr<int> {
    w.exec_params("SELECT pg_advisory_xact_lock($1)", kMigrationLock);
    w.exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)");
    pqxx::result v = w.exec("SELECT version FROM schema_version");
    int version = 0;
    if (v.empty()) {
      w.exec("INSERT INTO schema_version VALUES (0)");
    } else {
      version = v[0][0].as<int>();
    }
    if (version > LatestSchemaVersion()) {
      return absl::FailedPreconditionError(absl::StrCat("database schema version ", version,
                                                        " is newer than this kforge understands (",
                                                        LatestSchemaVersion(), ")"));
    }
    for (; version < LatestSchemaVersion(); ++version) {
      w.exec(kMigrations[version]);
      w.exec_params("UPDATE schema_version SET version = $1", version + 1);
    }
    return version;
  }, options_.connect_seconds);
  return r.status();
}

absl::Status PostgresStore::CreateJob(const v1::Job& job) {
  return WithTransaction<bool>("create job", [&](pqxx::work& w, int attempt) -> absl::StatusOr<bool> {
    const std::string body = job.SerializeAsString();
    pqxx::result r = w.exec_params(
        "INSERT INTO jobs (id, tenant, problem_hash, state, body) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT (id) DO NOTHING RETURNING id",
        job.id(), job.spec().tenant(), job.spec().problem().content_hash(), static_cast<int>(job.state()),
        pqxx::binarystring(body));
    if (!r.empty()) return true;
    // A retry after a commit whose answer was lost finds its own row.
    if (attempt > 1) {
      pqxx::result mine = w.exec_params("SELECT body FROM jobs WHERE id = $1", job.id());
      if (!mine.empty() && Bytes(mine[0][0]) == body) return true;
    }
    return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " exists"));
  }).status();
}

absl::StatusOr<v1::Job> PostgresStore::GetJob(const std::string& job_id) {
  return WithTransaction<v1::Job>("get job", [&](pqxx::work& w, int) -> absl::StatusOr<v1::Job> {
    pqxx::result r = w.exec_params("SELECT body FROM jobs WHERE id = $1", job_id);
    if (r.empty()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    return ParseRecord<v1::Job>(Bytes(r[0][0]), "job");
  });
}

absl::Status PostgresStore::UpdateJob(const v1::Job& job) {
  return WithTransaction<bool>("update job", [&](pqxx::work& w, int) -> absl::StatusOr<bool> {
    pqxx::result r = w.exec_params("UPDATE jobs SET state = $1, body = $2 WHERE id = $3",
                                   static_cast<int>(job.state()), pqxx::binarystring(job.SerializeAsString()),
                                   job.id());
    if (r.affected_rows() == 0) return absl::NotFoundError(absl::StrCat("no job ", job.id()));
    return true;
  }).status();
}

absl::StatusOr<std::vector<v1::Job>> PostgresStore::ListJobs(const JobQuery& q) {
  return WithTransaction<std::vector<v1::Job>>("list jobs", [&](pqxx::work& w, int) {
    pqxx::result r = w.exec_params(
        "SELECT body FROM jobs WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR problem_hash = $2) AND "
        "($3 = 0 OR state = $3) ORDER BY created_order DESC LIMIT $4",
        q.tenant, q.problem_hash, static_cast<int>(q.state), q.limit);
    return ParseRows<v1::Job>(r, "job");
  });
}

absl::StatusOr<bool> PostgresStore::InsertCandidate(const v1::Candidate& c) {
  return WithTransaction<bool>("insert candidate", [&](pqxx::work& w, int attempt) -> absl::StatusOr<bool> {
    if (!JobExists(w, c.job_id())) return absl::NotFoundError(absl::StrCat("no job ", c.job_id()));
    const std::string body = c.SerializeAsString();
    pqxx::result r = w.exec_params(
        "INSERT INTO candidates (job_id, id, content_hash, sequence, body) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT DO NOTHING RETURNING id",
        c.job_id(), c.id(), c.content_hash(), c.sequence(), pqxx::binarystring(body));
    if (!r.empty()) return true;
    if (attempt > 1) {
      pqxx::result mine =
          w.exec_params("SELECT body FROM candidates WHERE job_id = $1 AND id = $2", c.job_id(), c.id());
      if (!mine.empty() && Bytes(mine[0][0]) == body) return true;
    }
    return false;
  });
}

absl::StatusOr<std::vector<v1::Candidate>> PostgresStore::ListCandidates(const std::string& job_id) {
  return WithTransaction<std::vector<v1::Candidate>>(
      "list candidates", [&](pqxx::work& w, int) -> absl::StatusOr<std::vector<v1::Candidate>> {
        if (!JobExists(w, job_id)) return absl::NotFoundError(absl::StrCat("no job ", job_id));
        return ParseRows<v1::Candidate>(
            w.exec_params("SELECT body FROM candidates WHERE job_id = $1 ORDER BY sequence", job_id), "candidate");
      });
}

absl::StatusOr<bool> PostgresStore::PutEvaluation(const v1::EvaluationResult& e) {
  return WithTransaction<bool>("insert evaluation", [&](pqxx::work& w, int attempt) -> absl::StatusOr<bool> {
    if (w.exec_params("SELECT 1 FROM candidates WHERE job_id = $1 AND id = $2", e.job_id(), e.candidate_id())
            .empty()) {
      return absl::NotFoundError(absl::StrCat("no candidate ", e.candidate_id(), " in job ", e.job_id()));
    }
    const std::string body = e.SerializeAsString();
    pqxx::result r = w.exec_params(
        "INSERT INTO evaluations (job_id, candidate_id, outcome, speedup, body) VALUES ($1, $2, $3, $4, $5) "
        "ON CONFLICT DO NOTHING RETURNING candidate_id",
        e.job_id(), e.candidate_id(), static_cast<int>(e.outcome()), e.speedup(), pqxx::binarystring(body));
    if (!r.empty()) return true;
    if (attempt > 1) {
      pqxx::result mine = w.exec_params(
          "SELECT body FROM evaluations WHERE job_id = $1 AND candidate_id = $2", e.job_id(), e.candidate_id());
      if (!mine.empty() && Bytes(mine[0][0]) == body) return true;
    }
    return false;
  });
}

absl::StatusOr<std::vector<v1::EvaluationResult>> PostgresStore::ListEvaluations(const std::string& job_id) {
  return WithTransaction<std::vector<v1::EvaluationResult>>(
      "list evaluations", [&](pqxx::work& w, int) -> absl::StatusOr<std::vector<v1::EvaluationResult>> {
        if (!JobExists(w, job_id)) return absl::NotFoundError(absl::StrCat("no job ", job_id));
        return ParseRows<v1::EvaluationResult>(
            w.exec_params("SELECT e.body FROM evaluations e JOIN candidates c ON c.job_id = e.job_id AND "
                          "c.id = e.candidate_id WHERE e.job_id = $1 ORDER BY c.sequence",
                          job_id),
            "evaluation");
      });
}

absl::StatusOr<int64_t> PostgresStore::AppendEvent(v1::JobEvent event) {
  event.clear_sequence();
  const std::string body = event.SerializeAsString();
  return WithTransaction<int64_t>("insert event", [&](pqxx::work& w, int attempt) -> absl::StatusOr<int64_t> {
    // The job's row lock serialises appenders, so each gets the next sequence number.
    if (w.exec_params("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", event.job_id()).empty()) {
      return absl::NotFoundError(absl::StrCat("no job ", event.job_id()));
    }
    if (attempt > 1) {
      // A retry after a lost commit answer finds its event last.
      pqxx::result last = w.exec_params(
          "SELECT sequence, body FROM events WHERE job_id = $1 ORDER BY sequence DESC LIMIT 1", event.job_id());
      if (!last.empty() && Bytes(last[0][1]) == body) return last[0][0].as<int64_t>();
    }
    pqxx::result r = w.exec_params(
        "INSERT INTO events (job_id, sequence, body) VALUES ($1, (SELECT COALESCE(MAX(sequence), 0) + 1 FROM "
        "events WHERE job_id = $1), $2) RETURNING sequence",
        event.job_id(), pqxx::binarystring(body));
    return r[0][0].as<int64_t>();
  });
}

absl::StatusOr<std::vector<v1::JobEvent>> PostgresStore::ListEvents(const std::string& job_id, int64_t from,
                                                                    int limit) {
  return WithTransaction<std::vector<v1::JobEvent>>(
      "list events", [&](pqxx::work& w, int) -> absl::StatusOr<std::vector<v1::JobEvent>> {
        if (!JobExists(w, job_id)) return absl::NotFoundError(absl::StrCat("no job ", job_id));
        pqxx::result r = w.exec_params(
            "SELECT body, sequence FROM events WHERE job_id = $1 AND sequence >= $2 ORDER BY sequence LIMIT $3",
            job_id, from, limit);
        std::vector<v1::JobEvent> out;
        for (const auto& row : r) {
          auto e = ParseRecord<v1::JobEvent>(Bytes(row[0]), "event");
          if (!e.ok()) return e.status();
          e->set_sequence(row[1].as<int64_t>());
          out.push_back(*std::move(e));
        }
        return out;
      });
}

}  // namespace kforge
