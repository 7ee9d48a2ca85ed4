#include "tiers/cluster_tier.h"

#include <xxhash.h>

#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/block_checksum.h"
#include "common/byte_writer.h"
#include "common/status_macros.h"
#include "common/xxh3_fast.h"
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
      sealer_(options_.keyring == nullptr
                  ? std::nullopt
                  : std::make_optional<RecordSealer>(options_.keyring, options_.pool,
                                                     options_.tokens_per_block)),
      header_bytes_(sealer_.has_value() ? sealer_->head_bytes()
                                        : RecordHeaderBytes(options_.tokens_per_block)),
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

std::vector<uint32_t> ClusterTier::KeyIds() const {
  if (!sealer_.has_value()) return {0};
  return sealer_->keyring().key_ids();
}

absl::StatusOr<std::string> ClusterTier::NameOf(const BlockRecordIdentity& identity,
                                                uint32_t key_id) const {
  ByteWriter writer;
  writer.String(options_.pool.model_id);
  writer.U64(options_.pool.layout_fingerprint);
  writer.U32(static_cast<uint32_t>(options_.pool.hash_algorithm));
  writer.U64(options_.pool.block_bytes);
  writer.U64(identity.namespace_digest);
  writer.U64(identity.hash.hi);
  writer.U64(identity.hash.lo);
  writer.U64(identity.prefix_digest);
  char raw[16];
  if (sealer_.has_value()) {
    ASSIGN_OR_RETURN(const auto digest,
                     sealer_->NameDigest(key_id, identity.tenant,
                                         absl::string_view(writer.data(), writer.size())));
    std::memcpy(raw, digest.data(), sizeof(raw));
    return absl::StrCat("kvcs1:{", absl::BytesToHexString(absl::string_view(raw, 16)), "}");
  }
  const XXH128_hash_t digest = XXH3_128bits(writer.data(), writer.size());
  for (int i = 0; i < 8; ++i) {
    raw[i] = static_cast<char>(digest.high64 >> (56 - 8 * i));
    raw[8 + i] = static_cast<char>(digest.low64 >> (56 - 8 * i));
  }
  return absl::StrCat("kvc2:{", absl::BytesToHexString(absl::string_view(raw, 16)), "}");
}

std::string ClusterTier::KeyOf(const BlockRecordIdentity& identity) const {
  absl::StatusOr<std::string> name = NameOf(identity, KeyIds().front());
  return name.ok() ? *std::move(name) : "";
}

