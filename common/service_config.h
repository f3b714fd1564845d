#pragma once

// Declarative service configuration: each service lists its fields (dotted keys bound to
// members of its option struct); the schema reads a YAML file, applies environment overrides and
// prints the effective config. Unknown keys and wrong types are errors that name file, line,
// column and key.

#include "absl/strings/string_view.h"
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/tls.h"
#include "common/yaml_reader.h"

namespace kforge {

// getenv, injectable for tests.
using EnvLookup = std::function<const char*(const char*)>;

class ConfigSchema {
 public:
  using Target = std::variant<std::string*, int64_t*, double*, bool*>;
  // Checks a value after loading; returns an error message or "".
  using Check = std::function<std::string()>;

  void Add(std::string key, Target target, std::string help, Check check = nullptr);

  // Reads a config file (a map of maps); absent keys keep their defaults.
  [[nodiscard]] absl::Status LoadFile(const std::string& path);
  [[nodiscard]] absl::Status Load(const YamlNode& root);
  // "server.listen" is overridden by PREFIX_SERVER_LISTEN (e.g. KFORGE_COORDINATOR_SERVER_LISTEN).
  [[nodiscard]] absl::Status ApplyEnv(absl::string_view prefix, const EnvLookup& env);
  // Runs every field's check; the error names the key.
  [[nodiscard]] absl::Status Validate() const;

  // Effective config as YAML, with each field's help as a comment.
  std::string Dump() const;
  // One line per key for --help: "key (env VAR): help [default]".
  std::string Describe(absl::string_view env_prefix) const;

 private:
  struct Field {
    std::string key;
    Target target;
    std::string help;
    Check check;
  };
  absl::Status Set(const Field& f, const std::string& value, const std::string& where);
  absl::Status LoadLevel(const YamlNode& node, const std::string& prefix);
  static std::string ValueString(const Target& t);
  static std::string EnvName(absl::string_view prefix, absl::string_view key);

  std::vector<Field> fields_;
};

// Shared fields every service has.
struct ServerOptions {
  std::string listen = "127.0.0.1:0";          // gRPC host:port
  std::string metrics_listen = "127.0.0.1:0";  // Prometheus /metrics host:port
  std::string log_level = "info";
  TlsServerFiles tls;  // server.tls.*: TLS, and mutual TLS with a client CA
};
void AddServerFields(ConfigSchema& schema, ServerOptions& opts, absl::string_view default_listen,
                     absl::string_view default_metrics);

// host:port with a numeric port in [0, 65535]; "" on success.
std::string CheckHostPort(absl::string_view value);

// Parses --config/--print-config/--help for a service binary, loads the file, applies the
// environment and validates. Returns an exit code when the process should stop now (help, bad
// config: 2, --print-config: 0), nullopt to go on serving.
std::optional<int> LoadServiceConfigFromArgs(int argc, char** argv, absl::string_view name,
                                             absl::string_view description,
                                             absl::string_view env_prefix, ConfigSchema& schema);

}  // namespace kforge
