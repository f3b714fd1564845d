// Transport security: TLS and mutual TLS on the gRPC ports (server.tls), and the services'
// bearer tokens (auth.token_file). In-process for the llm-proxy service; the real binaries for the
// coordinator (with the kforge CLI) and the gpu-worker's admin port. Certificates come from the
// openssl command (tests/testutil/test_certs).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/launch.h"
#include "common/param_space.h"
#include "common/problem_loader.h"
#include "common/server_util.h"
#include "common/tls.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kforge/v1/worker.grpc.pb.h"
#include "services/llm-proxy/parametric_mutator.h"
#include "services/llm-proxy/client/remote_mutator.h"
#include "services/llm-proxy/proxy_service.h"
#include "tests/testutil/background_process.h"
#include "tests/testutil/subprocess.h"
#include "tests/testutil/temp_dir.h"
#include "tests/testutil/test_certs.h"

namespace kforge {
namespace {

using ::testing::HasSubstr;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto certs = testing::MakeTestCerts(dir_.path());
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
  }
  std::string Address(int port) const { return absl::StrCat("127.0.0.1:", port); }

  testing::TempDir dir_;
  testing::TestCerts certs_;
};

// A mutation through RemoteMutator with these credentials and token: the status.
absl::Status MutateThrough(int port, const TlsClientFiles& tls, const std::string& token, const v1::Problem& problem) {
  auto creds = ChannelCredentialsFor(tls);
  if (!creds.ok()) return creds.status();
  llm::RemoteMutator remote(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), *creds), 10, token);
  auto space = ParamSpace::Create(problem);
  if (!space.ok()) return space.status();
  v1::Candidate seed = MakeSeedCandidate(problem, *space->DefaultAssignment());
  seed.set_id("seed");
  v1::MutateRequest req;
  *req.mutable_problem() = problem;
  *req.add_parents()->mutable_candidate() = seed;
  req.set_seed(1);
  auto r = remote.Mutate(req, [](const std::string&) { return false; });
  if (!r.ok()) return r.status();
  return r->children().empty() ? absl::InternalError("no child") : absl::OkStatus();
}

TEST_F(TlsTest, TheLlmProxyOverMutualTlsTakesOnlyCertifiedCallersWithItsToken) {
  auto problem = LoadProblem(testing::SourceDir() + "/examples/opencl/matmul");
  ASSERT_TRUE(problem.ok()) << problem.status();
  llm::ParametricMutator parametric;
  llm::LlmProxyServiceImpl service(parametric, {.token = "proxy-secret"});
  auto creds = ServerCredentialsFor({certs_.server_cert, certs_.server_key, certs_.ca});
  ASSERT_TRUE(creds.ok()) << creds.status();
  auto server = StartGrpcServer("127.0.0.1:0", {&service}, kDefaultMaxReceiveBytes, nullptr, *creds);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = server->port;
  const TlsClientFiles good{certs_.ca, certs_.client_cert, certs_.client_key};

  EXPECT_TRUE(MutateThrough(port, good, "proxy-secret", *problem).ok());
  absl::Status st = MutateThrough(port, good, "wrong", *problem);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  st = MutateThrough(port, good, "", *problem);
  EXPECT_TRUE(absl::IsUnauthenticated(st)) << st;
  EXPECT_THAT(st.message(), HasSubstr("bearer token"));
  // The handshake itself fails: no client certificate, one from another CA, or plaintext.
  for (const TlsClientFiles& bad : {TlsClientFiles{certs_.ca, "", ""},
                                    TlsClientFiles{certs_.ca, certs_.rogue_cert, certs_.rogue_key},
                                    TlsClientFiles{}}) {
    st = MutateThrough(port, bad, "proxy-secret", *problem);
    EXPECT_TRUE(absl::IsUnavailable(st)) << bad.cert << ": " << st;
  }
  server->server->Shutdown();
}

