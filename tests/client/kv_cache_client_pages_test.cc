// The C++ client's page calls (issue 31) against a real daemon on a Unix socket: a pool "pages" of
// two parts, "kv" on every page and a one-page trailing "state", with a host tier and a disk tier
// moved by hand. Round trips byte for byte over the wire (PutPages / GetPages) and through the
// mapped pool (WritePages / ReadPagesInto); the hit rule on hand-built pages; manifests and
// tenants that never meet; a client killed mid-put (a child process) publishing and holding
// nothing; a corrupted record below ending the hit; a restart served from disk; bad input with
// the daemon's precise codes over the wire and the client's own before it.
#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/mapped_pool.h"
#include "common/block_checksum.h"
#include "common/block_hash.h"
#include "common/compatibility_manifest.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "common/task_workers.h"
#include "server/kv_cache_service.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/subprocess.h"

namespace kvcache::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kPool[] = "pages";
constexpr char kHostOnlyPool[] = "pages-host";  // no disk tier: a bad tier-2 record has no twin
constexpr uint32_t kPoolBlocks = 8;
// Room for a batch past KvCacheClient::kParallelCopyBytes (32 pages of 32 KiB), tier 1 only.
constexpr char kWidePool[] = "pages-wide";
constexpr uint32_t kWidePoolBlocks = 48;
constexpr uint64_t kKvBytes = 28 << 10;    // part 0, every page
constexpr uint64_t kStateBytes = 4 << 10;  // part 1, the last page of a hit
constexpr uint32_t kKv = 1;
constexpr uint32_t kState = 2;
constexpr uint32_t kBoth = kKv | kState;
constexpr uint32_t kPageTokens = 16;  // DefaultPoolOptions' block size
constexpr absl::Duration kChildTtl = absl::Seconds(10);
constexpr absl::Duration kLongTtl = absl::Minutes(5);
// The argument that makes this binary the killed client (PagesChild below).
constexpr char kChildTargetFlag[] = "--pages_child_target=";

// The manifest of an engine writing to pool "pages"; `config` tells engines' configs apart.
ManifestFields Manifest(const std::string& config = "cfg-1") {
  return ManifestFields{.model_id = "demo",
                        .model_config_digest = config,
                        .kv_dtype = "fp16",
                        .page_tokens = kPageTokens,
                        .parts = {{"kv", kKvBytes}, {"state", kStateBytes}}};
}

std::vector<std::string> Keys(const std::string& prefix, size_t count) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < count; ++i) keys.push_back(absl::StrCat(prefix, "/page-", i));
  return keys;
}

// A page's bytes: a function of its key and `seed`, different in every part.
std::string PageBytes(const std::string& key, uint64_t page_bytes, char seed = 0) {
  std::string bytes(page_bytes, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(key[i % key.size()] * 31 + i * 7 + (i >> 10) + seed);
  }
  return bytes;
}

