#include "services/gpu-worker/torch_runner.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/gpu-worker/child_process.h"
#include "services/gpu-worker/framing.h"
#include "services/gpu-worker/sandbox.h"

namespace kforge::worker {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr uint32_t kMaxHeaderBytes = 64u << 20;
constexpr uint64_t kMaxPayloadBytes = uint64_t{16} << 30;

bool Executable(const std::string& p) { return !p.empty() && access(p.c_str(), X_OK) == 0; }

std::string FindPython(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* v = std::getenv("KFORGE_PYTHON"); v != nullptr && *v) return v;
  if (Executable("/usr/bin/python3")) return "/usr/bin/python3";
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string p(path);
    for (size_t start = 0; start <= p.size();) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      const std::string cand = (fs::path(p.substr(start, end - start)) / "python3").string();
      if (Executable(cand)) return cand;
      start = end + 1;
    }
  }
  return "python3";
}

std::string FindJemalloc() {
  for (const char* p : {"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                        "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2"}) {
    if (access(p, R_OK) == 0) return p;
  }
  return "";
}

int CpusAllowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return CPU_COUNT(&set);
}

absl::Status WriteAllBytes(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("write to the PyTorch process failed: ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

std::vector<TorchTensor> TensorsFrom(const Json& specs, std::string_view payload) {
  std::vector<TorchTensor> out;
  if (!specs.is_array()) return out;
  for (const Json& s : specs) {
    TorchTensor t;
    if (!s.is_object()) continue;
    t.dtype = s.value("dtype", std::string());
    t.key = s.value("key", std::string());
    if (s.contains("shape") && s["shape"].is_array()) {
      for (const Json& d : s["shape"]) t.shape.push_back(d.is_number_integer() ? d.get<int64_t>() : -1);
    }
    const uint64_t off = s.value("offset", uint64_t{0}), len = s.value("bytes", uint64_t{0});
    if (off <= payload.size() && len <= payload.size() - off) t.bytes = payload.substr(off, len);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

std::string FindTorchPackage() {
  if (const char* v = std::getenv("KFORGE_PYTHON_DIR"); v != nullptr && *v) return v;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& p : {self.parent_path() / "../share/kforge/python", self.parent_path() / "python"}) {
      if (fs::is_directory(p / "kforge_torch", ec)) return fs::weakly_canonical(p, ec).string();
    }
  }
#ifdef KFORGE_PYTHON_SOURCE_DIR
  if (fs::is_directory(fs::path(KFORGE_PYTHON_SOURCE_DIR) / "kforge_torch", ec)) return KFORGE_PYTHON_SOURCE_DIR;
#endif
  return "";
}

std::string TorchDtypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return "f32";
    case v1::DTYPE_F64:
      return "f64";
    case v1::DTYPE_F16:
      return "f16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_I32:
      return "i32";
    case v1::DTYPE_I64:
      return "i64";
    case v1::DTYPE_U8:
      return "u8";
    default:
      return "";
  }
}

std::string TensorSpecs(const std::vector<TorchTensor>& tensors, std::string* payload) {
  Json specs = Json::array();
  for (const TorchTensor& t : tensors) {
    Json s = {{"dtype", t.dtype}, {"shape", t.shape}, {"offset", payload->size()}, {"bytes", t.bytes.size()}};
    if (!t.key.empty()) s["key"] = t.key;
    specs.push_back(std::move(s));
    payload->append(t.bytes);
  }
  return specs.dump();
}

TorchRunner::TorchRunner(TorchOptions options) : options_(std::move(options)) {
  options_.python = FindPython(options_.python);
  if (options_.package_dir.empty()) options_.package_dir = FindTorchPackage();
  if (options_.sandbox_binary.empty()) options_.sandbox_binary = FindSandboxBinary();
  if (options_.threads <= 0) options_.threads = CpusAllowed();
}

