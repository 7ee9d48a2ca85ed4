// MakeTestPki makes what TLS tests rely on: certificates that verify against the CA for their
// purpose and names, an expired one that fails for its expiry, and one from another CA that
// fails for its issuer. Checked with `openssl verify` and `openssl x509`, not with gRPC.
#include "tests/testing/test_pki.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class TestPkiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestPki> pki = MakeTestPki(dir_.path());
    ASSERT_OK(pki);
    pki_ = *std::move(pki);
  }

  // `openssl verify` of `cert` against the trusted CA, for `purpose` (sslserver, sslclient).
  OpensslRun Verify(const std::string& cert, const std::string& purpose) {
    absl::StatusOr<OpensslRun> run =
        RunOpenssl({"verify", "-CAfile", pki_.ca_cert, "-purpose", purpose, cert});
    EXPECT_OK(run);
    return run.ok() ? *run : OpensslRun{};
  }

  // The text form of `cert`'s subject and subjectAltName.
  std::string Names(const std::string& cert) {
    absl::StatusOr<OpensslRun> run =
        RunOpenssl({"x509", "-in", cert, "-noout", "-subject", "-ext", "subjectAltName"});
    EXPECT_OK(run);
    if (!run.ok()) return "";
    EXPECT_EQ(run->exit_code, 0) << run->output;
    return run->output;
  }

  ScopedTempDir dir_;
  TestPki pki_;
};

TEST_F(TestPkiTest, ServerCertificateVerifiesForLocalhostAndLoopback) {
  const OpensslRun run = Verify(pki_.server_cert, "sslserver");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(": OK"));
  EXPECT_THAT(Names(pki_.server_cert),
              AllOf(HasSubstr("DNS:localhost"), HasSubstr("IP Address:127.0.0.1")));
}

TEST_F(TestPkiTest, ClientCertificatesVerifyAndCarryTheirNames) {
  for (const auto& [cert, name] : std::vector<std::pair<std::string, std::string>>{
           {pki_.client_a_cert, kTestClientAName}, {pki_.client_b_cert, kTestClientBName}}) {
    const OpensslRun run = Verify(cert, "sslclient");
    EXPECT_EQ(run.exit_code, 0) << cert << ": " << run.output;
    EXPECT_THAT(run.output, HasSubstr(": OK"));
    EXPECT_THAT(Names(cert), AllOf(HasSubstr("CN = " + name), HasSubstr("DNS:" + name)));
  }
}

TEST_F(TestPkiTest, ExpiredCertificateFailsForItsExpiry) {
  const OpensslRun run = Verify(pki_.expired_client_cert, "sslclient");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("certificate has expired"));
  EXPECT_THAT(Names(pki_.expired_client_cert), HasSubstr(std::string("CN = ") + kTestClientAName));
}

TEST_F(TestPkiTest, CertificateOfTheOtherCaFailsForItsIssuer) {
  const OpensslRun run = Verify(pki_.untrusted_client_cert, "sslclient");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("unable to get local issuer certificate"));
  // It is a good certificate of its own CA: only the trust is missing.
  absl::StatusOr<OpensslRun> own = RunOpenssl({"verify", "-CAfile", pki_.other_ca_cert, "-purpose",
                                               "sslclient", pki_.untrusted_client_cert});
  ASSERT_OK(own);
  EXPECT_EQ(own->exit_code, 0) << own->output;
}

TEST_F(TestPkiTest, KeysAreEcP256) {
  for (const std::string& key : {pki_.ca_key, pki_.server_key, pki_.client_a_key}) {
    absl::StatusOr<OpensslRun> run = RunOpenssl({"pkey", "-in", key, "-noout", "-text"});
    ASSERT_OK(run);
    EXPECT_EQ(run->exit_code, 0) << run->output;
    EXPECT_THAT(run->output, HasSubstr("P-256")) << key;
  }
}

}  // namespace
}  // namespace kvcache::testing
