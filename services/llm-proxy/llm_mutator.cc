#include "services/llm-proxy/llm_mutator.h"

#include "common/problem_loader.h"
#include "common/utf8.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <thread>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/problem_loader.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"
#include "nlohmann/json.hpp"
#include "services/llm-proxy/edit_parser.h"
#include "services/llm-proxy/prompt_builder.h"

namespace kforge::llm {

absl::StatusOr<std::unique_ptr<ResponseCache>> ResponseCache::Open(const std::string& path) {
  auto cache = std::make_unique<ResponseCache>();
  cache->path_ = path;
  if (path.empty()) return cache;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder, not a replies file"));
  }
  cache->file_.open(path, std::ios::app);
  if (!cache->file_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write the replies file ", path, ": ", std::strerror(errno)));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the replies file ", path, ": ", std::strerror(errno)));
  }
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("key") || !j["key"].is_string() || !j.contains("text") ||
        !j["text"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not a cache record"));
    }
    cache->entries_[j["key"].get<std::string>()] = j["text"].get<std::string>();
  }
  return cache;
}

std::optional<std::string> ResponseCache::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  ++hits_;
  return it->second;
}

bool ResponseCache::Contains(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.contains(key);
}

void ResponseCache::Put(const std::string& key, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = text;
  if (file_.is_open()) {
    file_ << nlohmann::json{{"key", key}, {"text", text}}.dump() << "\n";
    file_.flush();
  }
}

absl::StatusOr<std::string> ReplyCacheFileIn(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create the folder ", dir, ": ", ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " is not a folder"));
  }
  const std::string file = (std::filesystem::path(dir) / "replies.jsonl").string();
  std::ofstream probe(file, std::ios::app);
  if (!probe) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write ", file, ": ", std::strerror(errno)));
  }
  return file;
}

std::string ReplyCacheKey(const ProviderConfig& provider, const v1::MutateRequest& req, uint64_t sample,
                          bool whole_file) {
  const v1::Problem& problem = req.problem();
  std::string material = absl::StrCat(
      "kforge reply key ", kReplyKeyVersion, "\nmodel ", provider.model, "\ntemperature ",
      provider.temperature, "\nsample ", sample, "\nwhole_file ", whole_file ? 1 : 0, "\nproblem ",
      problem.content_hash().empty() ? HashProblem(problem) : problem.content_hash());
  auto add = [&material](const char* role, const v1::Candidate& c) {
    absl::StrAppend(&material, "\n", role, " ",
                    c.content_hash().empty() ? HashCandidate(c) : c.content_hash());
  };
  for (const auto& p : req.parents()) add("parent", p.candidate());
  for (const auto& i : req.inspirations()) add("inspiration", i.candidate());
  return Sha256Hex(material);
}

