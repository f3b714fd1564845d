// Model providers and the LLM mutator against a real local HTTP server that speaks the OpenAI and
// Anthropic wire formats and scripts its answers: good edits, whole files, malformed replies,
// edits that do not apply, 429 with Retry-After, 500s, slow replies past the timeout, truncated
// bodies. A real model cannot be reached from tests.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "common/store/sqlite_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/llm-proxy/llm_mutator.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/prompt_builder.h"
#include "tests/testutil/scripted_http_server.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/vadd_problem.h"

namespace kforge::llm {
namespace {

using ::kforge::testing::ScriptedHttpServer;
using ::kforge::testing::ScriptedResponse;
using ::testing::HasSubstr;

std::string OpenAiReply(const std::string& text, int in = 100, int out = 50) {
  return testing::OpenAiChatReply(text, in, out);
}

std::string AnthropicReply(const std::string& text) {
  return nlohmann::json{{"content", {{{"type", "text"}, {"text", text}}}},
                        {"usage", {{"input_tokens", 70}, {"output_tokens", 30}}}}
      .dump();
}

ProviderConfig Config(const ScriptedHttpServer& s, const std::string& kind = "openai") {
  ProviderConfig c;
  c.name = "scripted";
  c.kind = kind;
  c.base_url = kind == "openai" ? s.url() + "/v1" : s.url();
  c.model = "test-model";
  c.api_key = "sk-test";
  c.timeout_seconds = 2;
  c.max_retries = 3;
  c.input_usd_per_mtok = 1.0;
  c.output_usd_per_mtok = 2.0;
  return c;
}

struct Sleeps {
  std::vector<double> waits;
  SleepFn fn() {
    return [this](double s) { waits.push_back(s); };
  }
};

TEST(ProviderTest, OpenAiCompatibleCallAndAccounting) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("hello", 1000, 500)});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server), http, sleeps.fn());
  auto r = p.Complete({"sys", "user text", 0.5, 256});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "hello");
  EXPECT_EQ(r->input_tokens, 1000);
  EXPECT_EQ(r->output_tokens, 500);
  EXPECT_DOUBLE_EQ(r->cost_usd, (1000 * 1.0 + 500 * 2.0) / 1e6);
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].path, "/v1/chat/completions");
  EXPECT_EQ(reqs[0].headers["authorization"], "Bearer sk-test");
  auto body = nlohmann::json::parse(reqs[0].body);
  EXPECT_EQ(body["model"], "test-model");
  EXPECT_EQ(body["messages"][0]["role"], "system");
  EXPECT_EQ(body["messages"][1]["content"], "user text");
}

TEST(ProviderTest, AnthropicMessagesCall) {
  ScriptedHttpServer server;
  server.Push({200, {}, AnthropicReply("bonjour")});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server, "anthropic"), http, sleeps.fn());
  auto r = p.Complete({"be brief", "hi", 0.2, 64});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "bonjour");
  EXPECT_EQ(r->input_tokens, 70);
  auto reqs = server.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].path, "/v1/messages");
  EXPECT_EQ(reqs[0].headers["x-api-key"], "sk-test");
  EXPECT_FALSE(reqs[0].headers["anthropic-version"].empty());
  EXPECT_EQ(nlohmann::json::parse(reqs[0].body)["system"], "be brief");
}

TEST(ProviderTest, RateLimitedHonoursRetryAfter) {
  ScriptedHttpServer server;
  server.Push({429, {{"Retry-After", "3"}}, "slow down"});
  server.Push({200, {}, OpenAiReply("ok")});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server), http, sleeps.fn());
  auto r = p.Complete({"s", "u", 0.5, 64});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->retries, 1);
  ASSERT_EQ(sleeps.waits.size(), 1u);
  EXPECT_DOUBLE_EQ(sleeps.waits[0], 3.0);
}

TEST(ProviderTest, ServerErrorsBackOffThenGiveUpWithTheReason) {
  ScriptedHttpServer server;
  for (int i = 0; i < 4; ++i) server.Push({500, {}, "internal trouble"});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server), http, sleeps.fn());
  auto r = p.Complete({"s", "u", 0.5, 64});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("giving up after 4 attempts"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("HTTP 500"));
  ASSERT_EQ(sleeps.waits.size(), 3u);
  // Exponential with jitter: each wait within [0.5, 1.5] of 0.5 * 2^attempt.
  for (size_t i = 0; i < sleeps.waits.size(); ++i) {
    const double base = 0.5 * (1 << i);
    EXPECT_GE(sleeps.waits[i], 0.5 * base);
    EXPECT_LE(sleeps.waits[i], 1.5 * base);
  }
  EXPECT_EQ(server.requests().size(), 4u);
}

TEST(ProviderTest, SlowReplyPastTheTimeoutIsRetried) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("late"), /*delay_ms=*/1500});
  server.Push({200, {}, OpenAiReply("on time")});
  CurlHttpClient http;
  Sleeps sleeps;
  ProviderConfig c = Config(server);
  c.timeout_seconds = 0.4;
  Provider p(c, http, sleeps.fn());
  auto r = p.Complete({"s", "u", 0.5, 64});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "on time");
  EXPECT_EQ(r->retries, 1);
}

