#include "services/gpu-worker/screen.h"

#include <cctype>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/param_space.h"
#include "common/status_macros.h"
#include "common/utf8.h"

namespace kforge::worker {

namespace {

constexpr const char* kCudaHeaders[] = {
    "cuda_fp16.h", "cuda_bf16.h", "cuda_runtime.h", "cooperative_groups.h",
    "cooperative_groups/reduce.h", "mma.h", "cuda_pipeline.h", "cuda/barrier", "cuda/pipeline",
    "stdint.h", "cstdint"};

// How a preprocessor may read the text. Where compilers differ (trigraphs are on in C and off in
// C++17), the screen reads it both ways and refuses what either reading shows.
struct Reading {
  bool trigraphs = true;
  bool raw_strings = false;  // C++11 R"delim(...)delim" (CUDA only)
};

// Phase 1 as every compiler does it: a UTF-8 byte-order mark is skipped, and "\r\n" and a lone
// "\r" are line breaks. Anything that is not UTF-8 text is refused, so no other encoding can
// hide a directive.
absl::StatusOr<std::string> NormaliseText(absl::string_view s) {
  if (s.size() >= 2 && ((s[0] == '\xFE' && s[1] == '\xFF') || (s[0] == '\xFF' && s[1] == '\xFE'))) {
    return absl::InvalidArgumentError("source is UTF-16 or UTF-32: kernels must be UTF-8 text");
  }
  if (absl::StartsWith(s, "\xEF\xBB\xBF")) s.remove_prefix(3);
  if (!IsValidUtf8(s)) return absl::InvalidArgumentError("source is not valid UTF-8 text");
  std::string out;
  out.reserve(s.size());
  int line = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\r') {
      out.push_back('\n');
      ++line;
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
      continue;
    }
    if (c == '\n') ++line;
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\v' && c != '\f') {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": control character 0x", absl::Hex(c, absl::kZeroPad2), " in the source"));
    }
    if (c == 0x7f) return absl::InvalidArgumentError(absl::StrCat("line ", line, ": control character 0x7f in the source"));
    out.push_back(static_cast<char>(c));
  }
  return out;
}

