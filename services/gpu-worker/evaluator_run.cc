// One evaluation through the pipeline: screen, compile, validate, benchmark (Evaluator::Run); the
// benchmark stage and its sampling are in evaluator_bench.cc.

#include "services/gpu-worker/evaluator_run.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "services/gpu-worker/device_backend.h"
#include "services/gpu-worker/host_data.h"
#include "services/gpu-worker/kernel_calls.h"
#include "services/gpu-worker/sample_stats.h"

namespace kforge::worker {

namespace {

void SetPoison(v1::BufferData& d, v1::DType dtype, int64_t elements, int pattern) {
  auto* p = d.mutable_poison();
  p->set_dtype(dtype);
  p->set_elements(elements);
  p->set_pattern(pattern);
}

bool IsPoison(std::string_view bytes, v1::DType dtype, int64_t i, int pattern) {
  const int64_t size = DTypeSize(dtype);
  const std::string poison = PoisonBytes(dtype, 1, pattern);
  return bytes.compare(static_cast<size_t>(i * size), static_cast<size_t>(size), poison) == 0;
}

}  // namespace

void Evaluator::BackendState::TrimHeld(const std::string& keep, int64_t max_bytes) {
  int64_t total = 0;
  for (const auto& [key, data] : problems) total += data->bytes;
  bool freed = false;
  while (total > max_bytes) {
    auto victim = problems.end();
    for (auto it = problems.begin(); it != problems.end(); ++it) {
      if (it->first != keep && (victim == problems.end() || it->second->last_use < victim->second->last_use)) {
        victim = it;
      }
    }
    if (victim == problems.end()) break;
    total -= victim->second->bytes;
    problems.erase(victim);
    freed = true;
  }
  if (freed) malloc_trim(0);  // large buffers live in the heap (KeepLargeAllocationsInHeap)
}

Evaluator::ProblemData& Evaluator::Run::Data() {
  auto& slot = st_.problems[key_];
  if (slot == nullptr) slot = std::make_unique<ProblemData>();
  slot->last_use = ++st_.uses;
  return *slot;
}

const std::map<std::string, std::string>& Evaluator::Run::Inputs(int set, int index) {
  auto key = std::make_pair(set, index);
  auto it = data_->inputs.find(key);
  if (it != data_->inputs.end()) return it->second;
  const std::string seed_text =
      absl::StrCat(ev_.options_.input_salt, "|", key_, "|", set, "|", index);
  const std::string h = Sha256Hex(seed_text);
  std::seed_seq seq(h.begin(), h.end());
  std::mt19937_64 rng(seq);
  std::map<std::string, std::string> bufs;
  const Bindings env = MakeBindings(p_.size_sets(set), v1::KernelSpec(), {});
  for (const auto& b : p_.buffers()) {
    if (b.role() == v1::BUFFER_ROLE_OUT) continue;
    if (b.fill().kind() == v1::Fill::KIND_MODULE) {
      // The PyTorch module's own state (EnsureTorchState loaded it; were it missing, the buffer
      // would be empty and its checks fail).
      if (!data_->torch_state.contains(set)) (void)EnsureTorchState(set);
      auto st = data_->torch_state.find(set);
      if (st != data_->torch_state.end() && st->second.contains(b.name())) bufs[b.name()] = st->second.at(b.name());
      continue;
    }
    // CheckRequest refused a problem with a shape that does not evaluate; were one to get here, it
    // would get an empty buffer (and fail its checks), not take the worker down.
    const int64_t n = ShapeElements(b.shape(), env).value_or(0);
    v1::Fill fill = b.fill();
    // Bounds that follow the sizes (randint(0, num_classes - 1)).
    if (!fill.a_expr().empty()) fill.set_a(static_cast<double>(EvaluateExpr(fill.a_expr(), env).value_or(0)));
    if (!fill.b_expr().empty()) fill.set_b(static_cast<double>(EvaluateExpr(fill.b_expr(), env).value_or(0)));
    bufs[b.name()] = FillBytes(b.dtype(), n, fill, rng);
    data_->bytes += static_cast<int64_t>(bufs[b.name()].size());
  }
  return data_->inputs[key] = std::move(bufs);
}

v1::BufferSet Evaluator::Run::BuildSet(int set, int index,
                                       const std::map<std::string, int64_t>& scratch, int pattern,
                                       bool inputs_only, bool resident) {
  v1::BufferSet out;
  const auto& inputs = Inputs(set, index);
  const Bindings env = MakeBindings(p_.size_sets(set), v1::KernelSpec(), {});
  for (const auto& b : p_.buffers()) {
    if (inputs_only && b.role() == v1::BUFFER_ROLE_OUT) continue;
    auto* d = out.add_buffers();
    d->set_name(b.name());
    if (b.role() == v1::BUFFER_ROLE_OUT) {
      SetPoison(*d, b.dtype(), ShapeElements(b.shape(), env).value_or(0), pattern);  // see Inputs
      // Poisoned again before every benchmark run, so that the last run's output is its own
      // (scratch is not: it starts poisoned once per request, and what a kernel keeps there
      // between runs cannot stand in for an answer).
      d->set_restore_each_run(true);
    } else {
      const std::string& bytes = inputs.at(b.name());
      const std::string key = absl::StrCat(key_, "/", set, "/", index, "/", b.name());
      if (resident && !bytes.empty() && st_.resident.Holds(sb_->generation(), key)) {
        d->set_resident_key(key);
      } else {
        d->set_data(bytes);
        if (resident && !bytes.empty() &&
            st_.resident.Add(sb_->generation(), key, static_cast<int64_t>(bytes.size()))) {
          d->set_resident_key(key);
        }
      }
      d->set_restore_each_run(b.role() == v1::BUFFER_ROLE_INOUT);
      d->set_check_unchanged(b.role() == v1::BUFFER_ROLE_IN);
    }
  }
  for (const auto& [name, bytes] : scratch) {
    if (inputs_only) break;
    auto* d = out.add_buffers();
    d->set_name(name);
    SetPoison(*d, v1::DTYPE_U8, bytes, pattern);
  }
  return out;
}

Sandbox::CallResult Evaluator::Run::RunCalls(int program, const std::vector<v1::KernelCall>& calls,
                                             std::vector<v1::BufferSet> sets, const Sampling* sampling) {
  v1::SandboxRequest req;
  auto* run = req.mutable_run();
  run->set_mode(sampling != nullptr ? v1::RunRequest::MODE_BENCH : v1::RunRequest::MODE_VALIDATE);
  run->set_program_id(program);
  for (const auto& c : calls) *run->add_calls() = c;
  for (auto& key : st_.resident.TakeDrops()) run->add_drop_resident(std::move(key));
  for (auto& s : sets) *run->add_sets() = std::move(s);  // tens of MB: moved, not copied
  if (sampling != nullptr) {
    run->set_warmup(sampling->warmup);
    run->set_min_samples(sampling->min_samples);
    run->set_max_samples(sampling->max_samples);
    run->set_min_seconds(sampling->min_seconds);
    run->set_target_rel_error(sampling->target_rel_error);
    run->set_race_seconds(sampling->race_seconds);
    run->set_race_samples(sampling->race_samples);
    run->set_race_early_seconds(sampling->race_early_seconds);
    run->set_race_early_samples(sampling->race_early_samples);
    run->set_flush_cache(p_.backend() == v1::BACKEND_CUDA);
  }
  run->set_share_outputs_min_bytes(ev_.options_.share_outputs_min_bytes);
  Sandbox::CallResult r = sb_->Call(req, RunTimeout());
  // A failed run may have stored only some of its inputs: start the sandbox's copies afresh.
  if (!RunSucceeded(r)) st_.resident.Abandon();
  return r;
}

absl::Status Evaluator::Run::EnsureReference(int set, int index) {
  if (torch()) return EnsureTorchReference(set, index);
  if (data_->ref_outputs.contains({set, index}) && data_->ref_generation == sb_->generation()) {
    return absl::OkStatus();
  }
  if (data_->ref_generation != sb_->generation() || data_->ref_program < 0) {
    v1::SandboxRequest req;
    auto* c = req.mutable_compile();
    c->set_source(p_.reference().source());
    for (const auto& [k, v] : p_.reference().defines()) (*c->mutable_defines())[k] = v;
    std::set<std::string> names;
    for (const auto& l : p_.reference().launches()) names.insert(l.kernel());
    for (const auto& n : names) c->add_kernels(n);
    auto r = sb_->Call(req, ev_.options_.compile_timeout_seconds);
    if (r.status != Sandbox::CallStatus::kOk)
      return absl::UnavailableError(absl::StrCat("reference compile: ", r.message));
    if (!r.response.compile().ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the reference does not compile: ", r.response.compile().log()));
    }
    data_->ref_program = r.response.compile().program_id();
    data_->ref_generation = sb_->generation();
  }
  if (data_->ref_outputs.contains({set, index})) return absl::OkStatus();
  auto r = RunCalls(data_->ref_program, ref_calls_[set],
                    {BuildSet(set, index, {}, 0, false, /*resident=*/false)},
                    nullptr);
  if (r.status != Sandbox::CallStatus::kOk)
    return absl::UnavailableError(absl::StrCat("reference run: ", r.message));
  if (r.response.run().outcome() != v1::OUTCOME_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("the reference failed: ", r.response.run().message()));
  }
  std::map<std::string, std::string> outs;
  for (const auto& b : r.response.run().buffers()) {
    for (const auto& pb : p_.buffers()) {
      if (pb.name() == b.name() && pb.role() != v1::BUFFER_ROLE_IN) {
        outs[b.name()] = std::string(r.Bytes(b));
        data_->bytes += static_cast<int64_t>(outs[b.name()].size());
      }
    }
  }
  data_->ref_outputs[{set, index}] = std::move(outs);
  if (r.response.run().samples_seconds_size() > 0) {
    double& t = data_->ref_run_seconds[set];
    t = std::max(t, r.response.run().samples_seconds(0));
  }
  return absl::OkStatus();
}

