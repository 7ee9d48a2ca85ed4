// A memcpy for copies too large to stay in cache: the destination is written with non-temporal
// stores, which go to memory without first reading each line into the cache and without evicting
// what the cache holds. Used where block bytes land for someone else: a large GetBlocksInto's
// buffer, and a host pool's blocks written by a put.
//
// GetBlocksInto copies every piece gRPC received into the caller's buffer: 64 KiB each under
// gRPC 1.51's default reads, at most a message's worth with TuneGrpcForBlockStreams. glibc streams
// only single copies above its non-temporal threshold (3/4 of the last-level cache's per-thread
// share, 240 MiB on our VM, which reports a 320 MiB cache), so pieces that add up to MiBs were
// copied through the cache: each line of the destination read in before it was written, and the
// cache filled with the destination, evicting the received bytes and the pool's. That copy took
// 16% of all samples (daemon and client) in perf of a `data_plane_bench 4 client` run, almost as
// much as the kernel's receive copy.
#ifndef KVCACHE_COMMON_STREAMING_COPY_H_
#define KVCACHE_COMMON_STREAMING_COPY_H_

#include <cstddef>

namespace kvcache {

// Copies from a total this large on, a copy's destination will not be in cache when it is next
// read, on the CPUs we run on (a private L2 of 1-2 MiB per core).
inline constexpr size_t kStreamingCopyMinTotalBytes = 4 << 20;

// memcpy's contract (the ranges do not overlap). On x86-64 the destination's bytes are written
// with SSE2 non-temporal stores and fenced before returning, so other threads see them in order
// like any other write; elsewhere this is memcpy.
void StreamingCopy(void* destination, const void* source, size_t size);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_STREAMING_COPY_H_