absl::StatusOr<LlmConfig> LoadLlmConfig(const std::string& path) {
  KF_ASSIGN_OR_RETURN(YamlNode root, LoadYamlFile(path));
  if (!root.is_map()) return root.Error("an LLM config must be a map with providers");
  KF_RETURN_IF_ERROR(root.CheckKeys({"providers", "probability", "cache_file"}));
  LlmConfig cfg;
  if (root.Child("probability").defined()) {
    KF_ASSIGN_OR_RETURN(cfg.probability, root.Child("probability").AsDouble());
    if (cfg.probability < 0 || cfg.probability > 1) return root.Child("probability").Error("must be between 0 and 1");
  }
  if (root.Child("cache_file").defined()) {
    KF_ASSIGN_OR_RETURN(cfg.cache_file, root.Child("cache_file").AsString());
  }
  KF_ASSIGN_OR_RETURN(auto items, root.Child("providers").Items());
  if (items.empty()) return root.Child("providers").Error("no providers given");
  for (const auto& item : items) {
    KF_RETURN_IF_ERROR(item.CheckKeys({"name", "kind", "base_url", "model", "api_key_env", "api_key_file",
                                       "headers", "weight", "temperature", "max_output_tokens", "context_tokens",
                                       "timeout_seconds", "max_retries", "input_usd_per_mtok",
                                       "output_usd_per_mtok", "max_concurrency", "requests_per_minute",
                                       "tokens_per_minute"}));
    ProviderConfig p;
    KF_ASSIGN_OR_RETURN(p.kind, item.Child("kind").AsString());
    if (p.kind != "openai" && p.kind != "anthropic") {
      return item.Child("kind").Error(absl::StrCat("unknown provider kind '", p.kind, "' (expected openai or anthropic)"));
    }
    KF_ASSIGN_OR_RETURN(p.base_url, item.Child("base_url").AsString());
    KF_ASSIGN_OR_RETURN(p.model, item.Child("model").AsString());
    p.name = item.Child("name").defined() ? item.Child("name").AsString().value_or(p.model) : p.model;
    if (item.Child("api_key_env").defined()) {
      KF_ASSIGN_OR_RETURN(std::string var, item.Child("api_key_env").AsString());
      const char* v = std::getenv(var.c_str());
      if (v == nullptr || *v == '\0') return item.Child("api_key_env").Error(absl::StrCat("environment variable ", var, " is not set"));
      p.api_key = v;
    } else if (item.Child("api_key_file").defined()) {
      KF_ASSIGN_OR_RETURN(std::string file, item.Child("api_key_file").AsString());
      std::ifstream in(file);
      if (!in) return item.Child("api_key_file").Error(absl::StrCat("cannot read ", file));
      std::getline(in, p.api_key);
    }
    if (item.Child("headers").defined()) {
      KF_ASSIGN_OR_RETURN(auto hs, item.Child("headers").Entries());
      for (const auto& [k, v] : hs) {
        KF_ASSIGN_OR_RETURN(std::string value, v.AsString());
        p.extra_headers[k] = value;
      }
    }
    auto num = [&](const char* key, double* out, double lo, double hi) -> absl::Status {
      if (!item.Child(key).defined()) return absl::OkStatus();
      KF_ASSIGN_OR_RETURN(*out, item.Child(key).AsDouble());
      if (*out < lo || *out > hi) return item.Child(key).Error(absl::StrCat("must be between ", lo, " and ", hi));
      return absl::OkStatus();
    };
    double max_out = static_cast<double>(p.max_output_tokens), ctx = static_cast<double>(p.context_tokens),
           retries = p.max_retries, conc = p.max_concurrency;
    KF_RETURN_IF_ERROR(num("weight", &p.weight, 0, 1e6));
    KF_RETURN_IF_ERROR(num("temperature", &p.temperature, 0, 2));
    KF_RETURN_IF_ERROR(num("max_output_tokens", &max_out, 16, 1e6));
    KF_RETURN_IF_ERROR(num("context_tokens", &ctx, 256, 1e7));
    KF_RETURN_IF_ERROR(num("timeout_seconds", &p.timeout_seconds, 0.1, 3600));
    KF_RETURN_IF_ERROR(num("max_retries", &retries, 0, 20));
    KF_RETURN_IF_ERROR(num("input_usd_per_mtok", &p.input_usd_per_mtok, 0, 1e4));
    KF_RETURN_IF_ERROR(num("output_usd_per_mtok", &p.output_usd_per_mtok, 0, 1e4));
    KF_RETURN_IF_ERROR(num("max_concurrency", &conc, 1, 1024));
    KF_RETURN_IF_ERROR(num("requests_per_minute", &p.requests_per_minute, 0, 1e7));
    KF_RETURN_IF_ERROR(num("tokens_per_minute", &p.tokens_per_minute, 0, 1e10));
    p.max_concurrency = static_cast<int>(conc);
    p.max_output_tokens = static_cast<int64_t>(max_out);
    p.context_tokens = static_cast<int64_t>(ctx);
    p.max_retries = static_cast<int>(retries);
    if (p.context_tokens <= p.max_output_tokens) {
      return item.Child("context_tokens").Error("must exceed max_output_tokens (room for the prompt)");
    }
    cfg.providers.push_back(std::move(p));
  }
  return cfg;
}

LlmMutator::LlmMutator(std::vector<std::unique_ptr<Provider>> providers, ResponseCache& cache, Logger log,
                       ProxyMetrics* metrics, Clock* clock, BreakerOptions breaker)
    : providers_(std::move(providers)),
      cache_(cache),
      log_(std::move(log)),
      metrics_(metrics),
      clock_(clock != nullptr ? *clock : own_clock_) {
  for (const auto& p : providers_) {
    breakers_.push_back(std::make_unique<CircuitBreaker>(breaker, clock_));
    if (metrics_ != nullptr) metrics_->SetBreakerOpen(p->config().name, p->config().model, false);
  }
}

