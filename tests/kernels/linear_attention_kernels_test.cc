// The linear-attention kernels (kernels/linear_attention_kernels.h) and the device state
// (model/cuda/device_linear_state.h).
//
// Label unit (every build, every machine): the launchers' argument checks, and what
// DeviceLinearAttentionState::Create answers for a bad config and for this build and machine.
//
// Label gpu (CUDA builds; every case skips without a device): LinearAttentionKernelsGpuTest
//  - CausalConv1dSiluCuda against worker::CausalConv1dSilu: outputs within 1e-5 relative (SiLU's
//    expf), the carried window bit for bit;
//  - GatedDeltaRuleCuda against worker::GatedDeltaRule over several shapes: outputs and state
//    within 2e-5 relative (expf / log1pf of the gates differ by an ulp; the sums are in the CPU's
//    order, unfused);
//  - a run split into calls (chunks, then one token at a time) is bit-identical on the GPU to the
//    run in one call: outputs, window and state;
//  - a CPU state's bytes restored onto the device, run on, saved back and restored onto the CPU
//    keep the documented layout: the device kernels on the device state agree with the CPU
//    functions on the host state.
#include "kernels/linear_attention_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "model/cuda/device_linear_state.h"
#include "model/linear_attention.h"
#include "model/linear_attention_state.h"
#include "model/ops.h"
#include "tests/testing/random_floats.h"
#include "tests/testing/status_matchers.h"

#if KVCACHE_WITH_CUDA
#include "tests/testing/device_array.h"
#endif

