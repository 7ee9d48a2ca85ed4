// Status propagation macros with the meaning of Abseil's newer ones, which Debian's Abseil
// (20220623) lacks.
#ifndef KVCACHE_COMMON_STATUS_MACROS_H_
#define KVCACHE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVCACHE_STATUS_CONCAT_INNER_(a, b) a##b
#define KVCACHE_STATUS_CONCAT_(a, b) KVCACHE_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                 \
  do {                                        \
    const ::absl::Status _kv_status = (expr); \
    if (!_kv_status.ok()) return _kv_status;  \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr())`: binds the value or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(KVCACHE_STATUS_CONCAT_(_kv_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // KVCACHE_COMMON_STATUS_MACROS_H_