std::optional<std::string> LlmMutator::OverAllowance(const Provider& provider, const Prompt& prompt,
                                                     const v1::MutateRequest& req,
                                                     const v1::MutateResponse& spent) const {
  if (req.llm_tokens_left() <= 0 && req.llm_cost_usd_left() <= 0) return std::nullopt;
  int64_t spent_tokens = 0;
  double spent_cost = 0;
  for (const auto& u : spent.usage()) {
    spent_tokens += u.input_tokens() + u.output_tokens();
    spent_cost += u.cost_usd();
  }
  const ProviderConfig& c = provider.config();
  const int64_t in = EstimateTokens(prompt.system) + EstimateTokens(prompt.user);
  const int64_t worst_tokens = in + c.max_output_tokens;
  const double worst_cost =
      (static_cast<double>(in) * c.input_usd_per_mtok + static_cast<double>(c.max_output_tokens) * c.output_usd_per_mtok) /
      1e6;
  if (req.llm_tokens_left() > 0 && spent_tokens + worst_tokens > req.llm_tokens_left()) {
    return absl::StrCat("a call to ", c.name, " could use ", worst_tokens, " tokens and the job has ",
                        req.llm_tokens_left() - spent_tokens, " left");
  }
  if (req.llm_cost_usd_left() > 0 && spent_cost + worst_cost > req.llm_cost_usd_left()) {
    return absl::StrFormat("a call to %s could cost %.4f USD and the job has %.4f USD left", c.name, worst_cost,
                           req.llm_cost_usd_left() - spent_cost);
  }
  return std::nullopt;
}

absl::StatusOr<std::string> LlmMutator::Ask(Provider& provider, const std::string& system, const std::string& user,
                                            const std::string& key, v1::MutateResponse* resp,
                                            const CancelledFn& cancelled) {
  const ProviderConfig& c = provider.config();
  auto* usage = resp->add_usage();
  usage->set_provider(c.name);
  usage->set_model(c.model);
  if (auto hit = cache_.Get(key); hit.has_value()) {
    usage->set_cache_hit(true);
    if (metrics_ != nullptr) metrics_->RecordCacheHit(c.name, c.model);
    return *hit;
  }
  ChatRequest req{system, user, c.temperature, c.max_output_tokens};
  auto r = provider.Complete(req, cancelled);
  if (metrics_ != nullptr) metrics_->RecordModelCall(c.name, c.model, r.ok() ? &*r : nullptr);
  if (!r.ok()) return r.status();
  usage->set_input_tokens(r->input_tokens);
  usage->set_output_tokens(r->output_tokens);
  usage->set_cost_usd(r->cost_usd);
  usage->set_latency_seconds(r->latency_seconds);
  usage->set_retries(r->retries);
  cache_.Put(key, r->text);
  return r->text;
}

