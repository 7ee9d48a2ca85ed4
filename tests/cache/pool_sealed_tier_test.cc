// A pool whose disk tier is sealed (PoolOptions::tier_keyring): the blocks a tenant computes go
// down sealed for that tenant and come back with identical bytes, across a restart with the same
// keys; a restart with another master key serves nothing from disk; a record that does not open
// is a miss, recomputed, counted in the tenant's own stats and nobody else's.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cache/pool.h"
#include "tests/testing/pool_memories.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_keys.h"

namespace kvcache {
namespace {

using ::kvcache::testing::Tokens;

constexpr uint32_t kBlockSize = 4;

TierMasterKey Key(uint32_t id, char fill) { return testing::TestTierKey(id, fill); }
std::shared_ptr<const TierKeyring> Keyring(std::vector<TierMasterKey> keys) {
  return testing::TestTierKeyring(std::move(keys));
}

const TierStatsRow* Row(const PoolStatsSnapshot& stats, absl::string_view tier) {
  for (const TierStatsRow& row : stats.tiers) {
    if (row.tier == tier) return &row;
  }
  return nullptr;
}

class PoolSealedTierTest : public ::testing::Test {
 protected:
  // An 8-block pool over an 8-slot tier 2 over a sealed disk tier of 64 records.
  void MakePool(std::shared_ptr<const TierKeyring> keyring) {
    pool_.reset();
    PoolOptions options = testing::SmallPoolOptions("sealed", 8, kBlockSize);
    options.host_tier_bytes = 8 * options.layout.BlockBytes();
    options.testing_manual_offload = true;
    options.disk_tier_path = dir_.File("pool.tier");
    options.disk_tier_bytes = 64 * (4096 + 4096);
    options.tier_keyring = std::move(keyring);
    options.workers = workers_;
    block_bytes_ = options.layout.BlockBytes();
    auto memory = testing::CreatePoolMemory(testing::PoolMemoryKind::kHost, block_bytes_, 8);
    ASSERT_OK(memory);
    auto pool = Pool::Create(options, 0, *std::move(memory));
    ASSERT_OK(pool);
    pool_ = *std::move(pool);
  }
  void TearDown() override {
    if (pool_ != nullptr) {
      EXPECT_OK(pool_->CheckInvariants());
    }
  }

  // The bytes a worker would write for block `i` of `tokens`: a function of its tokens.
  std::string BlockBytes(const std::vector<uint32_t>& tokens, size_t i) const {
    return testing::TokenBlockBytes(tokens, i, kBlockSize, block_bytes_);
  }

  absl::StatusOr<OpenedSequence> Open(const Session& session, const std::vector<uint32_t>& tokens) {
    return pool_->Open(session, SequenceSpec{.tokens = tokens});
  }

  // Opens, writes every full block not cached, commits and releases; the open's result.
  OpenedSequence Compute(const Session& session, const std::vector<uint32_t>& tokens) {
    absl::StatusOr<OpenedSequence> opened = Open(session, tokens);
    EXPECT_OK(opened);
    if (!opened.ok()) return {};
    for (size_t i = opened->num_cached_tokens / kBlockSize; i < tokens.size() / kBlockSize; ++i) {
      EXPECT_OK(pool_->WriteBlock(opened->block_ids[i], 0, BlockBytes(tokens, i)));
    }
    EXPECT_OK(pool_->Commit(session, opened->sequence_id, tokens.size()));
    EXPECT_OK(pool_->Release(session, opened->sequence_id));
    return *opened;
  }

  // `tokens` computed by `session`, then on disk only (out of tiers 1 and 2).
  void ComputeIntoDiskOnly(const Session& session, const std::vector<uint32_t>& tokens) {
    Compute(session, tokens);
    pool_->OffloadForTesting();
    pool_->disk_tier()->Flush();
    Compute(other_, Tokens(500, 32));
    pool_->OffloadForTesting();
    pool_->disk_tier()->Flush();
  }

  std::string ReadBack(BlockId block) {
    std::string bytes(block_bytes_, '\0');
    EXPECT_OK(pool_->ReadBlock(block, 0, block_bytes_, bytes.data()));
    return bytes;
  }

