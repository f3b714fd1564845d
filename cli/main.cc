// kforge: the command-line client. Exit codes: 0 ok, 1 the operation ran but failed, 2 bad input.

#include <csignal>
#include <iostream>

#include "CLI/CLI.hpp"
#include "cli/eval_command.h"
#include "cli/validate_command.h"
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*validate) return Validate(validate_dir);
  if (*eval) return kforge::cli::RunEval(eval_args);
  return 2;
}