absl::Status LlmMutator::CheckPromptFits(const v1::Problem& problem) const {
  v1::MutateRequest req;
  *req.mutable_problem() = problem;
  auto* parent = req.add_parents();
  parent->mutable_candidate()->set_source(problem.seed().source());
  *parent->mutable_candidate()->mutable_params() = {};
  parent->mutable_result()->set_outcome(v1::OUTCOME_COMPILE_ERROR);
  parent->mutable_result()->set_message(std::string(2048, 'x'));  // the longest feedback a worker sends
  for (const auto& p : providers_) {
    const int64_t budget = p->config().context_tokens - p->config().max_output_tokens;
    for (bool whole : {false, true}) {
      auto prompt = BuildPrompt(req, budget, whole, std::string(200, 'x'));
      if (!prompt.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("provider ", p->config().name, " (context ",
                                                          p->config().context_tokens, " tokens, ",
                                                          p->config().max_output_tokens, " for the reply): ",
                                                          prompt.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::MutateResponse> LlmMutator::MutateCancellable(const v1::MutateRequest& req, const SeenFn& seen,
                                                                  const CancelledFn& cancelled) {
  if (providers_.empty()) return absl::FailedPreconditionError("no LLM provider configured");
  // No parent: a problem with a PyTorch reference and no seed, whose first kernel the model writes.
  const bool from_scratch = req.parents().empty();
  if (from_scratch && !req.problem().reference().has_pytorch()) {
    return absl::InvalidArgumentError("mutate needs at least one parent");
  }
  v1::MutateResponse resp;
  // A weighted choice of model from the mutation's own random stream.
  std::mt19937_64 rng(req.seed());
  double total = 0;
  for (const auto& p : providers_) total += p->config().weight;
  double x = std::uniform_real_distribution<double>(0, total)(rng);
  size_t index = providers_.size() - 1;
  for (size_t i = 0; i < providers_.size(); ++i) {
    x -= providers_[i]->config().weight;
    if (x <= 0) {
      index = i;
      break;
    }
  }
  Provider* provider = providers_[index].get();
  const int64_t budget = provider->config().context_tokens - provider->config().max_output_tokens;
  KF_ASSIGN_OR_RETURN(Prompt prompt, BuildPrompt(req, budget));
  static const v1::Candidate kNoParent;
  const v1::Candidate& parent = from_scratch ? kNoParent : req.parents(0).candidate();
  // A recorded reply is free and needs no endpoint: the budget and the breaker apply to real calls.
  const std::string key = ReplyCacheKey(provider->config(), req, req.seed(), /*whole_file=*/false);
  const bool recorded = cache_.Contains(key);
  if (auto over = recorded ? std::nullopt : OverAllowance(*provider, prompt, req, resp); over.has_value()) {
    resp.set_message(absl::StrCat("model budget: ", *over));
    return resp;
  }
  CircuitBreaker& breaker = *breakers_[index];
  const std::string& name = provider->config().name;
  if (!recorded && !breaker.Allow()) {
    resp.set_message(absl::StrFormat("model %s skipped after repeated failures (next try in %.0f s)", name,
                                     breaker.RetryInSeconds()));
    return resp;
  }
  // Whether the provider answered a real call (recorded replies do not count).
  auto record = [&](bool answered) {
    const bool was_open = breaker.state() == CircuitBreaker::State::kOpen;
    if (answered) {
      breaker.RecordSuccess();
    } else {
      breaker.RecordFailure();
    }
    const bool open = breaker.state() == CircuitBreaker::State::kOpen;
    if (open != was_open) {
      if (open) log_->warn("model {} keeps failing: skipped for {:.0f} s", name, breaker.RetryInSeconds());
      if (metrics_ != nullptr) metrics_->SetBreakerOpen(name, provider->config().model, open);
    }
  };
  auto text = Ask(*provider, prompt.system, prompt.user, key, &resp, cancelled);
  if (!recorded) record(text.ok());
  if (!text.ok()) {
    resp.set_message(absl::StrCat("model call failed: ", text.status().message()));
    return resp;
  }
  std::string source;
  std::optional<std::string> plan_yaml;
  auto reply = ParseModelReply(*text);
  if (!reply.ok()) {
    resp.set_message(absl::StrCat("unusable model reply: ", reply.status().message()));
    return resp;
  }
  plan_yaml = reply->launch_plan_yaml;
  if (reply->whole_source.has_value()) {
    source = *reply->whole_source;
  } else if (!reply->edits.empty()) {
    auto applied = ApplyEdits(parent.source(), reply->edits);
    if (applied.ok()) {
      source = *applied;
    } else {
      // One retry asking for the whole file.
      auto again = BuildPrompt(req, budget, /*whole_file=*/true, std::string(applied.status().message()));
      if (!again.ok()) return again.status();
      const std::string key2 = ReplyCacheKey(provider->config(), req, req.seed() + 1, /*whole_file=*/true);
      const bool recorded2 = cache_.Contains(key2);
      if (auto over = recorded2 ? std::nullopt : OverAllowance(*provider, *again, req, resp); over.has_value()) {
        resp.set_message(absl::StrCat("edits did not apply (", applied.status().message(),
                                      ") and the whole-file retry would exceed the model budget: ", *over));
        return resp;
      }
      auto text2 = Ask(*provider, again->system, again->user, key2, &resp, cancelled);
      if (!recorded2) record(text2.ok());
      auto reply2 = text2.ok() ? ParseModelReply(*text2) : absl::StatusOr<ModelReply>(text2.status());
      if (!reply2.ok() || !reply2->whole_source.has_value()) {
        resp.set_message(absl::StrCat("edits did not apply (", applied.status().message(),
                                      ") and the whole-file retry failed: ",
                                      reply2.ok() ? "no code block" : reply2.status().message()));
        return resp;
      }
      source = *reply2->whole_source;
      if (reply2->launch_plan_yaml.has_value()) plan_yaml = reply2->launch_plan_yaml;
    }
  } else if (!from_scratch) {
    source = parent.source();  // a plan-only change
  }
  if (from_scratch && (source.empty() || !plan_yaml.has_value())) {
    resp.set_message(absl::StrCat("unusable model reply: a first kernel needs its whole source and a launch plan (",
                                  source.empty() ? "no code block" : "no yaml launch plan", ")"));
    return resp;
  }
  // A kernel goes into proto strings and the store: it must be UTF-8 text, and within the size
  // a worker accepts.
  if (!IsValidUtf8(source) || source.find('\0') != std::string::npos) {
    resp.set_message("unusable model reply: the kernel is not UTF-8 text");
    return resp;
  }
  if (source.size() > static_cast<size_t>(kMaxSourceBytes)) {
    resp.set_message(absl::StrCat("unusable model reply: the kernel is ", source.size(), " bytes"));
    return resp;
  }
  v1::Candidate child;
  child.set_job_id(from_scratch ? req.job_id() : parent.job_id());
  child.set_source(source);
  *child.mutable_plan() = parent.plan();
  *child.mutable_params() = parent.params();
  if (plan_yaml.has_value()) {
    auto plan = LoadLaunchPlanText(req.problem(), *plan_yaml, "model launch plan");
    if (!plan.ok()) {
      resp.set_message(absl::StrCat("unusable launch plan from the model: ", plan.status().message()));
      return resp;
    }
    *child.mutable_plan() = *plan;
  }
  for (const auto& p : req.parents()) child.add_parent_ids(p.candidate().id());
  child.set_mutator(v1::MUTATOR_KIND_LLM);
  child.set_note(absl::StrCat("llm ", provider->config().model));
  child.set_content_hash(HashCandidate(child));
  if (seen(child.content_hash())) {
    resp.set_message("the model proposed a candidate already seen");
    return resp;
  }
  *resp.add_children() = std::move(child);
  return resp;
}

absl::StatusOr<ConfiguredLlm> MakeLlmMutator(const LlmConfig& config, HttpClient& http, uint64_t jitter_seed,
                                             Logger log, ProxyMetrics* metrics) {
  ConfiguredLlm out;
  KF_ASSIGN_OR_RETURN(out.cache, ResponseCache::Open(config.cache_file));
  std::vector<std::unique_ptr<Provider>> providers;
  for (const auto& p : config.providers) {
    providers.push_back(std::make_unique<Provider>(
        p, http, [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }, jitter_seed));
    absl::StrAppend(&out.provider_names, out.provider_names.empty() ? "" : ", ", p.name);
  }
  out.mutator = std::make_unique<LlmMutator>(std::move(providers), *out.cache, std::move(log), metrics);
  return out;
}

absl::StatusOr<v1::MutateResponse> MixedMutator::Counted(const char* mutator,
                                                         absl::StatusOr<v1::MutateResponse> r) {
  if (metrics_ != nullptr) {
    metrics_->RecordMutation(mutator, !r.ok() ? "error" : r->children().empty() ? "no_child" : "child");
  }
  return r;
}

absl::StatusOr<v1::MutateResponse> MixedMutator::MutateCancellable(const v1::MutateRequest& req, const SeenFn& seen,
                                                                    const CancelledFn& cancelled) {
  // A stream of its own: the coordinator derives its own choices for this proposal (such as
  // whether it is a global draw) from the same seed, and the two must not move together.
  std::mt19937_64 rng(req.seed() ^ 0xd1b54a32d192ed03ULL);
  // The caller may rule the model out (the job's model budget is spent, or this is a fallback).
  const bool model_allowed = req.preferred() != v1::MUTATOR_KIND_PARAMETRIC;
  // A first kernel (no parent) is the model's whatever the share.
  const bool draw = std::uniform_real_distribution<double>(0, 1)(rng) < probability_;
  if (llm_ != nullptr && (draw || req.parents().empty()) && model_allowed) {
    if (cancelled()) return absl::CancelledError("the mutation was cancelled before the model call");
    auto r = llm_->MutateCancellable(req, seen, cancelled);
    if (r.ok() && !r->children().empty()) return Counted("model", std::move(r));
    if (metrics_ != nullptr) metrics_->RecordMutation("model", r.ok() ? "no_child" : "error");
    // The model failed or repeated itself: the knob tuner still makes progress; keep the usage.
    auto fallback = Counted("parametric", parametric_.MutateCancellable(req, seen, cancelled));
    if (!fallback.ok()) return fallback;
    const std::string why = r.ok() ? r->message() : std::string(r.status().message());
    if (r.ok()) {
      for (const auto& u : r->usage()) *fallback->add_usage() = u;
    }
    fallback->set_message(fallback->children().empty()
                              ? absl::StrCat(fallback->message(), " (the model: ", why, ")")
                              : absl::StrCat(why, "; fell back to the parametric mutator"));
    return fallback;
  }
  return Counted("parametric", parametric_.MutateCancellable(req, seen, cancelled));
}

}  // namespace kforge::llm