TEST(ProviderTest, TruncatedAndMalformedBodiesAreRetried) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("cut"), 0, /*truncate=*/true});
  server.Push({200, {}, "{\"choices\": []}"});
  server.Push({200, {}, OpenAiReply("whole")});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server), http, sleeps.fn());
  auto r = p.Complete({"s", "u", 0.5, 64});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, "whole");
  EXPECT_EQ(r->retries, 2);
}

TEST(ProviderTest, ClientErrorsAreNotRetried) {
  ScriptedHttpServer server;
  server.Push({401, {}, "bad key"});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server), http, sleeps.fn());
  auto r = p.Complete({"s", "u", 0.5, 64});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("HTTP 401: bad key"));
  EXPECT_TRUE(sleeps.waits.empty());
}

// Replies of the wrong shape are malformed replies, never an exception that takes the process
// down (nlohmann's accessors throw on a wrong type: these crashed the proxy and `kforge run`).
TEST(ProviderTest, RepliesOfTheWrongShapeAreMalformedNeverFatal) {
  ScriptedHttpServer server;
  CurlHttpClient http;
  Sleeps sleeps;
  Provider openai(Config(server), http, sleeps.fn());
  Provider anthropic(Config(server, "anthropic"), http, sleeps.fn());
  for (const std::string& body : std::vector<std::string>{
           "{\"choices\":[1]}", "{\"choices\":\"x\"}", "{\"choices\":[{\"message\":\"x\"}]}",
        "{\"choices\":[{\"message\":{\"content\":5}}]}", "{\"choices\":[null]}", "[]", "null", "\"text\"", "17",
        "{\"choices\":[{\"message\":{\"content\":\"\"}}]}", std::string("{\"choices\":[{\"message\":{\"content\":\"a\xff\"}}]}"),
        "{\"choices\":[{\"message\":{\"content\":\"\\ud800\"}}]}", std::string(100000, '['), ""}) {
    auto r = openai.Parse(body);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << body.substr(0, 60) << ": " << r.status();
  }
  for (const std::string& body : std::vector<std::string>{"{\"content\":[1,\"a\",{\"type\":5},{\"type\":\"text\",\"text\":7}]}",
                                 "{\"content\":{\"a\":1}}", "{\"content\":null}"}) {
    auto r = anthropic.Parse(body);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << body << ": " << r.status();
  }
  // Usage of the wrong type counts nothing, and the text still serves.
  auto odd_usage = openai.Parse(
      "{\"choices\":[{\"message\":{\"content\":\"hi\"}}],\"usage\":{\"prompt_tokens\":\"12\",\"completion_tokens\":-4}}");
  ASSERT_TRUE(odd_usage.ok()) << odd_usage.status();
  EXPECT_EQ(odd_usage->text, "hi");
  EXPECT_EQ(odd_usage->input_tokens, 0);
  EXPECT_EQ(odd_usage->output_tokens, 0);
  auto usage_list = anthropic.Parse("{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}],\"usage\":[1,2]}");
  ASSERT_TRUE(usage_list.ok()) << usage_list.status();
  EXPECT_EQ(usage_list->input_tokens, 0);
  // Through a real call: the malformed replies are retried, then given up on with the reason.
  for (int i = 0; i < 4; ++i) server.Push({200, {}, "{\"choices\":[1]}"});
  auto r = openai.Complete({"s", "u", 0.5, 64});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("malformed response"));
}

TEST(ProviderTest, AReplyLargerThanTheCapIsCutOffAndNotRetried) {
  ScriptedHttpServer server;
  server.Push({200, {}, std::string(50 << 20, 'x')});
  server.Push({200, {}, OpenAiReply("never asked for")});
  CurlHttpClient http;
  Sleeps sleeps;
  Provider p(Config(server), http, sleeps.fn());
  auto r = p.Complete({"s", "u", 0.5, 64});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("larger than"));
  EXPECT_EQ(server.requests().size(), 1u);
}

