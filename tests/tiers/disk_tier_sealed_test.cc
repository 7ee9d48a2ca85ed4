// The disk tier sealed (DiskTierOptions::keyring, tiers/record_seal.h): round trips, a restart
// with the keys, with the wrong ones and after a rotation, a byte flipped anywhere, another
// tenant asking, and files of the other sealing.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_keys.h"
#include "tests/tiers/test_blocks.h"
#include "tiers/disk_tier.h"
#include "tiers/io_ring.h"
#include "tiers/record_seal.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::kvcache::testing::TestBytes;
using ::kvcache::testing::TestHash;

constexpr uint64_t kSlotBytes = testing::kTestSlotBytes;
constexpr char kTenant[] = "acme";

TierMasterKey Key(uint32_t id, char fill) { return testing::TestTierKey(id, fill); }
std::shared_ptr<const TierKeyring> Keyring(std::vector<TierMasterKey> keys) {
  return testing::TestTierKeyring(std::move(keys));
}

BlockRecordIdentity Identity(uint64_t i, const std::string& tenant = kTenant) {
  BlockRecordIdentity identity = testing::TestIdentity(i);
  identity.tenant = tenant;
  return identity;
}

// Every case runs on io_uring and on the plain system calls.
class SealedDiskTierTest : public ::testing::TestWithParam<DiskTierOptions::Io> {
 protected:
  std::string path() const { return dir_.File("sealed.kvt"); }

  DiskTierOptions Options(std::shared_ptr<const TierKeyring> keyring) const {
    DiskTierOptions options = testing::TestTierOptions(path(), 32);
    options.io = GetParam();
    options.keyring = std::move(keyring);
    options.seal_workers = workers_;  // records read in place are opened on them
    return options;
  }

  std::unique_ptr<DiskTier> OpenTier(DiskTierOptions options) {
    auto tier = DiskTier::Open(std::move(options));
    EXPECT_OK(tier);
    return tier.ok() ? *std::move(tier) : nullptr;
  }

  // Stores blocks [first, end) for kTenant into a tier that is then closed.
  void StoreAndClose(std::shared_ptr<const TierKeyring> keyring, uint64_t first, uint64_t end) {
    auto tier = OpenTier(Options(std::move(keyring)));
    ASSERT_NE(tier, nullptr);
    for (uint64_t i = first; i < end; ++i) ASSERT_OK(Store(*tier, i));
  }

  static absl::Status Store(DiskTier& tier, uint64_t i) {
    return tier.Store(Identity(i), TestBytes(TestHash(i)));
  }

  // Loads block i for `tenant`; its bytes checked when OK.
  static absl::Status Load(DiskTier& tier, uint64_t i, const std::string& tenant = kTenant) {
    std::string out(testing::kTestBlockBytes, '\0');
    const absl::Status status = tier.Load(Identity(i, tenant), absl::MakeSpan(out));
    if (status.ok() && out != TestBytes(TestHash(i))) ADD_FAILURE() << "block " << i;
    return status;
  }

  std::string FileBytes() const {
    std::ifstream in(path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    return bytes.str();
  }

  void FlipByte(uint64_t offset) {
    const int fd = ::open(path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
    byte ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    ::close(fd);
  }

  // The key id the slot's head names (tiers/record_seal.h: bytes 8-11).
  uint32_t KeyIdOfSlot(uint64_t slot) const {
    const std::string bytes = FileBytes();
    uint32_t id = 0;
    for (int b = 0; b < 4; ++b) {
      id |= uint32_t{static_cast<unsigned char>(bytes[slot * kSlotBytes + 8 + b])} << (8 * b);
    }
    return id;
  }

  ScopedTempDir dir_{"kvcache-sealed-disk"};
  std::shared_ptr<const TierKeyring> keys_ = Keyring({Key(1, 'a')});
  std::shared_ptr<TaskWorkers> workers_ = std::make_shared<TaskWorkers>(2);
};

TEST_P(SealedDiskTierTest, RecordsRoundTripAndTheFileHoldsNothingInTheClear) {
  auto tier = OpenTier(Options(keys_));
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(tier->sealed());
  EXPECT_EQ(tier->slot_bytes(), kSlotBytes);  // the sealed head fits the header's 4 KiB
  for (uint64_t i = 0; i < 6; ++i) ASSERT_OK(Store(*tier, i));
  tier->Flush();
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_OK(tier->Find(TestHash(i)));
    EXPECT_EQ(*tier->Find(TestHash(i)), Identity(i));
    EXPECT_OK(Load(*tier, i));
  }
  EXPECT_EQ(tier->stats().load_hits, 6u);

  const std::string file = FileBytes();
  ASSERT_GE(file.size(), 6 * kSlotBytes);
  for (uint64_t i = 0; i < 6; ++i) {
    const std::string bytes = TestBytes(TestHash(i));
    for (size_t at = 0; at + 16 <= bytes.size(); at += 499) {
      ASSERT_EQ(file.find(bytes.substr(at, 16)), std::string::npos) << "block " << i;
    }
    const std::vector<uint32_t>& tokens = Identity(i).tokens;
    EXPECT_EQ(file.find(std::string(reinterpret_cast<const char*>(tokens.data()), 16)),
              std::string::npos);
  }
  EXPECT_EQ(file.find("tiny-qwen3-moe"), std::string::npos);
  EXPECT_EQ(file.find(kTenant), std::string::npos);
}

TEST_P(SealedDiskTierTest, AWarmRestartWithTheKeysServesTheRecordsAndTheirTenants) {
  StoreAndClose(keys_, 0, 8);
  auto tier = OpenTier(Options(keys_));
  ASSERT_NE(tier, nullptr);
  const DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.restart_records, 8u);
  EXPECT_EQ(stats.restart_unopened, 0u);
  for (const BlockRecordIdentity& record : tier->Records()) EXPECT_EQ(record.tenant, kTenant);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_OK(Load(*tier, i));
}