std::vector<absl::Status> ClusterTier::Store(absl::Span<const Record> records) {
  const bool split = head_data_bytes_ < options_.pool.block_bytes;
  const uint64_t tail_bytes = split ? options_.pool.block_bytes - head_data_bytes_ : 0;
  const uint32_t key_id = KeyIds().front();
  std::vector<absl::Status> results(records.size());
  // Each record's values: its tail, then its head. Both keys share a hash tag, so they go to one
  // node, down one connection, in this order, and Redis runs one connection's commands in order:
  // a head (which names the record) is never stored before its tail. One round trip per node.
  const uint64_t head_value_bytes = header_bytes_ + head_data_bytes_;
  // Unsealed: each record's encoded header, its bytes going into the batch from the record itself.
  // Sealed: each record's head and tail values in one buffer, not zero-filled (the cipher's output
  // fills it), made on the seal worker.
  std::vector<std::string> headers(sealer_.has_value() ? 0 : records.size());
  std::vector<std::unique_ptr<char[]>> sealed_values(sealer_.has_value() ? records.size() : 0);
  std::vector<std::string> keys;
  std::vector<uint64_t> sizes;
  std::vector<size_t> owner;  // the record of each key
  std::vector<bool> is_tail;
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& record = records[i];
    if (record.bytes.size() != options_.pool.block_bytes) {
      results[i] = absl::InvalidArgumentError(absl::StrCat(
          "a record of ", record.bytes.size(), " bytes in a pool of ", options_.pool.block_bytes));
      continue;
    }
    absl::StatusOr<std::string> key = NameOf(record.identity, key_id);
    if (!key.ok()) {
      results[i] = key.status();
      continue;
    }
    if (!sealer_.has_value()) {
      // The header alone: the bytes go from the record into the batch as pieces.
      headers[i].resize(header_bytes_);
      results[i] = EncodeRecordHeader(options_.pool, record.identity, /*sequence=*/0,
                                      absl::MakeSpan(headers[i]));
      if (!results[i].ok()) continue;
    }
    if (split) {
      keys.push_back(TailKeyOf(*key));
      sizes.push_back(tail_bytes);
      owner.push_back(i);
      is_tail.push_back(true);
    }
    keys.push_back(*std::move(key));
    sizes.push_back(head_value_bytes);
    owner.push_back(i);
    is_tail.push_back(false);
  }
  std::vector<absl::Status> set;
  if (!sealer_.has_value()) {
    std::vector<RedisCluster::SetEntry> entries(keys.size());
    for (size_t k = 0; k < keys.size(); ++k) {
      const absl::string_view bytes = records[owner[k]].bytes;
      entries[k].key = keys[k];
      if (is_tail[k]) {
        entries[k].value = {bytes.substr(head_data_bytes_)};
      } else {
        entries[k].value = {headers[owner[k]], bytes.substr(0, head_data_bytes_)};
      }
    }
    set = redis_->SetFromPieces(entries);
  } else {
    // Sealed on the seal workers, in order, while the values sealed first are on the wire: the
    // cipher's time hides behind the batch's round trip rather than adding to it.
    std::unique_ptr<absl::Notification[]> sealed(new absl::Notification[records.size()]);
    TaskWorkers::Group sealing(options_.seal_workers.get());
    for (size_t i = 0; i < records.size(); ++i) {
      if (!results[i].ok()) continue;
      // The bytes are encrypted straight into the two values.
      sealed_values[i] = TakeSealBuffer();
      sealing.Run([this, &record = records[i], head = sealed_values[i].get(), &result = results[i],
                   &done = sealed[i], head_value_bytes, tail_bytes] {
        const SealPiece pieces[] = {
            {record.bytes.data(), head + header_bytes_, head_data_bytes_},
            {record.bytes.data() + head_data_bytes_, head + head_value_bytes, tail_bytes}};
        result = sealer_->Seal({.pool = options_.pool, .block = record.identity}, pieces,
                               absl::MakeSpan(head, header_bytes_));
        done.Notify();
      });
    }
    const auto made = [&](size_t k) { return sealed[owner[k]].HasBeenNotified(); };
    const auto value = [&](size_t k) -> absl::StatusOr<absl::string_view> {
      const size_t i = owner[k];
      // Helping with the queued seals rather than sleeping while the workers wake.
      while (!sealed[i].HasBeenNotified()) {
        if (!sealing.RunOneQueued()) sealed[i].WaitForNotification();
      }
      if (!results[i].ok()) return results[i];
      const char* const head = sealed_values[i].get();
      return is_tail[k] ? absl::string_view(head + head_value_bytes, tail_bytes)
                        : absl::string_view(head, head_value_bytes);
    };
    set = redis_->SetAsMade(keys, sizes, {.made = made, .value = value});
  }
  // A record is stored when both its values are. A head taken after its tail was refused (a node
  // out of memory, a tail redirected too often) would name bytes that are not there: deleted, so
  // that no reader finds it (a reader that did would fail the checksum: a miss all the same).
  std::vector<std::string> orphan_heads;
  for (size_t k = 0; k < keys.size(); ++k) {
    absl::Status& result = results[owner[k]];  // its tail's, when k is a head
    if (!is_tail[k] && !result.ok() && set[k].ok()) orphan_heads.push_back(keys[k]);
    if (result.ok()) result = set[k];
  }
  if (!orphan_heads.empty()) redis_->Delete(orphan_heads);
  for (const absl::Status& result : results) {
    (result.ok() ? stored_ : store_failures_).fetch_add(1, std::memory_order_relaxed);
  }
  if (sealer_.has_value()) KeepSealBuffers(std::move(sealed_values));
  return results;
}

std::unique_ptr<char[]> ClusterTier::TakeSealBuffer() {
  {
    absl::MutexLock lock(&spare_mu_);
    if (!spare_seal_buffers_.empty()) {
      std::unique_ptr<char[]> buffer = std::move(spare_seal_buffers_.back());
      spare_seal_buffers_.pop_back();
      return buffer;
    }
  }
  // Not zero-filled: the cipher's output fills it.
  return std::unique_ptr<char[]>(new char[header_bytes_ + options_.pool.block_bytes]);
}

