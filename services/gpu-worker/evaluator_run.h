#pragma once

#include "services/gpu-worker/layer.h"

// The evaluator's internals, shared by evaluator.cc (the Evaluator: backends, sandboxes,
// dispatch) and evaluator_run.cc (one evaluation through the stages). Not for other users.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "services/gpu-worker/evaluator.h"
#include "services/gpu-worker/resident_inputs.h"
#include "services/gpu-worker/sandbox.h"
#include "services/gpu-worker/torch_runner.h"

namespace kforge::worker {

// Median, min, p20, p80 and count of timing samples (seconds); empty for none.
v1::TimingStats TimingStatsOf(std::vector<double> samples);

// Inputs and reference outputs of one problem, by size set and input set index.
struct Evaluator::ProblemData {
  int64_t bytes = 0;      // held in inputs and ref_outputs
  uint64_t last_use = 0;  // BackendState::uses at the last evaluation
  std::map<std::pair<int, int>, std::map<std::string, std::string>> inputs;
  std::map<std::pair<int, int>, std::map<std::string, std::string>> ref_outputs;
  int ref_program = -1;
  int ref_generation = -1;
  std::map<int, v1::TimingStats> ref_timing;  // by size set, valid for ref_timing_generation
  std::map<int, double> ref_run_seconds;      // by size set: its slowest validation run
  int ref_timing_generation = -1;
  // A PyTorch reference: the module's state by size set (the state buffers' bytes), loaded in the
  // runner process of torch_generation; torch.compile's timing by size set.
  std::map<int, std::map<std::string, std::string>> torch_state;
  int torch_generation = -1;
  std::map<int, v1::TimingStats> compiled_timing;
  std::set<int> compile_loaded;  // size sets built in torch_compile's process of compile_generation
  int compile_generation = -1;

  // Forgets the module's state (its process no longer holds the module) and, with `outputs`, the
  // reference's outputs, and the bytes they held.
  void ForgetTorchState(bool outputs) {
    for (const auto& [set, bufs] : torch_state) {
      for (const auto& [name, bytes] : bufs) this->bytes -= static_cast<int64_t>(bytes.size());
    }
    torch_state.clear();
    compile_loaded.clear();
    if (!outputs) return;
    for (const auto& [key, bufs] : ref_outputs) {
      for (const auto& [name, bytes] : bufs) this->bytes -= static_cast<int64_t>(bytes.size());
    }
    ref_outputs.clear();
  }
  std::map<int, std::string> compile_failed;  // by size set: why torch.compile could not be timed
};

struct Evaluator::BackendState {
  explicit BackendState(int64_t resident_bytes) : resident(resident_bytes) {}
  std::mutex mu;
  std::unique_ptr<Sandbox> sandbox;
  std::unique_ptr<CompileAhead> ahead;  // builders, when compile_threads > 0
  // Whether the sandbox's device is the host's CPU, from its hello: -1 until it said.
  std::atomic<int> host_device{-1};
  TorchOptions torch_options;          // on this backend's device (StateFor)
  std::unique_ptr<TorchRunner> torch;  // PyTorch references' process (made when first needed)
  // torch.compile's process: its compiler starts processes, which the reference's process may
  // not, so the baseline that needs them runs apart (made when first needed).
  std::unique_ptr<TorchRunner> torch_compile;
  std::string torch_problem;  // whose modules the processes hold (a problem key)
  ResidentIndex resident;  // what the sandbox holds, for its current generation
  std::map<std::string, std::unique_ptr<ProblemData>> problems;  // by worker-computed hash
  uint64_t uses = 0;

  // Forgets the least recently used problems other than `keep` while more than `max_bytes` are
  // held, and hands the freed memory back to the system.
  void TrimHeld(const std::string& keep, int64_t max_bytes);
};

// One evaluation: holds the request, the result being built, and the stage bookkeeping.
class Evaluator::Run {
 public:
  // `problem_key` names the problem in every cache; the worker computed it (HashProblem).
  Run(Evaluator& ev, BackendState& state, const v1::EvaluationRequest& req,
      const std::string& problem_key, v1::EvaluationResult& res)
      : ev_(ev), st_(state), req_(req), p_(req.problem()), key_(problem_key), res_(res) {}