TEST_P(SealedDiskTierTest, AByteFlippedInAHeadOrABodyIsAMissCountedForTheTenant) {
  auto tier = OpenTier(Options(keys_));
  ASSERT_NE(tier, nullptr);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_OK(Store(*tier, i));
  tier->Flush();
  // A new file fills slots 0, 1, 2, ...: one flip in block 1's head (its encrypted record
  // header), one in block 2's bytes, one in block 3's last byte.
  FlipByte(tier->SlotOffset(1) + 400);
  FlipByte(tier->SlotOffset(2) + 4096 + 5000);
  FlipByte(tier->SlotOffset(3) + 4096 + testing::kTestBlockBytes - 1);
  EXPECT_OK(Load(*tier, 0));
  for (uint64_t i = 1; i < 4; ++i) {
    EXPECT_THAT(Load(*tier, i), StatusIs(absl::StatusCode::kUnauthenticated)) << i;
    // Dropped: never read again.
    EXPECT_THAT(Load(*tier, i), StatusIs(absl::StatusCode::kNotFound));
  }
  const DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.load_unopened, 3u);
  EXPECT_EQ(stats.load_hits, 1u);
  EXPECT_EQ(tier->open_failures().Of(kTenant), 3u);
  EXPECT_OK(tier->CheckInvariants());
}

TEST_P(SealedDiskTierTest, AFlippedHeadIsSkippedAtRestart) {
  StoreAndClose(keys_, 0, 3);
  FlipByte(1 * kSlotBytes + 30);  // block 1's tenant box
  auto tier = OpenTier(Options(keys_));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().restart_records, 2u);
  EXPECT_EQ(tier->stats().restart_unopened, 1u);
  EXPECT_THAT(Load(*tier, 1), StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(SealedDiskTierTest, ARecordSealedForAnotherTenantDoesNotOpenThoughEveryFieldMatches) {
  auto tier = OpenTier(Options(keys_));
  ASSERT_NE(tier, nullptr);
  ASSERT_OK(Store(*tier, 0));
  ASSERT_OK(Store(*tier, 1));
  tier->Flush();
  // Same hash, namespace digest, tokens, prefix digest: only the tenant asking differs.
  EXPECT_THAT(Load(*tier, 0, "globex"), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_EQ(tier->open_failures().Of("globex"), 1u);
  EXPECT_EQ(tier->open_failures().Of(kTenant), 0u);
  EXPECT_OK(Load(*tier, 1));
}

TEST_P(SealedDiskTierTest, ARestartWithTheWrongMasterKeyServesNothing) {
  StoreAndClose(keys_, 0, 5);
  for (auto wrong : {Keyring({Key(1, 'z')}), Keyring({Key(9, 'a')})}) {
    auto tier = OpenTier(Options(wrong));
    ASSERT_NE(tier, nullptr);
    const DiskTierStats stats = tier->stats();
    EXPECT_EQ(stats.restart_records, 0u);
    EXPECT_EQ(stats.restart_unopened, 5u);
    EXPECT_EQ(stats.records, 0u);
    for (uint64_t i = 0; i < 5; ++i) {
      EXPECT_THAT(Load(*tier, i), StatusIs(absl::StatusCode::kNotFound));
    }
  }
}

TEST_P(SealedDiskTierTest, RotationKeepsOldRecordsReadableAndSealsNewOnesWithTheNewKey) {
  StoreAndClose(keys_, 0, 4);
  const auto rotated = Keyring({Key(2, 'b'), Key(1, 'a')});
  {
    auto tier = OpenTier(Options(rotated));
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->stats().restart_records, 4u);
    for (uint64_t i = 0; i < 4; ++i) EXPECT_OK(Load(*tier, i));
    for (uint64_t i = 4; i < 8; ++i) ASSERT_OK(Store(*tier, i));
    tier->Flush();
  }
  for (uint64_t slot = 0; slot < 4; ++slot) EXPECT_EQ(KeyIdOfSlot(slot), 1u);
  for (uint64_t slot = 4; slot < 8; ++slot) EXPECT_EQ(KeyIdOfSlot(slot), 2u);
  // Key 1 removed from the file: its records no longer open; key 2's do.
  auto tier = OpenTier(Options(Keyring({Key(2, 'b')})));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().restart_records, 4u);
  EXPECT_EQ(tier->stats().restart_unopened, 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_THAT(Load(*tier, i), StatusIs(absl::StatusCode::kNotFound));
  }
  for (uint64_t i = 4; i < 8; ++i) EXPECT_OK(Load(*tier, i));
}

