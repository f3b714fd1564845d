#include "services/gpu-worker/cuda_backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/gpu-worker/dl_symbol.h"

namespace kforge::worker {

namespace {

// The driver API subset we use, resolved with dlsym from libcuda.so.1.
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUevent = struct CUevent_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;

// Attribute and error numbers from cuda.h (stable ABI values).
enum : int {
  kAttrMaxThreadsPerBlock = 1, kAttrMaxBlockDimX = 2, kAttrMaxBlockDimY = 3, kAttrMaxBlockDimZ = 4,
  kAttrMaxGridDimX = 5, kAttrMaxGridDimY = 6, kAttrMaxGridDimZ = 7, kAttrClockRate = 13,
  kAttrMultiprocessors = 16, kAttrCcMajor = 75, kAttrCcMinor = 76, kAttrL2Size = 38,
  kAttrMaxSharedOptin = 97,
};
enum : int {
  kFuncMaxThreads = 0, kFuncSharedBytes = 1, kFuncLocalBytes = 3, kFuncNumRegs = 4,
  kFuncMaxDynamicShared = 8,
};

struct DriverApi {
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGetName)(char*, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DeviceTotalMem)(size_t*, CUdevice);
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxSynchronize)();
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncGetAttribute)(int*, int, CUfunction);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemsetD16)(CUdeviceptr, unsigned short, size_t);
  CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
  CUresult (*MemsetD2D32)(CUdeviceptr, size_t, unsigned int, size_t, size_t);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, CUstream, void**, void**);
  CUresult (*EventCreate)(CUevent*, unsigned);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*GetErrorString)(CUresult, const char**);
};

bool IsSticky(CUresult r) {
  // Errors after which the context is unusable: illegal address, launch failure, traps, ...
  return r == 700 || r == 702 || (r >= 714 && r <= 720) || r == 999;
}

class CudaBackend final : public DeviceBackend {
 public:
  ~CudaBackend() override {
    for (auto& [id, p] : programs_) {
      if (p.module != nullptr) cu_.ModuleUnload(p.module);
    }
    if (flush_buf_ != 0) cu_.MemFree(flush_buf_);
    if (handle_ != nullptr) dlclose(handle_);
  }

