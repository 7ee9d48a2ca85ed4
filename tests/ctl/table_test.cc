// kvcachectl's output: the table formatter (widths, alignment, no trailing spaces), the JSON
// documents' shapes (stable keys, numbers as numbers, 64-bit values as strings, null where a
// field does not apply), and the token parser of `lookup`.
#include "ctl/table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "ctl/format.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::ctl {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Keys(const Json& object) {
  std::vector<std::string> keys;
  for (auto it = object.begin(); it != object.end(); ++it) keys.push_back(it.key());
  return keys;
}

TEST(TableTest, ColumnsAreAsWideAsTheirWidestCellAndNumbersAlignRight) {
  Table table({{"NAME"}, {"BLOCKS", Align::kRight}, {"MEMORY"}});
  table.AddRow({"default", "64", "host"});
  table.AddRow({"a", "1048576", "cuda"});
  EXPECT_EQ(table.Render(),
            "NAME       BLOCKS   MEMORY\n"
            "default        64   host\n"
            "a         1048576   cuda\n");
  EXPECT_EQ(table.num_rows(), 2);
}

TEST(TableTest, NoLineEndsInSpaces) {
  Table table({{"A"}, {"LONG_HEADER"}});
  table.AddRow({"x", "y"});
  for (absl::string_view line : absl::StrSplit(table.Render(), '\n')) {
    EXPECT_FALSE(!line.empty() && line.back() == ' ') << "'" << line << "'";
  }
}

TEST(TableTest, AnEmptyTableIsItsHeader) {
  Table table({{"ID", Align::kRight}, {"TENANT"}});
  EXPECT_EQ(table.Render(), "ID   TENANT\n");
}

TEST(StreamTableTest, ColumnsStartAtTheirMinimumWidthAndOnlyGrow) {
  StreamTable table({{"SEQ", Align::kRight, 4}, {"KIND", Align::kLeft, 6}, {"N", Align::kRight}});
  EXPECT_EQ(table.Header(), " SEQ   KIND     N\n");
  EXPECT_EQ(table.Row({"1", "a", "2"}), "   1   a        2\n");
  EXPECT_EQ(table.Row({"123456", "stored", "10"}), "123456   stored   10\n");
  // The wider columns stay wide: later rows line up with the last one.
  EXPECT_EQ(table.Row({"7", "b", "3"}), "     7   b         3\n");
}

