// kforge-bench-llm: the LLM proxy's own cost. (1) Overhead per mutation on large sources: prompt
// build + reply parse + edit application, against the HTTP round trip to a local server measured
// in the same run. (2) Sustained mutations per second through the full LLM mutator against a local
// scripted OpenAI-compatible server that answers at once, at concurrency 1 and N.
//
//   kforge-bench-llm [--concurrency 4] [--mutations 200]

#include <atomic>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "common/launch.h"
#include "common/logging.h"
#include "common/problem_loader.h"
#include "nlohmann/json.hpp"
#include "services/llm-proxy/edit_parser.h"
#include "services/llm-proxy/llm_mutator.h"
#include "services/llm-proxy/prompt_builder.h"
#include "tests/testutil/scripted_http_server.h"
#include "tests/testutil/temp_dir.h"

using namespace kforge;

namespace {

std::string BigKernel(int functions) {
  std::string s;
  for (int f = 0; f < functions; ++f) {
    absl::StrAppend(&s, "float helper_", f, "(float x) {\n  float y = x * ", f, ".5f;\n  y = y + 1.0f;\n  return y;\n}\n\n");
  }
  absl::StrAppend(&s, "__kernel void add(__global const float* a, __global float* c, int n) {\n"
                      "  int i = get_global_id(0);\n  if (i < n) c[i] = helper_0(a[i]);\n}\n");
  return s;
}

std::string Reply(int functions, int edits) {
  std::string r = "Here are the changes:\n";
  for (int e = 0; e < edits; ++e) {
    const int f = (e * 7919) % functions;
    absl::StrAppend(&r, "<<<<<<< SEARCH\n  float y = x * ", f, ".5f;\n=======\n  float y = x * ", f, ".25f;\n>>>>>>> REPLACE\n");
  }
  return r;
}

std::string OpenAi(const std::string& text) {
  return nlohmann::json{{"choices", {{{"message", {{"content", text}}}}}},
                        {"usage", {{"prompt_tokens", 1000}, {"completion_tokens", 200}}}}
      .dump();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kforge LLM proxy overhead benchmark", "kforge-bench-llm"};
  int concurrency = 4, mutations = 200;
  app.add_option("--concurrency", concurrency, "parallel mutation calls");
  app.add_option("--mutations", mutations, "mutations per run");
  CLI11_PARSE(app, argc, argv);

  testing::TempDir dir;
  std::cout << "| source | prompt build | parse | apply 5 edits | total | local HTTP round trip | overhead / round trip |\n"
            << "|---|---|---|---|---|---|---|\n";
  for (int functions : {100, 1000, 4000}) {
    const std::string src = BigKernel(functions);
    dir.Write("p/k.cl", src);
    dir.Write("p/problem.yaml",
              "name: big\nbackend: opencl\ndescription: a large kernel\nsizes: {N: 1024}\n"
              "buffers:\n  a: {dtype: f32, shape: [N], role: in}\n  c: {dtype: f32, shape: [N], role: out}\n"
              "reference:\n  source: k.cl\n  launches: [{kernel: add, global: [N], args: [a, c, N]}]\n"
              "seed:\n  source: k.cl\n  launches: [{kernel: add, global: [N], args: [a, c, N]}]\n");
    auto problem = LoadProblem(dir.path() + "/p");
    if (!problem.ok()) {
      std::cerr << problem.status() << "\n";
      return 1;
    }
    v1::MutateRequest req;
    *req.mutable_problem() = *problem;
    *req.add_parents()->mutable_candidate() = MakeSeedCandidate(*problem, {});
    const std::string reply = Reply(functions, 5);
    std::vector<double> tb, tp, ta, rtt;
    for (int r = 0; r < 30; ++r) {
      double s = bench::Now();
      auto prompt = llm::BuildPrompt(req, 1 << 22);
      tb.push_back(bench::Now() - s);
      s = bench::Now();
      auto parsed = llm::ParseModelReply(reply);
      tp.push_back(bench::Now() - s);
      s = bench::Now();
      auto applied = llm::ApplyEdits(src, parsed->edits);
      ta.push_back(bench::Now() - s);
      if (!prompt.ok() || !applied.ok()) {
        std::cerr << "bench setup failed\n";
        return 1;
      }
    }
    {
      testing::ScriptedHttpServer server;
      llm::CurlHttpClient http;
      for (int r = 0; r < 30; ++r) server.Push({200, {}, OpenAi(reply)});
      for (int r = 0; r < 30; ++r) {
        const double s = bench::Now();
        (void)http.Post(server.url() + "/v1/chat/completions", {}, "{}", 5);
        rtt.push_back(bench::Now() - s);
      }
    }
    const double total = bench::Median(tb) + bench::Median(tp) + bench::Median(ta);
    std::cout << absl::StrFormat("| %d KB | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.2f |\n",
                                 src.size() / 1024, bench::Median(tb) * 1e3, bench::Median(tp) * 1e3,
                                 bench::Median(ta) * 1e3, total * 1e3, bench::Median(rtt) * 1e3,
                                 total / bench::Median(rtt));
  }

  // Sustained mutations per second through the whole LLM mutator.
  dir.Write("q/k.cl", BigKernel(100));
  dir.Write("q/problem.yaml",
            "name: q\nbackend: opencl\nsizes: {N: 1024}\n"
            "buffers:\n  a: {dtype: f32, shape: [N], role: in}\n  c: {dtype: f32, shape: [N], role: out}\n"
            "reference:\n  source: k.cl\n  launches: [{kernel: add, global: [N], args: [a, c, N]}]\n"
            "seed:\n  source: k.cl\n  launches: [{kernel: add, global: [N], args: [a, c, N]}]\n");
  auto problem = LoadProblem(dir.path() + "/q");
  auto run = [&](int conc) {
    testing::ScriptedHttpServer server;
    for (int i = 0; i < mutations; ++i) server.Push({200, {}, OpenAi(Reply(100, 3))});
    llm::CurlHttpClient http;
    llm::ProviderConfig c;
    c.name = "scripted";
    c.kind = "openai";
    c.base_url = server.url() + "/v1";
    c.model = "m";
    c.max_concurrency = conc;
    std::vector<std::unique_ptr<llm::Provider>> ps;
    ps.push_back(std::make_unique<llm::Provider>(c, http, [](double) {}));
    auto cache = *llm::ResponseCache::Open("");
    llm::LlmMutator m(std::move(ps), *cache, MakeLogger("bench", spdlog::level::err));
    std::atomic<int> next{0}, made{0};
    const double s = bench::Now();
    std::vector<std::thread> threads;
    for (int t = 0; t < conc; ++t) {
      threads.emplace_back([&] {
        for (int i = next++; i < mutations; i = next++) {
          v1::MutateRequest req;
          *req.mutable_problem() = *problem;
          *req.add_parents()->mutable_candidate() = MakeSeedCandidate(*problem, {});
          req.set_seed(static_cast<uint64_t>(i) + 1);  // distinct prompts: no cache hits
          auto r = m.Mutate(req, [](const std::string&) { return false; });
          if (r.ok() && r->children_size() == 1) ++made;
        }
      });
    }
    for (auto& t : threads) t.join();
    return std::make_pair(made.load() / (bench::Now() - s), made.load());
  };
  const auto one = run(1);
  const auto many = run(concurrency);
  std::cout << absl::StrFormat("\nsustained LLM mutations against a local instant server: %.0f/s at concurrency 1, "
                               "%.0f/s at concurrency %d (%.2fx); %d and %d children of %d\n",
                               one.first, many.first, concurrency, many.first / one.first, one.second, many.second,
                               mutations);
  return 0;
}