void ClusterTier::KeepSealBuffers(std::vector<std::unique_ptr<char[]>> buffers) {
  // At most 64 MiB kept (and at least one buffer): a batch's worth for blocks up to 2 MiB.
  constexpr uint64_t kKeptBytes = 64 << 20;
  const size_t keep =
      std::max<uint64_t>(1, kKeptBytes / (header_bytes_ + options_.pool.block_bytes));
  absl::MutexLock lock(&spare_mu_);
  for (std::unique_ptr<char[]>& buffer : buffers) {
    if (buffer == nullptr) continue;
    if (spare_seal_buffers_.size() >= keep) break;
    spare_seal_buffers_.push_back(std::move(buffer));
  }
}

ClusterTier::Found ClusterTier::CheckHead(absl::string_view value,
                                          const BlockRecordIdentity& expected, OpenedHead* opened,
                                          bool with_data) const {
  if (sealer_.has_value()) {
    absl::StatusOr<OpenedHead> open =
        sealer_->OpenHead(value.substr(0, header_bytes_), expected.tenant);
    // An unsealed value under a sealed name was put there by hand: it does not open either.
    if (absl::IsUnauthenticated(open.status()) || absl::IsFailedPrecondition(open.status())) {
      return Found::kUnopened;
    }
    if (!open.ok()) return Found::kCorrupt;
    *opened = *std::move(open);
  } else {
    absl::StatusOr<RecordHeader> header = DecodeRecordHeader(value);
    // An older record format's: intact, not ours to serve.
    if (absl::IsFailedPrecondition(header.status())) return Found::kForeign;
    if (!header.ok()) return Found::kCorrupt;
    opened->header = *std::move(header);
  }
  if (value.size() != header_bytes_ + (with_data ? head_data_bytes_ : 0)) return Found::kCorrupt;
  if (!PoolMismatch(opened->header.pool, options_.pool).empty()) return Found::kForeign;
  if (!RecordMismatch(opened->header.block, expected).empty()) return Found::kOtherBlock;
  return Found::kGood;
}

