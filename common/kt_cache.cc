#include "absl/strings/string_view.h"
#include "common/kt_cache.h"

#include <memory>

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_join.h"
#include "common/hash.h"
#include "nlohmann/json.hpp"

namespace kforge {

namespace {

// Recorded tuning spaces are a few MB; this bounds what a crafted path (/dev/zero, a
// decompression bomb) can make a process hold.
constexpr size_t kMaxCacheBytes = size_t{512} << 20;
// nlohmann::json parses recursively: nesting deeper than a cache ever has is refused first.
constexpr int kMaxJsonDepth = 64;

bool NestsTooDeep(const std::string& text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> ReadMaybeGzipFile(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", msg));
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > kMaxCacheBytes) {
      gzclose(f);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": larger than ", kMaxCacheBytes >> 20, " MB (uncompressed)"));
    }
    out.append(buf, n);
  }
  gzclose(f);
  return out;
}

namespace {

// An assignment's values in `keys` order, comma-joined: a cache entry's key. Nullopt when a key is
// missing from the assignment.
std::optional<std::string> JoinedValues(const std::vector<std::string>& keys, const ParamAssignment& a) {
  std::string out;
  for (const auto& k : keys) {
    auto it = a.find(k);
    if (it == a.end()) return std::nullopt;
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, it->second);
  }
  return out;
}

}  // namespace

std::optional<KtEntry> KtCache::Find(const ParamAssignment& a) const {
  const std::optional<std::string> joined = JoinedValues(keys, a);
  if (!joined.has_value()) return std::nullopt;
  auto it = entries.find(*joined);
  if (it == entries.end()) return std::nullopt;
  return it->second;
}

bool KtCache::Records(const ParamAssignment& a) const {
  // Without Find's copy of the entry: a replay job's mutator asks this for every knob variant it
  // tries.
  const std::optional<std::string> joined = JoinedValues(keys, a);
  if (!joined.has_value()) return false;
  auto it = entries.find(*joined);
  return it != entries.end() && it->second.recorded();
}

std::optional<double> KtCache::OptimumMs() const {
  std::optional<double> best;
  for (const auto& [k, e] : entries) {
    if (e.ok && (!best || e.time_ms < *best)) best = e.time_ms;
  }
  return best;
}

size_t KtCache::ValidCount() const {
  size_t n = 0;
  for (const auto& [k, e] : entries) n += e.ok ? 1 : 0;
  return n;
}

absl::StatusOr<KtCache> LoadKtCache(const std::string& path, const std::string& display_name) {
  const std::string name = display_name.empty() ? path : display_name;
  auto text = ReadMaybeGzipFile(path);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat(name, ": ", text.status().message()));
  if (NestsTooDeep(*text)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": JSON nested deeper than ", kMaxJsonDepth, " levels"));
  }
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(name, ": not valid JSON"));
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
  };
  if (!j.is_object()) return bad("top level must be an object");
  KtCache c;
  if (j.contains("device_name") && j["device_name"].is_string()) c.device_name = j["device_name"];
  if (j.contains("kernel_name") && j["kernel_name"].is_string()) c.kernel_name = j["kernel_name"];
  if (!j.contains("tune_params_keys") || !j["tune_params_keys"].is_array()) {
    return bad("missing tune_params_keys (a list of parameter names)");
  }
  if (!j.contains("tune_params") || !j["tune_params"].is_object()) {
    return bad("missing tune_params (parameter name -> allowed values)");
  }
  for (const auto& k : j["tune_params_keys"]) {
    if (!k.is_string()) return bad("tune_params_keys must hold strings");
    const std::string key = k;
    const auto& vals = j["tune_params"].find(key);
    if (vals == j["tune_params"].end() || !vals->is_array() || vals->empty()) {
      return bad(absl::StrCat("tune_params.", key, " is missing or empty"));
    }
    std::vector<int64_t> v;
    for (const auto& x : *vals) {
      if (!x.is_number_integer()) {
        return bad(absl::StrCat("tune_params.", key, ": only integer values are supported"));
      }
      v.push_back(x.get<int64_t>());
    }
    c.keys.push_back(key);
    c.values.push_back(std::move(v));
  }
  if (!j.contains("cache") || !j["cache"].is_object()) return bad("missing cache object");
  for (const auto& [key, rec] : j["cache"].items()) {
    if (!rec.is_object()) return bad(absl::StrCat("cache['", key, "'] is not an object"));
    // Rebuild the key from the record so that spacing differences in the file do not matter.
    std::vector<int64_t> vals;
    for (const auto& k : c.keys) {
      auto it = rec.find(k);
      if (it == rec.end() || !it->is_number_integer()) {
        return bad(absl::StrCat("cache['", key, "'] lacks integer parameter ", k));
      }
      vals.push_back(it->get<int64_t>());
    }
    KtEntry e;
    auto t = rec.find("time");
    if (t != rec.end() && t->is_number()) {
      e.ok = true;
      e.time_ms = t->get<double>();
    } else if (t != rec.end() && t->is_string()) {
      e.failure = t->get<std::string>();
    } else {
      return bad(absl::StrCat("cache['", key, "'] has no time"));
    }
    if (auto it = rec.find("compile_time"); it != rec.end() && it->is_number()) e.compile_ms = *it;
    if (auto it = rec.find("benchmark_time"); it != rec.end() && it->is_number()) e.benchmark_ms = *it;
    c.entries[absl::StrJoin(vals, ",")] = std::move(e);
  }
  if (c.entries.empty()) return bad("cache is empty");
  return c;
}

absl::StatusOr<ValidityFn> ReplayValidity(const v1::Problem& problem) {
  if (problem.backend() != v1::BACKEND_REPLAY) return ValidityFn();
  absl::StatusOr<KtCache> cache = LoadKtCache(problem.replay().cache_path(), problem.replay().cache_file());
  if (!cache.ok()) return cache.status();
  auto shared = std::make_shared<KtCache>(*std::move(cache));
  return ValidityFn([shared](const ParamAssignment& a) { return shared->Records(a); });
}

absl::StatusOr<RecordedSpace> RecordedSpaceOf(const v1::Problem& problem) {
  if (problem.backend() != v1::BACKEND_REPLAY) return absl::InvalidArgumentError("not a replay problem");
  absl::StatusOr<KtCache> cache = LoadKtCache(problem.replay().cache_path(), problem.replay().cache_file());
  if (!cache.ok()) return cache.status();
  RecordedSpace r;
  r.params = cache->keys;
  for (const auto& [joined, entry] : cache->entries) {
    if (entry.recorded()) r.configurations.push_back(joined);
  }
  std::sort(r.configurations.begin(), r.configurations.end());
  r.key = RecordedSpaceKey(r.params, r.configurations);
  return r;
}

std::string RecordedSpaceKey(const std::vector<std::string>& params, const std::vector<std::string>& configurations) {
  return Sha256Hex(absl::StrCat(absl::StrJoin(params, ","), "\n", absl::StrJoin(configurations, "\n")));
}

ValidityFn RecordedSpaceValidity(const std::vector<std::string>& params,
                                 const std::vector<std::string>& configurations) {
  auto set = std::make_shared<const absl::flat_hash_set<std::string>>(configurations.begin(), configurations.end());
  return [params, set](const ParamAssignment& a) {
    const std::optional<std::string> joined = JoinedValues(params, a);
    return joined.has_value() && set->contains(*joined);
  };
}

}  // namespace kforge
