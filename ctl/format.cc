#include "ctl/format.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/block_hash.h"
#include "common/compatibility_manifest.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"
#include "common/version.h"

namespace kvcache::ctl {
namespace {

// Cells never hold spaces or nothing at all: either would shift `awk`'s fields.
std::string Cell(absl::string_view text) {
  if (text.empty()) return "-";
  std::string cell(text);
  for (char& c : cell) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) c = '_';
  }
  return cell;
}

std::string Number(uint64_t value) { return absl::StrCat(value); }

Json CountsJson(uint32_t free, uint32_t evictable, uint32_t referenced) {
  Json counts = Json::object();
  counts["free"] = free;
  counts["evictable"] = evictable;
  counts["referenced"] = referenced;
  return counts;
}

absl::string_view MappingKind(KvCacheClient::PoolMapping::Kind kind) {
  switch (kind) {
    case KvCacheClient::PoolMapping::Kind::kShm:
      return "shm";
    case KvCacheClient::PoolMapping::Kind::kCudaIpc:
      return "cuda_ipc";
    case KvCacheClient::PoolMapping::Kind::kNone:
      break;
  }
  return "none";
}

Json HashOrNull(const v1::BlockHash* hash) {
  return hash == nullptr ? Json(nullptr) : Json(Hex64(hash->lo()));
}

// The fields of an event that its kind carries; the others stay empty.
struct EventFields {
  std::string pool;
  std::string tenant;
  std::string medium;
  std::optional<uint32_t> block_size;
  std::vector<const v1::BlockHash*> hashes;
  const v1::BlockHash* parent = nullptr;
  bool has_blocks = false;  // false for AllBlocksCleared: "how many blocks" does not apply
};

EventFields FieldsOf(const v1::KvEvent& event) {
  EventFields fields;
  switch (event.kind_case()) {
    case v1::KvEvent::kBlocksStored: {
      const v1::BlocksStored& stored = event.blocks_stored();
      fields.pool = stored.pool();
      fields.tenant = stored.tenant();
      fields.medium = stored.medium();
      fields.block_size = stored.block_size();
      for (const v1::StoredBlock& block : stored.blocks()) fields.hashes.push_back(&block.hash());
      if (stored.has_parent_hash()) fields.parent = &stored.parent_hash();
      fields.has_blocks = true;
      break;
    }
    case v1::KvEvent::kBlocksRemoved: {
      const v1::BlocksRemoved& removed = event.blocks_removed();
      fields.pool = removed.pool();
      fields.tenant = removed.tenant();
      fields.medium = removed.medium();
      for (const v1::BlockHash& hash : removed.hashes()) fields.hashes.push_back(&hash);
      fields.has_blocks = true;
      break;
    }
    case v1::KvEvent::kAllBlocksCleared:
      fields.pool = event.all_blocks_cleared().pool();
      break;
    case v1::KvEvent::KIND_NOT_SET:
      break;
  }
  return fields;
}

}  // namespace

std::string Hex64(uint64_t value) { return absl::StrFormat("%016x", value); }

std::optional<double> Ratio(uint64_t part, uint64_t whole) {
  if (whole == 0) return std::nullopt;
  return static_cast<double>(part) / static_cast<double>(whole);
}

std::string PercentCell(uint64_t part, uint64_t whole) {
  std::optional<double> ratio = Ratio(part, whole);
  if (!ratio.has_value()) return "-";
  return absl::StrFormat("%.1f%%", *ratio * 100);
}

std::string LayoutSummary(const PoolLayout& layout) {
  return absl::StrCat("L", layout.num_layers, "/H", layout.num_kv_heads, "/D", layout.head_dim, "/",
                      DTypeName(layout.dtype));
}

std::string DurationCell(absl::Duration duration) {
  return absl::FormatDuration(absl::Trunc(duration, absl::Milliseconds(100)));
}

std::string EventTime(int64_t unix_micros) {
  // A snapshot's AllBlocksCleared stands for the state, not for something that happened.
  if (unix_micros == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMicros(unix_micros),
                          absl::UTCTimeZone());
}

