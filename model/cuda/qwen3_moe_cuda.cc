// CudaQwen3MoeModel (see qwen3_moe_cuda.h): host orchestration of the kernels of
// kernels/worker_kernels.h through the CUDA runtime API. Compiled by the host compiler.
//
// Stream discipline: every copy and launch goes to impl->stream. The host reads device results
// only after cudaStreamSynchronize (the routing of each layer, the logits), and host staging
// buffers are rewritten only after such a sync, so pageable-memory copies can never race.
#include "model/cuda/qwen3_moe_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "common/status_macros.h"
#include "kernels/worker_kernels.h"
#include "model/cuda/cuda_model_support.h"
#include "model/cuda/moe_dispatch.h"
#include "model/paged_kv.h"

namespace kvcache::worker {
namespace {

// Device addresses of the weights, all inside one allocation.
struct DeviceLayer {
  const float* input_norm = nullptr;
  const float* q_proj = nullptr;
  const float* k_proj = nullptr;
  const float* v_proj = nullptr;
  const float* o_proj = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  const float* post_norm = nullptr;
  const float* router = nullptr;
  std::vector<DeviceMlp> experts;
};
struct DeviceWeights {
  DeviceBuffer storage;
  const float* embed_tokens = nullptr;  // [vocab, hidden]
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;  // [hidden]
  const float* lm_head = nullptr;     // [vocab, hidden]; embed_tokens when tied
};

absl::Status UploadWeights(const Qwen3MoeModel& model, cudaStream_t stream, DeviceWeights& w) {
  const ModelConfig& config = model.config();
  WeightUploader uploader;
  uploader.Add(model.embed_tokens(), &w.embed_tokens);
  uploader.Add(model.final_norm(), &w.final_norm);
  if (!config.tie_word_embeddings) uploader.Add(model.lm_head(), &w.lm_head);
  w.layers.resize(model.layers().size());  // no reallocation after this: Add keeps addresses
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const Qwen3MoeModel::Layer& src = model.layers()[l];
    DeviceLayer& dst = w.layers[l];
    using Tensor = std::pair<const std::vector<float>*, const float**>;
    for (const auto& [tensor, slot] :
         std::initializer_list<Tensor>{{&src.input_norm, &dst.input_norm},
                                       {&src.q_proj, &dst.q_proj},
                                       {&src.k_proj, &dst.k_proj},
                                       {&src.v_proj, &dst.v_proj},
                                       {&src.o_proj, &dst.o_proj},
                                       {&src.q_norm, &dst.q_norm},
                                       {&src.k_norm, &dst.k_norm},
                                       {&src.post_norm, &dst.post_norm},
                                       {&src.router, &dst.router}}) {
      uploader.Add(*tensor, slot);
    }
    dst.experts.resize(src.experts.size());
    for (size_t e = 0; e < src.experts.size(); ++e) {
      uploader.Add(src.experts[e].gate_proj, &dst.experts[e].gate_proj);
      uploader.Add(src.experts[e].up_proj, &dst.experts[e].up_proj);
      uploader.Add(src.experts[e].down_proj, &dst.experts[e].down_proj);
    }
  }
  RETURN_IF_ERROR(uploader.Finish(w.storage, stream));
  if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return absl::OkStatus();
}

// Per-call device buffers, sized for the largest call so far.
struct Scratch {
  DeviceBuffer x;              // [n, hidden] residual stream
  DeviceBuffer normed;         // [n, hidden]
  DeviceBuffer q;              // [n, heads * head_dim]
  DeviceBuffer k;              // [n, kv_heads * head_dim]
  DeviceBuffer v;              // [n, kv_heads * head_dim]
  DeviceBuffer attn;           // [n, heads * head_dim]
  DeviceBuffer router_logits;  // [n, experts]
  DeviceBuffer topk_ids;       // [n, top_k] uint32
  DeviceBuffer topk_weights;   // [n, top_k]
  DeviceBuffer moe_in;         // [n * top_k, hidden] normed rows grouped by expert
  DeviceBuffer moe_out;        // [n * top_k, hidden] expert outputs, same rows
  DeviceBuffer moe_act;        // [n, moe_intermediate] ExpertSwiGluCuda's workspace
  DeviceBuffer moe_rows;       // [2, n * top_k] uint32: gather_tokens, then combine_rows
  DeviceBuffer moe_weights;    // [n * top_k] combine_weights
  DeviceBuffer indices;        // uint32: tokens [n], positions [n], block table [blocks]
  DeviceBuffer slots;          // [n] int64 slot mapping of the positions being written
  DeviceBuffer logits;         // [vocab]

