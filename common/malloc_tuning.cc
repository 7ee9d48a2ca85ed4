#include "common/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvcache {

void TuneMallocForBlockStreams() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest allowed value on 64-bit
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
}

}  // namespace kvcache