ClusterTier::Run ClusterTier::LoadRun(uint32_t key_id,
                                      absl::Span<const BlockRecordIdentity> expected,
                                      absl::Span<uint8_t* const> out, absl::Time deadline,
                                      std::vector<uint64_t>* found_extras) {
  const uint64_t block_bytes = options_.pool.block_bytes;
  const bool split = head_data_bytes_ < block_bytes;
  const size_t per_record = split ? 2 : 1;
  Run run;
  std::vector<std::string> keys;
  for (const BlockRecordIdentity& identity : expected) {
    absl::StatusOr<std::string> key = NameOf(identity, key_id);
    if (!key.ok()) break;  // OpenSSL failed: the prefix ends here
    keys.push_back(*std::move(key));
    if (split) keys.push_back(TailKeyOf(keys.back()));
  }
  const size_t named = keys.size() / per_record;
  std::vector<Found> head(named, Found::kNothing);
  std::vector<Found> tail(named, Found::kNothing);
  std::vector<OpenedHead> opened(named);
  // Sealed, a head of the right size is copied here and opened on the seal workers with its
  // body, so that the thread reading the replies only copies: it sets the pace of the load.
  std::string sealed_heads(sealer_.has_value() ? named * header_bytes_ : 0, '\0');
  // The whole block's verdict, once both its halves are in: sealed, it opens as a whole or not at
  // all (a head and a tail of two different writes do not), then the checksum its header was
  // written with decides. Checked from inside the visitor (sealed, on the seal workers), so that
  // a block's decryption overlaps the arrival of the replies after it.
  std::vector<Found> body(named, Found::kNothing);
  // Unsealed, a block whose head came before its tail (the order they are asked in, unless one was
  // redirected) is checksummed as its values are copied out, in one pass; else after.
  std::vector<xxh3::CopyingHash> copied(sealer_.has_value() ? 0 : named,
                                        xxh3::CopyingHash(block_bytes));
  const auto check_body = [&](size_t record) {
    char* const bytes = reinterpret_cast<char*>(out[record]);
    if (head[record] == Found::kArrived) {
      head[record] =
          CheckHead(absl::string_view(sealed_heads.data() + record * header_bytes_, header_bytes_),
                    expected[record], &opened[record], /*with_data=*/false);
      if (head[record] != Found::kGood) return;
    }
    if (sealer_.has_value() &&
        !sealer_->OpenBody(opened[record], expected[record], {SealPiece{bytes, bytes, block_bytes}})
             .ok()) {
      body[record] = Found::kUnopened;
      return;
    }
    const uint64_t checksum = !copied.empty() && copied[record].fed() == block_bytes
                                  ? copied[record].Finish()
                                  : BlockChecksum(bytes, block_bytes);
    body[record] =
        checksum == opened[record].header.block.checksum ? Found::kGood : Found::kCorrupt;
  };
  TaskWorkers::Group opening(sealer_.has_value() ? options_.seal_workers.get() : nullptr);
  // Views are valid only inside the visitor: each value is checked and copied there.
  const std::vector<absl::Status> results = redis_->Get(
      keys,
      [&](size_t index, absl::string_view value) {
        const size_t record = index / per_record;
        if (split && index % 2 == 1) {
          const uint64_t tail_bytes = block_bytes - head_data_bytes_;
          if (value.size() != tail_bytes) {
            tail[record] = Found::kCorrupt;
            return;
          }
          if (!copied.empty() && head[record] == Found::kGood) {
            copied[record].Copy(out[record] + head_data_bytes_, value.data(), tail_bytes, false);
          } else {
            std::memcpy(out[record] + head_data_bytes_, value.data(), tail_bytes);
          }
          tail[record] = Found::kGood;
        } else if (sealer_.has_value() && value.size() == header_bytes_ + head_data_bytes_) {
          std::memcpy(sealed_heads.data() + record * header_bytes_, value.data(), header_bytes_);
          std::memcpy(out[record], value.data() + header_bytes_, head_data_bytes_);
          head[record] = Found::kArrived;
        } else {
          head[record] = CheckHead(value, expected[record], &opened[record]);
          if (head[record] != Found::kGood) return;
          if (!copied.empty() && tail[record] == Found::kNothing) {
            copied[record].Copy(out[record], value.data() + header_bytes_, head_data_bytes_, false);
          } else {
            std::memcpy(out[record], value.data() + header_bytes_, head_data_bytes_);
          }
        }
        // Once both halves are in (each comes once), and only then: the task owns out[record].
        const bool head_in = head[record] == Found::kGood || head[record] == Found::kArrived;
        if (head_in && (!split || tail[record] == Found::kGood)) {
          opening.Run([&check_body, record] { check_body(record); });
        }
      },
      deadline);
  opening.Wait();
  for (; run.loaded < named; ++run.loaded) {
    const size_t i = run.loaded;
    // A sealed head whose tail never came, or came wrong, was not opened: its verdict first.
    if (head[i] == Found::kArrived) {
      head[i] = CheckHead(absl::string_view(sealed_heads.data() + i * header_bytes_, header_bytes_),
                          expected[i], &opened[i], /*with_data=*/false);
    }
    const absl::Status& head_status = results[i * per_record];
    if (!head_status.ok() || head[i] != Found::kGood) {
      run.status = head_status;
      run.found = head[i];
      return run;
    }
    if (split) {
      const absl::Status& tail_status = results[i * per_record + 1];
      if (!tail_status.ok() || tail[i] != Found::kGood) {
        run.status = tail_status;
        run.found = tail[i];
        return run;
      }
    }
    if (body[i] != Found::kGood) {
      run.found = body[i];
      return run;
    }
    loaded_.fetch_add(1, std::memory_order_relaxed);
    if (found_extras != nullptr) found_extras->push_back(opened[i].header.block.extras_digest);
  }
  if (named < expected.size()) run.found = Found::kCorrupt;  // a name could not be made
  return run;
}

void ClusterTier::CountMiss(const Run& run, const BlockRecordIdentity& stopped_at) {
  if (!run.status.ok()) {
    (absl::IsNotFound(run.status)           ? absent_
     : absl::IsDeadlineExceeded(run.status) ? past_deadline_
                                            : unavailable_)
        .fetch_add(1, std::memory_order_relaxed);
  } else if (run.found == Found::kForeign) {
    foreign_.fetch_add(1, std::memory_order_relaxed);
  } else if (run.found == Found::kOtherBlock) {
    mismatched_.fetch_add(1, std::memory_order_relaxed);
  } else if (run.found == Found::kUnopened) {
    unopened_.fetch_add(1, std::memory_order_relaxed);
    open_failures_.Add(stopped_at.tenant);
  } else {
    corrupt_.fetch_add(1, std::memory_order_relaxed);
  }
}

