#include "common/hash.h"
#include "common/store/postgres_store.h"

#include <algorithm>
#include <pqxx/pqxx>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/store/postgres_connection.h"
#include "common/store/postgres_schema.h"
#include "common/store/postgres_statements.h"
#include "common/store/record.h"

namespace kforge {

using postgres::ArrayLiteral;
using postgres::Bytes;
using postgres::CandidateOutcomes;
using postgres::CandidateRow;
using postgres::CheckFence;
using postgres::CheckWritable;
using postgres::EvaluationOutcome;
using postgres::EvaluationOutcomes;
using postgres::EvaluationRow;
using postgres::FencedBatch;
using postgres::FindStoredCandidates;
using postgres::FindStoredEvaluations;
using postgres::InsertCandidatesCtes;
using postgres::InsertEvaluationsCtes;
using postgres::JobExists;
using postgres::JobFromRow;
using postgres::JobsFromRows;
using postgres::kBatchRows;
using postgres::kMigrationLock;
using postgres::kStepWrite;
using postgres::LockJobCte;
using postgres::ParseRows;
using postgres::StepWriteDefinition;
using postgres::StepWriteStatement;
using postgres::StoredBody;
using postgres::TokenOf;
using postgres::UnjoinedFirst;
using postgres::ValuesList;

bool IsPostgresUrl(const std::string& db) {
  return absl::StartsWith(db, "postgresql://") || absl::StartsWith(db, "postgres://");
}

int PostgresStore::LatestSchemaVersion() { return static_cast<int>(postgres::Migrations().size()); }

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

absl::Status PostgresStore::Migrate() {
  auto r = WithTransaction<int>("migrate", [](pqxx::transaction_base& w, int) -> absl::StatusOr<int> {
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
      w.exec(postgres::Migrations()[version]);
      w.exec_params("UPDATE schema_version SET version = $1", version + 1);
    }
    return version;
  }, options_.connect_seconds);
  return r.status();
}

