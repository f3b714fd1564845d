#include "services/gpu-worker/opencl_backend.h"

#ifdef KFORGE_HAVE_OPENCL

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>

#include <cstdlib>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace kforge::worker {

namespace {

std::string DeviceString(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "";
  std::string s(n, '\0');
  clGetDeviceInfo(d, what, n, s.data(), nullptr);
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T DeviceValue(cl_device_id d, cl_device_info what) {
  T v{};
  clGetDeviceInfo(d, what, sizeof(T), &v, nullptr);
  return v;
}

class OpenClBackend final : public DeviceBackend {
 public:
  ~OpenClBackend() override {
    for (auto& [id, p] : programs_) ReleaseProgram(p);
    if (queue_ != nullptr) clReleaseCommandQueue(queue_);
    if (context_ != nullptr) clReleaseContext(context_);
  }

  v1::HelloResponse Init() override {
    v1::HelloResponse hello;
    cl_uint nplat = 0;
    if (clGetPlatformIDs(0, nullptr, &nplat) != CL_SUCCESS || nplat == 0) {
      hello.set_unavailable_reason("no OpenCL platform (install an ICD such as pocl-opencl-icd)");
      return hello;
    }
    std::vector<cl_platform_id> plats(nplat);
    clGetPlatformIDs(nplat, plats.data(), nullptr);
    // KFORGE_OPENCL_DEVICE=P:D picks platform P, device D; otherwise the first GPU, else the first device.
    int want_p = -1, want_d = 0;
    if (const char* sel = std::getenv("KFORGE_OPENCL_DEVICE"); sel != nullptr) {
      std::string s(sel);
      const size_t colon = s.find(':');
      if (!absl::SimpleAtoi(s.substr(0, colon), &want_p) ||
          (colon != std::string::npos && !absl::SimpleAtoi(s.substr(colon + 1), &want_d))) {
        hello.set_unavailable_reason(absl::StrCat("bad KFORGE_OPENCL_DEVICE '", s, "' (expected P:D)"));
        return hello;
      }
    }
    for (cl_uint p = 0; p < nplat && device_ == nullptr; ++p) {
      if (want_p >= 0 && static_cast<int>(p) != want_p) continue;
      cl_uint ndev = 0;
      if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, nullptr, &ndev) != CL_SUCCESS || ndev == 0) continue;
      std::vector<cl_device_id> devs(ndev);
      clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, ndev, devs.data(), nullptr);
      if (want_p >= 0) {
        if (want_d < static_cast<int>(ndev)) device_ = devs[want_d];
      } else {
        for (auto d : devs) {
          if (DeviceValue<cl_device_type>(d, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_GPU) device_ = d;
        }
        if (device_ == nullptr) device_ = devs[0];
      }
    }
    if (device_ == nullptr) {
      hello.set_unavailable_reason("no OpenCL device found");
      return hello;
    }
    cl_int err = CL_SUCCESS;
    context_ = clCreateContext(nullptr, 1, &device_, nullptr, nullptr, &err);
    if (err != CL_SUCCESS) {
      hello.set_unavailable_reason(absl::StrCat("clCreateContext failed: ", err));
      return hello;
    }
    cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    queue_ = clCreateCommandQueueWithProperties(context_, device_, props, &err);
    if (err != CL_SUCCESS) {
      hello.set_unavailable_reason(absl::StrCat("clCreateCommandQueue failed: ", err));
      return hello;
    }
    hello.set_available(true);
    auto* info = hello.mutable_device();
    info->set_backend(v1::BACKEND_OPENCL);
    info->set_name(DeviceString(device_, CL_DEVICE_NAME));
    info->set_vendor(DeviceString(device_, CL_DEVICE_VENDOR));
    info->set_driver_version(DeviceString(device_, CL_DRIVER_VERSION));
    info->set_arch(DeviceString(device_, CL_DEVICE_VERSION));
    info->set_compute_units(static_cast<int32_t>(DeviceValue<cl_uint>(device_, CL_DEVICE_MAX_COMPUTE_UNITS)));
    info->set_clock_mhz(static_cast<int32_t>(DeviceValue<cl_uint>(device_, CL_DEVICE_MAX_CLOCK_FREQUENCY)));
    info->set_global_memory_bytes(static_cast<int64_t>(DeviceValue<cl_ulong>(device_, CL_DEVICE_GLOBAL_MEM_SIZE)));
    auto* lim = hello.mutable_limits();
    lim->set_max_threads_per_group(static_cast<int64_t>(DeviceValue<size_t>(device_, CL_DEVICE_MAX_WORK_GROUP_SIZE)));
    size_t dims[3] = {0, 0, 0};
    clGetDeviceInfo(device_, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(dims), dims, nullptr);
    for (size_t d : dims) lim->add_max_group_dims(static_cast<int64_t>(d));
    lim->set_max_shared_bytes(static_cast<int64_t>(DeviceValue<cl_ulong>(device_, CL_DEVICE_LOCAL_MEM_SIZE)));
    lim->set_max_alloc_bytes(static_cast<int64_t>(DeviceValue<cl_ulong>(device_, CL_DEVICE_MAX_MEM_ALLOC_SIZE)));
    lim->set_global_memory_bytes(info->global_memory_bytes());
    hello.set_compiler_version(absl::StrCat(DeviceString(device_, CL_DEVICE_OPENCL_C_VERSION), " / ",
                                            info->driver_version()));
    compiler_id_ = absl::StrCat(info->name(), "|", hello.compiler_version());
    cpu_device_ = (DeviceValue<cl_device_type>(device_, CL_DEVICE_TYPE) & CL_DEVICE_TYPE_CPU) != 0;
    hello.set_host_device(cpu_device_);
    return hello;
  }

