#pragma once

#include "services/gpu-worker/layer.h"

// CUDA compilers: NVRTC in-process (loaded with dlopen at run time, so binaries start on machines
// without it) and nvcc as a subprocess. Both turn CUDA C++ into a cubin for one architecture.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kforge::worker {

struct NvrtcOutput {
  bool ok = false;
  std::string log;
  std::string cubin;
  int64_t spill_bytes = -1;  // from ptxas' verbose output, -1 when not reported
  int32_t registers = -1;
};

// Turns CUDA C++ into a cubin for one architecture.
class CudaCompiler {
 public:
  virtual ~CudaCompiler() = default;
  virtual std::string Version() const = 0;
  // Compiles CUDA C++ to a cubin for `arch` (e.g. "sm_90") with -D defines.
  virtual NvrtcOutput Compile(const std::string& source,
                              const std::map<std::string, int64_t>& defines,
                              const std::string& arch) const = 0;
};

// NVRTC loaded from the usual library names (libnvrtc.so.13, .12, libnvrtc.so): in-process, the
// default.
class Nvrtc final : public CudaCompiler {
 public:
  // NotFound when no NVRTC library can be loaded.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Nvrtc>> Load();
  ~Nvrtc();

  std::string Version() const override;
  NvrtcOutput Compile(const std::string& source, const std::map<std::string, int64_t>& defines,
                      const std::string& arch) const override;

  struct Api;

 private:
  Nvrtc() = default;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
};

// nvcc as a subprocess writing a cubin into a private temporary folder: the fallback when NVRTC
// is missing, or chosen with KFORGE_CUDA_COMPILER=nvcc.
class NvccCompiler final : public CudaCompiler {
 public:
  // NotFound when no nvcc is found ($CUDA_HOME/bin, /usr/local/cuda/bin).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NvccCompiler>> Find();
  std::string Version() const override { return version_; }
  NvrtcOutput Compile(const std::string& source, const std::map<std::string, int64_t>& defines,
                      const std::string& arch) const override;

 private:
  std::string path_;
  std::string version_;
};

// KFORGE_CUDA_COMPILER=nvcc picks nvcc; otherwise NVRTC, falling back to nvcc when NVRTC is
// missing.
[[nodiscard]] absl::StatusOr<std::unique_ptr<CudaCompiler>> MakeCudaCompiler();

// Where the CUDA toolkit's headers are, for the allow-listed includes ("" when unknown).
std::string CudaIncludeDir();

}  // namespace kforge::worker
