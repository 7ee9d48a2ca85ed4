// Pages named by an engine's keys (DESIGN §13) on a small pool with two parts, "kv" on every page
// and a one-page trailing "state": round trips, duplicates, the hit rule on hand-built cases,
// namespaces, collisions, bad input, a session ending mid-put, pins, and the parts travelling
// through tier 2 and the disk tier across a restart, a page with more parts superseding its
// poorer copy there. Every test ends with the invariants checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cache/pool.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint32_t kBlockSize = 4;
constexpr uint32_t kKv = 1;     // part masks: bit 0 "kv" (96 bytes, all pages)
constexpr uint32_t kState = 2;  // bit 1 "state" (32 bytes, the last page)
constexpr uint32_t kBoth = kKv | kState;

std::shared_ptr<const CompatibilityManifest> Manifest(const std::string& config = "cfg-1") {
  absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> manifest =
      CompatibilityManifest::Create(ManifestFields{.model_id = "model",
                                                   .model_config_digest = config,
                                                   .kv_dtype = "fp32",
                                                   .page_tokens = kBlockSize,
                                                   .parts = {{"kv", 96}, {"state", 32}}});
  EXPECT_OK(manifest);
  return manifest.ok() ? *manifest : nullptr;
}

std::vector<std::string> Keys(const std::string& prefix, size_t n) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(absl::StrCat(prefix, "/page-", i));
  return keys;
}

class PoolPagesTest : public ::testing::Test {
 protected:
  void SetUp() override { MakePool(8); }
  void TearDown() override {
    if (pool_ != nullptr) {
      EXPECT_OK(pool_->CheckInvariants());
    }
  }

  void MakePool(uint32_t num_blocks, uint32_t tier_blocks = 0, uint64_t disk_records = 0,
                uint32_t hash_bits = 0) {
    PoolOptions options = testing::SmallPoolOptions("pages", num_blocks, kBlockSize);
    ASSERT_EQ(options.layout.BlockBytes(), 128u);
    options.parts = *ParsePageParts("kv/96+state/32/trailing1", 128);
    options.testing_hash_bits = hash_bits;
    options.testing_manual_offload = true;
    options.host_tier_bytes = uint64_t{tier_blocks} * 128;
    if (disk_records != 0) {
      options.disk_tier_path = disk_dir_.path() + "/pages.tier";
      options.disk_tier_bytes = disk_records * 4096;
    }
    pool_.reset();
    // A new log as a new daemon has: what a restart announces is not found in the old one's.
    events_ = std::make_unique<KvEventLog>();
    events_->AddPool(0, options.name, "CPU", kBlockSize);
    auto memory = HostPoolMemory::Create(128, num_blocks);
    ASSERT_OK(memory);
    auto pool =
        Pool::Create(options, 0, *std::move(memory), nullptr, &quotas_, events_.get(), &clock_);
    ASSERT_OK(pool);
    pool_ = *std::move(pool);
  }

  // The bytes of the page under `key`: a function of the key.
  static std::string PageBytes(const std::string& key) {
    std::string bytes(128, '\0');
    for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<char>(key[b % key.size()] + b);
    return bytes;
  }

  // ReservePages, WriteBlock of each fresh page, CommitPages.
  absl::StatusOr<CommittedPages> Put(const Session& session, const std::vector<std::string>& keys,
                                     std::vector<uint32_t> masks = {}) {
    ASSIGN_OR_RETURN(ReservedPages reserved, pool_->ReservePages(session, keys, masks));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (reserved.block_ids[i] == kNoBlock) continue;
      RETURN_IF_ERROR(pool_->WriteBlock(reserved.block_ids[i], 0, PageBytes(keys[i])));
    }
    return pool_->CommitPages(session, reserved.sequence_id);
  }

  uint32_t Exists(const std::vector<std::string>& keys, uint32_t wanted = kBoth,
                  const Session* session = nullptr) {
    absl::StatusOr<PagesFound> found =
        pool_->ExistsPages(session ? *session : session_, keys, wanted);
    EXPECT_OK(found);
    return found.ok() ? found->num_pages : 0;
  }

  // Acquires, checks every page's bytes, releases; returns the acquired pages.
  AcquiredPages AcquireChecked(const std::vector<std::string>& keys, uint32_t wanted = kBoth) {
    absl::StatusOr<AcquiredPages> acquired = pool_->AcquirePages(session_, keys, wanted, 0);
    EXPECT_OK(acquired);
    if (!acquired.ok()) return {};
    for (size_t i = 0; i < acquired->block_ids.size(); ++i) {
      std::string bytes(128, '\0');
      EXPECT_OK(pool_->ReadBlock(acquired->block_ids[i], 0, 128, bytes.data()));
      EXPECT_EQ(bytes, PageBytes(keys[i])) << "page " << i;
    }
    EXPECT_OK(pool_->Release(session_, acquired->sequence_id));
    return *acquired;
  }

  uint32_t Referenced() const { return pool_->Stats().referenced; }

  // The events of `kind` in `medium` from sequence `start` on.
  std::vector<std::shared_ptr<const KvEvent>> Events(uint64_t start, KvEventKind kind,
                                                     const std::string& medium) const {
    std::vector<std::shared_ptr<const KvEvent>> found;
    for (auto& event : events_->Read(start, 1 << 20).events) {
      if (event->kind == kind && event->medium == medium) found.push_back(event);
    }
    return found;
  }
  std::string ManifestDigest() const {
    return session_.manifest->Digest(pool_->options().hash_algorithm).ToHex();
  }

  testing::FakeClock clock_;
  testing::ScopedTempDir disk_dir_;
  TenantQuotas quotas_;  // without limits unless a test sets them
  std::unique_ptr<KvEventLog> events_;
  Session session_{1, "uid:1", "tenant-a", "engine", absl::Seconds(10), Manifest()};
  std::unique_ptr<Pool> pool_;
};

