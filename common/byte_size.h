// ParseByteSize: a byte count as an operator writes it on a command line or in a file ("64",
// "2k", "3MiB", "1G"). Used by the pool spec, the daemon's flags and the identity file.
#ifndef KVCACHE_COMMON_BYTE_SIZE_H_
#define KVCACHE_COMMON_BYTE_SIZE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache {

// A whole number with an optional K/M/G/T (or KiB/MiB/GiB/TiB) suffix, any case, binary multiples;
// surrounding whitespace is ignored. INVALID_ARGUMENT if it is not one or overflows 64 bits.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_BYTE_SIZE_H_
