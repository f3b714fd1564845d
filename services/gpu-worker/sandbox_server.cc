#include "services/gpu-worker/sandbox_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/gpu-worker/cuda_backend.h"
#include "services/gpu-worker/framing.h"
#include "services/gpu-worker/host_data.h"
#include "services/gpu-worker/opencl_backend.h"
#include "services/gpu-worker/resident_inputs.h"
#include "services/gpu-worker/sample_stats.h"

namespace kforge::worker {

std::unique_ptr<DeviceBackend> MakeBackend(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_OPENCL: return MakeOpenClBackend();
    case v1::BACKEND_CUDA: return MakeCudaBackend();
    default: return nullptr;
  }
}

namespace {

// Device buffers for one buffer set; freed on scope exit.
// Buffers missing from a set are taken from `shared` (set 0): benchmark sets differ only in their
// inputs, so outputs and scratch are shared. Outputs are poisoned again before every benchmark
// run (restore_each_run, on a poison description too): a kernel that skips work after computing
// once leaves poison behind, which the final validation of the last run catches.
class BoundSet {
 public:
  BoundSet(DeviceBackend& b, ResidentStore& store, BoundSet* shared)
      : backend_(b), store_(store), shared_(shared) {}
  // On the paths where the run has failed already; a successful run releases explicitly.
  ~BoundSet() { Release().IgnoreError(); }

  // Zeroes every buffer, then frees it: any of them may hold an answer (a kernel can write its
  // inputs too), except inputs checked to hold what was sent. The first failure to zero is
  // returned; every buffer is freed either way.
  absl::Status Release() {
    absl::Status first;
    for (auto& [name, buf] : bufs_) {
      if (!clean_.contains(name)) {
        if (absl::Status st = backend_.Clear(buf.first, buf.second); !st.ok() && first.ok())
          first = st;
      }
      backend_.Free(buf.first);
    }
    bufs_.clear();
    return first;
  }
  // Re-uploads the buffers a run overwrites in place (inout) so every run sees the same inputs.
  absl::Status Restore() {
    for (const auto& r : restore_) {
      if (absl::Status st = Write(bufs_.at(r.name).first, r); !st.ok()) return st;
    }
    return shared_ != nullptr ? shared_->Restore() : absl::OkStatus();
  }