TEST_F(PoolPagesTest, PutThenAcquireRoundTripsByteForByte) {
  const std::vector<std::string> keys = Keys("a", 3);
  absl::StatusOr<CommittedPages> put = Put(session_, keys);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_published, 3u);
  EXPECT_EQ(put->num_duplicates, 0u);
  EXPECT_EQ(Referenced(), 0u);  // published and released: cached, evictable
  EXPECT_EQ(Exists(keys), 3u);
  const AcquiredPages acquired = AcquireChecked(keys);
  EXPECT_EQ(acquired.block_ids.size(), 3u);
  EXPECT_THAT(acquired.part_masks, ElementsAre(kBoth, kBoth, kBoth));
  EXPECT_EQ(acquired.by_tier.pool, 3u);
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(PoolPagesTest, APagePresentAlreadyIsADuplicateNotAnError) {
  const std::vector<std::string> keys = Keys("a", 3);
  ASSERT_OK(Put(session_, {keys[0]}));
  absl::StatusOr<ReservedPages> reserved = pool_->ReservePages(session_, keys, {});
  ASSERT_OK(reserved);
  EXPECT_EQ(reserved->block_ids[0], kNoBlock);
  EXPECT_NE(reserved->block_ids[1], kNoBlock);
  ASSERT_OK(pool_->Release(session_, reserved->sequence_id));
  absl::StatusOr<CommittedPages> again = Put(session_, keys);
  ASSERT_OK(again);
  EXPECT_EQ(again->num_published, 2u);
  EXPECT_EQ(again->num_duplicates, 1u);
  absl::StatusOr<CommittedPages> third = Put(session_, keys);
  ASSERT_OK(third);
  EXPECT_EQ(third->num_published, 0u);
  EXPECT_EQ(third->num_duplicates, 3u);
}

TEST_F(PoolPagesTest, APagePutAgainWithMorePartsGainsThem) {
  const std::vector<std::string> keys = Keys("a", 2);
  ASSERT_OK(Put(session_, keys, {kKv, kKv}));
  EXPECT_EQ(Exists(keys, kBoth), 0u);
  absl::StatusOr<CommittedPages> again = Put(session_, {keys[1]}, {kBoth});
  ASSERT_OK(again);
  EXPECT_EQ(again->num_published, 1u);
  EXPECT_EQ(Exists(keys, kBoth), 2u);
  // A copy in use is kept: the put's is then a duplicate, and the reader's bytes stay.
  absl::StatusOr<AcquiredPages> reading = pool_->AcquirePages(session_, {keys[0]}, kKv, 0);
  ASSERT_OK(reading);
  absl::StatusOr<CommittedPages> blocked = Put(session_, {keys[0]}, {kBoth});
  ASSERT_OK(blocked);
  EXPECT_EQ(blocked->num_duplicates, 1u);
  ASSERT_OK(pool_->Release(session_, reading->sequence_id));
  EXPECT_EQ(Exists({keys[0]}, kBoth), 0u);  // page 0 still holds kv only
}

TEST_F(PoolPagesTest, HitRuleEndsAtTheGreatestEndpointEveryPartCanRestore) {
  // state only on page 2: a hit of kv and state ends after page 2, a kv-only hit covers all.
  const std::vector<std::string> keys = Keys("a", 5);
  ASSERT_OK(Put(session_, keys, {kKv, kKv, kBoth, kKv, kKv}));
  EXPECT_EQ(Exists(keys, kBoth), 3u);
  EXPECT_EQ(Exists(keys, kKv), 5u);
  EXPECT_EQ(Exists(keys, kState), 3u);  // a trailing part alone: its page at the endpoint
  const AcquiredPages acquired = AcquireChecked(keys, kBoth);
  EXPECT_THAT(acquired.part_masks, ElementsAre(kKv, kKv, kBoth));
}