class PagesClientTest : public DaemonFixture {
 protected:
  PagesClientTest() {
    with_other_tenant_ = true;
    PoolOptions pool = DefaultPoolOptions();
    pool.name = kPool;
    pool.num_blocks = kPoolBlocks;
    page_bytes_ = pool.layout.BlockBytes();
    pool.parts = *ParsePageParts("kv/28K+state/4K/trailing1", page_bytes_);
    pool.host_tier_bytes = 16 * page_bytes_;
    pool.testing_manual_offload = true;  // tests move pages down with Offload()
    pool.name = kHostOnlyPool;
    extra_pools_.push_back(pool);
    PoolOptions wide = pool;
    wide.name = kWidePool;
    wide.num_blocks = kWidePoolBlocks;
    wide.host_tier_bytes = 0;
    wide.workers = wide_pool_workers_;
    extra_pools_.push_back(wide);
    pool.name = kPool;
    pool.host_tier_bytes = kPoolBlocks * page_bytes_;  // the disk tier takes all of tier 2
    pool.disk_tier_path = disk_dir_.File("pages.tier");
    pool.disk_tier_bytes = 8 << 20;
    extra_pools_.push_back(pool);
  }

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DaemonFixture::SetUp());
    // Longer than any clock advance of a test: only the leases the test means to end end.
    ASSERT_OK(client_->OpenSession("default", "pages-test", kLongTtl, Manifest()));
  }

  std::vector<std::string> Pages(const std::vector<std::string>& keys, char seed = 0) const {
    std::vector<std::string> pages;
    for (const std::string& key : keys) pages.push_back(PageBytes(key, page_bytes_, seed));
    return pages;
  }
  static std::vector<absl::string_view> Views(const std::vector<std::string>& pages) {
    return std::vector<absl::string_view>(pages.begin(), pages.end());
  }

  absl::StatusOr<KvCacheClient::PagesStored> Put(KvCacheClient& client,
                                                 const std::vector<std::string>& keys,
                                                 std::vector<uint32_t> masks = {}, char seed = 0) {
    const std::vector<std::string> pages = Pages(keys, seed);
    return client.PutPages(pool_, keys, Views(pages), masks);
  }

  uint32_t Exists(KvCacheClient& client, const std::vector<std::string>& keys,
                  std::vector<std::string> parts = {}) {
    absl::StatusOr<KvCacheClient::PagesFound> found = client.ExistsPages(pool_, keys, parts);
    EXPECT_OK(found);
    return found.ok() ? found->num_pages : 0;
  }

  KvCacheClient::BlockCounts Counts() {
    absl::StatusOr<KvCacheClient::PoolDescription> description = client_->DescribePool(pool_);
    EXPECT_OK(description);
    return description.ok() ? description->counts : KvCacheClient::BlockCounts{};
  }

  Pool& PagesPool() { return **daemon_->manager().FindPool(pool_); }

  // Moves every page of tier 1 down to tier 2, and tier 2's down to the disk, written out.
  void Offload() {
    PagesPool().OffloadForTesting();
    PagesPool().disk_tier()->Flush();
    PagesPool().OffloadForTesting();
    PagesPool().disk_tier()->Flush();
  }

  // The hash under which tenant "default"'s session of Manifest() stores `key` in pool "pages".
  Hash128 PageHash(const std::string& key) {
    const Pool& pool = PagesPool();
    absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> manifest =
        CompatibilityManifest::Create(Manifest());
    EXPECT_OK(manifest);
    BlockHasher hasher(pool.options().hash_algorithm);
    const HashNamespace ns{.model_id = pool.options().model_id,
                           .layout_fingerprint = pool.layout_fingerprint(),
                           .tenant = "default",
                           .cache_salt = "",
                           .manifest_digest = (*manifest)->Digest(pool.options().hash_algorithm)};
    return hasher.Page(hasher.Root(ns), key);
  }

  std::unique_ptr<MappedPool> Map(const std::string& pool = kPool) {
    absl::StatusOr<KvCacheClient::PoolDescription> description = client_->DescribePool(pool);
    EXPECT_OK(description);
    if (!description.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(*description);
    EXPECT_OK(mapped);
    return mapped.ok() ? *std::move(mapped) : nullptr;
  }

  // Nothing referenced and no sequence open in the test's pool.
  // Polled: GetPages' pins go once its reply is sent, a moment after the client has it.
  void ExpectNothingHeld() {
    EXPECT_TRUE(PollUntil([&] { return Counts().referenced == 0; }))
        << Counts().referenced << " blocks still referenced";
    absl::StatusOr<KvCacheClient::Stats> stats = client_->GetStats(pool_);
    ASSERT_OK(stats);
    ASSERT_EQ(stats->pools.size(), 1u);
    EXPECT_EQ(stats->pools[0].open_sequences, 0u);
  }

  ScopedTempDir disk_dir_{"kvcache_pages_disk"};  // outlives the daemon: declared before it runs
  // The wide pool's (PoolOptions::workers), one thread: a batch of two slices.
  const std::shared_ptr<TaskWorkers> wide_pool_workers_ =
      std::make_shared<TaskWorkers>(1, absl::ZeroDuration());
  uint64_t page_bytes_ = 0;
  std::string pool_ = kPool;  // the pool the helpers use
};

