// MappedPool against a real in-process daemon: the shm pool is mapped, typed K/V spans land on
// the layout's offsets (written through one mapping, read through another and through the
// daemon's own memory), and every misuse gets its exact code.
#include "client/mapped_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::Each;
using ::testing::Eq;

class MappedPoolTest : public kvcache::testing::DaemonFixture {
 protected:
  KvCacheClient::PoolDescription Describe(absl::string_view pool = "default") {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool(pool);
    EXPECT_OK(described);
    return described.ok() ? *described : KvCacheClient::PoolDescription{};
  }

  std::unique_ptr<MappedPool> MapOrDie(const KvCacheClient::PoolDescription& described) {
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(described);
    EXPECT_OK(mapped);
    return mapped.ok() ? *std::move(mapped) : nullptr;
  }

  // The daemon's own view of bytes in its pool.
  std::string DaemonBytes(uint32_t block, uint64_t offset, uint64_t size) {
    std::string bytes(size, '\0');
    Pool* pool = *daemon_->manager().FindPool("default");
    EXPECT_OK(pool->memory().Read(block, offset, size, bytes.data()));
    return bytes;
  }
};

TEST_F(MappedPoolTest, DescriptionCarriesTheShmMappingAndEpoch) {
  const KvCacheClient::PoolDescription described = Describe();
  EXPECT_EQ(described.epoch, daemon_->manager().epoch());
  const KvCacheClient::PoolMapping& mapping = described.pool.mapping;
  EXPECT_EQ(mapping.kind, KvCacheClient::PoolMapping::Kind::kShm);
  EXPECT_EQ(mapping.shm_name.front(), '/');
  EXPECT_EQ(mapping.size_bytes, uint64_t{kDefaultBlocks} * described.pool.block_bytes);
  absl::StatusOr<std::vector<KvCacheClient::PoolInfo>> pools = client_->ListPools();
  ASSERT_OK(pools);
  ASSERT_EQ(pools->size(), 3u);  // default, tiny, large
  EXPECT_EQ((*pools)[0].mapping.shm_name, mapping.shm_name);
  EXPECT_NE((*pools)[1].mapping.shm_name, mapping.shm_name);
  EXPECT_NE((*pools)[2].mapping.shm_name, mapping.shm_name);
}

TEST_F(MappedPoolTest, MapsThePoolTheDaemonServes) {
  const KvCacheClient::PoolDescription described = Describe();
  std::unique_ptr<MappedPool> mapped = MapOrDie(described);
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->name(), "default");
  EXPECT_EQ(mapped->epoch(), daemon_->manager().epoch());
  EXPECT_EQ(mapped->num_blocks(), kDefaultBlocks);
  EXPECT_EQ(mapped->block_bytes(), described.pool.block_bytes);
  EXPECT_EQ(mapped->layout().BlockBytes(), described.pool.block_bytes);

  // Both directions: a write through the mapping is the daemon's memory, and back.
  const std::string written = "kv bytes through the mapping";
  std::memcpy(mapped->Block(5) + 100, written.data(), written.size());
  EXPECT_EQ(DaemonBytes(5, 100, written.size()), written);
  Pool* pool = *daemon_->manager().FindPool("default");
  ASSERT_OK(pool->memory().Write(kDefaultBlocks - 1, 0, "from the daemon"));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mapped->Block(kDefaultBlocks - 1)), 15),
            "from the daemon");
}