  absl::Status Reserve(const ModelConfig& c, size_t n, size_t blocks) {
    constexpr size_t kF = sizeof(float);
    const size_t routed = n * c.num_experts_per_tok;
    RETURN_IF_ERROR(x.Reserve(n * c.hidden_size * kF, "x"));
    RETURN_IF_ERROR(normed.Reserve(n * c.hidden_size * kF, "normed"));
    RETURN_IF_ERROR(q.Reserve(n * c.q_dim() * kF, "q"));
    RETURN_IF_ERROR(k.Reserve(n * c.kv_dim() * kF, "k"));
    RETURN_IF_ERROR(v.Reserve(n * c.kv_dim() * kF, "v"));
    RETURN_IF_ERROR(attn.Reserve(n * c.q_dim() * kF, "attn"));
    RETURN_IF_ERROR(router_logits.Reserve(n * c.num_experts * kF, "router_logits"));
    RETURN_IF_ERROR(topk_ids.Reserve(routed * sizeof(uint32_t), "topk_ids"));
    RETURN_IF_ERROR(topk_weights.Reserve(routed * kF, "topk_weights"));
    RETURN_IF_ERROR(moe_in.Reserve(routed * c.hidden_size * kF, "moe_in"));
    RETURN_IF_ERROR(moe_out.Reserve(routed * c.hidden_size * kF, "moe_out"));
    RETURN_IF_ERROR(moe_act.Reserve(n * c.moe_intermediate_size * kF, "moe_act"));
    RETURN_IF_ERROR(moe_rows.Reserve(2 * routed * sizeof(uint32_t), "moe_rows"));
    RETURN_IF_ERROR(moe_weights.Reserve(routed * kF, "moe_weights"));
    RETURN_IF_ERROR(indices.Reserve((2 * n + blocks) * sizeof(uint32_t), "indices"));
    RETURN_IF_ERROR(slots.Reserve(n * sizeof(int64_t), "slots"));
    return logits.Reserve(size_t{c.vocab_size} * kF, "logits");
  }
  void Release() {
    for (DeviceBuffer* buffer :
         {&x, &normed, &q, &k, &v, &attn, &router_logits, &topk_ids, &topk_weights, &moe_in,
          &moe_out, &moe_act, &moe_rows, &moe_weights, &indices, &slots, &logits}) {
      buffer->Release();
    }
  }
};

}  // namespace

struct CudaQwen3MoeModel::Impl {
  Impl(const ModelConfig& model_config, int device_ordinal)
      : config(model_config), device(device_ordinal) {}
  ~Impl();

  // Enqueues the whole forward pass; REQUIRES: the checks passed and the stream is idle.
  absl::StatusOr<std::vector<float>> Run(absl::Span<const uint32_t> tokens, uint32_t start_position,
                                         const DevicePagedKv& kv);
  absl::Status Upload(absl::Span<const uint32_t> tokens, uint32_t start_position, uint32_t blocks,
                      const DevicePagedKv& kv);
  absl::Status Attention(uint32_t layer, uint32_t n, uint32_t blocks, const DevicePagedKv& kv);
  absl::Status Moe(uint32_t layer, uint32_t n);
  // Brings the layer's routing to the host (a sync), plans and uploads the expert grouping.
  absl::Status PlanExperts(uint32_t n);
  absl::StatusOr<std::vector<float>> Logits(uint32_t n);

  // Device pointers into `scratch.indices`.
  const uint32_t* DeviceTokens() const { return scratch.indices.get<uint32_t>(); }
  const uint32_t* DevicePositions(uint32_t n) const { return DeviceTokens() + n; }
  const uint32_t* DeviceBlockTable(uint32_t n) const { return DeviceTokens() + 2 * size_t{n}; }

  // Constant after Create.
  const ModelConfig config;
  const int device;
  cudaStream_t stream = nullptr;
  DeviceWeights weights;

  // Per-call state (one Forward at a time).
  Scratch scratch;
  std::vector<uint32_t> host_indices;  // tokens, positions, block table: staged for upload
  std::vector<int64_t> host_slots;     // slot mapping: staged for upload
  std::vector<uint32_t> host_topk_ids;
  std::vector<float> host_topk_weights;
  MoeDispatchPlan plan;
};

