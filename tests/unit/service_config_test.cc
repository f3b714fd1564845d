#include "common/service_config.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/server_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testutil/temp_dir.h"

namespace kforge {
namespace {

using ::kforge::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Msg(const absl::Status& st) { return std::string(st.message()); }

// A service-like option struct covering every field type.
struct Options {
  ServerOptions server;
  std::string store_url = "kforge.db";
  int64_t max_running = 8;
  double timeout_seconds = 60;
  bool gzip = false;
  std::string cache_dir;  // key with a dash
};

void AddFields(ConfigSchema& schema, Options& o) {
  AddServerFields(schema, o.server, "127.0.0.1:7070", "127.0.0.1:9470");
  schema.Add("store.url", &o.store_url, "store location",
             [&o] { return o.store_url.empty() ? std::string("must not be empty") : std::string(); });
  schema.Add("jobs.max_running", &o.max_running, "jobs at once",
             [&o] { return o.max_running >= 1 ? std::string() : std::string("must be >= 1"); });
  schema.Add("sandbox.timeout_seconds", &o.timeout_seconds, "per-candidate limit",
             [&o] { return o.timeout_seconds > 0 ? std::string() : std::string("must be > 0"); });
  schema.Add("sandbox.gzip", &o.gzip, "compress logs");
  schema.Add("compile-cache.dir", &o.cache_dir, "cache folder");
}

// A schema bound to its own options.
struct Config {
  Options o;
  ConfigSchema schema;
  Config() { AddFields(schema, o); }
};

void ExpectSameValues(const Options& a, const Options& b) {
  EXPECT_EQ(a.server.listen, b.server.listen);
  EXPECT_EQ(a.server.metrics_listen, b.server.metrics_listen);
  EXPECT_EQ(a.server.log_level, b.server.log_level);
  EXPECT_EQ(a.store_url, b.store_url);
  EXPECT_EQ(a.max_running, b.max_running);
  EXPECT_EQ(a.timeout_seconds, b.timeout_seconds);
  EXPECT_EQ(a.gzip, b.gzip);
  EXPECT_EQ(a.cache_dir, b.cache_dir);
}

TEST(ServiceConfigTest, Defaults) {
  Config c;
  EXPECT_EQ(c.o.server.listen, "127.0.0.1:7070");
  EXPECT_EQ(c.o.server.metrics_listen, "127.0.0.1:9470");
  EXPECT_EQ(c.o.server.log_level, "info");
  EXPECT_TRUE(c.schema.Validate().ok());
  const std::string dump = c.schema.Dump();
  EXPECT_THAT(dump, HasSubstr("server:\n  listen: \"127.0.0.1:7070\"  # gRPC listen address"));
  EXPECT_THAT(dump, HasSubstr("  log_level: \"info\""));
  EXPECT_THAT(dump, HasSubstr("jobs:\n  max_running: 8  # jobs at once\n"));
  EXPECT_THAT(dump, HasSubstr("sandbox:\n  timeout_seconds: 60  # per-candidate limit\n  gzip: false"));
  EXPECT_THAT(dump, HasSubstr("compile-cache:\n  dir: \"\""));
}

TEST(ServiceConfigTest, EmptyFileKeepsDefaults) {
  TempDir dir;
  Config c;
  ASSERT_TRUE(c.schema.LoadFile(dir.Write("empty.yaml", "")).ok());
  ASSERT_TRUE(c.schema.LoadFile(dir.Write("comment.yaml", "# nothing here\n")).ok());
  ExpectSameValues(c.o, Config().o);
}

TEST(ServiceConfigTest, LoadsFile) {
  TempDir dir;
  const std::string path = dir.Write("svc.yaml",
                                     "server:\n"
                                     "  listen: 127.0.0.1:8080\n"
                                     "  log_level: debug\n"
                                     "store:\n"
                                     "  url: /var/lib/kforge/db.sqlite\n"
                                     "jobs: {max_running: 3}\n"
                                     "sandbox:\n"
                                     "  timeout_seconds: 2.5\n"
                                     "  gzip: true\n"
                                     "compile-cache:\n"
                                     "  dir: \"/tmp/cc\"\n");
  Config c;
  absl::Status st = c.schema.LoadFile(path);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(c.o.server.listen, "127.0.0.1:8080");
  EXPECT_EQ(c.o.server.metrics_listen, "127.0.0.1:9470");  // absent: default kept
  EXPECT_EQ(c.o.server.log_level, "debug");
  EXPECT_EQ(c.o.store_url, "/var/lib/kforge/db.sqlite");
  EXPECT_EQ(c.o.max_running, 3);
  EXPECT_DOUBLE_EQ(c.o.timeout_seconds, 2.5);
  EXPECT_TRUE(c.o.gzip);
  EXPECT_EQ(c.o.cache_dir, "/tmp/cc");
}

TEST(ServiceConfigTest, UnknownKeyNamesFileLineColumnAndKey) {
  TempDir dir;
  const std::string path = dir.Write("svc.yaml",
                                     "server:\n"
                                     "  listen: 127.0.0.1:8080\n"
                                     "  bogus: 1\n");
  Config c;
  absl::Status st = c.schema.LoadFile(path);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), ::testing::ContainsRegex("^" + path + ":3:[0-9]+: server\\.bogus: "));
  EXPECT_THAT(Msg(st), HasSubstr("unknown config key 'server.bogus'"));