TEST_F(PoolPagesTest, ATrailingPartMissingOnAnInnerPageDoesNotEndTheHit) {
  const std::vector<std::string> keys = Keys("b", 4);
  ASSERT_OK(Put(session_, keys, {kKv, kKv, kKv, kBoth}));
  EXPECT_EQ(Exists(keys, kBoth), 4u);
}

TEST_F(PoolPagesTest, APageMissingAnAllPagesPartEndsTheHitThere) {
  const std::vector<std::string> keys = Keys("c", 4);
  ASSERT_OK(Put(session_, keys, {kBoth, kState, kBoth, kBoth}));
  EXPECT_EQ(Exists(keys, kKv), 1u);
  EXPECT_EQ(Exists(keys, kBoth), 1u);  // page 0 holds both; page 1 has no kv
}

TEST_F(PoolPagesTest, AMissingPageEndsTheHit) {
  const std::vector<std::string> keys = Keys("d", 4);
  ASSERT_OK(Put(session_, {keys[0], keys[1], keys[3]}));
  EXPECT_EQ(Exists(keys, kKv), 2u);
}

TEST_F(PoolPagesTest, TenantsAndManifestsNeverMeet) {
  const std::vector<std::string> keys = Keys("shared", 2);
  ASSERT_OK(Put(session_, keys));
  Session other_tenant{2, "uid:2", "tenant-b", "engine", absl::Seconds(10), Manifest()};
  Session other_config{3, "uid:1", "tenant-a", "engine", absl::Seconds(10), Manifest("cfg-2")};
  Session same{4, "uid:1", "tenant-a", "engine-2", absl::Seconds(10), Manifest()};
  EXPECT_EQ(Exists(keys, kBoth, &other_tenant), 0u);
  EXPECT_EQ(Exists(keys, kBoth, &other_config), 0u);
  EXPECT_EQ(Exists(keys, kBoth, &same), 2u);  // equal manifests of one tenant share
}

