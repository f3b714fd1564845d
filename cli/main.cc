// kforge: the command-line client. Exit codes: 0 ok, 1 the operation ran but failed, 2 bad input.

#include <csignal>
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/admin_command.h"
#include "cli/client_commands.h"
#include "cli/eval_command.h"
#include "cli/health_command.h"
#include "cli/import_command.h"
#include "cli/run_command.h"
#include "cli/suite_command.h"
#include "cli/validate_command.h"
#include "common/host_memory.h"
#include "common/problem_loader.h"

namespace {

int Validate(const std::string& dir) {
  auto problem = kforge::LoadProblem(dir);
  if (!problem.ok()) {
    std::cerr << "kforge validate: " << problem.status().message() << "\n";
    return 2;
  }
  auto summary = kforge::cli::SummariseProblem(*problem);
  if (!summary.ok()) {
    std::cerr << "kforge validate: " << dir << ": " << summary.status().message() << "\n";
    return 2;
  }
  std::cout << *summary << "ok\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  // eval and run move kernel buffers in this process; if refused, they are only slower.
  (void)kforge::KeepLargeAllocationsInHeap();
  CLI::App app{"kforge: evolutionary GPU kernel optimization", "kforge"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kforge 0.1.0");

  std::string validate_dir;
  auto* validate = app.add_subcommand("validate", "load a problem folder, check it, print a summary");
  validate->add_option("PROBLEM_DIR", validate_dir, "problem folder (problem.yaml + sources)")->required();

  kforge::cli::EvalArgs eval_args;
  auto* eval = app.add_subcommand("eval", "run one candidate through the evaluation pipeline locally");
  eval->add_option("PROBLEM_DIR", eval_args.problem_dir, "problem folder")->required();
  eval->add_option("--source", eval_args.source_file, "kernel source to evaluate (default: the seed's)");
  eval->add_option("--params", eval_args.params, "knob values NAME=V,NAME=V (default: the seed's first valid)");
  eval->add_option("--launches", eval_args.launches_file, "launch plan YAML (launches:, scratch:)");
  eval->add_flag("--json", eval_args.json, "print the EvaluationResult as JSON");
  eval->add_option("--timeout", eval_args.timeout_seconds, "wall-clock limit per sandboxed run, seconds");
  eval->add_option("--compile-timeout", eval_args.compile_timeout_seconds,
                   "wall-clock limit per compilation, seconds (default 30)");
  eval->add_option("--cache-dir", eval_args.cache_dir,
                   "folder for the device runtimes' compiled-kernel caches and kforge's kernel binary cache, kept "
                  "between runs (\"\" = none)")
      ->default_str(eval_args.cache_dir);

  kforge::cli::RunArgs run_args;
  auto* run = app.add_subcommand("run", "optimise a problem embedded: coordinator, workers and mutator in this process");
  run->add_option("PROBLEM_DIR", run_args.problem_dir, "problem folder, or a PyTorch module file (FILE.py) to import")
      ->required();
  run->add_option("--set", run_args.sets, "with FILE.py: NAME=VALUE, a module constant (a size), repeatable");
  run->add_option("--fit", run_args.fit, "with FILE.py: halve the largest constants until every tensor holds at most N elements");
  run->add_option("--backend", run_args.backend, "with FILE.py: opencl or cuda (default opencl)");
  run->add_option("--budget", run_args.budget, "evaluations, the seed included (0 = no limit)");
  run->add_option("--time", run_args.time_seconds, "wall-clock budget in seconds");
  run->add_option("--seed", run_args.seed, "random seed: the same seed gives the same search");
  run->add_option("--workers", run_args.workers, "evaluations in parallel (one sandbox each)");
  run->add_option("--out", run_args.out_dir, "folder for the best kernel and the reports");
  run->add_flag("--resume", run_args.resume, "continue the latest unfinished job of this problem");
  run->add_option("--job", run_args.job_id, "with --resume: the job to continue");
  run->add_option("--db", run_args.db,
                  "SQLite database file, or a PostgreSQL database: postgresql://user@host:port/db");
  run->add_option("--target", run_args.target, "stop once this speedup is reached");
  run->add_option("--patience", run_args.patience, "stop after N evaluations without improvement");
  run->add_option("--islands", run_args.islands, "islands of the evolution");
  run->add_option("--screen", run_args.screen,
                  "parametric children the surrogate model screens per proposal (default 16, 1 = off)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--timeout", run_args.timeout_seconds, "wall-clock limit per sandboxed run, seconds");
  run->add_option("--compile-timeout", run_args.compile_timeout_seconds,
                  "wall-clock limit per compilation, seconds (default 30)");
  run->add_option("--finalists", run_args.finalists,
                  "fittest candidates re-measured side by side with the reference before the best is reported "
                  "(default 3, 0 = off)")
      ->check(CLI::Range(0, 10));
  run->add_option("--confirm-rounds", run_args.confirm_rounds, "rounds of that re-measurement (default 9)")
      ->check(CLI::Range(1, 50));
  run->add_flag("--compile-ahead,!--no-compile-ahead", run_args.compile_ahead,
                "on a device that is not the host's CPU, each worker takes a second candidate and compiles it "
                "in a builder sandbox while the first runs (default on; PoCL never)");
  run->add_flag("--always-remeasure", run_args.always_remeasure,
                "re-measure the finalists even when their own benchmarks already rank the best beyond their "
                "intervals (by default those are not re-measured)");
  run->add_option("--confirm-every", run_args.confirm_every,
                  "in a long job, re-measure the finalists every this many evaluations too (default 100, 0 = at "
                  "the end only)")
      ->check(CLI::NonNegativeNumber);
  run->add_option("--cache-dir", run_args.cache_dir,
                  "folder for the device runtimes' compiled-kernel caches and kforge's kernel binary cache, kept "
                  "between runs (\"\" = none)")
      ->default_str(run_args.cache_dir);
  run->add_flag("--fresh", run_args.fresh,
                "measure every candidate anew (by default a candidate an earlier job in the same --db evaluated "
                "on this device is not run again: that evaluation is reused)");
  run->add_flag("--cold", run_args.cold,
                "start from nothing (by default the search is warmed by earlier jobs in the same --db that tuned "
                "the same kernel on other devices or shapes: their best configurations and their ranking)");
  run->add_flag("--quiet", run_args.quiet, "print only the final summary");
  run->add_option("--llm", run_args.llm_config, "LLM providers YAML (see README); default: parametric only");
  run->add_option("--llm-proxy", run_args.llm_proxy, "host:port of a kforge-llm-proxy to ask for mutations");
  run->add_option("--llm-proxy-ca", run_args.llm_proxy_tls.ca, "CA (PEM file) of a proxy serving TLS");
  run->add_option("--llm-proxy-cert", run_args.llm_proxy_tls.cert, "client certificate (PEM file), for mutual TLS");
  run->add_option("--llm-proxy-key", run_args.llm_proxy_tls.key, "its private key (PEM file)");
  run->add_option("--llm-proxy-token-file", run_args.llm_proxy_token_file,
                  "file holding the proxy's bearer token (its auth.token_file)");
  run->add_option("--max-llm-tokens", run_args.max_llm_tokens, "model calls stop (the parametric mutator goes on) before this many tokens");
  run->add_option("--max-llm-cost", run_args.max_llm_cost, "model calls stop (the parametric mutator goes on) before this cost in USD");
  run->add_option("--queue", run_args.queue,
                  "work queue: redis://host:port[/db] for Redis Streams (default: in-process)");

  kforge::cli::ImportArgs import_args;
  auto* import = app.add_subcommand("import", "write a problem folder from a PyTorch module (KernelBench's format)");
  import->add_option("FILE", import_args.file, "the module file (class Model, get_inputs, get_init_inputs)")->required();
  import->add_option("--out", import_args.out_dir, "problem folder to write (default: the file's name)");
  import->add_option("--backend", import_args.backend, "opencl or cuda (default opencl)");
  import->add_option("--set", import_args.sets, "NAME=VALUE: a module constant (a size), repeatable");
  import->add_option("--fit", import_args.fit,
                     "halve the largest constants not --set until every tensor holds at most N elements")
      ->check(CLI::NonNegativeNumber);
  import->add_flag("--force", import_args.force, "write into a folder that is not empty");
  import->add_option("--max-elements", import_args.max_elements,
                     "refuse a module with an input, output or parameter of more elements (default 2^26)")
      ->check(CLI::PositiveNumber);
  import->add_option("--timeout", import_args.timeout_seconds,
                     "seconds the module may take to import and run once (default 600)")
      ->check(CLI::PositiveNumber);

  kforge::cli::SuiteArgs suite_args;
  auto* suite = app.add_subcommand("suite", "optimise many problems (PyTorch module files or folders) and report "
                                            "KernelBench's figures: correct, fast_1, geometric-mean speedup");
  suite->add_option("PATHS", suite_args.paths, "module files, folders of them, or problem folders")->required();
  suite->add_option("--budget", suite_args.run.budget, "evaluations per problem (default 100)");
  suite->add_option("--time", suite_args.run.time_seconds, "wall-clock budget per problem, seconds");
  suite->add_option("--seed", suite_args.run.seed, "random seed");
  suite->add_option("--workers", suite_args.run.workers, "evaluations in parallel");
  suite->add_option("--out", suite_args.out_dir, "folder for each problem's run and suite.json (default kforge-suite)");
  suite->add_option("--db", suite_args.run.db, "database for the runs (default: OUT/suite.db)");
  suite->add_option("--set", suite_args.run.sets, "NAME=VALUE for every module that has the constant");
  suite->add_option("--fit", suite_args.run.fit, "halve each module's constants until tensors hold at most N elements");
  suite->add_option("--backend", suite_args.run.backend, "opencl or cuda (default opencl)");
  suite->add_option("--timeout", suite_args.run.timeout_seconds, "wall-clock limit per sandboxed run, seconds");
  suite->add_option("--finalists", suite_args.run.finalists, "finalists re-measured per problem (default 3)");
  suite->add_option("--llm", suite_args.run.llm_config, "LLM providers YAML (problems with no template need one)");
  suite->add_flag("--json", suite_args.json, "print the figures and the table as JSON");
  suite->add_option("--server", suite_args.client.server,
                    "submit every problem to this kforge-coordinator (host:port) instead of running them here");
  suite->add_option("--token", suite_args.client.token, "with --server: API key (default: $KFORGE_TOKEN)");
  suite->add_option("--tls-ca", suite_args.client.tls.ca, "with --server: CA (PEM file) of a coordinator serving TLS");
  suite->add_option("--tls-cert", suite_args.client.tls.cert, "with --server: client certificate (PEM file)");
  suite->add_option("--tls-key", suite_args.client.tls.key, "with --server: its private key (PEM file)");

  kforge::cli::HealthArgs health_args;
  auto* health = app.add_subcommand("health", "ask a kforge service whether it serves (gRPC health check)");
  health->add_option("--server", health_args.server, "the service's gRPC host:port (default 127.0.0.1:7070)");
  health->add_option("--service", health_args.service, "one service's name (default: the server as a whole)");
  health->add_option("--tls-ca", health_args.tls.ca, "CA (PEM file) of a service serving TLS");
  health->add_option("--tls-cert", health_args.tls.cert, "client certificate (PEM file), for mutual TLS");
  health->add_option("--tls-key", health_args.tls.key, "its private key (PEM file)");
  health->add_option("--timeout", health_args.timeout_seconds, "seconds to wait for the answer (default 3)")
      ->check(CLI::PositiveNumber);

  kforge::cli::ClientCommands client_commands;
  client_commands.Register(app);
  kforge::cli::AdminCommands admin_commands;
  admin_commands.Register(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*validate) return Validate(validate_dir);
  if (*eval) return kforge::cli::RunEval(eval_args);
  if (*import) return kforge::cli::RunImport(import_args);
  if (*suite) {
    if (suite_args.run.db == "kforge.db") suite_args.run.db = suite_args.out_dir + "/suite.db";
    return kforge::cli::RunSuite(suite_args);
  }
  if (*run) return kforge::cli::RunJob(run_args);
  if (*health) return kforge::cli::HealthCommand(health_args);
  if (auto rc = client_commands.Run()) return *rc;
  if (auto rc = admin_commands.Run()) return *rc;
  return 2;
}
