// NotBuiltWith: the one answer of every stub that stands in for code this binary was built
// without (CUDA, NCCL). FAILED_PRECONDITION, as for a machine without a device: the call is valid,
// this build cannot serve it, and another build or host can (Abseil's guidance for "the system is
// not in a state required for the operation"). Needs no CUDA header, so stubs include it.
#ifndef KVCACHE_COMMON_CUDA_NOT_BUILT_H_
#define KVCACHE_COMMON_CUDA_NOT_BUILT_H_

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvcache {

// FAILED_PRECONDITION "built without <what>", prefixed with "<context>: " when `context` is not
// empty. `what` names the missing part: "CUDA" or "NCCL".
inline absl::Status NotBuiltWith(absl::string_view what, absl::string_view context = {}) {
  if (context.empty()) return absl::FailedPreconditionError(absl::StrCat("built without ", what));
  return absl::FailedPreconditionError(absl::StrCat(context, ": built without ", what));
}

}  // namespace kvcache

#endif  // KVCACHE_COMMON_CUDA_NOT_BUILT_H_