bool Evaluator::Run::Check(int set, int index, const Sandbox::CallResult& result, int pattern,
                           const char* check_name) {
  const v1::RunResponse& run = result.response.run();
  const auto& inputs = Inputs(set, index);
  const auto& want = data_->ref_outputs.at({set, index});
  std::map<std::string, const v1::BufferData*> got;
  for (const auto& b : run.buffers()) got[b.name()] = &b;
  auto fail = [&](const std::string& buffer, const char* check, const CompareResult* c) {
    auto* e = res_.mutable_errors();
    e->set_buffer(buffer);
    e->set_size_set(p_.size_sets(set).name());
    e->set_trial(index);
    e->set_check(check);
    if (c != nullptr) {
      e->set_max_abs_error(c->max_abs_error);
      e->set_max_rel_error(c->max_rel_error);
      e->set_mismatches(c->mismatches);
      e->set_first_mismatch_index(c->first_mismatch);
    }
    return false;
  };
  for (const auto& b : p_.buffers()) {
    auto it = got.find(b.name());
    if (it == got.end()) return fail(b.name(), "missing", nullptr);
    const std::string_view data = result.Bytes(*it->second);
    if (b.role() == v1::BUFFER_ROLE_IN) {
      // The sandbox vouches for an unchanged input. A kernel that could fake that verdict (one
      // in the sandbox's own address space, as on a CPU OpenCL device) gains nothing: the
      // outputs below are still judged here, against the reference.
      if (!it->second->unchanged() && data != inputs.at(b.name())) {
        CompareResult c = CompareBytes(data, inputs.at(b.name()), b.dtype(), 0, 0);
        return fail(b.name(), "input_modified", &c);
      }
      continue;
    }
    const double atol = p_.check().atol(), rtol = p_.check().rtol();
    CompareResult c = CompareBytes(data, want.at(b.name()), b.dtype(), atol, rtol);
    if (!c.ok) {
      const bool unwritten = IsPoison(data, b.dtype(), c.first_mismatch, pattern);
      return fail(b.name(), unwritten ? "unwritten" : check_name, &c);
    }
    res_.mutable_errors()->set_max_abs_error(
        std::max(res_.errors().max_abs_error(), c.max_abs_error));
    res_.mutable_errors()->set_max_rel_error(
        std::max(res_.errors().max_rel_error(), c.max_rel_error));
  }
  return true;
}

