// CudaQwen3NextModel (see qwen3_next_cuda.h): host orchestration of the kernels through the CUDA
// runtime API, in the stream discipline of qwen3_moe_cuda.cc (every copy and launch on
// impl->stream; the host reads device results only after a sync of it).
#include "model/cuda/qwen3_next_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "common/status_macros.h"
#include "kernels/linear_attention_kernels.h"
#include "kernels/worker_kernels.h"
#include "model/cuda/cuda_model_support.h"
#include "model/cuda/moe_dispatch.h"
#include "model/linear_attention.h"
#include "model/paged_kv.h"

namespace kvcache::worker {
namespace {

struct DeviceLayer {
  LayerType type = LayerType::kLinearAttention;
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  // Linear attention, in_proj rows regrouped: [q | k | v] (the conv's channels), z, b, a.
  const float* in_proj_qkv = nullptr;  // [conv_dim, hidden]
  const float* in_proj_z = nullptr;    // [value_dim, hidden]
  const float* in_proj_b = nullptr;    // [value_heads, hidden]
  const float* in_proj_a = nullptr;    // [value_heads, hidden]
  const float* conv = nullptr;
  const float* dt_bias = nullptr;
  const float* a_log = nullptr;
  const float* gated_norm = nullptr;
  const float* out_proj = nullptr;
  // Full attention, q_proj rows regrouped: all queries, then all gates.
  const float* q_proj = nullptr;     // [q_dim, hidden]
  const float* gate_proj = nullptr;  // [q_dim, hidden]
  const float* k_proj = nullptr;
  const float* v_proj = nullptr;
  const float* o_proj = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  // MoE.
  const float* router = nullptr;
  std::vector<DeviceMlp> experts;
  DeviceMlp shared_expert;
  const float* shared_expert_gate = nullptr;  // [1, hidden]
};

struct DeviceWeights {
  DeviceBuffer storage;
  const float* embed_tokens = nullptr;
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;
  const float* lm_head = nullptr;
};

// Rows [begin, begin + count) of a row-major [*, cols] matrix, appended to `out`.
void AppendRows(const std::vector<float>& matrix, size_t cols, size_t begin, size_t count,
                std::vector<float>& out) {
  out.insert(out.end(), matrix.begin() + begin * cols, matrix.begin() + (begin + count) * cols);
}

void AddMlp(const SwiGluExpert& src, DeviceMlp& dst, WeightUploader& uploader) {
  uploader.Add(src.gate_proj, &dst.gate_proj);
  uploader.Add(src.up_proj, &dst.up_proj);
  uploader.Add(src.down_proj, &dst.down_proj);
}

absl::Status UploadWeights(const Qwen3NextModel& model, cudaStream_t stream, DeviceWeights& w) {
  const Qwen3NextConfig& config = model.config();
  const LinearAttentionDims& d = config.linear;
  const size_t hidden = config.base.hidden_size;
  const size_t hk = d.key_head_dim;
  const size_t hv = d.value_head_dim;
  const size_t r = d.value_heads_per_key_head();
  const size_t group = 2 * hk + 2 * r * hv;  // one key head's [q | k | v | z] rows
  const size_t head_dim = config.base.head_dim;
  // The regrouped copies; a deque keeps their addresses while the uploader holds them.
  std::deque<std::vector<float>> regrouped;
  WeightUploader uploader;
  uploader.Add(model.embed_tokens(), &w.embed_tokens);
  uploader.Add(model.final_norm(), &w.final_norm);
  if (!config.base.tie_word_embeddings) uploader.Add(model.lm_head(), &w.lm_head);
  w.layers.resize(model.layers().size());  // no reallocation after this: Add keeps addresses
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const Qwen3NextModel::Layer& src = model.layers()[l];
    DeviceLayer& dst = w.layers[l];
    dst.type = src.type;
    uploader.Add(src.input_norm, &dst.input_norm);
    uploader.Add(src.post_norm, &dst.post_norm);
    if (src.type == LayerType::kLinearAttention) {
      const Qwen3NextModel::LinearAttentionWeights& lin = src.linear;
      std::vector<float>& qkv = regrouped.emplace_back();
      std::vector<float>& z = regrouped.emplace_back();
      std::vector<float>& b = regrouped.emplace_back();
      std::vector<float>& a = regrouped.emplace_back();
      // q of every key head, then k, then v: the conv's channel order.
      for (const auto& [offset, count] :
           {std::pair<size_t, size_t>{0, hk}, std::pair<size_t, size_t>{hk, hk},
            std::pair<size_t, size_t>{2 * hk, r * hv}}) {
        for (size_t kh = 0; kh < d.num_key_heads; ++kh) {
          AppendRows(lin.in_proj_qkvz, hidden, kh * group + offset, count, qkv);
        }
      }
      for (size_t kh = 0; kh < d.num_key_heads; ++kh) {
        AppendRows(lin.in_proj_qkvz, hidden, kh * group + 2 * hk + r * hv, r * hv, z);
        AppendRows(lin.in_proj_ba, hidden, kh * 2 * r, r, b);
        AppendRows(lin.in_proj_ba, hidden, kh * 2 * r + r, r, a);
      }
      uploader.Add(qkv, &dst.in_proj_qkv);
      uploader.Add(z, &dst.in_proj_z);
      uploader.Add(b, &dst.in_proj_b);
      uploader.Add(a, &dst.in_proj_a);
      uploader.Add(lin.conv, &dst.conv);
      uploader.Add(lin.dt_bias, &dst.dt_bias);
      uploader.Add(lin.a_log, &dst.a_log);
      uploader.Add(lin.norm, &dst.gated_norm);
      uploader.Add(lin.out_proj, &dst.out_proj);
    } else {
      const Qwen3NextModel::FullAttentionWeights& full = src.full;
      std::vector<float>& query = regrouped.emplace_back();
      std::vector<float>& gate = regrouped.emplace_back();
      for (size_t h = 0; h < config.base.num_attention_heads; ++h) {
        AppendRows(full.q_proj, hidden, h * 2 * head_dim, head_dim, query);
        AppendRows(full.q_proj, hidden, h * 2 * head_dim + head_dim, head_dim, gate);
      }
      uploader.Add(query, &dst.q_proj);
      uploader.Add(gate, &dst.gate_proj);
      uploader.Add(full.k_proj, &dst.k_proj);
      uploader.Add(full.v_proj, &dst.v_proj);
      uploader.Add(full.o_proj, &dst.o_proj);
      uploader.Add(full.q_norm, &dst.q_norm);
      uploader.Add(full.k_norm, &dst.k_norm);
    }
    uploader.Add(src.router, &dst.router);
    dst.experts.resize(src.experts.size());
    for (size_t e = 0; e < src.experts.size(); ++e)
      AddMlp(src.experts[e], dst.experts[e], uploader);
    AddMlp(src.shared_expert, dst.shared_expert, uploader);
    uploader.Add(src.shared_expert_gate, &dst.shared_expert_gate);
  }
  RETURN_IF_ERROR(uploader.Finish(w.storage, stream));
  if (config.base.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return absl::OkStatus();
}

absl::Status CheckLinearKernelLimits(const Qwen3NextConfig& config) {
  RETURN_IF_ERROR(CheckKernelLimits(config.base));
  if (config.linear.conv_kernel > kernels::kMaxCudaConvKernel) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear_conv_kernel_dim ", config.linear.conv_kernel,
                     " exceeds the CUDA kernels' ", kernels::kMaxCudaConvKernel));
  }
  if (config.linear.value_head_dim > kernels::kMaxCudaLinearHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear_value_head_dim ", config.linear.value_head_dim,
                     " exceeds the CUDA kernels' ", kernels::kMaxCudaLinearHeadDim));
  }
  return absl::OkStatus();
}

