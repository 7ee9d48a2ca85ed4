// KvWorker: runs the model with its KV in the daemon's pool. A generation opens a sequence (the
// daemon hands back the longest cached prefix), computes only the uncached prompt tokens at the
// positions after the cached ones, writes their KV in place through the shared mapping, commits
// the prompt, then decodes, appending tokens to the sequence and committing each block as it
// fills (one round trip per block, not per token), so a later turn hits its own earlier answer.
// The sequence is released (tail first) at the end, or on any error.
//
// Where the model runs follows the pool's memory: over a host pool (a daemon with --device host)
// the CPU model (Qwen3MoeModel) computes over the shm mapping; over a device pool (--device
// cuda:N) a CudaQwen3MoeModel on the pool's device, created once by Create (the weights are
// uploaded then), computes over the CUDA IPC mapping. The generation loop is the same for both;
// only its forward pass over the pool (a PoolForward, worker/pool_forward.h) differs.
//
// The hybrid model (Qwen3NextModel, DESIGN §5, worker/hybrid_pages.h) runs over a pool whose
// pages are [kv | state] — on the CPU over a host pool, as a CudaQwen3NextModel on the pool's
// device over a device pool, its state then in a DeviceLinearAttentionState copied device to
// device from and into the pages: Generate opens with restore_parts {kv, state}, so the daemon's
// hit ends at a page holding a state; the worker restores the state from that page, computes on,
// saves the state into every checkpoint_pages-th page it fills, and commits each block's part mask
// (kv, or kv + state). Only the forward pass, the state's restore and the masks differ from
// Qwen3-MoE; the loop is the same.
//
// Commit ordering: a forward pass returns only once its pool writes are complete — the CUDA
// model synchronizes its stream before Forward returns — so the CommitSequence that follows
// never publishes a block whose KV is still in flight, and an AfterPrefill hook (a transport,
// whose copies run on their own stream) reads finished bytes.
//
// Thread-safety: thread-compatible (one generation at a time per KvWorker; the CUDA model has
// one stream and one set of scratch buffers).
#ifndef KVCACHE_WORKER_KV_WORKER_H_
#define KVCACHE_WORKER_KV_WORKER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "model/qwen3_moe.h"
#include "model/qwen3_next.h"
#include "model/sampler.h"
#include "worker/generation.h"
#include "worker/hybrid_pages.h"
#include "worker/pool_forward.h"

namespace kvcache::worker {

class KvWorker {
 public:
  // `client` must have an open session and outlive the worker; so must `model`. Maps `pool` and,
  // for a device pool, creates the CUDA model on the pool's device. Errors:
  //   (DescribePool's codes, e.g. NOT_FOUND for an unknown pool)
  //   (MappedPool::Map's codes: FAILED_PRECONDITION for a device pool in a build without CUDA
  //    or on a machine without a usable CUDA device, or a stale handle)
  //   FAILED_PRECONDITION  the pool's layout is not the model's (layers, KV heads, head dim)
  //   (CudaQwen3MoeModel::Create's codes, the message naming the pool: FAILED_PRECONDITION
  //    without CUDA or a device, INVALID_ARGUMENT for a model the kernels cannot run,
  //    RESOURCE_EXHAUSTED out of device memory, INTERNAL for another CUDA error)
  static absl::StatusOr<std::unique_ptr<KvWorker>> Create(KvCacheClient* client, std::string pool,
                                                          const Qwen3MoeModel* model);

  // The hybrid model over a pool laid out as HybridPoolGeometryFor gives, a state saved every
  // `checkpoint_pages` pages (at least 1); for a device pool, a CudaQwen3NextModel and a
  // DeviceLinearAttentionState on the pool's device, created here. Errors: DescribePool's and
  // Map's, as above; INVALID_ARGUMENT for checkpoint_pages 0; FAILED_PRECONDITION for a pool
  // whose pages do not hold the model's (HybridPagesIn); CudaQwen3NextModel::Create's and
  // DeviceLinearAttentionState::Create's codes for a device pool, the message naming the pool.
  static absl::StatusOr<std::unique_ptr<KvWorker>> Create(KvCacheClient* client, std::string pool,
                                                          const Qwen3NextModel* model,
                                                          uint32_t checkpoint_pages = 1);

