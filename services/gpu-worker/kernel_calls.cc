#include "services/gpu-worker/kernel_calls.h"

#include <climits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/gpu-worker/host_data.h"

namespace kforge::worker {

namespace {

absl::StatusOr<v1::CallArg> ToCallArg(const LaunchArg& a, const v1::Problem& p) {
  v1::CallArg out;
  switch (a.kind) {
    case LaunchArg::Kind::kBuffer:
      out.set_buffer(a.name);
      return out;
    case LaunchArg::Kind::kInt:
      if (a.value < INT32_MIN || a.value > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("argument '", a.name, "' = ", a.value, " does not fit an i32"));
      }
      out.set_i32(static_cast<int32_t>(a.value));
      return out;
    case LaunchArg::Kind::kScalar:
      for (const auto& s : p.scalars()) {
        if (s.name() != a.name) continue;
        switch (s.dtype()) {
          case v1::DTYPE_F32:
            out.set_f32(static_cast<float>(s.value()));
            break;
          case v1::DTYPE_F64:
            out.set_f64(s.value());
            break;
          case v1::DTYPE_I32:
            out.set_i32(static_cast<int32_t>(s.value()));
            break;
          case v1::DTYPE_I64:
            out.set_i64(static_cast<int64_t>(s.value()));
            break;
          case v1::DTYPE_U8:
            out.set_u8(static_cast<uint32_t>(s.value()));
            break;
          case v1::DTYPE_F16:
            out.set_f16_bits(FloatToHalf(static_cast<float>(s.value())));
            break;
          case v1::DTYPE_BF16:
            out.set_f16_bits(FloatToBf16(static_cast<float>(s.value())));
            break;
          default:
            return absl::InvalidArgumentError(absl::StrCat("scalar '", a.name, "' has no dtype"));
        }
        return out;
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown scalar '", a.name, "'"));
  }
  return absl::InternalError("bad argument kind");
}

}  // namespace

absl::StatusOr<std::vector<v1::KernelCall>> ToCalls(const std::vector<ResolvedLaunch>& launches,
                                                    const v1::Problem& p) {
  std::vector<v1::KernelCall> out;
  for (const auto& l : launches) {
    v1::KernelCall c;
    c.set_kernel(l.kernel);
    for (int64_t v : l.global) c.add_global(v);
    for (int64_t v : l.local) c.add_local(v);
    for (int64_t v : l.grid) c.add_grid(v);
    for (int64_t v : l.block) c.add_block(v);
    c.set_shared_bytes(l.shared_bytes);
    for (const auto& a : l.args) {
      KF_ASSIGN_OR_RETURN(v1::CallArg ca, ToCallArg(a, p));
      *c.add_args() = std::move(ca);
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::string> KernelNames(const std::vector<ResolvedLaunch>& launches) {
  std::set<std::string> names;
  for (const auto& l : launches) names.insert(l.kernel);
  return {names.begin(), names.end()};
}

}  // namespace kforge::worker