TEST(FormatTest, Cells) {
  EXPECT_EQ(Hex64(0xbedc5fa071cb8097ULL), "bedc5fa071cb8097");
  EXPECT_EQ(Hex64(1), "0000000000000001");
  EXPECT_EQ(PercentCell(32, 100), "32.0%");
  EXPECT_EQ(PercentCell(1, 3), "33.3%");
  EXPECT_EQ(PercentCell(0, 0), "-");
  EXPECT_FALSE(Ratio(5, 0).has_value());
  EXPECT_DOUBLE_EQ(*Ratio(1, 4), 0.25);
  EXPECT_EQ(LayoutSummary(PoolLayout{.num_layers = 28,
                                     .num_kv_heads = 8,
                                     .head_dim = 128,
                                     .block_size = 16,
                                     .dtype = DType::kBFloat16}),
            "L28/H8/D128/bf16");
  EXPECT_EQ(DurationCell(absl::Milliseconds(7532)), "7.5s");
  EXPECT_EQ(DurationCell(absl::Seconds(30)), "30s");
  EXPECT_EQ(DurationCell(absl::ZeroDuration()), "0");
  EXPECT_EQ(EventTime(1700000000123456), "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(EventTime(0), "-");
}

TEST(ParseTokensTest, TakesWhitespaceAndCommaSeparatedDecimals) {
  absl::StatusOr<std::vector<uint32_t>> tokens = ParseTokens(" 1, 2,3\n4\t\t5 ,,6\r\n4294967295");
  ASSERT_OK(tokens);
  EXPECT_THAT(*tokens, ElementsAre(1, 2, 3, 4, 5, 6, 4294967295u));
}

TEST(ParseTokensTest, RefusesWhatIsNotAToken) {
  EXPECT_THAT(ParseTokens(""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tokens")));
  EXPECT_THAT(ParseTokens(" ,\n "), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokens("1 2 x3"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 3 ('x3')")));
  EXPECT_THAT(ParseTokens("4294967296"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokens("-1"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokens("+5"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokens("0x10"), StatusIs(absl::StatusCode::kInvalidArgument));
}

KvCacheClient::PoolDescription SamplePool() {
  KvCacheClient::PoolDescription pool;
  pool.pool.name = "default";
  pool.pool.model_id = "";
  pool.pool.layout = PoolLayout{.num_layers = 4,
                                .num_kv_heads = 2,
                                .head_dim = 64,
                                .block_size = 16,
                                .dtype = DType::kFloat16};
  pool.pool.block_bytes = pool.pool.layout.BlockBytes();
  pool.pool.layout_fingerprint = 0xfedcba9876543210ULL;  // past 2^53: must stay exact
  pool.pool.num_blocks = 64;
  pool.pool.memory_kind = "host";
  pool.pool.mapping.kind = KvCacheClient::PoolMapping::Kind::kShm;
  pool.pool.mapping.shm_name = "/kvcache.1.default";
  pool.pool.mapping.size_bytes = 64 * pool.pool.block_bytes;
  pool.pool.parts = {{.name = "kv", .offset = 0, .bytes = 24576},
                     {.name = "state",
                      .offset = 24576,
                      .bytes = 8192,
                      .policy = PartHitPolicy::kTrailingPages,
                      .trailing_pages = 1}};
  pool.counts = {.free = 60, .evictable = 2, .referenced = 2};
  pool.manifests.push_back(KvCacheClient::ManifestInUse{
      .digest = "00112233445566778899aabbccddeeff",
      .tenant = "default",
      .manifest = ManifestFields{.model_id = "llama",
                                 .model_config_digest = "\x01\xff",
                                 .kv_dtype = "fp16",
                                 .page_tokens = 16,
                                 .parts = {{"kv", 24576}, {"state", 8192}},
                                 .parallel = {.tp_size = 2, .tp_rank = 1}},
      .sessions = 3});
  return pool;
}

TEST(PoolsFormatTest, TableRowAndJsonShape) {
  const std::vector<KvCacheClient::PoolDescription> pools = {SamplePool()};
  EXPECT_EQ(PoolsTable(pools).Render(),
            "NAME      MODEL   BLOCKS   BLOCK_SIZE   LAYOUT           PARTS                       "
            "MEMORY   FREE   EVICTABLE   REFERENCED   HASH\n"
            "default   -           64           16   L4/H2/D64/fp16   kv/24K+state/8K/trailing1   "
            "host       60           2            2   xxh3_128\n");

  const Json document = PoolsJson(pools);
  ASSERT_TRUE(document["pools"].is_array());
  ASSERT_EQ(document["pools"].size(), 1);
  const Json& pool = document["pools"][0];
  EXPECT_THAT(Keys(pool), ElementsAre("name", "model_id", "num_blocks", "block_size", "block_bytes",
                                      "layout", "parts", "memory_kind", "hash_algorithm", "counts",
                                      "mapping", "manifests"));
  EXPECT_EQ(pool["name"], "default");
  EXPECT_TRUE(pool["num_blocks"].is_number_unsigned());
  EXPECT_EQ(pool["num_blocks"], 64);
  EXPECT_EQ(pool["block_bytes"], 32768);
  EXPECT_EQ(pool["layout"]["dtype"], "fp16");
  EXPECT_EQ(pool["layout"]["fingerprint"], "fedcba9876543210");
  EXPECT_EQ(pool["hash_algorithm"], "xxh3_128");
  EXPECT_EQ(pool["counts"]["free"], 60);
  EXPECT_EQ(pool["counts"]["evictable"], 2);
  EXPECT_EQ(pool["counts"]["referenced"], 2);
  EXPECT_EQ(pool["mapping"]["kind"], "shm");
  EXPECT_EQ(pool["mapping"]["shm_name"], "/kvcache.1.default");
  EXPECT_TRUE(pool["mapping"]["cuda_device"].is_null());
  ASSERT_EQ(pool["manifests"].size(), 1);
  const Json& manifest = pool["manifests"][0];
  EXPECT_EQ(manifest["digest"], "00112233445566778899aabbccddeeff");
  EXPECT_EQ(manifest["sessions"], 3);
  EXPECT_EQ(manifest["model_config_digest"], "01ff");
  EXPECT_EQ(manifest["page_tokens"], 16);
  EXPECT_EQ(manifest["parts"][0]["bytes"], 24576);
  EXPECT_EQ(manifest["parts"][1]["name"], "state");
  EXPECT_EQ(manifest["parallel"]["tp_rank"], 1);
  ASSERT_EQ(pool["parts"].size(), 2);
  EXPECT_EQ(pool["parts"][1]["name"], "state");
  EXPECT_EQ(pool["parts"][1]["offset"], 24576);
  EXPECT_EQ(pool["parts"][1]["bytes"], 8192);
  EXPECT_EQ(pool["parts"][1]["hit_policy"], "trailing_pages");
  EXPECT_EQ(pool["parts"][1]["trailing_pages"], 1);
  EXPECT_EQ(pool["parts"][0]["hit_policy"], "all_pages");
  EXPECT_EQ(PoolJson(pools[0]), pool);
}

TEST(PoolsFormatTest, PartsReadAsAPoolSpecWritesThem) {
  const KvCacheClient::PoolDescription pool = SamplePool();
  EXPECT_EQ(PartsSummary(pool.pool.parts), "kv/24K+state/8K/trailing1");
  EXPECT_EQ(PartsSummary({{.name = "kv", .bytes = 100}}), "kv/100");
  EXPECT_EQ(PartsSummary({}), "-");
  EXPECT_EQ(ManifestPartsSummary(pool.manifests[0].manifest.parts), "kv/24K+state/8K");
}

TEST(PoolsFormatTest, DescribeTablesShowPartsAndManifests) {
  const KvCacheClient::PoolDescription pool = SamplePool();
  EXPECT_EQ(PartsTable(pool.pool.parts).Render(),
            "PART    OFFSET   BYTES   HIT_POLICY       TRAILING_PAGES\n"
            "kv           0   24576   all_pages                     -\n"
            "state    24576    8192   trailing_pages                1\n");
  EXPECT_EQ(ManifestsTable(pool.manifests).Render(),
            "DIGEST                             TENANT    MODEL   CONFIG   DTYPE   PAGE_TOKENS   "
            "PARTS             TP    PP    CP    KEY_HASH   SESSIONS\n"
            "00112233445566778899aabbccddeeff   default   llama   01ff     fp16             16   "
            "kv/24K+state/8K   1/2   0/1   0/1   -                 3\n");
}

TEST(StatsFormatTest, HitRatioIsComputedFromTheCounters) {
  v1::GetStatsResponse stats;
  stats.set_open_sessions(3);
  v1::PoolStats* pool = stats.add_pools();
  pool->set_pool("default");
  pool->set_tenant("team-a");
  pool->set_prompt_tokens(80);
  pool->set_hit_tokens(32);
  pool->set_published_blocks(5);
  pool->mutable_counts()->set_free(60);
  v1::PoolStats* idle = stats.add_pools();
  idle->set_pool("idle");  // no tenant: the whole pool; no prompts yet

  const std::string table = StatsTable(stats).Render();
  EXPECT_THAT(table, HasSubstr("HIT_RATIO"));
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3);
  EXPECT_THAT(lines[1], HasSubstr("40.0%"));
  EXPECT_THAT(lines[2], ::testing::StartsWith("idle      *"));

  const Json document = StatsJson(stats);
  EXPECT_EQ(document["open_sessions"], 3);
  EXPECT_DOUBLE_EQ(document["pools"][0]["hit_ratio"].get<double>(), 0.4);
  EXPECT_EQ(document["pools"][0]["tenant"], "team-a");
  EXPECT_EQ(document["pools"][0]["published_blocks"], 5);
  EXPECT_EQ(document["pools"][0]["counts"]["free"], 60);
  EXPECT_TRUE(document["pools"][1]["hit_ratio"].is_null());
  EXPECT_EQ(Keys(document["pools"][0]), Keys(document["pools"][1]));
}

TEST(SessionsFormatTest, HiddenIdsAreDashesAndNulls) {
  std::vector<KvCacheClient::ListedSession> sessions(2);
  sessions[0] = {.session_id = 15480462953669326536ULL,
                 .tenant = "default",
                 .principal = "uid:1000",
                 .client_name = "worker 0",
                 .ttl = absl::Seconds(30),
                 .expires_in = absl::Milliseconds(29412),
                 .open_sequences = 1};
  sessions[1] = {.session_id = 0, .tenant = "default", .principal = "uid:1001"};
  const std::vector<std::string> lines =
      absl::StrSplit(SessionsTable(sessions).Render(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3);
  // The client name's space would split the row for awk.
  EXPECT_THAT(lines[1], HasSubstr("15480462953669326536   default   uid:1000    worker_0"));
  EXPECT_THAT(lines[2], ::testing::StartsWith("                   -   default"));

  const Json document = SessionsJson(sessions);
  EXPECT_EQ(document["sessions"][0]["session_id"], "15480462953669326536");
  EXPECT_EQ(document["sessions"][0]["client_name"], "worker 0");
  EXPECT_EQ(document["sessions"][0]["ttl_ms"], 30000);
  EXPECT_EQ(document["sessions"][0]["expires_in_ms"], 29412);
  EXPECT_TRUE(document["sessions"][1]["session_id"].is_null());
}

TEST(LookupFormatTest, TableAndJson) {
  const LookupReport report{.pool = "default",
                            .num_tokens = 40,
                            .result = {.num_cached_tokens = 32, .num_cached_blocks = 2}};
  EXPECT_EQ(LookupTable(report).Render(),
            "POOL      TOKENS   CACHED_BLOCKS   CACHED_TOKENS\n"
            "default       40               2              32\n");
  EXPECT_EQ(LookupJson(report).dump(),
            R"({"pool":"default","num_tokens":40,"num_cached_blocks":2,"num_cached_tokens":32})");
}

TEST(EventFormatTest, StoredRemovedAndClearedShareOneShape) {
  v1::KvEvent stored;
  stored.set_sequence(7);
  stored.set_time_unix_micros(1700000000123456);
  v1::BlocksStored* blocks = stored.mutable_blocks_stored();
  blocks->set_pool("default");
  blocks->set_tenant("default");
  blocks->set_medium("CPU");
  blocks->set_block_size(16);
  blocks->mutable_parent_hash()->set_lo(0xaaULL);
  blocks->add_blocks()->mutable_hash()->set_lo(0xfedcba9876543210ULL);
  blocks->add_blocks()->mutable_hash()->set_lo(2);

  v1::KvEvent removed;
  removed.set_sequence(8);
  removed.mutable_blocks_removed()->set_pool("default");
  removed.mutable_blocks_removed()->add_hashes()->set_lo(2);

  v1::KvEvent cleared;
  cleared.set_sequence(0);
  cleared.mutable_all_blocks_cleared();

  EXPECT_THAT(EventCells(stored),
              ElementsAre("7", "2023-11-14T22:13:20.123Z", "BlocksStored", "default", "default",
                          "CPU", "2", "fedcba9876543210", "00000000000000aa"));
  EXPECT_THAT(EventCells(removed), ElementsAre("8", "-", "BlocksRemoved", "default", "-", "-", "1",
                                               "0000000000000002", "-"));
  EXPECT_THAT(EventCells(cleared),
              ElementsAre("0", "-", "AllBlocksCleared", "*", "-", "-", "-", "-", "-"));

  const Json stored_json = EventJson(stored);
  EXPECT_EQ(
      stored_json.dump(),
      R"({"sequence":7,"time":"2023-11-14T22:13:20.123Z","time_unix_micros":1700000000123456,)"
      R"("kind":"BlocksStored","pool":"default","tenant":"default","medium":"CPU",)"
      R"("block_size":16,"num_blocks":2,"first_hash":"fedcba9876543210",)"
      R"("parent_hash":"00000000000000aa","hashes":["fedcba9876543210","0000000000000002"]})");
  const Json cleared_json = EventJson(cleared);
  EXPECT_EQ(Keys(cleared_json), Keys(stored_json));
  EXPECT_EQ(Keys(EventJson(removed)), Keys(stored_json));
  EXPECT_EQ(cleared_json["kind"], "AllBlocksCleared");
  EXPECT_TRUE(cleared_json["num_blocks"].is_null());
  EXPECT_TRUE(cleared_json["first_hash"].is_null());
  EXPECT_TRUE(cleared_json["time"].is_null());
  EXPECT_EQ(EventJson(removed)["num_blocks"], 1);
  EXPECT_TRUE(EventJson(removed)["parent_hash"].is_null());
}

TEST(HealthFormatTest, Json) {
  EXPECT_EQ(HealthJson("", "SERVING").dump(), R"({"service":"","status":"SERVING"})");
}

}  // namespace
}  // namespace kvcache::ctl
