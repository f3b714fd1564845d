#pragma once

// The problem loader's internals, shared by problem_loader.cc (problem.yaml: header, sizes,
// scalars, buffers, check, replay) and problem_loader_kernels.cc (reference and seed kernels,
// launch plans, the param space check). Not for other users: include common/problem_loader.h.

#include <filesystem>
#include <initializer_list>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/expr.h"
#include "common/problem_loader.h"
#include "common/yaml_reader.h"
#include "kforge/v1/candidate.pb.h"
#include "kforge/v1/problem.pb.h"

namespace kforge::loader_internal {

namespace fs = std::filesystem;

inline constexpr int64_t kMaxSpaceVisits = 1 << 22;
// No buffer may be larger: more than any device holds, and far from overflowing int64 sums.
inline constexpr int64_t kMaxBufferBytes = int64_t{1} << 40;

// The scanners below are loops over the characters, not std::regex: libstdc++'s regex recurses
// once per character and overflows the stack on inputs of a few ten thousand characters.

inline bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// What \s matches in a std::regex over char in the "C" locale.
inline bool IsRegexSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// [A-Za-z_][A-Za-z0-9_]*
inline bool IsIdentifier(absl::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    if (!IsWordChar(c)) return false;
  }
  return true;
}

// [A-Za-z0-9_.-]+
inline bool IsProblemName(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsWordChar(c) && c != '.' && c != '-') return false;
  }
  return true;
}

// Whether `source` has `name` as a whole word followed by optional whitespace and '(' (the
// regex \bNAME\s*\( for an identifier NAME). One pass over the source: every maximal run of
// word characters is compared with the name once.
bool DefinesFunction(absl::string_view source, absl::string_view name);

// Splits "fn ( args )" (the regex ([a-z]+)\s*\(([^()]*)\) matched on the whole text): false
// when `text` is not of that form.
bool SplitCall(absl::string_view text, absl::string_view* fn, absl::string_view* args);

// `text` quoted for an error message, cut to 80 bytes (see EchoValue).
inline std::string Q(absl::string_view text) { return Quoted(text); }

inline bool IsReserved(absl::string_view s) { return s == "ceil_div" || s == "min" || s == "max"; }

// The finite values a dtype holds, as doubles.
std::pair<double, double> DTypeRange(v1::DType dtype);

// What kind of thing a name refers to, to reject clashes and undefined references.
enum class NameKind { kSize, kScalar, kBuffer, kParam, kDefine };

inline absl::string_view KindName(NameKind k) {
  switch (k) {
    case NameKind::kSize:
      return "size";
    case NameKind::kScalar:
      return "scalar";
    case NameKind::kBuffer:
      return "buffer";
    case NameKind::kParam:
      return "param";
    case NameKind::kDefine:
      return "define";
  }
  return "name";
}

// Loads one problem folder, or a launch plan against a loaded problem; errors name the file,
// line, column and field.
class Loader {
 public:
  explicit Loader(std::string dir, bool confined = false) : dir_(std::move(dir)), confined_(confined) {}
  absl::StatusOr<v1::Problem> Load();
  // Parses a candidate's launch plan against an already loaded problem.
  absl::StatusOr<v1::LaunchPlan> LoadPlan(const v1::Problem& problem, const std::string& path,
                                          const std::string* text = nullptr);

 private:
  // Values a worker bounds (ProblemLimits) are bounded here too, with the location.
  absl::Status CheckLength(const YamlNode& at, const std::string& value, int64_t max_bytes,
                           absl::string_view what);
  absl::Status Declare(const YamlNode& at, const std::string& name, NameKind kind);
  // Parses an expression and checks every name it reads is of an allowed kind.
  absl::Status CheckExpr(const YamlNode& at, const std::string& text,
                         std::initializer_list<NameKind> allowed,
                         const absl::flat_hash_set<std::string>& extra = {});
  absl::Status LoadHeader(const YamlNode& root);
  absl::Status LoadSizeMap(const YamlNode& node, v1::SizeSet* set, bool declare);
  absl::Status LoadSizes(const YamlNode& node);
  absl::Status LoadScalars(const YamlNode& node);
  absl::StatusOr<v1::DType> ParseDTypeAt(const YamlNode& node);
  absl::Status ParseFill(const YamlNode& node, v1::Fill* fill);
  absl::Status LoadBuffers(const YamlNode& node);
  // Every value the fill can produce must be a finite value of the dtype.
  absl::Status CheckFillRange(const YamlNode& node, const v1::Fill& fill, v1::DType dtype);
  absl::Status LoadShape(const YamlNode& node,
                         google::protobuf::RepeatedPtrField<std::string>* shape,
                         std::initializer_list<NameKind> allowed,
                         const absl::flat_hash_set<std::string>& extra = {});
  absl::Status LoadCheck(const YamlNode& node);
  absl::StatusOr<std::string> ReadSource(const YamlNode& node);
  // When confined (LoadOptions), `rel` must name a file inside the folder.
  absl::Status CheckInFolder(const YamlNode& node, const std::string& rel, absl::string_view what) const;
  absl::Status LoadKernel(const YamlNode& node, bool is_seed, v1::KernelSpec* spec);
  // `reference: {pytorch: FILE, ...}` (problem_loader_torch.cc).
  absl::Status LoadTorchReference(const YamlNode& node);
  // Candidate-private buffers (a seed's or a launch plan file's); shapes may use params.
  absl::Status LoadScratch(const YamlNode& node,
                           google::protobuf::RepeatedPtrField<v1::ScratchBuffer>* out,
                           absl::flat_hash_set<std::string>* scratch_names);
  absl::Status LoadDims(const YamlNode& node, google::protobuf::RepeatedPtrField<std::string>* out);
  absl::Status LoadLaunch(const YamlNode& node, const std::string& source,
                          const std::string& source_file,
                          const absl::flat_hash_set<std::string>& scratch, v1::Launch* l);
  absl::Status LoadReplay(const YamlNode& root);
  // Every constraint must be satisfiable alone, and together.
  absl::Status CheckSpace(const YamlNode& seed);
  // What `kforge validate` prints, checked where the error can name the field: every buffer
  // shape on every size set, the reference's launches on every size set, and the seed's launches
  // and scratch shapes with its default params on every size set.
  absl::Status CheckEvaluates(const YamlNode& root);
  // One shape on one size set (`where` says which, and the params): every dimension positive,
  // the element count and bytes within kMaxBufferBytes.
  absl::Status CheckShapeValue(const YamlNode& node,
                               const google::protobuf::RepeatedPtrField<std::string>& shape,
                               v1::DType dtype, const Bindings& env, absl::string_view where,
                               int64_t* elements = nullptr);
  absl::Status CheckLaunchValues(const YamlNode& node, const v1::Launch& launch,
                                 const Bindings& env, absl::string_view where);
  std::string dir_;
  bool confined_ = false;
  std::string file_;
  v1::Problem p_;
  absl::flat_hash_map<std::string, NameKind> names_;
};

}  // namespace kforge::loader_internal
