// CUDA kernels for the worker's hot ops (model/qwen3_moe.cc): RMSNorm, rotate-half RoPE, the KV
// write into a block-major paged pool, causal GQA paged attention, MoE routing, and one SwiGLU
// expert. Each has a CPU reference with the same semantics in the worker model:
//
//   RmsNormCuda         worker::RmsNorm, once per row
//   RopeCuda            worker::RopeInverseFrequencies + RopeCosSin + ApplyRope, per token and head
//   WriteKvCuda         worker::PagedKv::WriteK / WriteV (worker::EncodeKv), byte for byte
//   PagedAttentionCuda  the attention loop of Qwen3MoeModel::Attention over PagedKv::ReadRange
//   MoeRouteCuda        worker::Softmax + worker::TopK (+ Qwen3MoeModel::Moe's renormalization)
//   ExpertSwiGluCuda    worker::MatVec (gate, up) + worker::SwiGlu + worker::MatVec (down)
//   LinearCuda          worker::MatVec per row (+ Qwen3MoeModel's residual add `x[i] += y[i]`)
//   GatherRowsCuda      the embedding row copy of Qwen3MoeModel::Forward
//   MoeCombineCuda      the weighted expert sum and residual add of Qwen3MoeModel::Moe
//
// (tests/kernels/worker_kernels_gpu_test.cc compares each kernel against those functions.)
// WriteKvCuda, LinearCuda, GatherRowsCuda and MoeCombineCuda are bit-exact with the CPU path;
// RmsNorm, RoPE and routing use the CPU's evaluation order and precision where it matters and
// agree in practice to the last bit or within an ulp; attention and the expert matvecs sum in
// another order and agree to a tolerance, not bit for bit.
//
// Batch invariance: every kernel computes a row (token) from that row's inputs alone, in an order
// that depends only on the problem's widths, never on the number of rows or on a row's index.
// So a token's results are bit-identical whether it is computed alone or among others — what
// makes prefix reuse and chunked prefill bit-exact on the GPU (model/cuda/qwen3_moe_cuda.h). No
// kernel uses atomics.
//
// Conventions (as kernels/block_copy.h): pointers are device pointers; `stream` is a cudaStream_t
// passed as void* (nullptr = the legacy default stream) so that code built without the CUDA
// headers can include this file. A launcher checks its host-visible arguments, enqueues its
// kernel(s) on `stream` and returns at once: no hidden synchronization, no allocation.
//   INVALID_ARGUMENT  a bad size, layout or null pointer (checked before anything is enqueued);
//   a CUDA launch error as common/cuda/cuda_status.h maps it (FAILED_PRECONDITION with no
//                     usable device or driver, INTERNAL otherwise), with cudaGetErrorString's
//                     text (cudaGetLastError: a sticky error from an earlier asynchronous fault
//                     shows up here too);
//   OK                for a zero token / row count, without launching (null pointers allowed then).
// Values that live on the device (slots, positions, block ids) cannot be checked without a sync:
// the kernels never access memory out of bounds for any such value and document what they do
// instead; callers that want strict checks run ValidateSlotMapping / ValidatePagedAttentionInputs
// on the host copies before uploading. A kernel fault surfaces on the next synchronizing call.
// Outputs must not alias inputs unless a function says so.
//
// Built without CUDA (KVCACHE_WITH_CUDA off), every *Cuda function makes the same argument checks
// and, where it would launch, returns FAILED_PRECONDITION("built without CUDA"); the Validate*
// functions work in every build.
// BuiltWithCuda() and CudaDeviceAvailable() are declared in common/cuda/cuda_device.h.
#ifndef KVCACHE_KERNELS_WORKER_KERNELS_H_
#define KVCACHE_KERNELS_WORKER_KERNELS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "kernels/block_copy.h"

