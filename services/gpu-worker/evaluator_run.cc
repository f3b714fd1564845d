// One evaluation through the pipeline: screen, compile, validate, benchmark (Evaluator::Run).

#include "services/gpu-worker/evaluator_run.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "services/gpu-worker/host_data.h"
#include "services/gpu-worker/kernel_calls.h"
#include "services/gpu-worker/sample_stats.h"

namespace kforge::worker {

namespace {

// A candidate whose fastest validation run took this many times the job's best time on a size set
// is not benchmarked there (racing on).
constexpr double kSkipBenchmarkFactor = 4;

v1::TimingStats Stats(std::vector<double> s) {
  v1::TimingStats t;
  if (s.empty()) return t;
  std::sort(s.begin(), s.end());
  t.set_median_seconds(SortedMedian(s));
  t.set_min_seconds(s.front());
  t.set_p20_seconds(SortedQuantile(s, 0.2));
  t.set_p80_seconds(SortedQuantile(s, 0.8));
  t.set_samples(static_cast<int32_t>(s.size()));
  return t;
}

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
    // CheckRequest refused a problem with a shape that does not evaluate; were one to get here, it
    // would get an empty buffer (and fail its checks), not take the worker down.
    const int64_t n = ShapeElements(b.shape(), env).value_or(0);
    bufs[b.name()] = FillBytes(b.dtype(), n, b.fill(), rng);
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
  double timeout =
      req_.timeout_seconds() > 0 ? req_.timeout_seconds() : ev_.options_.run_timeout_seconds;
  Sandbox::CallResult r = sb_->Call(req, timeout);
  // A failed run may have stored only some of its inputs: start the sandbox's copies afresh.
  if (!RunSucceeded(r)) st_.resident.Abandon();
  return r;
}

absl::Status Evaluator::Run::EnsureReference(int set, int index) {
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

absl::StatusOr<v1::TimingStats> Evaluator::Run::ReferenceTiming(int set,
                                                                const std::vector<int>& indices) {
  if (data_->ref_timing_generation != sb_->generation()) {
    data_->ref_timing.clear();
    data_->ref_timing_generation = sb_->generation();
  }
  if (auto it = data_->ref_timing.find(set); it != data_->ref_timing.end()) return it->second;
  auto it = data_->ref_run_seconds.find(set);
  const Sampling sampling = Capped(ReferenceSampling(), it == data_->ref_run_seconds.end() ? 0 : it->second);
  KF_ASSIGN_OR_RETURN(std::vector<double> samples, TimeReference(set, indices, sampling));
  return data_->ref_timing[set] = Stats(std::move(samples));
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
  // The reference's plan is trusted; it is resolved the same way with no limits.
  auto ref_sets = ResolvePlan(p_, p_.reference(), p_.reference().launches(),
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
    c->set_source(req_.candidate().source());
    for (const auto& [k, v] : screened->defines) (*c->mutable_defines())[k] = v;
    for (const auto& n : KernelNames(all_launches)) c->add_kernels(n);
    auto r = sb_->Call(req, ev_.options_.compile_timeout_seconds);
    if (r.status != Sandbox::CallStatus::kOk) {
      EndCallFailure(v1::STAGE_COMPILE, t0, r);
      return false;
    }
    const auto& cr = r.response.compile();
    *res_.mutable_resources() = cr.resources();
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
    EndStage(v1::STAGE_COMPILE, t0, v1::OUTCOME_OK, cr.log().empty() ? "" : cr.log());
    res_.mutable_stages()->rbegin()->set_cache_hit(cr.cache_hit());
  }

  // Stage 3: validate on fresh inputs; outputs poisoned; a repeat must agree.
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
      const int repeats = trial == 0 ? 2 : 1;
      for (int rep = 0; rep < repeats; ++rep) {
        auto r = RunCalls(cand_program_, cand_calls_[set],
                          {BuildSet(set, trial, cand_scratch_[set], rep, false, /*resident=*/true)},
                          nullptr);
        if (!RunSucceeded(r)) {
          EndRunFailure(v1::STAGE_VALIDATE, t0, r);
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
        if (!Check(set, trial, r, rep, rep == 0 ? "tolerance" : "nondeterministic")) {
          const auto& e = res_.errors();
          EndStage(v1::STAGE_VALIDATE, t0, v1::OUTCOME_WRONG_ANSWER,
                   absl::StrCat(e.check(), ": buffer ", e.buffer(), " size set ", e.size_set(),
                                " trial ", trial, rep == 1 ? " (repeat run)" : "", ": ",
                                e.mismatches(), " elements wrong, first at ",
                                e.first_mismatch_index(), ", max abs error ", e.max_abs_error()));
          return false;
        }
      }
    }
  }
  EndStage(v1::STAGE_VALIDATE, t0, v1::OUTCOME_OK);
  return true;
}

void Evaluator::Run::Benchmark() {
  auto& clock = ev_.clock_;
  // Stage 4: benchmark reference and candidate in this sandbox lifetime, rotating inputs, then
  // validate what the last timed run wrote.
  const double t0 = clock.MonotonicSeconds();
  double log_sum = 0;
  int bench_sets = 0;
  for (int set = 0; set < p_.size_sets_size(); ++set) {
    if (!p_.size_sets(set).bench()) continue;
    auto indices = BenchIndices(set);
    if (!indices.ok()) {
      EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_INFRA_ERROR, std::string(indices.status().message()));
      return;
    }
    auto ref = ReferenceTiming(set, *indices);
    if (!ref.ok()) {
      EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_INFRA_ERROR,
               std::string(ref.status().message()));
      return;
    }
    // Racing: the time the job's best would take here, from its speedup over this reference on
    // this size set (the geometric mean over sets when the request has no per-set speedups).
    Sampling sampling = CandidateSampling();
    double best = req_.best_speedup();
    if (auto it = req_.best_set_speedups().find(p_.size_sets(set).name());
        it != req_.best_set_speedups().end() && it->second > 0) {
      best = it->second;
    }
    const double best_seconds = best > 0 ? ref->median_seconds() / best : 0;
    if (best_seconds > 0 && ev_.options_.race_factor > 0) {
      sampling.race_seconds = best_seconds * ev_.options_.race_factor;
      sampling.race_samples = ev_.options_.race_samples;
      if (ev_.options_.race_early_factor > 0) {
        sampling.race_early_seconds = best_seconds * ev_.options_.race_early_factor;
        sampling.race_early_samples = ev_.options_.race_early_samples;
      }
    }
    sampling = Capped(
        sampling, set < static_cast<int>(cand_run_seconds_.size()) ? cand_run_seconds_[set] : 0);
    std::vector<double> samples;
    bool raced = false;
    const double fastest = set < static_cast<int>(cand_fastest_run_.size()) ? cand_fastest_run_[set] : 0;
    if (sampling.race_seconds > 0 && fastest > kSkipBenchmarkFactor * best_seconds) {
      // Its validation runs were already far slower than the best (a margin for their differences
      // from a timed sample: no warm-up, no cache flush, fresh inputs): not worth a benchmark, its
      // fastest run stands for it.
      samples = {fastest};
      raced = true;
    } else if (!TimeCandidate(set, *indices, sampling, t0, &samples, &raced)) {
      return;
    }
    auto* t = res_.add_timings();
    t->set_size_set(p_.size_sets(set).name());
    *t->mutable_candidate() = Stats(std::move(samples));
    *t->mutable_reference() = *ref;
    t->set_raced(raced);
    const double cand = t->candidate().median_seconds();
    t->set_speedup(cand > 0 ? ref->median_seconds() / cand : 0);
    if (t->speedup() > 0) {
      log_sum += std::log(t->speedup());
      ++bench_sets;
    }
  }
  res_.set_speedup(bench_sets > 0 ? std::exp(log_sum / bench_sets) : 0);
  EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_OK);
  res_.set_outcome(v1::OUTCOME_OK);
  res_.set_total_seconds(clock.MonotonicSeconds() - start_);
}

