#include "absl/strings/string_view.h"
#include "common/problem_loader.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/dtype.h"
#include "common/expr.h"
#include "common/hash.h"
#include "common/kt_cache.h"
#include "common/param_space.h"
#include "common/status_macros.h"
#include "common/yaml_reader.h"

namespace kforge {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxSpaceVisits = 1 << 22;

bool IsIdentifier(absl::string_view s) {
  static const std::regex kIdent("[A-Za-z_][A-Za-z0-9_]*");
  return std::regex_match(s.begin(), s.end(), kIdent);
}

bool IsReserved(absl::string_view s) { return s == "ceil_div" || s == "min" || s == "max"; }

// What kind of thing a name refers to, to reject clashes and undefined references.
enum class NameKind { kSize, kScalar, kBuffer, kParam, kDefine };

absl::string_view KindName(NameKind k) {
  switch (k) {
    case NameKind::kSize: return "size";
    case NameKind::kScalar: return "scalar";
    case NameKind::kBuffer: return "buffer";
    case NameKind::kParam: return "param";
    case NameKind::kDefine: return "define";
  }
  return "name";
}

class Loader {
 public:
  explicit Loader(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<v1::Problem> Load() {
    const fs::path yaml = fs::path(dir_) / "problem.yaml";
    file_ = yaml.string();
    std::error_code ec;
    if (!fs::is_directory(dir_, ec)) {
      return absl::NotFoundError(absl::StrCat(dir_, ": not a problem folder (no such directory)"));
    }
    if (!fs::is_regular_file(yaml, ec)) {
      return absl::NotFoundError(absl::StrCat(file_, ": missing (a problem folder needs problem.yaml)"));
    }
    KF_ASSIGN_OR_RETURN(YamlNode root, LoadYamlFile(file_));
    if (!root.is_map()) return root.Error("problem.yaml must be a map of fields");
    KF_RETURN_IF_ERROR(root.CheckKeys({"name", "backend", "description", "sizes", "scalars",
                                       "buffers", "check", "reference", "seed", "replay"}));
    KF_RETURN_IF_ERROR(LoadHeader(root));
    if (p_.backend() == v1::BACKEND_REPLAY) {
      KF_RETURN_IF_ERROR(LoadReplay(root));
    } else {
      KF_RETURN_IF_ERROR(LoadSizes(root.Child("sizes")));
      KF_RETURN_IF_ERROR(LoadScalars(root.Child("scalars")));
      KF_RETURN_IF_ERROR(LoadBuffers(root.Child("buffers")));
      KF_RETURN_IF_ERROR(LoadCheck(root.Child("check")));
      KF_RETURN_IF_ERROR(LoadKernel(root.Child("reference"), /*is_seed=*/false, p_.mutable_reference()));
      KF_RETURN_IF_ERROR(LoadKernel(root.Child("seed"), /*is_seed=*/true, p_.mutable_seed()));
      if (root.Child("replay").defined()) {
        return root.Child("replay").Error("only a replay problem (backend: replay) takes a cache");
      }
    }
    KF_RETURN_IF_ERROR(CheckSpace(root.Child("seed")));
    p_.set_content_hash(HashProblem(p_));
    return p_;
  }

 // Parses a candidate's launch plan against an already loaded problem.
  absl::StatusOr<v1::LaunchPlan> LoadPlan(const v1::Problem& problem, const std::string& path,
                                          const std::string* text = nullptr) {
    p_ = problem;
    file_ = path;
    for (const auto& s : problem.size_sets(0).sizes()) names_[s.first] = NameKind::kSize;
    for (const auto& s : problem.scalars()) names_[s.name()] = NameKind::kScalar;
    for (const auto& b : problem.buffers()) names_[b.name()] = NameKind::kBuffer;
    for (const auto& d : problem.seed().defines()) names_[d.first] = NameKind::kDefine;
    for (const auto& prm : problem.seed().params()) names_[prm.name()] = NameKind::kParam;
    KF_ASSIGN_OR_RETURN(YamlNode root, text != nullptr ? LoadYamlString(*text, path) : LoadYamlFile(path));
    if (!root.is_map()) return root.Error("a launch plan file must be a map with launches (and scratch)");
    KF_RETURN_IF_ERROR(root.CheckKeys({"launches", "scratch"}));
    v1::LaunchPlan plan;
    absl::flat_hash_set<std::string> scratch_names;
    KF_RETURN_IF_ERROR(LoadScratch(root.Child("scratch"), plan.mutable_scratch(), &scratch_names));
    KF_ASSIGN_OR_RETURN(auto launches, root.Child("launches").Items());
    if (launches.empty()) return root.Child("launches").Error("at least one launch is needed");
    // The source is the candidate's, not known here: kernel names are checked at compile time.
    for (const auto& l : launches) {
      KF_RETURN_IF_ERROR(LoadLaunch(l, "", "", scratch_names, plan.add_launches()));
    }
    return plan;
  }

 private:
  absl::Status Declare(const YamlNode& at, const std::string& name, NameKind kind) {
    if (!IsIdentifier(name)) {
      return at.Error(absl::StrCat("'", name, "' is not a valid name (letters, digits, _)"));
    }
    if (IsReserved(name)) return at.Error(absl::StrCat("'", name, "' is a reserved function name"));
    auto [it, inserted] = names_.emplace(name, kind);
    if (!inserted) {
      return at.Error(absl::StrCat("'", name, "' is already defined as a ", KindName(it->second)));
    }
    return absl::OkStatus();
  }

  // Parses an expression and checks every name it reads is of an allowed kind.
  absl::Status CheckExpr(const YamlNode& at, const std::string& text,
                         std::initializer_list<NameKind> allowed,
                         const absl::flat_hash_set<std::string>& extra = {}) {
    auto e = Expr::Parse(text);
    if (!e.ok()) return at.Error(absl::StrCat("bad expression '", text, "': ", e.status().message()));
    for (const auto& n : e->Names()) {
      if (extra.contains(n)) continue;
      auto it = names_.find(n);
      bool ok = false;
      if (it != names_.end()) {
        for (auto k : allowed) ok = ok || k == it->second;
      }
      if (!ok) {
        std::vector<std::string> kinds;
        for (auto k : allowed) kinds.emplace_back(KindName(k));
        return at.Error(absl::StrCat("undefined name '", n, "' in '", text, "' (expected a ",
                                     absl::StrJoin(kinds, " or "), ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status LoadHeader(const YamlNode& root) {
    KF_ASSIGN_OR_RETURN(std::string name, root.Child("name").AsString());
    static const std::regex kName("[A-Za-z0-9_.-]+");
    if (!std::regex_match(name, kName)) {
      return root.Child("name").Error(absl::StrCat("'", name, "' is not a valid problem name ([A-Za-z0-9_.-]+)"));
    }
    p_.set_name(name);
    KF_ASSIGN_OR_RETURN(std::string backend, root.Child("backend").AsString());
    if (backend == "opencl") {
      p_.set_backend(v1::BACKEND_OPENCL);
    } else if (backend == "cuda") {
      p_.set_backend(v1::BACKEND_CUDA);
    } else if (backend == "replay") {
      p_.set_backend(v1::BACKEND_REPLAY);
    } else {
      return root.Child("backend").Error(
          absl::StrCat("unknown backend '", backend, "' (expected opencl, cuda or replay)"));
    }
    if (root.Child("description").defined()) {
      KF_ASSIGN_OR_RETURN(std::string d, root.Child("description").AsString());
      p_.set_description(d);
    }
    return absl::OkStatus();
  }

  absl::Status LoadSizeMap(const YamlNode& node, v1::SizeSet* set, bool declare) {
    KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
    if (entries.empty()) return node.Error("no sizes given");
    for (const auto& [k, v] : entries) {
      if (declare) {
        KF_RETURN_IF_ERROR(Declare(v, k, NameKind::kSize));
      } else if (!names_.contains(k) || names_[k] != NameKind::kSize) {
        return v.Error(absl::StrCat("size '", k, "' is not in the first size set"));
      }
      KF_ASSIGN_OR_RETURN(int64_t x, v.AsInt64());
      if (x <= 0) return v.Error(absl::StrCat("size must be positive, got ", x));
      (*set->mutable_sizes())[k] = x;
    }
    return absl::OkStatus();
  }

  absl::Status LoadSizes(const YamlNode& node) {
    if (!node.defined()) return node.Error("missing field (a map of sizes or a list of size sets)");
    if (node.is_map()) {
      v1::SizeSet* set = p_.add_size_sets();
      set->set_name("default");
      set->set_bench(true);
      return LoadSizeMap(node, set, /*declare=*/true);
    }
    KF_ASSIGN_OR_RETURN(auto items, node.Items());
    if (items.empty()) return node.Error("no size sets given");
    absl::flat_hash_set<std::string> set_names;
    bool any_bench = false;
    for (size_t i = 0; i < items.size(); ++i) {
      const YamlNode& item = items[i];
      if (!item.is_map()) return item.Error("expected {name: ..., sizes: {...}, bench: true|false}");
      KF_RETURN_IF_ERROR(item.CheckKeys({"name", "sizes", "bench"}));
      v1::SizeSet* set = p_.add_size_sets();
      KF_ASSIGN_OR_RETURN(std::string name, item.Child("name").AsString());
      if (!set_names.insert(name).second) {
        return item.Child("name").Error(absl::StrCat("duplicate size set '", name, "'"));
      }
      set->set_name(name);
      set->set_bench(true);
      if (item.Child("bench").defined()) {
        KF_ASSIGN_OR_RETURN(bool b, item.Child("bench").AsBool());
        set->set_bench(b);
      }
      any_bench = any_bench || set->bench();
      KF_RETURN_IF_ERROR(LoadSizeMap(item.Child("sizes"), set, /*declare=*/i == 0));
      if (i > 0 && set->sizes_size() != p_.size_sets(0).sizes_size()) {
        for (const auto& [k, v] : p_.size_sets(0).sizes()) {
          if (!set->sizes().contains(k)) {
            return item.Child("sizes").Error(absl::StrCat("size '", k, "' is missing (every set must give every size)"));
          }
        }
      }
    }
    if (!any_bench) return node.Error("no size set has bench: true");
    return absl::OkStatus();
  }

  absl::Status LoadScalars(const YamlNode& node) {
    if (!node.defined()) return absl::OkStatus();
    KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
    for (const auto& [name, v] : entries) {
      KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kScalar));
      if (!v.is_map()) return v.Error("expected {dtype: ..., value: ...}");
      KF_RETURN_IF_ERROR(v.CheckKeys({"dtype", "value"}));
      v1::Scalar* s = p_.add_scalars();
      s->set_name(name);
      KF_ASSIGN_OR_RETURN(v1::DType dt, ParseDTypeAt(v.Child("dtype")));
      s->set_dtype(dt);
      KF_ASSIGN_OR_RETURN(double val, v.Child("value").AsDouble());
      s->set_value(val);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<v1::DType> ParseDTypeAt(const YamlNode& node) {
    KF_ASSIGN_OR_RETURN(std::string s, node.AsString());
    auto dt = ParseDType(s);
    if (!dt) return node.Error(absl::StrCat("unknown dtype '", s, "' (expected one of ", kDTypeNames, ")"));
    return *dt;
  }

  absl::Status ParseFill(const YamlNode& node, v1::Fill* fill) {
    KF_ASSIGN_OR_RETURN(std::string text, node.AsString());
    std::string s(absl::StripAsciiWhitespace(text));
    if (s == "zeros") {
      fill->set_kind(v1::Fill::KIND_CONSTANT);
      return absl::OkStatus();
    }
    if (s == "ones") {
      fill->set_kind(v1::Fill::KIND_CONSTANT);
      fill->set_a(1);
      return absl::OkStatus();
    }
    static const std::regex kCall(R"(([a-z]+)\s*\(([^()]*)\))");
    std::smatch m;
    if (!std::regex_match(s, m, kCall)) {
      if (s.find('(') != std::string::npos && s.find(')') == std::string::npos) {
        return node.Error(absl::StrCat("fill '", s,
                                       "' is cut short: in YAML flow style {...} quote it, e.g. "
                                       "fill: \"uniform(-1, 1)\""));
      }
      return node.Error(absl::StrCat("bad fill '", s,
                                     "' (expected uniform(a, b), normal(mean, std), randint(a, b), "
                                     "constant(v), arange(start, step), zeros or ones)"));
    }
    const std::string fn = m[1];
    std::vector<double> args;
    for (absl::string_view part : absl::StrSplit(std::string(m[2]), ',')) {
      double d = 0;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(part), &d)) {
        return node.Error(absl::StrCat("bad number '", part, "' in fill '", s, "'"));
      }
      args.push_back(d);
    }
    size_t want = 2;
    if (fn == "uniform") {
      fill->set_kind(v1::Fill::KIND_UNIFORM);
    } else if (fn == "normal") {
      fill->set_kind(v1::Fill::KIND_NORMAL);
    } else if (fn == "randint") {
      fill->set_kind(v1::Fill::KIND_RANDINT);
    } else if (fn == "arange") {
      fill->set_kind(v1::Fill::KIND_ARANGE);
    } else if (fn == "constant") {
      fill->set_kind(v1::Fill::KIND_CONSTANT);
      want = 1;
    } else {
      return node.Error(absl::StrCat("unknown fill '", fn, "'"));
    }
    if (args.size() != want) {
      return node.Error(absl::StrCat("fill ", fn, " takes ", want, " numbers, got ", args.size()));
    }
    fill->set_a(args[0]);
    if (want == 2) fill->set_b(args[1]);
    if ((fn == "uniform" || fn == "randint") && args[1] < args[0]) {
      return node.Error(absl::StrCat("fill '", s, "': upper bound below lower bound"));
    }
    if (fn == "normal" && args[1] < 0) return node.Error("fill normal: std must be >= 0");
    return absl::OkStatus();
  }

  absl::Status LoadBuffers(const YamlNode& node) {
    if (!node.defined()) return node.Error("missing field (a map of buffers)");
    KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
    bool any_out = false;
    for (const auto& [name, v] : entries) {
      KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kBuffer));
      if (!v.is_map()) return v.Error("expected {dtype: ..., shape: [...], role: ...}");
      // In flow style a bare comma cuts "uniform(-1, 1)" into a value and a stray key: say so
      // before the stray key is reported as unknown.
      if (const YamlNode fill = v.Child("fill"); fill.is_scalar()) {
        const std::string f = fill.AsString().value_or("");
        if (f.find('(') != std::string::npos && f.find(')') == std::string::npos) {
          return fill.Error(absl::StrCat("fill '", f, "' is cut short: in YAML flow style {...} quote it, e.g. "
                                         "fill: \"uniform(-1, 1)\""));
        }
      }
      KF_RETURN_IF_ERROR(v.CheckKeys({"dtype", "shape", "role", "fill"}));
      v1::Buffer* b = p_.add_buffers();
      b->set_name(name);
      KF_ASSIGN_OR_RETURN(v1::DType dt, ParseDTypeAt(v.Child("dtype")));
      b->set_dtype(dt);
      KF_ASSIGN_OR_RETURN(std::string role, v.Child("role").AsString());
      if (role == "in") {
        b->set_role(v1::BUFFER_ROLE_IN);
      } else if (role == "out") {
        b->set_role(v1::BUFFER_ROLE_OUT);
      } else if (role == "inout") {
        b->set_role(v1::BUFFER_ROLE_INOUT);
      } else {
        return v.Child("role").Error(absl::StrCat("unknown role '", role, "' (expected in, out or inout)"));
      }
      any_out = any_out || b->role() != v1::BUFFER_ROLE_IN;
      KF_RETURN_IF_ERROR(LoadShape(v.Child("shape"), b->mutable_shape(), {NameKind::kSize}));
      if (v.Child("fill").defined()) {
        if (b->role() == v1::BUFFER_ROLE_OUT) {
          return v.Child("fill").Error("an output buffer is not filled (it is poisoned before each run)");
        }
        KF_RETURN_IF_ERROR(ParseFill(v.Child("fill"), b->mutable_fill()));
      } else if (b->role() != v1::BUFFER_ROLE_OUT) {
        b->mutable_fill()->set_kind(v1::Fill::KIND_UNIFORM);
        b->mutable_fill()->set_a(dt == v1::DTYPE_U8 ? 0 : -1);
        b->mutable_fill()->set_b(1);
        if (!IsFloatDType(dt)) {
          b->mutable_fill()->set_kind(v1::Fill::KIND_RANDINT);
          b->mutable_fill()->set_b(dt == v1::DTYPE_U8 ? 255 : 100);
          b->mutable_fill()->set_a(dt == v1::DTYPE_U8 ? 0 : -100);
        }
      }
    }
    if (p_.buffers_size() == 0) return node.Error("no buffers given");
    if (!any_out) return node.Error("no buffer has role out or inout: nothing would be checked");
    return absl::OkStatus();
  }

  absl::Status LoadShape(const YamlNode& node, google::protobuf::RepeatedPtrField<std::string>* shape,
                         std::initializer_list<NameKind> allowed,
                         const absl::flat_hash_set<std::string>& extra = {}) {
    if (!node.defined()) return node.Error("missing field (a list of dimension expressions)");
    KF_ASSIGN_OR_RETURN(auto items, node.Items(/*allow_scalar=*/true));
    if (items.empty()) return node.Error("shape needs at least one dimension");
    for (const auto& item : items) {
      KF_ASSIGN_OR_RETURN(std::string e, item.AsString());
      KF_RETURN_IF_ERROR(CheckExpr(item, e, allowed, extra));
      shape->Add(std::move(e));
    }
    return absl::OkStatus();
  }

  absl::Status LoadCheck(const YamlNode& node) {
    v1::Check* c = p_.mutable_check();
    c->set_atol(1e-5);
    c->set_rtol(1e-5);
    c->set_trials(3);
    if (!node.defined()) return absl::OkStatus();
    KF_RETURN_IF_ERROR(node.CheckKeys({"atol", "rtol", "trials"}));
    if (node.Child("atol").defined()) {
      KF_ASSIGN_OR_RETURN(double v, node.Child("atol").AsDouble());
      if (v < 0) return node.Child("atol").Error("must be >= 0");
      c->set_atol(v);
    }
    if (node.Child("rtol").defined()) {
      KF_ASSIGN_OR_RETURN(double v, node.Child("rtol").AsDouble());
      if (v < 0) return node.Child("rtol").Error("must be >= 0");
      c->set_rtol(v);
    }
    if (node.Child("trials").defined()) {
      KF_ASSIGN_OR_RETURN(int64_t v, node.Child("trials").AsInt64());
      if (v < 1 || v > 100) return node.Child("trials").Error("must be between 1 and 100");
      c->set_trials(static_cast<int32_t>(v));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadSource(const YamlNode& node) {
    KF_ASSIGN_OR_RETURN(std::string rel, node.AsString());
    const fs::path path = fs::path(dir_) / rel;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      return node.Error(absl::StrCat("source file '", rel, "' is missing (looked in ", dir_, ")"));
    }
    if (fs::file_size(path, ec) > static_cast<uintmax_t>(kMaxSourceBytes)) {
      return node.Error(absl::StrCat("source file '", rel, "' is larger than ", kMaxSourceBytes, " bytes"));
    }
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) return node.Error(absl::StrCat("cannot read source file '", rel, "'"));
    return ss.str();
  }

  absl::Status LoadKernel(const YamlNode& node, bool is_seed, v1::KernelSpec* spec) {
    if (!node.defined()) return node.Error("missing field (source and launches)");
    if (!node.is_map()) return node.Error("expected a map with source and launches");
    if (is_seed) {
      KF_RETURN_IF_ERROR(node.CheckKeys({"source", "params", "constraints", "launches", "scratch", "defines"}));
    } else {
      KF_RETURN_IF_ERROR(node.CheckKeys({"source", "launches", "defines"}));
    }
    spec->set_source_file(node.Child("source").AsString().value_or(""));
    KF_ASSIGN_OR_RETURN(std::string source, ReadSource(node.Child("source")));
    spec->set_source(std::move(source));

    // Params and defines are local to a kernel spec: remember the outer names to restore them.
    auto saved = names_;
    if (node.Child("defines").defined()) {
      KF_ASSIGN_OR_RETURN(auto defs, node.Child("defines").Entries());
      for (const auto& [name, v] : defs) {
        KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kDefine));
        KF_ASSIGN_OR_RETURN(int64_t x, v.AsInt64());
        (*spec->mutable_defines())[name] = x;
      }
    }
    if (is_seed && node.Child("params").defined()) {
      KF_ASSIGN_OR_RETURN(auto params, node.Child("params").Entries());
      for (const auto& [name, v] : params) {
        KF_RETURN_IF_ERROR(Declare(v, name, NameKind::kParam));
        v1::Param* p = spec->add_params();
        p->set_name(name);
        KF_ASSIGN_OR_RETURN(auto vals, v.Items(/*allow_scalar=*/true));
        if (vals.empty()) return v.Error(absl::StrCat("param '", name, "' has an empty value list"));
        absl::flat_hash_set<int64_t> seen;
        for (const auto& item : vals) {
          KF_ASSIGN_OR_RETURN(int64_t x, item.AsInt64());
          if (!seen.insert(x).second) return item.Error(absl::StrCat("duplicate value ", x));
          p->add_values(x);
        }
      }
    }
    if (is_seed && node.Child("constraints").defined()) {
      KF_ASSIGN_OR_RETURN(auto cons, node.Child("constraints").Items(/*allow_scalar=*/true));
      for (const auto& c : cons) {
        KF_ASSIGN_OR_RETURN(std::string text, c.AsString());
        KF_RETURN_IF_ERROR(CheckExpr(c, text, {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
        spec->add_constraints(text);
      }
    }
    absl::flat_hash_set<std::string> scratch_names;
    if (is_seed) KF_RETURN_IF_ERROR(LoadScratch(node.Child("scratch"), spec->mutable_scratch(), &scratch_names));
    KF_ASSIGN_OR_RETURN(auto launches, node.Child("launches").Items());
    if (launches.empty()) return node.Child("launches").Error("at least one launch is needed");
    for (const auto& l : launches) {
      KF_RETURN_IF_ERROR(LoadLaunch(l, spec->source(), spec->source_file(), scratch_names,
                                    spec->add_launches()));
    }
    names_ = std::move(saved);
    return absl::OkStatus();
  }

  // Candidate-private buffers (a seed's or a launch plan file's); shapes may use params.
  absl::Status LoadScratch(const YamlNode& node, google::protobuf::RepeatedPtrField<v1::ScratchBuffer>* out,
                           absl::flat_hash_set<std::string>* scratch_names) {
    if (!node.defined()) return absl::OkStatus();
    KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
    for (const auto& [name, v] : entries) {
      if (names_.contains(name)) {
        return v.Error(absl::StrCat("'", name, "' is already defined as a ", KindName(names_[name])));
      }
      if (!IsIdentifier(name)) return v.Error(absl::StrCat("'", name, "' is not a valid name"));
      KF_RETURN_IF_ERROR(v.CheckKeys({"dtype", "shape"}));
      v1::ScratchBuffer* sb = out->Add();
      sb->set_name(name);
      KF_ASSIGN_OR_RETURN(v1::DType dt, ParseDTypeAt(v.Child("dtype")));
      sb->set_dtype(dt);
      KF_RETURN_IF_ERROR(LoadShape(v.Child("shape"), sb->mutable_shape(),
                                   {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
      scratch_names->insert(name);
    }
    return absl::OkStatus();
  }

  absl::Status LoadDims(const YamlNode& node, google::protobuf::RepeatedPtrField<std::string>* out) {
    KF_ASSIGN_OR_RETURN(auto items, node.Items(/*allow_scalar=*/true));
    if (items.empty() || items.size() > 3) return node.Error("expected 1 to 3 dimensions");
    for (const auto& item : items) {
      KF_ASSIGN_OR_RETURN(std::string e, item.AsString());
      KF_RETURN_IF_ERROR(CheckExpr(item, e, {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
      out->Add(std::move(e));
    }
    return absl::OkStatus();
  }

  absl::Status LoadLaunch(const YamlNode& node, const std::string& source,
                          const std::string& source_file,
                          const absl::flat_hash_set<std::string>& scratch, v1::Launch* l) {
    if (!node.is_map()) return node.Error("expected a launch map {kernel: ..., args: [...], ...}");
    const bool cuda = p_.backend() == v1::BACKEND_CUDA;
    if (cuda) {
      KF_RETURN_IF_ERROR(node.CheckKeys({"kernel", "grid", "block", "shared_bytes", "args"}));
    } else {
      KF_RETURN_IF_ERROR(node.CheckKeys({"kernel", "global", "local", "args"}));
    }
    KF_ASSIGN_OR_RETURN(std::string kernel, node.Child("kernel").AsString());
    if (!IsIdentifier(kernel)) return node.Child("kernel").Error(absl::StrCat("'", kernel, "' is not a kernel name"));
    const std::regex def("\\b" + kernel + "\\s*\\(");
    if (!source_file.empty() && !std::regex_search(source, def)) {
      return node.Child("kernel").Error(absl::StrCat("kernel '", kernel, "' is not defined in ", source_file));
    }
    l->set_kernel(kernel);
    if (cuda) {
      KF_RETURN_IF_ERROR(LoadDims(node.Child("grid"), l->mutable_grid()));
      KF_RETURN_IF_ERROR(LoadDims(node.Child("block"), l->mutable_block()));
      if (node.Child("shared_bytes").defined()) {
        KF_ASSIGN_OR_RETURN(std::string e, node.Child("shared_bytes").AsString());
        KF_RETURN_IF_ERROR(CheckExpr(node.Child("shared_bytes"), e,
                                     {NameKind::kSize, NameKind::kParam, NameKind::kDefine}));
        l->set_shared_bytes(e);
      }
    } else {
      KF_RETURN_IF_ERROR(LoadDims(node.Child("global"), l->mutable_global()));
      if (node.Child("local").defined()) {
        KF_RETURN_IF_ERROR(LoadDims(node.Child("local"), l->mutable_local()));
        if (l->local_size() != l->global_size()) {
          return node.Child("local").Error(absl::StrCat("has ", l->local_size(),
                                                        " dimensions but global has ", l->global_size()));
        }
      }
    }
    KF_ASSIGN_OR_RETURN(auto args, node.Child("args").Items());
    for (const auto& a : args) {
      KF_ASSIGN_OR_RETURN(std::string text, a.AsString());
      auto it = names_.find(text);
      const bool is_named_value = scratch.contains(text) ||
                                  (it != names_.end() && (it->second == NameKind::kBuffer ||
                                                          it->second == NameKind::kScalar));
      if (!is_named_value) {
        auto e = Expr::Parse(text);
        if (!e.ok()) {
          return a.Error(absl::StrCat("launch argument '", text, "' names no buffer, scalar or size"));
        }
        for (const auto& n : e->Names()) {
          auto nit = names_.find(n);
          if (nit == names_.end() || nit->second == NameKind::kBuffer || nit->second == NameKind::kScalar) {
            return a.Error(absl::StrCat("launch argument '", text, "' names no buffer, scalar or size"));
          }
        }
      }
      l->add_args(text);
    }
    return absl::OkStatus();
  }

  absl::Status LoadReplay(const YamlNode& root) {
    for (const char* k : {"sizes", "scalars", "buffers", "check", "reference"}) {
      if (root.Child(k).defined()) return root.Child(k).Error("a replay problem has no sources, sizes or buffers");
    }
    const YamlNode node = root.Child("replay");
    if (!node.defined()) return node.Error("missing field (replay: {cache: FILE})");
    KF_RETURN_IF_ERROR(node.CheckKeys({"cache"}));
    KF_ASSIGN_OR_RETURN(std::string rel, node.Child("cache").AsString());
    const fs::path path = fs::absolute(fs::path(dir_) / rel);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      return node.Child("cache").Error(absl::StrCat("cache file '", rel, "' is missing"));
    }
    auto cache = LoadKtCache(path.string(), rel);
    if (!cache.ok()) return node.Child("cache").Error(cache.status().message());
    p_.mutable_replay()->set_cache_file(rel);
    p_.mutable_replay()->set_cache_path(path.string());
    v1::SizeSet* set = p_.add_size_sets();
    set->set_name("default");
    set->set_bench(true);

    const YamlNode seed = root.Child("seed");
    absl::flat_hash_map<std::string, std::vector<int64_t>> narrowed;
    if (seed.defined()) {
      KF_RETURN_IF_ERROR(seed.CheckKeys({"params", "constraints"}));
      if (seed.Child("params").defined()) {
        KF_ASSIGN_OR_RETURN(auto params, seed.Child("params").Entries());
        for (const auto& [name, v] : params) {
          auto pos = std::find(cache->keys.begin(), cache->keys.end(), name);
          if (pos == cache->keys.end()) {
            return v.Error(absl::StrCat("param '", name, "' is not a tunable parameter of ", rel));
          }
          const auto& allowed = cache->values[pos - cache->keys.begin()];
          KF_ASSIGN_OR_RETURN(auto vals, v.Items(/*allow_scalar=*/true));
          if (vals.empty()) return v.Error(absl::StrCat("param '", name, "' has an empty value list"));
          for (const auto& item : vals) {
            KF_ASSIGN_OR_RETURN(int64_t x, item.AsInt64());
            if (std::find(allowed.begin(), allowed.end(), x) == allowed.end()) {
              return item.Error(absl::StrCat("value ", x, " of '", name, "' is not in ", rel));
            }
            narrowed[name].push_back(x);
          }
        }
      }
    }
    v1::KernelSpec* spec = p_.mutable_seed();
    spec->set_source_file(rel);
    for (size_t i = 0; i < cache->keys.size(); ++i) {
      KF_RETURN_IF_ERROR(Declare(node, cache->keys[i], NameKind::kParam));
      v1::Param* p = spec->add_params();
      p->set_name(cache->keys[i]);
      auto it = narrowed.find(cache->keys[i]);
      for (int64_t v : it != narrowed.end() ? it->second : cache->values[i]) p->add_values(v);
    }
    if (seed.defined() && seed.Child("constraints").defined()) {
      KF_ASSIGN_OR_RETURN(auto cons, seed.Child("constraints").Items(/*allow_scalar=*/true));
      for (const auto& c : cons) {
        KF_ASSIGN_OR_RETURN(std::string text, c.AsString());
        KF_RETURN_IF_ERROR(CheckExpr(c, text, {NameKind::kParam}));
        spec->add_constraints(text);
      }
    }
    return absl::OkStatus();
  }

  // Every constraint must be satisfiable alone, and together.
  absl::Status CheckSpace(const YamlNode& seed) {
    KF_ASSIGN_OR_RETURN(ParamSpace space, ParamSpace::Create(p_));
    if (space.constraint_count() == 0) return absl::OkStatus();
    if (space.TotalAssignments() > kMaxSpaceVisits && space.constraint_count() > 0) {
      return absl::OkStatus();  // too large to prove; the search reports it if nothing is valid
    }
    const int64_t total = space.TotalAssignments();
    std::vector<bool> sat(space.constraint_count(), false);
    bool any = false;
    for (int64_t i = 0; i < total; ++i) {
      ParamAssignment a = space.Decode(i);
      bool all = true;
      for (size_t c = 0; c < sat.size(); ++c) {
        auto ok = space.Holds(c, a);
        if (!ok.ok()) {
          // Division by zero etc. for some assignment: report it with the assignment.
          return seed.Child("constraints").Error(absl::StrCat(ok.status().message(), " for ", FormatParams(a)));
        }
        sat[c] = sat[c] || *ok;
        all = all && *ok;
      }
      any = any || all;
    }
    if (any) return absl::OkStatus();
    auto items = seed.Child("constraints").Items(/*allow_scalar=*/true);
    for (size_t c = 0; c < sat.size(); ++c) {
      if (!sat[c]) {
        const YamlNode at = items.ok() && c < items->size() ? (*items)[c] : seed.Child("constraints");
        return at.Error(absl::StrCat("constraint '", p_.seed().constraints(c),
                                     "' holds for no param assignment"));
      }
    }
    return seed.Child("constraints").Error("the constraints together admit no param assignment");
  }

  std::string dir_;
  std::string file_;
  v1::Problem p_;
  absl::flat_hash_map<std::string, NameKind> names_;
};

}  // namespace

absl::StatusOr<v1::Problem> LoadProblem(const std::string& dir) { return Loader(dir).Load(); }

absl::StatusOr<v1::Problem> ReplayProblemFromCache(const std::string& cache_path) {
  auto cache = LoadKtCache(cache_path);
  if (!cache.ok()) return cache.status();
  v1::Problem p;
  std::string name = fs::path(cache_path).filename().string();
  for (const char* ext : {".gz", ".json"}) {
    if (absl::EndsWith(name, ext)) name.resize(name.size() - std::strlen(ext));
  }
  p.set_name(absl::StrCat(fs::path(cache_path).parent_path().filename().string(), "-", name));
  p.set_backend(v1::BACKEND_REPLAY);
  p.set_description(absl::StrCat("recorded tuning space of ", cache->kernel_name, " on ", cache->device_name));
  p.mutable_replay()->set_cache_file(fs::path(cache_path).filename().string());
  p.mutable_replay()->set_cache_path(fs::absolute(cache_path).string());
  auto* set = p.add_size_sets();
  set->set_name("default");
  set->set_bench(true);
  for (size_t i = 0; i < cache->keys.size(); ++i) {
    v1::Param* prm = p.mutable_seed()->add_params();
    prm->set_name(cache->keys[i]);
    for (int64_t v : cache->values[i]) prm->add_values(v);
  }
  p.mutable_seed()->set_source_file(p.replay().cache_file());
  p.set_content_hash(HashProblem(p));
  return p;
}

absl::StatusOr<v1::LaunchPlan> LoadLaunchPlanFile(const v1::Problem& problem, const std::string& path) {
  if (problem.size_sets().empty()) return absl::InvalidArgumentError("problem has no size sets");
  return Loader("").LoadPlan(problem, path);
}

absl::StatusOr<v1::LaunchPlan> LoadLaunchPlanText(const v1::Problem& problem, const std::string& yaml,
                                                  const std::string& display_name) {
  if (problem.size_sets().empty()) return absl::InvalidArgumentError("problem has no size sets");
  return Loader("").LoadPlan(problem, display_name, &yaml);
}

}  // namespace kforge
