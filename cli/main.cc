// kforge: the command-line client. Exit codes: 0 ok, 1 the operation ran but failed, 2 bad input.

#include <iostream>

#include "CLI/CLI.hpp"
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
  CLI::App app{"kforge: evolutionary GPU kernel optimization", "kforge"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kforge 0.1.0");

  std::string validate_dir;
  auto* validate = app.add_subcommand("validate", "load a problem folder, check it, print a summary");
  validate->add_option("PROBLEM_DIR", validate_dir, "problem folder (problem.yaml + sources)")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*validate) return Validate(validate_dir);
  return 2;
}