// A call nobody waits for any more (the client's deadline passed, the proxy stops) ends now: its
// transfer is aborted and no retry starts, instead of posting again minutes later.
TEST(ProviderTest, ACancelledCallEndsWithinAMomentAndIsNotRetried) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("too late"), /*delay_ms=*/4000});
  server.Push({200, {}, OpenAiReply("never asked for")});
  CurlHttpClient http;
  ProviderConfig c = Config(server);
  c.timeout_seconds = 120;
  c.max_retries = 4;
  Provider p(c, http, [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); });
  std::atomic<bool> gone{false};
  std::thread leave([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gone = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto r = p.Complete({"s", "u", 0.5, 64}, [&] { return gone.load(); });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  leave.join();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_LT(took, 1.5);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(server.requests().size(), 1u);
}

// --- The mutator over a real problem.

constexpr const char* kSeed = testing::kVaddSeed;

class LlmMutatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write("p/problem.yaml",
               "name: vadd\nbackend: opencl\ndescription: c = a + b\nsizes: {N: 1000}\n"
               "buffers:\n  a: {dtype: f32, shape: [N], role: in}\n  b: {dtype: f32, shape: [N], role: in}\n"
               "  c: {dtype: f32, shape: [N], role: out}\n"
               "reference:\n  source: seed.cl\n  launches: [{kernel: add, global: [N], args: [a, b, c, N]}]\n"
               "seed:\n  source: seed.cl\n  params: {WG: [32, 64]}\n"
               "  launches: [{kernel: add, global: [\"ceil_div(N, WG) * WG\"], local: [WG], args: [a, b, c, N]}]\n");
    dir_.Write("p/seed.cl", kSeed);
    auto p = LoadProblem(dir_.path() + "/p");
    ASSERT_TRUE(p.ok()) << p.status();
    problem_ = *p;
  }

  v1::MutateRequest Request(uint64_t seed = 7) {
    v1::MutateRequest req;
    *req.mutable_problem() = problem_;
    v1::Candidate parent = MakeSeedCandidate(problem_, {{"WG", 32}});
    parent.set_id("parent");
    auto* pc = req.add_parents();
    *pc->mutable_candidate() = parent;
    pc->mutable_result()->set_outcome(v1::OUTCOME_OK);
    pc->mutable_result()->set_speedup(1.0);
    req.set_seed(seed);
    return req;
  }

  std::unique_ptr<LlmMutator> Mutator(ScriptedHttpServer& server) {
    std::vector<std::unique_ptr<Provider>> providers;
    providers.push_back(std::make_unique<Provider>(Config(server), http_, sleeps_.fn()));
    return std::make_unique<LlmMutator>(std::move(providers), *cache_, MakeLogger("llm-test", spdlog::level::warn));
  }

  testing::TempDir dir_;
  v1::Problem problem_;
  CurlHttpClient http_;
  Sleeps sleeps_;
  std::unique_ptr<ResponseCache> cache_ = *ResponseCache::Open("");
  SeenFn none_ = [](const std::string&) { return false; };
};

TEST_F(LlmMutatorTest, EditReplyBecomesAChildWithUsageAndIsCached) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("Vectorised:\n```c\n<<<<<<< SEARCH\n  if (i < n) c[i] = a[i] + b[i];\n=======\n"
                                    "  if (i < n) c[i] = b[i] + a[i];\n>>>>>>> REPLACE\n```\n")});
  auto m = Mutator(server);
  auto r = m->Mutate(Request(), none_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->children_size(), 1) << r->message();
  const v1::Candidate& c = r->children(0);
  EXPECT_THAT(c.source(), HasSubstr("c[i] = b[i] + a[i];"));
  EXPECT_EQ(c.mutator(), v1::MUTATOR_KIND_LLM);
  EXPECT_EQ(c.params().at("WG"), 32);
  EXPECT_EQ(c.parent_ids(0), "parent");
  EXPECT_EQ(c.content_hash(), HashCandidate(c));
  ASSERT_EQ(r->usage_size(), 1);
  EXPECT_EQ(r->usage(0).input_tokens(), 100);
  EXPECT_FALSE(r->usage(0).cache_hit());
  // The prompt carried the rules, the problem and the parent.
  auto body = nlohmann::json::parse(server.requests()[0].body);
  EXPECT_THAT(body["messages"][0]["content"].get<std::string>(), HasSubstr("<<<<<<< SEARCH"));
  EXPECT_THAT(body["messages"][1]["content"].get<std::string>(), HasSubstr("c = a + b"));
  EXPECT_THAT(body["messages"][1]["content"].get<std::string>(), HasSubstr("WG=32"));

  // Same prompt, same seed: served from the cache, the server sees nothing new.
  auto again = m->Mutate(Request(), none_);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->children_size(), 1);
  EXPECT_TRUE(again->usage(0).cache_hit());
  EXPECT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(again->children(0).source(), c.source());
}

TEST_F(LlmMutatorTest, EditsThatDoNotApplyTriggerOneWholeFileRetry) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("<<<<<<< SEARCH\nthis line is not in the parent\n=======\nx\n>>>>>>> REPLACE\n")});
  server.Push({200, {}, OpenAiReply(std::string("```c\n") + kSeed + "// rewritten\n```\n")});
  auto m = Mutator(server);
  auto r = m->Mutate(Request(), none_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->children_size(), 1) << r->message();
  EXPECT_THAT(r->children(0).source(), HasSubstr("// rewritten"));
  ASSERT_EQ(server.requests().size(), 2u);
  auto second = nlohmann::json::parse(server.requests()[1].body);
  EXPECT_THAT(second["messages"][1]["content"].get<std::string>(), HasSubstr("did not apply"));
  EXPECT_EQ(r->usage_size(), 2);
}

TEST_F(LlmMutatorTest, NewLaunchPlanFromTheModel) {
  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply("Bigger groups:\n```yaml\nlaunches:\n  - {kernel: add, global: [\"ceil_div(N, 128) * 128\"], "
                                    "local: [128], args: [a, b, c, N]}\n```\n")});
  auto r = Mutator(server)->Mutate(Request(), none_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->children_size(), 1) << r->message();
  ASSERT_EQ(r->children(0).plan().launches_size(), 1);
  EXPECT_EQ(r->children(0).plan().launches(0).local(0), "128");
}