// Per-call device buffers, sized for the largest call so far.
struct Scratch {
  DeviceBuffer x, normed, mixed, conv_out, z, a, b, core, q, gate, k, v, attn;
  DeviceBuffer router_logits, topk_ids, topk_weights, shared_logits;
  DeviceBuffer moe_in, moe_out, moe_act, moe_rows, moe_weights;
  DeviceBuffer indices, slots, logits;

  absl::Status Reserve(const Qwen3NextConfig& config, size_t n, size_t blocks) {
    constexpr size_t kF = sizeof(float);
    const ModelConfig& c = config.base;
    const LinearAttentionDims& d = config.linear;
    const size_t routed = n * c.num_experts_per_tok;
    const size_t combined = routed + n;  // the routed rows, then each token's shared expert row
    const size_t widest_mlp =
        std::max(c.moe_intermediate_size, config.shared_expert_intermediate_size);
    const std::tuple<DeviceBuffer*, size_t, const char*> sizes[] = {
        {&x, n * c.hidden_size * kF, "x"},
        {&normed, n * c.hidden_size * kF, "normed"},
        {&mixed, n * d.conv_dim() * kF, "mixed"},
        {&conv_out, n * d.conv_dim() * kF, "conv_out"},
        {&z, n * d.value_dim() * kF, "z"},
        {&a, n * d.num_value_heads * kF, "a"},
        {&b, n * d.num_value_heads * kF, "b"},
        {&core, n * d.value_dim() * kF, "core"},
        {&q, n * c.q_dim() * kF, "q"},
        {&gate, n * c.q_dim() * kF, "gate"},
        {&k, n * c.kv_dim() * kF, "k"},
        {&v, n * c.kv_dim() * kF, "v"},
        {&attn, n * c.q_dim() * kF, "attn"},
        {&router_logits, n * c.num_experts * kF, "router_logits"},
        {&topk_ids, routed * sizeof(uint32_t), "topk_ids"},
        {&topk_weights, routed * kF, "topk_weights"},
        {&shared_logits, n * kF, "shared_logits"},
        {&moe_in, routed * c.hidden_size * kF, "moe_in"},
        {&moe_out, combined * c.hidden_size * kF, "moe_out"},
        {&moe_act, n * widest_mlp * kF, "moe_act"},
        {&moe_rows, (routed + combined) * sizeof(uint32_t), "moe_rows"},
        {&moe_weights, combined * kF, "moe_weights"},
        {&indices, (2 * n + blocks) * sizeof(uint32_t), "indices"},
        {&slots, n * sizeof(int64_t), "slots"},
        {&logits, size_t{c.vocab_size} * kF, "logits"}};
    for (const auto& [buffer, bytes, what] : sizes) RETURN_IF_ERROR(buffer->Reserve(bytes, what));
    return absl::OkStatus();
  }
  void Release() {
    for (DeviceBuffer* buffer : {&x,
                                 &normed,
                                 &mixed,
                                 &conv_out,
                                 &z,
                                 &a,
                                 &b,
                                 &core,
                                 &q,
                                 &gate,
                                 &k,
                                 &v,
                                 &attn,
                                 &router_logits,
                                 &topk_ids,
                                 &topk_weights,
                                 &shared_logits,
                                 &moe_in,
                                 &moe_out,
                                 &moe_act,
                                 &moe_rows,
                                 &moe_weights,
                                 &indices,
                                 &slots,
                                 &logits}) {
      buffer->Release();
    }
  }
};

}  // namespace