  // A misspelt group.
  const std::string top = dir.Write("top.yaml", "server:\n  listen: 1.2.3.4:5\nstroe:\n  url: x\n");
  st = c.schema.LoadFile(top);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("unknown config key 'stroe'"));
  EXPECT_THAT(Msg(st), StartsWith(top + ":"));
}

// The location of an unknown key is the key's own line, also when its value is a nested map that
// starts on the next line.
TEST(ServiceConfigTest, UnknownKeyWithMapValueIsLocatedAtTheKey) {
  TempDir dir;
  const std::string path = dir.Write("svc.yaml",
                                     "server:\n"
                                     "  listen: 127.0.0.1:8080\n"
                                     "stroe:\n"
                                     "  url: x\n");
  Config c;
  absl::Status st = c.schema.LoadFile(path);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), StartsWith(path + ":3:1: stroe: ")) << st;
}

TEST(ServiceConfigTest, WrongTypeNamesFileLineColumnAndKey) {
  TempDir dir;
  struct Case {
    std::string yaml;
    std::string where;  // expected "line:col: key"
    std::string what;
  };
  const std::vector<Case> cases = {
      {"jobs:\n  max_running: many\n", "2:16: jobs.max_running", "expected an integer, got 'many'"},
      {"jobs:\n  max_running: 2.5\n", "2:16: jobs.max_running", "expected an integer"},
      {"sandbox:\n  timeout_seconds: soon\n", "2:20: sandbox.timeout_seconds", "expected a number"},
      {"sandbox:\n  gzip: maybe\n", "2:9: sandbox.gzip", "expected true or false"},
      {"jobs:\n  max_running: [1, 2]\n", "2:16: jobs.max_running", "expected a single value"},
      {"server: 5\n", "1:9: server", "expected a map"},
  };
  for (const auto& tc : cases) {
    const std::string path = dir.Write("svc.yaml", tc.yaml);
    Config c;
    absl::Status st = c.schema.LoadFile(path);
    ASSERT_FALSE(st.ok()) << tc.yaml;
    EXPECT_THAT(Msg(st), StartsWith(absl::StrCat(path, ":", tc.where, ": "))) << tc.yaml;
    EXPECT_THAT(Msg(st), HasSubstr(tc.what)) << tc.yaml;
  }
}

TEST(ServiceConfigTest, NotAMapAndSyntaxErrors) {
  TempDir dir;
  Config c;
  absl::Status st = c.schema.LoadFile(dir.Write("list.yaml", "- a\n- b\n"));
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("must be a map"));

  const std::string bad = dir.Write("bad.yaml", "server:\n  listen: [1, 2\n");
  st = c.schema.LoadFile(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), ::testing::ContainsRegex("^" + bad + ":[0-9]+:[0-9]+: invalid YAML"));

  st = c.schema.LoadFile(dir.path() + "/missing.yaml");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(st), HasSubstr("missing.yaml"));
}

TEST(ServiceConfigTest, LoadRunsChecks) {
  TempDir dir;
  Config c;
  absl::Status st = c.schema.LoadFile(dir.Write("svc.yaml", "jobs:\n  max_running: 0\n"));
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("jobs.max_running: must be >= 1"));

  Config d;
  st = d.schema.LoadFile(dir.Write("svc2.yaml", "server:\n  log_level: chatty\n"));
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("server.log_level"));
  EXPECT_THAT(Msg(st), HasSubstr("chatty"));
}

