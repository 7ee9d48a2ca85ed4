#include "tests/testing/test_pki.h"

#include <sys/wait.h>

#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "tests/testing/subprocess.h"

namespace kvcache::testing {
namespace {

constexpr absl::Duration kOpensslTimeout = absl::Seconds(30);
// Every certificate's validity but the expired one's: long enough for any test run.
constexpr char kValidDays[] = "3650";

// Sections for `openssl req`, `openssl x509 -extfile` and `openssl ca`. The [ca] database lives
// in `dir` (openssl ca records what it signed).
std::string OpensslConfig(const std::string& dir) {
  std::string config = absl::StrCat(R"([req]
distinguished_name = dn
[dn]
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
authorityKeyIdentifier = keyid
[ca]
default_ca = test_ca
[test_ca]
database = )",
                                    dir, R"(/ca_index.txt
new_certs_dir = )",
                                    dir, R"(
serial = )",
                                    dir, R"(/ca_serial
default_md = sha256
policy = any_name
unique_subject = no
[any_name]
commonName = supplied
)");
  for (const char* name : {kTestClientAName, kTestClientBName}) {
    absl::StrAppend(&config, "[client_", name, R"(]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:)",
                    name, R"(
authorityKeyIdentifier = keyid
)");
  }
  return config;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Runs openssl and requires it to exit 0.
absl::Status Openssl(const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(const OpensslRun run, RunOpenssl(args));
  if (run.exit_code != 0) {
    return absl::InternalError(absl::StrCat("openssl ", absl::StrJoin(args, " "), " exited ",
                                            run.exit_code, ":\n", run.output));
  }
  return absl::OkStatus();
}

// A new EC P-256 key at `key` and a signing request for CN=`name` at `csr`.
absl::Status NewKeyAndRequest(const std::string& config, const std::string& name,
                              const std::string& key, const std::string& csr) {
  return Openssl({"req", "-new", "-config", config, "-newkey", "ec", "-pkeyopt",
                  "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr, "-subj",
                  "/CN=" + name});
}

// A self-signed CA certificate and its key.
absl::Status NewCa(const std::string& config, const std::string& name, const std::string& cert,
                   const std::string& key) {
  return Openssl({"req",
                  "-x509",
                  "-new",
                  "-config",
                  config,
                  "-extensions",
                  "ca_ext",
                  "-newkey",
                  "ec",
                  "-pkeyopt",
                  "ec_paramgen_curve:P-256",
                  "-nodes",
                  "-keyout",
                  key,
                  "-out",
                  cert,
                  "-days",
                  kValidDays,
                  "-sha256",
                  "-subj",
                  "/CN=" + name});
}

// A leaf for CN=`name` signed by the CA (`ca_cert`, `ca_key`) with the extensions of
// `extensions` (a section of `config`).
absl::Status NewLeaf(const std::string& config, const std::string& extensions,
                     const std::string& name, const std::string& ca_cert, const std::string& ca_key,
                     int serial, const std::string& cert, const std::string& key) {
  const std::string csr = cert + ".csr";
  RETURN_IF_ERROR(NewKeyAndRequest(config, name, key, csr));
  return Openssl({"x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-set_serial",
                  absl::StrCat(serial), "-days", kValidDays, "-sha256", "-extfile", config,
                  "-extensions", extensions, "-out", cert});
}

}  // namespace

absl::StatusOr<OpensslRun> RunOpenssl(const std::vector<std::string>& args) {
  // The shell finds openssl on PATH (Subprocess takes a path) and folds its stderr into stdout.
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec openssl \"$@\" 2>&1", "openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  ASSIGN_OR_RETURN(Subprocess child, Subprocess::Start(argv));
  OpensslRun run;
  while (true) {
    absl::StatusOr<std::string> line = child.ReadLine(kOpensslTimeout);
    if (absl::IsOutOfRange(line.status())) break;  // end of output
    RETURN_IF_ERROR(line.status());
    absl::StrAppend(&run.output, *line, "\n");
  }
  ASSIGN_OR_RETURN(const int wait_status, child.Wait(kOpensslTimeout));
  if (!WIFEXITED(wait_status)) {
    return absl::InternalError(absl::StrCat("openssl ", absl::StrJoin(args, " "), ": ",
                                            DescribeWaitStatus(wait_status), "\n", run.output));
  }
  run.exit_code = WEXITSTATUS(wait_status);
  return run;
}

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  const auto path = [&dir](const char* name) { return absl::StrCat(dir, "/", name); };
  TestPki pki{.ca_cert = path("ca.pem"),
              .ca_key = path("ca.key"),
              .server_cert = path("server.pem"),
              .server_key = path("server.key"),
              .client_a_cert = path("client_a.pem"),
              .client_a_key = path("client_a.key"),
              .client_b_cert = path("client_b.pem"),
              .client_b_key = path("client_b.key"),
              .expired_client_cert = path("expired_client.pem"),
              .expired_client_key = path("expired_client.key"),
              .other_ca_cert = path("other_ca.pem"),
              .other_ca_key = path("other_ca.key"),
              .untrusted_client_cert = path("untrusted_client.pem"),
              .untrusted_client_key = path("untrusted_client.key")};
  const std::string config = path("openssl.cnf");
  RETURN_IF_ERROR(WriteTextFile(config, OpensslConfig(dir)));
  const std::string client_a_ext = absl::StrCat("client_", kTestClientAName);
  const std::string client_b_ext = absl::StrCat("client_", kTestClientBName);

  RETURN_IF_ERROR(NewCa(config, "kvcache test CA", pki.ca_cert, pki.ca_key));
  RETURN_IF_ERROR(NewLeaf(config, "server_ext", "localhost", pki.ca_cert, pki.ca_key, 2,
                          pki.server_cert, pki.server_key));
  RETURN_IF_ERROR(NewLeaf(config, client_a_ext, kTestClientAName, pki.ca_cert, pki.ca_key, 3,
                          pki.client_a_cert, pki.client_a_key));
  RETURN_IF_ERROR(NewLeaf(config, client_b_ext, kTestClientBName, pki.ca_cert, pki.ca_key, 4,
                          pki.client_b_cert, pki.client_b_key));

  // Expired: openssl 3.0's x509 cannot backdate a certificate (no -not_before), `openssl ca`
  // can (-startdate, -enddate), from its database.
  RETURN_IF_ERROR(WriteTextFile(path("ca_index.txt"), ""));
  RETURN_IF_ERROR(WriteTextFile(path("ca_serial"), "1000\n"));
  const std::string expired_csr = pki.expired_client_cert + ".csr";
  RETURN_IF_ERROR(NewKeyAndRequest(config, kTestClientAName, pki.expired_client_key, expired_csr));
  RETURN_IF_ERROR(
      Openssl({"ca", "-batch", "-config", config, "-cert", pki.ca_cert, "-keyfile", pki.ca_key,
               "-in", expired_csr, "-out", pki.expired_client_cert, "-extensions", client_a_ext,
               "-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-notext"}));

  RETURN_IF_ERROR(NewCa(config, "kvcache untrusted CA", pki.other_ca_cert, pki.other_ca_key));
  RETURN_IF_ERROR(NewLeaf(config, client_a_ext, kTestClientAName, pki.other_ca_cert,
                          pki.other_ca_key, 2, pki.untrusted_client_cert,
                          pki.untrusted_client_key));
  return pki;
}

}  // namespace kvcache::testing
