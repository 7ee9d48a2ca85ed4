// The command-line flags every kvcache tool (kvcache-demo, kvcache-worker, kvcache-pd) shares to
// say how it reaches a daemon with an identity: TLS (--tls, --tls_ca, --tls_cert, --tls_key,
// --tls_server_name) and a bearer token (--token_file, or $KVCACHE_TOKEN; over plaintext TCP to
// a host other than loopback only with --allow_plaintext_token). The token itself never
// goes on the command line, where `ps` would show it to every user of the machine.
//
// A binary gets these flags by calling ClientOptionsFromFlags (the linker keeps this file's
// flags only then); --help lists them (common/command_line.h).
//
// Thread safety: call ClientOptionsFromFlags after ParseCommandLineFlags; it reads the flags,
// the environment and the token file, and is safe to call from any thread after that.
#ifndef KVCACHE_CLIENT_CLIENT_FLAGS_H_
#define KVCACHE_CLIENT_CLIENT_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "client/kv_cache_client.h"

ABSL_DECLARE_FLAG(bool, tls);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(bool, allow_plaintext_token);

namespace kvcache {

// The environment variable that holds the bearer token when --token_file is empty.
inline constexpr char kTokenEnvironmentVariable[] = "KVCACHE_TOKEN";

// `base` with the TLS and bearer-token settings the flags give:
// - TLS is on with --tls or any other --tls_* flag; the files are PEM paths, read by Connect.
// - The token is --token_file's contents, else $KVCACHE_TOKEN's value when set and not empty,
//   trailing whitespace (a final newline) trimmed in both cases.
// - --allow_plaintext_token sets allow_plaintext_token (Connect checks the target).
// Settings the flags leave unset keep `base`'s. INVALID_ARGUMENT, naming the file or variable
// but never the token, when the token file cannot be read, the token is empty, or it holds
// characters a header cannot carry (only visible ASCII, no spaces); also for --tls_cert
// without --tls_key or the reverse.
absl::StatusOr<ClientOptions> ClientOptionsFromFlags(ClientOptions base = {});

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_CLIENT_FLAGS_H_
