// kvcache-soak-client: one load process of the soak test (soak_process_test.cc). It holds a
// session of its tenant (its bearer token) and runs a seeded random loop of open / extend /
// commit / release / fork / lookup / put / get against one pool until --seconds pass or it gets
// SIGTERM, then closes its session and prints what it measured (tests/integration/soak_stats.h)
// followed by "soak-end" ("soak-ready" first, once SIGTERM is handled). The driver SIGKILLs,
// SIGSTOPs and restarts it at random.
//
// Every byte it reads back is checked against the KV pattern of its tokens
// (tests/integration/kv_pattern.h), keyed by --pattern_key so that a block of another tenant
// (which holds the same tokens under another key) fails the check:
//   - prefix hits of OpenSequence, read through the mapped pool: a mismatch is a checksum failure
//     unless the lease ended around the read (a stopped process whose blocks were released and
//     reused), which a session call made after the read tells apart: leases never come back;
//   - the copied partial block of ForkSequence, through the mapping, likewise;
//   - GetBlocks / GetBlocksInto: the daemon pins the blocks while they stream, so any mismatch
//     (or DATA_LOSS from the stream's own checksums) is a failure.
// With --mapped_writes the process is a worker: it writes its sequences' KV into the mapped pool
// and commits it. Without, it never writes the pool (a process the driver stops for longer than
// the lease could otherwise write blocks that were reused meanwhile, which no daemon can fence
// off in shared memory): its sequences stay uncommitted and its data goes through PutBlocks.
//
// Thread safety: single-threaded loop (the client library runs its keep-alive thread).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client_flags.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "common/command_line.h"
#include "tests/integration/kv_pattern.h"
#include "tests/integration/soak_stats.h"

ABSL_FLAG(std::string, target, "", "the daemon, e.g. unix:///tmp/kv.sock");
ABSL_FLAG(std::string, pool, "soak", "the pool to load");
ABSL_FLAG(double, seconds, 60, "run this long at most (SIGTERM ends it earlier)");
ABSL_FLAG(uint64_t, seed, 1, "seed of this process's random choices");
ABSL_FLAG(uint32_t, pattern_key, 0,
          "XORed into each token before its KV pattern is computed: one key per tenant");
ABSL_FLAG(bool, mapped_writes, true,
          "write and commit KV through the mapped pool (else: never write the pool)");
ABSL_FLAG(uint32_t, documents, 24, "distinct shared prefixes the prompts start with");
ABSL_FLAG(uint32_t, max_sequences, 4, "open sequences this process holds at most");

namespace kvcache::testing {
namespace {

std::atomic<bool> stop_requested{false};

void RequestStop(int) { stop_requested.store(true); }

// Token `index` of shared document `document`: the same in every process, so prompts hit.
uint32_t DocumentToken(uint32_t document, uint32_t index) {
  uint64_t x = (uint64_t{document} << 32 | index) * 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ULL;
  return 1 + static_cast<uint32_t>((x ^ (x >> 29)) % 30000);
}

struct LiveSequence {
  uint64_t id = 0;
  std::vector<uint32_t> tokens;
  std::vector<uint32_t> block_ids;
  bool written = false;  // its KV is in the pool (mapped writes), so it may be committed
};

class SoakClient {
 public:
  SoakClient(std::unique_ptr<KvCacheClient> client, std::string pool)
      : client_(std::move(client)),
        pool_(std::move(pool)),
        rng_(absl::GetFlag(FLAGS_seed)),
        key_(absl::GetFlag(FLAGS_pattern_key)),
        mapped_writes_(absl::GetFlag(FLAGS_mapped_writes)),
        documents_(std::max<uint32_t>(1, absl::GetFlag(FLAGS_documents))),
        max_sequences_(std::max<uint32_t>(1, absl::GetFlag(FLAGS_max_sequences))) {}

  // Runs the loop until `deadline` or SIGTERM. An error only when the process cannot work at
  // all (the pool cannot be described or mapped).
  absl::Status Run(absl::Time deadline) {
    while (!stop_requested.load() && absl::Now() < deadline) {
      if (!EnsureSession()) {
        absl::SleepFor(absl::Milliseconds(50));
        continue;
      }
      if (mapped_ == nullptr || mapped_->epoch() != client_->session_epoch()) {
        absl::Status mapped = MapPool();
        if (!mapped.ok()) return mapped;
      }
      RunOne();
    }
    return absl::OkStatus();
  }

  // Closes the session (its sequences are released now rather than at the lease's end).
  void Finish() {
    if (session_open_) {
      absl::StatusOr<uint32_t> closed = client_->CloseSession();
      (void)closed;  // a lost lease has released everything already
    }
  }

  const SoakStats& stats() const { return stats_; }

