#include "services/gpu-worker/device_backend.h"

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

}  // namespace kforge::worker
