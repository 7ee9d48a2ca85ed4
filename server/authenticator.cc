#include "server/authenticator.h"

#include <grpcpp/security/auth_context.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tenant.h"

namespace kvcache {
namespace {

constexpr absl::string_view kBearerScheme = "bearer ";

std::vector<std::string> CertificateNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& value : auth.FindPropertyValues(property)) {
      names.emplace_back(value.data(), value.size());
    }
  }
  return names;
}

}  // namespace

absl::StatusOr<Identity> Authenticator::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    const absl::string_view value(it->second.data(), it->second.size());
    if (value.size() <= kBearerScheme.size() || !absl::StartsWithIgnoreCase(value, kBearerScheme)) {
      return absl::UnauthenticatedError("authorization metadata is not 'Bearer <token>'");
    }
    return identities_->ForToken(value.substr(kBearerScheme.size()));
  }
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    return identities_->ForCertificate(CertificateNames(*auth));
  }
  const std::string peer = context.peer();
  if (unix_listener_ != nullptr) {
    if (std::optional<ucred> unix_peer = unix_listener_->PeerOf(peer)) {
      return identities_->ForUnixPeer(unix_peer->uid, unix_peer->gid);
    }
  }
  return identities_->ForAnonymousPeer(peer);
}

absl::Status Permit(const Identity& caller, Role needed, absl::string_view method) {
  if (caller.role >= needed) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(caller.principal, " has role ",
                                                  RoleName(caller.role), "; ", method, " needs ",
                                                  RoleName(needed)));
}

absl::StatusOr<std::string> TenantFor(const Identity& caller, absl::string_view requested) {
  if (requested.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant has ", requested.size(), " bytes; at most ", kMaxTenantBytes));
  }
  if (requested.empty() || requested == caller.tenant) return caller.tenant;
  if (caller.role == Role::kAdmin) return std::string(requested);
  return absl::PermissionDeniedError(absl::StrCat(
      caller.principal, " acts in tenant '", caller.tenant, "', not in tenant '", requested, "'"));
}

}  // namespace kvcache