CudaQwen3MoeModel::Impl::~Impl() {
  StopModelStream(device, stream, [this] {
    scratch.Release();
    weights.storage.Release();
  });
}

absl::StatusOr<std::vector<float>> CudaQwen3MoeModel::Impl::Run(absl::Span<const uint32_t> tokens,
                                                                uint32_t start_position,
                                                                const DevicePagedKv& kv) {
  // CheckForwardRequest bounds start_position + n by max_position_embeddings (a uint32).
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const uint64_t widest = std::max(
      {config.num_attention_heads, config.num_key_value_heads, config.num_experts_per_tok});
  if (uint64_t{n} * widest > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " tokens in one call overflow the kernels' 32-bit row counts"));
  }
  // Only the table entries that hold positions < start_position + n are read.
  const uint64_t end = uint64_t{start_position} + n;
  const uint32_t blocks =
      static_cast<uint32_t>((end + kv.layout.block_size - 1) / kv.layout.block_size);
  RETURN_IF_ERROR(scratch.Reserve(config, n, blocks));
  RETURN_IF_ERROR(Upload(tokens, start_position, blocks, kv));
  RETURN_IF_ERROR(kernels::GatherRowsCuda(weights.embed_tokens, config.vocab_size,
                                          config.hidden_size, DeviceTokens(), n,
                                          scratch.x.get<float>(), stream));
  for (uint32_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    RETURN_IF_ERROR(Attention(layer, n, blocks, kv));
    RETURN_IF_ERROR(Moe(layer, n));
  }
  return Logits(n);
}

absl::Status CudaQwen3MoeModel::Impl::Upload(absl::Span<const uint32_t> tokens,
                                             uint32_t start_position, uint32_t blocks,
                                             const DevicePagedKv& kv) {
  return UploadRequest(tokens, start_position, kv.block_table, blocks, host_slots, host_indices,
                       scratch.indices, scratch.slots, stream);
}

absl::Status CudaQwen3MoeModel::Impl::Attention(uint32_t layer_index, uint32_t n, uint32_t blocks,
                                                const DevicePagedKv& kv) {
  const DeviceLayer& layer = weights.layers[layer_index];
  const ModelConfig& c = config;
  const uint32_t hidden = c.hidden_size;
  const uint32_t head_dim = c.head_dim;
  float* x = scratch.x.get<float>();
  float* normed = scratch.normed.get<float>();
  float* q = scratch.q.get<float>();
  float* k = scratch.k.get<float>();
  float* v = scratch.v.get<float>();
  float* attn = scratch.attn.get<float>();
  const uint32_t* positions = DevicePositions(n);

  RETURN_IF_ERROR(
      kernels::RmsNormCuda(x, layer.input_norm, c.rms_norm_eps, n, hidden, normed, stream));
  RETURN_IF_ERROR(
      kernels::LinearCuda(normed, layer.q_proj, n, hidden, c.q_dim(), false, q, stream));
  RETURN_IF_ERROR(
      kernels::LinearCuda(normed, layer.k_proj, n, hidden, c.kv_dim(), false, k, stream));
  RETURN_IF_ERROR(
      kernels::LinearCuda(normed, layer.v_proj, n, hidden, c.kv_dim(), false, v, stream));
  RETURN_IF_ERROR(NormRopeWriteAttend(c, head_dim, layer_index, n, blocks, layer.q_norm,
                                      layer.k_norm, q, k, v, positions, DeviceBlockTable(n),
                                      scratch.slots.get<int64_t>(), kv, attn, stream));
  // o_proj added onto the residual stream in place.
  return kernels::LinearCuda(attn, layer.o_proj, n, c.q_dim(), hidden, /*accumulate=*/true, x,
                             stream);
}

