#pragma once

#include "services/gpu-worker/layer.h"

// The evaluation pipeline: screen -> compile -> validate -> benchmark. Runs in the worker
// process and drives a sandbox per backend. The reference's answers never enter the sandbox:
// the sandbox returns what the candidate wrote and this process compares.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/problem_check.h"
#include "kforge/v1/evaluation.pb.h"
#include "kforge/v1/sandbox.pb.h"
#include "services/gpu-worker/compile_ahead.h"
#include "services/gpu-worker/kernel_binary_cache.h"
#include "services/gpu-worker/replay.h"
#include "services/gpu-worker/sandbox.h"
#include "services/gpu-worker/screen.h"
#include "services/gpu-worker/torch_runner.h"

namespace kforge::worker {

struct EvaluatorOptions {
  SandboxOptions sandbox;
  ScreenOptions screen;
  std::string worker_id = "local";
  // Its own limit: a macro bomb keeps a compiler busy whatever the run timeout says.
  double compile_timeout_seconds = 30;
  double run_timeout_seconds = 60;  // per sandbox run request (the watchdog)
  // What a request may ask for: its problem's size (checked before anything runs) and its
  // timeout (0 means run_timeout_seconds).
  ProblemLimits problem_limits;
  double max_timeout_seconds = 600;
  // Inputs and reference outputs this process keeps for the problems it has seen, together;
  // a problem that alone would need more is refused.
  int64_t max_held_bytes = int64_t{4} << 30;
  // Folders a replay problem's cache may be read from (after resolving links); nullopt = any
  // (the embedded run reads its user's own files), empty = none.
  std::optional<std::vector<std::string>> replay_roots;
  int warmup = 2;  // warm-up runs before the samples (a candidate's: 1 at most, see CandidateSampling)
  int min_samples = 10;
  int max_samples = 200;
  double min_bench_seconds = 0.25;  // device time per size set and kernel
  // A kernel whose validation run says it would need more device time than this for min_samples
  // gets fewer samples (3 at least) and one warm-up: seconds-long kernels are timed, not timed out.
  double max_bench_seconds = 3;
  int bench_input_sets = 3;         // input sets rotated between benchmark samples
  // Returned buffers of at least this many bytes come back through the sandbox's output arena
  // (shared_output.h), compared in place, instead of inside the response frame (copied on both
  // sides and through the socket). 0 = always in the frame.
  int64_t share_outputs_min_bytes = int64_t{1} << 20;
  // Adaptive sampling: a candidate stops sampling once its median is known to +-this fraction
  // (~95% interval), or after min_bench_seconds, whichever comes first (min_samples at least).
  // 0 = always min_bench_seconds.
  double bench_rel_error = 0.02;
  // The reference, which every candidate of the problem is judged against, to a tighter target:
  // +-1% (or min_bench_seconds). 0 = always min_bench_seconds.
  double reference_rel_error = 0.01;
  // Racing: after race_samples samples, a candidate whose fastest sample is race_factor times the
  // time of the job's best on that size set (EvaluationRequest.best_set_speedups, or
  // best_speedup) stops sampling. 0 = off. By default, once every one of 5 samples is over 1.1x
  // the best's time: a candidate whose median is below that shows five such samples with
  // probability under 1/32 (a one-sided sign test), and the 10% margin stands for what the bar
  // itself gets wrong (the best's speedup is the highest of many estimates, so a little high, and
  // the reference was timed earlier in the sandbox's life). So a candidate as fast as the best is
  // not lost to racing, and the rest of a search (most of it) pays 5 samples instead of the +-2%
  // target. A raced candidate keeps the median of its samples, known less tightly.
  double race_factor = 1.1;
  int race_samples = 5;
  // And sooner for one far slower: after race_early_samples, once even the fastest sample took
  // race_early_factor times the best's time (0 = off).
  double race_early_factor = 2;
  int race_early_samples = 3;
  // Re-measuring finalists (ConfirmRequest): samples per finalist and round, and the most rounds
  // and finalists a request may ask for.
  int confirm_samples = 5;
  int max_confirm_rounds = 50;
  int max_finalists = 10;
  // Input bytes a sandbox keeps between runs (read-only), so that a problem's inputs cross the
  // pipe once per sandbox lifetime rather than on every run; 0 sends them every time.
  int64_t resident_input_bytes = int64_t{1} << 30;
  int64_t max_message_bytes = 2048; // compile logs and messages are truncated to this
  // The kernel binary cache (kernel_binary_cache.h), "" = none: a kernel compiled before on this
  // device is loaded from what its runtime built then. `binary_wanted` says when a build's binary
  // is fetched for it: IF_CHEAP leaves out PoCL on a CPU (see sandbox.proto).
  std::string binary_cache_dir;
  int64_t binary_cache_max_bytes = int64_t{1} << 30;
  v1::CompileRequest::BinaryWanted binary_wanted = v1::CompileRequest::BINARY_WANTED_IF_CHEAP;
  // Builder sandboxes per backend (compile_ahead.h): a candidate that finds another holding the
  // device is compiled meanwhile, and its run loads the binary. 0 = off. Only where the device is
  // not the host's CPU, unless compile_ahead_on_host_device: on PoCL the builds would share the
  // cores the timed kernels run on.
  int compile_threads = 0;
  bool compile_ahead_on_host_device = false;
  // PyTorch references: the process that runs them (a python3 with torch). Off: such problems
  // are refused (CheckRequest).
  bool torch_enabled = true;
  TorchOptions torch;
  // Salt for the random inputs; 0 draws one from the OS at construction. Inputs depend on it,
  // the problem and the trial, never on the candidate, and nothing outside this process sees it.
  uint64_t input_salt = 0;
};

class Evaluator {
 public:
  Evaluator(EvaluatorOptions options, Clock& clock, Logger log);
  ~Evaluator();