size_t ClusterTier::LoadPrefix(absl::Span<const BlockRecordIdentity> expected,
                               absl::Span<uint8_t* const> out, absl::Time deadline,
                               std::vector<uint64_t>* found_extras) {
  // Under the newest key's names first. A record found under none of them may be under an older
  // key's (sealed before a rotation): only then are the older names asked, from that record on;
  // a run that loads some under an older name goes back to the newest for what follows.
  const std::vector<uint32_t> key_ids = KeyIds();
  size_t loaded = 0;
  Run run;
  for (size_t k = 0; k < key_ids.size() && loaded < expected.size();) {
    run =
        LoadRun(key_ids[k], expected.subspan(loaded), out.subspan(loaded), deadline, found_extras);
    loaded += run.loaded;
    if (loaded == expected.size() || !absl::IsNotFound(run.status)) break;
    k = k > 0 && run.loaded > 0 ? 0 : k + 1;
  }
  if (loaded < expected.size()) CountMiss(run, expected[loaded]);
  return loaded;
}

ClusterTier::Heads ClusterTier::ReadHeads(uint32_t key_id,
                                          absl::Span<const BlockRecordIdentity> expected,
                                          absl::Time deadline) {
  std::vector<std::string> keys;
  for (const BlockRecordIdentity& identity : expected) {
    absl::StatusOr<std::string> key = NameOf(identity, key_id);
    if (!key.ok()) break;
    keys.push_back(*std::move(key));
  }
  Heads heads;
  heads.extras.resize(keys.size());
  heads.verdicts.assign(keys.size(), Found::kNothing);
  heads.results = redis_->Get(
      keys,
      [&](size_t index, absl::string_view value) {
        OpenedHead opened;
        heads.verdicts[index] = CheckHead(value, expected[index], &opened);
        if (heads.verdicts[index] == Found::kGood) {
          heads.extras[index] = opened.header.block.extras_digest;
        }
      },
      deadline);
  return heads;
}

std::vector<uint64_t> ClusterTier::ProbeRun(uint32_t key_id,
                                            absl::Span<const BlockRecordIdentity> expected,
                                            absl::Time deadline, bool* stopped_absent) {
  const Heads heads = ReadHeads(key_id, expected, deadline);
  const size_t named = heads.extras.size();
  std::vector<uint64_t> found;
  for (size_t i = 0; i < named && heads.results[i].ok() && heads.extras[i].has_value(); ++i) {
    found.push_back(*heads.extras[i]);
  }
  *stopped_absent = found.size() < named && absl::IsNotFound(heads.results[found.size()]);
  if (found.size() < named && heads.verdicts[found.size()] == Found::kUnopened) {
    unopened_.fetch_add(1, std::memory_order_relaxed);
    open_failures_.Add(expected[found.size()].tenant);
  }
  return found;
}

std::vector<std::optional<uint64_t>> ClusterTier::StoredExtras(
    absl::Span<const BlockRecordIdentity> records, absl::Time deadline) {
  std::vector<BlockRecordIdentity> any_parts(records.begin(), records.end());
  for (BlockRecordIdentity& record : any_parts) record.extras_digest = kAnyPartMask;
  Heads heads = ReadHeads(KeyIds().front(), any_parts, deadline);
  std::vector<std::optional<uint64_t>> stored(records.size());
  for (size_t i = 0; i < heads.extras.size(); ++i) {
    if (heads.results[i].ok()) stored[i] = heads.extras[i];
  }
  return stored;
}

std::vector<uint64_t> ClusterTier::ProbePrefix(absl::Span<const BlockRecordIdentity> expected,
                                               absl::Time deadline) {
  // As LoadPrefix, the older keys' names only for what the newest's lack.
  const std::vector<uint32_t> key_ids = KeyIds();
  std::vector<uint64_t> found;
  for (size_t k = 0; k < key_ids.size() && found.size() < expected.size();) {
    bool stopped_absent = false;
    const std::vector<uint64_t> run =
        ProbeRun(key_ids[k], expected.subspan(found.size()), deadline, &stopped_absent);
    found.insert(found.end(), run.begin(), run.end());
    if (!stopped_absent) break;
    k = k > 0 && !run.empty() ? 0 : k + 1;
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
                             .corrupt = corrupt_.load(),
                             .unopened = unopened_.load()};
}

}  // namespace kvcache
