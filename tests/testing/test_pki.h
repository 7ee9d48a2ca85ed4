// MakeTestPki: a throwaway public-key infrastructure for tests of TLS and mutual TLS, made with
// the openssl command line (EC P-256 keys: fast). Every certificate but the CAs' is a leaf
// (CA:FALSE) signed by its CA; every key is unencrypted PEM.
//
// The bad client certificates carry the good name (CN tenant-a-worker), so a daemon that refuses
// them can only be refusing their expiry or their CA.
//
// Thread safety: thread-safe for distinct directories.
#ifndef KVCACHE_TESTS_TESTING_TEST_PKI_H_
#define KVCACHE_TESTS_TESTING_TEST_PKI_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvcache::testing {

// Names of the two client identities: each certificate's CN and its subjectAltName DNS entry.
inline constexpr char kTestClientAName[] = "tenant-a-worker";
inline constexpr char kTestClientBName[] = "tenant-b-worker";

// Paths of the PEM files MakeTestPki wrote (file names in comments).
struct TestPki {
  std::string ca_cert;  // ca.pem: the trusted CA, CN "kvcache test CA"
  std::string ca_key;   // ca.key
  // server.pem, server.key: subjectAltName DNS:localhost and IP:127.0.0.1, serverAuth.
  std::string server_cert;
  std::string server_key;
  // client_a.pem, client_a.key: kTestClientAName, clientAuth.
  std::string client_a_cert;
  std::string client_a_key;
  // client_b.pem, client_b.key: kTestClientBName, clientAuth.
  std::string client_b_cert;
  std::string client_b_key;
  // expired_client.pem, expired_client.key: kTestClientAName, valid only on 2020-01-01.
  std::string expired_client_cert;
  std::string expired_client_key;
  // other_ca.pem, other_ca.key: a second CA that nothing trusts, CN "kvcache untrusted CA".
  std::string other_ca_cert;
  std::string other_ca_key;
  // untrusted_client.pem, untrusted_client.key: kTestClientAName, signed by the other CA.
  std::string untrusted_client_cert;
  std::string untrusted_client_key;
};

// What a finished openssl command printed (stdout and stderr together) and its exit code.
struct OpensslRun {
  int exit_code = -1;
  std::string output;
};

// Runs `openssl args...` (found on PATH) to its end, within 30 s. An error only when it cannot
// be run or does not finish (DEADLINE_EXCEEDED), or is killed; a nonzero exit is in the result.
absl::StatusOr<OpensslRun> RunOpenssl(const std::vector<std::string>& args);

// Writes the files above (and the openssl configuration and scratch files that made them) into
// `dir`, an existing directory. INTERNAL with openssl's output when an openssl command fails
// (or is not installed).
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_TEST_PKI_H_