// Undoes the spellings that hide a directive: trigraphs (when the reading has them), line
// splices, digraphs, comments; string and character literals are blanked so that a "/*" inside
// one starts no comment. Line numbers of the original text are kept by emitting '\n' for every
// spliced newline at the end of the logical line.
std::string Canonicalise(absl::string_view in, const Reading& reading) {
  // Trigraphs and splices first (translation phases 1 and 2).
  std::string s;
  s.reserve(in.size());
  std::vector<size_t> spliced_at;  // positions in s where a newline was spliced away
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (reading.trigraphs && c == '?' && i + 2 < in.size() && in[i + 1] == '?') {
      const char t = in[i + 2];
      const char* from = "=/'()!<>-";
      const char* to = "#\\^[]|{}~";
      if (const char* p = std::strchr(from, t); p != nullptr && t != '\0') {
        c = to[p - from];
        i += 2;
      }
    }
    if (c == '\\') {
      size_t j = i + 1;
      while (j < in.size() && (in[j] == ' ' || in[j] == '\t')) ++j;
      if (j < in.size() && in[j] == '\n') {
        i = j;
        spliced_at.push_back(s.size());
        continue;
      }
    }
    s.push_back(c);
  }
  std::string out;
  out.reserve(s.size());
  int pending_newlines = 0;
  size_t next_splice = 0;
  auto count_splices_until = [&](size_t pos) {
    while (next_splice < spliced_at.size() && spliced_at[next_splice] <= pos) {
      ++pending_newlines;
      ++next_splice;
    }
  };
  for (size_t i = 0; i < s.size(); ++i) {
    count_splices_until(i);
    const char c = s[i];
    if (c == '%' && i + 1 < s.size() && s[i + 1] == ':') {
      out.push_back('#');
      ++i;
      continue;
    }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      const size_t end = s.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? s.size() : end + 2;
      for (size_t k = i; k < stop; ++k) pending_newlines += s[k] == '\n';
      out.push_back(' ');
      i = stop - 1;
      continue;
    }
    if (c == '/' && i + 1 < s.size() && s[i + 1] == '/') {
      while (i + 1 < s.size() && s[i + 1] != '\n') ++i;
      continue;
    }
    if (reading.raw_strings && c == 'R' && i + 1 < s.size() && s[i + 1] == '"' &&
        (i == 0 || !(std::isalnum(static_cast<unsigned char>(s[i - 1])) || s[i - 1] == '_'))) {
      const size_t open = s.find('(', i + 2);
      if (open != std::string::npos && open - (i + 2) <= 16 && s.find('\n', i + 2) > open) {
        const std::string close = absl::StrCat(")", s.substr(i + 2, open - (i + 2)), "\"");
        const size_t end = s.find(close, open + 1);
        const size_t stop = end == std::string::npos ? s.size() : end + close.size();
        for (size_t k = i; k < stop; ++k) pending_newlines += s[k] == '\n';
        out.append("\"\"");
        i = stop - 1;
        continue;
      }
    }
    if (c == '"' || c == '\'') {
      // A literal ends at its closing quote or, unterminated, at the end of the line.
      size_t k = i + 1;
      while (k < s.size() && s[k] != c && s[k] != '\n') k += s[k] == '\\' && k + 1 < s.size() && s[k + 1] != '\n' ? 2 : 1;
      out.push_back(c);
      out.push_back(c);
      i = (k < s.size() && s[k] == c) ? k : k - 1;
      continue;
    }
    out.push_back(c);
    if (c == '\n') {
      out.append(static_cast<size_t>(pending_newlines), '\n');
      pending_newlines = 0;
    }
  }
  return out;
}

absl::Status ScreenDirectives(v1::Backend backend, const std::string& text) {
  if (text.find("__has_include") != std::string::npos) {
    return absl::InvalidArgumentError("__has_include is not allowed");
  }
  if (text.find("__has_embed") != std::string::npos) {
    return absl::InvalidArgumentError("__has_embed is not allowed");
  }
  int line = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line;
    absl::string_view l(text.data() + pos, end - pos);
    size_t i = 0;
    while (i < l.size() && std::isspace(static_cast<unsigned char>(l[i]))) ++i;
    if (i < l.size() && l[i] == '#') {
      ++i;
      while (i < l.size() && std::isspace(static_cast<unsigned char>(l[i]))) ++i;
      size_t j = i;
      while (j < l.size() && (std::isalnum(static_cast<unsigned char>(l[j])) || l[j] == '_')) ++j;
      const absl::string_view directive = l.substr(i, j - i);
      absl::string_view rest = l.substr(j);
      while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
      while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.remove_suffix(1);
      if (directive == "include_next" || directive == "import" || directive == "embed") {
        return absl::InvalidArgumentError(absl::StrCat("line ", line, ": #", directive, " is not allowed"));
      }
      if (directive == "pragma" && (absl::StrContains(rest, "dependency") || absl::StrContains(rest, "include") ||
                                    absl::StrContains(rest, "embed"))) {
        // "#pragma GCC dependency FILE" opens FILE.
        return absl::InvalidArgumentError(absl::StrCat("line ", line, ": this #pragma is not allowed"));
      }
      if (directive == "include") {
        if (rest.size() < 3 || rest.front() != '<' || rest.back() != '>') {
          return absl::InvalidArgumentError(absl::StrCat(
              "line ", line, ": only #include <toolkit header> is allowed (no quotes, paths or macros)"));
        }
        const absl::string_view header = rest.substr(1, rest.size() - 2);
        if (!IsAllowedInclude(backend, header)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "line ", line, ": #include of a header outside the allow-list",
              backend == v1::BACKEND_CUDA ? absl::StrCat(" (allowed: ", absl::StrJoin(kCudaHeaders, ", "), ")")
                                          : std::string(" (OpenCL kernels may include nothing)")));
        }
      }
    }
    pos = end + 1;
  }
  return absl::OkStatus();
}

}  // namespace