  v1::CompileResponse Compile(const v1::CompileRequest& req) override {
    v1::CompileResponse resp;
    std::string options = "-cl-std=CL1.2";
    std::map<std::string, int64_t> defs(req.defines().begin(), req.defines().end());
    for (const auto& [k, v] : defs) absl::StrAppend(&options, " -D ", k, "=", v);
    const std::string key = CompileCacheKey(req, compiler_id_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      resp = programs_[it->second].response;
      resp.set_cache_hit(true);
      return resp;
    }
    Program p;
    // The worker's cached binary of this request, if the driver takes it; else the source.
    if (!req.binary().empty() && BuildFromBinary(req.binary(), options, &p)) {
      resp.set_from_binary(true);
    } else if (!BuildFromSource(req.source(), options, &p, &resp)) {
      return resp;
    }
    const std::string log = resp.log();
    auto* res = resp.mutable_resources();
    res->set_registers_per_thread(-1);
    res->set_spill_bytes(-1);
    res->set_source_bytes(static_cast<int64_t>(req.source().size()));
    // No CL_PROGRAM_BINARY_SIZES unless asked: PoCL generates the binary to answer it, 0.35 s more
    // per build (0.115 s -> 0.467 s for matmul, alternating builds of unique sources); binary_bytes
    // stays 0 then.
    int64_t max_threads = INT64_MAX;
    for (const auto& name : req.kernels()) {
      cl_int err = CL_SUCCESS;
      cl_kernel k = clCreateKernel(p.program, name.c_str(), &err);
      if (err != CL_SUCCESS) {
        ReleaseProgram(p);
        resp.set_ok(false);
        resp.set_log(absl::StrCat(log, "\nkernel '", name, "' not found in the program"));
        return resp;
      }
      p.kernels[name] = k;
      cl_ulong local_mem = 0, private_mem = 0;
      size_t wg = 0;
      clGetKernelWorkGroupInfo(k, device_, CL_KERNEL_LOCAL_MEM_SIZE, sizeof(local_mem), &local_mem, nullptr);
      clGetKernelWorkGroupInfo(k, device_, CL_KERNEL_PRIVATE_MEM_SIZE, sizeof(private_mem), &private_mem, nullptr);
      clGetKernelWorkGroupInfo(k, device_, CL_KERNEL_WORK_GROUP_SIZE, sizeof(wg), &wg, nullptr);
      res->set_shared_bytes(std::max<int64_t>(res->shared_bytes(), static_cast<int64_t>(local_mem)));
      res->set_local_bytes(std::max<int64_t>(res->local_bytes(), static_cast<int64_t>(private_mem)));
      (*resp.mutable_max_threads())[name] = static_cast<int64_t>(wg);
      max_threads = std::min<int64_t>(max_threads, static_cast<int64_t>(wg));
    }
    res->set_max_threads_per_block(max_threads == INT64_MAX ? 0 : static_cast<int32_t>(max_threads));
    resp.set_ok(true);
    if (programs_.size() >= kMaxPrograms) EvictAll();
    const int id = next_id_++;
    resp.set_program_id(id);
    p.response = resp;
    programs_[id] = std::move(p);
    cache_[key] = id;
    const bool want = req.want_binary() == v1::CompileRequest::BINARY_WANTED_ALWAYS ||
                      (req.want_binary() == v1::CompileRequest::BINARY_WANTED_IF_CHEAP && !cpu_device_);
    if (want && !resp.from_binary()) {
      std::string binary = ProgramBinary(programs_[id].program);
      res->set_binary_bytes(static_cast<int64_t>(binary.size()));
      resp.set_binary(std::move(binary));
    }
    return resp;
  }

