#include "common/version.h"

#include "absl/strings/str_cat.h"
#include "common/version_generated.h"  // configure_file'd from common/version_generated.h.in

namespace kvcache {

absl::string_view Version() { return KVCACHE_VERSION_STRING; }

absl::string_view Revision() { return KVCACHE_REVISION_STRING; }

std::string VersionLine(absl::string_view program) {
  if (Revision().empty()) return absl::StrCat(program, " ", Version());
  return absl::StrCat(program, " ", Version(), " (", Revision(), ")");
}

}  // namespace kvcache