  absl::Status Upload(const v1::BufferSet& set) {
    for (const auto& b : set.buffers()) {
      Contents c{.name = b.name(), .data = b.data()};
      if (b.has_poison()) {  // ExecuteRun checked every description's size
        // Filled on the device from one element: the poison's bytes never cross to it.
        c.fill = PoisonBytes(b.poison().dtype(), 1, b.poison().pattern());
        c.bytes = static_cast<size_t>(b.poison().elements()) * c.fill.size();
      } else if (!b.resident_key().empty()) {
        auto r = b.data().empty() ? store_.Get(b.resident_key())
                                  : store_.Put(b.resident_key(), b.data());
        if (!r.ok()) return r.status();  // the worker's bookkeeping, not the kernel: an infra error
        c.data = *r;  // the read-only copy: it outlives the request; a kernel writing it faults
      }
      if (c.fill.empty()) {
        c.bytes = c.data.size();
        if (b.check_unchanged()) sent_[b.name()] = c.data;  // poison is never compared
      }
      auto it = bufs_.find(b.name());
      if (it == bufs_.end()) {
        auto d = backend_.Alloc(c.bytes);
        if (!d.ok()) return d.status();
        it = bufs_.emplace(b.name(), std::make_pair(*d, c.bytes)).first;
      }
      if (absl::Status st = Write(it->second.first, c); !st.ok()) return st;
      // Inout inputs, and outputs, are written again before every benchmark run: a kernel that
      // skips work after computing once leaves poison, not an earlier answer, whichever sample is
      // the last.
      if (b.restore_each_run()) restore_.push_back(std::move(c));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<BoundCall>> Bind(const google::protobuf::RepeatedPtrField<v1::KernelCall>& calls) const {
    std::vector<BoundCall> out;
    for (const auto& c : calls) {
      BoundCall bc;
      bc.call = &c;
      for (const auto& a : c.args()) {
        DeviceBuf buf = 0;
        if (a.value_case() == v1::CallArg::kBuffer) {
          const auto* found = Find(a.buffer());
          if (found == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown buffer '", a.buffer(), "'"));
          buf = found->first;
        }
        bc.buffers.push_back(buf);
      }
      out.push_back(std::move(bc));
    }
    return out;
  }
  // Every buffer the set's kernels saw; inputs that still hold what was sent come back as a
  // verdict only.
  // Buffers of at least `share_min_bytes` (> 0) go into `arena` when one is given.
  absl::Status DownloadAll(google::protobuf::RepeatedPtrField<v1::BufferData>* out,
                           int64_t share_min_bytes, OutputArena* arena) {
    std::map<std::string, std::pair<DeviceBuf, size_t>> view;
    if (shared_ != nullptr) view = shared_->bufs_;
    for (const auto& [name, buf] : bufs_) view[name] = buf;
    auto shared = [&](size_t bytes) {
      return arena != nullptr && share_min_bytes > 0 && bytes > 0 &&
             bytes >= static_cast<size_t>(share_min_bytes);
    };
    auto slot = [](size_t bytes) { return (bytes + 63) / 64 * 64; };  // aligned for any element
    size_t total = 0;
    for (const auto& [name, buf] : view) {
      if (shared(buf.second)) total += slot(buf.second);
    }
    if (total > 0) KF_RETURN_IF_ERROR(arena->Reserve(total));
    size_t offset = 0;
    for (const auto& [name, buf] : view) {
      auto* b = out->Add();
      b->set_name(name);
      const bool in_arena = shared(buf.second);
      std::string_view got;
      if (in_arena) {
        char* dst = arena->data() + offset;
        arena->MarkWritten(offset + buf.second);
        KF_RETURN_IF_ERROR(backend_.Download(buf.first, buf.second, dst));
        got = {dst, buf.second};
      } else {
        b->mutable_data()->resize(buf.second);
        KF_RETURN_IF_ERROR(backend_.Download(buf.first, buf.second, b->mutable_data()->data()));
        got = b->data();
      }
      const std::string_view* sent = SentInput(name);
      if (sent != nullptr && *sent == got) {
        b->clear_data();
        b->set_unchanged(true);
        (bufs_.contains(name) ? this : shared_)->clean_.insert(name);
        continue;  // its arena bytes are overwritten by the next buffer, or cleared with the rest
      }
      if (in_arena) {
        b->set_arena_offset(static_cast<int64_t>(offset));
        b->set_arena_bytes(static_cast<int64_t>(buf.second));
        offset += slot(buf.second);
      }
    }
    return absl::OkStatus();
  }

 private:
  const std::string_view* SentInput(const std::string& name) const {
    if (auto it = sent_.find(name); it != sent_.end()) return &it->second;
    return shared_ != nullptr ? shared_->SentInput(name) : nullptr;
  }
  const std::pair<DeviceBuf, size_t>* Find(const std::string& name) const {
    if (auto it = bufs_.find(name); it != bufs_.end()) return &it->second;
    return shared_ != nullptr ? shared_->Find(name) : nullptr;
  }

  DeviceBackend& backend_;
  ResidentStore& store_;
  BoundSet* shared_;
  // What a buffer starts as: bytes (a view into the request or the resident store, both of which
  // outlive this set), or `bytes` of a repeated poison element.
  struct Contents {
    std::string name;
    std::string_view data;
    std::string fill;
    size_t bytes = 0;
  };
  absl::Status Write(DeviceBuf buf, const Contents& c) {
    return c.fill.empty() ? backend_.Upload(buf, c.data) : backend_.Fill(buf, c.bytes, c.fill);
  }

  std::vector<Contents> restore_;
  std::map<std::string, std::string_view> sent_;  // check_unchanged inputs, as sent
  std::map<std::string, std::pair<DeviceBuf, size_t>> bufs_;
  std::set<std::string> clean_;  // inputs found to hold exactly what was sent: nothing to hide
};

// The host copies of a run's buffers, zeroed once sent: memory this process frees may be reused
// by a later candidate's buffers (on a CPU device, kernels run in this process).
void ZeroBufferData(v1::RunResponse& r) {
  for (auto& b : *r.mutable_buffers()) explicit_bzero(b.mutable_data()->data(), b.data().size());
}

// A failed run's results are dropped: zeroed first (clear_buffers keeps the strings' memory, which
// is freed later unzeroed otherwise).
void DropResults(v1::RunResponse& r) {
  ZeroBufferData(r);
  r.clear_buffers();
}

void Fail(v1::RunResponse& r, const absl::Status& st) {
  r.set_outcome(st.code() == absl::StatusCode::kInvalidArgument ? v1::OUTCOME_LAUNCH_ERROR
                : st.code() == absl::StatusCode::kAborted      ? v1::OUTCOME_CRASHED
                                                                : v1::OUTCOME_INFRA_ERROR);
  r.set_message(std::string(st.message()));
}

}  // namespace

v1::RunResponse ExecuteRun(DeviceBackend& backend, ResidentStore& store, const v1::RunRequest& req,
                           OutputArena* arena) {
  v1::RunResponse r;
  for (const auto& key : req.drop_resident()) store.Drop(key);
  if (req.sets().empty()) {
    r.set_outcome(v1::OUTCOME_INFRA_ERROR);
    r.set_message("run request without buffers");
    return r;
  }
  // Poisoned buffers come back in the response: refuse what could not fit in one frame before
  // allocating any of it.
  int64_t poison_bytes = 0;
  for (const auto& set : req.sets()) {
    for (const auto& b : set.buffers()) {
      if (!b.has_poison()) continue;
      auto bytes = PoisonSize(b.poison(), kMaxFrameBytes);
      if (!bytes.ok()) {
        Fail(r, bytes.status());
        return r;
      }
      poison_bytes += *bytes;
      if (poison_bytes > kMaxFrameBytes) {
        Fail(r, absl::InvalidArgumentError(
                    absl::StrCat("outputs of more than ", kMaxFrameBytes, " bytes (poison)")));
        return r;
      }
    }
  }
  std::vector<std::unique_ptr<BoundSet>> sets;
  const int nsets = req.mode() == v1::RunRequest::MODE_BENCH ? req.sets_size() : 1;
  for (int i = 0; i < nsets; ++i) {
    sets.push_back(std::make_unique<BoundSet>(backend, store, i == 0 ? nullptr : sets[0].get()));
    if (absl::Status st = sets.back()->Upload(req.sets(i)); !st.ok()) {
      Fail(r, st);
      return r;
    }
  }
  std::vector<std::vector<BoundCall>> bound;
  for (auto& s : sets) {
    auto b = s->Bind(req.calls());
    if (!b.ok()) {
      Fail(r, b.status());
      return r;
    }
    bound.push_back(*std::move(b));
  }
  if (req.mode() == v1::RunRequest::MODE_VALIDATE) {
    auto t = backend.Launch(req.program_id(), bound[0]);
    if (!t.ok()) {
      Fail(r, t.status());
      return r;
    }
    r.add_samples_seconds(*t);
  } else {
    int last = 0;
    for (int i = 0; i < req.warmup(); ++i) {
      if (absl::Status st = sets[i % nsets]->Restore(); !st.ok()) {
        Fail(r, st);
        return r;
      }
      auto t = backend.Launch(req.program_id(), bound[i % nsets]);
      if (!t.ok()) {
        Fail(r, t.status());
        return r;
      }
      last = i % nsets;
    }
    double total = 0;
    double fastest = 0;
    const int max_samples = std::max(req.max_samples(), std::max(req.min_samples(), 1));
    // Racing: once `after` samples are in, even the fastest is slower than `bar` (0 = off).
    const auto over = [&](double bar, int after, int taken) {
      return bar > 0 && taken >= std::max(1, after) && fastest > bar;
    };
    for (int i = 0; i < max_samples; ++i) {
      if (i >= req.min_samples() &&
          (total >= req.min_seconds() ||
           (req.target_rel_error() > 0 &&
            MedianRelError({r.samples_seconds().begin(), r.samples_seconds().end()}) <= req.target_rel_error()))) {
        break;
      }
      if (over(req.race_seconds(), req.race_samples(), i) ||
          over(req.race_early_seconds(), req.race_early_samples(), i)) {
        r.set_raced(true);
        break;
      }
      if (req.flush_cache()) backend.FlushCache();
      last = i % nsets;
      if (absl::Status st = sets[last]->Restore(); !st.ok()) {
        Fail(r, st);
        return r;
      }
      auto t = backend.Launch(req.program_id(), bound[last]);
      if (!t.ok()) {
        Fail(r, t.status());
        return r;
      }
      r.add_samples_seconds(*t);
      total += *t;
      fastest = i == 0 ? *t : std::min(fastest, *t);
    }
    r.set_last_set(last);
  }
  const int returned = r.last_set();
  if (absl::Status st =
          sets[returned]->DownloadAll(r.mutable_buffers(), req.share_outputs_min_bytes(), arena);
      !st.ok()) {
    DropResults(r);
    Fail(r, st);
    return r;
  }
  // Set 0 last: the others share its buffers.
  for (auto it = sets.rbegin(); it != sets.rend(); ++it) {
    if (absl::Status st = (*it)->Release(); !st.ok()) {
      // A device that cannot be cleared may still hold this run's answers: crashed, so that the
      // worker replaces this process.
      DropResults(r);
      Fail(r, absl::AbortedError(absl::StrCat("clearing buffers after the run: ", st.message())));
      return r;
    }
  }
  r.set_outcome(v1::OUTCOME_OK);
  return r;
}

namespace {

// Moves this process's RLIMIT_CPU soft limit to the CPU time it has used plus `seconds` (only the
// soft limit: a process may set it anywhere below the hard one, and lower it again later).
void LimitOwnCpu(double seconds) {
  if (seconds <= 0 || !std::isfinite(seconds)) return;
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return;
  const double used = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                      static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  rlimit old{};
  if (getrlimit(RLIMIT_CPU, &old) != 0) return;
  const rlim_t soft = static_cast<rlim_t>(used + seconds + 5);
  const rlimit lim{old.rlim_max == RLIM_INFINITY ? soft : std::min(soft, old.rlim_max), old.rlim_max};
  setrlimit(RLIMIT_CPU, &lim);
}

}  // namespace

int ServeSandbox(int in_fd, int out_fd, const BackendFactory& factory, const AfterOpenFn& after_open) {
  std::unique_ptr<DeviceBackend> backend;
  bool opened = false;
  ResidentStore resident;
  OutputArena arena;
  while (true) {
    v1::SandboxRequest req;
    absl::Status st = ReadFrame(in_fd, &req);
    if (absl::IsNotFound(st)) return 0;  // the worker closed the pipe
    if (!st.ok()) return 3;
    // What the last run left in the arena, the worker has read by now: no kernel of this request
    // may find it.
    arena.Clear();
    LimitOwnCpu(req.cpu_limit_seconds());
    v1::SandboxResponse resp;
    bool exit_after = false;
    switch (req.kind_case()) {
      case v1::SandboxRequest::kHello:
        backend = factory(req.hello().backend());
        if (backend == nullptr) {
          resp.mutable_hello()->set_unavailable_reason("backend not built into this binary");
        } else {
          *resp.mutable_hello() = backend->Init();
          if (!resp.hello().available()) backend.reset();
        }
        // Restricted whether or not a device opened: compile requests are refused without one,
        // but nothing after the hello runs unrestricted.
        if (!opened && after_open) {
          opened = true;
          if (absl::Status st = after_open(resp.mutable_hello()); !st.ok()) {
            backend.reset();
            resp.mutable_hello()->set_available(false);
            resp.mutable_hello()->set_unavailable_reason(std::string(st.message()));
            (void)WriteFrame(out_fd, resp, false, {});
            return kExitNotJailed;
          }
        }
        break;
      case v1::SandboxRequest::kCompile:
        if (backend == nullptr) {
          resp.set_error("no device opened");
        } else {
          *resp.mutable_compile() = backend->Compile(req.compile());
        }
        break;
      case v1::SandboxRequest::kRun:
        if (backend == nullptr) {
          resp.set_error("no device opened");
        } else {
          // Swapped in, not copied: every copy of the results is one to zero.
          v1::RunResponse run = ExecuteRun(*backend, resident, req.run(), &arena);
          resp.mutable_run()->Swap(&run);
          // A sticky device error poisons the context: report it, then let the worker respawn us.
          exit_after = resp.run().outcome() == v1::OUTCOME_CRASHED;
        }
        break;
      default:
        resp.set_error("unknown request");
    }
    std::vector<int> fds;
    OwnedFd new_arena = arena.TakeNewFile();  // closed once sent: the mapping is all we keep
    if (new_arena.valid()) fds.push_back(new_arena.get());
    const bool sent = WriteFrame(out_fd, resp, /*zero_after_write=*/resp.has_run(), fds).ok();
    if (resp.has_run()) ZeroBufferData(*resp.mutable_run());
    if (!sent) return 3;
    if (exit_after) return 4;
  }
}

}  // namespace kforge::worker