TorchRunner::~TorchRunner() {
  Kill();
  if (!work_dir_.empty()) {
    std::error_code ec;
    fs::remove_all(work_dir_, ec);
  }
}

absl::Status TorchRunner::Spawn() {
  if (options_.package_dir.empty()) {
    return absl::FailedPreconditionError(
        "the kforge_torch package is not found (set KFORGE_PYTHON_DIR to the python/ folder of kforge)");
  }
  KF_ASSIGN_OR_RETURN(const ChildUser user,
                      PrepareChild(options_.sandbox_binary, options_.run_as_uid, "kforge-torch", &work_dir_));
  std::vector<std::string> extra = {"PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1", "PYTHONUNBUFFERED=1"};
  if (options_.reuse_memory) {
    if (const std::string je = FindJemalloc(); !je.empty()) {
      extra.push_back(absl::StrCat("LD_PRELOAD=", je));
      extra.push_back("MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1");
    }
  }
  std::string device = options_.device;
  if (const char* env = std::getenv("KFORGE_TORCH_DEVICE"); device.empty() && env != nullptr && *env) device = env;
  if (device.empty()) device = "cpu";
  extra.push_back(absl::StrCat("KFORGE_TORCH_DEVICE=", device));
  // The jail opens the GPU's driver files only for a process that runs on it.
  const bool cuda = absl::StartsWith(device, "cuda");
  ChildSpec spec;
  // A root worker's build and checkout may lie where the child's user cannot reach them.
  KF_ASSIGN_OR_RETURN(spec.binary, ReachableCopy(options_.sandbox_binary, user));
  KF_ASSIGN_OR_RETURN(const std::string package, ReachableCopy(options_.package_dir, user));
  spec.env = ChildEnvironment(work_dir_, options_.env_allow, extra);
  spec.args = {"--python", options_.python, "--package", package, "--backend", cuda ? "cuda" : "opencl"};
  if (options_.jail) spec.args.emplace_back("--jail");
  if (options_.require_jail) spec.args.emplace_back("--require-jail");
  if (options_.allow_fork) spec.args.emplace_back("--allow-fork");
  // A python outside the system's folders (a virtual environment) must be readable in the jail.
  const fs::path prefix = fs::path(options_.python).parent_path().parent_path();
  if (!prefix.empty() && prefix != "/usr" && prefix != "/") {
    spec.args.emplace_back("--read");
    spec.args.push_back(prefix.string());
  }
  spec.work_dir = work_dir_;
  if (!cuda) spec.address_space_bytes = options_.memory_limit_mb << 20;
  spec.user = user;
  KF_ASSIGN_OR_RETURN(Child child, StartChild(spec));
  pid_ = child.pid;
  fd_ = child.fd;
  drain_stop_ = false;
  output_budget_ = options_.max_output_bytes;
  drain_ = std::thread([this, fd = child.err_fd] { DrainOutput(fd); });
  ++generation_;
  return absl::OkStatus();
}

void TorchRunner::DrainOutput(int fd) {
  char buf[8192];
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) break;
    if (r > 0) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      const int64_t left = output_budget_.fetch_sub(n);
      if (left > 0) (void)!write(2, buf, static_cast<size_t>(std::min<int64_t>(n, left)));
    } else if (drain_stop_) {
      break;
    }
  }
  close(fd);
}

std::string TorchRunner::Reap(bool kill_first) {
  if (pid_ <= 0) return "not running";
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  const std::string how = ReapChild(pid_, kill_first);
  pid_ = -1;
  drain_stop_ = true;
  if (drain_.joinable()) drain_.join();
  return absl::StrCat("the PyTorch process ", how);
}

void TorchRunner::Kill() {
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ > 0) Reap(/*kill_first=*/true);
}

