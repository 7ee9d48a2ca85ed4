// Pages copied and checksummed on a GPU in one pass: the device side of the engine-facing page
// calls (KvCacheClient::WritePages / ReadPagesInto through a CUDA IPC mapping), which copy each
// page between an engine's buffer and a pool block and need the page's checksum, the XXH3-64
// (seed 0) every data RPC carries (common/block_checksum.h), without moving the bytes to the host.
//
// XXH3 chains its 1 KiB blocks: each block's eight lane sums are folded into the accumulators
// and then scrambled, so a page cannot be split like a copy. But a block's sums are plain
// 64-bit additions of its stripes, independent of every other block; only the scramble chain is
// sequential, eight independent lanes of one add, shift, xor and multiply per block. So every
// block's sums are computed in parallel while its bytes are copied, and one warp then runs the
// short chain (xxh3_blocks.h has the arithmetic, shared with the CPU code that checks it).
//
// Pages must be a multiple of 64 bytes and at least 256 (XXH3's long-input path; pool pages are
// kilobytes), and every pointer 16-byte aligned. Free functions; thread-compatible.
#ifndef KVCACHE_KERNELS_PAGE_CHECKSUM_H_
#define KVCACHE_KERNELS_PAGE_CHECKSUM_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvcache::kernels {

// One page to copy. `destination` null: the page is only checksummed.
struct PageCopy {
  const uint8_t* source = nullptr;
  uint8_t* destination = nullptr;
};

// Whether pages of `page_bytes` can be checksummed here: INVALID_ARGUMENT saying why not.
absl::Status CheckChecksummedPageBytes(uint64_t page_bytes);

// Checks `copies` as the launch needs them, on the host: none null (a null destination allowed),
// every pointer 16-byte aligned (INVALID_ARGUMENT naming the page), and page_bytes as above.
absl::Status ValidatePageCopies(absl::Span<const PageCopy> copies, uint64_t page_bytes);

// CPU reference: for each i, copies page i (when it has a destination) and sets checksums[i] to
// BlockChecksum of its source, computed block by block as the kernel computes it (so a CPU build
// tests the kernel's arithmetic). REQUIRES: checksums.size() == copies.size(). Checks as above.
absl::Status CopyPagesChecksummedCpu(absl::Span<const PageCopy> copies, uint64_t page_bytes,
                                     absl::Span<uint64_t> checksums);

// CUDA: the same over `num_pages` copies in `copies` (memory the device reads: device memory or
// mapped page-locked host memory), checksums into `checksums` (device-writable, num_pages
// entries), enqueued on `stream` (a cudaStream_t as void*; nullptr is the legacy default
// stream), no synchronization. Sources and destinations are device addresses (or any the device
// reaches, through UVA) that must not overlap. The launcher checks what it can see from the host
// (page_bytes, null arrays); the pointers inside `copies` are the caller's to check with
// ValidatePageCopies, as the kernel cannot; a bad one faults at the next synchronization.
absl::Status CopyPagesChecksummedCuda(const PageCopy* copies, uint32_t num_pages,
                                      uint64_t page_bytes, uint64_t* checksums, void* stream);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_PAGE_CHECKSUM_H_