absl::StatusOr<v1::Job> PostgresStore::CreateJob(const v1::Job& job) {
  v1::Job stored = job;
  stored.set_version(1);
  const std::string body = stored.SerializeAsString();
  const std::string kernel_key = HashKernel(job.spec().problem());
  return WithTransaction<v1::Job>("create job", [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<v1::Job> {
    pqxx::result r = w.exec_params(
        "INSERT INTO jobs (id, tenant, problem_hash, state, body, idempotency_key, kernel_key) VALUES ($1, $2, $3, "
        "$4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING id",
        job.id(), job.spec().tenant(), job.spec().problem().content_hash(), static_cast<int>(job.state()),
        pqxx::binarystring(body), job.idempotency_key(), kernel_key);
    if (!r.empty()) return stored;
    if (!job.idempotency_key().empty()) {
      // A concurrent submit with the same key waited on the unique index and finds its row.
      pqxx::result same = w.exec_params("SELECT body, version FROM jobs WHERE tenant = $1 AND idempotency_key = $2",
                                        job.spec().tenant(), job.idempotency_key());
      if (!same.empty()) return JobFromRow(same[0]);
    }
    // A retry after a commit whose answer was lost finds its own row.
    if (attempt > 1 && StoredBody(w, "SELECT body FROM jobs WHERE id = $1", body, job.id()))
      return stored;
    return absl::AlreadyExistsError(absl::StrCat("job ", job.id(), " exists"));
  });
}

absl::StatusOr<v1::Job> PostgresStore::GetJob(const std::string& job_id) {
  return WithTransaction<v1::Job>("get job", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<v1::Job> {
    pqxx::result r = w.exec_params("SELECT body, version FROM jobs WHERE id = $1", job_id);
    if (r.empty()) return NoJobError(job_id);
    return JobFromRow(r[0]);
  });
}

absl::StatusOr<int64_t> PostgresStore::UpdateJob(const v1::Job& job, int64_t fence) {
  v1::Job stored = job;
  stored.set_version(job.version() + 1);
  const std::string body = stored.SerializeAsString();
  return WithTransaction<int64_t>("update job", [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<int64_t> {
    if (absl::Status st = CheckWritable(w, job.id(), fence, /*updates_job=*/true); !st.ok()) return st;
    pqxx::result r = w.exec_params(
        "UPDATE jobs SET state = $1, body = $2, version = version + 1 WHERE id = $3 AND version = $4",
        static_cast<int>(job.state()), pqxx::binarystring(body), job.id(), job.version());
    if (r.affected_rows() > 0) return stored.version();
    pqxx::result now = w.exec_params("SELECT body, version FROM jobs WHERE id = $1", job.id());
    if (now.empty()) return NoJobError(job.id());
    const int64_t version = now[0][1].as<int64_t>();
    if (attempt > 1 && version == stored.version() && Bytes(now[0][0]) == body) return version;
    return VersionConflictError(job.id(), job.version(), version);
  });
}

absl::StatusOr<JobCounts> PostgresStore::CountJobs() {
  return WithTransaction<JobCounts>("count jobs", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<JobCounts> {
    JobCounts out;
    for (const auto& row : w.exec("SELECT tenant, state, count(*) FROM jobs GROUP BY tenant, state")) {
      out[{row[0].as<std::string>(), static_cast<v1::JobState>(row[1].as<int>())}] = row[2].as<int64_t>();
    }
    return out;
  });
}

absl::StatusOr<std::vector<v1::Job>> PostgresStore::ListJobs(const JobQuery& q) {
  return WithTransaction<std::vector<v1::Job>>("list jobs", [&](pqxx::transaction_base& w, int) {
    pqxx::result r = w.exec_params(
        "SELECT body, version FROM jobs WHERE ($1 = '' OR tenant = $1) AND ($2 = '' OR problem_hash = $2) AND "
        "($6 = '' OR kernel_key = $6) AND ($3 = 0 OR state = $3) AND ($5 = '' OR created_order < COALESCE((SELECT created_order FROM jobs "
        "WHERE id = $5), 0)) ORDER BY created_order DESC LIMIT $4",
        q.tenant, q.problem_hash, static_cast<int>(q.state), q.limit, q.after_job_id, q.kernel_key);
    return JobsFromRows(r);
  });
}

absl::StatusOr<JobLease> PostgresStore::ClaimJob(const std::string& job_id, const std::string& owner,
                                                 double lease_seconds) {
  // The server's clock decides expiry, so coordinators with skewed clocks agree.
  return WithTransaction<JobLease>("claim job", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<JobLease> {
    pqxx::result r = w.exec_params(
        "SELECT lease_owner, lease_token, lease_expires > now() FROM jobs WHERE id = $1 FOR UPDATE", job_id);
    if (r.empty()) return NoJobError(job_id);
    const std::string current = r[0][0].as<std::string>();
    int64_t token = r[0][1].as<int64_t>();
    if (!current.empty() && current != owner && r[0][2].as<bool>()) return LeaseHeldError(job_id, current);
    if (current != owner) ++token;
    w.exec_params(
        "UPDATE jobs SET lease_owner = $2, lease_token = $3, lease_expires = now() + $4::float8 * interval '1 second' "
        "WHERE id = $1",
        job_id, owner, token, lease_seconds);
    return JobLease{owner, token};
  });
}

absl::Status PostgresStore::RenewJobLease(const std::string& job_id, const JobLease& lease, double lease_seconds) {
  return WithTransaction<bool>("renew job lease", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<bool> {
    pqxx::result r = w.exec_params(
        "UPDATE jobs SET lease_expires = now() + $4::float8 * interval '1 second' WHERE id = $1 AND lease_owner = $2 AND "
        "lease_token = $3",
        job_id, lease.owner, lease.token, lease_seconds);
    if (r.affected_rows() > 0) return true;
    return JobExists(w, job_id) ? LeaseLostError(job_id, lease.token) : NoJobError(job_id);
  }).status();
}

absl::Status PostgresStore::ReleaseJob(const std::string& job_id, const JobLease& lease) {
  return WithTransaction<bool>("release job", [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<bool> {
    pqxx::result r = w.exec_params(
        "UPDATE jobs SET lease_owner = '', lease_expires = now() WHERE id = $1 AND lease_owner = $2 AND "
        "lease_token = $3",
        job_id, lease.owner, lease.token);
    if (r.affected_rows() > 0) return true;
    pqxx::result now = w.exec_params("SELECT lease_owner, lease_token FROM jobs WHERE id = $1", job_id);
    if (now.empty()) return NoJobError(job_id);
    // A retry after a lost commit answer finds its release done.
    if (attempt > 1 && now[0][0].as<std::string>().empty() && now[0][1].as<int64_t>() == lease.token) return true;
    return LeaseLostError(job_id, lease.token);
  }).status();
}

absl::StatusOr<std::vector<bool>> PostgresStore::InsertCandidates(const std::string& job_id,
                                                                  absl::Span<const v1::Candidate> candidates,
                                                                  int64_t fence) {
  if (absl::Status st = CheckCandidatesJob(job_id, candidates); !st.ok()) return st;
  std::vector<std::string> bodies;
  bodies.reserve(candidates.size());
  for (const auto& c : candidates) bodies.push_back(c.SerializeAsString());
  return WithTransaction<std::vector<bool>>(
      "insert candidates",
      [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<std::vector<bool>> {
        std::vector<bool> out(candidates.size(), false);
        std::set<std::string> done;  // candidates given true in this batch
        const std::string job = w.quote(job_id);
        // Per chunk one statement: the fence check (a shared lock on the job's row, so that a
        // takeover waits for it), a multi-row insert (the first of two with one id or content hash
        // wins), and per candidate whether it was inserted.
        KF_RETURN_IF_ERROR(FencedBatch(
            w, job_id, fence, candidates.size(),
            [&](size_t i) { return CandidateRow(w, i, candidates[i], bodies[i]); },
            [&](const std::string& values) {
              return absl::StrCat(LockJobCte(job),
                                  InsertCandidatesCtes(job, absl::StrCat(fence),
                                                       absl::StrCat("VALUES ", values), "v", "ins"),
                                  " ", CandidateOutcomes("v", "ins"), " ORDER BY v.ord");
            },
            [&](size_t i, const pqxx::row& row) {
              out[i] = row[2].as<bool>() && done.insert(candidates[i].id()).second;
            }));
        if (attempt > 1) FindStoredCandidates(w, job_id, candidates, bodies, out, done);
        return out;
      },
      -1, /*single_statement=*/candidates.size() <= kBatchRows);
}

absl::StatusOr<std::vector<v1::Candidate>> PostgresStore::ListCandidates(const std::string& job_id) {
  return WithTransaction<std::vector<v1::Candidate>>(
      "list candidates", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<std::vector<v1::Candidate>> {
        if (!JobExists(w, job_id)) return NoJobError(job_id);
        return ParseRows<v1::Candidate>(
            w.exec_params("SELECT body FROM candidates WHERE job_id = $1 ORDER BY sequence", job_id), "candidate");
      });
}

absl::StatusOr<std::vector<PutOutcome>> PostgresStore::PutEvaluations(const std::string& job_id,
                                                                      const std::vector<v1::EvaluationResult>& results,
                                                                      int64_t fence) {
  std::vector<std::string> bodies;
  bodies.reserve(results.size());
  for (const auto& r : results) bodies.push_back(r.SerializeAsString());
  return WithTransaction<std::vector<PutOutcome>>(
      "insert evaluations",
      [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<std::vector<PutOutcome>> {
        std::vector<PutOutcome> out(results.size(), PutOutcome::kUnknownCandidate);
        std::set<std::string> done;  // candidates given kStored in this batch
        const std::string job = w.quote(job_id);
        // Per chunk one statement: the fence check (a shared lock on the job's row), a multi-row
        // insert of the results whose candidate exists (the first of two for one candidate
        // wins), and per result whether its candidate exists and whether it was inserted.
        const auto write = [&](bool joined) {
          return FencedBatch(
              w, job_id, fence, results.size(),
              [&](size_t i) { return EvaluationRow(w, job_id, i, results[i], bodies[i]); },
              [&](const std::string& values) {
                return absl::StrCat(
                    LockJobCte(job),
                    InsertEvaluationsCtes(job, absl::StrCat(fence), absl::StrCat("VALUES ", values),
                                          "v", "ins", joined),
                    " ", EvaluationOutcomes(job, "v", "ins", joined), " ORDER BY v.ord");
              },
              [&](size_t i, const pqxx::row& row) {
                out[i] = EvaluationOutcome(row, 2, results[i].candidate_id(), done);
              });
        };
        // One statement tries unjoined first; chunks run in one transaction, which a failed
        // statement would abort.
        KF_RETURN_IF_ERROR(UnjoinedFirst(/*joined=*/results.size() > kBatchRows, write));
        if (attempt > 1) FindStoredEvaluations(w, job_id, results, bodies, out, done);
        return out;
      },
      -1, /*single_statement=*/results.size() <= kBatchRows);
}

absl::StatusOr<StepOutcome> PostgresStore::PutEvaluationsAndCandidates(
    const std::string& job_id, const std::vector<v1::EvaluationResult>& results,
    absl::Span<const v1::Candidate> candidates, int64_t fence) {
  const bool any_result =
      std::any_of(results.begin(), results.end(),
                  [&](const v1::EvaluationResult& r) { return r.job_id() == job_id; });
  if (!any_result || candidates.empty() || results.size() > kBatchRows ||
      candidates.size() > kBatchRows) {
    return Store::PutEvaluationsAndCandidates(job_id, results, candidates,
                                              fence);  // one of them, or in chunks
  }
  if (absl::Status st = CheckCandidatesJob(job_id, candidates); !st.ok()) return st;
  std::vector<std::string> result_bodies, candidate_bodies;
  result_bodies.reserve(results.size());
  for (const auto& r : results) result_bodies.push_back(r.SerializeAsString());
  candidate_bodies.reserve(candidates.size());
  for (const auto& c : candidates) candidate_bodies.push_back(c.SerializeAsString());
  return WithTransaction<StepOutcome>(
      "insert evaluations and candidates",
      [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<StepOutcome> {
        StepOutcome out{std::vector<PutOutcome>(results.size(), PutOutcome::kUnknownCandidate),
                        std::vector<bool>(candidates.size(), false)};
        std::set<std::string> evaluated, inserted;  // given kStored / true in this call
        // Unjoined first (see InsertEvaluationsCtes) and prepared, unless a result names a
        // candidate of this call.
        const bool joined =
            std::any_of(results.begin(), results.end(), [&](const v1::EvaluationResult& r) {
              return std::any_of(candidates.begin(), candidates.end(), [&](const v1::Candidate& c) {
                return c.id() == r.candidate_id();
              });
            });
        const auto prepared = [&] {
          ArrayLiteral e_ord, e_cid, e_outcome, e_speedup, e_body, c_ord, c_id, c_hash, c_seq,
              c_body;
          for (size_t i = 0; i < results.size(); ++i) {
            if (results[i].job_id() != job_id) continue;  // left out, like EvaluationRow
            e_ord.Add(static_cast<int64_t>(i));
            e_cid.Add(results[i].candidate_id());
            e_outcome.Add(static_cast<int64_t>(results[i].outcome()));
            e_speedup.Add(absl::StrFormat("%.17g", results[i].speedup()));
            e_body.AddBytes(result_bodies[i]);
          }
          for (size_t i = 0; i < candidates.size(); ++i) {
            c_ord.Add(static_cast<int64_t>(i));
            c_id.Add(candidates[i].id());
            c_hash.Add(candidates[i].content_hash());
            c_seq.Add(candidates[i].sequence());
            c_body.AddBytes(candidate_bodies[i]);
          }
          w.conn().prepare(kStepWrite, StepWriteDefinition());
          return w.exec_prepared(kStepWrite, job_id, fence, e_ord.Take(), e_cid.Take(),
                                 e_outcome.Take(), e_speedup.Take(), e_body.Take(), c_ord.Take(),
                                 c_id.Take(), c_hash.Take(), c_seq.Take(), c_body.Take());
        };
        const auto literal = [&] {  // joined: rare (a result for an unknown candidate)
          const std::string job = w.quote(job_id);
          const std::string result_values = ValuesList(0, results.size(), [&](size_t i) {
            return EvaluationRow(w, job_id, i, results[i], result_bodies[i]);
          });
          const std::string candidate_values = ValuesList(0, candidates.size(), [&](size_t i) {
            return CandidateRow(w, i, candidates[i], candidate_bodies[i]);
          });
          return w.exec(
              StepWriteStatement(job, absl::StrCat(fence), absl::StrCat("VALUES ", result_values),
                                 absl::StrCat("VALUES ", candidate_values), /*joined=*/true));
        };
        // One statement: the fence check, both inserts (the evaluations' candidates are those
        // stored before it: every CTE sees the statement's starting snapshot), and the outcomes.
        const pqxx::result rows =
            UnjoinedFirst(joined, [&](bool j) { return j ? literal() : prepared(); });
        KF_RETURN_IF_ERROR(CheckFence(job_id, fence, TokenOf(rows)));
        for (const pqxx::row& row : rows) {
          const size_t i = row[1].as<size_t>();
          if (row[4].as<int>() == 0) {
            out.evaluations[i] = EvaluationOutcome(row, 2, results[i].candidate_id(), evaluated);
          } else {
            out.candidates[i] = row[3].as<bool>() && inserted.insert(candidates[i].id()).second;
          }
        }
        if (attempt > 1) {
          FindStoredEvaluations(w, job_id, results, result_bodies, out.evaluations, evaluated);
          FindStoredCandidates(w, job_id, candidates, candidate_bodies, out.candidates, inserted);
        }
        return out;
      },
      -1, /*single_statement=*/true);
}

absl::StatusOr<std::vector<v1::EvaluationResult>> PostgresStore::ListEvaluations(const std::string& job_id) {
  return WithTransaction<std::vector<v1::EvaluationResult>>(
      "list evaluations", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<std::vector<v1::EvaluationResult>> {
        if (!JobExists(w, job_id)) return NoJobError(job_id);
        return ParseRows<v1::EvaluationResult>(
            w.exec_params("SELECT e.body FROM evaluations e JOIN candidates c ON c.job_id = e.job_id AND "
                          "c.id = e.candidate_id WHERE e.job_id = $1 ORDER BY c.sequence",
                          job_id),
            "evaluation");
      });
}

absl::StatusOr<std::vector<v1::EvaluationResult>> PostgresStore::FindEvaluations(const EvaluationQuery& q) {
  return WithTransaction<std::vector<v1::EvaluationResult>>(
      "find evaluations", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<std::vector<v1::EvaluationResult>> {
        return ParseRows<v1::EvaluationResult>(
            w.exec_params("SELECT e.body FROM candidates c JOIN evaluations e ON e.job_id = c.job_id AND "
                          "e.candidate_id = c.id JOIN jobs j ON j.id = c.job_id WHERE c.content_hash = $1 AND "
                          "j.tenant = $2 AND j.problem_hash = $3 AND j.id <> $4 ORDER BY j.created_order DESC "
                          "LIMIT $5",
                          q.content_hash, q.tenant, q.problem_hash, q.exclude_job_id, q.limit),
            "evaluation");
      });
}

absl::StatusOr<int64_t> PostgresStore::AppendSequenced(const char* table, const std::string& job_id,
                                                       const std::string& body, int64_t fence) {
  return WithTransaction<int64_t>("append", [&](pqxx::transaction_base& w, int attempt) -> absl::StatusOr<int64_t> {
    // The job's row lock serialises appenders, so each gets the next sequence number.
    pqxx::result j = w.exec_params("SELECT lease_token FROM jobs WHERE id = $1 FOR UPDATE", job_id);
    KF_RETURN_IF_ERROR(CheckFence(job_id, fence, TokenOf(j)));
    if (attempt > 1) {
      // A retry after a lost commit answer finds its record last.
      pqxx::result last = w.exec_params(
          absl::StrCat("SELECT sequence, body FROM ", table, " WHERE job_id = $1 ORDER BY sequence DESC LIMIT 1"),
          job_id);
      if (!last.empty() && Bytes(last[0][1]) == body) return last[0][0].as<int64_t>();
    }
    pqxx::result r = w.exec_params(
        absl::StrCat("INSERT INTO ", table, " (job_id, sequence, body) VALUES ($1, (SELECT COALESCE(MAX(sequence), 0) "
                     "+ 1 FROM ", table, " WHERE job_id = $1), $2) RETURNING sequence"),
        job_id, pqxx::binarystring(body));
    return r[0][0].as<int64_t>();
  });
}

template <typename Msg>
absl::StatusOr<std::vector<Msg>> PostgresStore::ListSequenced(const char* table, const std::string& job_id,
                                                              int64_t from, int limit) {
  return WithTransaction<std::vector<Msg>>("list", [&](pqxx::transaction_base& w, int) -> absl::StatusOr<std::vector<Msg>> {
    if (!JobExists(w, job_id)) return NoJobError(job_id);
    pqxx::result r = w.exec_params(
        absl::StrCat("SELECT body, sequence FROM ", table,
                     " WHERE job_id = $1 AND sequence >= $2 ORDER BY sequence LIMIT $3"),
        job_id, from, limit);
    std::vector<Msg> out;
    for (const auto& row : r) {
      auto e = ParseRecord<Msg>(Bytes(row[0]), table);
      if (!e.ok()) return e.status();
      e->set_sequence(row[1].as<int64_t>());
      out.push_back(*std::move(e));
    }
    return out;
  });
}

absl::StatusOr<int64_t> PostgresStore::AppendEvent(v1::JobEvent event, int64_t fence) {
  event.clear_sequence();
  return AppendSequenced("events", event.job_id(), event.SerializeAsString(), fence);
}

absl::StatusOr<std::vector<v1::JobEvent>> PostgresStore::ListEvents(const std::string& job_id, int64_t from,
                                                                    int limit) {
  return ListSequenced<v1::JobEvent>("events", job_id, from, limit);
}

absl::StatusOr<int64_t> PostgresStore::AppendModelCall(v1::ModelCall call, int64_t fence) {
  call.clear_sequence();
  return AppendSequenced("model_calls", call.job_id(), call.SerializeAsString(), fence);
}

absl::StatusOr<std::vector<v1::ModelCall>> PostgresStore::ListModelCalls(const std::string& job_id, int64_t from,
                                                                         int limit) {
  return ListSequenced<v1::ModelCall>("model_calls", job_id, from, limit);
}

}  // namespace kforge
