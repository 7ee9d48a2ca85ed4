// KvWorker (worker/kv_worker.h) against in-process daemons; label unit, runs on every build and
// machine.
//
// Host pools (a real daemon, --device host): the worker computes with the CPU model; a cold
// generation, a prefix hit on the same prompt and a hit of a longer prompt on blocks committed
// during decode are all bit-identical to the cold reference (GenerateColdReference, which for a
// host pool is GenerateCold). A pool laid out for another model is FAILED_PRECONDITION.
//
// Device pools: a fake daemon describes a CUDA IPC pool on a device no machine has (cuda:4096).
// Create refuses it with FAILED_PRECONDITION whatever the build and machine — "built without
// CUDA" without CUDA, no usable device without a GPU, no such device with one — and so never
// reaches the CPU model with device addresses. (That the GPU path computes correctly needs a GPU:
// tests/integration/worker_gpu_process_test.cc.)
#include "worker/kv_worker.h"

#include <gmock/gmock.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cache/pool_spec.h"
#include "client/kv_cache_client.h"
#include "server/daemon.h"
#include "tests/testing/fake_session_service.h"
#include "tests/testing/in_process_daemon.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "worker/generation.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using ::kvcache::worker::testing::TinyModel;

constexpr uint32_t kBlockSize = 16;

void ExpectSameGeneration(const GenerationResult& got, const GenerationResult& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logits_digest, want.logits_digest);
}

// A daemon with host pools: "qwen", laid out for the tiny model, and "default", which is not.
class KvWorkerHostPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<PoolOptions> qwen = ParsePoolSpec(
        "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=16:dtype=bf16:blocks=32");
    ASSERT_OK(qwen);
    ASSERT_NO_FATAL_FAILURE(daemon_.Start({*qwen, DefaultPoolOptions()}, "kv_worker_test"));
    client_ = daemon_.client();
  }
  void TearDown() override { daemon_.Stop(); }

  ::kvcache::testing::InProcessDaemon daemon_;
  KvCacheClient* client_ = nullptr;
};

TEST_F(KvWorkerHostPoolTest, CpuModelOverTheHostPoolMatchesTheColdReference) {
  absl::StatusOr<std::unique_ptr<KvWorker>> worker =
      KvWorker::Create(client_, "qwen", &TinyModel());
  ASSERT_OK(worker);
  EXPECT_FALSE((*worker)->on_device());
  EXPECT_FALSE((*worker)->mapped().is_device());

  // 40 prompt tokens and 30 generated: decode crosses the block boundaries at 48 and 64.
  const std::vector<uint32_t> prompt = testing::MakePrompt(40, 7);
  constexpr uint32_t kNewTokens = 30;
  Sampler cold_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> cold =
      (*worker)->GenerateColdReference(prompt, kNewTokens, cold_sampler);
  ASSERT_OK(cold);
  // For a host pool the reference is the CPU cold run.
  Sampler cpu_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> cpu =
      GenerateCold(TinyModel(), prompt, kNewTokens, cpu_sampler, kBlockSize, DType::kBFloat16);
  ASSERT_OK(cpu);
  ExpectSameGeneration(*cold, *cpu);

  Sampler first_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> first = (*worker)->Generate(prompt, kNewTokens, first_sampler);
  ASSERT_OK(first);
  EXPECT_EQ(first->cached_tokens, 0u);
  ExpectSameGeneration(*first, *cold);

  Sampler hit_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> hit = (*worker)->Generate(prompt, kNewTokens, hit_sampler);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->cached_tokens, 32u);
  ExpectSameGeneration(*hit, *cold);

  // The blocks filled during decode were committed: the conversation so far hits up to 64.
  std::vector<uint32_t> next = prompt;
  next.insert(next.end(), first->tokens.begin(), first->tokens.end() - 1);  // 69 tokens
  next.push_back(3);
  Sampler next_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> continued = (*worker)->Generate(next, 5, next_sampler);
  ASSERT_OK(continued);
  EXPECT_EQ(continued->cached_tokens, 64u);
  Sampler next_cold_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> continued_cold =
      (*worker)->GenerateColdReference(next, 5, next_cold_sampler);
  ASSERT_OK(continued_cold);
  ExpectSameGeneration(*continued, *continued_cold);
}

TEST_F(KvWorkerHostPoolTest, PoolOfAnotherModelIsFailedPrecondition) {
  EXPECT_THAT(KvWorker::Create(client_, "default", &TinyModel()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("laid out for")));
  EXPECT_THAT(KvWorker::Create(client_, "nope", &TinyModel()),
              StatusIs(absl::StatusCode::kNotFound));
}

// Describes one pool, "gpu": the tiny model's layout in device memory (CUDA IPC) on cuda:4096.
class FakeDevicePoolDaemon final : public kvcache::testing::FakeSessionService {
 public:
  FakeDevicePoolDaemon() : FakeSessionService(/*epoch=*/5, GpuPool()) {}

  static constexpr int kDevice = 4096;
  static constexpr uint32_t kBlocks = 8;

 private:
  static v1::PoolInfo GpuPool() {
    const PoolLayout layout = TinyModel().KvLayout(kBlockSize, DType::kBFloat16);
    v1::PoolInfo pool = ::kvcache::testing::FakePool(layout, kBlocks);
    pool.set_name("gpu");
    pool.set_model_id("tiny");
    pool.set_memory_kind("cuda");
    v1::PoolMapping* mapping = pool.mutable_mapping();
    mapping->set_kind(v1::PoolMapping::KIND_CUDA_IPC);
    mapping->set_size_bytes(uint64_t{kBlocks} * layout.BlockBytes());
    mapping->set_cuda_ipc_handle(std::string(64, '\x5a'));  // never opened: no such device
    mapping->set_cuda_device(kDevice);
    return pool;
  }
};

TEST(KvWorkerDevicePoolTest, DevicePoolThisProcessCannotUseIsFailedPrecondition) {
  ScopedTempDir dir("kvcache_kv_worker_fake");
  const std::string address = "unix://" + dir.File("fake.sock");
  FakeDevicePoolDaemon service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(address);
    ASSERT_OK(client);
    ASSERT_OK((*client)->OpenSession("", "kv_worker_test"));
    absl::StatusOr<KvCacheClient::PoolDescription> described = (*client)->DescribePool("gpu");
    ASSERT_OK(described);
    ASSERT_EQ(described->pool.mapping.kind, KvCacheClient::PoolMapping::Kind::kCudaIpc);

    absl::StatusOr<std::unique_ptr<KvWorker>> worker =
        KvWorker::Create(client->get(), "gpu", &TinyModel());
    EXPECT_THAT(worker, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 AllOf(HasSubstr("gpu"), Not(HasSubstr("laid out for")))));
    if (!MappedPool::BuiltWithCuda()) {
      EXPECT_THAT(worker,
                  StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("built without CUDA")));
    }
  }
  server->Shutdown();
}

}  // namespace
}  // namespace kvcache::worker