bool Evaluator::Run::ValidationRun(int set, int trial, int pattern, v1::Stage stage, double t0) {
  auto r = RunCalls(cand_program_, cand_calls_[set],
                    {BuildSet(set, trial, cand_scratch_[set], pattern, false, /*resident=*/true)}, nullptr);
  if (!RunSucceeded(r)) {
    EndRunFailure(stage, t0, r);
    return false;
  }
  const auto& run = r.response.run();
  if (run.samples_seconds_size() > 0) {
    cand_run_seconds_.resize(p_.size_sets_size(), 0);
    cand_fastest_run_.resize(p_.size_sets_size(), 0);
    const double t = run.samples_seconds(0);
    cand_run_seconds_[set] = std::max(cand_run_seconds_[set], t);
    cand_fastest_run_[set] = cand_fastest_run_[set] > 0 ? std::min(cand_fastest_run_[set], t) : t;
  }
  if (!Check(set, trial, r, pattern, pattern == 0 ? "tolerance" : "nondeterministic")) {
    const auto& e = res_.errors();
    EndStage(stage, t0, v1::OUTCOME_WRONG_ANSWER,
             absl::StrCat(e.check(), ": buffer ", e.buffer(), " size set ", e.size_set(), " trial ", trial,
                          pattern == 1 ? " (repeat run)" : "", ": ", e.mismatches(), " elements wrong, first at ",
                          e.first_mismatch_index(), ", max abs error ", e.max_abs_error()));
    return false;
  }
  return true;
}