TEST_F(PagesClientTest, PutPagesAndGetPagesRoundTripByteForByte) {
  const std::vector<std::string> keys = Keys("a", 3);
  absl::StatusOr<KvCacheClient::PagesStored> put = Put(*client_, keys);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_published, 3u);
  EXPECT_EQ(put->num_duplicates, 0u);

  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages(kPool, keys);
  ASSERT_OK(got);
  ASSERT_EQ(got->pages.size(), 3u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(got->pages[i] == Pages(keys)[i]) << "page " << i << " differs";
  }
  EXPECT_THAT(got->part_masks, ElementsAre(kBoth, kBoth, kBoth));
  EXPECT_EQ(got->pages_by_tier.pool, 3u);

  // A key past the stored ones ends the hit; a second put of the same keys stores nothing new.
  std::vector<std::string> longer = keys;
  longer.push_back("a/unknown");
  EXPECT_EQ(Exists(*client_, longer), 3u);
  put = Put(*client_, keys, {}, /*seed=*/9);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_published, 0u);
  EXPECT_EQ(put->num_duplicates, 3u);
  got = client_->GetPages(kPool, keys);
  ASSERT_OK(got);
  EXPECT_TRUE(got->pages[1] == Pages(keys)[1]) << "a duplicate put replaced a page";
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, WritePagesAndReadPagesIntoRoundTripByteForByte) {
  std::unique_ptr<MappedPool> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->parts().size(), 2u);
  const std::vector<std::string> keys = Keys("mapped", 3);
  const std::vector<std::string> pages = Pages(keys);
  absl::StatusOr<KvCacheClient::PagesStored> written =
      client_->WritePages(*mapped, keys, Views(pages));
  ASSERT_OK(written);
  EXPECT_EQ(written->num_published, 3u);
  ExpectNothingHeld();

  std::vector<std::string> out(keys.size(), std::string(page_bytes_, '\0'));
  std::vector<absl::Span<char>> destinations;
  for (std::string& page : out) destinations.push_back(absl::MakeSpan(page));
  absl::StatusOr<KvCacheClient::PagesRead> read =
      client_->ReadPagesInto(*mapped, keys, destinations);
  ASSERT_OK(read);
  EXPECT_EQ(read->num_pages, 3u);
  EXPECT_THAT(read->part_masks, ElementsAre(kBoth, kBoth, kBoth));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(out[i] == pages[i]) << "page " << i << " differs";
  }
  client_->AwaitReleases();  // the release was sent, not waited for
  ExpectNothingHeld();

  // The other way round: written over the wire, read through the mapping part by part.
  const std::vector<std::string> wire_keys = Keys("wire", 2);
  ASSERT_OK(Put(*client_, wire_keys));
  absl::StatusOr<KvCacheClient::AcquiredPages> acquired = client_->AcquirePages(kPool, wire_keys);
  ASSERT_OK(acquired);
  ASSERT_EQ(acquired->block_ids.size(), 2u);
  const std::string expected = Pages(wire_keys)[1];
  absl::StatusOr<absl::Span<uint8_t>> kv = mapped->Part(acquired->block_ids[1], "kv");
  absl::StatusOr<absl::Span<uint8_t>> state = mapped->Part(acquired->block_ids[1], "state");
  ASSERT_OK(kv);
  ASSERT_OK(state);
  EXPECT_EQ(kv->size(), kKvBytes);
  EXPECT_TRUE(std::string(kv->begin(), kv->end()) == expected.substr(0, kKvBytes));
  EXPECT_TRUE(std::string(state->begin(), state->end()) == expected.substr(kKvBytes));
  EXPECT_THAT(mapped->Part(acquired->block_ids[1], "swa"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the pool has kv, state")));
  EXPECT_EQ(Counts().referenced, 2u);  // pinned until released
  ASSERT_OK(client_->ReleaseSequence(acquired->sequence_id));
  ExpectNothingHeld();
}

// A batch of kParallelCopyBytes or more is copied by the caller's thread and the client's page
// copy threads, a slice each: every page lands in its own block with its own checksum, the
// duplicates among fresh pages included (their checksums are left out, the others stay in order),
// and a page changed in the pool is named by its own index whichever slice copied it.
TEST_F(PagesClientTest, ABatchCopiedByTheCopyThreadsKeepsEachPageAndItsChecksum) {
  ClientOptions options;
  options.page_copy_threads = 2;
  std::unique_ptr<KvCacheClient> client = Connect(options);
  ASSERT_OK(client->OpenSession("default", "pages-copiers", kLongTtl, Manifest()));
  std::unique_ptr<MappedPool> mapped = Map(kWidePool);
  ASSERT_NE(mapped, nullptr);
  constexpr size_t kBatch = 40;
  ASSERT_GE(kBatch * page_bytes_, KvCacheClient::kParallelCopyBytes);
  const std::vector<std::string> keys = Keys("copiers", kBatch);
  const std::vector<std::string> pages = Pages(keys);
  // Every third page present already: the write's checksums skip them.
  std::vector<std::string> present_keys;
  std::vector<std::string> present_pages;
  for (size_t i = 0; i < kBatch; i += 3) {
    present_keys.push_back(keys[i]);
    present_pages.push_back(pages[i]);
  }
  ASSERT_OK(client->PutPages(kWidePool, present_keys, Views(present_pages)));
  absl::StatusOr<KvCacheClient::PagesStored> written =
      client->WritePages(*mapped, keys, Views(pages));
  ASSERT_OK(written);
  EXPECT_EQ(written->num_published, kBatch - present_keys.size());

  std::vector<std::string> out(kBatch, std::string(page_bytes_, '\0'));
  std::vector<absl::Span<char>> destinations;
  for (std::string& page : out) destinations.push_back(absl::MakeSpan(page));
  absl::StatusOr<KvCacheClient::PagesRead> read =
      client->ReadPagesInto(*mapped, keys, destinations);
  ASSERT_OK(read);
  EXPECT_EQ(read->num_pages, kBatch);
  for (size_t i = 0; i < kBatch; ++i) EXPECT_TRUE(out[i] == pages[i]) << "page " << i << " differs";
  // Over the wire, the daemon's checksums (those the write sent) check every page again.
  absl::StatusOr<KvCacheClient::GotPages> got = client->GetPages(kWidePool, keys);
  ASSERT_OK(got);
  EXPECT_TRUE(got->pages == pages);

  // A stray write into the last slice's page 37.
  absl::StatusOr<KvCacheClient::AcquiredPages> acquired = client->AcquirePages(kWidePool, keys);
  ASSERT_OK(acquired);
  absl::StatusOr<absl::Span<uint8_t>> page = mapped->Page(acquired->block_ids[37]);
  ASSERT_OK(page);
  (*page)[100] ^= 0x5a;
  ASSERT_OK(client->ReleaseSequence(acquired->sequence_id));
  EXPECT_THAT(client->ReadPagesInto(*mapped, keys, destinations),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("ReadPagesInto: page 37 (key \"copiers/page-37\")")));
  client->AwaitReleases();
  absl::StatusOr<KvCacheClient::PoolDescription> description = client->DescribePool(kWidePool);
  ASSERT_OK(description);
  EXPECT_EQ(description->counts.referenced, 0u);
}