  void Execute();
  // The stages before the benchmark: screen, compile, validate. False: the result says why.
  bool Prepare();
  // Stage 4, after Prepare: times reference and candidate, fills the speedup.
  void Benchmark();

  // How a benchmark run samples (see RunRequest).
  struct Sampling {
    int warmup = 0;
    int min_samples = 1;
    int max_samples = 1;
    double min_seconds = 0;
    double target_rel_error = 0;
    double race_seconds = 0;
    int race_samples = 0;
    double race_early_seconds = 0;
    int race_early_samples = 0;
  };
  // The input sets a size set is benchmarked on, their reference answers ensured.
  absl::StatusOr<std::vector<int>> BenchIndices(int set);
  // Times the reference on those sets afresh (not the cached timing).
  absl::StatusOr<std::vector<double>> TimeReference(int set, const std::vector<int>& indices,
                                                    const Sampling& sampling);
  // Times the candidate (after Prepare) and checks what its last timed run left; false (the
  // result's outcome set, the benchmark stage closed from t0) when it failed. Outputs are poisoned
  // with the repeat run's pattern (1) before every timed run: the last run's check is the repeat
  // run of a benchmarked size set (see Prepare).
  bool TimeCandidate(int set, const std::vector<int>& indices, const Sampling& sampling, double t0,
                     std::vector<double>* samples, bool* raced);
  v1::EvaluationResult& result() { return res_; }
  bool torch() const { return p_.reference().has_pytorch(); }
  // How a confirmation round samples this candidate (or the reference) on a size set: a few
  // samples, fewer for a kernel whose run takes long (a round gets a third of max_bench_seconds).
  Sampling RoundSampling(int set, bool reference) const;
  // The candidate's slowest validation run on a size set (0 before Prepare).
  double RunSeconds(int set) const {
    return set < static_cast<int>(cand_run_seconds_.size()) ? cand_run_seconds_[set] : 0;
  }
  // The reference's slowest validation run on a size set (0 when it has not run).
  double ReferenceRunSeconds(int set) const;

 private:
  // Closes the current stage; false (and the result's outcome set) when it failed.
  bool EndStage(v1::Stage stage, double t0, v1::Outcome outcome, const std::string& message = "") {
    auto* s = res_.add_stages();
    s->set_stage(stage);
    s->set_outcome(outcome);
    s->set_duration_seconds(ev_.clock_.MonotonicSeconds() - t0);
    s->set_message(ScrubMessage(message, ev_.options_.max_message_bytes));
    if (outcome != v1::OUTCOME_OK) {
      res_.set_outcome(outcome);
      res_.set_message(absl::StrCat(StageName(stage), ": ", s->message()));
      return false;
    }
    return true;
  }

  // Maps a failed sandbox call to the stage's outcome.
  bool EndCallFailure(v1::Stage stage, double t0, const Sandbox::CallResult& r) {
    v1::Outcome o = v1::OUTCOME_INFRA_ERROR;
    if (r.status == Sandbox::CallStatus::kTimeout) o = v1::OUTCOME_TIMEOUT;
    if (r.status == Sandbox::CallStatus::kCrashed) o = v1::OUTCOME_CRASHED;
    return EndStage(stage, t0, o, r.message);
  }

  // Whether a run request was answered and the kernels ran.
  static bool RunSucceeded(const Sandbox::CallResult& r) {
    return r.status == Sandbox::CallStatus::kOk && r.response.run().outcome() == v1::OUTCOME_OK;
  }
  // Closes the stage with the outcome of a run that did not succeed (see RunSucceeded).
  void EndRunFailure(v1::Stage stage, double t0, const Sandbox::CallResult& r) {
    if (r.status != Sandbox::CallStatus::kOk) {
      EndCallFailure(stage, t0, r);
    } else {
      EndStage(stage, t0, r.response.run().outcome(), r.response.run().message());
    }
  }

