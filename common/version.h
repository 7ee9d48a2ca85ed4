// The kvcache release every binary reports: the one version in CMake's project(VERSION), and the
// source revision it was built from (`git describe` at configure time; empty outside a git
// checkout). `NAME --version` prints VersionLine(NAME); /metrics exports kvcache_build_info.
//
// Thread safety: functions of constants only.
#ifndef KVCACHE_COMMON_VERSION_H_
#define KVCACHE_COMMON_VERSION_H_

#include <string>

#include "absl/strings/string_view.h"

namespace kvcache {

// "0.1.0": MAJOR.MINOR.PATCH, as project(kvcache VERSION ...) says.
absl::string_view Version();
// "a3b2f13", "a3b2f13-dirty", "v0.1.0-3-ga3b2f13"; "" when built outside a git checkout.
absl::string_view Revision();
// "kvcache-manager 0.1.0 (a3b2f13)", or "kvcache-manager 0.1.0" without a revision.
std::string VersionLine(absl::string_view program);
// The same line for another build's version and revision (a daemon's, as it reports them).
std::string VersionLine(absl::string_view program, absl::string_view version,
                        absl::string_view revision);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_VERSION_H_