 private:
  bool EnsureSession() {
    if (session_open_ && !client_->session_lost() && !client_->epoch_changed()) return true;
    sequences_.clear();  // the daemon released them with the lease
    absl::StatusOr<KvCacheClient::SessionInfo> session =
        client_->OpenSession("", absl::StrCat("soak-", absl::GetFlag(FLAGS_seed)));
    if (session.status().code() == absl::StatusCode::kAlreadyExists) {
      // The library still holds a session we saw fail (an ABORTED call before the keep-alive
      // noticed): close it and open anew.
      (void)client_->CloseSession();
      session = client_->OpenSession("", absl::StrCat("soak-", absl::GetFlag(FLAGS_seed)));
    }
    session_open_ = session.ok();
    if (session.ok()) ++stats_.sessions;
    if (!session.ok() && !IsExpected(session.status())) {
      std::fprintf(stderr, "soak-client: OpenSession: %s\n", session.status().ToString().c_str());
    }
    return session_open_;
  }

  absl::Status MapPool() {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool(pool_);
    if (!described.ok()) return described.status();
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(*described);
    if (!mapped.ok()) return mapped.status();
    mapped_ = *std::move(mapped);
    layout_ = mapped_->layout();
    return absl::OkStatus();
  }

  static bool IsExpected(const absl::Status& status) {
    switch (status.code()) {
      case absl::StatusCode::kOk:
      case absl::StatusCode::kResourceExhausted:
      case absl::StatusCode::kAborted:
      case absl::StatusCode::kFailedPrecondition:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kUnavailable:
        return true;
      default:
        return false;
    }
  }

  // Files the call's outcome; a lost lease makes the next iteration open a new session.
  void Count(const char* call, const absl::Status& status, absl::Time start) {
    stats_.calls[call].Count(status, absl::Now() - start);
    if (status.code() == absl::StatusCode::kAborted ||
        status.code() == absl::StatusCode::kFailedPrecondition) {
      session_open_ = false;
    }
    if (!IsExpected(status)) {
      std::fprintf(stderr, "soak-client: unexpected %s: %s\n", call, status.ToString().c_str());
    }
  }

  uint32_t Uniform(uint32_t low, uint32_t high) {  // [low, high]
    return std::uniform_int_distribution<uint32_t>(low, high)(rng_);
  }

  // A shared document's first 1 to 6 blocks, then `tail` tokens of this process's own.
  std::vector<uint32_t> Prompt(uint32_t tail) {
    const uint32_t document = Uniform(0, documents_ - 1);
    const uint32_t shared = Uniform(1, 6) * layout_.block_size;
    std::vector<uint32_t> tokens;
    for (uint32_t i = 0; i < shared; ++i) tokens.push_back(DocumentToken(document, i));
    for (uint32_t i = 0; i < tail; ++i) tokens.push_back(Uniform(30001, 60000));
    return tokens;
  }

  std::vector<uint32_t> Keyed(absl::Span<const uint32_t> tokens) const {
    std::vector<uint32_t> keyed(tokens.begin(), tokens.end());
    for (uint32_t& token : keyed) token ^= key_;
    return keyed;
  }

  // Whether slots [0, slots) of `block` (the prompt's block `index`) hold their pattern.
  bool SlotsMatch(absl::Span<const uint32_t> keyed, uint32_t index, uint32_t block,
                  uint32_t slots) const {
    const char* bytes = reinterpret_cast<const char*>(mapped_->Block(block));
    if (slots == layout_.block_size) {
      const std::string expected = ExpectedBlockBytes(layout_, keyed, index);
      return std::memcmp(bytes, expected.data(), expected.size()) == 0;
    }
    std::string expected(layout_.BlockBytes(), '\0');
    for (uint32_t slot = 0; slot < slots; ++slot) {
      const uint32_t position = index * layout_.block_size + slot;
      WriteTokenPattern(layout_, keyed[position], position, expected.data());
    }
    for (uint32_t layer = 0; layer < layout_.num_layers; ++layer) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        const uint64_t offset = layout_.KvOffset(layer, kv);
        if (std::memcmp(bytes + offset, expected.data() + offset, slots * layout_.TokenBytes()) !=
            0) {
          return false;
        }
      }
    }
    return true;
  }

  // A mismatch read through the mapping while `sequence` was ours: a failure if the lease was
  // still alive after the read (then it was alive during it), else a stale read.
  void NoteMappedMismatch(const char* what, const LiveSequence& sequence) {
    const absl::StatusOr<KvCacheClient::Commit> alive = client_->CommitSequence(sequence.id, 0);
    if (alive.ok()) {
      ++stats_.checksum_failures;
      std::fprintf(stderr, "soak-client: %s: mapped bytes of sequence %llu fail their pattern\n",
                   what, static_cast<unsigned long long>(sequence.id));
    } else {
      ++stats_.stale_reads;
      session_open_ = false;
    }
  }

