#include "auth/identity_file.h"

#include <openssl/sha.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "common/tenant.h"

namespace kvcache {
namespace {

inline constexpr size_t kMaxNameBytes = 256;
static_assert(kMaxNameBytes == kMaxTenantBytes, "a tenant named here may be named in any request");
inline constexpr absl::string_view kSha256Prefix = "sha256:";

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("identity file line ", line, ": ", what));
}

absl::Status CheckName(int line, absl::string_view kind, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return LineError(line, absl::StrCat(kind, " must have 1 to ", kMaxNameBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<IdentityFile::Mapping> ParseMapping(int line, absl::string_view tenant,
                                                   absl::string_view role) {
  RETURN_IF_ERROR(CheckName(line, "a tenant", tenant));
  std::optional<Role> parsed = ParseRole(role);
  if (!parsed.has_value()) {
    return LineError(line, absl::StrCat("unknown role '", role, "' (want reader, worker, admin)"));
  }
  return IdentityFile::Mapping{std::string(tenant), *parsed};
}

absl::StatusOr<Sha256Digest> ParseDigest(int line, absl::string_view text) {
  if (!absl::StartsWith(text, kSha256Prefix) ||
      text.size() != kSha256Prefix.size() + 2 * sizeof(Sha256Digest)) {
    return LineError(line, "a token digest is sha256: followed by 64 hex digits");
  }
  text.remove_prefix(kSha256Prefix.size());
  Sha256Digest digest;
  for (size_t i = 0; i < digest.size(); ++i) {
    int byte = 0;
    for (char c : text.substr(2 * i, 2)) {
      const char lower = absl::ascii_tolower(c);
      if (!absl::ascii_isxdigit(c)) {
        return LineError(line, "a token digest is sha256: followed by 64 hex digits");
      }
      byte = byte * 16 + (lower <= '9' ? lower - '0' : lower - 'a' + 10);
    }
    digest[i] = static_cast<uint8_t>(byte);
  }
  return digest;
}

absl::Status ParseLimit(int line, absl::string_view field, TenantLimits* limits) {
  const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
  uint64_t value = 0;
  if (kv.first == "max_put_bytes_in_flight") {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(kv.second);
    if (!bytes.ok()) return LineError(line, bytes.status().message());
    limits->max_put_bytes_in_flight = *bytes;
    return absl::OkStatus();
  }
  if (!absl::SimpleAtoi(kv.second, &value)) {
    return LineError(line, absl::StrCat("'", field, "' is not LIMIT=NUMBER"));
  }
  if (kv.first == "max_referenced_blocks") {
    limits->max_referenced_blocks = value;
  } else if (kv.first == "max_sessions") {
    limits->max_sessions = value;
  } else if (kv.first == "max_open_sequences") {
    limits->max_open_sequences = value;
  } else {
    return LineError(line, absl::StrCat("unknown limit '", kv.first,
                                        "' (want max_referenced_blocks, max_sessions, "
                                        "max_open_sequences, max_put_bytes_in_flight)"));
  }
  return absl::OkStatus();
}

template <typename Key, typename Map>
absl::Status AddUnique(int line, absl::string_view kind, const Key& key, Map& map,
                       typename Map::mapped_type value) {
  if (!map.emplace(key, std::move(value)).second) {
    return LineError(line, absl::StrCat("duplicate ", kind, " ", key));
  }
  return absl::OkStatus();
}

absl::Status ParseLine(int line, const std::vector<absl::string_view>& fields, IdentityFile* file) {
  const absl::string_view kind = fields[0];
  auto want = [&](size_t count, absl::string_view shape) -> absl::Status {
    if (fields.size() == count) return absl::OkStatus();
    return LineError(line, absl::StrCat("want '", shape, "'"));
  };
  if (kind == "tenant") {
    if (fields.size() < 2) return LineError(line, "want 'tenant NAME [LIMIT=N]...'");
    RETURN_IF_ERROR(CheckName(line, "a tenant", fields[1]));
    TenantLimits limits;
    for (size_t i = 2; i < fields.size(); ++i)
      RETURN_IF_ERROR(ParseLimit(line, fields[i], &limits));
    return AddUnique(line, "tenant", std::string(fields[1]), file->limits, limits);
  }
  if (kind == "uid" || kind == "gid") {
    RETURN_IF_ERROR(want(4, absl::StrCat(kind, " ID TENANT ROLE")));
    ASSIGN_OR_RETURN(IdentityFile::Mapping mapping, ParseMapping(line, fields[2], fields[3]));
    if (kind == "uid" && fields[1] == "*") {
      if (file->any_uid.has_value()) return LineError(line, "duplicate uid *");
      file->any_uid = std::move(mapping);
      return absl::OkStatus();
    }
    uint32_t id = 0;
    if (!absl::SimpleAtoi(fields[1], &id)) {
      return LineError(line, absl::StrCat("'", fields[1], "' is not a numeric ", kind));
    }
    if (kind == "uid") return AddUnique(line, "uid", id, file->uids, std::move(mapping));
    return AddUnique(line, "gid", id, file->gids, std::move(mapping));
  }
  if (kind == "token") {
    RETURN_IF_ERROR(want(5, "token NAME sha256:HEX TENANT ROLE"));
    RETURN_IF_ERROR(CheckName(line, "a token name", fields[1]));
    ASSIGN_OR_RETURN(Sha256Digest digest, ParseDigest(line, fields[2]));
    ASSIGN_OR_RETURN(IdentityFile::Mapping mapping, ParseMapping(line, fields[3], fields[4]));
    for (const TokenEntry& token : file->tokens) {
      if (token.name == fields[1])
        return LineError(line, absl::StrCat("duplicate token ", fields[1]));
      if (token.digest == digest) return LineError(line, "the same token is listed twice");
    }
    file->tokens.push_back(
        TokenEntry{std::string(fields[1]), digest, std::move(mapping.tenant), mapping.role});
    return absl::OkStatus();
  }
  if (kind == "subject") {
    RETURN_IF_ERROR(want(4, "subject NAME TENANT ROLE"));
    RETURN_IF_ERROR(CheckName(line, "a subject", fields[1]));
    ASSIGN_OR_RETURN(IdentityFile::Mapping mapping, ParseMapping(line, fields[2], fields[3]));
    return AddUnique(line, "subject", std::string(fields[1]), file->subjects, std::move(mapping));
  }
  return LineError(
      line, absl::StrCat("unknown entry '", kind, "' (want tenant, uid, gid, token, subject)"));
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

std::optional<Role> ParseRole(absl::string_view name) {
  if (name == "reader") return Role::kReader;
  if (name == "worker") return Role::kWorker;
  if (name == "admin") return Role::kAdmin;
  return std::nullopt;
}

Sha256Digest Sha256Of(absl::string_view bytes) {
  Sha256Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data());
  return digest;
}

std::string TokenDigestText(absl::string_view token) {
  const Sha256Digest digest = Sha256Of(token);
  return absl::StrCat(kSha256Prefix,
                      absl::BytesToHexString(absl::string_view(
                          reinterpret_cast<const char*>(digest.data()), digest.size())));
}

absl::StatusOr<IdentityFile> ParseIdentityFile(absl::string_view text) {
  IdentityFile file;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    RETURN_IF_ERROR(ParseLine(line_number, fields, &file));
  }
  return file;
}

absl::StatusOr<IdentityFile> LoadIdentityFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int error = errno;
    const std::string message =
        absl::StrCat("cannot read identity file ", path, ": ", std::strerror(error));
    return error == EACCES ? absl::PermissionDeniedError(message) : absl::NotFoundError(message);
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseIdentityFile(text.str());
}

}  // namespace kvcache