  absl::StatusOr<DeviceBuf> Alloc(size_t bytes) override {
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(context_, CL_MEM_READ_WRITE, std::max<size_t>(bytes, 1), nullptr, &err);
    if (err != CL_SUCCESS) return absl::ResourceExhaustedError(absl::StrCat("clCreateBuffer(", bytes, ") failed: ", err));
    return reinterpret_cast<DeviceBuf>(m);
  }

  void Free(DeviceBuf buf) override { clReleaseMemObject(reinterpret_cast<cl_mem>(buf)); }

  absl::Status Clear(DeviceBuf buf, size_t bytes) override {
    return Fill(buf, bytes, std::string_view("\0", 1));
  }

  absl::Status Fill(DeviceBuf buf, size_t bytes, std::string_view element) override {
    if (element.empty() || element.size() > 8 || (element.size() & (element.size() - 1)) != 0 ||
        bytes % element.size() != 0) {
      return DeviceBackend::Fill(buf, bytes, element);
    }
    // The widest pattern OpenCL allows for the bulk (the element repeated), the element for the
    // tail: a CPU device (PoCL) fills by copying the pattern over and over, so a narrow pattern
    // costs a call per element.
    cl_uchar wide[128];
    for (size_t i = 0; i < sizeof(wide); ++i)
      wide[i] = static_cast<cl_uchar>(element[i % element.size()]);
    const size_t bulk = bytes / sizeof(wide) * sizeof(wide);
    cl_mem m = reinterpret_cast<cl_mem>(buf);
    cl_int err = CL_SUCCESS;
    if (bulk > 0)
      err = clEnqueueFillBuffer(queue_, m, wide, sizeof(wide), 0, bulk, 0, nullptr, nullptr);
    if (err == CL_SUCCESS && bytes > bulk) {
      err = clEnqueueFillBuffer(queue_, m, wide, element.size(), bulk, bytes - bulk, 0, nullptr,
                                nullptr);
    }
    if (err == CL_SUCCESS) err = clFinish(queue_);
    if (err != CL_SUCCESS)
      return absl::InternalError(absl::StrCat("clEnqueueFillBuffer failed: ", err));
    return absl::OkStatus();
  }

  absl::Status Upload(DeviceBuf buf, std::string_view data) override {
    if (data.empty()) return absl::OkStatus();
    cl_int err = clEnqueueWriteBuffer(queue_, reinterpret_cast<cl_mem>(buf), CL_TRUE, 0, data.size(),
                                      data.data(), 0, nullptr, nullptr);
    if (err != CL_SUCCESS) return absl::InternalError(absl::StrCat("clEnqueueWriteBuffer failed: ", err));
    return absl::OkStatus();
  }