  void WriteTokens(const LiveSequence& sequence, uint32_t from) {
    const std::vector<uint32_t> keyed = Keyed(sequence.tokens);
    for (uint32_t position = from; position < keyed.size(); ++position) {
      char* block = reinterpret_cast<char*>(
          mapped_->Block(sequence.block_ids[position / layout_.block_size]));
      WriteTokenPattern(layout_, keyed[position], position, block);
    }
  }

  void RunOne() {
    const uint32_t roll = Uniform(0, 99);
    if (roll < 22) return OpenOne();
    if (roll < 34) return ExtendOne();
    if (roll < 46) return CommitOne();
    if (roll < 58) return ReleaseOne();
    if (roll < 66) return ForkOne();
    if (roll < 76) return LookupOne();
    if (roll < 88) return PutOne();
    return GetOne();
  }

  LiveSequence* PickSequence() {
    if (sequences_.empty()) return nullptr;
    return &sequences_[Uniform(0, static_cast<uint32_t>(sequences_.size()) - 1)];
  }

  void OpenOne() {
    if (sequences_.size() >= max_sequences_) return ReleaseOne();
    LiveSequence sequence;
    sequence.tokens = Prompt(Uniform(1, 2 * layout_.block_size - 1));
    const absl::Time start = absl::Now();
    absl::StatusOr<KvCacheClient::Sequence> opened = client_->OpenSequence(pool_, sequence.tokens);
    Count("open", opened.status(), start);
    if (!opened.ok()) return;
    sequence.id = opened->sequence_id;
    sequence.block_ids = opened->block_ids;
    const std::vector<uint32_t> keyed = Keyed(sequence.tokens);
    bool hits_match = true;
    for (uint32_t b = 0; b < opened->num_cached_tokens / layout_.block_size; ++b) {
      ++stats_.verified_blocks;
      hits_match = hits_match && SlotsMatch(keyed, b, sequence.block_ids[b], layout_.block_size);
    }
    if (!hits_match) NoteMappedMismatch("open", sequence);
    if (mapped_writes_) {
      WriteTokens(sequence, opened->num_cached_tokens);
      sequence.written = true;
    }
    sequences_.push_back(std::move(sequence));
  }

  void ExtendOne() {
    LiveSequence* sequence = PickSequence();
    if (sequence == nullptr) return OpenOne();
    std::vector<uint32_t> more(Uniform(1, layout_.block_size + 4));
    for (uint32_t& token : more) token = Uniform(30001, 60000);
    const absl::Time start = absl::Now();
    absl::StatusOr<KvCacheClient::Extension> extended = client_->ExtendSequence(sequence->id, more);
    Count("extend", extended.status(), start);
    if (!extended.ok()) {
      // After a timeout the daemon may or may not have appended: forget the sequence rather
      // than write KV for positions it does not have.
      if (extended.status().code() == absl::StatusCode::kDeadlineExceeded ||
          extended.status().code() == absl::StatusCode::kUnavailable) {
        Drop(sequence);
      }
      return;
    }
    const uint32_t from = static_cast<uint32_t>(sequence->tokens.size());
    sequence->tokens.insert(sequence->tokens.end(), more.begin(), more.end());
    sequence->block_ids.insert(sequence->block_ids.end(), extended->new_block_ids.begin(),
                               extended->new_block_ids.end());
    if (sequence->written) WriteTokens(*sequence, from);
  }

  void CommitOne() {
    LiveSequence* sequence = PickSequence();
    if (sequence == nullptr || !sequence->written) return LookupOne();
    const absl::Time start = absl::Now();
    absl::StatusOr<KvCacheClient::Commit> committed =
        client_->CommitSequence(sequence->id, static_cast<uint32_t>(sequence->tokens.size()));
    Count("commit", committed.status(), start);
  }

  // Releases the sequence (best effort) and forgets it.
  void Drop(LiveSequence* sequence) {
    const absl::Time start = absl::Now();
    Count("release", client_->ReleaseSequence(sequence->id), start);
    sequences_.erase(sequences_.begin() + (sequence - sequences_.data()));
  }

  void ReleaseOne() {
    LiveSequence* sequence = PickSequence();
    if (sequence == nullptr) return OpenOne();
    Drop(sequence);
  }

