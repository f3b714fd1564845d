// Evaluator::Run with a PyTorch reference: the module's state (its parameters and buffers, the
// candidate's read-only inputs), its outputs for the same inputs the candidate gets, and its eager
// and torch.compile timings, all from the jailed TorchRunner process of this backend.

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/launch.h"
#include "common/status_macros.h"
#include "services/gpu-worker/evaluator_run.h"
#include "services/gpu-worker/sample_stats.h"

namespace kforge::worker {

namespace {

constexpr int kTorchGenerationBase = 1 << 20;  // keeps torch generations apart from sandbox ones

// The module's constants on size set `set`: the sizes it names, and the fixed ones.
std::map<std::string, double> Constants(const v1::Problem& p, int set) {
  std::map<std::string, double> c;
  const auto& t = p.reference().pytorch();
  for (const auto& name : t.size_constants()) {
    if (auto it = p.size_sets(set).sizes().find(name); it != p.size_sets(set).sizes().end()) {
      c[name] = static_cast<double>(it->second);
    }
  }
  for (const auto& [k, v] : t.fixed_constants()) c[k] = v;
  return c;
}

}  // namespace

absl::StatusOr<TorchRunner*> Evaluator::Run::Torch() {
  if (!ev_.options_.torch_enabled) {
    return absl::FailedPreconditionError("this worker runs no PyTorch references (worker.pytorch is off)");
  }
  if (st_.torch == nullptr) st_.torch = std::make_unique<TorchRunner>(st_.torch_options);
  KF_ASSIGN_OR_RETURN(TorchInfo info, st_.torch->EnsureStarted());
  if (st_.torch_problem != key_) {
    // The processes hold one problem's modules at a time (a fleet worker serves many tenants): the
    // one held before is built again when it comes back.
    if (auto it = st_.problems.find(st_.torch_problem); it != st_.problems.end()) {
      it->second->ForgetTorchState(/*outputs=*/false);
    }
    st_.torch_problem = key_;
  }
  // The baseline's torch goes with the result: reports name what the speedup was measured against.
  v1::DeviceInfo* d = res_.mutable_device();
  d->set_torch_version(info.version);
  d->set_torch_device(info.device);
  d->set_torch_compile(info.compile);
  return st_.torch.get();
}

int Evaluator::Run::ReferenceGeneration() const {
  if (!torch()) return sb_->generation();
  return kTorchGenerationBase + (st_.torch != nullptr ? st_.torch->generation() : 0);
}

absl::Status Evaluator::Run::EnsureTorchState(int set) {
  KF_ASSIGN_OR_RETURN(TorchRunner * runner, Torch());
  if (data_->torch_generation != runner->generation()) {
    // A new process knows no module: every size set's is loaded again (with the same seed, so
    // the same state and the same answers as before).
    data_->ForgetTorchState(/*outputs=*/true);
    data_->torch_generation = runner->generation();
  }
  if (data_->torch_state.contains(set)) return absl::OkStatus();
  KF_ASSIGN_OR_RETURN(std::vector<TorchTensor> state, LoadModule(*runner, set));
  std::map<std::string, std::string> by_key;
  for (const TorchTensor& t : state) by_key[t.key] = std::string(t.bytes);
  const Bindings env = MakeBindings(p_.size_sets(set), v1::KernelSpec(), {});
  std::map<std::string, std::string> bufs;
  for (const auto& [buffer, key] : p_.reference().pytorch().state()) {
    auto it = by_key.find(key);
    if (it == by_key.end()) {
      return absl::FailedPreconditionError(absl::StrCat("the module has no state_dict entry '", key,
                                                        "' (buffer ", buffer, ")"));
    }
    for (const auto& b : p_.buffers()) {
      if (b.name() != buffer) continue;
      const int64_t want = ShapeElements(b.shape(), env).value_or(-1) * DTypeSize(b.dtype());
      if (static_cast<int64_t>(it->second.size()) != want) {
        return absl::FailedPreconditionError(absl::StrCat("the module's ", key, " has ", it->second.size(),
                                                          " bytes; buffer ", buffer, " holds ", want,
                                                          " on size set ", p_.size_sets(set).name()));
      }
    }
    data_->bytes += static_cast<int64_t>(it->second.size());
    bufs[buffer] = std::move(it->second);
  }
  data_->torch_state[set] = std::move(bufs);
  return absl::OkStatus();
}

std::string Evaluator::Run::TorchSet(int set) const {
  // Named by problem too: a module of another problem can never stand in for this one's.
  return absl::StrCat(key_.substr(0, 16), "/", p_.size_sets(set).name());
}

absl::StatusOr<std::vector<TorchTensor>> Evaluator::Run::LoadModule(TorchRunner& runner, int set) {
  // The module's initialisation is seeded from the worker's salt: the state is fixed for this
  // worker and problem (the same in every process), and not known outside this one beforehand.
  const uint64_t seed = std::stoull(Sha256Hex(absl::StrCat(ev_.options_.input_salt, "|module|", key_)).substr(0, 15),
                                    nullptr, 16);
  // Building the module is one run of its code: the same watchdog (a module that hangs in its
  // import or __init__ holds the worker no longer than a kernel that hangs).
  const double timeout = RunTimeout();
  return runner.Load(TorchSet(set), key_, p_.reference().pytorch(), Constants(p_, set), seed,
                     ev_.options_.problem_limits.max_problem_bytes, timeout);
}

absl::StatusOr<TorchRunner*> Evaluator::Run::CompileTorch(int set) {
  // The module is built in the reference's process first: its own errors are reported from there.
  KF_RETURN_IF_ERROR(EnsureTorchState(set));
  if (st_.torch_compile == nullptr) {
    TorchOptions o = st_.torch_options;
    o.allow_fork = true;
    st_.torch_compile = std::make_unique<TorchRunner>(std::move(o));
  }
  TorchRunner* runner = st_.torch_compile.get();
  KF_RETURN_IF_ERROR(runner->EnsureStarted().status());
  if (data_->compile_generation != runner->generation()) {
    data_->compile_loaded.clear();
    data_->compile_generation = runner->generation();
  }
  if (!data_->compile_loaded.contains(set)) {
    KF_RETURN_IF_ERROR(LoadModule(*runner, set).status());
    data_->compile_loaded.insert(set);
  }
  return runner;
}

namespace {

// The module's inputs for one input set, in forward's order: buffers with their shapes, and
// scalars (as one-element tensors of their dtype).
std::vector<TorchTensor> ModuleInputs(const v1::Problem& p, int set, const std::map<std::string, std::string>& bytes,
                                      std::vector<std::string>* scalar_bytes) {
  const Bindings env = MakeBindings(p.size_sets(set), v1::KernelSpec(), {});
  std::vector<TorchTensor> out;
  scalar_bytes->reserve(p.reference().pytorch().inputs_size());
  for (const auto& name : p.reference().pytorch().inputs()) {
    TorchTensor t;
    bool found = false;
    for (const auto& b : p.buffers()) {
      if (b.name() != name) continue;
      t.dtype = TorchDtypeName(b.dtype());
      for (const auto& d : b.shape()) t.shape.push_back(EvaluateExpr(d, env).value_or(0));
      auto it = bytes.find(name);
      if (it != bytes.end()) t.bytes = it->second;
      found = true;
    }
    if (!found) {
      for (const auto& s : p.scalars()) {
        if (s.name() != name) continue;
        // A number of forward's (scale = 3.14): a 0-d tensor the runner turns back into one.
        const bool integral = s.dtype() == v1::DTYPE_I32 || s.dtype() == v1::DTYPE_I64;
        if (integral) {
          const int64_t v = static_cast<int64_t>(s.value());
          scalar_bytes->emplace_back(reinterpret_cast<const char*>(&v), sizeof(v));
          t.dtype = "i64";
        } else {
          const double v = s.value();
          scalar_bytes->emplace_back(reinterpret_cast<const char*>(&v), sizeof(v));
          t.dtype = "f64";
        }
        t.key = "scalar";
        t.bytes = scalar_bytes->back();
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

absl::Status Evaluator::Run::EnsureTorchReference(int set, int index) {
  KF_RETURN_IF_ERROR(EnsureTorchState(set));
  if (data_->ref_outputs.contains({set, index})) return absl::OkStatus();
  KF_ASSIGN_OR_RETURN(TorchRunner * runner, Torch());
  std::vector<std::string> scalars;
  const std::vector<TorchTensor> inputs = ModuleInputs(p_, set, Inputs(set, index), &scalars);
  const double timeout = RunTimeout();
  KF_ASSIGN_OR_RETURN(std::vector<TorchTensor> outs, runner->Run(TorchSet(set), inputs, timeout));
  const auto& names = p_.reference().pytorch().outputs();
  if (outs.size() != static_cast<size_t>(names.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("forward() gave ", outs.size(), " outputs; the problem has ", names.size()));
  }
  const Bindings env = MakeBindings(p_.size_sets(set), v1::KernelSpec(), {});
  std::map<std::string, std::string> want;
  for (int i = 0; i < names.size(); ++i) {
    for (const auto& b : p_.buffers()) {
      if (b.name() != names[i]) continue;
      const int64_t n = ShapeElements(b.shape(), env).value_or(-1);
      const std::string dtype = TorchDtypeName(b.dtype());
      const bool same_type = outs[i].dtype == dtype || (outs[i].dtype == "bool" && dtype == "u8");
      if (!same_type || static_cast<int64_t>(outs[i].bytes.size()) != n * DTypeSize(b.dtype())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "forward()'s output ", i, " is ", outs[i].dtype, " of ", outs[i].bytes.size(), " bytes; buffer ", b.name(),
            " is ", DTypeName(b.dtype()), " of ", n, " elements on size set ", p_.size_sets(set).name()));
      }
      data_->bytes += static_cast<int64_t>(outs[i].bytes.size());
      want[b.name()] = std::string(outs[i].bytes);
    }
  }
  data_->ref_outputs[{set, index}] = std::move(want);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> Evaluator::Run::TimeTorch(int set, const std::vector<int>& indices,
                                                              const Sampling& sampling, const std::string& mode) {
  TorchRunner* runner = nullptr;
  if (mode == "compile") {
    KF_ASSIGN_OR_RETURN(runner, CompileTorch(set));
  } else {
    KF_RETURN_IF_ERROR(EnsureTorchState(set));
    KF_ASSIGN_OR_RETURN(runner, Torch());
  }
  std::vector<std::vector<std::string>> scalars(indices.size());
  std::vector<std::vector<TorchTensor>> sets;
  for (size_t i = 0; i < indices.size(); ++i) {
    sets.push_back(ModuleInputs(p_, set, Inputs(set, indices[i]), &scalars[i]));
  }
  TorchSampling s{.warmup = std::max(1, sampling.warmup),
                  .min_samples = sampling.min_samples,
                  .max_samples = sampling.max_samples,
                  .min_seconds = sampling.min_seconds,
                  .max_seconds = ev_.options_.max_bench_seconds * 4};
  // torch.compile compiles on its first call (seconds, more on a GPU): a deadline of its own, a
  // few of the request's, so that a compiler that hangs holds the worker a bounded time.
  const double timeout = mode == "compile" ? std::min(ev_.options_.max_timeout_seconds, std::max(120.0, 4 * RunTimeout()))
                                           : ev_.options_.run_timeout_seconds;
  return runner->Time(TorchSet(set), mode, sets, s, timeout);
}

absl::StatusOr<v1::TimingStats> Evaluator::Run::CompiledTiming(int set, const std::vector<int>& indices) {
  KF_ASSIGN_OR_RETURN(TorchRunner * runner, Torch());
  KF_ASSIGN_OR_RETURN(TorchInfo info, runner->EnsureStarted());
  if (!info.compile) return absl::NotFoundError(absl::StrCat("torch ", info.version, " has no torch.compile"));
  if (auto it = data_->compiled_timing.find(set); it != data_->compiled_timing.end()) return it->second;
  if (auto it = data_->compile_failed.find(set); it != data_->compile_failed.end()) {
    return absl::UnavailableError(it->second);
  }
  auto samples = TimeTorch(set, indices, ReferenceSampling(), "compile");
  if (!samples.ok()) {
    data_->compile_failed[set] = std::string(samples.status().message());
    return samples.status();
  }
  return data_->compiled_timing[set] = TimingStatsOf(*std::move(samples));
}

}  // namespace kforge::worker
