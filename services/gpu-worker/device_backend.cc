#include "services/gpu-worker/device_backend.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace kforge::worker {

std::string CompileCacheKey(const v1::CompileRequest& req, const std::string& compiler_id) {
  std::string material = absl::StrCat(compiler_id, "\n", req.source(), "\n");
  const std::map<std::string, int64_t> defs(req.defines().begin(), req.defines().end());
  for (const auto& [k, v] : defs) absl::StrAppend(&material, "-D", k, "=", v, "\n");
  for (const auto& k : req.kernels()) absl::StrAppend(&material, "kernel ", k, "\n");
  return Sha256Hex(material);
}

absl::Status DeviceBackend::Fill(DeviceBuf buf, size_t bytes, std::string_view element) {
  if (element.empty() || bytes % element.size() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fill of ", bytes, " bytes with a ", element.size(), "-byte element"));
  }
  std::string host(element);
  host.reserve(bytes);
  while (host.size() < bytes)
    host.append(host, 0, std::min(host.size(), bytes - host.size()));  // doubling
  return Upload(buf, host);
}

}  // namespace kforge::worker