  absl::Status Download(DeviceBuf buf, size_t bytes, char* dst) override {
    if (bytes == 0) return absl::OkStatus();
    cl_int err = clEnqueueReadBuffer(queue_, reinterpret_cast<cl_mem>(buf), CL_TRUE, 0, bytes, dst,
                                     0, nullptr, nullptr);
    if (err != CL_SUCCESS) return absl::InternalError(absl::StrCat("clEnqueueReadBuffer failed: ", err));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Launch(int program_id, const std::vector<BoundCall>& calls) override {
    auto pit = programs_.find(program_id);
    if (pit == programs_.end()) return absl::InvalidArgumentError("unknown program");
    std::vector<cl_event> events;
    auto release = [&] {
      for (cl_event e : events) clReleaseEvent(e);
    };
    for (const auto& bc : calls) {
      const v1::KernelCall& c = *bc.call;
      auto kit = pit->second.kernels.find(c.kernel());
      if (kit == pit->second.kernels.end()) {
        release();
        return absl::InvalidArgumentError(absl::StrCat("kernel '", c.kernel(), "' not in program"));
      }
      cl_kernel k = kit->second;
      for (int i = 0; i < c.args_size(); ++i) {
        const v1::CallArg& a = c.args(i);
        cl_int err = CL_SUCCESS;
        cl_mem m;
        switch (a.value_case()) {
          case v1::CallArg::kBuffer:
            m = reinterpret_cast<cl_mem>(bc.buffers[i]);
            err = clSetKernelArg(k, i, sizeof(cl_mem), &m);
            break;
          case v1::CallArg::kI32: {
            cl_int v = a.i32();
            err = clSetKernelArg(k, i, sizeof(v), &v);
            break;
          }
          case v1::CallArg::kI64: {
            cl_long v = a.i64();
            err = clSetKernelArg(k, i, sizeof(v), &v);
            break;
          }
          case v1::CallArg::kF32: {
            cl_float v = a.f32();
            err = clSetKernelArg(k, i, sizeof(v), &v);
            break;
          }
          case v1::CallArg::kF64: {
            cl_double v = a.f64();
            err = clSetKernelArg(k, i, sizeof(v), &v);
            break;
          }
          case v1::CallArg::kU8: {
            cl_uchar v = static_cast<cl_uchar>(a.u8());
            err = clSetKernelArg(k, i, sizeof(v), &v);
            break;
          }
          case v1::CallArg::kF16Bits: {
            cl_ushort v = static_cast<cl_ushort>(a.f16_bits());
            err = clSetKernelArg(k, i, sizeof(v), &v);
            break;
          }
          default:
            err = CL_INVALID_ARG_VALUE;
        }
        if (err != CL_SUCCESS) {
          release();
          return absl::InvalidArgumentError(absl::StrCat("kernel '", c.kernel(), "' argument ", i,
                                                         " rejected (", err, "): does the signature match the launch args?"));
        }
      }
      size_t global[3], local[3];
      const cl_uint dims = static_cast<cl_uint>(c.global_size());
      for (cl_uint d = 0; d < dims; ++d) {
        global[d] = static_cast<size_t>(c.global(d));
        if (!c.local().empty()) local[d] = static_cast<size_t>(c.local(d));
      }
      cl_event ev = nullptr;
      cl_int err = clEnqueueNDRangeKernel(queue_, k, dims, nullptr, global, c.local().empty() ? nullptr : local,
                                          0, nullptr, &ev);
      if (err != CL_SUCCESS) {
        release();
        return absl::InvalidArgumentError(absl::StrCat("clEnqueueNDRangeKernel(", c.kernel(), ") failed: ", err));
      }
      events.push_back(ev);
    }
    cl_int err = clFinish(queue_);
    if (err != CL_SUCCESS) {
      release();
      return absl::AbortedError(absl::StrCat("clFinish failed: ", err));
    }
    cl_ulong start = 0, end = 0;
    clGetEventProfilingInfo(events.front(), CL_PROFILING_COMMAND_START, sizeof(start), &start, nullptr);
    clGetEventProfilingInfo(events.back(), CL_PROFILING_COMMAND_END, sizeof(end), &end, nullptr);
    for (cl_event e : events) {
      cl_int status = CL_COMPLETE;
      clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, nullptr);
      if (status < 0) {
        release();
        return absl::AbortedError(absl::StrCat("kernel execution failed: ", status));
      }
    }
    release();
    return end > start ? static_cast<double>(end - start) * 1e-9 : 0.0;
  }

