#pragma once

// The SQL that PostgresStore sends (the fenced batch inserts, the step's one-statement write and
// its prepared form) and the helpers that read its rows. Internal to the store: these throw
// libpqxx's exceptions, which PostgresStore catches.

#include <algorithm>
#include <optional>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "common/store/record.h"
#include "common/store/store.h"

namespace kforge::postgres {

std::string Bytes(const pqxx::field& f);

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

bool JobExists(pqxx::transaction_base& w, const std::string& job_id);

// NotFound for a job without a row (no lease token read), FailedPrecondition when `fence` is not
// its lease token.
absl::Status CheckFence(const std::string& job_id, int64_t fence, std::optional<int64_t> token);

// The lease token in a result's first row and column (none without a row, or when it is null).
std::optional<int64_t> TokenOf(const pqxx::result& r);

// NotFound for an unknown job, FailedPrecondition for a stale fence. The row lock makes a takeover
// wait for the writes already checked: shared, so that many writers of one job's rows proceed
// together, or exclusive for a transaction that will update the job's row itself (two shared
// holders upgrading would deadlock).
absl::Status CheckWritable(pqxx::transaction_base& w, const std::string& job_id, int64_t fence,
                           bool updates_job = false);

// A job row (body, version) back to its message: the version lives in its column.
absl::StatusOr<v1::Job> JobFromRow(const pqxx::row& row);

absl::StatusOr<std::vector<v1::Job>> JobsFromRows(const pqxx::result& r);

// Statements of a batch insert stay well under the server's limits.
inline constexpr size_t kBatchRows = 500;

// The VALUES entries `values_of(i)` of rows [begin, end), comma-separated ("" leaves a row out).
template <typename ValuesFn>
std::string ValuesList(size_t begin, size_t end, ValuesFn values_of) {
  std::string values;
  for (size_t i = begin; i < end; ++i) {
    const std::string v = values_of(i);
    if (!v.empty()) absl::StrAppend(&values, values.empty() ? "" : ",", v);
  }
  return values;
}

// A batch write of one job's rows, kBatchRows per statement: `values_of(i)` is row i's VALUES
// entry ("" leaves it out), `statement(values)` a chunk's statement, whose result rows begin with
// the job's lease token (null: no such job) and the row's ordinal. The fence is checked on the
// first result row; every row goes to `on_row(ordinal, row)`. NotFound for an unknown job,
// FailedPrecondition for a stale fence.
template <typename ValuesFn, typename StatementFn, typename RowFn>
absl::Status FencedBatch(pqxx::transaction_base& w, const std::string& job_id, int64_t fence,
                         size_t n, ValuesFn values_of, StatementFn statement, RowFn on_row) {
  bool checked = false;
  for (size_t begin = 0; begin < n; begin += kBatchRows) {
    const std::string values = ValuesList(begin, std::min(n, begin + kBatchRows), values_of);
    if (values.empty()) continue;
    const pqxx::result rows = w.exec(statement(values));
    if (!checked && !rows.empty()) {
      KF_RETURN_IF_ERROR(CheckFence(job_id, fence, TokenOf(rows)));
      checked = true;
    }
    for (const pqxx::row& row : rows) on_row(row[1].as<size_t>(), row);
  }
  if (!checked)
    return CheckWritable(w, job_id, fence);  // nothing was written: the fence still counts
  return absl::OkStatus();
}

// A retry after a commit whose answer was lost finds the row it stored: whether `query`, with
// `keys` as its parameters, reads back exactly `body`.
template <typename... Keys>
bool StoredBody(pqxx::transaction_base& w, const char* query, const std::string& body,
                const Keys&... keys) {
  pqxx::result mine = w.exec_params(query, keys...);
  return !mine.empty() && Bytes(mine[0][0]) == body;
}

// A retry after a lost commit answer: the candidates refused as duplicates that this batch had
// stored (the same body) were inserted by it.
void FindStoredCandidates(pqxx::transaction_base& w, const std::string& job_id,
                          absl::Span<const v1::Candidate> candidates,
                          const std::vector<std::string>& bodies, std::vector<bool>& out,
                          std::set<std::string>& done);

// Likewise for evaluations.
void FindStoredEvaluations(pqxx::transaction_base& w, const std::string& job_id,
                           const std::vector<v1::EvaluationResult>& results,
                           const std::vector<std::string>& bodies, std::vector<PutOutcome>& out,
                           std::set<std::string>& done);

// The VALUES entry of candidate `i` for the insert below.
std::string CandidateRow(pqxx::transaction_base& w, size_t i, const v1::Candidate& c,
                         const std::string& body);

// The CTEs that insert the candidates of VALUES `values` as `v` (the first of two with one id or
// content hash wins), returning the inserted rows as `ins`; they need the CTE `j` (the job's row,
// locked: see FencedBatch).
std::string InsertCandidatesCtes(const std::string& job, const std::string& fence,
                                 const std::string& rows, const char* v, const char* ins);

// Per candidate of `v`: whether it was inserted. By id and hash: of two rows with one id, the one
// inserted may be the second.
std::string CandidateOutcomes(const char* v, const char* ins);

// The VALUES entry of result `i` ("" for a result of another job: it is left out).
std::string EvaluationRow(pqxx::transaction_base& w, const std::string& job_id, size_t i,
                          const v1::EvaluationResult& r, const std::string& body);

// The CTEs that insert the results of VALUES `values` as `v` (the first of two for one candidate
// wins), returning the candidates evaluated as `ins`; they need `j`. Joined, only the results
// whose candidate exists are inserted. Unjoined (cheaper: no join with candidates to plan and run),
// a result for an unknown candidate fails the whole statement with a foreign_key_violation, and the
// caller writes again joined. Unjoined only in one autocommit statement (nothing of a failed one
// remains) none of whose results names a candidate the same statement inserts (the foreign key,
// checked at its end, would see that candidate).
std::string InsertEvaluationsCtes(const std::string& job, const std::string& fence,
                                  const std::string& rows, const char* v, const char* ins,
                                  bool joined);

// Per result of `v`: whether its candidate exists (unjoined: it does, or the statement failed)
// and whether it was inserted.
std::string EvaluationOutcomes(const std::string& job, const char* v, const char* ins, bool joined);

// `write(joined)` unjoined unless `joined` (see InsertEvaluationsCtes), and joined again when a
// result names an unknown candidate.
template <typename WriteFn>
auto UnjoinedFirst(bool joined, WriteFn write) -> decltype(write(true)) {
  if (!joined) {
    try {
      return write(/*joined=*/false);
    } catch (const pqxx::foreign_key_violation&) {
      // a result for an unknown candidate: nothing of that statement remains
    }
  }
  return write(/*joined=*/true);
}

std::string LockJobCte(const std::string& job);

// A step's write in one statement (see PutEvaluationsAndCandidates): `job` and `fence` as SQL,
// the results' and the candidates' rows from `result_rows` and `candidate_rows`. Its rows: the
// lease token, the ordinal, whether the candidate exists, whether the row was inserted, and 0 for
// a result's row or 1 for a candidate's (results first, in order).
std::string StepWriteStatement(const std::string& job, const std::string& fence,
                               const std::string& result_rows, const std::string& candidate_rows,
                               bool joined);

// The unjoined step write as a prepared statement, its rows in arrays: a coordinator makes one
// per step, and parsing and planning a fresh statement each time was about a third of the
// server's CPU. Parameters: job id, fence, then per result ordinal, candidate id, outcome, speedup,
// body, and per candidate ordinal, id, content hash, sequence, body.
inline constexpr char kStepWrite[] = "kforge_step_write";
const std::string& StepWriteDefinition();

// A PostgreSQL array literal, built element by element (every element quoted).
class ArrayLiteral {
 public:
  void Add(absl::string_view text) {
    out_.append(out_.size() == 1 ? "\"" : ",\"");
    for (char ch : text) {
      if (ch == '"' || ch == '\\') out_.push_back('\\');
      out_.push_back(ch);
    }
    out_.push_back('"');
  }
  void Add(int64_t n) { absl::StrAppend(&out_, out_.size() == 1 ? "" : ",", n); }
  // A bytea element in the hex format.
  void AddBytes(absl::string_view bytes) {
    absl::StrAppend(&out_, out_.size() == 1 ? "" : ",", "\"\\\\x", absl::BytesToHexString(bytes),
                    "\"");
  }
  std::string Take() {
    out_.push_back('}');
    return std::move(out_);
  }

 private:
  std::string out_ = "{";
};

// PutEvaluations' outcome of a result from its row (candidate exists, inserted); `done` holds the
// candidates given kStored in this batch (the first of two results for one candidate wins).
PutOutcome EvaluationOutcome(const pqxx::row& row, int exists, const std::string& candidate_id,
                             std::set<std::string>& done);

}  // namespace kforge::postgres
