#pragma once

// The cluster client: `kforge submit/list/status/watch/best/cancel` against a kforge-coordinator
// (--server / KFORGE_SERVER, --token / KFORGE_TOKEN). Exit codes: 0 ok, 1 the call failed (the
// server unreachable, an unknown job, a failed job), 2 bad input or a refused token.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cli/coordinator_client.h"
#include "kforge/v1/job.pb.h"

namespace CLI {
class App;
}  // namespace CLI

namespace kforge::cli {

struct SubmitArgs {
  std::string problem_dir;
  int64_t budget = 100;  // evaluations, the seed included
  double time_seconds = 0;
  uint64_t seed = 1;
  int priority = 0;
  double target = 0;
  int64_t patience = 0;
  int screen = 0;
  std::string idempotency_key;
  bool fresh = false;  // measure every candidate; no earlier job's evaluation is reused
  bool cold = false;   // no warm start from earlier jobs of the same kernel
  bool watch = false;
  // A PyTorch module file instead of a folder: imported first (kforge import) with these.
  std::vector<std::string> sets;
  int64_t fit = 0;
  std::string backend = "opencl";
};

struct ListArgs {
  std::string state;  // "" = any
  bool json = false;
  int limit = 50;
};

// What SubmitProblem did: the job, or the coordinator's refusal (rpc), and what an import of a
// module file found.
struct Submitted {
  v1::Job job;
  grpc::Status rpc;
  bool imported = false;
  std::string family;  // the seed's template; "" = none (a model writes the kernels)
  std::string sizes;
};

// `kforge submit`'s work: a module file imported (locally, jailed), the folder checked as
// `kforge validate` does (InvalidArgument naming what is wrong), the job submitted.
[[nodiscard]] absl::StatusOr<Submitted> SubmitProblem(CoordinatorClient& client, const SubmitArgs& args);
// One job, and its best, from the coordinator (Unavailable with the call's failure).
[[nodiscard]] absl::StatusOr<v1::Job> FetchJob(CoordinatorClient& client, const std::string& job_id);
[[nodiscard]] absl::StatusOr<v1::GetBestResponse> FetchBest(CoordinatorClient& client, const std::string& job_id);

int SubmitCommand(const ClientArgs& client, const SubmitArgs& args);
int ListCommand(const ClientArgs& client, const ListArgs& args);
int StatusCommand(const ClientArgs& client, const std::string& job_id, bool json);
int WatchCommand(const ClientArgs& client, const std::string& job_id);
int BestCommand(const ClientArgs& client, const std::string& job_id, const std::string& out_dir);
int CancelCommand(const ClientArgs& client, const std::string& job_id, const std::string& reason);
// The fleet: each worker's state, slots, streams, devices and last heartbeat.
int WorkersCommand(const ClientArgs& client, bool json);

// "running", "RUNNING" or "JOB_STATE_RUNNING"; InvalidArgument listing the states otherwise.
[[nodiscard]] absl::StatusOr<v1::JobState> ParseJobState(const std::string& text);

// The client subcommands on a CLI11 app: Register adds them, Run runs the one given (nullopt when
// none of them was).
class ClientCommands {
 public:
  void Register(CLI::App& app);
  std::optional<int> Run() const;

 private:
  ClientArgs client_;
  SubmitArgs submit_;
  ListArgs list_;
  std::string job_id_;
  bool json_ = false;
  std::string out_dir_;
  std::string reason_;
  CLI::App* submit_cmd_ = nullptr;
  CLI::App* list_cmd_ = nullptr;
  CLI::App* status_cmd_ = nullptr;
  CLI::App* watch_cmd_ = nullptr;
  CLI::App* best_cmd_ = nullptr;
  CLI::App* cancel_cmd_ = nullptr;
  CLI::App* workers_cmd_ = nullptr;
};

}  // namespace kforge::cli