  void ForkOne() {
    LiveSequence* sequence = PickSequence();
    if (sequence == nullptr || sequences_.size() >= max_sequences_) return LookupOne();
    const absl::Time start = absl::Now();
    absl::StatusOr<KvCacheClient::Fork> forked = client_->ForkSequence(sequence->id);
    Count("fork", forked.status(), start);
    if (!forked.ok()) return;
    LiveSequence child{.id = forked->sequence_id,
                       .tokens = sequence->tokens,
                       .block_ids = forked->block_ids,
                       .written = sequence->written};
    const uint32_t partial = static_cast<uint32_t>(child.tokens.size() % layout_.block_size);
    if (child.written && partial != 0 && !child.block_ids.empty()) {
      // The fork copied the partial last block: the copy holds the parent's written slots.
      ++stats_.verified_blocks;
      const uint32_t index = static_cast<uint32_t>(child.block_ids.size() - 1);
      if (!SlotsMatch(Keyed(child.tokens), index, child.block_ids.back(), partial)) {
        NoteMappedMismatch("fork", child);
      }
    }
    sequences_.push_back(std::move(child));
  }

  void LookupOne() {
    const std::vector<uint32_t> tokens = Prompt(Uniform(0, layout_.block_size - 1));
    const absl::Time start = absl::Now();
    absl::StatusOr<KvCacheClient::LookupResult> found = client_->Lookup(pool_, "", tokens);
    Count("lookup", found.status(), start);
  }

  void PutOne() {
    const std::vector<uint32_t> tokens = Prompt(0);
    const std::string bytes =
        ExpectedPrefixBytes(layout_, Keyed(tokens), tokens.size() / layout_.block_size);
    const absl::Time start = absl::Now();
    absl::StatusOr<KvCacheClient::PutResult> put = client_->PutBlocks(pool_, tokens, bytes);
    Count("put", put.status(), start);
  }

  void GetOne() {
    const std::vector<uint32_t> tokens = Prompt(Uniform(0, layout_.block_size - 1));
    const std::vector<uint32_t> keyed = Keyed(tokens);
    const bool into = Uniform(0, 1) == 1;
    std::string bytes;
    uint32_t num_blocks = 0;
    const absl::Time start = absl::Now();
    absl::Status status;
    if (into) {
      bytes.resize(tokens.size() / layout_.block_size * layout_.BlockBytes());
      absl::StatusOr<KvCacheClient::GetInfo> got =
          client_->GetBlocksInto(pool_, tokens, absl::MakeSpan(bytes));
      status = got.status();
      if (got.ok()) num_blocks = got->num_blocks;
    } else {
      absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks(pool_, tokens);
      status = got.status();
      if (got.ok()) {
        num_blocks = got->num_blocks;
        bytes = std::move(got->bytes);
      }
    }
    Count(into ? "get_into" : "get", status, start);
    if (status.code() == absl::StatusCode::kDataLoss) ++stats_.checksum_failures;
    if (!status.ok()) return;
    stats_.verified_blocks += num_blocks;
    const std::string expected = ExpectedPrefixBytes(layout_, keyed, num_blocks);
    if (bytes.compare(0, expected.size(), expected) != 0) {
      ++stats_.checksum_failures;
      std::fprintf(stderr, "soak-client: %s: %u blocks fail their pattern\n",
                   into ? "GetBlocksInto" : "GetBlocks", num_blocks);
    }
  }

  const std::unique_ptr<KvCacheClient> client_;
  const std::string pool_;
  std::mt19937_64 rng_;
  const uint32_t key_;
  const bool mapped_writes_;
  const uint32_t documents_;
  const uint32_t max_sequences_;
  std::unique_ptr<MappedPool> mapped_;
  PoolLayout layout_;
  bool session_open_ = false;
  std::vector<LiveSequence> sequences_;
  SoakStats stats_;
};

int Main(int argc, char** argv) {
  struct sigaction action {};
  action.sa_handler = RequestStop;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // From here SIGTERM ends the loop with a report; the driver terminates only ready clients.
  std::printf("soak-ready\n");
  std::fflush(stdout);
  ParseCommandLineFlags(argc, argv,
                        "kvcache-soak-client --target=unix:///path/kv.sock [--token_file=F] "
                        "[--seed=N] [--pattern_key=K] [--seconds=S]: one soak load process");
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));

  ClientOptions base;
  base.rpc_timeout = absl::Seconds(10);
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags(base);
  if (!options.ok()) {
    std::fprintf(stderr, "soak-client: %s\n", options.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client =
      KvCacheClient::Connect(absl::GetFlag(FLAGS_target), *options);
  if (!client.ok()) {
    std::fprintf(stderr, "soak-client: connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  SoakClient soak(*std::move(client), absl::GetFlag(FLAGS_pool));
  const absl::Status ran = soak.Run(deadline);
  soak.Finish();
  std::printf("%ssoak-end\n", soak.stats().ToLines().c_str());
  std::fflush(stdout);
  if (!ran.ok()) {
    std::fprintf(stderr, "soak-client: %s\n", ran.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvcache::testing

int main(int argc, char** argv) { return kvcache::testing::Main(argc, argv); }
