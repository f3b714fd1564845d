#include "services/coordinator/job_api.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <stdlib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/problem_loader.h"
#include "common/status_macros.h"
#include "common/utf8.h"

namespace kforge::coordinator {

namespace fs = std::filesystem;

namespace {

// A relative path of plain names: no "..", no absolute path, no odd bytes.
absl::Status CheckFileName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("problem_files: bad file name ", Quoted(name)));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-' || c == '/';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("problem_files: file name ", Quoted(name), " has a byte other than [A-Za-z0-9._/-]"));
    }
  }
  for (const auto& part : fs::path(name)) {
    if (part == ".." || part == "." || part.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("problem_files: file name ", Quoted(name), " leaves its folder"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Problem> JobApi::LoadSubmittedProblem(const v1::SubmitJobRequest& request) {
  if (request.problem_files().empty()) {
    return absl::InvalidArgumentError(
        "problem_files is empty: send the problem folder's files (problem.yaml and its sources), as kforge submit does");
  }
  if (request.problem_files_size() > options_.max_problem_files) {
    return absl::InvalidArgumentError(absl::StrCat("problem_files: ", request.problem_files_size(),
                                                   " files; at most ", options_.max_problem_files));
  }
  if (!request.problem_files().contains("problem.yaml")) {
    return absl::InvalidArgumentError("problem_files has no problem.yaml");
  }
  // Sorted, so that the folder's name is a function of the contents.
  const std::map<std::string, std::string> files(request.problem_files().begin(), request.problem_files().end());
  int64_t total = 0;
  std::string digest;
  for (const auto& [name, bytes] : files) {
    KF_RETURN_IF_ERROR(CheckFileName(name));
    total += static_cast<int64_t>(bytes.size());
    absl::StrAppend(&digest, name, "\n", Sha256Hex(bytes), "\n");
  }
  if (total > options_.max_problem_file_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("problem_files: ", total, " bytes; at most ",
                                                   options_.max_problem_file_bytes));
  }
  // Written to a folder of its own, loaded confined to it (the problem names no host path), and
  // gone again unless it is kept: a replay problem's cache is read by the workers later, so that
  // folder moves to its content's name under problems_dir; nothing else is kept, refused or not.
  const fs::path root(options_.problems_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  std::string incoming = (root / ".incoming-XXXXXX").string();
  if (mkdtemp(incoming.data()) == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot make a folder for the submitted problem under ", root.string()));
  }
  struct RemoveUnlessKept {
    fs::path dir;
    ~RemoveUnlessKept() {
      std::error_code ignored;
      if (!dir.empty()) fs::remove_all(dir, ignored);
    }
  } cleanup{incoming};
  for (const auto& [name, bytes] : files) {
    const fs::path p = fs::path(incoming) / name;
    fs::create_directories(p.parent_path(), ec);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) return absl::UnavailableError("cannot write the submitted problem under problems_dir");
  }
  absl::StatusOr<v1::Problem> p = LoadProblem(incoming, LoadOptions{.confined = true});
  if (!p.ok()) {
    // The loader names the folder it read: say the submitted problem's own names instead.
    std::string msg(p.status().message());
    const std::string prefix = incoming + "/";
    for (size_t at; (at = msg.find(prefix)) != std::string::npos;) msg.replace(at, prefix.size(), "");
    for (size_t at; (at = msg.find(incoming)) != std::string::npos;) msg.replace(at, incoming.size(), "");
    return absl::InvalidArgumentError(msg);
  }
  if (p->backend() == v1::BACKEND_REPLAY) {
    const fs::path kept = root / Sha256Hex(digest).substr(0, 24);
    fs::rename(incoming, kept, ec);
    if (!ec) {
      cleanup.dir.clear();
    } else if (!fs::is_directory(kept)) {  // an identical submit kept it already: that one serves
      return absl::UnavailableError("cannot keep the submitted replay problem under problems_dir");
    }
    p->mutable_replay()->set_cache_path((kept / p->replay().cache_file()).string());
  }
  return p;
}

absl::StatusOr<v1::Job> JobApi::Submit(const Caller& caller, const v1::SubmitJobRequest& request) {
  KF_ASSIGN_OR_RETURN(v1::Problem problem, LoadSubmittedProblem(request));
  v1::JobSpec spec = request.spec();
  *spec.mutable_problem() = std::move(problem);
  spec.set_tenant(caller.tenant);
  if (!IsValidUtf8(spec.display_name()) || spec.display_name().size() > 256) {
    return absl::InvalidArgumentError("spec.display_name must be UTF-8 of at most 256 bytes");
  }
  return manager_.Submit(std::move(spec), request.idempotency_key());
}

absl::StatusOr<v1::Job> JobApi::Get(const Caller& caller, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = store_.GetJob(job_id);
  // Another tenant's job does not exist for this caller.
  if (job.ok() && job->spec().tenant() != caller.tenant) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return job;
}

absl::StatusOr<v1::ListJobsResponse> JobApi::List(const Caller& caller, const v1::ListJobsRequest& request) {
  const int size = request.page_size() > 0 ? std::min(request.page_size(), options_.max_page_size) : 50;
  if (!request.page_token().empty()) KF_RETURN_IF_ERROR(Get(caller, request.page_token()).status());
  KF_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs,
                      store_.ListJobs({.tenant = caller.tenant, .state = request.state(), .limit = size + 1,
                                       .after_job_id = request.page_token()}));
  v1::ListJobsResponse resp;
  for (int i = 0; i < static_cast<int>(jobs.size()) && i < size; ++i) {
    v1::Job* j = resp.add_jobs();
    *j = std::move(jobs[i]);
    j->mutable_spec()->mutable_problem()->clear_reference();  // listings stay small
    j->mutable_spec()->mutable_problem()->clear_seed();
  }
  if (static_cast<int>(jobs.size()) > size) resp.set_next_page_token(resp.jobs(size - 1).id());
  return resp;
}

absl::StatusOr<v1::Job> JobApi::Cancel(const Caller& caller, const v1::CancelJobRequest& request) {
  KF_RETURN_IF_ERROR(Get(caller, request.job_id()).status());
  if (request.reason().size() > 1024 || !IsValidUtf8(request.reason())) {
    return absl::InvalidArgumentError("reason must be UTF-8 of at most 1024 bytes");
  }
  return manager_.Cancel(request.job_id(), request.reason());
}

absl::StatusOr<v1::ListCandidatesResponse> JobApi::Candidates(const Caller& caller,
                                                              const v1::ListCandidatesRequest& request) {
  KF_RETURN_IF_ERROR(Get(caller, request.job_id()).status());
  KF_ASSIGN_OR_RETURN(std::vector<v1::Candidate> cands, store_.ListCandidates(request.job_id()));
  KF_ASSIGN_OR_RETURN(std::vector<v1::EvaluationResult> evals, store_.ListEvaluations(request.job_id()));
  std::map<std::string, v1::EvaluationResult> by_id;
  for (auto& e : evals) by_id[e.candidate_id()] = std::move(e);
  std::vector<v1::ScoredCandidate> scored;
  for (auto& c : cands) {
    v1::ScoredCandidate s;
    if (auto it = by_id.find(c.id()); it != by_id.end()) *s.mutable_result() = it->second;
    *s.mutable_candidate() = std::move(c);
    if (!request.include_source()) s.mutable_candidate()->clear_source();
    scored.push_back(std::move(s));
  }
  if (request.best_first()) {
    auto fitness = [](const v1::ScoredCandidate& s) {
      return s.result().outcome() == v1::OUTCOME_OK ? s.result().speedup() : -1.0;
    };
    std::stable_sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) { return fitness(a) > fitness(b); });
  }
  int64_t offset = 0;
  if (!request.page_token().empty() && (!absl::SimpleAtoi(request.page_token(), &offset) || offset < 0)) {
    return absl::InvalidArgumentError("bad page_token");
  }
  const int size = request.page_size() > 0 ? std::min(request.page_size(), options_.max_page_size) : 100;
  v1::ListCandidatesResponse resp;
  for (int64_t i = offset; i < static_cast<int64_t>(scored.size()) && i < offset + size; ++i) {
    *resp.add_candidates() = std::move(scored[static_cast<size_t>(i)]);
  }
  if (offset + size < static_cast<int64_t>(scored.size())) resp.set_next_page_token(absl::StrCat(offset + size));
  return resp;
}