TEST_F(PoolPagesTest, PagesNeedAManifestAndOneThatFitsThePool) {
  Session bare{5, "uid:1", "tenant-a", "engine", absl::Seconds(10)};
  EXPECT_THAT(pool_->ExistsPages(bare, Keys("a", 1), kBoth),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without a manifest")));
  absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> one_part =
      CompatibilityManifest::Create(ManifestFields{.model_id = "model",
                                                   .model_config_digest = "cfg-1",
                                                   .kv_dtype = "fp32",
                                                   .page_tokens = kBlockSize,
                                                   .parts = {{"kv", 128}}});
  ASSERT_OK(one_part);
  Session misfit{6, "uid:1", "tenant-a", "engine", absl::Seconds(10), *one_part};
  EXPECT_THAT(pool_->ReservePages(misfit, Keys("a", 1), {}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("parts kv/96,state/32")));
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(PoolPagesTest, BadInputIsInvalidArgumentAndHoldsNothing) {
  const auto expect_invalid = [&](const std::vector<std::string>& keys, std::vector<uint32_t> masks,
                                  absl::string_view message) {
    EXPECT_THAT(pool_->ReservePages(session_, keys, masks),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
  };
  expect_invalid({}, {}, "no page keys");
  expect_invalid({std::string(65, 'k')}, {}, "page key 0 has 65 bytes; want 1 to 64");
  expect_invalid({"a", ""}, {}, "page key 1 has 0 bytes");
  expect_invalid(std::vector<std::string>(kMaxPagesPerCall + 1, "k"), {}, "4097 page keys");
  expect_invalid({"a"}, {0}, "page 0 has part mask 0x0");
  expect_invalid({"a"}, {4}, "has 2 part(s)");
  expect_invalid({"a", "b"}, {kKv}, "1 part masks for 2 page keys");
  EXPECT_THAT(pool_->AcquirePages(session_, {std::string(65, 'k')}, kBoth, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(pool_->CommitPages(session_, 12345), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(PartMaskOf(pool_->parts(), std::vector<std::string>{"swa"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown part 'swa'; the pool has kv, state")));
  EXPECT_EQ(Referenced(), 0u);
  EXPECT_EQ(pool_->Stats().open_sequences, 0u);
}

TEST_F(PoolPagesTest, ACommitOfATokenSequenceOrTwiceIsRefused) {
  absl::StatusOr<ReservedPages> reserved = pool_->ReservePages(session_, Keys("a", 1), {});
  ASSERT_OK(reserved);
  ASSERT_OK(pool_->WriteBlock(reserved->block_ids[0], 0, PageBytes(Keys("a", 1)[0])));
  ASSERT_OK(pool_->CommitPages(session_, reserved->sequence_id));
  EXPECT_THAT(pool_->CommitPages(session_, reserved->sequence_id),
              StatusIs(absl::StatusCode::kNotFound));  // the commit ended the reservation
  absl::StatusOr<OpenedSequence> tokens =
      pool_->Open(session_, SequenceSpec{.tokens = testing::Tokens(1, 9)});
  ASSERT_OK(tokens);
  EXPECT_THAT(pool_->CommitPages(session_, tokens->sequence_id),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a page reservation")));
  ASSERT_OK(pool_->Release(session_, tokens->sequence_id));
}

// A writer's checksums are kept as given (each later read verifies against them); a count
// other than the reservation's is refused and publishes nothing.
TEST_F(PoolPagesTest, ACommitKeepsTheWritersChecksums) {
  const std::vector<std::string> keys = Keys("sum", 2);
  absl::StatusOr<ReservedPages> reserved = pool_->ReservePages(session_, keys, {});
  ASSERT_OK(reserved);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(pool_->WriteBlock(reserved->block_ids[i], 0, PageBytes(keys[i])));
  }
  const std::vector<uint64_t> one = {1};
  EXPECT_THAT(pool_->CommitPages(session_, reserved->sequence_id, one),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 page checksums for 2 reserved pages")));
  EXPECT_EQ(Exists(keys), 0u);
  const std::vector<uint64_t> sums = {BlockChecksum(PageBytes(keys[0]).data(), 128), 42};
  ASSERT_OK(pool_->CommitPages(session_, reserved->sequence_id, sums));
  absl::StatusOr<AcquiredPages> acquired = pool_->AcquirePages(session_, keys, kBoth, 0);
  ASSERT_OK(acquired);
  ASSERT_EQ(acquired->block_ids.size(), 2u);
  EXPECT_EQ(*pool_->BlockChecksum(acquired->block_ids[0]), sums[0]);
  EXPECT_EQ(*pool_->BlockChecksum(acquired->block_ids[1]), 42u);
  ASSERT_OK(pool_->Release(session_, acquired->sequence_id));
}

TEST_F(PoolPagesTest, ASessionEndingMidPutPublishesNothingAndHoldsNothing) {
  const std::vector<std::string> keys = Keys("a", 3);
  absl::StatusOr<ReservedPages> reserved = pool_->ReservePages(session_, keys, {});
  ASSERT_OK(reserved);
  EXPECT_EQ(Referenced(), 3u);
  session_.closed.store(true);
  EXPECT_EQ(pool_->ReleaseSession(session_.id), 1u);
  EXPECT_EQ(Referenced(), 0u);
  Session next{7, "uid:1", "tenant-a", "engine", absl::Seconds(10), Manifest()};
  EXPECT_EQ(Exists(keys, kBoth, &next), 0u);
  EXPECT_EQ(pool_->Stats().free, 8u);
}

TEST_F(PoolPagesTest, AHashCollisionIsAMissNeverAnotherPage) {
  MakePool(8, 0, 0, /*hash_bits=*/1);  // two hash values: every other key collides
  const std::vector<std::string> stored = {"stored-0", "stored-1"};
  ASSERT_OK(Put(session_, stored));
  uint32_t hits = 0;
  for (int i = 0; i < 8; ++i) hits += Exists({absl::StrCat("other-", i)}, kKv);
  EXPECT_EQ(hits, 0u);
  EXPECT_GT(pool_->collisions_caught(), 0u);
  AcquireChecked(stored, kKv);  // the stored pages themselves still hit
}

TEST_F(PoolPagesTest, PinsHoldPagesUntilTheirTtl) {
  const std::vector<std::string> keys = Keys("agent", 2);
  ASSERT_OK(Put(session_, keys));
  absl::StatusOr<uint32_t> pinned = pool_->PinPages(session_, keys, absl::Seconds(30));
  ASSERT_OK(pinned);
  EXPECT_EQ(*pinned, 2u);
  EXPECT_EQ(Referenced(), 2u);
  // Pressure: six other pages fill the rest; the pinned two stay.
  ASSERT_OK(Put(session_, Keys("other", 6)));
  EXPECT_EQ(Exists(keys), 2u);
  EXPECT_THAT(Put(session_, Keys("more", 7)),
              StatusIs(absl::StatusCode::kResourceExhausted));  // only 6 can be had
  clock_.Advance(absl::Seconds(31));
  ASSERT_OK(Put(session_, Keys("more", 7)));  // the pin has ended: its pages are evictable
  EXPECT_EQ(Referenced(), 0u);
  EXPECT_THAT(pool_->PinPages(session_, keys, absl::Hours(25)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most")));
  // A touch holds nothing.
  ASSERT_OK(pool_->PinPages(session_, Keys("more", 7), absl::ZeroDuration()));
  EXPECT_EQ(Referenced(), 0u);
}

// Pins end at their TTL even when no allocating call comes: the reaper's ExpirePins, a lookup and
// the statistics release them.
TEST_F(PoolPagesTest, ExpiredPinsAreReleasedWithoutAnAllocatingCall) {
  const std::vector<std::string> keys = Keys("idle", 2);
  ASSERT_OK(Put(session_, keys));
  ASSERT_OK(pool_->PinPages(session_, keys, absl::Seconds(30)));
  pool_->ExpirePins();
  EXPECT_EQ(Referenced(), 2u);  // not yet
  clock_.Advance(absl::Seconds(31));
  EXPECT_EQ(Referenced(), 2u);  // nothing has looked since
  pool_->ExpirePins();
  EXPECT_EQ(Referenced(), 0u);

  ASSERT_OK(pool_->PinPages(session_, keys, absl::Seconds(30)));
  clock_.Advance(absl::Seconds(31));
  EXPECT_EQ(Exists(keys), 2u);  // a lookup releases it first
  EXPECT_EQ(Referenced(), 0u);
  ASSERT_OK(pool_->PinPages(session_, keys, absl::Seconds(30)));
  clock_.Advance(absl::Seconds(31));
  const std::vector<uint32_t> tokens = {1, 2, 3, 4, 5};
  ASSERT_OK(pool_->Lookup("tenant-a", SequenceSpec{.tokens = tokens}));
  EXPECT_EQ(Referenced(), 0u);
}

// Under a tight quota a pin of higher priority releases the tenant's lower ones, the lowest first;
// one of equal priority is refused, and so is one with no lower pin left.
TEST_F(PoolPagesTest, AHigherPriorityPinDisplacesLowerOnesWhenTheQuotaIsTight) {
  quotas_.SetLimits({{"tenant-a", TenantLimits{.max_referenced_blocks = 4}}});
  const std::vector<std::string> low = Keys("low", 2), mid = Keys("mid", 2), high = Keys("high", 2);
  ASSERT_OK(Put(session_, low));
  ASSERT_OK(Put(session_, mid));
  ASSERT_OK(Put(session_, high));
  ASSERT_OK(pool_->PinPages(session_, low, absl::Seconds(60), /*priority=*/0));
  ASSERT_OK(pool_->PinPages(session_, mid, absl::Seconds(30), /*priority=*/1));
  EXPECT_EQ(Referenced(), 4u);
  EXPECT_THAT(pool_->PinPages(session_, high, absl::Seconds(30), 0),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("max_referenced_blocks")));
  EXPECT_EQ(Referenced(), 4u);  // an equal priority displaces nothing
  absl::StatusOr<uint32_t> pinned = pool_->PinPages(session_, high, absl::Seconds(90), 2);
  ASSERT_OK(pinned);
  EXPECT_EQ(*pinned, 2u);  // "low" made room
  EXPECT_EQ(Referenced(), 4u);
  EXPECT_THAT(pool_->PinPages(session_, low, absl::Seconds(30), 1),
              StatusIs(absl::StatusCode::kResourceExhausted));  // nothing below 1 is left
  EXPECT_EQ(Referenced(), 4u);
  ASSERT_OK(pool_->PinPages(session_, low, absl::Seconds(120), Pool::kMaxPinPriority));
  // "mid" (1) went before "high" (2): past mid's TTL, "high" and "low" are still pinned.
  clock_.Advance(absl::Seconds(31));
  pool_->ExpirePins();
  EXPECT_EQ(Referenced(), 4u);
  clock_.Advance(absl::Seconds(90));
  pool_->ExpirePins();
  EXPECT_EQ(Referenced(), 0u);
  EXPECT_THAT(pool_->PinPages(session_, low, absl::Seconds(30), Pool::kMaxPinPriority + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pin priority 8; at most 7")));
}

TEST_F(PoolPagesTest, PartsTravelThroughTierTwo) {
  MakePool(8, /*tier_blocks=*/16);
  const std::vector<std::string> keys = Keys("a", 4);
  ASSERT_OK(Put(session_, keys, {kKv, kKv, kBoth, kKv}));
  pool_->OffloadForTesting();
  ASSERT_OK(Put(session_, Keys("evict", 8)));  // tier 1 now holds only these
  absl::StatusOr<PagesFound> found = pool_->ExistsPages(session_, keys, kBoth);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 3u);
  EXPECT_EQ(found->by_tier.host, 3u);
  const AcquiredPages acquired = AcquireChecked(keys, kBoth);
  EXPECT_THAT(acquired.part_masks, ElementsAre(kKv, kKv, kBoth));
  EXPECT_EQ(acquired.by_tier.host, 3u);
  EXPECT_EQ(Exists(keys, kKv), 4u);  // page 3 was loaded too: a verified page is kept
}

// Regression (simulation seed 4000137): with no room to load the page below that ended the hit,
// an acquire returned the tier-1 pages before it, whose last lacked the state the hit needs.
TEST_F(PoolPagesTest, AnAcquireWithoutRoomToLoadStillEndsOnAHit) {
  MakePool(4, /*tier_blocks=*/16);
  const std::vector<std::string> keys = Keys("a", 3);
  ASSERT_OK(Put(session_, {keys[2]}, {kBoth}));
  pool_->OffloadForTesting();
  ASSERT_OK(Put(session_, {keys[0], keys[1]}, {kKv, kKv}));
  // Two reserved pages take the free block and evict page 2, which tier 2 still holds.
  absl::StatusOr<ReservedPages> reserved = pool_->ReservePages(session_, Keys("b", 2), {});
  ASSERT_OK(reserved);
  absl::StatusOr<PagesFound> found = pool_->ExistsPages(session_, keys, kBoth);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 3u);
  EXPECT_EQ(found->by_tier.host, 1u);
  // Page 2 cannot be loaded (every other block is a hit or reserved): pages 0 and 1 alone
  // restore no state, so nothing is a hit.
  absl::StatusOr<AcquiredPages> acquired = pool_->AcquirePages(session_, keys, kBoth, 0);
  ASSERT_OK(acquired);
  EXPECT_THAT(acquired->block_ids, ElementsAre());
  ASSERT_OK(pool_->Release(session_, acquired->sequence_id));
  EXPECT_EQ(AcquireChecked(keys, kKv).block_ids.size(), 2u);  // kv alone: both tier-1 pages
  ASSERT_OK(pool_->Release(session_, reserved->sequence_id));
}

// Regression (cache_manager_fuzzer): a Fork of an acquire that the hit rule had cut short took
// the keys past the hit for blocks of the sequence and pinned a free block. Extend, Commit and
// Fork are for token sequences: a page sequence is refused and left as it was.
TEST_F(PoolPagesTest, TokenCallsOnAPageSequenceAreRefused) {
  const std::vector<std::string> keys = Keys("a", 3);
  ASSERT_OK(Put(session_, keys, {kKv, kKv, kKv}));
  absl::StatusOr<AcquiredPages> acquired = pool_->AcquirePages(session_, keys, kBoth, 0);
  ASSERT_OK(acquired);
  EXPECT_THAT(acquired->block_ids, ElementsAre());  // no state anywhere: no hit
  absl::StatusOr<ReservedPages> reserved = pool_->ReservePages(session_, Keys("b", 2), {});
  ASSERT_OK(reserved);
  for (const uint64_t id : {acquired->sequence_id, reserved->sequence_id}) {
    EXPECT_THAT(pool_->Fork(session_, id),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds pages")));
    EXPECT_THAT(pool_->Extend(session_, id, testing::Tokens(1, kBlockSize)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds pages")));
    EXPECT_THAT(pool_->Commit(session_, id, kBlockSize),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds pages")));
  }
  EXPECT_EQ(Referenced(), 2u);  // the reservation's two pages, unpublished
  EXPECT_EQ(Exists(Keys("b", 2), kKv), 0u);
  ASSERT_OK(pool_->CommitPages(session_, reserved->sequence_id));
  ASSERT_OK(pool_->Release(session_, acquired->sequence_id));
  EXPECT_EQ(Referenced(), 0u);
}

// Pages are independent, so the oldest go below first while later ones stay in tier 1: a
// lookup goes on in tier 1 after pages from below.
TEST_F(PoolPagesTest, TierOnePagesAfterPagesFromBelowAreHitsToo) {
  MakePool(8, /*tier_blocks=*/16);
  const std::vector<std::string> keys = Keys("a", 4);
  ASSERT_OK(Put(session_, {keys[0], keys[1]}));
  pool_->OffloadForTesting();                    // a0, a1 in tier 2 as well
  ASSERT_OK(Put(session_, {keys[2], keys[3]}));  // tier 1 only
  ASSERT_OK(Put(session_, Keys("filler", 6)));   // evicts the oldest two: a0, a1
  absl::StatusOr<PagesFound> found = pool_->ExistsPages(session_, keys, kKv);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 4u);
  EXPECT_EQ(found->by_tier.host, 2u);
  EXPECT_EQ(found->by_tier.pool, 2u);
  const AcquiredPages acquired = AcquireChecked(keys, kKv);
  EXPECT_EQ(acquired.block_ids.size(), 4u);
  EXPECT_EQ(acquired.by_tier.host, 2u);
  EXPECT_EQ(acquired.by_tier.pool, 2u);
}

TEST_F(PoolPagesTest, ARestartFromDiskServesTheSamePages) {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  const std::vector<std::string> keys = Keys("persist", 4);
  ASSERT_OK(Put(session_, keys, {kKv, kKv, kKv, kBoth}));
  pool_->OffloadForTesting();
  pool_->disk_tier()->Flush();
  pool_->OffloadForTesting();
  pool_->disk_tier()->Flush();
  MakePool(8, 8, 64);  // a new daemon over the same file
  absl::StatusOr<PagesFound> found = pool_->ExistsPages(session_, keys, kBoth);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 4u);
  EXPECT_EQ(found->by_tier.disk, 4u);
  const AcquiredPages acquired = AcquireChecked(keys, kBoth);
  EXPECT_THAT(acquired.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  Session other_config{8, "uid:1", "tenant-a", "engine", absl::Seconds(10), Manifest("cfg-2")};
  EXPECT_EQ(Exists(keys, kKv, &other_config), 0u);
}

// A page put again with more parts supersedes its copies below tier 1 too: tier 2 and the disk
// take the richer copy in place of the poorer one, announcing it stored again with its mask and
// never removed (the page never left them), and a restart serves it from disk.
TEST_F(PoolPagesTest, APagePutAgainWithMorePartsSupersedesItsCopiesBelow) {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  const std::vector<std::string> keys = Keys("rich", 2);
  const auto pass_down = [&] {
    pool_->OffloadForTesting();
    pool_->disk_tier()->Flush();
    pool_->OffloadForTesting();
    pool_->disk_tier()->Flush();
  };
  ASSERT_OK(Put(session_, keys, {kKv, kKv}));
  pass_down();
  const uint64_t start = events_->next_sequence();
  absl::StatusOr<CommittedPages> again = Put(session_, {keys[1]}, {kBoth});
  ASSERT_OK(again);
  EXPECT_EQ(again->num_published, 1u);
  pass_down();
  EXPECT_EQ(pool_->host_tier()->counters().superseded, 1u);
  EXPECT_EQ(pool_->disk_tier()->stats().superseded, 1u);
  for (const std::string medium : {"CPU_PINNED", "DISK"}) {
    EXPECT_THAT(Events(start, KvEventKind::kBlocksRemoved, medium), ::testing::IsEmpty()) << medium;
    const std::vector<std::shared_ptr<const KvEvent>> stored =
        Events(start, KvEventKind::kBlocksStored, medium);
    ASSERT_EQ(stored.size(), 1u) << medium;
    EXPECT_THAT(stored[0]->page_keys, ElementsAre(keys[1]));
    ASSERT_EQ(stored[0]->blocks.size(), 1u);
    EXPECT_EQ(stored[0]->blocks[0].extras_digest, kBoth) << medium;
  }

  ASSERT_OK(Put(session_, Keys("evict", 8)));  // tier 1 now holds only these
  absl::StatusOr<PagesFound> found = pool_->ExistsPages(session_, keys, kBoth);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 2u);
  EXPECT_EQ(found->by_tier.host, 2u);
  EXPECT_THAT(AcquireChecked(keys, kBoth).part_masks, ElementsAre(kKv, kBoth));

  MakePool(8, 8, 64);  // a new daemon over the same file
  found = pool_->ExistsPages(session_, keys, kBoth);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 2u);
  EXPECT_EQ(found->by_tier.disk, 2u);
  EXPECT_EQ(pool_->disk_tier()->stats().restart_duplicates, 1u);  // the superseded record
  EXPECT_THAT(AcquireChecked(keys, kBoth).part_masks, ElementsAre(kKv, kBoth));
}

// A page put later with fewer parts than tier 2's copy (tier 1 had evicted the richer one)
// leaves that copy: passed down, it is not stored over it, and evicting it loses nothing.
TEST_F(PoolPagesTest, APoorerPagePutLaterLeavesTheRicherCopyBelow) {
  MakePool(8, /*tier_blocks=*/16);
  const std::string key = "page-with-state";
  ASSERT_OK(Put(session_, {key}, {kBoth}));
  pool_->OffloadForTesting();
  ASSERT_OK(Put(session_, Keys("evict", 8)));  // the page leaves tier 1
  absl::StatusOr<CommittedPages> poorer = Put(session_, {key}, {kKv});
  ASSERT_OK(poorer);
  EXPECT_EQ(poorer->num_published, 1u);  // tier 1 did not hold it
  EXPECT_THAT(AcquireChecked({key}, kKv).part_masks, ElementsAre(kKv));
  pool_->OffloadForTesting();
  EXPECT_EQ(pool_->host_tier()->counters().superseded, 0u);
  ASSERT_OK(Put(session_, Keys("evict-again", 8)));  // the poorer copy leaves tier 1
  absl::StatusOr<PagesFound> found = pool_->ExistsPages(session_, {key}, kBoth);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 1u);
  EXPECT_EQ(found->by_tier.host, 1u);
  EXPECT_THAT(AcquireChecked({key}, kBoth).part_masks, ElementsAre(kBoth));
  EXPECT_OK(pool_->host_tier()->CheckInvariants());
}

// A page's events name it by the engine's key and manifest, not by tokens (its tokens are the
// key's first bytes, which mean nothing to a router): its store, the call's pages one event with
// no parent, and its removal, by the key the router stored.
TEST_F(PoolPagesTest, PagesAreAnnouncedAndRemovedByTheirEngineKeys) {
  const std::vector<std::string> keys = Keys("announced", 3);
  uint64_t start = events_->next_sequence();
  ASSERT_OK(Put(session_, keys, {kKv, kKv, kBoth}));
  std::vector<std::shared_ptr<const KvEvent>> stored =
      Events(start, KvEventKind::kBlocksStored, "CPU");
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_THAT(stored[0]->page_keys, ElementsAre(keys[0], keys[1], keys[2]));
  EXPECT_EQ(stored[0]->manifest_digest, ManifestDigest());
  EXPECT_EQ(stored[0]->tenant, "tenant-a");
  EXPECT_EQ(stored[0]->parent_hash, std::nullopt);
  ASSERT_EQ(stored[0]->blocks.size(), 3u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_THAT(stored[0]->blocks[i].token_ids, ::testing::IsEmpty());
    EXPECT_EQ(PartMaskIn(stored[0]->blocks[i].extras_digest), i == 2 ? kBoth : kKv) << i;
  }
  // Each page stays without a parent in the log's index (what a snapshot and the lower tiers'
  // announcements read).
  for (const StoredBlock& block : stored[0]->blocks) {
    EXPECT_EQ(events_->FindAnnounced(0, block.hash)->parent_hash, std::nullopt);
  }
  // A duplicate is not announced again.
  start = events_->next_sequence();
  ASSERT_OK(Put(session_, {keys[2]}));
  EXPECT_EQ(events_->next_sequence(), start);

  // Eight new pages evict the three; their removal names them by their keys.
  ASSERT_OK(Put(session_, Keys("evictor", 8)));
  std::vector<std::string> removed_keys;
  for (const auto& event : Events(start, KvEventKind::kBlocksRemoved, "CPU")) {
    ASSERT_EQ(event->page_keys.size(), event->removed.size());
    removed_keys.insert(removed_keys.end(), event->page_keys.begin(), event->page_keys.end());
  }
  EXPECT_THAT(removed_keys, ::testing::UnorderedElementsAreArray(keys));
}

TEST_F(PoolPagesTest, TierTwoAnnouncesPagesByTheirKeysToo) {
  MakePool(8, /*tier_blocks=*/16);
  const std::vector<std::string> keys = Keys("host", 2);
  ASSERT_OK(Put(session_, keys));
  const uint64_t start = events_->next_sequence();
  pool_->OffloadForTesting();
  std::vector<std::string> announced;
  for (const auto& event : Events(start, KvEventKind::kBlocksStored, "CPU_PINNED")) {
    ASSERT_EQ(event->blocks.size(), 1u);
    EXPECT_THAT(event->blocks[0].token_ids, ::testing::IsEmpty());
    EXPECT_EQ(event->parent_hash, std::nullopt);
    EXPECT_EQ(event->manifest_digest, ManifestDigest());
    EXPECT_EQ(event->tenant, "tenant-a");
    announced.insert(announced.end(), event->page_keys.begin(), event->page_keys.end());
  }
  EXPECT_THAT(announced, ::testing::UnorderedElementsAreArray(keys));
}

// A restarted daemon knows its disk's pages only by their records: each key is read back from
// the record's tokens (the key's first bytes, zero-padded) at the length whose digest matches, a
// key ending in zero bytes included; the manifest is not on disk.
TEST_F(PoolPagesTest, ARestartAnnouncesItsDiskPagesByTheKeysReadBack) {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  const std::vector<std::string> keys = {"k", std::string("k\0", 2), std::string("zero\0\0", 6),
                                         "sixteen-bytes-ok"};
  ASSERT_OK(Put(session_, keys));
  pool_->OffloadForTesting();
  pool_->disk_tier()->Flush();
  pool_->OffloadForTesting();
  pool_->disk_tier()->Flush();
  MakePool(8, 8, 64);
  std::vector<std::string> announced;
  for (const auto& event : Events(0, KvEventKind::kBlocksStored, "DISK")) {
    EXPECT_EQ(event->parent_hash, std::nullopt);
    EXPECT_EQ(event->manifest_digest, "");
    EXPECT_THAT(event->blocks[0].token_ids, ::testing::IsEmpty());
    announced.insert(announced.end(), event->page_keys.begin(), event->page_keys.end());
  }
  EXPECT_THAT(announced, ::testing::UnorderedElementsAreArray(keys));
}

}  // namespace
}  // namespace kvcache