TEST_F(MappedPoolTest, KeysAndValuesAreTheLayersSlicesOfTheBlock) {
  const KvCacheClient::PoolDescription described = Describe();
  // Two independent mappings of the same object, as two processes would have.
  std::unique_ptr<MappedPool> writer = MapOrDie(described);
  std::unique_ptr<MappedPool> reader = MapOrDie(described);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  ASSERT_NE(writer->Block(0), reader->Block(0));
  const PoolLayout& layout = described.pool.layout;
  ASSERT_EQ(DTypeBytes(layout.dtype), sizeof(uint16_t));
  const size_t elements = size_t{layout.block_size} * layout.num_kv_heads * layout.head_dim;
  constexpr uint32_t kBlock = 3;

  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    absl::StatusOr<absl::Span<uint16_t>> keys = writer->Keys<uint16_t>(kBlock, layer);
    absl::StatusOr<absl::Span<uint16_t>> values = writer->Values<uint16_t>(kBlock, layer);
    ASSERT_OK(keys);
    ASSERT_OK(values);
    ASSERT_EQ(keys->size(), elements);
    ASSERT_EQ(values->size(), elements);
    // [token][kv_head][head_dim]: element (t, h, d) of K and V tagged with everything.
    for (uint32_t t = 0; t < layout.block_size; ++t) {
      for (uint32_t h = 0; h < layout.num_kv_heads; ++h) {
        for (uint32_t d = 0; d < layout.head_dim; ++d) {
          const size_t i = (size_t{t} * layout.num_kv_heads + h) * layout.head_dim + d;
          (*keys)[i] = static_cast<uint16_t>((layer << 12) | (t << 8) | (h << 7) | d);
          (*values)[i] = static_cast<uint16_t>(~(*keys)[i]);
        }
      }
    }
  }

  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    absl::StatusOr<absl::Span<uint16_t>> keys = reader->Keys<uint16_t>(kBlock, layer);
    absl::StatusOr<absl::Span<uint16_t>> values = reader->Values<uint16_t>(kBlock, layer);
    ASSERT_OK(keys);
    ASSERT_OK(values);
    // The spans sit at the layout's offsets in the block.
    EXPECT_EQ(reinterpret_cast<uint8_t*>(keys->data()),
              reader->Block(kBlock) + layout.KvOffset(layer, 0));
    EXPECT_EQ(reinterpret_cast<uint8_t*>(values->data()),
              reader->Block(kBlock) + layout.KvOffset(layer, 1));
    for (uint32_t t = 0; t < layout.block_size; ++t) {
      for (uint32_t h = 0; h < layout.num_kv_heads; ++h) {
        for (uint32_t d = 0; d < layout.head_dim; ++d) {
          const size_t i = (size_t{t} * layout.num_kv_heads + h) * layout.head_dim + d;
          const uint16_t expected = static_cast<uint16_t>((layer << 12) | (t << 8) | (h << 7) | d);
          ASSERT_EQ((*keys)[i], expected) << "layer " << layer << " token " << t;
          ASSERT_EQ((*values)[i], static_cast<uint16_t>(~expected)) << "layer " << layer;
          // Token t, head h of layer `layer`'s K, in raw bytes at the documented offset.
          uint16_t raw = 0;
          std::memcpy(&raw,
                      reader->Block(kBlock) + layout.KvOffset(layer, 0) + t * layout.TokenBytes() +
                          (size_t{h} * layout.head_dim + d) * sizeof(uint16_t),
                      sizeof(raw));
          ASSERT_EQ(raw, expected);
        }
      }
    }
  }
  // K and V of all layers fill the block exactly; the neighbours were not touched.
  EXPECT_EQ(layout.KvOffset(layout.num_layers - 1, 1) + layout.block_size * layout.TokenBytes(),
            described.pool.block_bytes);
  absl::StatusOr<absl::Span<uint8_t>> before = reader->CheckedBlock(kBlock - 1);
  absl::StatusOr<absl::Span<uint8_t>> after = reader->CheckedBlock(kBlock + 1);
  ASSERT_OK(before);
  ASSERT_OK(after);
  EXPECT_THAT(*before, Each(Eq(0)));
  EXPECT_THAT(*after, Each(Eq(0)));
}