absl::StatusOr<std::pair<std::string, std::string>> TorchRunner::Exchange(const std::string& header,
                                                                          std::string_view payload, double timeout) {
  output_budget_ = options_.max_output_bytes;
  const uint32_t n = static_cast<uint32_t>(header.size());
  const uint64_t m = payload.size();
  unsigned char h4[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                         static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  unsigned char h8[8];
  for (int i = 0; i < 8; ++i) h8[i] = static_cast<unsigned char>(m >> (8 * i));
  absl::Status st = WriteAllBytes(fd_, h4, 4);
  if (st.ok()) st = WriteAllBytes(fd_, header.data(), header.size());
  if (st.ok()) st = WriteAllBytes(fd_, h8, 8);
  if (st.ok()) st = WriteAllBytes(fd_, payload.data(), payload.size());
  if (!st.ok()) return absl::UnavailableError(absl::StrCat(Reap(false), " (", st.message(), ")"));
  bytes_sent_ += static_cast<int64_t>(12 + header.size() + payload.size());
  const int64_t deadline = MonotonicMillis() + static_cast<int64_t>(timeout * 1000);
  auto fail = [&](const absl::Status& why) -> absl::Status {
    if (absl::IsDeadlineExceeded(why)) {
      Reap(/*kill_first=*/true);
      return absl::DeadlineExceededError(
          absl::StrCat("the PyTorch reference gave no answer within ", timeout, " s (its process was killed)"));
    }
    return absl::UnavailableError(Reap(false));
  };
  unsigned char r4[4];
  if (absl::Status s = ReadFull(fd_, r4, 4, deadline); !s.ok()) return fail(s);
  const uint32_t hn = r4[0] | (r4[1] << 8) | (r4[2] << 16) | (static_cast<uint32_t>(r4[3]) << 24);
  if (hn > kMaxHeaderBytes) return absl::DataLossError(absl::StrCat(Reap(true), ": an answer header of ", hn, " bytes"));
  std::string answer(hn, '\0');
  if (absl::Status s = ReadFull(fd_, answer.data(), hn, deadline); !s.ok()) return fail(s);
  unsigned char r8[8];
  if (absl::Status s = ReadFull(fd_, r8, 8, deadline); !s.ok()) return fail(s);
  uint64_t pn = 0;
  for (int i = 0; i < 8; ++i) pn |= static_cast<uint64_t>(r8[i]) << (8 * i);
  if (pn > kMaxPayloadBytes) return absl::DataLossError(absl::StrCat(Reap(true), ": an answer of ", pn, " bytes"));
  std::string data(pn, '\0');
  if (pn > 0) {
    if (absl::Status s = ReadFull(fd_, data.data(), pn, deadline); !s.ok()) return fail(s);
  }
  bytes_received_ += static_cast<int64_t>(12 + hn + pn);
  return std::make_pair(std::move(answer), std::move(data));
}

absl::StatusOr<TorchInfo> TorchRunner::EnsureStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ > 0) return info_;
  KF_RETURN_IF_ERROR(Spawn());
  auto answer = Exchange(Json{{"op", "hello"}, {"threads", options_.threads}}.dump(), {},
                         options_.start_timeout_seconds);
  if (!answer.ok()) {
    return absl::UnavailableError(absl::StrCat("no PyTorch here (", options_.python, "): ", answer.status().message()));
  }
  const Json j = Json::parse(answer->first, nullptr, false);
  if (!j.is_object() || !j.contains("torch") || !j["torch"].is_string()) {
    const std::string why = j.is_object() && j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>()
                                                                                          : answer->first.substr(0, 200);
    Reap(true);
    return absl::UnavailableError(absl::StrCat("no PyTorch here: ", why));
  }
  info_.version = j["torch"].get<std::string>();
  info_.device = j.value("device", std::string("cpu"));
  info_.compile = j.value("compile", false);
  info_.threads = j.value("threads", 0);
  return info_;
}

absl::StatusOr<std::pair<std::string, std::string>> TorchRunner::Call(const std::string& header_json,
                                                                      const std::string& payload, double timeout) {
  KF_RETURN_IF_ERROR(EnsureStarted().status());
  std::lock_guard<std::mutex> lock(mu_);
  if (pid_ <= 0) return absl::UnavailableError("the PyTorch process is gone");
  return Exchange(header_json, payload, timeout);
}

