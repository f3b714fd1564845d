#include "common/store/postgres_statements.h"

#include "absl/strings/str_format.h"

namespace kforge::postgres {

std::string Bytes(const pqxx::field& f) { return pqxx::binarystring(f).str(); }

bool JobExists(pqxx::transaction_base& w, const std::string& job_id) {
  return !w.exec_params("SELECT 1 FROM jobs WHERE id = $1", job_id).empty();
}

absl::Status CheckFence(const std::string& job_id, int64_t fence, std::optional<int64_t> token) {
  if (!token.has_value()) return NoJobError(job_id);
  if (fence != kNoFence && *token != fence) return StaleFenceError(job_id, fence, *token);
  return absl::OkStatus();
}

std::optional<int64_t> TokenOf(const pqxx::result& r) {
  if (r.empty() || r[0][0].is_null()) return std::nullopt;
  return r[0][0].as<int64_t>();
}

absl::Status CheckWritable(pqxx::transaction_base& w, const std::string& job_id, int64_t fence,
                           bool updates_job) {
  pqxx::result r =
      w.exec_params(updates_job ? "SELECT lease_token FROM jobs WHERE id = $1 FOR UPDATE"
                                : "SELECT lease_token FROM jobs WHERE id = $1 FOR SHARE",
                    job_id);
  return CheckFence(job_id, fence, TokenOf(r));
}

absl::StatusOr<v1::Job> JobFromRow(const pqxx::row& row) {
  auto j = ParseRecord<v1::Job>(Bytes(row[0]), "job");
  if (j.ok()) j->set_version(row[1].as<int64_t>());
  return j;
}

absl::StatusOr<std::vector<v1::Job>> JobsFromRows(const pqxx::result& r) {
  std::vector<v1::Job> out;
  for (const auto& row : r) {
    auto j = JobFromRow(row);
    if (!j.ok()) return j.status();
    out.push_back(*std::move(j));
  }
  return out;
}

void FindStoredCandidates(pqxx::transaction_base& w, const std::string& job_id,
                          absl::Span<const v1::Candidate> candidates,
                          const std::vector<std::string>& bodies, std::vector<bool>& out,
                          std::set<std::string>& done) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (out[i] || done.contains(candidates[i].id())) continue;
    if (StoredBody(w, "SELECT body FROM candidates WHERE job_id = $1 AND id = $2", bodies[i],
                   job_id, candidates[i].id())) {
      out[i] = true;
      done.insert(candidates[i].id());
    }
  }
}

void FindStoredEvaluations(pqxx::transaction_base& w, const std::string& job_id,
                           const std::vector<v1::EvaluationResult>& results,
                           const std::vector<std::string>& bodies, std::vector<PutOutcome>& out,
                           std::set<std::string>& done) {
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string& cid = results[i].candidate_id();
    if (out[i] != PutOutcome::kDuplicate || done.contains(cid)) continue;
    if (StoredBody(w, "SELECT body FROM evaluations WHERE job_id = $1 AND candidate_id = $2",
                   bodies[i], job_id, cid)) {
      out[i] = PutOutcome::kStored;
      done.insert(cid);
    }
  }
}

std::string CandidateRow(pqxx::transaction_base& w, size_t i, const v1::Candidate& c,
                         const std::string& body) {
  return absl::StrCat("(", i, ",", w.quote(c.id()), ",", w.quote(c.content_hash()), ",",
                      c.sequence(), "::int8,", w.quote_raw(body), "::bytea)");
}

std::string InsertCandidatesCtes(const std::string& job, const std::string& fence,
                                 const std::string& rows, const char* v, const char* ins) {
  return absl::StrCat(
      v, "(ord, id, hash, seq, body) AS (", rows, "), ", ins,
      " AS (INSERT INTO candidates (job_id, id, content_hash, sequence, body) SELECT ", job, ", ",
      v, ".id, ", v, ".hash, ", v, ".seq, ", v, ".body FROM ", v, ", j WHERE ", fence,
      " = 0 OR j.lease_token = ", fence, " ORDER BY ", v,
      ".ord ON CONFLICT DO NOTHING RETURNING id, content_hash)");
}