TEST_F(LlmMutatorTest, FailuresAreRecordedWithTheirReason) {
  {
    ScriptedHttpServer server;
    server.Push({200, {}, OpenAiReply("I cannot improve this kernel.")});
    auto r = Mutator(server)->Mutate(Request(1), none_);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->children_size(), 0);
    EXPECT_THAT(r->message(), HasSubstr("unusable model reply"));
    EXPECT_EQ(r->usage_size(), 1);  // the call was paid for
  }
  {
    ScriptedHttpServer server;
    server.Push({200, {}, OpenAiReply("```yaml\nlaunches:\n  - {kernel: add, global: [M], args: [a, b, c, N]}\n```\n")});
    auto r = Mutator(server)->Mutate(Request(2), none_);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->children_size(), 0);
    EXPECT_THAT(r->message(), HasSubstr("unusable launch plan"));
    EXPECT_THAT(r->message(), HasSubstr("undefined name 'M'"));
  }
  {
    ScriptedHttpServer server;
    server.Push({403, {}, "forbidden"});
    auto r = Mutator(server)->Mutate(Request(3), none_);
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(r->message(), HasSubstr("model call failed"));
    EXPECT_THAT(r->message(), HasSubstr("HTTP 403"));
  }
}

TEST_F(LlmMutatorTest, MixedMutatorFallsBackToTheKnobTuner) {
  ScriptedHttpServer server;
  server.Push({400, {}, "bad request"});
  auto llm = Mutator(server);
  ParametricMutator parametric;
  MixedMutator mixed(parametric, llm.get(), /*llm_probability=*/1.0);
  auto r = mixed.Mutate(Request(), none_);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->children_size(), 1);
  EXPECT_EQ(r->children(0).mutator(), v1::MUTATOR_KIND_PARAMETRIC);
  EXPECT_THAT(r->message(), HasSubstr("fell back to the parametric mutator"));
  // Probability 0 never calls the model.
  MixedMutator never(parametric, llm.get(), 0.0);
  ASSERT_TRUE(never.Mutate(Request(9), none_).ok());
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST_F(LlmMutatorTest, RecordReplayFileServesARerunWithoutTheModel) {
  const std::string file = dir_.path() + "/replies.jsonl";
  {
    ScriptedHttpServer server;
    server.Push({200, {}, OpenAiReply(std::string("```c\n") + kSeed + "// v2\n```\n")});
    auto cache = ResponseCache::Open(file);
    ASSERT_TRUE(cache.ok());
    std::vector<std::unique_ptr<Provider>> providers;
    providers.push_back(std::make_unique<Provider>(Config(server), http_, sleeps_.fn()));
    LlmMutator m(std::move(providers), **cache, MakeLogger("llm-test", spdlog::level::warn));
    ASSERT_EQ(m.Mutate(Request(), none_)->children_size(), 1);
  }
  ScriptedHttpServer silent;  // answers nothing useful: every call would fail
  auto cache = ResponseCache::Open(file);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::vector<std::unique_ptr<Provider>> providers;
  providers.push_back(std::make_unique<Provider>(Config(silent), http_, sleeps_.fn()));
  LlmMutator m(std::move(providers), **cache, MakeLogger("llm-test", spdlog::level::warn));
  auto r = m.Mutate(Request(), none_);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->children_size(), 1) << r->message();
  EXPECT_THAT(r->children(0).source(), HasSubstr("// v2"));
  EXPECT_TRUE(silent.requests().empty());
}

// The prompt carries measured times, which differ on every run: the reply cache's key does not.
TEST_F(LlmMutatorTest, CacheKeyIgnoresMeasuredTimesButNotTheParent) {
  auto timed = [&](double speedup, double median, int wg = 32) {
    v1::MutateRequest req = Request();
    if (wg != 32) {
      v1::Candidate other = MakeSeedCandidate(problem_, {{"WG", wg}});
      other.set_id("parent");
      *req.mutable_parents(0)->mutable_candidate() = other;
    }
    auto* r = req.mutable_parents(0)->mutable_result();
    r->set_speedup(speedup);
    auto* t = r->add_timings();
    t->set_size_set("default");
    t->mutable_candidate()->set_median_seconds(median);
    t->mutable_reference()->set_median_seconds(median * speedup);
    return req;
  };
  const v1::MutateRequest first = timed(1.02, 1.25e-5), rerun = timed(0.97, 1.61e-5);
  ASSERT_NE(BuildPrompt(first, 100000)->user, BuildPrompt(rerun, 100000)->user);  // the times differ

  ScriptedHttpServer server;
  server.Push({200, {}, OpenAiReply(std::string("```c\n") + kSeed + "// first\n```\n")});
  server.Push({200, {}, OpenAiReply(std::string("```c\n") + kSeed + "// other parent\n```\n")});
  auto m = Mutator(server);
  auto a = m->Mutate(first, none_);
  ASSERT_TRUE(a.ok() && a->children_size() == 1) << (a.ok() ? a->message() : a.status().ToString());
  // Same parent, other times: the same entry, no call.
  auto b = m->Mutate(rerun, none_);
  ASSERT_TRUE(b.ok() && b->children_size() == 1);
  EXPECT_TRUE(b->usage(0).cache_hit());
  EXPECT_EQ(b->children(0).source(), a->children(0).source());
  EXPECT_EQ(server.requests().size(), 1u);
  // Another parent (another knob value, so another content hash): a miss, the model is asked.
  auto c = m->Mutate(timed(1.02, 1.25e-5, /*wg=*/64), none_);
  ASSERT_TRUE(c.ok() && c->children_size() == 1);
  EXPECT_FALSE(c->usage(0).cache_hit());
  EXPECT_THAT(c->children(0).source(), HasSubstr("// other parent"));
  EXPECT_EQ(server.requests().size(), 2u);
  EXPECT_EQ(cache_->hits(), 1u);
}

