// One seed's run of the token-sequence simulation (tests/cache/simulation_test.cc has what it
// checks): a pool driven by seeded random operations, each answer checked against the content
// model, the shadow KV and, in the tier runs, the bytes. token_simulation.cc sets the pool up and
// checks it; token_simulation_ops.cc has the operations.
#ifndef KVCACHE_TESTS_CACHE_TOKEN_SIMULATION_H_
#define KVCACHE_TESTS_CACHE_TOKEN_SIMULATION_H_

#include "tests/cache/sim_common.h"

namespace kvcache {
namespace simulation {

// One seed's run. Returns the first discrepancy; `trace` holds every operation so far.
class Simulation {
 public:
  // `disk`: a disk tier below tier 2 (which `tier` then must ask for).
  // `staged`: the pool's memory is host bytes behind the device interface
  // (tests/testing/pool_memories.h), so every tier copy takes a device pool's batched path.
  // `parts`: the pool declares a block of two parts, "kv" and a one-block trailing "state"; the
  // commits name none, so every block holds both and the model's answers stand (DESIGN §13).
  Simulation(uint64_t seed, uint32_t hash_bits, bool tier, bool disk, int num_ops,
             bool staged = false, bool parts = false)
      : rng_(seed),
        hash_bits_(hash_bits),
        tier_(tier || disk),
        disk_(disk),
        staged_(staged),
        parts_(parts),
        num_ops_(num_ops) {}

  absl::Status Run(SimTotals* totals);

  const std::vector<std::string>& trace() const { return trace_; }
  // The trace with each session id (random: SessionRegistry draws them) replaced by its place in
  // opening order, so that two runs of a seed can be compared.
  std::vector<std::string> ComparableTrace() const;

 private:
  struct SessionInfo {
    std::shared_ptr<Session> session;
    std::string tenant;
    std::string principal;
    absl::Time deadline;
    bool ended = false;
  };
  struct SeqInfo {
    uint64_t session_id = 0;
    std::string tenant;
    std::string ns;
    std::vector<uint32_t> tokens;
    std::vector<BlockId> blocks;
    uint32_t committed = 0;
  };

  // A lower tier's record as the simulation names it: chain hash and prefix digest.
  using RecordKey = std::tuple<uint64_t, uint64_t, uint64_t>;
  static RecordKey RecordKeyOf(const Hash128& hash, uint64_t prefix_digest) {
    return {hash.hi, hash.lo, prefix_digest};
  }
  // The chain hashes and prefix digests of every full block of `tokens` in namespace `ns`
  // ("tenant/salt/lora"), computed here as a client would, not taken from the pool.
  struct Chain {
    std::vector<Hash128> hashes;
    std::vector<uint64_t> digests;
  };
  Chain ChainOf(const std::string& ns, const std::vector<uint32_t>& tokens) const;

  // A new pool (and manager: a new daemon) with empty tiers 1 and 2, over the disk file if any.
  absl::Status StartPool();

  // Adds this pool's figures to `totals` and starts counting afresh (at the end and at a
  // restart).
  absl::Status AddTotals(SimTotals* totals);

  PoolDiskTierStats DiskStats() const {
    return pool_->Stats().disk_tier.value_or(PoolDiskTierStats{});
  }

  // What the disk tier indexes now, sorted.
  std::vector<RecordKey> DiskRecords() const;

  // Every record on disk is a block this run wrote, under its own identity.
  absl::Status CheckDiskRecords();

  // Where blocks [first, limit) of `tokens` come back from below tier 1 (the model run: full
  // hashes): 'h' from tier 2 where it holds the block's record, else 'd' from the disk tier's
  // durable ones; the walk ends at the first block neither holds.
  std::string PredictBelow(const std::string& ns, const std::vector<uint32_t>& tokens, size_t first,
                           size_t limit) const;

  // A daemon restart over the same disk file: tiers 1 and 2 and every session are gone; the disk
  // indexes again exactly the records it held (each offload was flushed: all durable).
  absl::Status Restart(SimTotals* totals);

  uint32_t Uniform(uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(0, 99) < static_cast<uint32_t>(percent); }
  template <typename T>
  T Pick(std::initializer_list<T> items) {
    return *(items.begin() + Uniform(0, static_cast<uint32_t>(items.size()) - 1));
  }

  std::vector<uint32_t> NewPrompt();