TEST_F(TlsTest, BadTlsFilesAreClearErrors) {
  EXPECT_THAT(CheckTlsServerFiles({certs_.server_cert, "", ""}), HasSubstr("go together"));
  EXPECT_THAT(CheckTlsServerFiles({"", "", certs_.ca}), HasSubstr("client_ca needs"));
  EXPECT_THAT(CheckTlsClientFiles({"", certs_.client_cert, certs_.client_key}), HasSubstr("needs tls.ca"));
  auto missing = ServerCredentialsFor({dir_.path() + "/nope.pem", certs_.server_key, ""});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.pem"));
  auto not_pem = ChannelCredentialsFor({dir_.Write("junk.pem", "hello"), "", ""});
  EXPECT_THAT(not_pem.status().message(), HasSubstr("not PEM"));
  EXPECT_TRUE(absl::IsInvalidArgument(ReadTokenFile(dir_.Write("empty-token", " \n")).status()));
  auto token = ReadTokenFile(dir_.Write("token", "  s3cret\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
}

TEST_F(TlsTest, TheCoordinatorServesTheCliOverMutualTls) {
  const std::string kforge = testing::BinaryDir() + "/cli/kforge";
  const std::string db = dir_.path() + "/k.db";
  ASSERT_EQ(testing::RunProgram(kforge, {"admin", "tenant-create", "acme", "--db", db}).exit_code, 0);
  testing::RunResult key = testing::RunProgram(kforge, {"admin", "key-create", "acme", "--db", db});
  ASSERT_EQ(key.exit_code, 0) << key.err;
  const std::string token(absl::StripAsciiWhitespace(key.out));
  const std::string config = dir_.Write(
      "coordinator.yaml",
      absl::StrCat("server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\", log_level: info,\n"
                   "         tls: {cert: \"", certs_.server_cert, "\", key: \"", certs_.server_key,
                   "\", client_ca: \"", certs_.ca, "\"}}\n",
                   "store: {kind: sqlite, url: \"", db, "\"}\nqueue: {kind: memory}\n"));
  testing::BackgroundProcess coordinator(testing::BinaryDir() + "/services/coordinator/kforge-coordinator",
                                         {"--config", config});
  const std::string line = coordinator.WaitForLine("listening ", 60);
  ASSERT_FALSE(line.empty()) << "the coordinator did not start";
  int port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d", &port), 1) << line;
  const std::vector<std::string> env = {"KFORGE_TOKEN=" + token, "KFORGE_SERVER=" + Address(port)};

  testing::RunResult r = testing::RunProgram(
      kforge, {"list", "--tls-ca", certs_.ca, "--tls-cert", certs_.client_cert, "--tls-key", certs_.client_key}, env);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // The same from the environment.
  r = testing::RunProgram(kforge, {"list"},
                          {env[0], env[1], "KFORGE_TLS_CA=" + certs_.ca, "KFORGE_TLS_CERT=" + certs_.client_cert,
                           "KFORGE_TLS_KEY=" + certs_.client_key});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // No client certificate, another CA's, or plaintext: refused, one line, exit 1.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"list", "--tls-ca", certs_.ca},
        std::vector<std::string>{"list", "--tls-ca", certs_.ca, "--tls-cert", certs_.rogue_cert, "--tls-key",
                                 certs_.rogue_key},
        std::vector<std::string>{"list"}}) {
    r = testing::RunProgram(kforge, args, env);
    EXPECT_EQ(r.exit_code, 1) << args.size() << ": " << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator"));
  }
  // A certificate without its key is bad input.
  r = testing::RunProgram(kforge, {"list", "--tls-ca", certs_.ca, "--tls-cert", certs_.client_cert}, env);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--tls-cert and --tls-key go together"));
  // kforge health speaks TLS too.
  r = testing::RunProgram(kforge, {"health", "--server", Address(port), "--tls-ca", certs_.ca, "--tls-cert",
                                   certs_.client_cert, "--tls-key", certs_.client_key});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // Without the CA it cannot verify the coordinator: not serving, exit 1.
  r = testing::RunProgram(kforge, {"health", "--server", Address(port)});
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
}

TEST_F(TlsTest, KforgeRunReachesAProxyServingTlsWithAToken) {
  const std::string token_file = dir_.Write("proxy-token", "proxy-secret\n");
  const std::string config = dir_.Write(
      "proxy.yaml", absl::StrCat("server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\",\n"
                                 "         tls: {cert: \"", certs_.server_cert, "\", key: \"", certs_.server_key,
                                 "\"}}\nauth: {token_file: \"", token_file, "\"}\n"));
  testing::BackgroundProcess proxy(testing::BinaryDir() + "/services/llm-proxy/kforge-llm-proxy", {"--config", config});
  const std::string line = proxy.WaitForLine("listening ", 30);
  ASSERT_FALSE(line.empty()) << "the proxy did not start";
  int port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d", &port), 1) << line;
  const std::vector<std::string> run = {"run", testing::SourceDir() + "/examples/replay/pnpoly", "--budget", "8",
                                        "--llm-proxy", Address(port), "--llm-proxy-ca", certs_.ca, "--db",
                                        dir_.path() + "/run.db"};
  std::vector<std::string> with_token = run;
  with_token.insert(with_token.end(), {"--llm-proxy-token-file", token_file});
  testing::RunResult r = testing::RunProgram(testing::BinaryDir() + "/cli/kforge", with_token);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("8 evaluations"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("falling back")));
  // Without the token the proxy refuses every call; the run carries on with its own parametric
  // mutator and says why.
  std::vector<std::string> without = run;
  without.back() = dir_.path() + "/run2.db";
  r = testing::RunProgram(testing::BinaryDir() + "/cli/kforge", without);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("bearer token"));
}

TEST_F(TlsTest, TheWorkersAdminPortWantsItsToken) {
  const std::string token_file = dir_.Write("worker-token", "worker-secret\n");
  const std::string config = dir_.Write(
      "worker.yaml", absl::StrCat("server: {listen: \"127.0.0.1:0\", metrics_listen: \"127.0.0.1:0\",\n"
                                  "         tls: {cert: \"", certs_.server_cert, "\", key: \"", certs_.server_key,
                                  "\"}}\nworker: {backends: replay}\nauth: {token_file: \"", token_file, "\"}\n"));
  testing::BackgroundProcess worker(testing::BinaryDir() + "/services/gpu-worker/kforge-gpu-worker",
                                    {"--config", config});
  const std::string line = worker.WaitForLine("listening ", 30);
  ASSERT_FALSE(line.empty()) << "the worker did not start";
  int port = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "listening grpc=%d", &port), 1) << line;
  auto creds = ChannelCredentialsFor({certs_.ca, "", ""});
  ASSERT_TRUE(creds.ok());
  auto stub = v1::WorkerAdminService::NewStub(grpc::CreateChannel(Address(port), *creds));
  for (const std::string& token : {std::string(), std::string("guess"), std::string("worker-secret")}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::WorkerInfo info;
    grpc::Status st = stub->GetInfo(&ctx, v1::GetInfoRequest(), &info);
    if (token == "worker-secret") {
      EXPECT_TRUE(st.ok()) << st.error_message();
    } else {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    }
  }
}

}  // namespace
}  // namespace kforge