// ReadPagesInto sends its release from a thread of the client's without waiting for it. A client
// destroyed at once stops that thread before anything of it is gone (what this part checks is
// for the sanitizers: closing the session releases the pages either way); a client that reads on
// gets the same bytes every time while the releases go out beside it, and AwaitReleases leaves
// nothing pinned.
TEST_F(PagesClientTest, AReaderDestroyedRightAfterReadPagesIntoLeavesNothingPinned) {
  std::unique_ptr<MappedPool> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  const std::vector<std::string> keys = Keys("reader", 2);
  ASSERT_OK(Put(*client_, keys));
  std::vector<std::string> out(keys.size(), std::string(page_bytes_, '\0'));
  std::vector<absl::Span<char>> destinations;
  for (std::string& page : out) destinations.push_back(absl::MakeSpan(page));
  for (int round = 0; round < 20; ++round) {
    std::unique_ptr<KvCacheClient> reader = Connect();
    ASSERT_OK(reader->OpenSession("default", "reader", kLongTtl, Manifest()));
    absl::StatusOr<KvCacheClient::PagesRead> read =
        reader->ReadPagesInto(*mapped, keys, destinations);
    ASSERT_OK(read);
    EXPECT_EQ(read->num_pages, 2u);
    EXPECT_TRUE(out == Pages(keys)) << "round " << round;
  }
  ExpectNothingHeld();
  for (int read = 0; read < 50; ++read) {
    ASSERT_OK(client_->ReadPagesInto(*mapped, keys, destinations));
    EXPECT_TRUE(out == Pages(keys)) << "read " << read;
  }
  client_->AwaitReleases();
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, APageMissingItsStatePartEndsTheHitThere) {
  // "state" only on page 2: restoring both parts ends after page 2, restoring kv covers all.
  const std::vector<std::string> keys = Keys("hit", 5);
  ASSERT_OK(Put(*client_, keys, {kKv, kKv, kBoth, kKv, kKv}));
  EXPECT_EQ(Exists(*client_, keys), 3u);
  EXPECT_EQ(Exists(*client_, keys, {"kv"}), 5u);
  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages(kPool, keys);
  ASSERT_OK(got);
  EXPECT_EQ(got->pages.size(), 3u);
  EXPECT_THAT(got->part_masks, ElementsAre(kKv, kKv, kBoth));
  // An all-pages part missing on an inner page ends the hit before it.
  const std::vector<std::string> gap = Keys("gap", 3);
  ASSERT_OK(Put(*client_, gap, {kBoth, kState, kBoth}));
  EXPECT_EQ(Exists(*client_, gap), 1u);
  EXPECT_EQ(Exists(*client_, gap, {"kv"}), 1u);
}