absl::StatusOr<std::vector<uint32_t>> ParseTokens(absl::string_view text) {
  std::vector<uint32_t> tokens;
  for (absl::string_view word :
       absl::StrSplit(text, absl::ByAnyChar(" \t\r\n\f\v,"), absl::SkipEmpty())) {
    uint32_t token = 0;
    // Digits only: SimpleAtoi alone would also take "+5".
    const bool digits = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
      return absl::ascii_isdigit(static_cast<unsigned char>(c));
    });
    if (!digits || !absl::SimpleAtoi(word, &token)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", tokens.size() + 1, " ('", word.substr(0, 32),
                       "') is not a decimal integer in [0, 4294967295]"));
    }
    tokens.push_back(token);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        "no tokens: want decimal token ids separated by whitespace or commas");
  }
  return tokens;
}

namespace {

// "12K" for whole kibibytes (as a pool spec may write them), else the bytes.
std::string PartBytes(uint64_t bytes) {
  return bytes % 1024 == 0 ? absl::StrCat(bytes / 1024, "K") : absl::StrCat(bytes);
}

std::string HitPolicyName(const PagePartLayout& part) {
  return part.policy == PartHitPolicy::kTrailingPages ? "trailing_pages" : "all_pages";
}

// "1/2": a rank of a size (a size of 0 means 1).
std::string RankOf(uint32_t rank, uint32_t size) {
  return absl::StrCat(rank, "/", std::max<uint32_t>(size, 1));
}

}  // namespace

std::string PartsSummary(absl::Span<const PagePartLayout> parts) {
  if (parts.empty()) return "-";
  std::vector<std::string> named;
  for (const PagePartLayout& part : parts) {
    named.push_back(absl::StrCat(part.name, "/", PartBytes(part.bytes),
                                 part.policy == PartHitPolicy::kTrailingPages
                                     ? absl::StrCat("/trailing", part.trailing_pages)
                                     : ""));
  }
  return absl::StrJoin(named, "+");
}

std::string ManifestPartsSummary(absl::Span<const PagePart> parts) {
  if (parts.empty()) return "-";
  std::vector<std::string> named;
  for (const PagePart& part : parts)
    named.push_back(absl::StrCat(part.name, "/", PartBytes(part.bytes)));
  return absl::StrJoin(named, "+");
}

Table PoolsTable(absl::Span<const KvCacheClient::PoolDescription> pools) {
  Table table({{"NAME"},
               {"MODEL"},
               {"BLOCKS", Align::kRight},
               {"BLOCK_SIZE", Align::kRight},
               {"LAYOUT"},
               {"PARTS"},
               {"MEMORY"},
               {"FREE", Align::kRight},
               {"EVICTABLE", Align::kRight},
               {"REFERENCED", Align::kRight},
               {"HASH"}});
  for (const KvCacheClient::PoolDescription& pool : pools) {
    const KvCacheClient::PoolInfo& info = pool.pool;
    table.AddRow({Cell(info.name), Cell(info.model_id), Number(info.num_blocks),
                  Number(info.layout.block_size), LayoutSummary(info.layout),
                  PartsSummary(info.parts), Cell(info.memory_kind), Number(pool.counts.free),
                  Number(pool.counts.evictable), Number(pool.counts.referenced),
                  std::string(HashAlgorithmName(info.hash_algorithm))});
  }
  return table;
}

