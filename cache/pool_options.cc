#include "cache/pool_options.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvcache {

absl::Status ValidatePoolName(absl::string_view name) {
  const bool allowed = std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
  });
  if (!name.empty() && name.size() <= kMaxPoolNameBytes && allowed) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("pool name '", absl::CHexEscape(name.substr(0, kMaxPoolNameBytes)),
                   name.size() > kMaxPoolNameBytes ? "...'" : "'", " (", name.size(),
                   " bytes) must have 1 to ", kMaxPoolNameBytes, " of A-Z a-z 0-9 . _ -"));
}

}  // namespace kvcache