TEST_F(LlmMutatorTest, CacheKeyIsWhatDeterminesTheRequest) {
  const ProviderConfig c = Config(ScriptedHttpServer());
  const v1::MutateRequest req = Request(7);
  const std::string key = ReplyCacheKey(c, req, req.seed(), false);
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key, ReplyCacheKey(c, req, 7, false));
  // A parent without a content hash is hashed: the same key.
  v1::MutateRequest unhashed = req;
  unhashed.mutable_parents(0)->mutable_candidate()->clear_content_hash();
  unhashed.mutable_problem()->clear_content_hash();
  EXPECT_EQ(ReplyCacheKey(c, unhashed, 7, false), key);
  // Its id, its metrics and the coordinator's bookkeeping do not count.
  v1::MutateRequest noise = req;
  noise.mutable_parents(0)->mutable_candidate()->set_id("another-id");
  noise.mutable_parents(0)->mutable_result()->set_speedup(3.5);
  noise.set_count(512);
  noise.set_strategy("global");
  noise.add_seen_hashes("abc");
  EXPECT_EQ(ReplyCacheKey(c, noise, 7, false), key);
  // Each of these does.
  std::vector<std::string> keys = {key, ReplyCacheKey(c, req, 8, false), ReplyCacheKey(c, req, 7, true)};
  ProviderConfig other_model = c;
  other_model.model = "other-model";
  keys.push_back(ReplyCacheKey(other_model, req, 7, false));
  ProviderConfig hotter = c;
  hotter.temperature = c.temperature + 0.5;
  keys.push_back(ReplyCacheKey(hotter, req, 7, false));
  v1::MutateRequest inspired = req;
  *inspired.add_inspirations()->mutable_candidate() = MakeSeedCandidate(problem_, {{"WG", 64}});
  keys.push_back(ReplyCacheKey(c, inspired, 7, false));
  v1::MutateRequest two_parents = req;
  *two_parents.add_parents()->mutable_candidate() = MakeSeedCandidate(problem_, {{"WG", 64}});
  keys.push_back(ReplyCacheKey(c, two_parents, 7, false));
  v1::MutateRequest other_problem = req;
  other_problem.mutable_problem()->set_description("c = b + a");
  other_problem.mutable_problem()->set_content_hash(HashProblem(other_problem.problem()));
  keys.push_back(ReplyCacheKey(c, other_problem, 7, false));
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size());
}

TEST(ResponseCacheTest, ReplyFileInAFolder) {
  testing::TempDir dir;
  // Created when missing, then recorded to and replayed from.
  auto file = ReplyCacheFileIn(dir.path() + "/llm-cache/sub");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file, dir.path() + "/llm-cache/sub/replies.jsonl");
  {
    auto cache = ResponseCache::Open(*file);
    ASSERT_TRUE(cache.ok()) << cache.status();
    (*cache)->Put("k", "reply");
  }
  auto cache = ResponseCache::Open(*ReplyCacheFileIn(dir.path() + "/llm-cache/sub"));
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ((*cache)->Get("k"), std::optional<std::string>("reply"));
  // A folder that cannot be made (a file is in the way) and a replies file that cannot be
  // written are errors, not recordings silently lost.
  dir.Write("plain-file", "x");
  auto bad = ReplyCacheFileIn(dir.path() + "/plain-file/sub");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("plain-file/sub"));
  auto unwritable = ResponseCache::Open(dir.path() + "/plain-file/sub/replies.jsonl");
  ASSERT_FALSE(unwritable.ok());
  EXPECT_THAT(std::string(unwritable.status().message()), HasSubstr("cannot write"));
  EXPECT_FALSE(ResponseCache::Open(dir.path()).ok());  // a folder is not a replies file
}