TEST_F(PagesClientTest, ATrailingPartMissingOnAnInnerPageDoesNotEndTheHit) {
  const std::vector<std::string> keys = Keys("window", 4);
  ASSERT_OK(Put(*client_, keys, {kKv, kKv, kKv, kBoth}));
  EXPECT_EQ(Exists(*client_, keys), 4u);
  PageReadOptions both{.parts = {"kv", "state"}};
  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages(kPool, keys, both);
  ASSERT_OK(got);
  EXPECT_EQ(got->pages.size(), 4u);
  EXPECT_TRUE(got->pages[3] == Pages(keys)[3]);
}

TEST_F(PagesClientTest, AnotherManifestMissesAndOneThatDoesNotFitIsRefused) {
  const std::vector<std::string> keys = Keys("m", 2);
  ASSERT_OK(Put(*client_, keys));
  std::unique_ptr<KvCacheClient> other_config = Connect();
  ASSERT_OK(other_config->OpenSession("default", "cfg-2", absl::ZeroDuration(), Manifest("cfg-2")));
  EXPECT_EQ(Exists(*other_config, keys), 0u);
  absl::StatusOr<KvCacheClient::GotPages> got = other_config->GetPages(kPool, keys);
  ASSERT_OK(got);
  EXPECT_TRUE(got->pages.empty());

  std::unique_ptr<KvCacheClient> misfit = Connect();
  ManifestFields one_part = Manifest();
  one_part.parts = {{"kv", page_bytes_}};
  ASSERT_OK(misfit->OpenSession("default", "misfit", absl::ZeroDuration(), one_part));
  EXPECT_THAT(misfit->ExistsPages(kPool, keys),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("kv/28672,state/4096")));
  EXPECT_THAT(Put(*misfit, Keys("misfit", 1)), StatusIs(absl::StatusCode::kFailedPrecondition));

  std::unique_ptr<KvCacheClient> bare = Connect();
  ASSERT_OK(bare->OpenSession("default", "no-manifest"));
  EXPECT_THAT(bare->ExistsPages(kPool, keys),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without a manifest")));
  EXPECT_EQ(Exists(*client_, Keys("misfit", 1)), 0u);
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, EqualKeysInTwoTenantsNeverMeet) {
  const std::vector<std::string> keys = Keys("shared", 3);
  ASSERT_OK(Put(*client_, keys));
  std::unique_ptr<KvCacheClient> globex = ConnectAsOtherTenant();
  ASSERT_NE(globex, nullptr);
  ASSERT_OK(globex->OpenSession("globex", "globex-engine", absl::ZeroDuration(), Manifest()));
  EXPECT_EQ(Exists(*globex, keys), 0u);
  absl::StatusOr<KvCacheClient::PagesStored> put = Put(*globex, keys, {}, /*seed=*/5);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_published, 3u);  // not duplicates of tenant "default"'s pages

  absl::StatusOr<KvCacheClient::GotPages> mine = client_->GetPages(kPool, keys);
  absl::StatusOr<KvCacheClient::GotPages> theirs = globex->GetPages(kPool, keys);
  ASSERT_OK(mine);
  ASSERT_OK(theirs);
  ASSERT_EQ(mine->pages.size(), 3u);
  ASSERT_EQ(theirs->pages.size(), 3u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(mine->pages[i] == Pages(keys)[i]) << "page " << i;
    EXPECT_TRUE(theirs->pages[i] == Pages(keys, 5)[i]) << "page " << i;
  }
}

// The killed client: run as a child of KilledMidPut (this binary, filtered to this case), it
// reserves three pages and waits to be killed. Skipped in a normal run (disabled).
TEST(PagesChild, DISABLED_ReserveThenWait) {
  std::ifstream cmdline("/proc/self/cmdline");
  const std::string args((std::istreambuf_iterator<char>(cmdline)), {});
  std::string target;
  for (absl::string_view arg : absl::StrSplit(args, '\0')) {
    if (absl::ConsumePrefix(&arg, kChildTargetFlag)) target = std::string(arg);
  }
  if (target.empty()) GTEST_SKIP() << "run only as PagesClientTest's child";
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target);
  ASSERT_OK(client);
  ASSERT_OK((*client)->OpenSession("default", "killed", kChildTtl, Manifest()));
  absl::StatusOr<KvCacheClient::PageReservation> reserved =
      (*client)->ReservePages(kPool, Keys("killed", 3));
  ASSERT_OK(reserved);
  std::cout << "reserved " << reserved->block_ids.size() << std::endl;
  absl::SleepFor(absl::Minutes(5));  // until SIGKILL
}