namespace kvcache::kernels {

// The documented "skip this token" slot in a slot mapping.
inline constexpr int64_t kSkipSlot = -1;

// Limits of the CUDA kernels (shared-memory and register budgets); larger values are
// INVALID_ARGUMENT.
inline constexpr uint32_t kMaxCudaHeadDim = 1024;  // RopeCuda, PagedAttentionCuda
inline constexpr uint32_t kMaxCudaExperts = 4096;  // MoeRouteCuda

// --- Host-side checks of device-resident indices (host memory; every build). ---

// slot_mapping: [num_tokens] of block_id * block_size + slot_in_block, or kSkipSlot.
// OUT_OF_RANGE for a slot other than kSkipSlot outside [0, num_pool_blocks * block_size);
// INVALID_ARGUMENT when a non-skip slot repeats (two tokens would race for one slot) or
// block_size is 0.
absl::Status ValidateSlotMapping(absl::Span<const int64_t> slot_mapping, uint64_t num_pool_blocks,
                                 uint32_t block_size);

// The index arguments of PagedAttentionCuda, on the host. block_tables: [num_seqs,
// max_blocks_per_seq]; positions: [num_tokens]; seq_ids: [num_tokens], or empty for "every token
// is in sequence 0". INVALID_ARGUMENT for mismatched sizes, a zero num_seqs / max_blocks_per_seq /
// block_size, or a seq id >= num_seqs; OUT_OF_RANGE when a position is past its sequence's
// capacity (max_blocks_per_seq * block_size) or a block-table entry that a token reads (entries
// 0 .. position / block_size of its sequence) is >= num_pool_blocks. Entries no token reads are
// not checked (padding).
absl::Status ValidatePagedAttentionInputs(absl::Span<const uint32_t> positions,
                                          absl::Span<const uint32_t> seq_ids,
                                          absl::Span<const uint32_t> block_tables,
                                          uint32_t num_seqs, uint32_t max_blocks_per_seq,
                                          uint32_t block_size, uint64_t num_pool_blocks);

// --- CUDA launchers (device pointers, explicit stream). ---

// x, out: [rows, dim]; weight: [dim].
// out[r, i] = weight[i] * (x[r, i] * inv_rms(r)), inv_rms = 1 / sqrt(mean(x[r, :]^2) + eps) with
// the sum of squares in double, as worker::RmsNorm. `out` may equal `x` (in place; the per-head
// q_norm / k_norm use rows = tokens * heads, dim = head_dim). dim must be > 0.
absl::Status RmsNormCuda(const float* x, const float* weight, float eps, uint32_t rows,
                         uint32_t dim, float* out, void* stream);

// x: [num_tokens, num_heads, head_dim], rotated in place; positions: [num_tokens] uint32.
// Rotate-half RoPE (Hugging Face): with half = head_dim / 2, inv_freq[i] = theta^(-2i / head_dim)
// and angle = position * inv_freq[i] in double, cos / sin rounded to float,
//   x'[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   x'[i + half] = x[i + half] * cos[i] + x[i] * sin[i]
// in float without FMA contraction, as worker::ApplyRope. Serves q (num_heads = q heads) and k
// (num_heads = kv heads). head_dim must be even, in [2, kMaxCudaHeadDim]; theta > 0 and finite.
absl::Status RopeCuda(float* x, const uint32_t* positions, uint32_t num_tokens, uint32_t num_heads,
                      uint32_t head_dim, double theta, void* stream);

// RopeCuda on the first rotary_dim dims of each head only (Qwen3-Next's partial_rotary_factor):
// inv_freq[i] = theta^(-2i / rotary_dim), pairs (i, i + rotary_dim / 2) for i < rotary_dim / 2,
// the other dims untouched; as worker::RopeInverseFrequencies(rotary_dim) + ApplyRope(head,
// rotary_dim). rotary_dim must be even, in [2, head_dim]. RopeCuda is rotary_dim = head_dim.
absl::Status PartialRopeCuda(float* x, const uint32_t* positions, uint32_t num_tokens,
                             uint32_t num_heads, uint32_t head_dim, uint32_t rotary_dim,
                             double theta, void* stream);

// k, v: [num_tokens, num_kv_heads, head_dim] float; slot_mapping: [num_tokens] int64;
// pool: [num_pool_blocks, page_stride_bytes] bytes, block-major as common/pool_layout.h: block b's
// KV is layout.BlockBytes() bytes at pool + b * page_stride_bytes, where page_stride_bytes is 0
// for layout.BlockBytes() (a pool of KV alone) or, for a pool whose pages hold more than the KV
// (common/page_parts.h: the KV part first, then e.g. a recurrent state), the page's bytes; the
// bytes past the KV are never touched. For each token t with slot s = slot_mapping[t] in [0,
// num_pool_blocks * block_size): K and V of `layer` go to block s / block_size, token slot s %
// block_size, converted to layout.dtype with worker::EncodeKv's rounding (fp32 copy; bf16, fp16,
// fp8 E4M3 round to nearest even; NaN stays NaN; fp16 overflows to inf, fp8 saturates to +-448):
// the bytes are those PagedKv::WriteK / WriteV would write. kSkipSlot (-1) skips the token; so does
// any other slot outside the pool (documented, memory-safe; ValidateSlotMapping rejects it on the
// host). Slots must not repeat (repeats race). Every dtype of common/pool_layout.h is supported.
// INVALID_ARGUMENT for a layout that fails PoolLayout::Validate, layer >= num_layers,
// num_pool_blocks == 0, a page stride other than 0 below layout.BlockBytes() or not a multiple of
// the element size, or a pool size that overflows uint64.
absl::Status WriteKvCuda(const float* k, const float* v, const int64_t* slot_mapping,
                         uint32_t num_tokens, uint32_t layer, const PoolLayout& layout,
                         uint64_t num_pool_blocks, uint8_t* pool, void* stream,
                         uint64_t page_stride_bytes = 0);

// q, out: [num_tokens, num_q_heads, head_dim] float (head_dim = layout.head_dim);
// positions: [num_tokens] uint32; seq_ids: [num_tokens] uint32 or nullptr (every token in
// sequence 0); block_tables: [num_seqs, max_blocks_per_seq] uint32 block ids; pool as WriteKvCuda.
// For token t of sequence s = seq_ids[t] at position p = positions[t], head h: causal attention
// over the sequence's positions 0..p (context length p + 1, the token's own K/V included, so
// WriteKvCuda for it must be enqueued first) of `layer`, position j read from block
// block_tables[s, j / block_size], slot j % block_size and decoded exactly from the pool dtype:
//   score_j = dot(q[t, h], K_j[h / group]) * scale, scale = float(1 / sqrt(double(head_dim))),
//   out[t, h] = sum_j softmax(score)_j * V_j[h / group],  group = num_q_heads / num_kv_heads,
// softmax in fp32 (online over tiles of positions; see the .cu). Device-side index errors never
// read out of bounds: a position whose block id is >= num_pool_blocks is left out of the softmax;
// a token whose seq id >= num_seqs or whose position is past max_blocks_per_seq * block_size gets
// NaN in every output element (as does one with no position left). INVALID_ARGUMENT for a bad
// layout or page stride (as WriteKvCuda), layer >= num_layers, num_q_heads == 0 or not a multiple
// of num_kv_heads, head_dim > kMaxCudaHeadDim, num_seqs / max_blocks_per_seq / num_pool_blocks
// == 0, or a pool size that overflows uint64.
absl::Status PagedAttentionCuda(const float* q, const uint32_t* positions, const uint32_t* seq_ids,
                                const uint32_t* block_tables, uint32_t num_tokens,
                                uint32_t num_q_heads, uint32_t num_seqs,
                                uint32_t max_blocks_per_seq, uint32_t layer,
                                const PoolLayout& layout, uint64_t num_pool_blocks,
                                const uint8_t* pool, float* out, void* stream,
                                uint64_t page_stride_bytes = 0);

// logits: [num_tokens, num_experts] router logits; topk_ids: [num_tokens, top_k] uint32;
// topk_weights: [num_tokens, top_k] float.
// Per token: probs = softmax(logits) as worker::Softmax (max, then exp(x - max) summed in index
// order, then divided); the top_k experts by prob as worker::TopK: largest first, equal probs by
// lowest index, NaN last; weight = prob, or prob / (sum of the selected probs, summed in that
// order) when norm_topk_prob (Qwen3MoeModel::Moe). Ids are in TopK order, not sorted by index.
// INVALID_ARGUMENT unless 1 <= top_k <= num_experts <= kMaxCudaExperts.
absl::Status MoeRouteCuda(const float* logits, uint32_t num_tokens, uint32_t num_experts,
                          uint32_t top_k, bool norm_topk_prob, uint32_t* topk_ids,
                          float* topk_weights, void* stream);

// x: [rows, hidden]; gate_proj, up_proj: [intermediate, hidden]; down_proj: [hidden,
// intermediate] (Linear weights [out, in]); workspace: [rows, intermediate] scratch the caller
// owns (overwritten); out: [rows, hidden].
// For one expert: workspace[r] = Silu(gate_proj x[r]) * up_proj x[r]; out[r] = down_proj
// workspace[r], Silu(g) = g / (1 + exp(-g)). The routing weight and the sum over experts are the
// caller's. Naive warp-per-output matvecs (no cuBLAS). hidden, intermediate must be > 0.
absl::Status ExpertSwiGluCuda(const float* x, const float* gate_proj, const float* up_proj,
                              const float* down_proj, uint32_t rows, uint32_t hidden,
                              uint32_t intermediate, float* workspace, float* out, void* stream);

// x: [rows, in_features]; weight: [out_features, in_features] (a Linear weight [out, in]);
// out: [rows, out_features].
// out[r, o] = Dot(weight[o], x[r]) — or out[r, o] + Dot(...) when `accumulate` (the residual add)
// — with worker::Dot's exact evaluation order: eight lanes, lane k % 8 accumulating
// x[k] * weight[k] in ascending k (each product and sum rounded, no FMA), then combined as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). So the result is bit-identical to
// worker::MatVec (and to `out[i] += ...` after it). Tiled through shared memory; no cuBLAS,
// whose shape-dependent algorithm choice (split-K for skinny shapes) would break batch
// invariance. `out` must not alias `x` or `weight`. in_features, out_features must be > 0.
absl::Status LinearCuda(const float* x, const float* weight, uint32_t rows, uint32_t in_features,
                        uint32_t out_features, bool accumulate, float* out, void* stream);

// src: [num_src_rows, cols]; row_ids: [num_rows] uint32; out: [num_rows, cols].
// out[r] = src[row_ids[r]], a plain copy (the embedding lookup; the MoE token grouping). A row id
// >= num_src_rows (only a device-side bug can produce one) gives a row of NaN instead of an
// out-of-bounds read. cols and num_src_rows must be > 0.
absl::Status GatherRowsCuda(const float* src, uint64_t num_src_rows, uint32_t cols,
                            const uint32_t* row_ids, uint32_t num_rows, float* out, void* stream);

// expert_out: [num_expert_rows, hidden] (each selected expert's output for each token);
// rows, weights: [num_tokens, top_k]; x: [num_tokens, hidden], updated in place.
// For each token t: acc = +0, then for j = 0 .. top_k - 1 in order
// acc = acc + expert_out[rows[t, j]] * weights[t, j] (each product and sum rounded); then
// x[t] = x[t] + acc. With the entries of each token ordered by expert index this is
// Qwen3MoeModel::Moe's sum and residual, bit for bit. A row >= num_expert_rows contributes NaN
// (memory-safe). top_k, hidden and num_expert_rows must be > 0.
absl::Status MoeCombineCuda(const float* expert_out, uint64_t num_expert_rows, uint32_t hidden,
                            const uint32_t* rows, const float* weights, uint32_t num_tokens,
                            uint32_t top_k, float* x, void* stream);

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_WORKER_KERNELS_H_
