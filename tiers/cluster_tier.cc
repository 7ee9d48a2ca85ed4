#include "tiers/cluster_tier.h"

#include <xxhash.h>

#include <cstring>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/byte_writer.h"
#include "tiers/record_codec.h"

namespace kvcache {
namespace {

// What Redis adds to a string value's allocation: an sds header of up to 9 bytes and the
// terminating NUL, with room to spare (measured: a value of 256 KiB - 64 takes 1.009 bytes per
// byte, bench/redis_cluster_bench).
constexpr uint64_t kRedisValueOverhead = 64;

}  // namespace

uint64_t SizeClassAtMost(uint64_t bytes) {
  if (bytes < 16) return bytes;
  if (bytes < 128) return bytes / 16 * 16;
  int log2 = 63 - __builtin_clzll(bytes);
  const uint64_t base = uint64_t{1} << log2;
  const uint64_t step = base / 4;
  return base + (bytes - base) / step * step;
}

absl::StatusOr<std::unique_ptr<ClusterTier>> ClusterTier::Create(ClusterTierOptions options) {
  if (options.pool.block_bytes == 0 || options.tokens_per_block == 0) {
    return absl::InvalidArgumentError("a cluster tier needs the pool's block bytes and block size");
  }
  absl::StatusOr<std::unique_ptr<RedisCluster>> redis = RedisCluster::Create(options.redis);
  if (!redis.ok()) return redis.status();
  return std::unique_ptr<ClusterTier>(new ClusterTier(std::move(options), *std::move(redis)));
}

ClusterTier::ClusterTier(ClusterTierOptions options, std::unique_ptr<RedisCluster> redis)
    : options_(std::move(options)),
      redis_(std::move(redis)),
      header_bytes_(RecordHeaderBytes(options_.tokens_per_block)),
      head_data_bytes_([this] {
        const uint64_t whole = header_bytes_ + options_.pool.block_bytes;
        if (!options_.fit_size_classes) return options_.pool.block_bytes;
        const uint64_t fitting = SizeClassAtMost(whole);
        if (fitting >= whole + kRedisValueOverhead ||
            fitting < header_bytes_ + 2 * kRedisValueOverhead) {
          return options_.pool.block_bytes;  // already fits, or too small to be worth a split
        }
        return fitting - kRedisValueOverhead - header_bytes_;
      }()) {}

std::string ClusterTier::KeyOf(const BlockRecordIdentity& identity) const {
  ByteWriter writer;
  writer.String(options_.pool.model_id);
  writer.U64(options_.pool.layout_fingerprint);
  writer.U32(static_cast<uint32_t>(options_.pool.hash_algorithm));
  writer.U64(options_.pool.block_bytes);
  writer.U64(identity.namespace_digest);
  writer.U64(identity.hash.hi);
  writer.U64(identity.hash.lo);
  writer.U64(identity.prefix_digest);
  const XXH128_hash_t digest = XXH3_128bits(writer.data(), writer.size());
  char raw[16];
  for (int i = 0; i < 8; ++i) {
    raw[i] = static_cast<char>(digest.high64 >> (56 - 8 * i));
    raw[8 + i] = static_cast<char>(digest.low64 >> (56 - 8 * i));
  }
  return absl::StrCat("kvc2:{", absl::BytesToHexString(absl::string_view(raw, 16)), "}");
}

std::vector<absl::Status> ClusterTier::Store(absl::Span<const Record> records) {
  const bool split = head_data_bytes_ < options_.pool.block_bytes;
  std::vector<absl::Status> results(records.size());
  // One batch: each record's tail, then its head. Both keys share a hash tag, so they go to one
  // node, down one connection, in this order, and Redis runs one connection's commands in order:
  // a head (which names the record) is never stored before its tail. One round trip per node.
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<size_t> owner;  // the record of each entry
  std::vector<bool> is_tail;
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& record = records[i];
    if (record.bytes.size() != options_.pool.block_bytes) {
      results[i] = absl::InvalidArgumentError(absl::StrCat(
          "a record of ", record.bytes.size(), " bytes in a pool of ", options_.pool.block_bytes));
      continue;
    }
    std::string head(header_bytes_ + head_data_bytes_, '\0');
    results[i] = EncodeRecordHeader(
        RecordHeader{.pool = options_.pool, .block = record.identity, .sequence = 0},
        absl::MakeSpan(head.data(), header_bytes_));
    if (!results[i].ok()) continue;
    std::memcpy(head.data() + header_bytes_, record.bytes.data(), head_data_bytes_);
    std::string key = KeyOf(record.identity);
    if (split) {
      entries.emplace_back(TailKeyOf(key), std::string(record.bytes.substr(head_data_bytes_)));
      owner.push_back(i);
      is_tail.push_back(true);
    }
    entries.emplace_back(std::move(key), std::move(head));
    owner.push_back(i);
    is_tail.push_back(false);
  }
  const std::vector<absl::Status> set = redis_->Set(entries);
  // A record is stored when both its values are. A head taken after its tail was refused (a node
  // out of memory, a tail redirected too often) would name bytes that are not there: deleted, so
  // that no reader finds it (a reader that did would fail the checksum: a miss all the same).
  std::vector<std::string> orphan_heads;
  for (size_t k = 0; k < entries.size(); ++k) {
    absl::Status& result = results[owner[k]];  // its tail's, when k is a head
    if (!is_tail[k] && !result.ok() && set[k].ok()) orphan_heads.push_back(entries[k].first);
    if (result.ok()) result = set[k];
  }
  if (!orphan_heads.empty()) redis_->Delete(orphan_heads);
  for (const absl::Status& result : results) {
    (result.ok() ? stored_ : store_failures_).fetch_add(1, std::memory_order_relaxed);
  }
  return results;
}