TEST_F(MappedPoolTest, WrongElementSizeAndOutOfRangeAreRejected) {
  std::unique_ptr<MappedPool> mapped = MapOrDie(Describe());
  ASSERT_NE(mapped, nullptr);
  const uint32_t layers = mapped->layout().num_layers;
  // fp16 pool: 2-byte elements only.
  EXPECT_THAT(mapped->Keys<float>(0, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(mapped->Values<uint8_t>(0, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(mapped->Keys<int16_t>(0, 0));
  EXPECT_OK(mapped->Values<uint16_t>(kDefaultBlocks - 1, layers - 1));
  EXPECT_THAT(mapped->Keys<uint16_t>(kDefaultBlocks, 0), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(mapped->Values<uint16_t>(0, layers), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(mapped->CheckedBlock(kDefaultBlocks), StatusIs(absl::StatusCode::kOutOfRange));
  absl::StatusOr<absl::Span<uint8_t>> last = mapped->CheckedBlock(kDefaultBlocks - 1);
  ASSERT_OK(last);
  EXPECT_EQ(last->size(), mapped->block_bytes());
  EXPECT_EQ(last->data(), mapped->Block(kDefaultBlocks - 1));
}

TEST_F(MappedPoolTest, UnmappablePoolsFailWithoutMapping) {
  KvCacheClient::PoolDescription described = Describe();
  described.pool.mapping.kind = KvCacheClient::PoolMapping::Kind::kNone;
  EXPECT_THAT(MappedPool::Map(described),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("GetBlocks")));
}

// A CUDA IPC description whose handle opens nothing: refused without CUDA or without a device
// with FAILED_PRECONDITION, and never mapped as host memory. (A real device pool is mapped in
// tests/integration/mapped_pool_gpu_test.cc: CUDA cannot open a handle in the process that
// exported it, so it needs a daemon process.)
TEST_F(MappedPoolTest, CudaIpcPoolWithoutCudaOrDeviceIsFailedPrecondition) {
  KvCacheClient::PoolDescription described = Describe();
  described.pool.mapping.kind = KvCacheClient::PoolMapping::Kind::kCudaIpc;
  described.pool.mapping.cuda_ipc_handle.assign(64, '\0');
  described.pool.mapping.cuda_device = 0;
  absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(described);
  if (!MappedPool::BuiltWithCuda()) {
    EXPECT_THAT(mapped, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 ::testing::HasSubstr("built without CUDA")));
  } else if (!CudaDeviceAvailable()) {
    EXPECT_THAT(mapped, StatusIs(absl::StatusCode::kFailedPrecondition,
                                 ::testing::HasSubstr("no CUDA device")));
  } else {
    // A handle of zeros names no allocation.
    EXPECT_FALSE(mapped.ok());
  }
  // A device this machine does not have.
  described.pool.mapping.cuda_device = 1 << 20;
  EXPECT_THAT(MappedPool::Map(described), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(MappedPoolTest, MalformedCudaIpcDescriptionIsInvalidInEveryBuild) {
  KvCacheClient::PoolDescription described = Describe();
  described.pool.mapping.kind = KvCacheClient::PoolMapping::Kind::kCudaIpc;
  described.pool.mapping.cuda_device = 0;
  described.pool.mapping.cuda_ipc_handle = "short";
  EXPECT_THAT(MappedPool::Map(described),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("64 bytes")));
  described.pool.mapping.cuda_ipc_handle.assign(64, '\0');
  described.pool.mapping.cuda_device = -1;
  EXPECT_THAT(MappedPool::Map(described), StatusIs(absl::StatusCode::kInvalidArgument));
  described.pool.mapping.cuda_device = 0;
  described.pool.block_bytes += 2;
  EXPECT_THAT(MappedPool::Map(described), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(MappedPoolTest, HostMappingIsNotDevice) {
  std::unique_ptr<MappedPool> mapped = MapOrDie(Describe());
  ASSERT_NE(mapped, nullptr);
  EXPECT_FALSE(mapped->is_device());
  EXPECT_EQ(mapped->device(), -1);
}

TEST_F(MappedPoolTest, SizeMismatchIsFailedPreconditionAndBadDescriptionInvalid) {
  const KvCacheClient::PoolDescription described = Describe();
  // A description of a smaller pool under the same name: the object is not that pool.
  KvCacheClient::PoolDescription smaller = described;
  smaller.pool.num_blocks = kDefaultBlocks / 2;
  smaller.pool.mapping.size_bytes = described.pool.mapping.size_bytes / 2;
  EXPECT_THAT(MappedPool::Map(smaller), StatusIs(absl::StatusCode::kFailedPrecondition));
  // The tiny pool's object under the default pool's description.
  KvCacheClient::PoolDescription swapped = described;
  swapped.pool.mapping.shm_name = Describe("tiny").pool.mapping.shm_name;
  EXPECT_THAT(MappedPool::Map(swapped), StatusIs(absl::StatusCode::kFailedPrecondition));

  KvCacheClient::PoolDescription inconsistent = described;
  inconsistent.pool.block_bytes += 2;
  EXPECT_THAT(MappedPool::Map(inconsistent), StatusIs(absl::StatusCode::kInvalidArgument));
  inconsistent = described;
  inconsistent.pool.num_blocks = kDefaultBlocks + 1;
  EXPECT_THAT(MappedPool::Map(inconsistent), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(MappedPoolTest, GoneShmIsNotFound) {
  KvCacheClient::PoolDescription described = Describe();
  KvCacheClient::PoolDescription missing = described;
  missing.pool.mapping.shm_name = "/kvcache.no-such-pool";
  EXPECT_THAT(MappedPool::Map(missing), StatusIs(absl::StatusCode::kNotFound));

  // A mapping made before the daemon stops stays readable; mapping afterwards is NOT_FOUND.
  std::unique_ptr<MappedPool> mapped = MapOrDie(described);
  ASSERT_NE(mapped, nullptr);
  std::memcpy(mapped->Block(0), "still here", 10);
  const uint64_t old_epoch = mapped->epoch();
  client_.reset();
  daemon_.reset();
  EXPECT_THAT(MappedPool::Map(described), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mapped->Block(0)), 10), "still here");

  // The restarted daemon's pool is another object of another epoch, under the same name (the
  // name is the listen address's and the pool's).
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  client_ = Connect();
  ASSERT_NE(client_, nullptr);
  const KvCacheClient::PoolDescription restarted = Describe();
  EXPECT_NE(restarted.epoch, old_epoch);
  EXPECT_EQ(restarted.pool.mapping.shm_name, described.pool.mapping.shm_name);
  std::unique_ptr<MappedPool> remapped = MapOrDie(restarted);
  ASSERT_NE(remapped, nullptr);
  EXPECT_EQ(remapped->epoch(), restarted.epoch);
  EXPECT_NE(std::memcmp(remapped->Block(0), "still here", 10), 0);
}

TEST_F(MappedPoolTest, CommittedKvWrittenInPlaceIsWhatTheNextHitReads) {
  ASSERT_OK(client_->OpenSession("", "writer"));
  std::unique_ptr<MappedPool> mapped = MapOrDie(Describe());
  ASSERT_NE(mapped, nullptr);
  const std::vector<uint32_t> prompt = Tokens(2 * kBlockSize + 3);
  absl::StatusOr<KvCacheClient::Sequence> first = client_->OpenSequence("default", prompt);
  ASSERT_OK(first);
  ASSERT_EQ(first->num_cached_tokens, 0u);
  for (size_t b = 0; b < first->block_ids.size(); ++b) {
    absl::StatusOr<absl::Span<uint8_t>> block = mapped->CheckedBlock(first->block_ids[b]);
    ASSERT_OK(block);
    std::memset(block->data(), static_cast<int>(0x40 + b), block->size());
  }
  ASSERT_OK(client_->CommitSequence(first->sequence_id, prompt.size()));
  ASSERT_OK(client_->ReleaseSequence(first->sequence_id));

  std::unique_ptr<KvCacheClient> other = Connect();
  ASSERT_OK(other->OpenSession("", "reader"));
  std::unique_ptr<MappedPool> other_mapping = MapOrDie(Describe());
  ASSERT_NE(other_mapping, nullptr);
  absl::StatusOr<KvCacheClient::Sequence> second = other->OpenSequence("default", prompt);
  ASSERT_OK(second);
  ASSERT_EQ(second->num_cached_tokens, 2 * kBlockSize);
  for (size_t b = 0; b < 2; ++b) {
    absl::StatusOr<absl::Span<uint8_t>> block = other_mapping->CheckedBlock(second->block_ids[b]);
    ASSERT_OK(block);
    EXPECT_THAT(*block, Each(Eq(0x40 + b))) << "block " << b;
  }
}

}  // namespace
}  // namespace kvcache
