#include "common/rpc/malloc_tuning.h"

// Before the check below: <cstdlib> brings in <features.h>, which defines __GLIBC__. Without it
// the check was false everywhere and the tuning compiled to nothing.
#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvcache {

bool TuneMallocForBlockStreams() {
#if defined(__GLIBC__)
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;  // glibc's largest on 64-bit
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, 64 << 20) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace kvcache