TEST(ResponseCacheTest, ProxyRefusesAnUnusableCacheDirAtStart) {
  testing::TempDir dir;
  dir.Write("plain-file", "x");
  const std::string providers = dir.Write(
      "llm.yaml", "providers:\n  - {kind: openai, base_url: \"http://127.0.0.1:1/v1\", model: m}\n");
  const std::string proxy = testing::BinaryDir() + "/services/llm-proxy/kforge-llm-proxy";
  auto config = [&](const std::string& name, const std::string& llm) {
    return dir.Write(name, "server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\"}\nllm: " + llm + "\n");
  };
  auto r = testing::RunProgram(
      proxy, {"--config", config("bad.yaml", "{providers_file: \"" + providers + "\", cache_dir: \"" + dir.path() +
                                                 "/plain-file/sub\"}")});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("llm.cache_dir"));
  EXPECT_THAT(r.err, HasSubstr("plain-file/sub"));
  // Both a folder and the providers file's own cache_file: which one would be meant?
  const std::string with_file = dir.Write(
      "llm2.yaml", "cache_file: " + dir.path() + "/r.jsonl\nproviders:\n  - {kind: openai, base_url: x, model: m}\n");
  r = testing::RunProgram(proxy, {"--config", config("both.yaml", "{providers_file: \"" + with_file +
                                                                      "\", cache_dir: \"" + dir.path() + "/c\"}")});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("llm.cache_dir"));
  EXPECT_THAT(r.err, HasSubstr("keep one"));
  // A usable folder is created at start, with its replies file (the proxy runs until stopped).
  r = testing::RunProgram("/usr/bin/timeout",
                          {"-s", "TERM", "3", proxy, "--config",
                           config("ok.yaml", "{providers_file: \"" + providers + "\", cache_dir: \"" + dir.path() +
                                                 "/cache\"}")});
  EXPECT_TRUE(std::filesystem::is_regular_file(dir.path() + "/cache/replies.jsonl")) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("replies_file=\"" + dir.path() + "/cache/replies.jsonl\""));
}