TEST_P(SealedDiskTierTest, AFileOfTheOtherSealingIsNotRead) {
  StoreAndClose(nullptr, 0, 3);  // unsealed
  {
    auto tier = OpenTier(Options(keys_));
    ASSERT_NE(tier, nullptr);
    EXPECT_EQ(tier->stats().restart_other_sealing, 3u);
    EXPECT_EQ(tier->stats().records, 0u);
    EXPECT_THAT(Load(*tier, 0), StatusIs(absl::StatusCode::kNotFound));
    for (uint64_t i = 0; i < 3; ++i) ASSERT_OK(Store(*tier, i));  // sealed now
  }
  auto tier = OpenTier(Options(nullptr));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().restart_other_sealing, 3u);
  EXPECT_EQ(tier->stats().restart_torn, 0u);
  EXPECT_EQ(tier->stats().records, 0u);
}

TEST_P(SealedDiskTierTest, AnotherPoolsRecordsDoNotOpen) {
  StoreAndClose(keys_, 0, 3);
  DiskTierOptions options = Options(keys_);
  options.pool.layout_fingerprint ^= 1;
  auto tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->stats().restart_records, 0u);
  EXPECT_EQ(tier->stats().restart_unopened, 3u);
}

TEST_P(SealedDiskTierTest, PageAlignedBlocksAreDecryptedInPlaceOnTheTaskWorkers) {
  DiskTierOptions options = Options(keys_);
  options.pool.block_bytes = 8192;
  options.read_depth = 4;
  auto tier = OpenTier(options);
  ASSERT_NE(tier, nullptr);
  std::vector<BlockRecordIdentity> identities;
  std::vector<std::string> bytes;
  for (uint64_t i = 0; i < 12; ++i) {
    bytes.push_back(TestBytes(TestHash(i), 8192));
    identities.push_back(Identity(i));
    identities.back().checksum = BlockChecksum(bytes.back().data(), 8192);
    ASSERT_OK(tier->Store(identities.back(), bytes.back()));
  }
  tier->Flush();
  FlipByte(tier->SlotOffset(7) + 4096 + 100);  // record 7's bytes
  AlignedBuffer out(12 * 8192);
  std::vector<DiskTier::LoadRequest> requests;
  for (uint64_t i = 0; i < 12; ++i) {
    requests.push_back({&identities[i], absl::MakeSpan(out.data() + i * 8192, 8192)});
  }
  const std::vector<absl::Status> results = tier->LoadMany(requests);
  for (uint64_t i = 0; i < 12; ++i) {
    if (i == 7) {
      EXPECT_THAT(results[i], StatusIs(absl::StatusCode::kUnauthenticated));
      continue;
    }
    ASSERT_OK(results[i]) << i;
    EXPECT_EQ(std::string(out.data() + i * 8192, 8192), bytes[i]) << i;
  }
  EXPECT_EQ(tier->stats().loads_in_place, 11u);
  EXPECT_EQ(tier->stats().load_unopened, 1u);
  EXPECT_EQ(tier->open_failures().Of(kTenant), 1u);
  EXPECT_OK(tier->CheckInvariants());
}

INSTANTIATE_TEST_SUITE_P(Io, SealedDiskTierTest,
                         ::testing::Values(DiskTierOptions::Io::kIoUring,
                                           DiskTierOptions::Io::kSyscalls),
                         [](const ::testing::TestParamInfo<DiskTierOptions::Io>& info) {
                           return info.param == DiskTierOptions::Io::kIoUring ? "IoUring"
                                                                              : "Syscalls";
                         });

}  // namespace
}  // namespace kvcache
