#include "services/gpu-worker/device_backend.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace kforge::worker {

std::string CompileCacheKey(const v1::CompileRequest& req, const std::string& compiler_id) {
  // Every field with its length: a source ending in "\n-DX=1" is not the source with a define X.
  std::string material;
  auto field = [&material](absl::string_view what, absl::string_view value) {
    absl::StrAppend(&material, what, " ", value.size(), ":", value, "\n");
  };
  field("compiler", compiler_id);
  field("source", req.source());
  const std::map<std::string, int64_t> defs(req.defines().begin(), req.defines().end());
  for (const auto& [k, v] : defs) field("define", absl::StrCat(k, "=", v));
  for (const auto& k : req.kernels()) field("kernel", k);
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
