#include "cli/import_command.h"

#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/problem_loader.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "services/gpu-worker/torch_runner.h"

namespace kforge::cli {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr int64_t kMaxModuleBytes = 1 << 20;

absl::StatusOr<std::string> ReadModule(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return absl::InvalidArgumentError(absl::StrCat(path, ": no such file"));
  if (fs::file_size(path, ec) > static_cast<uintmax_t>(kMaxModuleBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": larger than ", kMaxModuleBytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError(absl::StrCat(path, ": not UTF-8 text"));
  return text;
}

// What the import may write: these names only.
bool AllowedFile(const std::string& name) {
  return name == "problem.yaml" || name == "model.py" || name == "seed.cl" || name == "seed.cu";
}

}  // namespace

bool IsModuleFile(const std::string& path) {
  std::error_code ec;
  return fs::path(path).extension() == ".py" && fs::is_regular_file(path, ec);
}

absl::StatusOr<ImportSummary> ImportModule(const ImportArgs& args) {
  if (args.backend != "opencl" && args.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--backend ", args.backend, ": expected opencl or cuda"));
  }
  KF_ASSIGN_OR_RETURN(std::string source, ReadModule(args.file));
  Json sets = Json::object();
  for (const std::string& s : args.sets) {
    const size_t eq = s.find('=');
    double v = 0;
    if (eq == std::string::npos || eq == 0 || !absl::SimpleAtod(s.substr(eq + 1), &v) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("--set ", s, ": expected NAME=NUMBER"));
    }
    if (v == static_cast<double>(static_cast<int64_t>(v))) {
      sets[s.substr(0, eq)] = static_cast<int64_t>(v);
    } else {
      sets[s.substr(0, eq)] = v;
    }
  }
  const std::string out = args.out_dir.empty() ? fs::path(args.file).stem().string() : args.out_dir;
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_empty(out, ec) && !args.force) {
    return absl::InvalidArgumentError(absl::StrCat(out, " exists and is not empty (--force writes into it)"));
  }
  worker::TorchRunner runner(worker::TorchOptions{});
  const Json req = {{"op", "import"},         {"source", source},
                    {"filename", fs::path(args.file).filename().string()},
                    {"backend", args.backend}, {"set", sets},
                    {"fit", args.fit},         {"max_elements", args.max_elements}};
  auto answer = runner.Call(req.dump(), {}, args.timeout_seconds);
  if (!answer.ok()) {
    return absl::Status(answer.status().code(), absl::StrCat(args.file, ": ", answer.status().message()));
  }
  const Json j = Json::parse(answer->first, nullptr, false);
  if (!j.is_object()) return absl::InternalError("the import answered something other than a JSON object");
  if (j.contains("error")) {
    return absl::InvalidArgumentError(
        absl::StrCat(args.file, ": ", j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump()));
  }
  if (!j.contains("files") || !j["files"].is_object()) return absl::InternalError("the import wrote no files");
  fs::create_directories(out, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot create ", out, ": ", ec.message()));
  for (const auto& [name, text] : j["files"].items()) {
    if (!AllowedFile(name) || !text.is_string()) {
      return absl::InternalError(absl::StrCat("the import named a file it may not write: ", name));
    }
    std::ofstream f(fs::path(out) / name, std::ios::binary | std::ios::trunc);
    f << text.get<std::string>();
    if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", (fs::path(out) / name).string()));
  }
  // A stale seed of an earlier import must not stay beside a problem.yaml without one.
  for (const char* stale : {"seed.cl", "seed.cu"}) {
    if (!j["files"].contains(stale)) fs::remove(fs::path(out) / stale, ec);
  }
  KF_RETURN_IF_ERROR(LoadProblem(out).status());
  ImportSummary s;
  s.dir = out;
  const Json& sum = j.value("summary", Json::object());
  if (sum.contains("family") && sum["family"].is_string()) s.family = sum["family"].get<std::string>();
  if (sum.contains("why") && sum["why"].is_string()) s.why = sum["why"].get<std::string>();
  s.check_set = sum.value("check_set", false);
  std::vector<std::string> parts;
  if (sum.contains("sizes") && sum["sizes"].is_object()) {
    for (const auto& [k, v] : sum["sizes"].items()) parts.push_back(absl::StrCat(k, "=", v.dump()));
  }
  s.sizes = absl::StrJoin(parts, " ");
  return s;
}

int RunImport(const ImportArgs& args) {
  auto s = ImportModule(args);
  if (!s.ok()) {
    std::cerr << "kforge import: " << s.status().message() << "\n";
    return absl::IsInvalidArgument(s.status()) ? 2 : 1;
  }
  if (!args.quiet) {
    std::cout << "imported " << args.file << " -> " << s->dir << "\n"
              << "  sizes: " << s->sizes << (s->check_set ? " (and a size set for validation only)" : "") << "\n";
    if (!s->family.empty()) {
      std::cout << "  seed: the " << s->family << " template (tunable; no model needed)\n";
    } else {
      std::cout << "  seed: none (no template fits: " << s->why
                << "); a model writes the first kernels (kforge run --llm)\n";
    }
  }
  return 0;
}

}  // namespace kforge::cli