absl::StatusOr<std::vector<int>> Evaluator::Run::BenchIndices(int set) {
  std::vector<int> indices;
  for (int i = 0; i < std::max(1, ev_.options_.bench_input_sets); ++i) {
    KF_RETURN_IF_ERROR(EnsureReference(set, i));
    indices.push_back(i);
  }
  return indices;
}

Evaluator::Run::Sampling Evaluator::Run::ReferenceSampling() const {
  const EvaluatorOptions& o = ev_.options_;
  return Sampling{.warmup = o.warmup, .min_samples = o.min_samples, .max_samples = o.max_samples,
                  .min_seconds = o.min_bench_seconds};
}

Evaluator::Run::Sampling Evaluator::Run::Capped(Sampling s, double run_seconds) const {
  // A kernel that takes seconds per run gets fewer samples (at least 3) rather than a timeout: its
  // validation run said how long one takes.
  const double cap = ev_.options_.max_bench_seconds;
  if (run_seconds <= 0 || cap <= 0) return s;
  const double fit = std::floor(cap / run_seconds);
  if (fit < s.max_samples) {
    s.max_samples = static_cast<int>(std::max(3.0, fit));
    s.min_samples = std::min(s.min_samples, s.max_samples);
    s.race_samples = std::min(s.race_samples, s.max_samples);
    s.race_early_samples = std::min(s.race_early_samples, s.max_samples);
  }
  if (run_seconds * s.warmup > cap / 2) s.warmup = std::min(s.warmup, 1);
  return s;
}