namespace {

// The answer's JSON, or its error as a status: the module's own errors are InvalidArgument (the
// problem's fault), the rest Internal.
absl::StatusOr<Json> Answer(const std::pair<std::string, std::string>& answer) {
  Json j = Json::parse(answer.first, nullptr, false);
  if (!j.is_object()) return absl::DataLossError("the PyTorch process answered something other than a JSON object");
  if (j.contains("error")) {
    const std::string e = j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump();
    return absl::InvalidArgumentError(absl::StrCat("the PyTorch reference: ", e));
  }
  return j;
}

}  // namespace

absl::StatusOr<std::vector<TorchTensor>> TorchRunner::Load(const std::string& set, const std::string& problem,
                                                           const v1::TorchReference& ref,
                                                           const std::map<std::string, double>& constants,
                                                           uint64_t seed, int64_t max_state_bytes, double timeout) {
  Json c = Json::object();
  for (const auto& [k, v] : constants) {
    // Sizes are integers in the file; fixed constants keep their type.
    if (v == static_cast<double>(static_cast<int64_t>(v)) && ref.fixed_constants().count(k) == 0) {
      c[k] = static_cast<int64_t>(v);
    } else {
      c[k] = v;
    }
  }
  const Json req = {{"op", "load"},
                    {"set", set},
                    {"problem", problem},
                    {"source", ref.source()},
                    {"filename", ref.source_file()},
                    {"constants", c},
                    {"seed", seed},
                    {"max_state_bytes", max_state_bytes}};
  KF_ASSIGN_OR_RETURN(auto answer, Call(req.dump(), {}, timeout));
  KF_ASSIGN_OR_RETURN(Json j, Answer(answer));
  answer_payload_ = std::move(answer.second);
  return TensorsFrom(j.value("state", Json::array()), answer_payload_);
}

absl::StatusOr<std::vector<TorchTensor>> TorchRunner::Run(const std::string& set,
                                                          const std::vector<TorchTensor>& inputs, double timeout) {
  std::string payload;
  const Json specs = Json::parse(TensorSpecs(inputs, &payload));
  KF_ASSIGN_OR_RETURN(auto answer, Call(Json{{"op", "run"}, {"set", set}, {"inputs", specs}}.dump(), payload, timeout));
  KF_ASSIGN_OR_RETURN(Json j, Answer(answer));
  answer_payload_ = std::move(answer.second);
  return TensorsFrom(j.value("outputs", Json::array()), answer_payload_);
}

absl::StatusOr<std::vector<double>> TorchRunner::Time(const std::string& set, const std::string& mode,
                                                      const std::vector<std::vector<TorchTensor>>& sets,
                                                      const TorchSampling& s, double timeout) {
  std::string payload;
  Json all = Json::array();
  for (const auto& inputs : sets) all.push_back(Json::parse(TensorSpecs(inputs, &payload)));
  const Json req = {{"op", "time"},          {"set", set},
                    {"mode", mode},          {"sets", all},
                    {"warmup", s.warmup},    {"min_samples", s.min_samples},
                    {"max_samples", s.max_samples}, {"min_seconds", s.min_seconds},
                    {"max_seconds", s.max_seconds}};
  KF_ASSIGN_OR_RETURN(auto answer, Call(req.dump(), payload, timeout));
  KF_ASSIGN_OR_RETURN(Json j, Answer(answer));
  std::vector<double> samples;
  if (j.contains("samples") && j["samples"].is_array()) {
    for (const Json& x : j["samples"]) {
      if (x.is_number()) samples.push_back(x.get<double>());
    }
  }
  if (samples.empty()) return absl::InternalError("the PyTorch reference returned no timing samples");
  return samples;
}

}  // namespace kforge::worker
