#pragma once

#include "services/coordinator/layer.h"

// What CoordinatorService does, without gRPC: every call is scoped to the caller's tenant (another
// tenant's job is NotFound), and a submitted problem arrives as its folder's files and goes
// through the same loader as `kforge validate`.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/queue/work_queue.h"
#include "common/store/store.h"
#include "kforge/v1/coordinator.pb.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/job_manager.h"

namespace kforge::coordinator {

struct JobApiOptions {
  std::string problems_dir;                       // where submitted problem folders are written
  int max_problem_files = 64;
  int64_t max_problem_file_bytes = int64_t{64} << 20;  // all files of one submit together
  int max_page_size = 500;
};

class JobApi {
 public:
  JobApi(Store& store, WorkQueue& queue, JobManager& manager, JobApiOptions options)
      : store_(store), queue_(queue), manager_(manager), options_(std::move(options)) {}

  [[nodiscard]] absl::StatusOr<v1::Job> Submit(const Caller& caller, const v1::SubmitJobRequest& request);
  [[nodiscard]] absl::StatusOr<v1::Job> Get(const Caller& caller, const std::string& job_id);
  [[nodiscard]] absl::StatusOr<v1::ListJobsResponse> List(const Caller& caller, const v1::ListJobsRequest& request);
  [[nodiscard]] absl::StatusOr<v1::Job> Cancel(const Caller& caller, const v1::CancelJobRequest& request);
  [[nodiscard]] absl::StatusOr<v1::ListCandidatesResponse> Candidates(const Caller& caller,
                                                                      const v1::ListCandidatesRequest& request);
  [[nodiscard]] absl::StatusOr<v1::GetBestResponse> Best(const Caller& caller, const std::string& job_id);
  // The fleet (shared by every tenant): the workers heard from lately.
  [[nodiscard]] absl::StatusOr<v1::ListWorkersResponse> Workers(const Caller& caller);
  // The job's events from `from_sequence` (at most `limit`), and whether the job has ended (a
  // watcher that has read everything stops then).
  struct EventPage {
    std::vector<v1::JobEvent> events;
    bool ended = false;
  };
  [[nodiscard]] absl::StatusOr<EventPage> Events(const Caller& caller, const std::string& job_id,
                                                 int64_t from_sequence, int limit);

 private:
  // Writes the files under problems_dir and loads them; errors name the file and field.
  absl::StatusOr<v1::Problem> LoadSubmittedProblem(const v1::SubmitJobRequest& request);

  Store& store_;
  WorkQueue& queue_;
  JobManager& manager_;
  const JobApiOptions options_;
};

}  // namespace kforge::coordinator
