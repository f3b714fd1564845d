#include "services/gpu-worker/cuda_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cctype>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/gpu-worker/dl_symbol.h"

extern char** environ;

namespace kforge::worker {

// NVRTC's C API, declared here so that building needs no toolkit headers.
using nvrtcResult = int;
using nvrtcProgram = struct _nvrtcProgram*;

struct Nvrtc::Api {
  nvrtcResult (*version)(int*, int*);
  nvrtcResult (*create)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                        const char* const*);
  nvrtcResult (*compile)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*log_size)(nvrtcProgram, size_t*);
  nvrtcResult (*log)(nvrtcProgram, char*);
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t*);
  nvrtcResult (*cubin)(nvrtcProgram, char*);
  nvrtcResult (*destroy)(nvrtcProgram*);
};

namespace {

// The number that ends right before `pos` in `text` (digits only), if any.
std::optional<int64_t> NumberBefore(const std::string& text, size_t pos) {
  size_t start = pos;
  while (start > 0 && pos - start < 18 && std::isdigit(static_cast<unsigned char>(text[start - 1]))) --start;
  if (start == pos) return std::nullopt;
  return std::stoll(text.substr(start, pos - start));
}

// The number that starts at `pos` in `text`, if any.
std::optional<int64_t> NumberAt(const std::string& text, size_t pos) {
  size_t end = pos;
  while (end < text.size() && end - pos < 18 && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  if (end == pos) return std::nullopt;
  return std::stoll(text.substr(pos, end - pos));
}

// ptxas -v: "Used 32 registers, ..." and "N bytes spill stores, M bytes spill loads". Plain
// searches: the log holds the candidate's text (no regex engine may run over it).
void ReadPtxasInfo(NvrtcOutput* out) {
  const std::string& log = out->log;
  constexpr std::string_view kStores = " bytes spill stores, ";
  constexpr std::string_view kLoads = " bytes spill loads";
  if (size_t p = log.find(kStores); p != std::string::npos) {
    const auto stores = NumberBefore(log, p);
    const auto loads = NumberAt(log, p + kStores.size());
    if (stores && loads && log.compare(p + kStores.size() + std::to_string(*loads).size(), kLoads.size(), kLoads) == 0) {
      out->spill_bytes = *stores + *loads;
    }
  }
  constexpr std::string_view kUsed = "Used ";
  for (size_t p = log.find(kUsed); p != std::string::npos; p = log.find(kUsed, p + 1)) {
    const auto regs = NumberAt(log, p + kUsed.size());
    if (regs && log.compare(p + kUsed.size() + std::to_string(*regs).size(), 10, " registers") == 0) {
      out->registers = static_cast<int>(*regs);
      break;
    }
  }
}

}  // namespace

std::string CudaIncludeDir() {
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(env); v != nullptr && *v) {
      const std::string dir = absl::StrCat(v, "/include");
      if (std::filesystem::exists(dir + "/cuda_fp16.h")) return dir;
    }
  }
  if (std::filesystem::exists("/usr/local/cuda/include/cuda_fp16.h"))
    return "/usr/local/cuda/include";
  return "";
}

absl::StatusOr<std::unique_ptr<Nvrtc>> Nvrtc::Load() {
  std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/lib"}) {
    names.push_back(absl::StrCat(dir, "/libnvrtc.so"));
  }
  void* h = nullptr;
  for (const auto& n : names) {
    h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h != nullptr) break;
  }
  if (h == nullptr) return absl::NotFoundError("NVRTC not found (libnvrtc.so)");
  std::unique_ptr<Nvrtc> n(new Nvrtc());
  n->handle_ = h;
  n->api_ = std::make_unique<Api>();
  Api& a = *n->api_;
  if (!DlSymbol(h, "nvrtcVersion", &a.version) || !DlSymbol(h, "nvrtcCreateProgram", &a.create) ||
      !DlSymbol(h, "nvrtcCompileProgram", &a.compile) ||
      !DlSymbol(h, "nvrtcGetProgramLogSize", &a.log_size) ||
      !DlSymbol(h, "nvrtcGetProgramLog", &a.log) ||
      !DlSymbol(h, "nvrtcGetCUBINSize", &a.cubin_size) || !DlSymbol(h, "nvrtcGetCUBIN", &a.cubin) ||
      !DlSymbol(h, "nvrtcDestroyProgram", &a.destroy)) {
    return absl::NotFoundError("NVRTC library lacks expected symbols");
  }
  return n;
}

Nvrtc::~Nvrtc() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string Nvrtc::Version() const {
  int major = 0, minor = 0;
  api_->version(&major, &minor);
  return absl::StrCat("nvrtc ", major, ".", minor);
}

