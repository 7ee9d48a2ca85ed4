#include "client/client_flags.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/read_file.h"
#include "common/status_macros.h"

ABSL_FLAG(bool, tls, false,
          "reach the daemon over TLS (TCP targets only); implied by any other --tls_* flag");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA certificates that verify the daemon's certificate (default: the "
          "system's roots)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate, for a daemon that requires mutual TLS (with "
          "--tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM file of --tls_cert's private key");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name the daemon's certificate must carry, when it differs from the target's host");
ABSL_FLAG(bool, allow_plaintext_token, false,
          "send the bearer token over plaintext TCP to a host other than loopback (a trusted "
          "network only: anyone on the path can read it); without it such a target needs --tls");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token sent with every call (trailing whitespace trimmed); "
          "empty: $KVCACHE_TOKEN if set. The token itself never goes on the command line");

namespace kvcache {
namespace {

// The token from `text`, read from `source` ("--token_file /path", "$KVCACHE_TOKEN"): trimmed
// and checked. Errors name the source, never the token.
absl::StatusOr<std::string> TokenFrom(std::string text, const std::string& source) {
  absl::StripTrailingAsciiWhitespace(&text);
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(source, " holds no token"));
  if (absl::Status valid = CheckBearerToken(text); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
  }
  return text;
}

}  // namespace

absl::StatusOr<ClientOptions> ClientOptionsFromFlags(ClientOptions base) {
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  if (!token_file.empty()) {
    const std::string source = absl::StrCat("--token_file ", token_file);
    absl::StatusOr<std::string> text = ReadFileToString(token_file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file: ", text.status().message()));
    }
    ASSIGN_OR_RETURN(base.bearer_token, TokenFrom(*std::move(text), source));
  } else if (const char* token = std::getenv(kTokenEnvironmentVariable);
             token != nullptr && *token != '\0') {
    ASSIGN_OR_RETURN(base.bearer_token,
                     TokenFrom(token, absl::StrCat("$", kTokenEnvironmentVariable)));
  }

  if (absl::GetFlag(FLAGS_allow_plaintext_token)) base.allow_plaintext_token = true;

  ClientTlsOptions tls{.enabled = absl::GetFlag(FLAGS_tls),
                       .ca_file = absl::GetFlag(FLAGS_tls_ca),
                       .cert_file = absl::GetFlag(FLAGS_tls_cert),
                       .key_file = absl::GetFlag(FLAGS_tls_key),
                       .server_name = absl::GetFlag(FLAGS_tls_server_name)};
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both or neither");
  }
  if (tls.enabled || !tls.ca_file.empty() || !tls.cert_file.empty() || !tls.server_name.empty()) {
    tls.enabled = true;
    base.tls = std::move(tls);
  }
  return base;
}

}  // namespace kvcache