void Evaluator::Run::Execute() {
  if (Prepare()) Benchmark();
}

bool Evaluator::Run::Prepare() {
  auto& clock = ev_.clock_;
  start_ = clock.MonotonicSeconds();
  sb_ = st_.sandbox.get();
  data_ = &Data();
  const int start_generation = sb_->generation();
  res_.mutable_errors()->set_first_mismatch_index(-1);

  // Stage 1: screen (no device involved beyond its limits).
  double t0 = clock.MonotonicSeconds();
  auto hello = sb_->EnsureStarted();
  if (sb_->generation() != start_generation)
    res_.set_sandbox_overhead_seconds(sb_->last_start_seconds());
  if (!hello.ok() || !hello->available()) {
    EndStage(v1::STAGE_SCREEN, t0, v1::OUTCOME_INFRA_ERROR,
             hello.ok() ? hello->unavailable_reason() : std::string(hello.status().message()));
    return false;
  }
  st_.host_device = hello->host_device() ? 1 : 0;
  *res_.mutable_device() = hello->device();
  res_.mutable_device()->set_device_class(
      absl::StrCat(BackendName(p_.backend()), ":", hello->device().name()));
  auto screened = Screen(p_, req_.candidate(), hello->limits(), ev_.options_.screen);
  if (!screened.ok()) {
    EndStage(v1::STAGE_SCREEN, t0, v1::OUTCOME_REJECTED, std::string(screened.status().message()));
    return false;
  }
  std::vector<ResolvedLaunch> all_launches;
  for (const auto& s : screened->sets) {
    auto calls = ToCalls(s.launches, p_);
    if (!calls.ok()) {
      EndStage(v1::STAGE_SCREEN, t0, v1::OUTCOME_REJECTED, std::string(calls.status().message()));
      return false;
    }
    cand_calls_.push_back(*std::move(calls));
    cand_scratch_.push_back(s.scratch_bytes);
    all_launches.insert(all_launches.end(), s.launches.begin(), s.launches.end());
  }
  // The reference's plan is trusted; it is resolved the same way with no limits. (A PyTorch
  // reference has none: its module runs in its own process.)
  auto ref_sets = torch() ? absl::StatusOr<std::vector<ScreenedSizeSet>>(std::vector<ScreenedSizeSet>()) : ResolvePlan(p_, p_.reference(), p_.reference().launches(),
                              p_.reference().scratch(), {}, v1::DeviceLimits(),
                              ScreenOptions{.max_source_bytes = INT64_MAX,
                                            .max_launches = 64,
                                            .max_total_work_items = INT64_MAX,
                                            .max_scratch_bytes =
                                                ev_.options_.problem_limits.max_buffer_bytes});
  if (!ref_sets.ok()) {
    EndStage(v1::STAGE_SCREEN, t0, v1::OUTCOME_INFRA_ERROR,
             absl::StrCat("reference plan: ", ref_sets.status().message()));
    return false;
  }
  for (const auto& s : *ref_sets) {
    auto calls = ToCalls(s.launches, p_);
    if (!calls.ok()) {
      EndStage(v1::STAGE_SCREEN, t0, v1::OUTCOME_INFRA_ERROR,
               std::string(calls.status().message()));
      return false;
    }
    ref_calls_.push_back(*std::move(calls));
  }
  EndStage(v1::STAGE_SCREEN, t0, v1::OUTCOME_OK);

  // Stage 2: compile (in the sandbox; the compiler sees hostile source too).
  t0 = clock.MonotonicSeconds();
  {
    v1::SandboxRequest req;
    auto* c = req.mutable_compile();
    *c = CandidateCompileRequest(req_.candidate().source(), *screened);
    // What a builder compiled while another candidate held the device (compile_ahead.h), else the
    // kernel binary cache, keyed as the sandbox's own compile cache is, with this device and its
    // compiler: what the runtime built from this request before, else a build to keep.
    const bool cache = ev_.binaries_ != nullptr && ev_.options_.binary_wanted != v1::CompileRequest::BINARY_WANTED_NO;
    const std::string binary_key =
        cache || st_.ahead != nullptr ? KernelBinaryKey(*c, p_.backend(), *hello) : std::string();
    std::optional<BuiltKernel> built = st_.ahead != nullptr ? st_.ahead->Take(binary_key) : std::nullopt;
    if (built.has_value()) {
      c->set_binary(built->binary);
    } else if (cache) {
      if (std::optional<std::string> binary = ev_.binaries_->Get(binary_key)) c->set_binary(*std::move(binary));
    }
    // A binary the runtime refuses (another driver) is compiled from source: its build replaces it.
    if (cache) c->set_want_binary(ev_.options_.binary_wanted);
    auto r = sb_->Call(req, ev_.options_.compile_timeout_seconds);
    if (r.status != Sandbox::CallStatus::kOk) {
      EndCallFailure(v1::STAGE_COMPILE, t0, r);
      return false;
    }
    const auto& cr = r.response.compile();
    // Kept: a fresh build's binary, or the builder's that loaded (the sandbox sends none back).
    const bool from_builder = built.has_value() && cr.from_binary();
    const std::string& keep = from_builder && cr.binary().empty() ? built->binary : cr.binary();
    if (cache && cr.ok() && !keep.empty()) {
      if (absl::Status st = ev_.binaries_->Put(binary_key, keep); !st.ok()) {
        ev_.log_->warn("kernel binary not cached: {}", st.message());
      }
    }
    *res_.mutable_resources() = cr.resources();
    // A loaded cubin has no spill count; the builder's compile had one.
    if (from_builder && cr.resources().spill_bytes() < 0) {
      res_.mutable_resources()->set_spill_bytes(built->resources.spill_bytes());
    }
    res_.mutable_resources()->set_source_bytes(
        static_cast<int64_t>(req_.candidate().source().size()));
    if (!cr.ok()) {
      EndStage(v1::STAGE_COMPILE, t0, v1::OUTCOME_COMPILE_ERROR,
               cr.log().empty() ? "compilation failed" : cr.log());
      return false;
    }
    for (const auto& l : all_launches) {
      const auto& block = p_.backend() == v1::BACKEND_CUDA ? l.block : l.local;
      int64_t threads = 1;
      for (int64_t b : block) threads *= b;
      auto it = cr.max_threads().find(l.kernel);
      if (!block.empty() && it != cr.max_threads().end() && it->second > 0 &&
          threads > it->second) {
        EndStage(v1::STAGE_COMPILE, t0, v1::OUTCOME_COMPILE_ERROR,
                 absl::StrCat("kernel ", l.kernel, " can run at most ", it->second,
                              " threads per group with its resource usage, the plan launches ",
                              threads));
        return false;
      }
      if (hello->limits().max_shared_bytes() > 0 &&
          cr.resources().shared_bytes() + l.shared_bytes > hello->limits().max_shared_bytes()) {
        EndStage(v1::STAGE_COMPILE, t0, v1::OUTCOME_COMPILE_ERROR,
                 absl::StrCat("kernel ", l.kernel, " needs ",
                              cr.resources().shared_bytes() + l.shared_bytes,
                              " bytes of shared/local memory (device limit ",
                              hello->limits().max_shared_bytes(), ")"));
        return false;
      }
    }
    cand_program_ = cr.program_id();
    EndStage(v1::STAGE_COMPILE, t0, v1::OUTCOME_OK, from_builder && cr.log().empty() ? built->log : cr.log());
    res_.mutable_stages()->rbegin()->set_cache_hit(cr.cache_hit() || cr.from_binary());
  }

  // Stage 3: validate on fresh inputs; outputs poisoned; a repeat must agree. The repeat of a size
  // set the benchmark times is the benchmark's own last run (poisoned with the repeat's pattern
  // before every run, and checked), or, for a candidate too slow to be timed, a run Benchmark
  // makes: here only for the size sets no benchmark runs.
  t0 = clock.MonotonicSeconds();
  const int generation = sb_->generation();
  for (int set = 0; set < p_.size_sets_size(); ++set) {
    for (int trial = 0; trial < std::max(1, p_.check().trials()); ++trial) {
      if (absl::Status st = EnsureReference(set, trial); !st.ok()) {
        EndStage(v1::STAGE_VALIDATE, t0, v1::OUTCOME_INFRA_ERROR, std::string(st.message()));
        return false;
      }
      if (sb_->generation() != generation) {
        EndStage(v1::STAGE_VALIDATE, t0, v1::OUTCOME_INFRA_ERROR,
                 "sandbox restarted during validation");
        return false;
      }
      const int repeats = trial == 0 && !p_.size_sets(set).bench() ? 2 : 1;
      for (int rep = 0; rep < repeats; ++rep) {
        if (!ValidationRun(set, trial, rep, v1::STAGE_VALIDATE, t0)) return false;
      }
    }
  }
  EndStage(v1::STAGE_VALIDATE, t0, v1::OUTCOME_OK);
  return true;
}

}  // namespace kforge::worker