// The compatibility manifests in use on a pool (DescribePool's), what an operator checks when
// two engines that should share KV do not: which field differs.
Json ManifestsJson(absl::Span<const KvCacheClient::ManifestInUse> uses) {
  Json list = Json::array();
  for (const KvCacheClient::ManifestInUse& use : uses) {
    const ManifestFields& manifest = use.manifest;
    Json parallel = Json::object();
    parallel["tp_size"] = manifest.parallel.tp_size;
    parallel["tp_rank"] = manifest.parallel.tp_rank;
    parallel["pp_size"] = manifest.parallel.pp_size;
    parallel["pp_rank"] = manifest.parallel.pp_rank;
    parallel["cp_size"] = manifest.parallel.cp_size;
    parallel["cp_rank"] = manifest.parallel.cp_rank;
    Json parts = Json::array();
    for (const PagePart& part : manifest.parts) {
      Json item = Json::object();
      item["name"] = part.name;
      item["bytes"] = part.bytes;
      parts.push_back(std::move(item));
    }
    Json item = Json::object();
    item["digest"] = use.digest;
    item["tenant"] = use.tenant;
    item["sessions"] = use.sessions;
    item["model_id"] = manifest.model_id;
    // Opaque bytes: hex, so any engine's digest prints.
    item["model_config_digest"] = absl::BytesToHexString(manifest.model_config_digest);
    item["kv_dtype"] = manifest.kv_dtype;
    item["kv_codec"] = manifest.kv_codec;
    item["page_tokens"] = manifest.page_tokens;
    item["parts"] = std::move(parts);
    item["parallel"] = std::move(parallel);
    item["key_hash_algorithm"] = manifest.key_hash_algorithm;
    list.push_back(std::move(item));
  }
  return list;
}

Json PoolJson(const KvCacheClient::PoolDescription& pool) {
  const KvCacheClient::PoolInfo& info = pool.pool;
  Json layout = Json::object();
  layout["num_layers"] = info.layout.num_layers;
  layout["num_kv_heads"] = info.layout.num_kv_heads;
  layout["head_dim"] = info.layout.head_dim;
  layout["block_size"] = info.layout.block_size;
  layout["dtype"] = std::string(DTypeName(info.layout.dtype));
  layout["fingerprint"] = Hex64(info.layout_fingerprint);
  Json mapping = Json::object();
  mapping["kind"] = std::string(MappingKind(info.mapping.kind));
  mapping["shm_name"] = info.mapping.kind == KvCacheClient::PoolMapping::Kind::kShm
                            ? Json(info.mapping.shm_name)
                            : Json(nullptr);
  mapping["size_bytes"] = info.mapping.size_bytes;
  mapping["cuda_device"] = info.mapping.kind == KvCacheClient::PoolMapping::Kind::kCudaIpc
                               ? Json(info.mapping.cuda_device)
                               : Json(nullptr);
  Json item = Json::object();
  item["name"] = info.name;
  item["model_id"] = info.model_id;
  item["num_blocks"] = info.num_blocks;
  item["block_size"] = info.layout.block_size;
  item["block_bytes"] = info.block_bytes;
  item["layout"] = std::move(layout);
  Json parts = Json::array();
  for (const PagePartLayout& part : info.parts) {
    Json entry = Json::object();
    entry["name"] = part.name;
    entry["offset"] = part.offset;
    entry["bytes"] = part.bytes;
    entry["hit_policy"] = HitPolicyName(part);
    entry["trailing_pages"] = part.trailing_pages;
    parts.push_back(std::move(entry));
  }
  item["parts"] = std::move(parts);
  item["memory_kind"] = info.memory_kind;
  item["hash_algorithm"] = std::string(HashAlgorithmName(info.hash_algorithm));
  item["counts"] = CountsJson(pool.counts.free, pool.counts.evictable, pool.counts.referenced);
  item["mapping"] = std::move(mapping);
  item["manifests"] = ManifestsJson(pool.manifests);
  return item;
}

Json PoolsJson(absl::Span<const KvCacheClient::PoolDescription> pools) {
  Json list = Json::array();
  for (const KvCacheClient::PoolDescription& pool : pools) list.push_back(PoolJson(pool));
  Json document = Json::object();
  document["pools"] = std::move(list);
  return document;
}

Table PartsTable(absl::Span<const PagePartLayout> parts) {
  Table table({{"PART"},
               {"OFFSET", Align::kRight},
               {"BYTES", Align::kRight},
               {"HIT_POLICY"},
               {"TRAILING_PAGES", Align::kRight}});
  for (const PagePartLayout& part : parts) {
    table.AddRow(
        {Cell(part.name), Number(part.offset), Number(part.bytes), HitPolicyName(part),
         part.policy == PartHitPolicy::kTrailingPages ? Number(part.trailing_pages) : "-"});
  }
  return table;
}