  // Never fails: every problem is a typed outcome in the result. Thread-safe; one evaluation at
  // a time per backend.
  v1::EvaluationResult Evaluate(const v1::EvaluationRequest& request);

  // Starts the backend's sandbox and returns what it found (device info or why unavailable).
  v1::HelloResponse Probe(v1::Backend backend);

  // Whether a request is one this worker will run: the problem passes CheckProblem and the
  // worker's limits, the timeout is within bounds, a replay cache lies in an allowed folder.
  // Evaluate runs it too; callers that can refuse a request outright (the gRPC handler) call it
  // first.
  [[nodiscard]] absl::Status CheckRequest(const v1::EvaluationRequest& request) const;

  // Shutting down: kills every sandbox's child so that evaluations in flight end now (as
  // infra errors, not retried).
  void Interrupt();

  const EvaluatorOptions& options() const { return options_; }

  // Candidates compiled by a builder while another held the device, over this object's lifetime.
  int64_t compiled_ahead() const;

 private:
  struct ProblemData;
  struct BackendState;
  class Run;

  BackendState& StateFor(v1::Backend backend);
  void EvaluateOnce(const v1::EvaluationRequest& req, const std::string& problem_key,
                    v1::EvaluationResult& res);
  // A ConfirmRequest: the finalists validated again and timed side by side (evaluator_confirm.cc).
  void ConfirmOnce(const v1::EvaluationRequest& req, const std::string& problem_key,
                   v1::EvaluationResult& res);

  EvaluatorOptions options_;
  Clock& clock_;
  Logger log_;
  std::unique_ptr<KernelBinaryCache> binaries_;  // null: no binary cache
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<BackendState>> backends_;
  ReplayEvaluator replay_;
  std::atomic<bool> interrupted_{false};
};

// Removes absolute paths and truncates; what leaves the worker goes through this.
std::string ScrubMessage(const std::string& text, int64_t max_bytes);

}  // namespace kforge::worker