namespace kvcache::kernels {
namespace {

using ::kvcache::testing::RandomNormals;
using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;
using worker::LinearAttentionDims;

TEST(LinearAttentionKernelsTest, ConvArgumentsAreChecked) {
  float dummy = 0;
  EXPECT_THAT(CausalConv1dSiluCuda(&dummy, &dummy, 1, 0, 4, &dummy, &dummy, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("channels (0)")));
  EXPECT_THAT(
      CausalConv1dSiluCuda(&dummy, &dummy, 1, 8, kMaxCudaConvKernel + 1, &dummy, &dummy, nullptr),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kernel (17)")));
  EXPECT_THAT(CausalConv1dSiluCuda(&dummy, &dummy, 1, 8, 4, nullptr, &dummy, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("conv_state")));
  EXPECT_OK(CausalConv1dSiluCuda(nullptr, nullptr, 0, 8, 4, nullptr, nullptr, nullptr));
}

TEST(LinearAttentionKernelsTest, DeltaRuleArgumentsAreChecked) {
  float dummy = 0;
  const auto run = [&](GatedDeltaRuleShape shape, uint32_t n, float* state) {
    return GatedDeltaRuleCuda(shape, &dummy, &dummy, &dummy, &dummy, &dummy, n, state, &dummy,
                              nullptr);
  };
  EXPECT_THAT(run({2, 3, 16, 16}, 1, &dummy),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("3 value heads are not a multiple of 2 key heads")));
  EXPECT_THAT(run({2, 4, 0, 16}, 1, &dummy), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(run({2, 4, 16, kMaxCudaLinearHeadDim + 1}, 1, &dummy),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value head dim 1025")));
  EXPECT_THAT(run({2, 4, 16, 16}, 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("state")));
  EXPECT_OK(run({2, 4, 16, 16}, 0, nullptr));
}

TEST(LinearAttentionKernelsTest, GateArgumentsAreChecked) {
  float dummy = 0;
  EXPECT_THAT(GateMultiplyCuda(nullptr, &dummy, 4, GateActivation::kSilu, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("x")));
  EXPECT_THAT(GateMultiplyCuda(&dummy, nullptr, 4, GateActivation::kSigmoid, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gate")));
  EXPECT_OK(GateMultiplyCuda(nullptr, nullptr, 0, GateActivation::kSilu, nullptr));
}

worker::Qwen3NextConfig SmallConfig() {
  worker::Qwen3NextConfig config;
  config.base = {.hidden_size = 32,
                 .moe_intermediate_size = 16,
                 .num_hidden_layers = 2,
                 .num_attention_heads = 2,
                 .num_key_value_heads = 1,
                 .head_dim = 16,
                 .vocab_size = 64,
                 .num_experts = 2,
                 .num_experts_per_tok = 1,
                 .max_position_embeddings = 256};
  config.shared_expert_intermediate_size = 16;
  config.linear = {.num_key_heads = 2,
                   .num_value_heads = 4,
                   .key_head_dim = 16,
                   .value_head_dim = 8,
                   .conv_kernel = 4};
  config.layer_types = {worker::LayerType::kLinearAttention, worker::LayerType::kFullAttention};
  return config;
}

TEST(DeviceLinearAttentionStateTest, CreateAnswersForThisBuildAndMachine) {
  worker::Qwen3NextConfig bad = SmallConfig();
  bad.linear.num_value_heads = 3;
  EXPECT_THAT(worker::DeviceLinearAttentionState::Create(0, bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<worker::DeviceLinearAttentionState> state =
      worker::DeviceLinearAttentionState::Create(0, SmallConfig());
  if (!BuiltWithCuda()) {
    EXPECT_THAT(state,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("built without CUDA")));
  } else if (!CudaDeviceAvailable()) {
    EXPECT_THAT(state, StatusIs(absl::StatusCode::kFailedPrecondition));
  } else {
    ASSERT_OK(state);
    EXPECT_EQ(state->StateBytes(), worker::LinearAttentionState::StateBytes(SmallConfig()));
  }
}

#if KVCACHE_WITH_CUDA

using ::kvcache::testing::DeviceArray;
using ::kvcache::testing::ExpectAllNear;

constexpr float kNear = 1e-5f;
constexpr float kRecurrent = 2e-5f;

GatedDeltaRuleShape ShapeOf(const LinearAttentionDims& dims) {
  return {dims.num_key_heads, dims.num_value_heads, dims.key_head_dim, dims.value_head_dim};
}

// One layer's inputs for n tokens: conv input [n, conv_dim], weights, gates.
struct LayerInputs {
  LayerInputs(const LinearAttentionDims& d, uint32_t tokens, uint32_t seed)
      : dims(d),
        n(tokens),
        input(RandomNormals(size_t{n} * d.conv_dim(), seed)),
        weight(RandomNormals(size_t{d.conv_dim()} * d.conv_kernel, seed + 1, 0.5f)),
        a(RandomNormals(size_t{n} * d.num_value_heads, seed + 2)),
        b(RandomNormals(size_t{n} * d.num_value_heads, seed + 3)),
        a_log(RandomNormals(d.num_value_heads, seed + 4, 0.5f)),
        dt_bias(RandomNormals(d.num_value_heads, seed + 5, 0.5f)) {}

  LinearAttentionDims dims;
  uint32_t n;
  std::vector<float> input, weight, a, b, a_log, dt_bias;
};

// The layer on the device, tokens [begin, end), carrying `conv_state` and `state` (device).
void RunOnDevice(const LayerInputs& in, uint32_t begin, uint32_t end,
                 const DeviceArray<float>& input, const DeviceArray<float>& weight,
                 const DeviceArray<float>& a, const DeviceArray<float>& b,
                 const DeviceArray<float>& a_log, const DeviceArray<float>& dt_bias,
                 float* conv_state, float* state, DeviceArray<float>& conv_out,
                 DeviceArray<float>& out) {
  const LinearAttentionDims& d = in.dims;
  const uint32_t count = end - begin;
  ASSERT_OK(CausalConv1dSiluCuda(input.get() + size_t{begin} * d.conv_dim(), weight.get(), count,
                                 d.conv_dim(), d.conv_kernel, conv_state,
                                 conv_out.get() + size_t{begin} * d.conv_dim(), nullptr));
  ASSERT_OK(GatedDeltaRuleCuda(ShapeOf(d), conv_out.get() + size_t{begin} * d.conv_dim(),
                               a.get() + size_t{begin} * d.num_value_heads,
                               b.get() + size_t{begin} * d.num_value_heads, a_log.get(),
                               dt_bias.get(), count, state,
                               out.get() + size_t{begin} * d.value_dim(), nullptr));
}

class LinearAttentionKernelsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

const LinearAttentionDims kShapes[] = {
    {.num_key_heads = 2,
     .num_value_heads = 4,
     .key_head_dim = 16,
     .value_head_dim = 16,
     .conv_kernel = 4},
    {.num_key_heads = 1,
     .num_value_heads = 1,
     .key_head_dim = 128,
     .value_head_dim = 128,
     .conv_kernel = 4},
    {.num_key_heads = 2,
     .num_value_heads = 6,
     .key_head_dim = 32,
     .value_head_dim = 40,
     .conv_kernel = 2},
    {.num_key_heads = 3,
     .num_value_heads = 3,
     .key_head_dim = 8,
     .value_head_dim = 300,
     .conv_kernel = 1},
};

std::string Describe(const LinearAttentionDims& d) {
  return absl::StrCat("nk=", d.num_key_heads, " nv=", d.num_value_heads, " hk=", d.key_head_dim,
                      " hv=", d.value_head_dim, " K=", d.conv_kernel);
}

TEST_F(LinearAttentionKernelsGpuTest, MatchesTheCpuReference) {
  uint32_t seed = 10;
  for (const LinearAttentionDims& d : kShapes) {
    const std::string what = Describe(d);
    const LayerInputs in(d, 29, seed += 10);
    // Non-zero starting window and state, as after a restored prefix.
    std::vector<float> conv_state = RandomNormals(d.conv_floats(), seed + 6);
    std::vector<float> state = RandomNormals(d.recurrent_floats(), seed + 7, 0.1f);
    DeviceArray<float> input(in.input), weight(in.weight), a(in.a), b(in.b), a_log(in.a_log),
        dt_bias(in.dt_bias), d_conv_state(conv_state), d_state(state);
    DeviceArray<float> conv_out(size_t{in.n} * d.conv_dim()), out(size_t{in.n} * d.value_dim());
    RunOnDevice(in, 0, in.n, input, weight, a, b, a_log, dt_bias, d_conv_state.get(), d_state.get(),
                conv_out, out);

    std::vector<float> want_conv(size_t{in.n} * d.conv_dim()), want(size_t{in.n} * d.value_dim());
    worker::CausalConv1dSilu(in.input.data(), in.weight.data(), in.n, d.conv_dim(), d.conv_kernel,
                             conv_state.data(), want_conv.data());
    ExpectAllNear(conv_out.Download(), want_conv, kNear, what + " conv");
    EXPECT_EQ(d_conv_state.Download(), conv_state) << what << " window";
    // The rule on the GPU's own conv output, so that only the rule's differences count.
    const std::vector<float> gpu_conv = conv_out.Download();
    worker::GatedDeltaRule(d, gpu_conv.data(), in.a.data(), in.b.data(), in.a_log.data(),
                           in.dt_bias.data(), in.n, state.data(), want.data());
    ExpectAllNear(out.Download(), want, kRecurrent, what + " output");
    ExpectAllNear(d_state.Download(), state, kRecurrent, what + " state");
  }
}

TEST_F(LinearAttentionKernelsGpuTest, SplitRunsAreBitIdenticalOnTheGpu) {
  uint32_t seed = 100;
  for (const LinearAttentionDims& d : kShapes) {
    const std::string what = Describe(d);
    const LayerInputs in(d, 33, seed += 10);
    DeviceArray<float> input(in.input), weight(in.weight), a(in.a), b(in.b), a_log(in.a_log),
        dt_bias(in.dt_bias);
    const auto run = [&](const std::vector<uint32_t>& cuts, std::vector<float>& out,
                         std::vector<float>& window, std::vector<float>& state) {
      DeviceArray<float> d_window(std::vector<float>(d.conv_floats(), 0.0f));
      DeviceArray<float> d_state(std::vector<float>(d.recurrent_floats(), 0.0f));
      DeviceArray<float> conv_out(size_t{in.n} * d.conv_dim()), d_out(size_t{in.n} * d.value_dim());
      uint32_t begin = 0;
      for (uint32_t end : cuts) {
        RunOnDevice(in, begin, end, input, weight, a, b, a_log, dt_bias, d_window.get(),
                    d_state.get(), conv_out, d_out);
        begin = end;
      }
      out = d_out.Download();
      window = d_window.Download();
      state = d_state.Download();
    };
    std::vector<float> out_once, window_once, state_once;
    run({in.n}, out_once, window_once, state_once);
    std::vector<uint32_t> token_by_token;
    for (uint32_t t = 1; t <= in.n; ++t) token_by_token.push_back(t);
    for (const std::vector<uint32_t>& cuts :
         {std::vector<uint32_t>{16, in.n}, std::vector<uint32_t>{1, 17, 32, in.n},
          std::vector<uint32_t>{16, 17, 18, 19, in.n}, token_by_token}) {
      std::vector<float> out, window, state;
      run(cuts, out, window, state);
      const std::string where = absl::StrCat(what, " cut at ", cuts.front());
      EXPECT_EQ(std::memcmp(out.data(), out_once.data(), out.size() * sizeof(float)), 0) << where;
      EXPECT_EQ(std::memcmp(window.data(), window_once.data(), window.size() * sizeof(float)), 0)
          << where;
      EXPECT_EQ(std::memcmp(state.data(), state_once.data(), state.size() * sizeof(float)), 0)
          << where;
    }
  }
}

// x * sigmoid(g) and x * SiLU(g), as the CPU model's gates (one rounded product each).
TEST_F(LinearAttentionKernelsGpuTest, GatesMatchTheCpu) {
  for (const size_t count : {size_t{1}, size_t{257}, size_t{100000}}) {
    const std::vector<float> x = RandomNormals(count, 40, 2.0f);
    const std::vector<float> gate = RandomNormals(count, 41, 4.0f);
    for (GateActivation activation : {GateActivation::kSigmoid, GateActivation::kSilu}) {
      DeviceArray<float> d_x(x), d_gate(gate);
      ASSERT_OK(GateMultiplyCuda(d_x.get(), d_gate.get(), count, activation, nullptr));
      std::vector<float> want = x;
      for (size_t i = 0; i < count; ++i) {
        want[i] = want[i] * (activation == GateActivation::kSigmoid ? worker::Sigmoid(gate[i])
                                                                    : worker::Silu(gate[i]));
      }
      ExpectAllNear(
          d_x.Download(), want, kNear,
          absl::StrCat(count, activation == GateActivation::kSilu ? " silu" : " sigmoid"));
    }
  }
}

// A host state's bytes restored onto the device drive the kernels exactly where the CPU functions
// find the same layer's state on the host, and come back in the same layout.
TEST_F(LinearAttentionKernelsGpuTest, DeviceStateHasTheHostByteLayout) {
  const worker::Qwen3NextConfig config = SmallConfig();
  const LinearAttentionDims& d = config.linear;
  worker::LinearAttentionState host(config);
  const std::vector<float> recurrent = RandomNormals(d.recurrent_floats(), 7, 0.1f);
  const std::vector<float> window = RandomNormals(d.conv_floats(), 8);
  std::copy(recurrent.begin(), recurrent.end(), host.recurrent(0));
  std::copy(window.begin(), window.end(), host.conv(0));
  std::vector<uint8_t> bytes(host.StateBytes());
  ASSERT_OK(host.SaveTo(absl::MakeSpan(bytes)));

  absl::StatusOr<worker::DeviceLinearAttentionState> device =
      worker::DeviceLinearAttentionState::Create(0, config);
  ASSERT_OK(device);
  ASSERT_OK(device->RestoreFrom(bytes, 48, nullptr));
  EXPECT_EQ(device->position(), 48u);
  std::vector<uint8_t> round_trip(device->StateBytes());
  ASSERT_OK(device->SaveTo(absl::MakeSpan(round_trip), nullptr));
  EXPECT_EQ(round_trip, bytes);

  const LayerInputs in(d, 9, 300);
  DeviceArray<float> input(in.input), weight(in.weight), a(in.a), b(in.b), a_log(in.a_log),
      dt_bias(in.dt_bias);
  DeviceArray<float> conv_out(size_t{in.n} * d.conv_dim()), out(size_t{in.n} * d.value_dim());
  RunOnDevice(in, 0, in.n, input, weight, a, b, a_log, dt_bias, device->conv(0),
              device->recurrent(0), conv_out, out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<float> want_conv(size_t{in.n} * d.conv_dim()), want(size_t{in.n} * d.value_dim());
  worker::CausalConv1dSilu(in.input.data(), in.weight.data(), in.n, d.conv_dim(), d.conv_kernel,
                           host.conv(0), want_conv.data());
  const std::vector<float> gpu_conv = conv_out.Download();
  worker::GatedDeltaRule(d, gpu_conv.data(), in.a.data(), in.b.data(), in.a_log.data(),
                         in.dt_bias.data(), in.n, host.recurrent(0), want.data());
  ExpectAllNear(out.Download(), want, kRecurrent, "output");

  ASSERT_OK(device->SaveTo(absl::MakeSpan(round_trip), nullptr));
  worker::LinearAttentionState from_device(config);
  ASSERT_OK(from_device.RestoreFrom(round_trip, 57));
  ExpectAllNear(std::vector<float>(from_device.values().begin(), from_device.values().end()),
                std::vector<float>(host.values().begin(), host.values().end()), kRecurrent,
                "state after the run");
  EXPECT_THAT(device->SaveTo(absl::MakeSpan(round_trip).first(8), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::kernels