NvrtcOutput Nvrtc::Compile(const std::string& source, const std::map<std::string, int64_t>& defines,
                           const std::string& arch) const {
  NvrtcOutput out;
  nvrtcProgram prog = nullptr;
  if (api_->create(&prog, source.c_str(), "candidate.cu", 0, nullptr, nullptr) != 0) {
    out.log = "nvrtcCreateProgram failed";
    return out;
  }
  std::vector<std::string> opts = {absl::StrCat("--gpu-architecture=", arch), "--std=c++17",
                                   "--ptxas-options=-v", "-DKFORGE=1"};
  if (const std::string inc = CudaIncludeDir(); !inc.empty())
    opts.push_back(absl::StrCat("-I", inc));
  for (const auto& [k, v] : defines) opts.push_back(absl::StrCat("-D", k, "=", v));
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());
  const nvrtcResult rc = api_->compile(prog, static_cast<int>(argv.size()), argv.data());
  size_t n = 0;
  api_->log_size(prog, &n);
  out.log.assign(n, '\0');
  if (n > 0) api_->log(prog, out.log.data());
  while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  if (rc == 0) {
    size_t size = 0;
    api_->cubin_size(prog, &size);
    out.cubin.assign(size, '\0');
    api_->cubin(prog, out.cubin.data());
    out.ok = size > 0;
    ReadPtxasInfo(&out);
  }
  api_->destroy(&prog);
  return out;
}

namespace {

// Runs argv (no shell), stdout+stderr into *log; returns the exit status (-1 if not started).
int RunCapture(const std::vector<std::string>& argv, const std::string& log_path,
               std::string* log) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  std::ifstream in(log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  *log = ss.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvccCompiler>> NvccCompiler::Find() {
  std::vector<std::string> candidates;
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(env); v != nullptr && *v)
      candidates.push_back(absl::StrCat(v, "/bin/nvcc"));
  }
  candidates.push_back("/usr/local/cuda/bin/nvcc");
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) != 0) continue;
    std::unique_ptr<NvccCompiler> n(new NvccCompiler());
    n->path_ = c;
    std::string out;
    const std::string log =
        (std::filesystem::temp_directory_path() / absl::StrCat("kforge-nvcc-v-", getpid()))
            .string();
    RunCapture({c, "--version"}, log, &out);
    std::filesystem::remove(log);
    const size_t rel = out.find("release ");
    n->version_ = rel == std::string::npos
                      ? "nvcc"
                      : absl::StrCat("nvcc ", out.substr(rel + 8, out.find(',', rel) - rel - 8));
    return n;
  }
  return absl::NotFoundError("nvcc not found (set CUDA_HOME)");
}

NvrtcOutput NvccCompiler::Compile(const std::string& source,
                                  const std::map<std::string, int64_t>& defines,
                                  const std::string& arch) const {
  NvrtcOutput out;
  std::string tmpl = (std::filesystem::temp_directory_path() / "kforge-nvcc-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    out.log = "cannot create a temporary folder for nvcc";
    return out;
  }
  const std::string dir = tmpl;
  {
    std::ofstream src(dir + "/candidate.cu", std::ios::binary);
    src << source;
  }
  std::vector<std::string> argv = {
      path_,        "-cubin", absl::StrCat("-arch=", arch), "--std=c++17",        "-Xptxas", "-v",
      "-DKFORGE=1", "-o",     dir + "/candidate.cubin",     dir + "/candidate.cu"};
  for (const auto& [k, v] : defines) argv.push_back(absl::StrCat("-D", k, "=", v));
  const int rc = RunCapture(argv, dir + "/log.txt", &out.log);
  if (rc == 0) {
    std::ifstream in(dir + "/candidate.cubin", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.cubin = ss.str();
    out.ok = !out.cubin.empty();
    ReadPtxasInfo(&out);
  } else if (out.log.empty()) {
    out.log = absl::StrCat("nvcc failed to run (status ", rc, ")");
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return out;
}

absl::StatusOr<std::unique_ptr<CudaCompiler>> MakeCudaCompiler() {
  const char* choice = std::getenv("KFORGE_CUDA_COMPILER");
  if (choice != nullptr && std::string(choice) == "nvcc") {
    auto n = NvccCompiler::Find();
    if (!n.ok()) return n.status();
    return std::unique_ptr<CudaCompiler>(std::move(*n));
  }
  auto nvrtc = Nvrtc::Load();
  if (nvrtc.ok()) return std::unique_ptr<CudaCompiler>(std::move(*nvrtc));
  auto n = NvccCompiler::Find();
  if (n.ok()) return std::unique_ptr<CudaCompiler>(std::move(*n));
  return absl::NotFoundError(absl::StrCat(nvrtc.status().message(), "; ", n.status().message()));
}

}  // namespace kforge::worker