bool IsAllowedInclude(v1::Backend backend, absl::string_view header) {
  if (backend != v1::BACKEND_CUDA) return false;  // OpenCL C has no standard headers
  for (const char* h : kCudaHeaders) {
    if (header == h) return true;
  }
  return false;
}

absl::Status ScreenIncludes(v1::Backend backend, absl::string_view source) {
  KF_ASSIGN_OR_RETURN(const std::string text, NormaliseText(source));
  // Every reading a compiler might use: with and without trigraphs; raw strings in CUDA C++.
  for (const bool trigraphs : {true, false}) {
    const Reading r{.trigraphs = trigraphs, .raw_strings = backend == v1::BACKEND_CUDA};
    KF_RETURN_IF_ERROR(ScreenDirectives(backend, Canonicalise(text, r)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ScreenedSizeSet>> ResolvePlan(
    const v1::Problem& problem, const v1::KernelSpec& spec_for_defines,
    const google::protobuf::RepeatedPtrField<v1::Launch>& launches,
    const google::protobuf::RepeatedPtrField<v1::ScratchBuffer>& scratch,
    const ParamAssignment& params, const v1::DeviceLimits& limits, const ScreenOptions& opts) {
  const bool cuda = problem.backend() == v1::BACKEND_CUDA;
  if (launches.empty()) return absl::InvalidArgumentError("launch plan has no launches");
  if (launches.size() > opts.max_launches) {
    return absl::InvalidArgumentError(absl::StrCat("launch plan has ", launches.size(),
                                                   " launches (at most ", opts.max_launches, ")"));
  }
  std::vector<ScreenedSizeSet> out;
  for (const auto& set : problem.size_sets()) {
    ScreenedSizeSet s;
    s.size_set = &set;
    const Bindings env = MakeBindings(set, spec_for_defines, params);
    for (const auto& sb : scratch) {
      if (DTypeSize(sb.dtype()) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("scratch '", sb.name(), "' has no dtype"));
      }
      auto n = ShapeElements(sb.shape(), env);
      if (!n.ok()) return absl::InvalidArgumentError(absl::StrCat("scratch '", sb.name(), "' ", n.status().message()));
      const int64_t bytes = *n * DTypeSize(sb.dtype());
      if (bytes > opts.max_scratch_bytes || (limits.max_alloc_bytes() > 0 && bytes > limits.max_alloc_bytes())) {
        return absl::InvalidArgumentError(absl::StrCat("scratch '", sb.name(), "' needs ", bytes, " bytes (too large)"));
      }
      s.scratch_bytes[sb.name()] = bytes;
    }
    for (int li = 0; li < launches.size(); ++li) {
      const auto& l = launches[li];
      const std::string where = absl::StrCat("launch ", li, " (", l.kernel(), ") for size set '", set.name(), "': ");
      auto r = ResolveLaunch(l, problem, scratch, env);
      if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(where, r.status().message()));
      const auto& g = cuda ? r->grid : r->global;
      const auto& b = cuda ? r->block : r->local;
      if (g.empty() || g.size() > 3) return absl::InvalidArgumentError(absl::StrCat(where, "needs 1 to 3 dimensions"));
      if (!b.empty() && b.size() != g.size()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "local/block and global/grid dimension counts differ"));
      }
      if (cuda && b.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "CUDA launches need a block"));
      int64_t total = 1, group = 1;
      for (size_t d = 0; d < g.size(); ++d) {
        if (g[d] <= 0) return absl::InvalidArgumentError(absl::StrCat(where, "dimension ", d, " is ", g[d]));
        if (__builtin_mul_overflow(total, g[d], &total)) total = INT64_MAX;
        if (!b.empty()) {
          if (b[d] <= 0) return absl::InvalidArgumentError(absl::StrCat(where, "group dimension ", d, " is ", b[d]));
          group *= b[d];
          if (d < static_cast<size_t>(limits.max_group_dims_size()) && b[d] > limits.max_group_dims(d)) {
            return absl::InvalidArgumentError(absl::StrCat(where, "group dimension ", d, " is ", b[d],
                                                           " (device limit ", limits.max_group_dims(d), ")"));
          }
          if (!cuda && g[d] % b[d] != 0) {
            return absl::InvalidArgumentError(absl::StrCat(where, "global size ", g[d], " is not a multiple of local size ",
                                                           b[d], " in dimension ", d));
          }
          if (group > (int64_t{1} << 20)) group = int64_t{1} << 20;
        }
        if (cuda && d < static_cast<size_t>(limits.max_grid_dims_size()) && g[d] > limits.max_grid_dims(d)) {
          return absl::InvalidArgumentError(absl::StrCat(where, "grid dimension ", d, " is ", g[d],
                                                         " (device limit ", limits.max_grid_dims(d), ")"));
        }
      }
      if (cuda) total = total > INT64_MAX / std::max<int64_t>(group, 1) ? INT64_MAX : total * group;
      if (total > opts.max_total_work_items) {
        return absl::InvalidArgumentError(absl::StrCat(where, "launches ", total, " threads (at most ",
                                                       opts.max_total_work_items, ")"));
      }
      if (limits.max_threads_per_group() > 0 && group > limits.max_threads_per_group()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "group of ", group, " threads exceeds the device limit ",
                                                       limits.max_threads_per_group()));
      }
      if (r->shared_bytes < 0 || (limits.max_shared_bytes() > 0 && r->shared_bytes > limits.max_shared_bytes())) {
        return absl::InvalidArgumentError(absl::StrCat(where, "shared_bytes ", r->shared_bytes,
                                                       " exceeds the device limit ", limits.max_shared_bytes()));
      }
      s.launches.push_back(*std::move(r));
    }
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<ScreenedCandidate> Screen(const v1::Problem& problem, const v1::Candidate& candidate,
                                         const v1::DeviceLimits& limits, const ScreenOptions& opts) {
  if (static_cast<int64_t>(candidate.source().size()) > opts.max_source_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("source is ", candidate.source().size(),
                                                   " bytes (at most ", opts.max_source_bytes, ")"));
  }
  if (candidate.source().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("source contains a NUL byte");
  }
  KF_RETURN_IF_ERROR(ScreenIncludes(problem.backend(), candidate.source()));
  ScreenedCandidate out;
  out.params = ParamAssignment(candidate.params().begin(), candidate.params().end());
  KF_ASSIGN_OR_RETURN(ParamSpace space, ParamSpace::Create(problem));
  auto valid = space.IsValid(out.params);
  if (!valid.ok()) return absl::InvalidArgumentError(valid.status().message());
  if (!*valid) {
    return absl::InvalidArgumentError(absl::StrCat("params ", FormatParams(out.params),
                                                   " are not an allowed assignment (declared values and constraints)"));
  }
  out.defines = CompileDefines(problem, out.params);
  const auto& launches = candidate.plan().launches().empty() ? problem.seed().launches() : candidate.plan().launches();
  const auto& scratch = candidate.plan().launches().empty() ? problem.seed().scratch() : candidate.plan().scratch();
  for (const auto& sb : scratch) {
    for (const auto& b : problem.buffers()) {
      if (b.name() == sb.name()) {
        return absl::InvalidArgumentError(absl::StrCat("scratch '", sb.name(), "' shadows a problem buffer"));
      }
    }
  }
  KF_ASSIGN_OR_RETURN(out.sets, ResolvePlan(problem, problem.seed(), launches, scratch, out.params, limits, opts));
  return out;
}

}  // namespace kforge::worker