struct CudaQwen3NextModel::Impl {
  Impl(const Qwen3NextConfig& model_config, int device_ordinal)
      : config(model_config), kv_config(model_config.base), device(device_ordinal) {
    kv_config.num_hidden_layers = config.num_full_attention_layers();
  }
  ~Impl() {
    StopModelStream(device, stream, [this] {
      scratch.Release();
      weights.storage.Release();
    });
  }

  // Enqueues the whole forward pass; REQUIRES: the checks passed and the stream is idle.
  absl::StatusOr<std::vector<float>> Run(absl::Span<const uint32_t> tokens, uint32_t start_position,
                                         const DevicePagedKv& kv,
                                         DeviceLinearAttentionState& state);
  absl::Status LinearAttention(uint32_t layer, uint32_t n, DeviceLinearAttentionState& state);
  absl::Status FullAttention(uint32_t layer, uint32_t n, uint32_t blocks, const DevicePagedKv& kv);
  absl::Status Moe(uint32_t layer, uint32_t n);
  // Brings the routing and the shared-expert gates to the host (a sync), plans the expert
  // grouping with each token's shared expert as its last entry, and uploads it.
  absl::Status PlanExperts(uint32_t n);

  const uint32_t* DeviceTokens() const { return scratch.indices.get<uint32_t>(); }
  const uint32_t* DevicePositions(uint32_t n) const { return DeviceTokens() + n; }
  const uint32_t* DeviceBlockTable(uint32_t n) const { return DeviceTokens() + 2 * size_t{n}; }

  // Constant after Create.
  const Qwen3NextConfig config;
  ModelConfig kv_config;  // the pool's shape: the full-attention layers only
  const int device;
  cudaStream_t stream = nullptr;
  DeviceWeights weights;

  // Per-call state (one Forward at a time).
  Scratch scratch;
  std::vector<uint32_t> host_indices;
  std::vector<int64_t> host_slots;
  std::vector<uint32_t> host_topk_ids;
  std::vector<float> host_topk_weights;
  std::vector<float> host_shared_logits;
  std::vector<uint32_t> host_rows;  // gather rows, then combine rows (top_k + 1 per token)
  std::vector<float> host_weights;  // combine weights (top_k + 1 per token)
  MoeDispatchPlan plan;
};