TEST(ServiceConfigTest, EnvOverrides) {
  Config c;
  std::vector<std::string> asked;
  const std::map<std::string, std::string> env = {
      {"KFORGE_TEST_SERVER_LISTEN", "10.0.0.1:9000"},
      {"KFORGE_TEST_JOBS_MAX_RUNNING", "12"},
      {"KFORGE_TEST_SANDBOX_TIMEOUT_SECONDS", "0.5"},
      {"KFORGE_TEST_SANDBOX_GZIP", "true"},
      {"KFORGE_TEST_COMPILE_CACHE_DIR", "/cc"},
      {"KFORGE_OTHER_SERVER_LISTEN", "9.9.9.9:1"},  // another service's variable
      {"server.listen", "8.8.8.8:1"},
  };
  absl::Status st = c.schema.ApplyEnv("KFORGE_TEST", [&](const char* name) -> const char* {
    asked.emplace_back(name);
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(c.o.server.listen, "10.0.0.1:9000");
  EXPECT_EQ(c.o.max_running, 12);
  EXPECT_DOUBLE_EQ(c.o.timeout_seconds, 0.5);
  EXPECT_TRUE(c.o.gzip);
  EXPECT_EQ(c.o.cache_dir, "/cc");
  EXPECT_EQ(c.o.server.metrics_listen, "127.0.0.1:9470");
  EXPECT_THAT(asked, ::testing::Contains("KFORGE_TEST_SERVER_METRICS_LISTEN"));
  EXPECT_THAT(asked, ::testing::Contains("KFORGE_TEST_STORE_URL"));
}

TEST(ServiceConfigTest, EnvOverridesFile) {
  TempDir dir;
  Config c;
  ASSERT_TRUE(c.schema.LoadFile(dir.Write("svc.yaml", "jobs:\n  max_running: 3\n")).ok());
  ASSERT_TRUE(c.schema
                  .ApplyEnv("KF", [](const char* n) -> const char* {
                    return std::string(n) == "KF_JOBS_MAX_RUNNING" ? "5" : nullptr;
                  })
                  .ok());
  EXPECT_EQ(c.o.max_running, 5);
}

TEST(ServiceConfigTest, BadEnvValueNamesVariableAndKey) {
  Config c;
  absl::Status st = c.schema.ApplyEnv("KF", [](const char* n) -> const char* {
    return std::string(n) == "KF_JOBS_MAX_RUNNING" ? "lots" : nullptr;
  });
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("environment variable KF_JOBS_MAX_RUNNING"));
  EXPECT_THAT(Msg(st), HasSubstr("jobs.max_running"));
  EXPECT_THAT(Msg(st), HasSubstr("'lots'"));

  Config d;
  st = d.schema.ApplyEnv("KF", [](const char* n) -> const char* {
    return std::string(n) == "KF_SERVER_LISTEN" ? "no-port" : nullptr;
  });
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(Msg(st), HasSubstr("server.listen"));
}

TEST(ServiceConfigTest, ValidateNamesTheKey) {
  {
    Config c;
    c.o.max_running = 0;
    absl::Status st = c.schema.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(Msg(st), "jobs.max_running: must be >= 1");
  }
  {
    Config c;
    c.o.server.listen = "localhost";
    absl::Status st = c.schema.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(Msg(st), StartsWith("server.listen: "));
    EXPECT_THAT(Msg(st), HasSubstr("not host:port"));
  }
  {
    Config c;
    c.o.server.metrics_listen = "host:70000";
    absl::Status st = c.schema.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_THAT(Msg(st), StartsWith("server.metrics_listen: "));
  }
  {
    Config c;
    c.o.store_url = "";
    absl::Status st = c.schema.Validate();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(Msg(st), "store.url: must not be empty");
  }
  {
    Config c;
    c.o.timeout_seconds = -1;
    EXPECT_THAT(Msg(c.schema.Validate()), StartsWith("sandbox.timeout_seconds: "));
  }
}

TEST(ServiceConfigTest, CheckHostPort) {
  EXPECT_EQ(CheckHostPort("127.0.0.1:80"), "");
  EXPECT_EQ(CheckHostPort("0.0.0.0:0"), "");
  EXPECT_EQ(CheckHostPort("example.com:65535"), "");
  EXPECT_EQ(CheckHostPort("[::1]:443"), "");
  EXPECT_NE(CheckHostPort("localhost"), "");
  EXPECT_NE(CheckHostPort(":80"), "");
  EXPECT_NE(CheckHostPort("host:"), "");
  EXPECT_NE(CheckHostPort("host:65536"), "");
  EXPECT_NE(CheckHostPort("host:-1"), "");
  EXPECT_NE(CheckHostPort("host:http"), "");
  EXPECT_NE(CheckHostPort(""), "");
  EXPECT_THAT(CheckHostPort("host:99999"), HasSubstr("host:99999"));
}

// Dump prints YAML that loads back into the same values.
TEST(ServiceConfigTest, DumpReloadsToSameValues) {
  Config a;
  a.o.server.listen = "192.168.1.2:7000";
  a.o.server.log_level = "warn";
  a.o.store_url = "postgresql://u:p@db/kforge?sslmode=require";
  a.o.max_running = 123456789012;
  a.o.timeout_seconds = 0.25;
  a.o.gzip = true;
  a.o.cache_dir = "/var/cache/kforge # not a comment";
  ASSERT_TRUE(a.schema.Validate().ok());
  const std::string dump = a.schema.Dump();

  TempDir dir;
  Config b;
  absl::Status st = b.schema.LoadFile(dir.Write("dump.yaml", dump));
  ASSERT_TRUE(st.ok()) << st << "\n" << dump;
  ExpectSameValues(a.o, b.o);
  EXPECT_EQ(b.schema.Dump(), dump);
}

TEST(ServiceConfigTest, DumpReloadsAwkwardStrings) {
  Config a;
  a.o.store_url = "C:\\data\\it's \"quoted\": yes\ttab";
  a.o.cache_dir = "/srv/caf\xc3\xa9/cache";  // UTF-8
  const std::string dump = a.schema.Dump();
  TempDir dir;
  Config b;
  absl::Status st = b.schema.LoadFile(dir.Write("dump.yaml", dump));
  ASSERT_TRUE(st.ok()) << st << "\n" << dump;
  EXPECT_EQ(b.o.store_url, a.o.store_url);
  EXPECT_EQ(b.o.cache_dir, a.o.cache_dir);
}

TEST(ServiceConfigTest, DumpReloadsDoublesExactly) {
  for (double v : {0.1, 1.0 / 3.0, 123456.789, 2.5e10, 1e-7, 12345678.0}) {
    Config a;
    a.o.timeout_seconds = v;
    TempDir dir;
    Config b;
    absl::Status st = b.schema.LoadFile(dir.Write("dump.yaml", a.schema.Dump()));
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(b.o.timeout_seconds, v) << "dumped as: " << a.schema.Dump();
  }
}

TEST(ServiceConfigTest, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1:7071", "127.0.0.2:0", "localhost:80", "[::1]:443", "unix:/run/kforge.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:7071", "[::]:7071", "10.0.0.5:80", "example.com:443", "128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(ServiceConfigTest, Describe) {
  Config c;
  const std::string d = c.schema.Describe("KFORGE_TEST");
  EXPECT_THAT(d, HasSubstr("  server.listen (env KFORGE_TEST_SERVER_LISTEN): gRPC listen address"));
  EXPECT_THAT(d, HasSubstr("[default \"127.0.0.1:7070\"]"));
  EXPECT_THAT(d, HasSubstr("jobs.max_running (env KFORGE_TEST_JOBS_MAX_RUNNING): jobs at once "
                           "[default 8]"));
  EXPECT_THAT(d, HasSubstr("compile-cache.dir (env KFORGE_TEST_COMPILE_CACHE_DIR)"));
  EXPECT_THAT(d, HasSubstr("server.tls.client_ca (env KFORGE_TEST_SERVER_TLS_CLIENT_CA)"));
  // One line per key (the server's 3 + its 3 TLS files, and the test's own).
  EXPECT_EQ(std::count(d.begin(), d.end(), '\n'), 11);
}

void RunArgs(Config& c, std::vector<std::string> args, std::optional<int>* rc) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  *rc = LoadServiceConfigFromArgs(static_cast<int>(argv.size()), argv.data(), "kforge-test",
                                  "test service", "KFORGE_UNIT_TEST_UNSET_PREFIX", c.schema);
}

TEST(ServiceConfigTest, LoadServiceConfigFromArgs) {
  TempDir dir;
  std::optional<int> rc;
  {
    Config c;
    RunArgs(c, {"svc"}, &rc);
    EXPECT_FALSE(rc.has_value());
  }
  {
    Config c;
    RunArgs(c, {"svc", "--config", dir.Write("ok.yaml", "jobs:\n  max_running: 4\n")}, &rc);
    EXPECT_FALSE(rc.has_value());
    EXPECT_EQ(c.o.max_running, 4);
  }
  {
    Config c;
    ::testing::internal::CaptureStderr();
    RunArgs(c, {"svc", "-c", dir.Write("bad.yaml", "jobs:\n  max_runing: 4\n")}, &rc);
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 2);
    EXPECT_THAT(err, HasSubstr("kforge-test: bad config: "));
    EXPECT_THAT(err, HasSubstr("jobs.max_runing"));
  }
  {
    Config c;
    ::testing::internal::CaptureStdout();
    RunArgs(c, {"svc", "--print-config"}, &rc);
    const std::string out = ::testing::internal::GetCapturedStdout();
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 0);
    EXPECT_EQ(out, c.schema.Dump());
  }
  {
    Config c;
    ::testing::internal::CaptureStderr();
    ::testing::internal::CaptureStdout();
    RunArgs(c, {"svc", "--no-such-flag"}, &rc);
    ::testing::internal::GetCapturedStdout();
    ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 2);
  }
}

}  // namespace
}  // namespace kforge