Evaluator::Run::Sampling Evaluator::Run::RoundSampling(int set, bool reference) const {
  Sampling s{.warmup = 1, .min_samples = ev_.options_.confirm_samples, .max_samples = ev_.options_.confirm_samples};
  double run_seconds = 0;
  if (reference) {
    auto it = data_->ref_run_seconds.find(set);
    run_seconds = it == data_->ref_run_seconds.end() ? 0 : it->second;
  } else if (set < static_cast<int>(cand_run_seconds_.size())) {
    run_seconds = cand_run_seconds_[set];
  }
  const double cap = ev_.options_.max_bench_seconds / 3;
  if (run_seconds > 0 && run_seconds * (s.max_samples + s.warmup) > cap) {
    s.max_samples = s.min_samples = static_cast<int>(std::max(1.0, std::floor(cap / run_seconds)));
    s.warmup = run_seconds * (s.max_samples + 1) > cap ? 0 : 1;
  }
  return s;
}

Evaluator::Run::Sampling Evaluator::Run::CandidateSampling() const {
  Sampling s = ReferenceSampling();
  s.target_rel_error = ev_.options_.bench_rel_error;
  return s;
}

absl::StatusOr<std::vector<double>> Evaluator::Run::TimeReference(int set, const std::vector<int>& indices,
                                                                  const Sampling& sampling) {
  std::vector<v1::BufferSet> sets;
  for (int i : indices)
    sets.push_back(BuildSet(set, i, {}, 0, /*inputs_only=*/i != indices[0], /*resident=*/true));
  auto r = RunCalls(data_->ref_program, ref_calls_[set], std::move(sets), &sampling);
  if (!RunSucceeded(r)) {
    return absl::UnavailableError(
        absl::StrCat("reference benchmark: ", r.message, r.response.run().message()));
  }
  return std::vector<double>(r.response.run().samples_seconds().begin(), r.response.run().samples_seconds().end());
}

bool Evaluator::Run::TimeCandidate(int set, const std::vector<int>& indices, const Sampling& sampling, double t0,
                                   std::vector<double>* samples, bool* raced) {
  std::vector<v1::BufferSet> sets;
  for (int i : indices) {
    sets.push_back(BuildSet(set, i, cand_scratch_[set], 0, /*inputs_only=*/i != indices[0],
                            /*resident=*/true));
  }
  auto r = RunCalls(cand_program_, cand_calls_[set], std::move(sets), &sampling);
  if (!RunSucceeded(r)) {
    EndRunFailure(v1::STAGE_BENCHMARK, t0, r);
    return false;
  }
  const auto& run = r.response.run();
  if (!Check(set, indices[run.last_set()], r, 0, "stale")) {
    const auto& e = res_.errors();
    EndStage(v1::STAGE_BENCHMARK, t0, v1::OUTCOME_WRONG_ANSWER,
             absl::StrCat(e.check(), ": the last timed run left wrong results in ", e.buffer(),
                          " (size set ", e.size_set(), "): ", e.mismatches(), " elements wrong"));
    return false;
  }
  samples->assign(run.samples_seconds().begin(), run.samples_seconds().end());
  *raced = run.raced();
  return true;
}

}  // namespace kforge::worker