 private:
  struct Program {
    cl_program program = nullptr;
    std::map<std::string, cl_kernel> kernels;
    v1::CompileResponse response;
  };
  static constexpr size_t kMaxPrograms = 256;

  // Builds `source` into *p; false with the compiler's log in *resp when it does not build.
  bool BuildFromSource(const std::string& source, const std::string& options, Program* p,
                       v1::CompileResponse* resp) {
    const char* src = source.c_str();
    const size_t len = source.size();
    cl_int err = CL_SUCCESS;
    p->program = clCreateProgramWithSource(context_, 1, &src, &len, &err);
    if (err != CL_SUCCESS) {
      resp->set_log(absl::StrCat("clCreateProgramWithSource failed: ", err));
      return false;
    }
    err = clBuildProgram(p->program, 1, &device_, options.c_str(), nullptr, nullptr);
    size_t log_size = 0;
    clGetProgramBuildInfo(p->program, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &log_size);
    std::string log(log_size, '\0');
    if (log_size > 0) clGetProgramBuildInfo(p->program, device_, CL_PROGRAM_BUILD_LOG, log_size, log.data(), nullptr);
    while (!log.empty() && log.back() == '\0') log.pop_back();
    resp->set_log(log);
    if (err != CL_SUCCESS) {
      ReleaseProgram(*p);
      if (log.empty()) resp->set_log(absl::StrCat("clBuildProgram failed: ", err));
      return false;
    }
    return true;
  }

  // Builds a program binary of this device (as ProgramBinary gave it) into *p; false when the
  // driver refuses it (another driver version, damaged bytes): then the source is built.
  bool BuildFromBinary(const std::string& binary, const std::string& options, Program* p) {
    const size_t len = binary.size();
    const auto* bytes = reinterpret_cast<const unsigned char*>(binary.data());
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    p->program = clCreateProgramWithBinary(context_, 1, &device_, &len, &bytes, &status, &err);
    if (err != CL_SUCCESS || status != CL_SUCCESS || p->program == nullptr) {
      ReleaseProgram(*p);
      return false;
    }
    if (clBuildProgram(p->program, 1, &device_, options.c_str(), nullptr, nullptr) != CL_SUCCESS) {
      ReleaseProgram(*p);
      return false;
    }
    return true;
  }

  // The built program's binary for this device ("" when the driver gives none).
  std::string ProgramBinary(cl_program program) {
    size_t size = 0;
    if (clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr) != CL_SUCCESS || size == 0) {
      return "";
    }
    std::string binary(size, '\0');
    unsigned char* out = reinterpret_cast<unsigned char*>(binary.data());
    if (clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof(out), &out, nullptr) != CL_SUCCESS) return "";
    return binary;
  }

  static void ReleaseProgram(Program& p) {
    for (auto& [n, k] : p.kernels) clReleaseKernel(k);
    p.kernels.clear();
    if (p.program != nullptr) clReleaseProgram(p.program);
    p.program = nullptr;
  }
  void EvictAll() {
    for (auto& [id, p] : programs_) ReleaseProgram(p);
    programs_.clear();
    cache_.clear();
  }

  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::string compiler_id_;
  // A CPU device (PoCL): a program binary costs a generic compile there (see BINARY_WANTED_IF_CHEAP).
  bool cpu_device_ = false;
  std::map<int, Program> programs_;
  std::map<std::string, int> cache_;
  int next_id_ = 1;
};

}  // namespace

std::unique_ptr<DeviceBackend> MakeOpenClBackend() { return std::make_unique<OpenClBackend>(); }

}  // namespace kforge::worker

#else

namespace kforge::worker {
std::unique_ptr<DeviceBackend> MakeOpenClBackend() { return nullptr; }
}  // namespace kforge::worker

#endif