  v1::HelloResponse Init() override {
    v1::HelloResponse hello;
    handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      hello.set_unavailable_reason("no CUDA device: the NVIDIA driver (libcuda.so.1) is not installed");
      return hello;
    }
    if (!LoadDriver()) {
      hello.set_unavailable_reason("no CUDA device: libcuda.so.1 lacks expected symbols");
      return hello;
    }
    auto compiler = MakeCudaCompiler();
    if (!compiler.ok()) {
      hello.set_unavailable_reason(absl::StrCat("no CUDA compiler: ", compiler.status().message()));
      return hello;
    }
    nvrtc_ = *std::move(compiler);
    int count = 0;
    if (CUresult r = cu_.Init(0); r != 0) {
      hello.set_unavailable_reason(absl::StrCat("no CUDA device: cuInit failed: ", ErrorString(r)));
      return hello;
    }
    if (cu_.DeviceGetCount(&count) != 0 || count == 0) {
      hello.set_unavailable_reason("no CUDA device found");
      return hello;
    }
    int ordinal = 0;
    if (const char* v = std::getenv("KFORGE_CUDA_DEVICE"); v != nullptr) ordinal = std::atoi(v);
    if (cu_.DeviceGet(&device_, ordinal) != 0 || cu_.PrimaryCtxRetain(&ctx_, device_) != 0 ||
        cu_.CtxSetCurrent(ctx_) != 0) {
      hello.set_unavailable_reason(absl::StrCat("cannot open CUDA device ", ordinal));
      return hello;
    }
    char name[256] = {0};
    cu_.DeviceGetName(name, sizeof(name) - 1, device_);
    const int major = Attr(kAttrCcMajor), minor = Attr(kAttrCcMinor);
    arch_ = absl::StrCat("sm_", major, minor);
    int driver = 0;
    cu_.DriverGetVersion(&driver);
    size_t mem = 0;
    cu_.DeviceTotalMem(&mem, device_);
    hello.set_available(true);
    auto* info = hello.mutable_device();
    info->set_backend(v1::BACKEND_CUDA);
    info->set_name(name);
    info->set_vendor("NVIDIA");
    info->set_driver_version(absl::StrCat(driver / 1000, ".", (driver % 1000) / 10));
    info->set_arch(arch_);
    info->set_compute_units(Attr(kAttrMultiprocessors));
    info->set_clock_mhz(Attr(kAttrClockRate) / 1000);
    info->set_global_memory_bytes(static_cast<int64_t>(mem));
    auto* lim = hello.mutable_limits();
    lim->set_max_threads_per_group(Attr(kAttrMaxThreadsPerBlock));
    for (int a : {kAttrMaxBlockDimX, kAttrMaxBlockDimY, kAttrMaxBlockDimZ}) lim->add_max_group_dims(Attr(a));
    for (int a : {kAttrMaxGridDimX, kAttrMaxGridDimY, kAttrMaxGridDimZ}) lim->add_max_grid_dims(Attr(a));
    lim->set_max_shared_bytes(Attr(kAttrMaxSharedOptin));
    lim->set_max_alloc_bytes(static_cast<int64_t>(mem));
    lim->set_global_memory_bytes(static_cast<int64_t>(mem));
    hello.set_compiler_version(nvrtc_->Version());
    // L2 flush buffer: twice the L2 so a memset evicts everything the kernel left behind.
    flush_bytes_ = static_cast<size_t>(std::max(Attr(kAttrL2Size), 1 << 20)) * 2;
    if (cu_.MemAlloc(&flush_buf_, flush_bytes_) != 0) flush_buf_ = 0;
    return hello;
  }

  v1::CompileResponse Compile(const v1::CompileRequest& req) override {
    v1::CompileResponse resp;
    std::map<std::string, int64_t> defs(req.defines().begin(), req.defines().end());
    const std::string key = CompileCacheKey(req, absl::StrCat(arch_, "|", nvrtc_->Version()));
    if (auto it = cache_.find(key); it != cache_.end()) {
      resp = programs_[it->second].response;
      resp.set_cache_hit(true);
      return resp;
    }
    Program p;
    NvrtcOutput out;
    // The worker's cached cubin of this request, if the driver loads it; else NVRTC.
    if (!req.binary().empty() && cu_.ModuleLoadData(&p.module, req.binary().data()) == 0) {
      resp.set_from_binary(true);
      out.ok = true;
      out.spill_bytes = -1;  // NVRTC's log said it; a loaded cubin does not
      out.cubin = req.binary();
    } else {
      p.module = nullptr;
      out = nvrtc_->Compile(req.source(), defs, arch_);
      resp.set_log(out.log);
      if (!out.ok) return resp;
      if (CUresult r = cu_.ModuleLoadData(&p.module, out.cubin.data()); r != 0) {
        resp.set_log(absl::StrCat(out.log, "\ncuModuleLoadData failed: ", ErrorString(r)));
        return resp;
      }
    }
    auto* res = resp.mutable_resources();
    res->set_spill_bytes(out.spill_bytes);
    res->set_binary_bytes(static_cast<int64_t>(out.cubin.size()));
    res->set_source_bytes(static_cast<int64_t>(req.source().size()));
    int min_threads = INT32_MAX;
    for (const auto& name : req.kernels()) {
      CUfunction f = nullptr;
      if (cu_.ModuleGetFunction(&f, p.module, name.c_str()) != 0) {
        cu_.ModuleUnload(p.module);
        resp.set_log(absl::StrCat(out.log, "\nkernel '", name, "' not found (declare it extern \"C\" __global__)"));
        return resp;
      }
      p.functions[name] = f;
      int regs = 0, shared = 0, local = 0, maxt = 0;
      cu_.FuncGetAttribute(&regs, kFuncNumRegs, f);
      cu_.FuncGetAttribute(&shared, kFuncSharedBytes, f);
      cu_.FuncGetAttribute(&local, kFuncLocalBytes, f);
      cu_.FuncGetAttribute(&maxt, kFuncMaxThreads, f);
      res->set_registers_per_thread(std::max(res->registers_per_thread(), regs));
      res->set_shared_bytes(std::max<int64_t>(res->shared_bytes(), shared));
      res->set_local_bytes(std::max<int64_t>(res->local_bytes(), local));
      (*resp.mutable_max_threads())[name] = maxt;
      min_threads = std::min(min_threads, maxt);
    }
    res->set_max_threads_per_block(min_threads == INT32_MAX ? 0 : min_threads);
    resp.set_ok(true);
    const int id = next_id_++;
    resp.set_program_id(id);
    p.response = resp;
    programs_[id] = std::move(p);
    cache_[key] = id;
    // A cubin is at hand whatever the request asked: sending it costs nothing more.
    if (req.want_binary() != v1::CompileRequest::BINARY_WANTED_NO && !resp.from_binary()) {
      resp.set_binary(std::move(out.cubin));
    }
    return resp;
  }

  absl::StatusOr<DeviceBuf> Alloc(size_t bytes) override {
    CUdeviceptr p = 0;
    if (CUresult r = cu_.MemAlloc(&p, std::max<size_t>(bytes, 1)); r != 0) {
      return absl::ResourceExhaustedError(absl::StrCat("cuMemAlloc(", bytes, ") failed: ", ErrorString(r)));
    }
    return static_cast<DeviceBuf>(p);
  }
  void Free(DeviceBuf buf) override { cu_.MemFree(static_cast<CUdeviceptr>(buf)); }
  absl::Status Clear(DeviceBuf buf, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    if (absl::Status st =
            Check(cu_.MemsetD8(static_cast<CUdeviceptr>(buf), 0, bytes), "cuMemsetD8");
        !st.ok()) {
      return st;
    }
    return Check(cu_.CtxSynchronize(), "cuCtxSynchronize");
  }
  absl::Status Fill(DeviceBuf buf, size_t bytes, std::string_view element) override {
    const CUdeviceptr p = static_cast<CUdeviceptr>(buf);
    CUresult r;
    if (element.empty() || bytes % element.size() != 0) {
      return DeviceBackend::Fill(buf, bytes, element);  // refuses it
    } else if (element.size() == 1) {
      r = cu_.MemsetD8(p, static_cast<unsigned char>(element[0]), bytes);
    } else if (element.size() == 2) {
      unsigned short v;
      std::memcpy(&v, element.data(), 2);
      r = cu_.MemsetD16(p, v, bytes / 2);
    } else if (element.size() == 4) {
      unsigned int v;
      std::memcpy(&v, element.data(), 4);
      r = cu_.MemsetD32(p, v, bytes / 4);
    } else if (element.size() == 8) {
      // No 64-bit memset: each half as a column of 32-bit values, 8 bytes apart.
      unsigned int lo, hi;
      std::memcpy(&lo, element.data(), 4);
      std::memcpy(&hi, element.data() + 4, 4);
      r = cu_.MemsetD2D32(p, 8, lo, 1, bytes / 8);
      if (r == 0) r = cu_.MemsetD2D32(p + 4, 8, hi, 1, bytes / 8);
    } else {
      return DeviceBackend::Fill(buf, bytes, element);
    }
    if (absl::Status st = Check(r, "cuMemset"); !st.ok()) return st;
    return Check(cu_.CtxSynchronize(), "cuCtxSynchronize");
  }
  absl::Status Upload(DeviceBuf buf, std::string_view data) override {
    if (data.empty()) return absl::OkStatus();
    return Check(cu_.MemcpyHtoD(static_cast<CUdeviceptr>(buf), data.data(), data.size()), "cuMemcpyHtoD");
  }
  absl::Status Download(DeviceBuf buf, size_t bytes, char* dst) override {
    if (bytes == 0) return absl::OkStatus();
    return Check(cu_.MemcpyDtoH(dst, static_cast<CUdeviceptr>(buf), bytes), "cuMemcpyDtoH");
  }

  absl::StatusOr<double> Launch(int program_id, const std::vector<BoundCall>& calls) override {
    auto pit = programs_.find(program_id);
    if (pit == programs_.end()) return absl::InvalidArgumentError("unknown program");
    if (start_ == nullptr) {
      if (cu_.EventCreate(&start_, 0) != 0 || cu_.EventCreate(&stop_, 0) != 0) {
        return absl::InternalError("cuEventCreate failed");
      }
    }
    if (absl::Status st = Check(cu_.EventRecord(start_, nullptr), "cuEventRecord"); !st.ok()) return st;
    for (const auto& bc : calls) {
      const v1::KernelCall& c = *bc.call;
      auto fit = pit->second.functions.find(c.kernel());
      if (fit == pit->second.functions.end()) {
        return absl::InvalidArgumentError(absl::StrCat("kernel '", c.kernel(), "' not in program"));
      }
      // Argument storage must outlive cuLaunchKernel; one 8-byte slot per argument.
      std::vector<uint64_t> storage(c.args_size());
      std::vector<void*> params(c.args_size());
      for (int i = 0; i < c.args_size(); ++i) {
        const v1::CallArg& a = c.args(i);
        void* slot = &storage[i];
        switch (a.value_case()) {
          case v1::CallArg::kBuffer: { CUdeviceptr p = bc.buffers[i]; std::memcpy(slot, &p, sizeof(p)); break; }
          case v1::CallArg::kI32: { int32_t v = a.i32(); std::memcpy(slot, &v, sizeof(v)); break; }
          case v1::CallArg::kI64: { int64_t v = a.i64(); std::memcpy(slot, &v, sizeof(v)); break; }
          case v1::CallArg::kF32: { float v = a.f32(); std::memcpy(slot, &v, sizeof(v)); break; }
          case v1::CallArg::kF64: { double v = a.f64(); std::memcpy(slot, &v, sizeof(v)); break; }
          case v1::CallArg::kU8: { uint8_t v = static_cast<uint8_t>(a.u8()); std::memcpy(slot, &v, sizeof(v)); break; }
          case v1::CallArg::kF16Bits: { uint16_t v = static_cast<uint16_t>(a.f16_bits()); std::memcpy(slot, &v, sizeof(v)); break; }
          default: return absl::InvalidArgumentError("bad kernel argument");
        }
        params[i] = slot;
      }
      auto dim = [](const auto& v, int d) { return d < v.size() ? static_cast<unsigned>(v.Get(d)) : 1u; };
      if (c.shared_bytes() > 48 * 1024) {
        cu_.FuncSetAttribute(fit->second, kFuncMaxDynamicShared, static_cast<int>(c.shared_bytes()));
      }
      CUresult r = cu_.LaunchKernel(fit->second, dim(c.grid(), 0), dim(c.grid(), 1), dim(c.grid(), 2),
                                    dim(c.block(), 0), dim(c.block(), 1), dim(c.block(), 2),
                                    static_cast<unsigned>(c.shared_bytes()), nullptr, params.data(), nullptr);
      if (r != 0) {
        if (IsSticky(r)) return absl::AbortedError(absl::StrCat("launch of ", c.kernel(), ": ", ErrorString(r)));
        return absl::InvalidArgumentError(absl::StrCat("launch of ", c.kernel(), " refused: ", ErrorString(r)));
      }
    }
    if (absl::Status st = Check(cu_.EventRecord(stop_, nullptr), "cuEventRecord"); !st.ok()) return st;
    if (CUresult r = cu_.EventSynchronize(stop_); r != 0) {
      return absl::AbortedError(absl::StrCat("kernel failed: ", ErrorString(r)));
    }
    float ms = 0;
    if (absl::Status st = Check(cu_.EventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime"); !st.ok()) return st;
    return static_cast<double>(ms) * 1e-3;
  }

  void FlushCache() override {
    if (flush_buf_ != 0) {
      cu_.MemsetD8(flush_buf_, static_cast<unsigned char>(flush_counter_++), flush_bytes_);
      cu_.CtxSynchronize();
    }
  }

 private:
  struct Program {
    CUmodule module = nullptr;
    std::map<std::string, CUfunction> functions;
    v1::CompileResponse response;
  };

  bool LoadDriver() {
    void* h = handle_;
    return DlSymbol(h, "cuInit", &cu_.Init) &&
           DlSymbol(h, "cuDriverGetVersion", &cu_.DriverGetVersion) &&
           DlSymbol(h, "cuDeviceGet", &cu_.DeviceGet) &&
           DlSymbol(h, "cuDeviceGetCount", &cu_.DeviceGetCount) &&
           DlSymbol(h, "cuDeviceGetName", &cu_.DeviceGetName) &&
           DlSymbol(h, "cuDeviceGetAttribute", &cu_.DeviceGetAttribute) &&
           DlSymbol(h, "cuDeviceTotalMem_v2", &cu_.DeviceTotalMem) &&
           DlSymbol(h, "cuDevicePrimaryCtxRetain", &cu_.PrimaryCtxRetain) &&
           DlSymbol(h, "cuCtxSetCurrent", &cu_.CtxSetCurrent) &&
           DlSymbol(h, "cuCtxSynchronize", &cu_.CtxSynchronize) &&
           DlSymbol(h, "cuModuleLoadData", &cu_.ModuleLoadData) &&
           DlSymbol(h, "cuModuleUnload", &cu_.ModuleUnload) &&
           DlSymbol(h, "cuModuleGetFunction", &cu_.ModuleGetFunction) &&
           DlSymbol(h, "cuFuncGetAttribute", &cu_.FuncGetAttribute) &&
           DlSymbol(h, "cuFuncSetAttribute", &cu_.FuncSetAttribute) &&
           DlSymbol(h, "cuMemAlloc_v2", &cu_.MemAlloc) &&
           DlSymbol(h, "cuMemFree_v2", &cu_.MemFree) &&
           DlSymbol(h, "cuMemcpyHtoD_v2", &cu_.MemcpyHtoD) &&
           DlSymbol(h, "cuMemcpyDtoH_v2", &cu_.MemcpyDtoH) &&
           DlSymbol(h, "cuMemsetD8_v2", &cu_.MemsetD8) &&
           DlSymbol(h, "cuMemsetD16_v2", &cu_.MemsetD16) &&
           DlSymbol(h, "cuMemsetD32_v2", &cu_.MemsetD32) &&
           DlSymbol(h, "cuMemsetD2D32_v2", &cu_.MemsetD2D32) &&
           DlSymbol(h, "cuLaunchKernel", &cu_.LaunchKernel) &&
           DlSymbol(h, "cuEventCreate", &cu_.EventCreate) &&
           DlSymbol(h, "cuEventRecord", &cu_.EventRecord) &&
           DlSymbol(h, "cuEventSynchronize", &cu_.EventSynchronize) &&
           (DlSymbol(h, "cuEventElapsedTime_v2", &cu_.EventElapsedTime) ||
            DlSymbol(h, "cuEventElapsedTime", &cu_.EventElapsedTime)) &&
           DlSymbol(h, "cuGetErrorString", &cu_.GetErrorString);
  }
  int Attr(int a) {
    int v = 0;
    cu_.DeviceGetAttribute(&v, a, device_);
    return v;
  }
  std::string ErrorString(CUresult r) {
    const char* s = nullptr;
    if (cu_.GetErrorString != nullptr && cu_.GetErrorString(r, &s) == 0 && s != nullptr) return absl::StrCat(s, " (", r, ")");
    return absl::StrCat("CUDA error ", r);
  }
  absl::Status Check(CUresult r, const char* what) {
    if (r == 0) return absl::OkStatus();
    if (IsSticky(r)) return absl::AbortedError(absl::StrCat(what, ": ", ErrorString(r)));
    return absl::InternalError(absl::StrCat(what, ": ", ErrorString(r)));
  }

  void* handle_ = nullptr;
  DriverApi cu_{};
  std::unique_ptr<CudaCompiler> nvrtc_;  // NVRTC, or nvcc as the fallback
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  std::string arch_;
  CUevent start_ = nullptr;
  CUevent stop_ = nullptr;
  CUdeviceptr flush_buf_ = 0;
  size_t flush_bytes_ = 0;
  int flush_counter_ = 0;
  std::map<int, Program> programs_;
  std::map<std::string, int> cache_;
  int next_id_ = 1;
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeCudaBackend() { return std::make_unique<CudaBackend>(); }

}  // namespace kforge::worker
