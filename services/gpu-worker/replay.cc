#include "services/gpu-worker/replay.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/param_space.h"

namespace kforge::worker {

absl::StatusOr<std::shared_ptr<const ReplayEvaluator::Loaded>> ReplayEvaluator::Get(const v1::Problem& problem) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& path = problem.replay().cache_path();
  if (auto it = caches_.find(path); it != caches_.end()) return it->second;
  auto cache = LoadKtCache(path, problem.replay().cache_file());
  if (!cache.ok()) return cache.status();
  auto loaded = std::make_shared<Loaded>();
  loaded->cache = *std::move(cache);
  auto space = ParamSpace::Create(problem);
  std::optional<KtEntry> def;
  if (space.ok()) {
    if (auto a = space->DefaultAssignment(); a.has_value()) def = loaded->cache.Find(*a);
  }
  if (def.has_value() && def->ok) {
    loaded->reference_ms = def->time_ms;
  } else {
    std::vector<double> times;
    for (const auto& [k, e] : loaded->cache.entries) {
      if (e.ok) times.push_back(e.time_ms);
    }
    if (times.empty()) return absl::InvalidArgumentError("replay cache has no valid configuration");
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    loaded->reference_ms = times[times.size() / 2];
  }
  if (caches_.size() >= 16) caches_.erase(caches_.begin());  // requests choose the paths: bounded
  caches_[path] = loaded;
  return std::shared_ptr<const Loaded>(loaded);
}

void ReplayEvaluator::Evaluate(const v1::EvaluationRequest& req, v1::EvaluationResult* r) {
  auto* screen = r->add_stages();
  screen->set_stage(v1::STAGE_SCREEN);
  auto loaded = Get(req.problem());
  if (!loaded.ok()) {
    screen->set_outcome(v1::OUTCOME_INFRA_ERROR);
    screen->set_message(std::string(loaded.status().message()));
    r->set_outcome(v1::OUTCOME_INFRA_ERROR);
    r->set_message(screen->message());
    return;
  }
  const ParamAssignment a(req.candidate().params().begin(), req.candidate().params().end());
  auto space = ParamSpace::Create(req.problem());
  auto valid = space.ok() ? space->IsValid(a) : absl::StatusOr<bool>(space.status());
  std::optional<KtEntry> e = (*loaded)->cache.Find(a);
  if (!valid.ok() || !*valid || !e.has_value() || !e->recorded()) {
    screen->set_outcome(v1::OUTCOME_REJECTED);
    screen->set_message(absl::StrCat("configuration ", FormatParams(a),
                                     !valid.ok() || !*valid ? " is outside the declared space"
                                                            : " is not a valid configuration of the recorded space"));
    r->set_outcome(v1::OUTCOME_REJECTED);
    r->set_message(screen->message());
    return;
  }
  screen->set_outcome(v1::OUTCOME_OK);
  auto* compile = r->add_stages();
  compile->set_stage(v1::STAGE_COMPILE);
  compile->set_duration_seconds(e->compile_ms * 1e-3);
  if (!e->ok && e->failure == "CompilationFailedConfig") {
    compile->set_outcome(v1::OUTCOME_COMPILE_ERROR);
    compile->set_message("recorded compilation failure");
    r->set_outcome(v1::OUTCOME_COMPILE_ERROR);
    r->set_message(compile->message());
    return;
  }
  compile->set_outcome(v1::OUTCOME_OK);
  auto* bench = r->add_stages();
  bench->set_stage(v1::STAGE_BENCHMARK);
  bench->set_duration_seconds(e->benchmark_ms * 1e-3);
  if (!e->ok) {
    bench->set_outcome(v1::OUTCOME_LAUNCH_ERROR);
    bench->set_message(absl::StrCat("recorded failure: ", e->failure));
    r->set_outcome(v1::OUTCOME_LAUNCH_ERROR);
    r->set_message(bench->message());
    return;
  }
  bench->set_outcome(v1::OUTCOME_OK);
  auto* t = r->add_timings();
  t->set_size_set(req.problem().size_sets_size() > 0 ? req.problem().size_sets(0).name() : "default");
  for (auto* s : {t->mutable_candidate()}) {
    s->set_median_seconds(e->time_ms * 1e-3);
    s->set_min_seconds(e->time_ms * 1e-3);
    s->set_p20_seconds(e->time_ms * 1e-3);
    s->set_p80_seconds(e->time_ms * 1e-3);
    s->set_samples(1);
  }
  t->mutable_reference()->set_median_seconds((*loaded)->reference_ms * 1e-3);
  t->mutable_reference()->set_samples(1);
  t->set_speedup((*loaded)->reference_ms / e->time_ms);
  r->set_speedup(t->speedup());
  r->set_outcome(v1::OUTCOME_OK);
  auto* dev = r->mutable_device();
  dev->set_backend(v1::BACKEND_REPLAY);
  dev->set_name((*loaded)->cache.device_name);
  dev->set_device_class(absl::StrCat("replay:", (*loaded)->cache.device_name));
}

}  // namespace kforge::worker
