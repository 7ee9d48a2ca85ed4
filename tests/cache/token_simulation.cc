// Simulation (token_simulation.h): a run, the pool and its tiers set up and restarted, and the
// checks of hits, bytes and records.
#include "tests/cache/token_simulation.h"

namespace kvcache {
namespace simulation {

absl::Status Simulation::Run(SimTotals* totals) {
  block_size_ = Pick({1u, 2u, 4u});
  num_blocks_ = Uniform(3, 24);
  PoolOptions options;
  options.name = "sim";
  options.model_id = "sim-model";
  options.layout = PoolLayout{.num_layers = 1,
                              .num_kv_heads = 1,
                              .head_dim = 2,
                              .block_size = block_size_,
                              .dtype = DType::kFloat16};
  options.num_blocks = num_blocks_;
  options.testing_hash_bits = hash_bits_;
  if (parts_) {
    const uint64_t bytes = options.layout.BlockBytes();
    ASSIGN_OR_RETURN(options.parts,
                     ParsePageParts(absl::StrCat("kv/", bytes - 2, "+state/2/trailing1"), bytes));
  }
  if (tier_) {
    // From one block to twice the pool, so tier 2 evicts its own records too; over a disk
    // tier at most the pool, so records are passed down (and evicted) often.
    options.host_tier_bytes =
        uint64_t{Uniform(1, (disk_ ? 1 : 2) * num_blocks_)} * options.layout.BlockBytes();
    options.offload_window = Uniform(0, num_blocks_);  // 0: the default
    options.testing_manual_offload = true;
  }
  if (disk_) {
    // From one record to twice the pool, so the disk evicts too. A slot is a header page and
    // the block rounded up to pages.
    const uint64_t slot_bytes = 4096 + (options.layout.BlockBytes() + 4095) / 4096 * 4096;
    disk_dir_.emplace();
    options.disk_tier_path = disk_dir_->File("pool.tier");
    options.disk_tier_bytes = uint64_t{Uniform(1, 2 * num_blocks_)} * slot_bytes;
    // Room for every store of one OffloadForTesting: a full queue would refuse stores
    // depending on how fast the writer thread drains it, and the seed would not replay. One
    // call passes down at most what tier 2 held (at most the pool) and what it stores from
    // tier 1 (each block once): 48 records. Each queued record has a buffer, allocated at open.
    options.testing_disk_tier_options = [](DiskTierOptions* disk) { disk->max_queued_stores = 48; };
  }
  block_bytes_ = options.layout.BlockBytes();
  options_ = options;
  RETURN_IF_ERROR(StartPool());
  trace_.push_back(absl::StrCat(
      "pool: ", num_blocks_, " blocks of ", block_size_, " tokens, hash bits ",
      hash_bits_ == 0 ? 128 : hash_bits_, ", tier 2 ", options.host_tier_bytes / block_bytes_,
      " blocks, offload window ", pool_->offload_window(),
      disk_ ? absl::StrCat(", disk ", DiskStats().store.slots, " records, demotion window ",
                           pool_->demotion_window())
            : ""));

  for (int op = 0; op < num_ops_; ++op) {
    ++totals->operations;
    if (tier_ && Chance(20)) {
      RETURN_IF_ERROR(Offload());
      RETURN_IF_ERROR(CheckAccounting());
    }
    if (disk_ && Chance(2)) {
      RETURN_IF_ERROR(Restart(totals));
      RETURN_IF_ERROR(CheckAccounting());
    }
    RETURN_IF_ERROR(Step());
    RETURN_IF_ERROR(CheckAccounting());
  }
  // Every session ends; everything is released.
  for (uint64_t id : session_order_) {
    if (!sessions_.at(id).ended) RETURN_IF_ERROR(CloseSession(id));
  }
  RETURN_IF_ERROR(CheckAccounting());
  if (pool_->Stats().referenced != 0)
    return absl::InternalError("blocks held after every session ended");
  return AddTotals(totals);
}

std::vector<std::string> Simulation::ComparableTrace() const {
  std::vector<std::pair<std::string, std::string>> names;
  for (size_t i = 0; i < opened_sessions_.size(); ++i) {
    names.emplace_back(absl::StrCat(opened_sessions_[i]), absl::StrCat("S", i));
  }
  std::vector<std::string> trace;
  for (const std::string& line : trace_) trace.push_back(absl::StrReplaceAll(line, names));
  return trace;
}

Simulation::Chain Simulation::ChainOf(const std::string& ns,
                                      const std::vector<uint32_t>& tokens) const {
  const std::vector<std::string> parts = absl::StrSplit(ns, '/');
  BlockHasher hasher(options_.hash_algorithm, hash_bits_);
  const HashNamespace space{options_.model_id, pool_->layout_fingerprint(), parts[0], parts[1]};
  ExtraKeys extras;
  extras.lora_id = parts[2];
  Chain chain;
  hasher.ExtendChain(hasher.Root(space), hasher.NamespaceDigest(space), tokens, block_size_, extras,
                     &chain.hashes, &chain.digests);
  return chain;
}

absl::Status Simulation::StartPool() {
  auto memory = testing::CreatePoolMemory(
      staged_ ? testing::PoolMemoryKind::kStaged : testing::PoolMemoryKind::kHost, block_bytes_,
      num_blocks_);
  if (!memory.ok()) return memory.status();
  manager_ = std::make_unique<CacheManager>(SessionLimits{}, &clock_, epoch_);
  RETURN_IF_ERROR(manager_->AddPool(options_, *std::move(memory)));
  pool_ = manager_->pools().front();
  shadow_.assign(num_blocks_, std::nullopt);
  if (hash_bits_ == 0) model_.emplace(num_blocks_);
  return absl::OkStatus();
}

absl::Status Simulation::AddTotals(SimTotals* totals) {
  const PoolStatsSnapshot stats = pool_->Stats();
  totals->hit_blocks += hit_blocks_;
  totals->evictions += stats.pool.evictions;
  totals->collisions_caught += pool_->collisions_caught();
  totals->tier_hit_blocks += tier_hit_blocks_;
  totals->offloaded_blocks += offloaded_blocks_;
  totals->disk_hit_blocks += disk_hit_blocks_;
  if (stats.disk_tier.has_value()) totals->demoted_blocks += stats.disk_tier->demoted_blocks;
  hit_blocks_ = tier_hit_blocks_ = offloaded_blocks_ = disk_hit_blocks_ = 0;
  if (hash_bits_ == 0 && pool_->collisions_caught() != 0) {
    return absl::InternalError(
        absl::StrCat(pool_->collisions_caught(), " collisions caught with full-width hashes"));
  }
  return absl::OkStatus();
}

std::vector<Simulation::RecordKey> Simulation::DiskRecords() const {
  std::vector<RecordKey> records;
  for (const BlockRecordIdentity& record : pool_->disk_tier()->Records()) {
    records.push_back(RecordKeyOf(record.hash, record.prefix_digest));
  }
  std::sort(records.begin(), records.end());
  return records;
}

absl::Status Simulation::CheckDiskRecords() {
  for (const BlockRecordIdentity& record : pool_->disk_tier()->Records()) {
    auto it = written_identities_.find(RecordKeyOf(record.hash, record.prefix_digest));
    if (it == written_identities_.end()) {
      return Fail(absl::StrCat("disk holds record ", record.hash.ToHex(), " never written"));
    }
    const std::vector<uint32_t>& tokens = it->second.tokens;
    if (!std::equal(record.tokens.begin(), record.tokens.end(), tokens.end() - block_size_,
                    tokens.end()) ||
        record.tokens.size() != block_size_) {
      return Fail(absl::StrCat("disk record for ", Describe(it->second), " holds tokens ",
                               absl::StrJoin(record.tokens, ",")));
    }
  }
  return absl::OkStatus();
}

std::string Simulation::PredictBelow(const std::string& ns, const std::vector<uint32_t>& tokens,
                                     size_t first, size_t limit) const {
  std::string tiers;
  const Chain chain = ChainOf(ns, tokens);
  for (size_t i = first; i < std::min(limit, chain.hashes.size()); ++i) {
    const std::optional<BlockRecordIdentity> host = pool_->host_tier()->Find(chain.hashes[i]);
    if (host.has_value() && host->prefix_digest == chain.digests[i]) {
      tiers.push_back('h');
      continue;
    }
    if (!disk_) break;
    const absl::StatusOr<BlockRecordIdentity> disk = pool_->disk_tier()->Find(chain.hashes[i]);
    if (!disk.ok() || disk->prefix_digest != chain.digests[i]) break;
    tiers.push_back('d');
  }
  return tiers;
}

absl::Status Simulation::Restart(SimTotals* totals) {
  pool_->disk_tier()->Flush();
  const std::vector<RecordKey> before = DiskRecords();
  RETURN_IF_ERROR(AddTotals(totals));
  ++totals->restarts;
  trace_.push_back(absl::StrCat("restart with ", before.size(), " records on disk"));
  pool_ = nullptr;
  manager_.reset();  // the pool, its tiers and its lock on the file
  ++epoch_;
  sessions_.clear();
  session_order_.clear();
  seqs_.clear();
  dead_seqs_.clear();
  RETURN_IF_ERROR(StartPool());
  const PoolStatsSnapshot stats = pool_->Stats();
  const DiskTierStats& disk = stats.disk_tier->store;
  totals->restored_records += disk.restart_records;
  if (disk.restart_records != before.size() || disk.restart_torn != 0 ||
      disk.restart_foreign != 0 || disk.restart_old_format != 0 || disk.restart_duplicates != 0) {
    return Fail(absl::StrCat("restart: restored/torn/foreign/old/duplicates ", disk.restart_records,
                             "/", disk.restart_torn, "/", disk.restart_foreign, "/",
                             disk.restart_old_format, "/", disk.restart_duplicates,
                             "; the disk held ", before.size()));
  }
  if (DiskRecords() != before) return Fail("restart: the disk indexes other records");
  if (stats.host_tier->store.records != 0) return Fail("restart: tier 2 is not empty");
  RETURN_IF_ERROR(CheckDiskRecords());
  // Tiers 1 and 2 are empty: every recent prompt, in every namespace, is found on disk exactly
  // as far as the records the old pool left there continue its chain.
  const std::set<RecordKey> held(before.begin(), before.end());
  for (const std::vector<uint32_t>& tokens : prompts_) {
    for (absl::string_view tenant : kTenants) {
      for (absl::string_view salt : kSalts) {
        const Chain chain = ChainOf(Namespace(std::string(tenant), salt, ""), tokens);
        size_t want = 0;
        while (want < chain.hashes.size() &&
               held.count(RecordKeyOf(chain.hashes[want], chain.digests[want])) > 0) {
          ++want;
        }
        auto found = pool_->Lookup(tenant, SequenceSpec{tokens, salt, {}});
        if (!found.ok() || found->num_cached_blocks != want ||
            found->num_disk_tier_tokens != want * block_size_) {
          return Fail(absl::StrCat(
              "restart: lookup ", tenant, "/", salt, " tokens ", absl::StrJoin(tokens, ","), " -> ",
              found.ok() ? absl::StrCat(found->num_cached_blocks, " blocks, ",
                                        found->num_disk_tier_tokens, " disk tokens")
                         : found.status().ToString(),
              "; the old pool left ", want, " blocks of it on disk"));
        }
        totals->restart_found_blocks += want;
      }
    }
  }
  // A new session computes two recent prompts again: what the disk holds of them is loaded.
  RETURN_IF_ERROR(OpenSession());
  for (int i = 0; i < 2 && !prompts_.empty(); ++i) {
    const std::vector<uint32_t> prompt = prompts_[Uniform(0, prompts_.size() - 1)];
    RETURN_IF_ERROR(OpenSequence(OpenMode::kCompute, /*composite=*/true, &prompt));
  }
  return absl::OkStatus();
}

std::vector<uint32_t> Simulation::NewPrompt() {
  std::vector<uint32_t> tokens;
  if (!prompts_.empty() && Chance(70)) {
    const std::vector<uint32_t>& base = prompts_[Uniform(0, prompts_.size() - 1)];
    tokens.assign(base.begin(),
                  base.begin() + (Chance(50) ? base.size() : Uniform(0, base.size())));
  }
  const uint32_t extra = Chance(3) ? num_blocks_ * block_size_ + 1 : Uniform(0, 3 * block_size_);
  // A tiny alphabet: equal blocks under different prefixes are common.
  for (uint32_t i = 0; i < extra; ++i) tokens.push_back(Uniform(1, 3));
  if (!tokens.empty()) {
    if (prompts_.size() < 12) {
      prompts_.push_back(tokens);
    } else {
      prompts_[Uniform(0, prompts_.size() - 1)] = tokens;
    }
  }
  return tokens;
}

uint64_t Simulation::PickSession() {
  // In opening order: session ids are random, and the run must depend on the seed alone.
  std::vector<uint64_t> live, ended;
  for (uint64_t id : session_order_) (sessions_.at(id).ended ? ended : live).push_back(id);
  if (!ended.empty() && (live.empty() || Chance(5))) return ended[Uniform(0, ended.size() - 1)];
  if (live.empty()) return 0;
  return live[Uniform(0, live.size() - 1)];
}

std::pair<uint64_t, uint64_t> Simulation::PickSequence() {
  if ((seqs_.empty() || Chance(4)) && !dead_seqs_.empty()) {
    return {PickSession(), dead_seqs_[Uniform(0, dead_seqs_.size() - 1)]};
  }
  if (seqs_.empty()) return {0, 0};
  auto it = seqs_.begin();
  std::advance(it, Uniform(0, seqs_.size() - 1));
  if (Chance(4)) return {PickSession(), it->first};
  return {it->second.session_id, it->first};
}

absl::StatusCode Simulation::SequenceAccess(uint64_t session_id, uint64_t sequence_id) const {
  if (sessions_.at(session_id).ended) return absl::StatusCode::kAborted;
  auto it = seqs_.find(sequence_id);
  if (it == seqs_.end() || it->second.session_id != session_id) return absl::StatusCode::kNotFound;
  return absl::StatusCode::kOk;
}

absl::Status Simulation::CheckHit(BlockId block, const Key& want, absl::string_view op) {
  if (block >= shadow_.size() || !shadow_[block].has_value()) {
    return Fail(absl::StrCat(op, ": hit block ", block, " holds no committed KV"));
  }
  if (!(*shadow_[block] == want)) {
    return Fail(absl::StrCat(op, ": WRONG KV: hit block ", block, " holds ",
                             Describe(*shadow_[block]), " for ", Describe(want)));
  }
  return tier_ ? CheckBytes(block, want, op) : absl::OkStatus();
}

std::string Simulation::BytesOf(const Key& key) const {
  const uint64_t digest = std::hash<std::string>{}(Describe(key));
  std::string bytes(block_bytes_, '\0');
  for (size_t b = 0; b < bytes.size(); ++b) {
    bytes[b] = static_cast<char>((digest >> (8 * (b % 8))) ^ (b / 8));
  }
  return bytes;
}

absl::Status Simulation::CheckBytes(BlockId block, const Key& key, absl::string_view op) {
  std::string bytes(block_bytes_, '\0');
  RETURN_IF_ERROR(pool_->ReadBlock(block, 0, block_bytes_, bytes.data()));
  if (bytes != BytesOf(key)) {
    auto it = written_.find(bytes);
    return Fail(absl::StrCat(op, ": WRONG BYTES: block ", block, " holds ",
                             it == written_.end() ? "bytes never written" : Describe(it->second),
                             " for ", Describe(key)));
  }
  return absl::OkStatus();
}

absl::Status Simulation::Offload() {
  const size_t stored = pool_->OffloadForTesting();
  offloaded_blocks_ += stored;
  trace_.push_back(absl::StrCat("offload -> ", stored));
  if (!disk_) return absl::OkStatus();
  // What was passed down becomes durable, hence visible, now: not when the writer gets to it.
  pool_->disk_tier()->Flush();
  const PoolDiskTierStats disk = DiskStats();
  trace_.back() += absl::StrCat(", passed down ", disk.demoted_blocks, " in all, disk holds ",
                                disk.store.records, " (evicted ", disk.store.evictions, ")");
  return CheckDiskRecords();
}

absl::Status Simulation::Step() {
  const uint32_t dice = Uniform(0, 99);
  if (sessions_.size() < 2 || dice < 6) return OpenSession();
  if (dice < 30)
    return OpenSequence(
        Pick({OpenMode::kCompute, OpenMode::kCompute, OpenMode::kPut, OpenMode::kPinCached}),
        /*composite=*/dice >= 24);
  if (dice < 40) return Extend();
  if (dice < 56) return Commit();
  if (dice < 68) return Release();
  if (dice < 74) return Fork();
  if (dice < 82) return Lookup();
  if (dice < 86) {
    const uint64_t session = PickSession();
    return session == 0 ? absl::OkStatus() : CloseSession(session);
  }
  if (dice < 93) return AdvanceAndExpire();
  return KeepAlive();
}

}  // namespace simulation
}  // namespace kvcache
