// What kvcachectl prints for each command, as a table for people (ctl/table.h) and as JSON for
// scripts. Kept apart from the RPCs so the shapes can be tested without a daemon.
//
// JSON conventions (also in `kvcachectl --help`): field names are snake_case and stable; counts
// are JSON numbers; values that are 64-bit and may exceed 2^53 — where a JavaScript reader would
// silently round them — are strings: block hashes and layout fingerprints as 16 lowercase hex
// digits (a block hash's low 64 bits, vLLM's event hash), session ids and epochs as decimal.
// Every key is always present; a value that does not apply is null.
//
// Thread safety: functions of their arguments only.
#ifndef KVCACHE_CTL_FORMAT_H_
#define KVCACHE_CTL_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/kv_cache_client.h"
#include "ctl/table.h"
#include "kvcache/v1/kvcache.pb.h"
#include "nlohmann/json.hpp"

namespace kvcache::ctl {

// Keys in the order they were set: documents read the same from one run to the next.
using Json = nlohmann::ordered_json;

// 16 lowercase hex digits.
std::string Hex64(uint64_t value);
// part / whole, or nullopt when whole is 0 (a ratio of nothing is not 0%).
std::optional<double> Ratio(uint64_t part, uint64_t whole);
// "62.5%", or "-" when whole is 0.
std::string PercentCell(uint64_t part, uint64_t whole);
// "L28/H8/D128/bf16": layers, KV heads, head dimension, element type.
std::string LayoutSummary(const PoolLayout& layout);
// A duration to 0.1 s ("10s", "7.5s", "0s").
std::string DurationCell(absl::Duration duration);
// An event's time, UTC to the millisecond: "2024-05-01T12:34:56.789Z"; "-" for 0 (a snapshot's
// AllBlocksCleared carries no time).
std::string EventTime(int64_t unix_micros);

// Prompt tokens from text: decimal integers in [0, 2^32) separated by whitespace and/or commas.
// INVALID_ARGUMENT naming the first bad one (its position and text), or for text with none.
absl::StatusOr<std::vector<uint32_t>> ParseTokens(absl::string_view text);

// A pool's page parts as its spec declares them: "kv/12K+state/4K/trailing1" (sizes in K where
// whole kibibytes, else bytes).
std::string PartsSummary(absl::Span<const PagePartLayout> parts);
// A manifest's parts: "kv/12K+state/4K" (a manifest names no hit policy).
std::string ManifestPartsSummary(absl::Span<const PagePart> parts);

// `kvcachectl pools`: ListPools with each pool's DescribePool.
Table PoolsTable(absl::Span<const KvCacheClient::PoolDescription> pools);
Json PoolsJson(absl::Span<const KvCacheClient::PoolDescription> pools);

// `kvcachectl describe --pool P`: one pool's DescribePool, its page parts and the compatibility
// manifests in use on it. The document is the pool's entry of PoolsJson.
Table PartsTable(absl::Span<const PagePartLayout> parts);
Table ManifestsTable(absl::Span<const KvCacheClient::ManifestInUse> manifests);
Json PoolJson(const KvCacheClient::PoolDescription& pool);

// `kvcachectl stats`: GetStats.
Table StatsTable(const v1::GetStatsResponse& stats);
Json StatsJson(const v1::GetStatsResponse& stats);

// `kvcachectl sessions`: ListSessions.
Table SessionsTable(absl::Span<const KvCacheClient::ListedSession> sessions);
Json SessionsJson(absl::Span<const KvCacheClient::ListedSession> sessions);

// `kvcachectl lookup`: one Lookup.
struct LookupReport {
  std::string pool;
  uint64_t num_tokens = 0;
  KvCacheClient::LookupResult result;
};
Table LookupTable(const LookupReport& report);
Json LookupJson(const LookupReport& report);

// `kvcachectl events`: one row or JSON object per KV event.
StreamTable EventsTable();
std::vector<std::string> EventCells(const v1::KvEvent& event);
Json EventJson(const v1::KvEvent& event);
// "BlocksStored", "BlocksRemoved", "AllBlocksCleared" (the proto's names, as in vLLM's events),
// or "Unknown" for an event this build does not know.
absl::string_view EventKind(const v1::KvEvent& event);

// `kvcachectl version`: this kvcachectl's version and revision (common/version.h), and the
// daemon's at `target` when one answered (its Ping).
std::string VersionText(const std::optional<KvCacheClient::ServerVersion>& server,
                        absl::string_view target);
Json VersionJson(const std::optional<KvCacheClient::ServerVersion>& server,
                 absl::string_view target);

// `kvcachectl health`: the health service's answer ("SERVING", "NOT_SERVING", "SERVICE_UNKNOWN").
Json HealthJson(absl::string_view service, absl::string_view status);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CTL_FORMAT_H_