size_t ClusterTier::LoadPrefix(absl::Span<const BlockRecordIdentity> expected,
                               absl::Span<uint8_t* const> out, absl::Time deadline,
                               std::vector<uint64_t>* found_extras) {
  const bool split = head_data_bytes_ < options_.pool.block_bytes;
  const size_t per_record = split ? 2 : 1;
  std::vector<std::string> keys;
  for (const BlockRecordIdentity& identity : expected) {
    keys.push_back(KeyOf(identity));
    if (split) keys.push_back(TailKeyOf(keys.back()));
  }
  enum class Found : uint8_t { kNothing, kGood, kCorrupt, kForeign, kOtherBlock };
  std::vector<Found> head(expected.size(), Found::kNothing);
  std::vector<Found> tail(expected.size(), Found::kNothing);
  std::vector<uint64_t> checksum(expected.size(), 0);  // the bytes', as their header says
  std::vector<uint64_t> extras(expected.size(), 0);
  // Views are valid only inside the visitor: each value is checked and copied there.
  const std::vector<absl::Status> results = redis_->Get(
      keys,
      [&](size_t index, absl::string_view value) {
        const size_t record = index / per_record;
        if (split && index % 2 == 1) {
          const uint64_t tail_bytes = options_.pool.block_bytes - head_data_bytes_;
          if (value.size() != tail_bytes) {
            tail[record] = Found::kCorrupt;
            return;
          }
          std::memcpy(out[record] + head_data_bytes_, value.data(), tail_bytes);
          tail[record] = Found::kGood;
          return;
        }
        absl::StatusOr<RecordHeader> header = DecodeRecordHeader(value);
        if (absl::IsFailedPrecondition(header.status())) {
          head[record] = Found::kForeign;  // an older record format's: intact, not ours to serve
        } else if (!header.ok() || value.size() != header_bytes_ + head_data_bytes_) {
          head[record] = Found::kCorrupt;
        } else if (!PoolMismatch(header->pool, options_.pool).empty()) {
          head[record] = Found::kForeign;
        } else if (!RecordMismatch(header->block, expected[record]).empty()) {
          head[record] = Found::kOtherBlock;
        } else {
          std::memcpy(out[record], value.data() + header_bytes_, head_data_bytes_);
          checksum[record] = header->block.checksum;
          extras[record] = header->block.extras_digest;
          head[record] = Found::kGood;
        }
      },
      deadline);
  const auto miss = [&](const absl::Status& status, Found found) {
    if (!status.ok()) {
      (absl::IsNotFound(status)           ? absent_
       : absl::IsDeadlineExceeded(status) ? past_deadline_
                                          : unavailable_)
          .fetch_add(1, std::memory_order_relaxed);
    } else if (found == Found::kForeign) {
      foreign_.fetch_add(1, std::memory_order_relaxed);
    } else if (found == Found::kOtherBlock) {
      mismatched_.fetch_add(1, std::memory_order_relaxed);
    } else {
      corrupt_.fetch_add(1, std::memory_order_relaxed);
    }
  };
  size_t loaded = 0;
  for (; loaded < expected.size(); ++loaded) {
    const absl::Status& head_status = results[loaded * per_record];
    if (!head_status.ok() || head[loaded] != Found::kGood) {
      miss(head_status, head[loaded]);
      break;
    }
    if (split) {
      const absl::Status& tail_status = results[loaded * per_record + 1];
      if (!tail_status.ok() || tail[loaded] != Found::kGood) {
        miss(tail_status, tail[loaded]);
        break;
      }
    }
    // The whole block is in out[loaded]; the checksum its header was written with decides (a
    // head and a tail of two different writes fail here).
    if (BlockChecksum(out[loaded], options_.pool.block_bytes) != checksum[loaded]) {
      corrupt_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    loaded_.fetch_add(1, std::memory_order_relaxed);
    if (found_extras != nullptr) found_extras->push_back(extras[loaded]);
  }
  return loaded;
}

std::vector<uint64_t> ClusterTier::ProbePrefix(absl::Span<const BlockRecordIdentity> expected,
                                               absl::Time deadline) {
  std::vector<std::string> keys;
  keys.reserve(expected.size());
  for (const BlockRecordIdentity& identity : expected) keys.push_back(KeyOf(identity));
  std::vector<std::optional<uint64_t>> extras(expected.size());
  const std::vector<absl::Status> results = redis_->Get(
      keys,
      [&](size_t index, absl::string_view value) {
        absl::StatusOr<RecordHeader> header = DecodeRecordHeader(value);
        if (header.ok() && PoolMismatch(header->pool, options_.pool).empty() &&
            RecordMismatch(header->block, expected[index]).empty()) {
          extras[index] = header->block.extras_digest;
        }
      },
      deadline);
  std::vector<uint64_t> found;
  for (size_t i = 0; i < expected.size() && results[i].ok() && extras[i].has_value(); ++i) {
    found.push_back(*extras[i]);
  }
  return found;
}

ClusterTierCounters ClusterTier::counters() const {
  return ClusterTierCounters{.stored = stored_.load(),
                             .store_failures = store_failures_.load(),
                             .loaded = loaded_.load(),
                             .absent = absent_.load(),
                             .unavailable = unavailable_.load(),
                             .past_deadline = past_deadline_.load(),
                             .foreign = foreign_.load(),
                             .mismatched = mismatched_.load(),
                             .corrupt = corrupt_.load()};
}

}  // namespace kvcache