TEST(ResponseCacheTest, KforgeRunRefusesAReplyFileItCannotWrite) {
  testing::TempDir dir;
  testing::WriteVaddProblem(dir, "p");
  dir.Write("plain-file", "x");
  const std::string cfg = dir.Write("llm.yaml", "cache_file: " + dir.path() + "/plain-file/replies.jsonl\n"
                                                "providers:\n  - {kind: openai, base_url: \"http://127.0.0.1:1/v1\", model: m}\n");
  auto r = testing::RunProgram(testing::BinaryDir() + "/cli/kforge",
                               {"run", dir.path() + "/p", "--budget", "2", "--llm", cfg, "--db", dir.path() + "/k.db",
                                "--out", dir.path() + "/out"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot write the replies file " + dir.path() + "/plain-file/replies.jsonl"));
}

TEST(LlmConfigTest, LoadsProvidersAndReportsBadKeys) {
  testing::TempDir dir;
  setenv("KFORGE_TEST_LLM_KEY", "sk-from-env", 1);
  auto ok = LoadLlmConfig(dir.Write("ok.yaml",
                                    "probability: 0.5\nproviders:\n"
                                    "  - {name: local, kind: openai, base_url: \"http://127.0.0.1:1/v1\", model: m, "
                                    "api_key_env: KFORGE_TEST_LLM_KEY, weight: 2}\n"
                                    "  - {kind: anthropic, base_url: \"http://127.0.0.1:2\", model: c}\n"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_DOUBLE_EQ(ok->probability, 0.5);
  ASSERT_EQ(ok->providers.size(), 2u);
  EXPECT_EQ(ok->providers[0].api_key, "sk-from-env");
  EXPECT_EQ(ok->providers[1].name, "c");
  auto bad = LoadLlmConfig(dir.Write("bad.yaml", "providers:\n  - {kind: gemini, base_url: x, model: m}\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bad.yaml:2"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("unknown provider kind 'gemini'"));
  auto nokey = LoadLlmConfig(dir.Write("nokey.yaml",
                                       "providers:\n  - {kind: openai, base_url: x, model: m, api_key_env: NOPE_NOT_SET}\n"));
  ASSERT_FALSE(nokey.ok());
  EXPECT_THAT(std::string(nokey.status().message()), HasSubstr("NOPE_NOT_SET is not set"));
}

TEST(KforgeRunLlmTest, EmbeddedRunUsesTheConfiguredModel) {
  ScriptedHttpServer server;
  // Every call gets the same correct whole-file rewrite; later ones are repeats (seen), so the
  // run falls back to the knob tuner for them.
  const std::string rewrite =
      "__kernel void add(__global const float* a, __global const float* b, __global float* c, int n) {\n"
      "  int i = get_global_id(0);\n"
      "  if (i < n) c[i] = b[i] + a[i];\n"
      "}\n";
  for (int i = 0; i < 8; ++i) server.Push({200, {}, OpenAiReply("```c\n" + rewrite + "```\n")});
  testing::TempDir dir;
  testing::WriteVaddProblem(dir, "p");
  const std::string cfg = dir.Write("llm.yaml", "probability: 1.0\nproviders:\n  - {kind: openai, base_url: \"" +
                                                    server.url() + "/v1\", model: scripted, timeout_seconds: 5}\n");
  auto r = testing::RunProgram(testing::BinaryDir() + "/cli/kforge",
                               {"run", dir.path() + "/p", "--budget", "4", "--llm", cfg, "--db", dir.path() + "/k.db",
                                "--out", dir.path() + "/out", "--timeout", "20"});
  if (r.exit_code == 1 && r.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("mutator: llm (scripted)"));
  EXPECT_GE(server.requests().size(), 1u);
  const std::string report = dir.Read("out/report.json");
  EXPECT_THAT(report, HasSubstr("MUTATOR_KIND_LLM"));
  // Every model call is a record of the job's with its accounting.
  auto store = SqliteStore::Open(dir.path() + "/k.db");
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->ListJobs({});
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  auto calls = (*store)->ListModelCalls(jobs->front().id(), 0, 1000);
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_EQ(calls->size(), server.requests().size());
  for (const auto& c : *calls) {
    EXPECT_EQ(c.usage().model(), "scripted");
    EXPECT_GT(c.proposal(), 0);
  }
  EXPECT_GT(jobs->front().progress().llm_tokens(), 0);
}

// `kforge run --llm` against a model whose replies are of the wrong shape: the run goes on with
// the knob tuner and ends COMPLETED (it died of SIGABRT, leaving its job RUNNING).
TEST(KforgeRunLlmTest, MalformedRepliesDoNotStopTheRun) {
  ScriptedHttpServer server;
  for (int i = 0; i < 40; ++i) {
    server.Push({200, {}, i % 2 == 0 ? "{\"choices\":[1]}" : "{\"choices\":[{\"message\":{\"content\":\"x\"}}],"
                                                          "\"usage\":{\"prompt_tokens\":\"12\"}}"});
  }
  testing::TempDir dir;
  testing::WriteVaddProblem(dir, "p");
  const std::string cfg = dir.Write("llm.yaml", "probability: 1.0\nproviders:\n  - {kind: openai, base_url: \"" +
                                                    server.url() + "/v1\", model: scripted, timeout_seconds: 5, "
                                                    "max_retries: 0}\n");
  auto r = testing::RunProgram(testing::BinaryDir() + "/cli/kforge",
                               {"run", dir.path() + "/p", "--budget", "4", "--llm", cfg, "--db", dir.path() + "/k.db",
                                "--out", dir.path() + "/out", "--timeout", "20"});
  if (r.exit_code == 1 && r.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_GE(server.requests().size(), 1u);
  auto store = SqliteStore::Open(dir.path() + "/k.db");
  ASSERT_TRUE(store.ok());
  auto jobs = (*store)->ListJobs({});
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ(jobs->front().state(), v1::JOB_STATE_COMPLETED) << jobs->front().state_reason();
  EXPECT_GE(jobs->front().progress().evaluations(), 2);  // the knob space has two points; other seeds' kernels
}

// Record/replay end to end: two runs with the same seed and replies file; the second calls no
// model and proposes the same candidates. Every model kernel here is distinct and wrong (a
// different constant added), so the seed stays the only successful candidate and the parent of
// every proposal: the search does not depend on timings (with winning model kernels it would:
// which one is faster decides the next parent). The prompts still carry the seed's measured
// times, which differ between the runs: a key over the prompt's text would miss every time.
TEST(KforgeRunLlmTest, SecondRunWithTheSameSeedReplaysWithoutTheModel) {
  ScriptedHttpServer server;
  constexpr int kBudget = 6;  // the seed and five model proposals
  for (int k = 1; k < kBudget; ++k) {
    server.Push({200, {}, OpenAiReply(absl::StrCat(
                              "```c\n__kernel void add(__global const float* a, __global const float* b, "
                              "__global float* c, int n) {\n  int i = get_global_id(0);\n  if (i < n) c[i] = a[i] + b[i] + ",
                              k, ".0f;\n}\n```\n"))});
  }
  testing::TempDir dir;
  testing::WriteVaddProblem(dir, "p");
  const std::string cfg = dir.Write("llm.yaml", "probability: 1.0\ncache_file: " + dir.path() +
                                                    "/replies.jsonl\nproviders:\n  - {kind: openai, base_url: \"" +
                                                    server.url() + "/v1\", model: scripted, timeout_seconds: 5}\n");
  auto run = [&](const std::string& name) {
    return testing::RunProgram(testing::BinaryDir() + "/cli/kforge",
                               {"run", dir.path() + "/p", "--budget", std::to_string(kBudget), "--seed", "42",
                                "--llm", cfg, "--db", dir.path() + "/" + name + ".db", "--out",
                                dir.path() + "/" + name, "--timeout", "20"});
  };
  // The model-made candidates of the run's job, in proposal order, and its model calls.
  auto model_made = [&](const std::string& name, std::vector<v1::ModelCall>* calls) {
    std::vector<std::string> sources;
    auto store = SqliteStore::Open(dir.path() + "/" + name + ".db");
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return sources;
    auto jobs = (*store)->ListJobs({});
    EXPECT_TRUE(jobs.ok() && jobs->size() == 1u);
    if (!jobs.ok() || jobs->size() != 1u) return sources;
    auto cands = (*store)->ListCandidates(jobs->front().id());
    EXPECT_TRUE(cands.ok()) << cands.status();
    for (const auto& c : *cands) {
      if (c.mutator() == v1::MUTATOR_KIND_LLM) sources.push_back(c.source());
    }
    *calls = *(*store)->ListModelCalls(jobs->front().id(), 0, 1000);
    return sources;
  };

  auto first = run("first");
  if (first.exit_code == 1 && first.err.find("not available") != std::string::npos) GTEST_SKIP() << "no OpenCL device";
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const size_t asked = server.requests().size();
  ASSERT_EQ(asked, static_cast<size_t>(kBudget - 1));
  for (const auto& req : server.requests()) {
    // The prompt carried the parent's measured times.
    EXPECT_THAT(nlohmann::json::parse(req.body)["messages"][1]["content"].get<std::string>(), HasSubstr(" ms (reference "));
  }
  std::vector<v1::ModelCall> first_calls;
  const std::vector<std::string> first_sources = model_made("first", &first_calls);
  ASSERT_EQ(first_sources.size(), static_cast<size_t>(kBudget - 1));
  EXPECT_EQ(first_calls.size(), static_cast<size_t>(kBudget - 1));
  for (const auto& c : first_calls) EXPECT_FALSE(c.usage().cache_hit());

  auto second = run("second");
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_EQ(server.requests().size(), asked) << "the replayed run called the model";
  std::vector<v1::ModelCall> second_calls;
  EXPECT_EQ(model_made("second", &second_calls), first_sources);
  ASSERT_EQ(second_calls.size(), first_calls.size());
  for (const auto& c : second_calls) {
    EXPECT_TRUE(c.usage().cache_hit());
    EXPECT_EQ(c.usage().input_tokens() + c.usage().output_tokens(), 0);  // nothing paid
  }
}

}  // namespace
}  // namespace kforge::llm

namespace kforge::llm {
namespace {

struct FakeTime {
  double now = 0;
  std::vector<double> sleeps;
  NowFn now_fn() {
    return [this] { return now; };
  }
  SleepFn sleep_fn() {
    return [this](double s) {
      sleeps.push_back(s);
      now += s;
    };
  }
};

TEST(RateLimiterTest, RequestsPerMinute) {
  FakeTime t;
  RateLimiter lim(8, /*rpm=*/2, /*tpm=*/0, t.now_fn(), t.sleep_fn());
  lim.Acquire(10);
  lim.Release();
  t.now = 5;
  lim.Acquire(10);
  lim.Release();
  EXPECT_TRUE(t.sleeps.empty());
  lim.Acquire(10);  // the third call in the minute waits until the first leaves the window
  lim.Release();
  ASSERT_EQ(t.sleeps.size(), 1u);
  EXPECT_NEAR(t.now, 60.0, 1e-6);
}

TEST(RateLimiterTest, TokensPerMinute) {
  FakeTime t;
  RateLimiter lim(8, 0, /*tpm=*/1000, t.now_fn(), t.sleep_fn());
  lim.Acquire(600);
  lim.Release();
  lim.Acquire(600);
  lim.Release();
  EXPECT_NEAR(t.now, 60.0, 1e-6);
  lim.Acquire(5000);  // larger than the budget: alone in a window, it goes through
  lim.Release();
}

TEST(RateLimiterTest, ConcurrencyCap) {
  RateLimiter lim(1, 0, 0, [] { return 0.0; }, [](double) {});
  lim.Acquire(1);
  std::atomic<bool> second_started{false};
  std::thread other([&] {
    lim.Acquire(1);
    second_started = true;
    lim.Release();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(second_started.load());
  lim.Release();
  other.join();
  EXPECT_TRUE(second_started.load());
}

TEST(PromptFitTest, TooSmallAContextIsRefusedAtJobStart) {
  testing::TempDir dir;
  dir.Write("p/problem.yaml",
            "name: vadd\nbackend: opencl\nsizes: {N: 16}\n"
            "buffers:\n  a: {dtype: f32, shape: [N], role: in}\n  c: {dtype: f32, shape: [N], role: out}\n"
            "reference:\n  source: k.cl\n  launches: [{kernel: k, global: [N], args: [a, c, N]}]\n"
            "seed:\n  source: k.cl\n  launches: [{kernel: k, global: [N], args: [a, c, N]}]\n");
  dir.Write("p/k.cl", "__kernel void k(__global const float* a, __global float* c, int n) { c[get_global_id(0)] = a[get_global_id(0)]; }\n");
  auto problem = LoadProblem(dir.path() + "/p");
  ASSERT_TRUE(problem.ok()) << problem.status();
  CurlHttpClient http;
  auto make = [&](int64_t context) {
    ProviderConfig c;
    c.name = "tiny";
    c.kind = "openai";
    c.base_url = "http://127.0.0.1:1/v1";
    c.model = "m";
    c.context_tokens = context;
    c.max_output_tokens = 256;
    std::vector<std::unique_ptr<Provider>> ps;
    ps.push_back(std::make_unique<Provider>(c, http, [](double) {}));
    return ps;
  };
  auto cache = *ResponseCache::Open("");
  LlmMutator small(make(700), *cache, MakeLogger("fit", spdlog::level::warn));
  absl::Status st = small.CheckPromptFits(*problem);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("provider tiny (context 700 tokens"));
  LlmMutator big(make(32768), *cache, MakeLogger("fit", spdlog::level::warn));
  EXPECT_TRUE(big.CheckPromptFits(*problem).ok());
}

}  // namespace
}  // namespace kforge::llm