  ProblemData& Data();
  const std::map<std::string, std::string>& Inputs(int set, int index);
  absl::Status EnsureReference(int set, int index);
  // A PyTorch reference (evaluator_torch.cc): its process, the module's state on a size set, its
  // outputs for an input set, and its timings (eager or torch.compile).
  absl::StatusOr<TorchRunner*> Torch();
  absl::StatusOr<TorchRunner*> CompileTorch(int set);  // torch.compile's process, the module built
  std::string TorchSet(int set) const;                 // a size set's name in the processes
  // One sandboxed run's (or one run of the module's code) wall-clock limit: the request's, else
  // the worker's.
  double RunTimeout() const {
    return req_.timeout_seconds() > 0 ? req_.timeout_seconds() : ev_.options_.run_timeout_seconds;
  }
  absl::StatusOr<std::vector<TorchTensor>> LoadModule(TorchRunner& runner, int set);
  absl::Status EnsureTorchState(int set);
  absl::Status EnsureTorchReference(int set, int index);
  absl::StatusOr<std::vector<double>> TimeTorch(int set, const std::vector<int>& indices, const Sampling& sampling,
                                                const std::string& mode);
  // torch.compile's timing on a size set (cached like the reference's); NotFound when this torch
  // has none.
  absl::StatusOr<v1::TimingStats> CompiledTiming(int set, const std::vector<int>& indices);
  // Which process a reference timing is comparable within: the sandbox's, or the PyTorch one's.
  int ReferenceGeneration() const;
  absl::StatusOr<v1::TimingStats> ReferenceTiming(int set, const std::vector<int>& indices);
  Sampling ReferenceSampling() const;
  Sampling CandidateSampling() const;
  // `s` with fewer samples for a kernel whose one run takes `run_seconds` (see max_bench_seconds).
  Sampling Capped(Sampling s, double run_seconds) const;
  // `resident`: inputs go by key when the sandbox holds them (candidate runs, and the reference's
  // timed runs). The reference's validation runs always carry their bytes: the answers every
  // candidate is judged by come from inputs the worker sent in that very request. Its timed runs
  // answer nothing, and the resident copies are read-only: a kernel writing one faults.
  v1::BufferSet BuildSet(int set, int index, const std::map<std::string, int64_t>& scratch,
                         int pattern, bool inputs_only, bool resident);
  // `sampling` null: a validation run (once, every buffer back).
  Sandbox::CallResult RunCalls(int program, const std::vector<v1::KernelCall>& calls,
                               std::vector<v1::BufferSet> sets, const Sampling* sampling);
  // One validation run of the candidate on (set, trial) with outputs poisoned by `pattern`, its
  // time noted and its answer checked; false (the stage closed from t0 with the reason) when it
  // failed. Pattern 1 is the repeat run, judged "nondeterministic".
  bool ValidationRun(int set, int trial, int pattern, v1::Stage stage, double t0);
  // Compares one run's returned buffers with the inputs and the reference; fills errors_.
  bool Check(int set, int index, const Sandbox::CallResult& result, int pattern,
             const char* check_name);

  Evaluator& ev_;
  BackendState& st_;
  const v1::EvaluationRequest& req_;
  const v1::Problem& p_;
  const std::string& key_;
  v1::EvaluationResult& res_;
  Sandbox* sb_ = nullptr;
  ProblemData* data_ = nullptr;
  std::vector<std::vector<v1::KernelCall>> cand_calls_;  // by size set
  std::vector<std::map<std::string, int64_t>> cand_scratch_;
  std::vector<std::vector<v1::KernelCall>> ref_calls_;
  int cand_program_ = -1;
  std::vector<double> cand_run_seconds_;  // by size set: the candidate's slowest validation run
  std::vector<double> cand_fastest_run_;  // by size set: its fastest validation run
  double start_ = 0;
};

}  // namespace kforge::worker