  // Called once the prompt's KV is written and committed, with the sequence's block table and
  // the part masks its full blocks were committed with (empty: every part), while the sequence
  // still pins its blocks (a prefill worker ships them, masks and all, to a decode worker here).
  using AfterPrefill = std::function<absl::Status(absl::Span<const uint32_t> block_table,
                                                  absl::Span<const uint32_t> part_masks)>;

  // Errors: the daemon's (e.g. RESOURCE_EXHAUSTED when the pool is full), the model's, the
  // hook's, or FAILED_PRECONDITION after a daemon restart (the mapping belongs to the old epoch).
  absl::StatusOr<GenerationResult> Generate(absl::Span<const uint32_t> prompt,
                                            uint32_t max_new_tokens, Sampler& sampler,
                                            absl::string_view cache_salt = "",
                                            const AfterPrefill& after_prefill = nullptr);

  // The cold reference of Generate, computed the way this worker computes: the same generation
  // in this process over a private pool of the pool's layout, with no daemon and no cache —
  // GenerateCold (CPU model, host memory) for a host pool, GenerateColdCuda (this worker's CUDA
  // model, a fresh device buffer on the pool's device) for a device pool, GenerateColdHybrid for
  // the hybrid model (GenerateColdHybridCuda over a device pool). Generate's tokens and
  // logits digest, prefix hit or not, must equal it bit for bit. Errors as those functions'.
  absl::StatusOr<GenerationResult> GenerateColdReference(absl::Span<const uint32_t> prompt,
                                                         uint32_t max_new_tokens, Sampler& sampler);

  const PoolLayout& layout() const { return mapped_->layout(); }
  const MappedPool& mapped() const { return *mapped_; }
  // True when the model runs on a GPU (the pool is device memory).
  bool on_device() const { return mapped_->is_device(); }
  // True for the hybrid model.
  bool hybrid() const { return hybrid_model_ != nullptr; }

  // The hybrid's pages and running state (absent for Qwen3-MoE); public for the forward pass
  // built over them.
  struct HybridParts {
    HybridPages pages;
    uint32_t checkpoint_pages;
    LinearAttentionState state;  // the running generation's, over a host pool
    // Over a device pool: the model on the pool's device and the running generation's state
    // there (declared after the model: destroyed first, while its device work is long done).
    std::unique_ptr<CudaQwen3NextModel> cuda_model;
    std::unique_ptr<DeviceLinearAttentionState> device_state;
  };

 private:
  KvWorker(KvCacheClient* client, std::string pool, const Qwen3MoeModel* model,
           const Qwen3NextModel* hybrid_model, std::unique_ptr<MappedPool> mapped,
           std::unique_ptr<CudaQwen3MoeModel> cuda_model, std::unique_ptr<HybridParts> hybrid);

  absl::StatusOr<GenerationResult> Run(const KvCacheClient::Sequence& sequence,
                                       absl::Span<const uint32_t> prompt, uint32_t max_new_tokens,
                                       Sampler& sampler, const AfterPrefill& after_prefill);
  // Commits the first `tokens` tokens; for the hybrid, with each full block's part mask (the
  // cached blocks' as the daemon gave them in `masks`, which grows by the blocks written since).
  absl::Status Commit(uint64_t sequence_id, uint32_t tokens, std::vector<uint32_t>& masks);

  // Constant after construction. Declared (so destroyed in reverse) in dependency order:
  // forward_ refers to cuda_model_ (or model_, or hybrid_'s models and states) and mapped_'s
  // memory; the CUDA models' destructors wait for their streams before mapped_ closes the device
  // mapping.
  KvCacheClient* const client_;
  const std::string pool_;
  const Qwen3MoeModel* const model_;          // null for the hybrid
  const Qwen3NextModel* const hybrid_model_;  // null for Qwen3-MoE
  const std::unique_ptr<MappedPool> mapped_;
  const std::unique_ptr<CudaQwen3MoeModel> cuda_model_;  // null for a host pool
  const std::unique_ptr<HybridParts> hybrid_;            // null for Qwen3-MoE
  const PoolForward forward_;  // over mapped_, on the right backend (and hybrid_->state)
};

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_KV_WORKER_H_
