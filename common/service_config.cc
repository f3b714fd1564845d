#include "absl/strings/string_view.h"
#include "common/service_config.h"

#include <cstdlib>
#include <iostream>
#include <map>

#include "CLI/CLI.hpp"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace kforge {

void ConfigSchema::Add(std::string key, Target target, std::string help, Check check) {
  fields_.push_back({std::move(key), target, std::move(help), std::move(check)});
}

absl::Status ConfigSchema::Set(const Field& f, const std::string& value, const std::string& where) {
  auto bad = [&](absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", f.key, ": expected ", want, ", got '", value, "'"));
  };
  if (auto* s = std::get_if<std::string*>(&f.target)) {
    **s = value;
  } else if (auto* i = std::get_if<int64_t*>(&f.target)) {
    if (!absl::SimpleAtoi(value, *i)) return bad("an integer");
  } else if (auto* d = std::get_if<double*>(&f.target)) {
    if (!absl::SimpleAtod(value, *d)) return bad("a number");
  } else if (auto* b = std::get_if<bool*>(&f.target)) {
    if (!absl::SimpleAtob(value, *b)) return bad("true or false");
  }
  return absl::OkStatus();
}

absl::Status ConfigSchema::LoadLevel(const YamlNode& node, const std::string& prefix) {
  KF_ASSIGN_OR_RETURN(auto entries, node.Entries());
  for (const auto& [k, v] : entries) {
    const std::string key = prefix.empty() ? k : absl::StrCat(prefix, ".", k);
    const Field* field = nullptr;
    bool is_group = false;
    for (const auto& f : fields_) {
      if (f.key == key) field = &f;
      if (absl::StartsWith(f.key, key + ".")) is_group = true;
    }
    if (field != nullptr) {
      KF_ASSIGN_OR_RETURN(std::string value, v.AsString());
      const std::string where = absl::StrCat(v.file(), ":", v.line(), ":", v.column());
      KF_RETURN_IF_ERROR(Set(*field, value, where));
    } else if (is_group) {
      if (!v.is_map()) return v.Error("expected a map");
      KF_RETURN_IF_ERROR(LoadLevel(v, key));
    } else {
      return v.KeyError(absl::StrCat("unknown config key '", key, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConfigSchema::Load(const YamlNode& root) {
  if (!root.defined()) return absl::OkStatus();  // an empty file keeps every default
  if (!root.is_map()) return root.Error("a config file must be a map");
  KF_RETURN_IF_ERROR(LoadLevel(root, ""));
  return Validate();
}

absl::Status ConfigSchema::LoadFile(const std::string& path) {
  KF_ASSIGN_OR_RETURN(YamlNode root, LoadYamlFile(path));
  return Load(root);
}

std::string ConfigSchema::EnvName(absl::string_view prefix, absl::string_view key) {
  std::string name = absl::StrCat(prefix, "_", absl::StrReplaceAll(key, {{".", "_"}, {"-", "_"}}));
  absl::AsciiStrToUpper(&name);
  return name;
}

absl::Status ConfigSchema::ApplyEnv(absl::string_view prefix, const EnvLookup& env) {
  for (const auto& f : fields_) {
    const std::string name = EnvName(prefix, f.key);
    if (const char* v = env(name.c_str()); v != nullptr) {
      KF_RETURN_IF_ERROR(Set(f, v, absl::StrCat("environment variable ", name)));
    }
  }
  return Validate();
}

absl::Status ConfigSchema::Validate() const {
  for (const auto& f : fields_) {
    if (!f.check) continue;
    if (std::string err = f.check(); !err.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(f.key, ": ", err));
    }
  }
  return absl::OkStatus();
}

std::string ConfigSchema::ValueString(const Target& t) {
  if (auto* s = std::get_if<std::string*>(&t)) {
    // YAML double-quoted style: escape backslash, quote and control characters; UTF-8 passes.
    std::string out = "\"";
    for (unsigned char c : **s) {
      if (c == '\\' || c == '"') {
        out.push_back('\\');
        out.push_back(static_cast<char>(c));
      } else if (c < 0x20 || c == 0x7f) {
        out += absl::StrFormat("\\x%02x", c);
      } else {
        out.push_back(static_cast<char>(c));
      }
    }
    return out + "\"";
  }
  if (auto* i = std::get_if<int64_t*>(&t)) return absl::StrCat(**i);
  if (auto* d = std::get_if<double*>(&t)) return absl::StrFormat("%.17g", **d);
  if (auto* b = std::get_if<bool*>(&t)) return **b ? "true" : "false";
  return "";
}

std::string ConfigSchema::Dump() const {
  // Group by the dotted prefix so the output is valid nested YAML.
  std::string out;
  std::vector<std::string> open;
  for (const auto& f : fields_) {
    std::vector<std::string> parts = absl::StrSplit(f.key, '.');
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      absl::StrAppend(&out, std::string(2 * i, ' '), parts[i], ":\n");
      open.push_back(parts[i]);
    }
    absl::StrAppend(&out, std::string(2 * (parts.size() - 1), ' '), parts.back(), ": ",
                    ValueString(f.target), "  # ", f.help, "\n");
  }
  return out;
}

std::string ConfigSchema::Describe(absl::string_view env_prefix) const {
  std::string out;
  for (const auto& f : fields_) {
    absl::StrAppend(&out, "  ", f.key, " (env ", EnvName(env_prefix, f.key), "): ", f.help,
                    " [default ", ValueString(f.target), "]\n");
  }
  return out;
}

std::string CheckHostPort(absl::string_view value) {
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return absl::StrCat("'", value, "' is not host:port");
  int port = -1;
  if (!absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::StrCat("'", value, "' has no valid port (0 to 65535)");
  }
  return "";
}

void AddServerFields(ConfigSchema& schema, ServerOptions& opts, absl::string_view default_listen,
                     absl::string_view default_metrics) {
  opts.listen = std::string(default_listen);
  opts.metrics_listen = std::string(default_metrics);
  schema.Add("server.listen", &opts.listen, "gRPC listen address host:port (port 0 = any free)",
             [&opts] { return CheckHostPort(opts.listen); });
  schema.Add("server.metrics_listen", &opts.metrics_listen,
             "Prometheus /metrics listen address host:port",
             [&opts] { return CheckHostPort(opts.metrics_listen); });
  schema.Add("server.log_level", &opts.log_level, "debug, info, warn, error or off", [&opts] {
    auto l = ParseLogLevel(opts.log_level);
    return l.ok() ? std::string() : std::string(l.status().message());
  });
  schema.Add("server.tls.cert", &opts.tls.cert, "TLS certificate chain (PEM file) for the gRPC port; empty: plaintext",
             [&opts] { return CheckTlsServerFiles(opts.tls); });
  schema.Add("server.tls.key", &opts.tls.key, "the certificate's private key (PEM file)");
  schema.Add("server.tls.client_ca", &opts.tls.client_ca,
             "CA (PEM file) that signs the callers' certificates: mutual TLS, a caller without one is refused");
}

std::optional<int> LoadServiceConfigFromArgs(int argc, char** argv, absl::string_view name,
                                             absl::string_view description,
                                             absl::string_view env_prefix, ConfigSchema& schema) {
  CLI::App app{std::string(description), std::string(name)};
  std::string config_path;
  bool print_config = false;
  app.add_option("-c,--config", config_path, "YAML config file")->check(CLI::ExistingFile);
  app.add_flag("--print-config", print_config, "print the effective config and exit");
  app.footer(absl::StrCat("Config keys (file key, environment override):\n",
                          schema.Describe(env_prefix)));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  absl::Status st;
  if (!config_path.empty()) st = schema.LoadFile(config_path);
  if (st.ok()) st = schema.ApplyEnv(env_prefix, [](const char* k) { return std::getenv(k); });
  if (st.ok()) st = schema.Validate();
  if (!st.ok()) {
    std::cerr << name << ": bad config: " << st.message() << "\n";
    return 2;
  }
  if (print_config) {
    std::cout << schema.Dump();
    return 0;
  }
  return std::nullopt;
}

}  // namespace kforge