TEST_F(PagesClientTest, AClientKilledMidPutPublishesNothingAndHoldsNothing) {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(length, 0);
  absl::StatusOr<Subprocess> child = Subprocess::Start(
      {std::string(self, length), "--gtest_filter=PagesChild.DISABLED_ReserveThenWait",
       "--gtest_also_run_disabled_tests", absl::StrCat(kChildTargetFlag, address_)});
  ASSERT_OK(child);
  absl::StatusOr<std::string> line = child->ReadLineStartingWith("reserved ", absl::Seconds(30));
  ASSERT_OK(line);
  EXPECT_EQ(*line, "reserved 3");
  EXPECT_EQ(Counts().referenced, 3u);  // the child's reservation, unwritten

  ASSERT_OK(child->Signal(SIGKILL));
  absl::StatusOr<int> status = child->Wait(absl::Seconds(10));
  ASSERT_OK(status);
  EXPECT_TRUE(WIFSIGNALED(*status)) << DescribeWaitStatus(*status);
  // Nothing renews the child's lease now: past its TTL the daemon ends it.
  clock_.Advance(kChildTtl + absl::Seconds(1));
  EXPECT_TRUE(PollUntil([&] { return Counts().referenced == 0; }))
      << Counts().referenced << " blocks still referenced";
  EXPECT_EQ(Exists(*client_, Keys("killed", 3)), 0u);
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, ACorruptedRecordBelowIsAMissForItsPageAndEveryPageAfter) {
  pool_ = kHostOnlyPool;
  const std::vector<std::string> keys = Keys("deep", 4);
  ASSERT_OK(Put(*client_, keys));
  PagesPool().OffloadForTesting();                       // tier 2 holds the four pages
  ASSERT_OK(Put(*client_, Keys("evict", kPoolBlocks)));  // tier 1 now holds only these
  absl::StatusOr<KvCacheClient::PagesFound> found = client_->ExistsPages(pool_, keys);
  ASSERT_OK(found);
  ASSERT_EQ(found->num_pages, 4u);
  ASSERT_EQ(found->pages_by_tier.host, 4u);
  // A byte of page 2's state part flips in tier 2.
  ASSERT_TRUE(PagesPool().host_tier()->CorruptForTesting(PageHash(keys[2]), kKvBytes + 100));

  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages(pool_, keys);
  ASSERT_OK(got);
  ASSERT_EQ(got->pages.size(), 2u);
  EXPECT_TRUE(got->pages[0] == Pages(keys)[0]);
  EXPECT_TRUE(got->pages[1] == Pages(keys)[1]);
  EXPECT_EQ(got->pages_by_tier.host, 2u);
  absl::StatusOr<KvCacheClient::Stats> stats = client_->GetStats(pool_);
  ASSERT_OK(stats);
  ASSERT_EQ(stats->pools[0].tiers.size(), 1u);
  EXPECT_EQ(stats->pools[0].tiers[0].verify_failures, 1u);
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, ARestartFromDiskServesTheSamePages) {
  const std::vector<std::string> keys = Keys("persist", 4);
  ASSERT_OK(Put(*client_, keys, {kKv, kKv, kKv, kBoth}));
  Offload();
  ASSERT_EQ(PagesPool().disk_tier()->stats().records, 4u);

  client_.reset();
  daemon_.reset();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  client_ = Connect();
  ASSERT_NE(client_, nullptr);
  ASSERT_OK(RetryWhileUnavailable([&] {
    return client_->OpenSession("default", "after-restart", absl::ZeroDuration(), Manifest());
  }));
  absl::StatusOr<KvCacheClient::PagesFound> found = client_->ExistsPages(kPool, keys);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 4u);
  EXPECT_EQ(found->pages_by_tier.disk, 4u);
  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages(kPool, keys);
  ASSERT_OK(got);
  ASSERT_EQ(got->pages.size(), 4u);
  EXPECT_THAT(got->part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(got->pages[i] == Pages(keys)[i]) << "page " << i << " differs after the restart";
  }
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, BadInputOverTheWireHasPreciseCodesAndChangesNothing) {
  // A raw stub: the client would refuse most of these before they leave.
  std::unique_ptr<v1::KvCache::Stub> stub =
      v1::KvCache::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  const auto stamp = [&](auto* request) {
    request->set_session_id(client_->session_id());
    request->set_epoch(client_->session_epoch());
    request->set_pool(kPool);
  };
  const std::vector<std::string> good = Keys("good", 2);
  const std::vector<std::string> pages = Pages(good);
  // A put of `keys` with `pages` (one checksum per page, of its bytes unless `bad_checksum`).
  const auto put = [&](const std::vector<std::string>& keys, const std::vector<std::string>& bytes,
                       bool bad_checksum = false) {
    v1::PutPagesRequest request;
    stamp(&request);
    for (const std::string& key : keys) request.add_keys(key);
    for (const std::string& page : bytes) {
      request.add_pages(page);
      request.add_page_checksums(BlockChecksum(page.data(), page.size()) + bad_checksum);
    }
    v1::PutPagesResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub->PutPages(&context, request, &response));
  };
  const auto exists = [&](const std::vector<std::string>& keys,
                          const std::vector<std::string>& parts) {
    v1::ExistsPagesRequest request;
    stamp(&request);
    for (const std::string& key : keys) request.add_keys(key);
    for (const std::string& part : parts) request.add_parts(part);
    v1::ExistsPagesResponse response;
    grpc::ClientContext context;
    return FromGrpcStatus(stub->ExistsPages(&context, request, &response));
  };

  const std::string long_key(kMaxPageKeyBytes + 1, 'k');
  EXPECT_THAT(put({good[0], long_key}, {pages[0], pages[1]}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page key 1 has 65 bytes")));
  EXPECT_THAT(exists({long_key}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(exists(good, {"swa"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown part 'swa'")));
  EXPECT_THAT(put(good, {pages[0], pages[1].substr(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page 1 has")));
  EXPECT_THAT(put({}, {}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no page keys")));
  EXPECT_THAT(exists({}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<std::string> too_many = Keys("many", kMaxPagesPerCall + 1);
  EXPECT_THAT(exists(too_many, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4097 page keys")));
  EXPECT_THAT(put(good, pages, /*bad_checksum=*/true),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("page 0 does not match")));
  EXPECT_EQ(Exists(*client_, good), 0u);  // nothing published
  ExpectNothingHeld();

  // The client's own checks answer the same codes before anything leaves.
  EXPECT_THAT(client_->ExistsPages(kPool, {long_key}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("65 bytes")));
  EXPECT_THAT(client_->GetPages(kPool, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->PinPages(kPool, too_many, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("4097 page keys")));
  EXPECT_THAT(client_->PutPages(kPool, good, Views({pages[0]})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 pages for 2 page keys")));
  EXPECT_THAT(client_->ReservePages(kPool, good, {kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 part masks")));
  // ...and pass on the daemon's for what only it can tell.
  EXPECT_THAT(client_->PutPages(kPool, good, Views({pages[0], pages[1].substr(1)})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page 1 has")));
  EXPECT_THAT(client_->ExistsPages(kPool, good, {std::string("swa")}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown part")));
  EXPECT_THAT(client_->ReservePages(kPool, good, {kKv, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->PinPages(kPool, good, absl::Milliseconds((int64_t{1} << 32) + 1000)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most")));  // not 1 s
  std::unique_ptr<MappedPool> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  EXPECT_THAT(client_->WritePages(*mapped, good, Views({pages[0], pages[1].substr(1)})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page 1 has")));
  EXPECT_EQ(Exists(*client_, good), 0u);
  ExpectNothingHeld();
}

// A PutPages of kSlicedCopyMinBytes or more into a host pool is verified and copied
// a slice at a time, the later slices on the pool's workers: a wrong checksum in any slice fails
// the put naming the first bad page, with nothing published and nothing held, and a good one
// lands every page whole.
TEST_F(PagesClientTest, APutCutIntoSlicesOnTheWorkersNamesItsFirstBadPageOrLandsEveryPage) {
  pool_ = kWidePool;
  std::unique_ptr<v1::KvCache::Stub> stub =
      v1::KvCache::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  constexpr size_t kBatch = 40;
  ASSERT_GE(kBatch * page_bytes_, kSlicedCopyMinBytes);
  const std::vector<std::string> keys = Keys("sliced", kBatch);
  const std::vector<std::string> pages = Pages(keys);
  // A put of the batch whose pages `bad` carry a wrong checksum.
  const auto put = [&](const std::vector<size_t>& bad) -> absl::StatusOr<uint32_t> {
    v1::PutPagesRequest request;
    request.set_session_id(client_->session_id());
    request.set_epoch(client_->session_epoch());
    request.set_pool(kWidePool);
    for (size_t i = 0; i < kBatch; ++i) {
      request.add_keys(keys[i]);
      request.add_pages(pages[i]);
      const bool wrong = std::find(bad.begin(), bad.end(), i) != bad.end();
      request.add_page_checksums(BlockChecksum(pages[i].data(), pages[i].size()) + wrong);
    }
    v1::PutPagesResponse response;
    grpc::ClientContext context;
    RETURN_IF_ERROR(FromGrpcStatus(stub->PutPages(&context, request, &response)));
    return response.num_published();
  };
  EXPECT_THAT(put({37}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("page 37 does not match")));
  EXPECT_THAT(put({5, 37}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("page 5 does not match")));
  EXPECT_THAT(put({0, 39}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("page 0 does not match")));
  EXPECT_EQ(Exists(*client_, keys), 0u);
  ExpectNothingHeld();

  absl::StatusOr<uint32_t> published = put({});
  ASSERT_OK(published);
  EXPECT_EQ(*published, kBatch);
  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages(kWidePool, keys);
  ASSERT_OK(got);
  EXPECT_TRUE(got->pages == pages);
  // Each of the four puts handed its second slice out (run by the worker, or by the call's own
  // thread if it got there first).
  EXPECT_EQ(wide_pool_workers_->ran_on_workers() + wide_pool_workers_->ran_by_callers(), 4u);
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, APageChangedInTheMappedPoolFailsItsChecksumOnTheWayOut) {
  std::unique_ptr<MappedPool> mapped = Map();
  ASSERT_NE(mapped, nullptr);
  const std::vector<std::string> keys = Keys("changed", 3);
  ASSERT_OK(Put(*client_, keys));
  absl::StatusOr<KvCacheClient::AcquiredPages> acquired = client_->AcquirePages(kPool, keys);
  ASSERT_OK(acquired);
  ASSERT_EQ(acquired->block_ids.size(), 3u);
  // A stray write into a published page, behind the daemon's back.
  absl::StatusOr<absl::Span<uint8_t>> state = mapped->Part(acquired->block_ids[1], "state");
  ASSERT_OK(state);
  (*state)[7] ^= 0x5a;
  ASSERT_OK(client_->ReleaseSequence(acquired->sequence_id));

  EXPECT_THAT(client_->GetPages(kPool, keys),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("GetPages: page 1 (key \"changed/page-1\")")));
  std::vector<std::string> out(keys.size(), std::string(page_bytes_, '\0'));
  std::vector<absl::Span<char>> destinations;
  for (std::string& page : out) destinations.push_back(absl::MakeSpan(page));
  EXPECT_THAT(client_->ReadPagesInto(*mapped, keys, destinations),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ReadPagesInto: page 1")));
  ExpectNothingHeld();
}

TEST_F(PagesClientTest, PinsHoldPagesAndEveryCallNeedsASession) {
  const std::vector<std::string> keys = Keys("agent", 2);
  ASSERT_OK(Put(*client_, keys));
  absl::StatusOr<uint32_t> pinned = client_->PinPages(kPool, keys, absl::Seconds(30));
  ASSERT_OK(pinned);
  EXPECT_EQ(*pinned, 2u);
  EXPECT_EQ(Counts().referenced, 2u);
  // Pressure: the two pinned pages stay, so seven fresh ones do not fit in the eight blocks.
  EXPECT_THAT(Put(*client_, Keys("more", kPoolBlocks - 1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(Exists(*client_, keys), 2u);
  clock_.Advance(absl::Seconds(31));  // past the pin (the session's lease is longer)
  ASSERT_OK(Put(*client_, Keys("more", kPoolBlocks - 1)));
  ExpectNothingHeld();

  std::unique_ptr<KvCacheClient> sessionless = Connect();
  EXPECT_THAT(sessionless->ExistsPages(kPool, keys),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("open session")));
  EXPECT_THAT(sessionless->CommitPages(1), StatusIs(absl::StatusCode::kFailedPrecondition));
}

// An idle pool's expired pin is released by the time GetStats answers (or the reaper before it).
TEST_F(PagesClientTest, GetStatsShowsAnExpiredPinReleased) {
  const std::vector<std::string> keys = Keys("idle", 2);
  ASSERT_OK(Put(*client_, keys));
  ASSERT_OK(client_->PinPages(kPool, keys, absl::Seconds(30)));
  clock_.Advance(absl::Seconds(31));
  absl::StatusOr<KvCacheClient::Stats> stats = client_->GetStats(pool_);
  ASSERT_OK(stats);
  ASSERT_EQ(stats->pools.size(), 1u);
  EXPECT_EQ(stats->pools[0].counts.referenced, 0u);
  EXPECT_EQ(stats->pools[0].open_sequences, 0u);
  // A priority travels with the pin; past the highest it is refused.
  EXPECT_THAT(client_->PinPages(kPool, keys, absl::Seconds(30), /*priority=*/8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pin priority 8; at most 7")));
  ASSERT_OK(client_->PinPages(kPool, keys, absl::Seconds(30), /*priority=*/7));
  EXPECT_EQ(Counts().referenced, 2u);
}

}  // namespace
}  // namespace kvcache::testing
