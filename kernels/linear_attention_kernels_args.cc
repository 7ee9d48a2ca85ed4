// The argument checks of linear_attention_kernels.h's launchers, built in every configuration.
#include <cmath>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/block_copy_internal.h"
#include "kernels/linear_attention_kernels.h"

namespace kvcache::kernels {

absl::Status CausalConv1dSiluCuda(const float* input, const float* weight, uint32_t n,
                                  uint32_t channels, uint32_t kernel, float* conv_state, float* out,
                                  void* stream) {
  constexpr char kOp[] = "CausalConv1dSiluCuda";
  if (channels == 0 || kernel == 0 || kernel > kMaxCudaConvKernel) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: channels (%u) must be > 0 and kernel (%u) in [1, %u]", kOp, channels,
                        kernel, kMaxCudaConvKernel));
  }
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "input", input));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "weight", weight));
  if (kernel > 1) RETURN_IF_ERROR(internal::CheckNotNull(kOp, "conv_state", conv_state));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "out", out));
  return internal::LaunchCausalConv1dSilu(input, weight, n, channels, kernel, conv_state, out,
                                          stream);
}

absl::Status GatedDeltaRuleCuda(const GatedDeltaRuleShape& shape, const float* qkv, const float* a,
                                const float* b, const float* a_log, const float* dt_bias,
                                uint32_t n, float* state, float* out, void* stream) {
  constexpr char kOp[] = "GatedDeltaRuleCuda";
  if (shape.num_key_heads == 0 || shape.num_value_heads == 0 || shape.key_head_dim == 0 ||
      shape.value_head_dim == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: key heads (%u), value heads (%u), key head dim (%u) and value head dim (%u) must "
        "be > 0",
        kOp, shape.num_key_heads, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim));
  }
  if (shape.num_value_heads % shape.num_key_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %u value heads are not a multiple of %u key heads", kOp,
                        shape.num_value_heads, shape.num_key_heads));
  }
  if (shape.value_head_dim > kMaxCudaLinearHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: value head dim %u exceeds %u", kOp,
                                                      shape.value_head_dim, kMaxCudaLinearHeadDim));
  }
  if (n == 0) return absl::OkStatus();
  for (const auto& [what, ptr] : {std::pair<const char*, const void*>{"qkv", qkv},
                                  {"a", a},
                                  {"b", b},
                                  {"a_log", a_log},
                                  {"dt_bias", dt_bias},
                                  {"state", state},
                                  {"out", out}}) {
    RETURN_IF_ERROR(internal::CheckNotNull(kOp, what, ptr));
  }
  // worker::GatedDeltaRule's q scale, computed the same way on the host.
  const float q_scale =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.key_head_dim)));
  return internal::LaunchGatedDeltaRule(shape, q_scale, qkv, a, b, a_log, dt_bias, n, state, out,
                                        stream);
}

absl::Status GateMultiplyCuda(float* x, const float* gate, uint64_t count,
                              GateActivation activation, void* stream) {
  constexpr char kOp[] = "GateMultiplyCuda";
  if (count == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "x", x));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "gate", gate));
  return internal::LaunchGateMultiply(x, gate, count, activation, stream);
}

}  // namespace kvcache::kernels