absl::StatusOr<v1::GetBestResponse> JobApi::Best(const Caller& caller, const std::string& job_id) {
  KF_ASSIGN_OR_RETURN(v1::Job job, Get(caller, job_id));
  v1::GetBestResponse resp;
  if (job.has_best() && job.confirmation().finalists_size() > 0) {
    // The finalists were re-measured side by side: the job's best is the one that won there,
    // which need not be the highest single measurement.
    *resp.mutable_best()->mutable_candidate() = job.best();
    *resp.mutable_best()->mutable_result() = job.best_result();
    return resp;
  }
  v1::ListCandidatesRequest req;
  req.set_job_id(job_id);
  req.set_best_first(true);
  req.set_include_source(true);
  req.set_page_size(1);
  KF_ASSIGN_OR_RETURN(v1::ListCandidatesResponse page, Candidates(caller, req));
  if (page.candidates().empty() || page.candidates(0).result().outcome() != v1::OUTCOME_OK) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no correct candidate yet"));
  }
  *resp.mutable_best() = page.candidates(0);
  return resp;
}

absl::StatusOr<JobApi::EventPage> JobApi::Events(const Caller& caller, const std::string& job_id,
                                                 int64_t from_sequence, int limit) {
  KF_ASSIGN_OR_RETURN(v1::Job job, Get(caller, job_id));
  EventPage page;
  KF_ASSIGN_OR_RETURN(page.events, store_.ListEvents(job_id, std::max<int64_t>(1, from_sequence), limit));
  // The job was read before its events: if it had ended then, every event it has is among them.
  page.ended = IsFinalJobState(job.state());
  return page;
}

absl::StatusOr<v1::ListWorkersResponse> JobApi::Workers(const Caller&) {
  KF_ASSIGN_OR_RETURN(std::vector<v1::WorkerStatus> workers, queue_.ListWorkers());
  v1::ListWorkersResponse resp;
  for (auto& w : workers) *resp.add_workers() = std::move(w);
  return resp;
}

}  // namespace kforge::coordinator
