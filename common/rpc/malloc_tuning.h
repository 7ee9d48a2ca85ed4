// Allocator settings for processes that move block bytes over gRPC: the daemon, the workers,
// and any client that streams blocks. Call once from main(), before the first channel.
#ifndef KVCACHE_COMMON_RPC_MALLOC_TUNING_H_
#define KVCACHE_COMMON_RPC_MALLOC_TUNING_H_

namespace kvcache {

// gRPC receives every message into freshly allocated buffers of up to a few MiB. By default
// glibc hands memory above the top of its heap back to the kernel once 128 KiB or more is free
// there, and serves large blocks from fresh mappings, so a block stream page-faulted and zeroed
// every page it received: 14% of a GetBlocks's cycles in perf (exc_page_fault, clear_page, brk).
// This keeps freed memory (up to 64 MiB at the heap's top) for reuse and serves blocks below
// 32 MiB from the heap. Process-wide, hence explicit: a library does not call it on its own.
// Returns whether the settings took: false where the C library is not glibc, or where an
// interposed allocator (a sanitizer's, tcmalloc) ignores mallopt.
bool TuneMallocForBlockStreams();

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_MALLOC_TUNING_H_
