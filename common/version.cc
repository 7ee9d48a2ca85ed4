#include "common/version.h"

#include "absl/strings/str_cat.h"
#include "common/version_generated.h"  // configure_file'd from common/version_generated.h.in

namespace kvcache {

absl::string_view Version() { return KVCACHE_VERSION_STRING; }

absl::string_view Revision() { return KVCACHE_REVISION_STRING; }

std::string VersionLine(absl::string_view program) {
  return VersionLine(program, Version(), Revision());
}

std::string VersionLine(absl::string_view program, absl::string_view version,
                        absl::string_view revision) {
  if (revision.empty()) return absl::StrCat(program, " ", version);
  return absl::StrCat(program, " ", version, " (", revision, ")");
}

}  // namespace kvcache