std::string CandidateOutcomes(const char* v, const char* ins) {
  return absl::StrCat("SELECT (SELECT lease_token FROM j), ", v, ".ord, (", v, ".id, ", v,
                      ".hash) IN (SELECT id, content_hash FROM ", ins, ") FROM ", v);
}

std::string EvaluationRow(pqxx::transaction_base& w, const std::string& job_id, size_t i,
                          const v1::EvaluationResult& r, const std::string& body) {
  if (r.job_id() != job_id) return "";
  return absl::StrCat("(", i, ",", w.quote(r.candidate_id()), ",", static_cast<int>(r.outcome()),
                      ",", w.quote(absl::StrFormat("%.17g", r.speedup())), "::float8,",
                      w.quote_raw(body), "::bytea)");
}

std::string InsertEvaluationsCtes(const std::string& job, const std::string& fence,
                                  const std::string& rows, const char* v, const char* ins,
                                  bool joined) {
  return absl::StrCat(
      v, "(ord, cid, outcome, speedup, body) AS (", rows, "), ", ins,
      " AS (INSERT INTO evaluations (job_id, candidate_id, outcome, speedup, body) SELECT ", job,
      ", ", v, ".cid, ", v, ".outcome, ", v, ".speedup, ", v, ".body FROM ", v,
      joined ? absl::StrCat(" JOIN candidates c ON c.job_id = ", job, " AND c.id = ", v, ".cid")
             : "",
      ", j WHERE ", fence, " = 0 OR j.lease_token = ", fence, " ORDER BY ", v,
      ".ord ON CONFLICT DO NOTHING RETURNING candidate_id)");
}

std::string EvaluationOutcomes(const std::string& job, const char* v, const char* ins,
                               bool joined) {
  if (!joined) {
    return absl::StrCat("SELECT (SELECT lease_token FROM j), ", v, ".ord, true, ", v,
                        ".cid IN (SELECT candidate_id FROM ", ins, ") FROM ", v);
  }
  return absl::StrCat("SELECT (SELECT lease_token FROM j), ", v, ".ord, c.id IS NOT NULL, ", v,
                      ".cid IN (SELECT candidate_id FROM ", ins, ") FROM ", v,
                      " LEFT JOIN candidates c ON c.job_id = ", job, " AND c.id = ", v, ".cid");
}

std::string LockJobCte(const std::string& job) {
  return absl::StrCat("WITH j AS (SELECT lease_token FROM jobs WHERE id = ", job, " FOR SHARE), ");
}

std::string StepWriteStatement(const std::string& job, const std::string& fence,
                               const std::string& result_rows, const std::string& candidate_rows,
                               bool joined) {
  return absl::StrCat(
      LockJobCte(job), InsertEvaluationsCtes(job, fence, result_rows, "ve", "inse", joined), ", ",
      InsertCandidatesCtes(job, fence, candidate_rows, "vc", "insc"),
      " SELECT eo.token, eo.ord, eo.present, eo.inserted, 0 FROM (",
      EvaluationOutcomes(job, "ve", "inse", joined),
      ") eo(token, ord, present, inserted) UNION ALL SELECT co.token, co.ord, true, co.inserted, 1 "
      "FROM (",
      CandidateOutcomes("vc", "insc"), ") co(token, ord, inserted) ORDER BY 5, 2");
}

PutOutcome EvaluationOutcome(const pqxx::row& row, int exists, const std::string& candidate_id,
                             std::set<std::string>& done) {
  if (!row[exists].as<bool>()) return PutOutcome::kUnknownCandidate;
  return row[exists + 1].as<bool>() && done.insert(candidate_id).second ? PutOutcome::kStored
                                                                        : PutOutcome::kDuplicate;
}

const std::string& StepWriteDefinition() {
  static const std::string sql = StepWriteStatement(
      "$1::text", "$2::int8",
      "SELECT * FROM unnest($3::int4[], $4::text[], $5::int4[], $6::float8[], $7::bytea[])",
      "SELECT * FROM unnest($8::int4[], $9::text[], $10::text[], $11::int8[], $12::bytea[])",
      /*joined=*/false);
  return sql;
}

}  // namespace kforge::postgres