Table ManifestsTable(absl::Span<const KvCacheClient::ManifestInUse> manifests) {
  Table table({{"DIGEST"},
               {"TENANT"},
               {"MODEL"},
               {"CONFIG"},
               {"DTYPE"},
               {"PAGE_TOKENS", Align::kRight},
               {"PARTS"},
               {"TP"},
               {"PP"},
               {"CP"},
               {"KEY_HASH"},
               {"SESSIONS", Align::kRight}});
  for (const KvCacheClient::ManifestInUse& use : manifests) {
    const ManifestFields& manifest = use.manifest;
    const ParallelGeometry& parallel = manifest.parallel;
    table.AddRow({Cell(use.digest), Cell(use.tenant), Cell(manifest.model_id),
                  Cell(absl::BytesToHexString(manifest.model_config_digest)),
                  Cell(manifest.kv_dtype), Number(manifest.page_tokens),
                  ManifestPartsSummary(manifest.parts), RankOf(parallel.tp_rank, parallel.tp_size),
                  RankOf(parallel.pp_rank, parallel.pp_size),
                  RankOf(parallel.cp_rank, parallel.cp_size), Cell(manifest.key_hash_algorithm),
                  Number(use.sessions)});
  }
  return table;
}

Table StatsTable(const v1::GetStatsResponse& stats) {
  Table table({{"POOL"},
               {"TENANT"},
               {"PROMPT_TOKENS", Align::kRight},
               {"HIT_TOKENS", Align::kRight},
               {"HIT_RATIO", Align::kRight},
               {"FREE", Align::kRight},
               {"EVICTABLE", Align::kRight},
               {"REFERENCED", Align::kRight},
               {"EVICTIONS", Align::kRight},
               {"RESURRECTED", Align::kRight},
               {"PUBLISHED", Align::kRight},
               {"DUPLICATES", Align::kRight},
               {"OPEN_SEQS", Align::kRight}});
  for (const v1::PoolStats& pool : stats.pools()) {
    // An empty tenant is the whole pool (an admin's view).
    table.AddRow({Cell(pool.pool()), pool.tenant().empty() ? "*" : Cell(pool.tenant()),
                  Number(pool.prompt_tokens()), Number(pool.hit_tokens()),
                  PercentCell(pool.hit_tokens(), pool.prompt_tokens()),
                  Number(pool.counts().free()), Number(pool.counts().evictable()),
                  Number(pool.counts().referenced()), Number(pool.evictions()),
                  Number(pool.resurrected_blocks()), Number(pool.published_blocks()),
                  Number(pool.duplicate_blocks()), Number(pool.open_sequences())});
  }
  return table;
}

