#pragma once

#include "services/gpu-worker/layer.h"

// The worker's side of a PyTorch reference: a Python process that runs the tenant's module
// (python/kforge_torch/runner.py), started through kforge-sandbox --python, which restricts its
// files before Python starts; the runner closes network, signals, IPC and new processes itself
// once torch has opened its device, before any request (sandbox_jail.h JailFiles,
// SeccompPlanJson), with the child hygiene of child_process.h. The tenant's Python never runs
// in the worker, the coordinator or the proxy: only here. A request that overruns its timeout kills the process; the next request
// starts a fresh one. `kforge import` uses the same process to describe a module file.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "kforge/v1/problem.pb.h"

namespace kforge::worker {

struct TorchOptions {
  // A python3 that imports torch; "" = KFORGE_PYTHON, then /usr/bin/python3, then python3 on PATH.
  std::string python;
  // The folder holding the kforge_torch package; "" = FindTorchPackage().
  std::string package_dir;
  std::string sandbox_binary;  // kforge-sandbox; "" = FindSandboxBinary()
  // Where torch runs the module ("cpu", "cuda:0"): the candidates' device, so that the baseline is
  // timed where they are. "" = $KFORGE_TORCH_DEVICE, else "cpu".
  std::string device;
  bool jail = true;
  bool require_jail = false;
  int64_t run_as_uid = -1;     // as SandboxOptions::run_as_uid
  // torch's threads; 0 = the CPUs this process may run on (as many as an OpenCL device on the
  // same CPU uses: the baseline is timed with the same cores as the candidates).
  int threads = 0;
  int64_t memory_limit_mb = 16384;  // address space (not for a CUDA torch, as for CUDA sandboxes)
  double start_timeout_seconds = 120;
  // torch.compile starts compiler processes (Inductor, Triton's ptxas); the module itself should
  // not: off unless asked (the worker's torch.compile process only; the files and network jail
  // still hold, and bind every process it starts).
  bool allow_fork = false;
  // Preload jemalloc (when installed) with its decay off: freed memory stays with the process, as
  // in a warmed-up one, instead of being faulted in afresh on every call (KERNELBENCH.md: under
  // glibc a 64 MB relu costs 200 ms of page faults against 3.7 ms).
  bool reuse_memory = true;
  int64_t max_output_bytes = 64 << 10;  // of the process's stderr per request, to the log
  std::vector<std::string> env_allow = {"PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
                                        "OMP_*", "MKL_*", "OPENBLAS_*"};
};

// Finds python/kforge_torch: $KFORGE_PYTHON_DIR, then beside the binary's install prefix
// (share/kforge/python), then the source tree this build came from.
std::string FindTorchPackage();

// What the process found.
struct TorchInfo {
  std::string version;   // torch.__version__
  std::string device;    // "cpu", "cuda:0"
  bool compile = false;  // torch.compile exists
  int threads = 0;
};

// A tensor going in or coming out.
struct TorchTensor {
  std::string dtype;  // f32, f64, f16, bf16, i32, i64, u8, bool
  std::vector<int64_t> shape;
  std::string key;    // a state_dict entry's key (Load's answers)
  std::string_view bytes;
};

struct TorchSampling {
  int warmup = 2;
  int min_samples = 10;
  int max_samples = 200;
  double min_seconds = 0.25;
  double max_seconds = 30;
};

class TorchRunner {
 public:
  explicit TorchRunner(TorchOptions options);
  ~TorchRunner();
  TorchRunner(const TorchRunner&) = delete;
  TorchRunner& operator=(const TorchRunner&) = delete;

  // Starts the process if none runs. Unavailable (with why) when there is no torch here.
  [[nodiscard]] absl::StatusOr<TorchInfo> EnsureStarted();

  // Builds the module of size set `set` (constants set, seeded initialisation); its state_dict
  // entries, valid until the next call. InvalidArgument for the module's own errors.
  // `problem` names whose module it is: the process keeps one problem's modules, and forgets the
  // others' when another's is built.
  [[nodiscard]] absl::StatusOr<std::vector<TorchTensor>> Load(const std::string& set, const std::string& problem,
                                                              const v1::TorchReference& ref,
                                                              const std::map<std::string, double>& constants,
                                                              uint64_t seed, int64_t max_state_bytes, double timeout);
  // forward() on `inputs`; the outputs, valid until the next call.
  [[nodiscard]] absl::StatusOr<std::vector<TorchTensor>> Run(const std::string& set,
                                                             const std::vector<TorchTensor>& inputs, double timeout);
  // Times forward() ("eager" or "compile"), rotating over input sets; the samples in seconds.
  [[nodiscard]] absl::StatusOr<std::vector<double>> Time(const std::string& set, const std::string& mode,
                                                         const std::vector<std::vector<TorchTensor>>& sets,
                                                         const TorchSampling& sampling, double timeout);
  // Any request of the runner's protocol (kforge import's "describe"): the answer's JSON header
  // and payload.
  [[nodiscard]] absl::StatusOr<std::pair<std::string, std::string>> Call(const std::string& header_json,
                                                                          const std::string& payload, double timeout);

  void Kill();
  // Increments with every process started: a timing is comparable only within one.
  int generation() const { return generation_; }
  bool running() const { return pid_ > 0; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  absl::Status Spawn();
  std::string Reap(bool kill_first);
  void DrainOutput(int fd);
  // Sends a frame and reads the answer; the answer's header (parsed JSON, as text) and payload.
  absl::StatusOr<std::pair<std::string, std::string>> Exchange(const std::string& header, std::string_view payload,
                                                               double timeout);

  TorchOptions options_;
  std::mutex mu_;
  std::string work_dir_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::thread drain_;
  std::atomic<bool> drain_stop_{false};
  std::atomic<int64_t> output_budget_{0};
  int generation_ = 0;
  TorchInfo info_;
  std::string answer_payload_;  // what the last answer's tensors point into
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

// Appends tensors to a payload and their header entries ({"dtype","shape","offset","bytes"}) as
// JSON text; for the requests of the protocol.
std::string TensorSpecs(const std::vector<TorchTensor>& tensors, std::string* payload);

// The torch dtype name of a buffer dtype ("f32"), and back; "" when kforge has none.
std::string TorchDtypeName(v1::DType dtype);

}  // namespace kforge::worker