absl::StatusOr<std::vector<float>> CudaQwen3NextModel::Impl::Run(
    absl::Span<const uint32_t> tokens, uint32_t start_position, const DevicePagedKv& kv,
    DeviceLinearAttentionState& state) {
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  const ModelConfig& c = config.base;
  const uint64_t widest = std::max({c.num_attention_heads, c.num_key_value_heads,
                                    c.num_experts_per_tok + 1, config.linear.num_value_heads});
  if (uint64_t{n} * widest > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " tokens in one call overflow the kernels' 32-bit row counts"));
  }
  const uint64_t end = uint64_t{start_position} + n;
  const uint32_t blocks =
      static_cast<uint32_t>((end + kv.layout.block_size - 1) / kv.layout.block_size);
  RETURN_IF_ERROR(scratch.Reserve(config, n, blocks));
  RETURN_IF_ERROR(UploadRequest(tokens, start_position, kv.block_table, blocks, host_slots,
                                host_indices, scratch.indices, scratch.slots, stream));
  RETURN_IF_ERROR(kernels::GatherRowsCuda(weights.embed_tokens, c.vocab_size, c.hidden_size,
                                          DeviceTokens(), n, scratch.x.get<float>(), stream));
  for (uint32_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (weights.layers[layer].type == LayerType::kLinearAttention) {
      RETURN_IF_ERROR(LinearAttention(layer, n, state));
    } else {
      RETURN_IF_ERROR(FullAttention(layer, n, blocks, kv));
    }
    RETURN_IF_ERROR(Moe(layer, n));
  }
  ASSIGN_OR_RETURN(
      std::vector<float> logits,
      LastTokenLogits(c, scratch.x.get<float>(), n, weights.final_norm, weights.lm_head,
                      scratch.normed.get<float>(), scratch.logits.get<float>(), stream));
  state.set_position(end);
  return logits;
}

absl::Status CudaQwen3NextModel::Impl::LinearAttention(uint32_t layer_index, uint32_t n,
                                                       DeviceLinearAttentionState& state) {
  const DeviceLayer& layer = weights.layers[layer_index];
  const LinearAttentionDims& d = config.linear;
  const uint32_t hidden = config.base.hidden_size;
  const float eps = config.base.rms_norm_eps;
  const uint32_t linear_index = config.IndexWithinType(layer_index);
  float* x = scratch.x.get<float>();
  float* normed = scratch.normed.get<float>();
  float* mixed = scratch.mixed.get<float>();
  float* conv_out = scratch.conv_out.get<float>();
  float* z = scratch.z.get<float>();
  float* a = scratch.a.get<float>();
  float* b = scratch.b.get<float>();
  float* core = scratch.core.get<float>();

  RETURN_IF_ERROR(kernels::RmsNormCuda(x, layer.input_norm, eps, n, hidden, normed, stream));
  RETURN_IF_ERROR(kernels::LinearCuda(normed, layer.in_proj_qkv, n, hidden, d.conv_dim(), false,
                                      mixed, stream));
  RETURN_IF_ERROR(
      kernels::LinearCuda(normed, layer.in_proj_z, n, hidden, d.value_dim(), false, z, stream));
  RETURN_IF_ERROR(
      kernels::LinearCuda(normed, layer.in_proj_b, n, hidden, d.num_value_heads, false, b, stream));
  RETURN_IF_ERROR(
      kernels::LinearCuda(normed, layer.in_proj_a, n, hidden, d.num_value_heads, false, a, stream));
  RETURN_IF_ERROR(kernels::CausalConv1dSiluCuda(mixed, layer.conv, n, d.conv_dim(), d.conv_kernel,
                                                state.conv(linear_index), conv_out, stream));
  const kernels::GatedDeltaRuleShape shape{d.num_key_heads, d.num_value_heads, d.key_head_dim,
                                           d.value_head_dim};
  RETURN_IF_ERROR(kernels::GatedDeltaRuleCuda(shape, conv_out, a, b, layer.a_log, layer.dt_bias, n,
                                              state.recurrent(linear_index), core, stream));
  // RMSNormGated per value head (in place), times SiLU(z), then out_proj onto the residual.
  RETURN_IF_ERROR(kernels::RmsNormCuda(core, layer.gated_norm, eps, n * d.num_value_heads,
                                       d.value_head_dim, core, stream));
  RETURN_IF_ERROR(kernels::GateMultiplyCuda(core, z, uint64_t{n} * d.value_dim(),
                                            kernels::GateActivation::kSilu, stream));
  return kernels::LinearCuda(core, layer.out_proj, n, d.value_dim(), hidden, /*accumulate=*/true, x,
                             stream);
}