Json StatsJson(const v1::GetStatsResponse& stats) {
  Json list = Json::array();
  for (const v1::PoolStats& pool : stats.pools()) {
    Json item = Json::object();
    item["pool"] = pool.pool();
    item["tenant"] = pool.tenant();
    item["prompt_tokens"] = pool.prompt_tokens();
    item["hit_tokens"] = pool.hit_tokens();
    std::optional<double> ratio = Ratio(pool.hit_tokens(), pool.prompt_tokens());
    item["hit_ratio"] = ratio.has_value() ? Json(*ratio) : Json(nullptr);
    item["hit_blocks"] = pool.hit_blocks();
    item["miss_blocks"] = pool.miss_blocks();
    item["resurrected_blocks"] = pool.resurrected_blocks();
    item["evictions"] = pool.evictions();
    item["published_blocks"] = pool.published_blocks();
    item["duplicate_blocks"] = pool.duplicate_blocks();
    item["open_sequences"] = pool.open_sequences();
    item["counts"] =
        CountsJson(pool.counts().free(), pool.counts().evictable(), pool.counts().referenced());
    // The pool's lower tiers (v1.TierStats), top down; empty without any.
    Json tiers = Json::array();
    for (const v1::TierStats& tier : pool.tiers()) {
      Json entry = Json::object();
      entry["tier"] = tier.tier();
      entry["hit_blocks"] = tier.hit_blocks();
      entry["stored_blocks"] = tier.stored_blocks();
      entry["evicted_blocks"] = tier.evicted_blocks();
      entry["records"] = tier.records();
      entry["bytes_used"] = tier.bytes_used();
      entry["capacity_bytes"] = tier.capacity_bytes();
      entry["verify_failures"] = tier.verify_failures();
      if (tier.tier() != "host") entry["open_failures"] = tier.open_failures();
      entry["load_failures"] = tier.load_failures();
      entry["deadline_blocks"] = tier.deadline_blocks();
      entry["evicted_from_above"] = tier.evicted_from_above();
      entry["lost_from_above"] = tier.lost_from_above();
      if (tier.tier() == "cluster") {
        entry["poorer_kept_back"] = tier.poorer_kept_back();
      } else {
        entry["superseded"] = tier.superseded();
      }
      entry["request_waits"] = tier.request_waits();
      entry["store_failures"] = tier.store_failures();
      if (tier.tier() == "disk") {
        entry["restored_records"] = tier.restored_records();
        entry["restore_skipped"] = tier.restore_skipped();
      }
      if (tier.tier() == "cluster") {
        entry["node_failures"] = tier.node_failures();
        entry["skipped_commands"] = tier.skipped_commands();
        entry["redirects"] = tier.redirects();
      }
      tiers.push_back(std::move(entry));
    }
    item["tiers"] = std::move(tiers);
    list.push_back(std::move(item));
  }
  Json document = Json::object();
  document["open_sessions"] = stats.open_sessions();
  document["pools"] = std::move(list);
  return document;
}

Table SessionsTable(absl::Span<const KvCacheClient::ListedSession> sessions) {
  Table table({{"ID", Align::kRight},
               {"TENANT"},
               {"PRINCIPAL"},
               {"CLIENT"},
               {"TTL", Align::kRight},
               {"EXPIRES_IN", Align::kRight},
               {"SEQUENCES", Align::kRight}});
  for (const KvCacheClient::ListedSession& session : sessions) {
    // Id 0: another identity's session, whose id the daemon does not show.
    table.AddRow({session.session_id == 0 ? "-" : Number(session.session_id), Cell(session.tenant),
                  Cell(session.principal), Cell(session.client_name), DurationCell(session.ttl),
                  DurationCell(session.expires_in), Number(session.open_sequences)});
  }
  return table;
}

Json SessionsJson(absl::Span<const KvCacheClient::ListedSession> sessions) {
  Json list = Json::array();
  for (const KvCacheClient::ListedSession& session : sessions) {
    Json item = Json::object();
    item["session_id"] =
        session.session_id == 0 ? Json(nullptr) : Json(absl::StrCat(session.session_id));
    item["tenant"] = session.tenant;
    item["principal"] = session.principal;
    item["client_name"] = session.client_name;
    item["ttl_ms"] = absl::ToInt64Milliseconds(session.ttl);
    item["expires_in_ms"] = absl::ToInt64Milliseconds(session.expires_in);
    item["open_sequences"] = session.open_sequences;
    list.push_back(std::move(item));
  }
  Json document = Json::object();
  document["sessions"] = std::move(list);
  return document;
}

Table LookupTable(const LookupReport& report) {
  Table table({{"POOL"},
               {"TOKENS", Align::kRight},
               {"CACHED_BLOCKS", Align::kRight},
               {"CACHED_TOKENS", Align::kRight}});
  table.AddRow({Cell(report.pool), Number(report.num_tokens),
                Number(report.result.num_cached_blocks), Number(report.result.num_cached_tokens)});
  return table;
}

Json LookupJson(const LookupReport& report) {
  Json document = Json::object();
  document["pool"] = report.pool;
  document["num_tokens"] = report.num_tokens;
  document["num_cached_blocks"] = report.result.num_cached_blocks;
  document["num_cached_tokens"] = report.result.num_cached_tokens;
  return document;
}

absl::string_view EventKind(const v1::KvEvent& event) {
  switch (event.kind_case()) {
    case v1::KvEvent::kBlocksStored:
      return "BlocksStored";
    case v1::KvEvent::kBlocksRemoved:
      return "BlocksRemoved";
    case v1::KvEvent::kAllBlocksCleared:
      return "AllBlocksCleared";
    case v1::KvEvent::KIND_NOT_SET:
      break;
  }
  return "Unknown";
}

