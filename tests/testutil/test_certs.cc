#include "tests/testutil/test_certs.h"

#include "absl/strings/str_cat.h"
#include "tests/testutil/subprocess.h"

namespace kforge::testing {

namespace {

absl::Status OpenSsl(const std::vector<std::string>& args) {
  RunResult r = RunProgram("/usr/bin/openssl", args);
  if (r.exit_code != 0) return absl::InternalError(absl::StrCat("openssl ", args.front(), ": ", r.err));
  return absl::OkStatus();
}

// A key and a certificate: self-signed when `ca` is empty, else signed by ca / ca_key.
absl::Status MakeCert(const std::string& dir, const std::string& name, const std::string& subject,
                      const std::string& san, const std::string& ca, const std::string& ca_key, bool is_ca) {
  const std::string key = absl::StrCat(dir, "/", name, ".key");
  const std::string cert = absl::StrCat(dir, "/", name, ".pem");
  if (absl::Status st = OpenSsl({"genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key});
      !st.ok()) {
    return st;
  }
  if (ca.empty()) {
    return OpenSsl({"req", "-x509", "-new", "-key", key, "-out", cert, "-days", "2", "-subj", subject, "-addext",
                    is_ca ? "basicConstraints=critical,CA:TRUE" : "basicConstraints=CA:FALSE"});
  }
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  std::vector<std::string> req = {"req", "-new", "-key", key, "-out", csr, "-subj", subject};
  if (!san.empty()) {
    req.push_back("-addext");
    req.push_back(absl::StrCat("subjectAltName=", san));
  }
  if (absl::Status st = OpenSsl(req); !st.ok()) return st;
  return OpenSsl({"x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days",
                  "2", "-copy_extensions", "copy"});
}

}  // namespace

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir) {
  const auto p = [&](const std::string& f) { return absl::StrCat(dir, "/", f); };
  for (const auto& [name, subject, san, ca, is_ca] :
       std::vector<std::tuple<std::string, std::string, std::string, std::string, bool>>{
           {"ca", "/CN=kforge test CA", "", "", true},
           {"server", "/CN=localhost", "IP:127.0.0.1,DNS:localhost", "ca", false},
           {"client", "/CN=kforge-coordinator", "", "ca", false},
           {"rogue-ca", "/CN=someone else's CA", "", "", true},
           {"rogue", "/CN=intruder", "", "rogue-ca", false}}) {
    if (absl::Status st = MakeCert(dir, name, subject, san, ca.empty() ? "" : p(ca + ".pem"),
                                   ca.empty() ? "" : p(ca + ".key"), is_ca);
        !st.ok()) {
      return st;
    }
  }
  return TestCerts{p("ca.pem"), p("server.pem"), p("server.key"), p("client.pem"), p("client.key"),
                   p("rogue.pem"), p("rogue.key")};
}

}  // namespace kforge::testing