  std::string Namespace(const std::string& tenant, absl::string_view salt, absl::string_view lora) {
    return absl::StrCat(tenant, "/", salt, "/", lora);
  }

  // A session to act in: mostly a live one; sometimes one that has ended.
  uint64_t PickSession();
  // A sequence to act on, with the session to send: mostly its own, live one; sometimes a
  // released id or another session.
  std::pair<uint64_t, uint64_t> PickSequence();

  // The status a sequence call gets before anything about blocks: ABORTED for an ended session,
  // NOT_FOUND for a sequence that is not the session's.
  absl::StatusCode SequenceAccess(uint64_t session_id, uint64_t sequence_id) const;

  // A hit must hold exactly the requested prefix: by the shadow, and in the tier run by the
  // bytes in the pool's memory.
  absl::Status CheckHit(BlockId block, const Key& want, absl::string_view op);

  // The bytes the worker writes for a block of content `key`: its digest, repeated (a block is at
  // least 8 bytes).
  std::string BytesOf(const Key& key) const;

  // The pool's memory holds `key`'s bytes in `block`.
  absl::Status CheckBytes(BlockId block, const Key& key, absl::string_view op);

  uint64_t PassedDownOnEviction() const {
    const PoolStatsSnapshot stats = pool_->Stats();
    return stats.host_tier.has_value() ? stats.host_tier->passed_down_on_eviction : 0;
  }

  // What the mover would do now, done synchronously.
  absl::Status Offload();

  absl::Status Step();

  absl::Status OpenSession();

  // Opens a sequence. `composite` with kCompute: commits every token and releases (a finished
  // request); with kPut: the same (what PutBlocks does); with kPinCached: checks the hits and
  // releases (GetBlocks). `prompt`: these tokens rather than a new prompt.
  absl::Status OpenSequence(OpenMode mode, bool composite,
                            const std::vector<uint32_t>* prompt = nullptr);

  absl::Status Extend();

  absl::Status Commit();

  absl::Status DoCommit(uint64_t session_id, uint64_t id, uint32_t written);

  absl::Status Release();

  absl::Status DoRelease(uint64_t session_id, uint64_t id);

  absl::Status Fork();

  absl::Status Lookup();

  // The model's side of a session's end: its sequences dropped, their blocks (each sequence's
  // tail first) appended to `blocks`, which the caller releases as one LRU group.
  uint32_t EndSession(uint64_t session_id, std::vector<BlockId>* blocks);

  absl::Status CloseSession(uint64_t session_id);

  absl::Status AdvanceAndExpire();

  absl::Status KeepAlive();

  absl::Status CheckAccounting();

  std::mt19937_64 rng_;
  const uint32_t hash_bits_;
  const bool tier_;
  const bool disk_;
  const bool staged_;
  const bool parts_;
  const int num_ops_;
  PoolOptions options_;
  // The disk tier's file, kept across restarts.
  std::optional<::kvcache::testing::ScopedTempDir> disk_dir_;
  uint32_t block_size_ = 0;
  uint64_t block_bytes_ = 0;
  uint32_t num_blocks_ = 0;
  FakeClock clock_;
  uint64_t epoch_ = kEpoch;                // a restart is a new daemon: a new epoch
  std::unique_ptr<CacheManager> manager_;  // destroyed before the file: declared after disk_dir_
  Pool* pool_ = nullptr;
  std::optional<Model> model_;
  std::vector<std::optional<Key>> shadow_;
  std::map<uint64_t, SessionInfo> sessions_;
  std::vector<uint64_t> session_order_;
  std::vector<uint64_t> opened_sessions_;  // every session opened, restarts included
  std::map<uint64_t, SeqInfo> seqs_;
  std::vector<uint64_t> dead_seqs_;
  std::vector<std::vector<uint32_t>> prompts_;
  std::vector<std::string> trace_;
  uint64_t hit_blocks_ = 0;
  uint64_t tier_hit_blocks_ = 0;  // blocks Open loaded from tier 2
  uint64_t disk_hit_blocks_ = 0;  // blocks Open loaded from the disk tier
  uint64_t offloaded_blocks_ = 0;
  std::map<std::string, Key> written_;  // the tier run's bytes, for messages
  // The disk run's written blocks by their records' identity, kept across restarts.
  std::map<RecordKey, Key> written_identities_;
};

}  // namespace simulation
}  // namespace kvcache

#endif  // KVCACHE_TESTS_CACHE_TOKEN_SIMULATION_H_