StreamTable EventsTable() {
  // Minimum widths fit the common case (sequences up to 8 digits, the time's fixed 24
  // characters, a 16-digit hash), so columns seldom shift while tailing.
  return StreamTable({{"SEQ", Align::kRight, 8},
                      {"TIME", Align::kLeft, 24},
                      {"KIND", Align::kLeft, 16},
                      {"POOL", Align::kLeft, 8},
                      {"TENANT", Align::kLeft, 8},
                      {"MEDIUM", Align::kLeft, 6},
                      {"BLOCKS", Align::kRight, 6},
                      {"FIRST_HASH", Align::kLeft, 16},
                      {"PARENT", Align::kLeft, 16}});
}

std::vector<std::string> EventCells(const v1::KvEvent& event) {
  const EventFields fields = FieldsOf(event);
  // AllBlocksCleared with no pool clears every pool.
  std::string pool =
      event.has_all_blocks_cleared() && fields.pool.empty() ? "*" : Cell(fields.pool);
  return {Number(event.sequence()),
          EventTime(event.time_unix_micros()),
          std::string(EventKind(event)),
          std::move(pool),
          Cell(fields.tenant),
          Cell(fields.medium),
          fields.has_blocks ? Number(fields.hashes.size()) : "-",
          fields.hashes.empty() ? "-" : Hex64(fields.hashes.front()->lo()),
          fields.parent == nullptr ? "-" : Hex64(fields.parent->lo())};
}

Json EventJson(const v1::KvEvent& event) {
  const EventFields fields = FieldsOf(event);
  Json hashes = Json::array();
  for (const v1::BlockHash* hash : fields.hashes) hashes.push_back(Hex64(hash->lo()));
  Json document = Json::object();
  document["sequence"] = event.sequence();
  document["time"] =
      event.time_unix_micros() == 0 ? Json(nullptr) : Json(EventTime(event.time_unix_micros()));
  document["time_unix_micros"] = event.time_unix_micros();
  document["kind"] = std::string(EventKind(event));
  document["pool"] = fields.pool;
  document["tenant"] = event.has_all_blocks_cleared() ? Json(nullptr) : Json(fields.tenant);
  document["medium"] = event.has_all_blocks_cleared() ? Json(nullptr) : Json(fields.medium);
  document["block_size"] = fields.block_size.has_value() ? Json(*fields.block_size) : Json(nullptr);
  document["num_blocks"] = fields.has_blocks ? Json(fields.hashes.size()) : Json(nullptr);
  document["first_hash"] = HashOrNull(fields.hashes.empty() ? nullptr : fields.hashes.front());
  document["parent_hash"] = HashOrNull(fields.parent);
  document["hashes"] = std::move(hashes);
  return document;
}

Json HealthJson(absl::string_view service, absl::string_view status) {
  Json document = Json::object();
  document["service"] = std::string(service);
  document["status"] = std::string(status);
  return document;
}

std::string VersionText(const std::optional<KvCacheClient::ServerVersion>& server,
                        absl::string_view target) {
  std::string text = VersionLine("kvcachectl") + "\n";
  if (server.has_value()) {
    absl::StrAppend(&text, VersionLine("kvcache-manager", server->version, server->revision),
                    " at ", target, "\n");
  }
  return text;
}

Json VersionJson(const std::optional<KvCacheClient::ServerVersion>& server,
                 absl::string_view target) {
  const auto build = [](absl::string_view version, absl::string_view revision) {
    Json document = Json::object();
    document["version"] = std::string(version);
    document["revision"] = revision.empty() ? Json(nullptr) : Json(std::string(revision));
    return document;
  };
  Json document = Json::object();
  document["client"] = build(Version(), Revision());
  if (server.has_value()) {
    document["server"] = build(server->version, server->revision);
    document["server"]["target"] = std::string(target);
  }
  return document;
}

}  // namespace kvcache::ctl