absl::Status CudaQwen3NextModel::Impl::FullAttention(uint32_t layer_index, uint32_t n,
                                                     uint32_t blocks, const DevicePagedKv& kv) {
  const DeviceLayer& layer = weights.layers[layer_index];
  const ModelConfig& c = config.base;
  const uint32_t hidden = c.hidden_size;
  const uint32_t pool_layer = config.IndexWithinType(layer_index);
  float* x = scratch.x.get<float>();
  float* normed = scratch.normed.get<float>();
  float* q = scratch.q.get<float>();
  float* gate = scratch.gate.get<float>();
  float* k = scratch.k.get<float>();
  float* v = scratch.v.get<float>();
  float* attn = scratch.attn.get<float>();
  const uint32_t* positions = DevicePositions(n);

  RETURN_IF_ERROR(
      kernels::RmsNormCuda(x, layer.input_norm, c.rms_norm_eps, n, hidden, normed, stream));
  for (const auto& [weight, out, width] :
       {std::tuple<const float*, float*, uint32_t>{layer.q_proj, q, c.q_dim()},
        std::tuple<const float*, float*, uint32_t>{layer.gate_proj, gate, c.q_dim()},
        std::tuple<const float*, float*, uint32_t>{layer.k_proj, k, c.kv_dim()},
        std::tuple<const float*, float*, uint32_t>{layer.v_proj, v, c.kv_dim()}}) {
    RETURN_IF_ERROR(kernels::LinearCuda(normed, weight, n, hidden, width, false, out, stream));
  }
  RETURN_IF_ERROR(NormRopeWriteAttend(c, config.rotary_dim(), pool_layer, n, blocks, layer.q_norm,
                                      layer.k_norm, q, k, v, positions, DeviceBlockTable(n),
                                      scratch.slots.get<int64_t>(), kv, attn, stream));
  RETURN_IF_ERROR(kernels::GateMultiplyCuda(attn, gate, uint64_t{n} * c.q_dim(),
                                            kernels::GateActivation::kSigmoid, stream));
  return kernels::LinearCuda(attn, layer.o_proj, n, c.q_dim(), hidden, /*accumulate=*/true, x,
                             stream);
}

absl::Status CudaQwen3NextModel::Impl::Moe(uint32_t layer_index, uint32_t n) {
  const DeviceLayer& layer = weights.layers[layer_index];
  const ModelConfig& c = config.base;
  const uint32_t hidden = c.hidden_size;
  const uint32_t top_k = c.num_experts_per_tok;
  const uint32_t routed = n * top_k;
  float* x = scratch.x.get<float>();
  float* normed = scratch.normed.get<float>();
  float* moe_in = scratch.moe_in.get<float>();
  float* moe_out = scratch.moe_out.get<float>();
  float* act = scratch.moe_act.get<float>();
  const uint32_t* gather_tokens = scratch.moe_rows.get<uint32_t>();
  const uint32_t* combine_rows = gather_tokens + routed;

  RETURN_IF_ERROR(NormAndRoute(c, x, layer.post_norm, layer.router, n, normed,
                               scratch.router_logits.get<float>(), scratch.topk_ids.get<uint32_t>(),
                               scratch.topk_weights.get<float>(), stream));
  RETURN_IF_ERROR(kernels::LinearCuda(normed, layer.shared_expert_gate, n, hidden, 1, false,
                                      scratch.shared_logits.get<float>(), stream));
  RETURN_IF_ERROR(PlanExperts(n));
  RETURN_IF_ERROR(
      kernels::GatherRowsCuda(normed, n, hidden, gather_tokens, routed, moe_in, stream));
  RETURN_IF_ERROR(RunRoutedExperts(plan, layer.experts, moe_in, hidden, c.moe_intermediate_size,
                                   act, moe_out, stream));
  // The shared expert over every token, its rows after the routed ones.
  RETURN_IF_ERROR(kernels::ExpertSwiGluCuda(
      normed, layer.shared_expert.gate_proj, layer.shared_expert.up_proj,
      layer.shared_expert.down_proj, n, hidden, config.shared_expert_intermediate_size, act,
      moe_out + size_t{routed} * hidden, stream));
  // Per token: the routed experts in expert-index order, then sigmoid(gate) * shared, then the
  // residual add — Qwen3NextModel::Moe's order.
  return kernels::MoeCombineCuda(moe_out, routed + n, hidden, combine_rows,
                                 scratch.moe_weights.get<float>(), n, top_k + 1, x, stream);
}

