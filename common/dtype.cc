#include "absl/strings/string_view.h"
#include "common/dtype.h"

#include "kforge/v1/evaluation.pb.h"

namespace kforge {

std::optional<v1::DType> ParseDType(absl::string_view name) {
  if (name == "f16") return v1::DTYPE_F16;
  if (name == "bf16") return v1::DTYPE_BF16;
  if (name == "f32") return v1::DTYPE_F32;
  if (name == "f64") return v1::DTYPE_F64;
  if (name == "i32") return v1::DTYPE_I32;
  if (name == "i64") return v1::DTYPE_I64;
  if (name == "u8") return v1::DTYPE_U8;
  return std::nullopt;
}

absl::string_view DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F16: return "f16";
    case v1::DTYPE_BF16: return "bf16";
    case v1::DTYPE_F32: return "f32";
    case v1::DTYPE_F64: return "f64";
    case v1::DTYPE_I32: return "i32";
    case v1::DTYPE_I64: return "i64";
    case v1::DTYPE_U8: return "u8";
    default: return "unspecified";
  }
}

int64_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16: return 2;
    case v1::DTYPE_F32:
    case v1::DTYPE_I32: return 4;
    case v1::DTYPE_F64:
    case v1::DTYPE_I64: return 8;
    case v1::DTYPE_U8: return 1;
    default: return 0;
  }
}

bool IsFloatDType(v1::DType dtype) {
  return dtype == v1::DTYPE_F16 || dtype == v1::DTYPE_BF16 || dtype == v1::DTYPE_F32 ||
         dtype == v1::DTYPE_F64;
}

absl::string_view BackendName(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_OPENCL: return "opencl";
    case v1::BACKEND_CUDA: return "cuda";
    case v1::BACKEND_REPLAY: return "replay";
    default: return "unspecified";
  }
}

absl::string_view RoleName(v1::BufferRole role) {
  switch (role) {
    case v1::BUFFER_ROLE_IN: return "in";
    case v1::BUFFER_ROLE_OUT: return "out";
    case v1::BUFFER_ROLE_INOUT: return "inout";
    case v1::BUFFER_ROLE_SCRATCH: return "scratch";
    default: return "unspecified";
  }
}

absl::string_view OutcomeName(int outcome) {
  switch (outcome) {
    case v1::OUTCOME_OK: return "ok";
    case v1::OUTCOME_REJECTED: return "rejected";
    case v1::OUTCOME_COMPILE_ERROR: return "compile_error";
    case v1::OUTCOME_LAUNCH_ERROR: return "launch_error";
    case v1::OUTCOME_WRONG_ANSWER: return "wrong_answer";
    case v1::OUTCOME_TIMEOUT: return "timeout";
    case v1::OUTCOME_CRASHED: return "crashed";
    case v1::OUTCOME_INFRA_ERROR: return "infra_error";
    default: return "unspecified";
  }
}

absl::string_view StageName(int stage) {
  switch (stage) {
    case v1::STAGE_SCREEN: return "screen";
    case v1::STAGE_COMPILE: return "compile";
    case v1::STAGE_VALIDATE: return "validate";
    case v1::STAGE_BENCHMARK: return "benchmark";
    default: return "unspecified";
  }
}

}  // namespace kforge