  std::string DiskFile() const {
    std::ifstream in(dir_.File("pool.tier"), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    return bytes.str();
  }

  ::kvcache::testing::ScopedTempDir dir_{"kvcache-pool-sealed"};
  Session acme_{1, "uid:1", "acme", "test", absl::Seconds(10)};
  Session other_{2, "uid:2", "globex", "test", absl::Seconds(10)};
  uint64_t block_bytes_ = 0;
  std::shared_ptr<const TierKeyring> keys_ = Keyring({Key(1, 'k')});
  std::shared_ptr<TaskWorkers> workers_ = std::make_shared<TaskWorkers>(1);
  std::unique_ptr<Pool> pool_;
};

TEST_F(PoolSealedTierTest, ATenantsBlocksGoDownSealedAndComeBackIdentical) {
  MakePool(keys_);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(acme_, a);
  // Each record carries, and is sealed for, the tenant whose block it was.
  size_t acme_records = 0;
  for (const BlockRecordIdentity& record : pool_->disk_tier()->Records()) {
    EXPECT_THAT(record.tenant, ::testing::AnyOf("acme", "globex"));
    acme_records += record.tenant == "acme";
  }
  EXPECT_EQ(acme_records, 4u);
  const std::string file = DiskFile();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(file.find(BlockBytes(a, i).substr(0, 32)), std::string::npos) << "block " << i;
  }

  auto opened = Open(acme_, a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_disk_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i));
  ASSERT_OK(pool_->Release(acme_, opened->sequence_id));

  // A restart with the same key file: the same records, the same bytes.
  pool_.reset();
  MakePool(keys_);
  EXPECT_EQ(pool_->Stats().disk_tier->store.restart_records, 12u);
  auto again = Open(acme_, a);
  ASSERT_OK(again);
  EXPECT_EQ(again->num_disk_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ReadBack(again->block_ids[i]), BlockBytes(a, i));
  EXPECT_EQ(pool_->lower_tiers().SealedTiers(), std::vector<absl::string_view>{"disk"});
}

TEST_F(PoolSealedTierTest, ARestartWithAnotherMasterKeyServesNothingFromDisk) {
  MakePool(keys_);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(acme_, a);
  pool_.reset();
  MakePool(Keyring({Key(1, 'x')}));
  const PoolStatsSnapshot stats = pool_->Stats();
  EXPECT_EQ(stats.disk_tier->store.restart_records, 0u);
  EXPECT_EQ(stats.disk_tier->store.restart_unopened, 12u);
  EXPECT_EQ(Row(stats, "disk")->restore_skipped, 12u);
  auto opened = Open(acme_, a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 0u);
  ASSERT_OK(pool_->Release(acme_, opened->sequence_id));
}

TEST_F(PoolSealedTierTest, ARecordThatDoesNotOpenIsRecomputedAndCountedForItsTenantOnly) {
  MakePool(keys_);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(acme_, a);
  // Slots hold A3, A2, A1, A0 from slot 0 (passed down tail first): A1's bytes change.
  const uint64_t slot_bytes = pool_->disk_tier()->slot_bytes();
  const int fd = ::open(dir_.File("pool.tier").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte = 0;
  const off_t offset = static_cast<off_t>(2 * slot_bytes + 4096 + 9);
  ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
  byte ^= 0x04;
  ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
  ::close(fd);

  auto opened = Open(acme_, a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 4u);  // A0; A1 on is computed
  EXPECT_EQ(ReadBack(opened->block_ids[0]), BlockBytes(a, 0));
  ASSERT_OK(pool_->Release(acme_, opened->sequence_id));
  EXPECT_EQ(Row(pool_->Stats("acme"), "disk")->open_failures, 1u);
  EXPECT_EQ(Row(pool_->Stats("globex"), "disk")->open_failures, 0u);
  EXPECT_EQ(Row(pool_->Stats(), "disk")->open_failures, 1u);
  EXPECT_EQ(Row(pool_->Stats(), "disk")->verify_failures, 0u);  // not a checksum failure
  const std::vector<LowerTiers::TenantOpenFailures> failures =
      pool_->lower_tiers().OpenFailuresByTenant();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].tier, "disk");
  EXPECT_EQ(failures[0].tenant, "acme");
  EXPECT_EQ(failures[0].count, 1u);
}

}  // namespace
}  // namespace kvcache