absl::Status CudaQwen3NextModel::Impl::PlanExperts(uint32_t n) {
  const uint32_t top_k = config.base.num_experts_per_tok;
  const size_t routed = size_t{n} * top_k;
  RETURN_IF_ERROR(RouteOnHost(scratch.topk_ids, scratch.topk_weights, n, top_k,
                              config.base.num_experts, host_topk_ids, host_topk_weights, plan,
                              stream, scratch.shared_logits.get<float>(), &host_shared_logits, n));
  const size_t combined = routed + n;
  host_rows.assign(plan.gather_tokens.begin(), plan.gather_tokens.end());
  host_rows.resize(routed + combined);
  host_weights.resize(combined);
  for (uint32_t t = 0; t < n; ++t) {
    uint32_t* rows = &host_rows[routed + size_t{t} * (top_k + 1)];
    float* token_weights = &host_weights[size_t{t} * (top_k + 1)];
    for (uint32_t j = 0; j < top_k; ++j) {
      rows[j] = plan.combine_rows[size_t{t} * top_k + j];
      token_weights[j] = plan.combine_weights[size_t{t} * top_k + j];
    }
    rows[top_k] = static_cast<uint32_t>(routed + t);
    token_weights[top_k] = Sigmoid(host_shared_logits[t]);  // the CPU model's own function
  }
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(scratch.moe_rows.get<uint32_t>(), host_rows.data(),
                      host_rows.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (expert rows)");
  return CudaStatus(
      cudaMemcpyAsync(scratch.moe_weights.get<float>(), host_weights.data(),
                      host_weights.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (combine weights)");
}

absl::StatusOr<CudaQwen3NextModel> CudaQwen3NextModel::Create(const Qwen3NextModel& model,
                                                              int device) {
  RETURN_IF_ERROR(CheckCudaDevice(device));
  RETURN_IF_ERROR(CheckLinearKernelLimits(model.config()));
  auto impl = std::make_unique<Impl>(model.config(), device);
  ScopedCudaDevice scoped;
  RETURN_IF_ERROR(StartModelStream(device, scoped, impl->stream));
  RETURN_IF_ERROR(UploadWeights(model, impl->stream, impl->weights));
  return CudaQwen3NextModel(std::move(impl));
}

CudaQwen3NextModel::CudaQwen3NextModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaQwen3NextModel::~CudaQwen3NextModel() = default;
CudaQwen3NextModel::CudaQwen3NextModel(CudaQwen3NextModel&& other) noexcept = default;
CudaQwen3NextModel& CudaQwen3NextModel::operator=(CudaQwen3NextModel&& other) noexcept = default;

int CudaQwen3NextModel::device() const { return impl_ == nullptr ? -1 : impl_->device; }

absl::StatusOr<std::vector<float>> CudaQwen3NextModel::Forward(absl::Span<const uint32_t> tokens,
                                                               uint32_t start_position,
                                                               const DevicePagedKv& kv,
                                                               DeviceLinearAttentionState& state) {
  if (impl_ == nullptr) {
    return absl::FailedPreconditionError("CudaQwen3NextModel::Forward on a moved-from model");
  }
  // The CPU model's checks, codes and messages; the view is inspected, never dereferenced.
  const PagedKv view(kv.pool_base, kv.layout, kv.block_table, kv.num_pool_blocks,
                     kv.page_stride_bytes);
  RETURN_IF_ERROR(CheckForwardRequest(impl_->kv_config, tokens, start_position, view));
  RETURN_IF_ERROR(
      CheckStateRequest(impl_->config, state.StateBytes(), state.position(), start_position));
  if (state.device() != impl_->device) {
    return absl::FailedPreconditionError(absl::StrCat("linear-attention state is on CUDA device ",
                                                      state.device(), ", the model on ",
                                                      impl_->device));
  }
  return RunForwardOnDevice(impl_->device, impl_->stream, kv, start_position, tokens.size(),
                            impl_->host_slots,
                            [&] { return impl_->Run(tokens, start_position, kv, state); });
}

}  // namespace kvcache::worker