absl::Status CudaQwen3MoeModel::Impl::Moe(uint32_t layer_index, uint32_t n) {
  const DeviceLayer& layer = weights.layers[layer_index];
  const ModelConfig& c = config;
  const uint32_t hidden = c.hidden_size;
  const uint32_t top_k = c.num_experts_per_tok;
  const uint32_t routed = n * top_k;
  float* x = scratch.x.get<float>();
  float* normed = scratch.normed.get<float>();
  float* moe_in = scratch.moe_in.get<float>();
  float* moe_out = scratch.moe_out.get<float>();
  const uint32_t* gather_tokens = scratch.moe_rows.get<uint32_t>();
  const uint32_t* combine_rows = gather_tokens + routed;

  RETURN_IF_ERROR(NormAndRoute(c, x, layer.post_norm, layer.router, n, normed,
                               scratch.router_logits.get<float>(), scratch.topk_ids.get<uint32_t>(),
                               scratch.topk_weights.get<float>(), stream));
  RETURN_IF_ERROR(PlanExperts(n));
  RETURN_IF_ERROR(
      kernels::GatherRowsCuda(normed, n, hidden, gather_tokens, routed, moe_in, stream));
  RETURN_IF_ERROR(RunRoutedExperts(plan, layer.experts, moe_in, hidden, c.moe_intermediate_size,
                                   scratch.moe_act.get<float>(), moe_out, stream));
  // Weighted sum in expert-index order (combine_rows is so ordered) and the residual add.
  return kernels::MoeCombineCuda(moe_out, routed, hidden, combine_rows,
                                 scratch.moe_weights.get<float>(), n, top_k, x, stream);
}

absl::Status CudaQwen3MoeModel::Impl::PlanExperts(uint32_t n) {
  const uint32_t top_k = config.num_experts_per_tok;
  const size_t routed = size_t{n} * top_k;
  RETURN_IF_ERROR(RouteOnHost(scratch.topk_ids, scratch.topk_weights, n, top_k, config.num_experts,
                              host_topk_ids, host_topk_weights, plan, stream));
  uint32_t* rows = scratch.moe_rows.get<uint32_t>();
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(rows, plan.gather_tokens.data(), routed * sizeof(uint32_t),
                      cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (gather rows)");
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(rows + routed, plan.combine_rows.data(), routed * sizeof(uint32_t),
                      cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (combine rows)");
  return CudaStatus(cudaMemcpyAsync(scratch.moe_weights.get<float>(), plan.combine_weights.data(),
                                    routed * sizeof(float), cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync (combine weights)");
}

absl::StatusOr<std::vector<float>> CudaQwen3MoeModel::Impl::Logits(uint32_t n) {
  return LastTokenLogits(config, scratch.x.get<float>(), n, weights.final_norm, weights.lm_head,
                         scratch.normed.get<float>(), scratch.logits.get<float>(), stream);
}

absl::StatusOr<CudaQwen3MoeModel> CudaQwen3MoeModel::Create(const Qwen3MoeModel& model,
                                                            int device) {
  RETURN_IF_ERROR(CheckCudaDevice(device));
  RETURN_IF_ERROR(CheckKernelLimits(model.config()));
  auto impl = std::make_unique<Impl>(model.config(), device);
  ScopedCudaDevice scoped;
  RETURN_IF_ERROR(StartModelStream(device, scoped, impl->stream));
  RETURN_IF_ERROR(UploadWeights(model, impl->stream, impl->weights));
  return CudaQwen3MoeModel(std::move(impl));
}

CudaQwen3MoeModel::CudaQwen3MoeModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaQwen3MoeModel::~CudaQwen3MoeModel() = default;
CudaQwen3MoeModel::CudaQwen3MoeModel(CudaQwen3MoeModel&& other) noexcept = default;
CudaQwen3MoeModel& CudaQwen3MoeModel::operator=(CudaQwen3MoeModel&& other) noexcept = default;

int CudaQwen3MoeModel::device() const { return impl_ == nullptr ? -1 : impl_->device; }

absl::StatusOr<std::vector<float>> CudaQwen3MoeModel::Forward(absl::Span<const uint32_t> tokens,
                                                              uint32_t start_position,
                                                              const DevicePagedKv& kv) {
  if (impl_ == nullptr) {
    return absl::FailedPreconditionError("CudaQwen3MoeModel::Forward on a moved-from model");
  }
  // The CPU model's checks, codes and messages. The view is inspected (layout, table, pool size),
  // never dereferenced.
  const PagedKv view(kv.pool_base, kv.layout, kv.block_table, kv.num_pool_blocks,
                     kv.page_stride_bytes);
  RETURN_IF_ERROR(CheckForwardRequest(impl_->config, tokens, start_position, view));
  return RunForwardOnDevice(impl_->device, impl_->stream, kv, start_position, tokens.size(),
                            impl_->host_slots,
                            [&] { return impl_->Run(tokens, start_position, kv); });
}

}  // namespace kvcache::worker
