// KvCacheClient: the C++ client of the kvcache daemon's v1 API. It turns each RPC into a typed call
// returning absl::Status / absl::StatusOr of plain structs, puts a deadline on every call, and
// holds one session (lease) per client: OpenSession starts a background thread that keeps the
// lease alive every ttl/3 until CloseSession or destruction.
//
// Epoch fencing: the client remembers the epoch the daemon reported when the session was opened
// and sends it with every session request. A response with a different epoch, or the daemon's
// FAILED_PRECONDITION for a request that carried one, means the daemon restarted: every block id
// and sequence id from before is meaningless. The call then returns FAILED_PRECONDITION,
// epoch_changed() turns true and on_epoch_change runs once; the caller opens a new session (which
// clears the flag) and recomputes. A lease found ended without CloseSession (the keep-alive
// thread's ABORTED, NOT_FOUND or FAILED_PRECONDITION, or a session call's ABORTED) sets
// session_lost(): the daemon has released its sequences.
//
// Identity: with ClientOptions::bearer_token every call, keep-alives and block streams included,
// carries the token; with ClientOptions::tls the channel is TLS (mutual TLS with a client
// certificate). A daemon that checks identities answers a call it cannot authenticate, or one
// that reaches outside the caller's tenant, with its own codes (UNAUTHENTICATED,
// PERMISSION_DENIED), passed on unchanged.
//
// Error codes are the daemon's, unchanged (see proto/kvcache/v1/kvcache.proto); the client adds
// INVALID_ARGUMENT when Connect is given unusable options (an unreadable TLS file, TLS for a
// unix:// target, a token that cannot go in a header or would go over plaintext TCP to a host
// other than loopback), UNAVAILABLE when Connect cannot reach the
// daemon (a failed TLS handshake included), DEADLINE_EXCEEDED when a call outlives
// rpc_timeout, ALREADY_EXISTS when OpenSession is called while a healthy session is open, and
// for the block data and page calls FAILED_PRECONDITION without an open session, INVALID_ARGUMENT
// for a put of the wrong size (a page batch that is empty, too long, with a key of the wrong size
// or counts that disagree) and DATA_LOSS for received bytes that fail their checksum.
//
// Workers on the daemon's node map the pool instead of streaming bytes: see MappedPool
// (client/mapped_pool.h), built from DescribePool's answer.
//
// Thread safety: thread-safe. Calls may be made from any number of threads at once; OpenSession
// and CloseSession are serialized with each other. Callbacks run on the thread that noticed the
// change (a caller's or the keep-alive thread) with no client lock held; they may make calls but
// must not call OpenSession or CloseSession (which join the keep-alive thread) nor destroy the
// client: hand the reopening to another thread.
#ifndef KVCACHE_CLIENT_KV_CACHE_CLIENT_H_
#define KVCACHE_CLIENT_KV_CACHE_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/block_checksum.h"
#include "common/block_hash.h"
#include "common/compatibility_manifest.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"
#include "common/task_workers.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache {

namespace kernels {
struct PageCopy;  // kernels/page_checksum.h
}  // namespace kernels

class BlockStream;
class MappedPool;

// TLS for a TCP target (a unix:// target is local and takes no TLS). Files are PEM; Connect reads
// them, and names a file it cannot read, never its contents.
struct ClientTlsOptions {
  bool enabled = false;
  // CA certificates that verify the daemon's certificate; empty: gRPC's default roots (the
  // system's, or $GRPC_DEFAULT_SSL_ROOTS_FILE_PATH).
  std::string ca_file;
  // A client certificate (chain) and its private key, for a daemon that requires mutual TLS:
  // both or neither.
  std::string cert_file;
  std::string key_file;
  // The name the daemon's certificate must carry, when it differs from the target's host (a
  // daemon reached by IP address or through a tunnel); empty: the target's host.
  std::string server_name;
};

struct ClientOptions {
  // How long Connect waits for the channel to become ready.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Deadline of every call, keep-alives included.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // When true, a call made while the daemon is unreachable waits (up to rpc_timeout) for it to
  // come back instead of failing UNAVAILABLE at once: useful across a sidecar's restart.
  bool wait_for_ready = false;
  int max_message_bytes = 16 << 20;
  // When not empty, every call carries `authorization: Bearer <bearer_token>`, which the daemon
  // maps to this caller's identity. Visible ASCII only (no spaces): Connect refuses anything else
  // with INVALID_ARGUMENT. The client never puts the token in an error or a log.
  // Over plaintext TCP (no tls) anyone on the path can read the token, so Connect refuses to
  // send it to a host other than loopback (127.0.0.0/8, ::1, localhost) with INVALID_ARGUMENT
  // unless allow_plaintext_token is set. Unix sockets and TLS channels are unaffected.
  std::string bearer_token;
  bool allow_plaintext_token = false;
  ClientTlsOptions tls;
  // Runs once per detected restart. `new_epoch` is 0 when the daemon only said FAILED_PRECONDITION
  // (an error carries no response body, so its epoch is unknown).
  std::function<void(uint64_t old_epoch, uint64_t new_epoch)> on_epoch_change;
  // Runs once when the keep-alive thread finds the lease ended; `status` is the daemon's answer.
  std::function<void(const absl::Status& status)> on_session_lost;
  // Threads besides the caller's that copy and checksum the pages of WritePages and ReadPagesInto
  // on a host pool, and checksum those of PutPages and PutBlocks, in calls of kParallelCopyBytes
  // or more (started by the first such call; one thread alone copies at about half the rate
  // memory allows). They look for their slices while the batch's round trip is under way, up to
  // 1 ms of a core each per batch, rather than sleep through it and wake late.
  // -1: one less than the machine's cores, at most 3; 0: the caller's alone.
  int page_copy_threads = -1;
};

// What KvCacheClient's AcquirePages, GetPages and ReadPagesInto restore (at namespace scope so it
// can be a default argument inside the class).
struct PageReadOptions {
  // The parts the caller restores, by name; empty: every part of the pool.
  std::vector<std::string> parts;
  // How long loading from the lower tiers may take; 0: no bound.
  uint32_t max_load_ms = 0;
};

// OK when `token` can go in ClientOptions::bearer_token: visible ASCII, no spaces (what a gRPC
// header value and RFC 6750 allow). INVALID_ARGUMENT otherwise, quoting nothing of the token.
absl::Status CheckBearerToken(absl::string_view token);

// Whether `target` is a gRPC target whose host is a loopback address: 127.0.0.0/8, ::1 (or
// ::ffff:127.x.x.x) or "localhost", with or without a dns:, ipv4: or ipv6: scheme and a port.
// False for Unix sockets and for anything it cannot parse.
bool IsLoopbackTarget(absl::string_view target);

// One WatchEvents stream (see the proto): Next blocks for the next response. Resume a broken
// watch with a new one from the last response's next_sequence and epoch.
// Thread safety: Next from one thread; Cancel from any.
class EventWatch {
 public:
  ~EventWatch();
  EventWatch(const EventWatch&) = delete;
  EventWatch& operator=(const EventWatch&) = delete;

  // The next response, or the stream's final status once it ends: CANCELLED after Cancel,
  // UNAVAILABLE when the daemon went away, the daemon's error otherwise (PERMISSION_DENIED,
  // NOT_FOUND, RESOURCE_EXHAUSTED).
  absl::StatusOr<v1::WatchEventsResponse> Next();
  void Cancel() { context_.TryCancel(); }

 private:
  friend class KvCacheClient;
  EventWatch() = default;

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::WatchEventsResponse>> reader_;
  bool finished_ = false;
  absl::Status final_status_;
};

// The channel Connect makes for `target` (TLS from options.tls, message limits, reconnect
// backoff), not yet connected; for tools that call other services of the daemon (health) or
// hold several channels. INVALID_ARGUMENT as Connect.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateDaemonChannel(const std::string& target,
                                                                   const ClientOptions& options);
// Waits up to options.connect_timeout for `channel` to connect; UNAVAILABLE naming `target`.
absl::Status WaitForDaemon(grpc::Channel& channel, const std::string& target,
                           const ClientOptions& options);

class KvCacheClient {
 public:
  // How a process on the daemon's node maps a pool's memory (kvcache.v1.PoolMapping); see
  // MappedPool (client/mapped_pool.h). Block i starts at byte i * block_bytes.
  struct PoolMapping {
    enum class Kind {
      kNone = 0,     // not mappable: move bytes with PutBlocks / GetBlocks
      kShm = 1,      // POSIX shared memory: shm_open(shm_name, O_RDWR), mmap size_bytes
      kCudaIpc = 2,  // cudaIpcOpenMemHandle(cuda_ipc_handle) on cuda_device
    };
    Kind kind = Kind::kNone;
    std::string shm_name;
    uint64_t size_bytes = 0;
    std::string cuda_ipc_handle;  // raw cudaIpcMemHandle_t bytes
    int32_t cuda_device = -1;
  };
  struct PoolInfo {
    std::string name;
    std::string model_id;
    PoolLayout layout;
    uint64_t block_bytes = 0;         // layout.BlockBytes(), as the daemon computed it
    uint64_t layout_fingerprint = 0;  // root of every hash chain in this pool
    uint32_t num_blocks = 0;
    HashAlgorithm hash_algorithm = HashAlgorithm::kXxh3_128;
    std::string memory_kind;  // "host" or "cuda"
    PoolMapping mapping;
    // The named parts of every page, in page order (one "kv" part, the whole block, for a pool
    // declared without parts); bit i of a page's part mask is parts[i].
    std::vector<PagePartLayout> parts;
  };
  // free + evictable + referenced == num_blocks.
  struct BlockCounts {
    uint32_t free = 0;
    uint32_t evictable = 0;   // ref 0, still hashed and findable
    uint32_t referenced = 0;  // ref > 0
  };
  // A manifest open sessions are bound to that fits the pool (v1.ManifestInUse).
  struct ManifestInUse {
    std::string digest;  // 32 hex digits, under the pool's hash algorithm
    std::string tenant;
    ManifestFields manifest;
    uint32_t sessions = 0;
  };
  struct PoolDescription {
    PoolInfo pool;
    BlockCounts counts;
    // The caller's tenant's (an admin's: every tenant's), by tenant then digest.
    std::vector<ManifestInUse> manifests;
    // The daemon's epoch when it answered. The mapping (shm name, IPC handle) belongs to that
    // daemon start only.
    uint64_t epoch = 0;
  };
  struct SessionInfo {
    uint64_t session_id = 0;
    uint64_t epoch = 0;
    absl::Duration ttl;  // as granted: the daemon clamps the asked TTL to its limits
  };
  // Where cached tokens were found (v1.TierTokens): the pool itself, or a lower tier they were
  // loaded from (Lookup: found in, not loaded).
  struct TierTokens {
    uint32_t pool = 0;
    uint32_t host = 0;
    uint32_t cluster = 0;
    uint32_t disk = 0;
  };
  struct Sequence {
    uint64_t sequence_id = 0;
    std::vector<uint32_t> block_ids;  // the block table, one id per block_size tokens
    uint32_t num_cached_tokens = 0;   // leading tokens whose KV is already in the pool
    TierTokens cached_tokens_by_tier;
    // One per cached block: the parts it holds (bit i: the pool's part i, DescribePool's order);
    // empty for a pool declared without parts.
    std::vector<uint32_t> part_masks;
  };
  struct Extension {
    std::vector<uint32_t> new_block_ids;  // appended to the block table
    uint32_t num_tokens = 0;              // sequence length after the call
  };
  struct Commit {
    uint32_t num_committed_blocks = 0;  // full blocks of the sequence now committed
    uint32_t num_published_blocks = 0;  // of those, how many this call added to the index
  };
  struct Fork {
    uint64_t sequence_id = 0;
    std::vector<uint32_t> block_ids;
    std::optional<uint32_t> copied_from_block;  // source of the copied partial last block
  };
  struct LookupResult {
    uint32_t num_cached_tokens = 0;  // num_cached_blocks * block_size; not capped
    uint32_t num_cached_blocks = 0;
    TierTokens cached_tokens_by_tier;
    std::vector<uint32_t> part_masks;  // as Sequence's
  };
  // A pool's lower tier (v1.TierStats).
  struct TierStats {
    std::string tier;  // "host", "disk" or "cluster"
    uint64_t hit_blocks = 0;
    uint64_t stored_blocks = 0;
    uint64_t evicted_blocks = 0;
    uint64_t bytes_used = 0;
    uint64_t capacity_bytes = 0;
    uint64_t verify_failures = 0;
    uint64_t load_failures = 0;
    uint64_t deadline_blocks = 0;
    uint64_t evicted_from_above = 0;
    uint64_t records = 0;
    uint64_t request_waits = 0;
    uint64_t store_failures = 0;  // copies the tier did not take (v1.TierStats)
    uint64_t restored_records = 0;
    uint64_t restore_skipped = 0;
    uint64_t node_failures = 0;     // cluster: nodes rested (v1.TierStats)
    uint64_t skipped_commands = 0;  // cluster: commands skipped while their node rested
    uint64_t redirects = 0;         // cluster: MOVED and ASK followed
    uint64_t lost_from_above = 0;   // evictions above whose block the tier refused (v1.TierStats)
    uint64_t open_failures = 0;  // sealed records that did not open for the tenant (v1.TierStats)
    uint64_t superseded = 0;     // host, disk: records replaced by a copy with more parts
    uint64_t poorer_kept_back = 0;  // cluster: poorer copies not sent over richer ones
  };
  struct PoolStats {
    std::string pool;
    BlockCounts counts;
    uint64_t prompt_tokens = 0;  // tokens asked for by OpenSequence
    uint64_t hit_tokens = 0;     // of those, served from the cache
    uint64_t hit_blocks = 0;
    uint64_t resurrected_blocks = 0;  // of OpenSequence's hit blocks, those soft-freed (evictable)
    uint64_t miss_blocks = 0;         // freshly allocated blocks
    uint64_t evictions = 0;
    uint64_t published_blocks = 0;
    uint64_t duplicate_blocks = 0;
    uint32_t open_sequences = 0;
    std::vector<TierStats> tiers;  // the pool's lower tiers, top down
  };
  struct Stats {
    std::vector<PoolStats> pools;
    uint32_t open_sessions = 0;
  };
  // Where a page call's pages were (v1.TierPages), summing to its page count.
  using TierPages = PagesByTier;
  struct PagesFound {
    uint32_t num_pages = 0;  // leading keys restorable under the hit rule
    TierPages pages_by_tier;
  };
  // Marks a key's page present already (a duplicate) in PageReservation::block_ids.
  static constexpr uint32_t kDuplicatePage = 0xFFFFFFFF;
  struct PageReservation {
    uint64_t sequence_id = 0;  // CommitPages publishes it, ReleaseSequence abandons it
    // Per key, the block to write its page into, or kDuplicatePage.
    std::vector<uint32_t> block_ids;
  };
  struct PagesStored {
    uint32_t num_published = 0;   // pages this call added
    uint32_t num_duplicates = 0;  // pages present already
  };
  struct AcquiredPages {
    uint64_t sequence_id = 0;  // ReleaseSequence unpins the pages
    // One entry per page the hit rule gave, from the first key on.
    std::vector<uint32_t> block_ids;
    std::vector<uint64_t> page_checksums;  // XXH3-64 of each whole page
    std::vector<uint32_t> part_masks;      // the parts each page holds
    TierPages pages_by_tier;
  };
  struct GotPages {
    std::vector<std::string> pages;  // whole pages, one per page the hit rule gave, verified
    std::vector<uint32_t> part_masks;
    TierPages pages_by_tier;
  };
  struct PagesRead {
    uint32_t num_pages = 0;  // leading destinations written
    std::vector<uint32_t> part_masks;
    TierPages pages_by_tier;
  };
  struct ListedSession {
    uint64_t session_id = 0;  // 0: another identity's session, hidden from a non-admin
    std::string tenant;
    std::string principal;
    std::string client_name;
    absl::Duration ttl;
    absl::Duration expires_in;
    uint32_t open_sequences = 0;
  };
  struct WatchOptions {
    uint64_t start_sequence = 0;  // 0: everything; else the last response's next_sequence
    uint64_t epoch = 0;           // the epoch start_sequence was counted in
    std::string tenant;           // empty: the caller's (an admin: every tenant)
    std::string pool;             // empty: every pool
  };
  struct PutResult {
    uint32_t num_blocks = 0;          // full blocks in the put prefix
    uint32_t num_already_cached = 0;  // of those, kept from the cache (their bytes were dropped)
    uint32_t num_stored = 0;          // of those, written and published by this put
  };
  struct GetInfo {
    uint32_t num_blocks = 0;         // cached full blocks matched, from the front
    uint32_t num_cached_tokens = 0;  // num_blocks * block_size
    uint64_t block_bytes = 0;
    std::vector<uint32_t> part_masks;  // one per block, as Sequence's
  };
  struct GetResult : GetInfo {
    std::string bytes;  // num_blocks * block_bytes: the blocks' bytes, concatenated in order
  };

  // Connects to `target` ("unix:///path/kv.sock" or "host:port"; over TLS with options.tls) and
  // waits up to options.connect_timeout for the channel to be ready; UNAVAILABLE if it is not
  // (the daemon is not there, or the TLS handshake failed: an untrusted or misnamed daemon
  // certificate, a client certificate the daemon refuses). INVALID_ARGUMENT for TLS with a
  // unix:// target, TLS files that cannot be read, a client certificate without its key (or the
  // reverse), or a bearer token that is not visible ASCII.
  static absl::StatusOr<std::unique_ptr<KvCacheClient>> Connect(std::string target,
                                                                ClientOptions options = {});

  // Talks over `channel` (Connect makes one with the options' message limits and TLS).
  // REQUIRES: options.bearer_token is visible ASCII (Connect checks it; gRPC aborts on a header
  // value it cannot send).
  explicit KvCacheClient(std::shared_ptr<grpc::ChannelInterface> channel,
                         ClientOptions options = {});
  // Stops the keep-alive thread and closes an open session (best effort, short deadline), so
  // the daemon releases its sequences now instead of at the end of the lease.
  ~KvCacheClient();

  KvCacheClient(const KvCacheClient&) = delete;
  KvCacheClient& operator=(const KvCacheClient&) = delete;

  // Returns the daemon's epoch. Read-only calls (Ping, ListPools, DescribePool, Lookup, GetStats)
  // are idempotent; NOT_FOUND for an unknown pool.
  absl::StatusOr<uint64_t> Ping();
  // The daemon's release and source revision (Ping's server_version and server_revision).
  struct ServerVersion {
    std::string version;
    std::string revision;  // empty when the daemon was built outside a git checkout
  };
  absl::StatusOr<ServerVersion> GetServerVersion();
  absl::StatusOr<std::vector<PoolInfo>> ListPools();
  absl::StatusOr<PoolDescription> DescribePool(absl::string_view pool);
  // `manifest`: the one the looked-up blocks' sessions are bound to (none: sessions without).
  // `restore_parts`: as OpenSequence's.
  absl::StatusOr<LookupResult> Lookup(absl::string_view pool, absl::string_view tenant,
                                      absl::Span<const uint32_t> tokens,
                                      absl::string_view cache_salt = "",
                                      const ExtraKeys& extra_keys = {},
                                      const std::optional<ManifestFields>& manifest = std::nullopt,
                                      absl::Span<const std::string> restore_parts = {});
  // Every pool when `pool` is empty.
  absl::StatusOr<Stats> GetStats(absl::string_view pool = "");
  // The caller's tenant's open sessions (an admin's: every tenant's, or `tenant`'s).
  absl::StatusOr<std::vector<ListedSession>> ListSessions(absl::string_view tenant = "");
  // Starts a KV-event stream; errors come from its first Next. The stream has no deadline.
  std::unique_ptr<EventWatch> WatchEvents(const WatchOptions& options);

  // Opens this client's session; `ttl` of zero asks for the daemon's default. Replaces a session
  // that was lost or fenced by a restart; ALREADY_EXISTS while a healthy one is open. Not
  // idempotent: each successful call makes a new session on the daemon.
  // `manifest` binds the session to the engine's compatibility manifest (DESIGN §3; the daemon
  // answers INVALID_ARGUMENT naming a bad field, and FAILED_PRECONDITION at each call on a pool
  // whose layout it contradicts); none: blocks are hashed as by sessions before manifests.
  absl::StatusOr<SessionInfo> OpenSession(
      std::string tenant, std::string client_name, absl::Duration ttl = absl::ZeroDuration(),
      const std::optional<ManifestFields>& manifest = std::nullopt);
  // Closes the session and releases its sequences; returns how many. Later session calls are
  // answered ABORTED by the daemon.
  absl::StatusOr<uint32_t> CloseSession();

  // Session calls. NOT_FOUND for an unknown pool or sequence, ABORTED once the session ended,
  // FAILED_PRECONDITION after a daemon restart, INVALID_ARGUMENT for malformed input,
  // RESOURCE_EXHAUSTED when the pool is short of blocks. Open/Extend/Release/Fork are not
  // idempotent; Commit is.
  // `max_load_ms` bounds loading the cached prefix from the pool's lower tiers (0: no bound);
  // what does not come up in time is left to compute.
  // `restore_parts`: the pool's parts the caller restores (DESIGN §13; empty: every part). The
  // hit ends at the greatest block endpoint where each of them restores; the blocks after it
  // are fresh. INVALID_ARGUMENT for a part the pool lacks.
  absl::StatusOr<Sequence> OpenSequence(absl::string_view pool, absl::Span<const uint32_t> tokens,
                                        absl::string_view cache_salt = "",
                                        const ExtraKeys& extra_keys = {}, uint32_t max_load_ms = 0,
                                        absl::Span<const std::string> restore_parts = {});
  absl::StatusOr<Extension> ExtendSequence(uint64_t sequence_id, absl::Span<const uint32_t> tokens);
  // REQUIRES: the KV of the first `num_written_tokens` tokens is written (and synchronized).
  // `part_masks`: empty (every block holds every part), or one per full block written from
  // block 0, the parts written (bit i: the pool's part i; each holds every all-pages part).
  absl::StatusOr<Commit> CommitSequence(uint64_t sequence_id, uint32_t num_written_tokens,
                                        absl::Span<const uint32_t> part_masks = {});
  absl::Status ReleaseSequence(uint64_t sequence_id);
  absl::StatusOr<Fork> ForkSequence(uint64_t sequence_id);

  // Block data for clients that do not map the pool (another node, no shared memory). Both need
  // an open session (FAILED_PRECONDITION locally otherwise) and fence on its epoch like the calls
  // above. The pool's layout is fetched once per pool and daemon epoch (DescribePool) and cached.
  // The stream's deadline is rpc_timeout plus 1 s per 64 MiB it moves.
  //
  // PutBlocks stores the KV of `tokens`' full blocks: `bytes` is every full block's bytes,
  // concatenated in order ((tokens.size() / block_size) * block_bytes; INVALID_ARGUMENT locally
  // otherwise), sent after a header with each block's XXH3-64 checksum in messages of at most
  // `chunk_bytes` (capped by max_message_bytes). The daemon publishes the blocks only once every
  // byte arrived and matched: a failed put stores nothing. Blocks already cached are kept as
  // they are. Idempotent. INVALID_ARGUMENT also for a put with no full block; DATA_LOSS if the
  // daemon saw a checksum mismatch; RESOURCE_EXHAUSTED when the pool is short of blocks.
  // With `first_block` > 0, `bytes` holds only blocks [first_block, full blocks): the daemon must
  // already hold the blocks before it cached (FAILED_PRECONDITION otherwise), as a receiver
  // that has a prefix is not sent it again.
  // `part_masks`: as CommitSequence's, one per full block of `tokens` from block 0 (also with
  // `first_block` > 0); empty: every part. INVALID_ARGUMENT from the daemon for a bad one.
  absl::StatusOr<PutResult> PutBlocks(absl::string_view pool, absl::Span<const uint32_t> tokens,
                                      absl::string_view bytes, absl::string_view cache_salt = "",
                                      const ExtraKeys& extra_keys = {},
                                      size_t chunk_bytes = size_t{1} << 20,
                                      uint32_t first_block = 0,
                                      absl::Span<const uint32_t> part_masks = {});
  // Same, with each block's bytes where they already are (a mapped pool's blocks, say): blocks[i]
  // is block options.first_block + i, block_bytes long (INVALID_ARGUMENT locally otherwise). The
  // bytes are handed to gRPC without a copy and must stay unchanged until the call returns.
  struct PutOptions {
    absl::string_view cache_salt;
    ExtraKeys extra_keys;
    size_t chunk_bytes = size_t{1} << 20;
    uint32_t first_block = 0;
    absl::Span<const uint32_t> part_masks;  // as above
    // Called after each data message is handed to gRPC, with the bytes sent so far (progress;
    // tests that interrupt a put halfway). An error cancels the put, which then stores nothing,
    // and PutBlocks returns that error.
    std::function<absl::Status(uint64_t bytes_sent)> after_chunk;
  };
  absl::StatusOr<PutResult> PutBlocks(absl::string_view pool, absl::Span<const uint32_t> tokens,
                                      absl::Span<const absl::string_view> blocks,
                                      const PutOptions& options);
  // GetBlocks returns the bytes of the longest cached full-block prefix of `tokens` (possibly
  // none), each block verified against the checksum the daemon computed (DATA_LOSS on a mismatch
  // or a stream that ends early). `max_chunk_bytes` of 0 takes the daemon's default chunk size.
  // Read-only; the blocks stay pinned on the daemon while they stream.
  // `restore_parts`: as OpenSequence's; the prefix ends where the hit rule ends it, and
  // part_masks tells each block's parts (empty for a pool without parts).
  absl::StatusOr<GetResult> GetBlocks(absl::string_view pool, absl::Span<const uint32_t> tokens,
                                      absl::string_view cache_salt = "",
                                      const ExtraKeys& extra_keys = {},
                                      uint32_t max_chunk_bytes = 0,
                                      absl::Span<const std::string> restore_parts = {});
  // Same, writing the bytes into `destination` instead (a staging buffer, a pool the caller
  // owns: no allocation, one copy from the received bytes). OUT_OF_RANGE, and the stream is
  // cancelled, when the daemon has more cached blocks than `destination` holds; its contents are
  // unspecified after an error. Gets of kStreamingCopyMinTotalBytes or more bypass the cache on
  // the way into `destination` (common/streaming_copy.h): the bytes are in memory, not in cache.
  absl::StatusOr<GetInfo> GetBlocksInto(absl::string_view pool, absl::Span<const uint32_t> tokens,
                                        absl::Span<char> destination,
                                        absl::string_view cache_salt = "",
                                        const ExtraKeys& extra_keys = {},
                                        uint32_t max_chunk_bytes = 0,
                                        absl::Span<const std::string> restore_parts = {});

  // Same, handing each piece of the stream to `visit` where gRPC received it: no copy and no
  // allocation by the client, for a consumer that moves the bytes on anyway (a staging copy into
  // device memory, a file). Pieces come in stream order; `piece` is valid only during the call.
  // A block's checksum is checked once its last piece was visited: on DATA_LOSS the consumer must
  // drop what it got of that block. An error from `visit` cancels the stream and is returned.
  using BlockVisitor =
      absl::FunctionRef<absl::Status(uint32_t block, uint64_t offset, absl::string_view piece)>;
  absl::StatusOr<GetInfo> GetBlocksVisit(absl::string_view pool, absl::Span<const uint32_t> tokens,
                                         BlockVisitor visit, absl::string_view cache_salt = "",
                                         const ExtraKeys& extra_keys = {},
                                         uint32_t max_chunk_bytes = 0,
                                         absl::Span<const std::string> restore_parts = {});

  // Rendezvous: small values peers exchange through the daemon before they can talk to each
  // other (an NCCL unique id, say). Keys (1 to 256 bytes) are scoped to the session's tenant;
  // values are at most 4 KiB. Both calls need an open session (FAILED_PRECONDITION locally
  // otherwise) and fence on its epoch like the session calls.
  //
  // PublishRendezvous stores `value` under `key` until this session ends (CloseSession, a lost
  // lease, a daemon restart). ALREADY_EXISTS when another session holds the key; this session
  // may overwrite its own value (idempotent). INVALID_ARGUMENT for an empty or oversize key or
  // value. Deadline: rpc_timeout.
  absl::Status PublishRendezvous(absl::string_view key, absl::string_view value);
  // AwaitRendezvous returns the key's value as soon as it has one (at once if it is already
  // published). The call's deadline is `timeout`, not rpc_timeout: DEADLINE_EXCEEDED when no
  // value arrives in time. INVALID_ARGUMENT for an empty or oversize key. Read-only.
  absl::StatusOr<std::string> AwaitRendezvous(absl::string_view key, absl::Duration timeout);

  // Pages named by the engine's own keys (DESIGN §13; the proto's page calls say what the daemon
  // does). `keys`: 1 to kMaxPagesPerCall keys of 1 to kMaxPageKeyBytes bytes each, in prefix
  // order; the client refuses any other batch locally with INVALID_ARGUMENT, as it does counts
  // that disagree (part masks neither none nor one per key, pages not one per key). Every call
  // needs an open session (FAILED_PRECONDITION locally otherwise), opened with a manifest whose
  // parts are the pool's (the daemon's FAILED_PRECONDITION otherwise), and fences on its epoch
  // like the session calls. Part masks: bit i is PoolInfo::parts[i]; none: every part.
  //
  // ExistsPages: how many leading keys the hit rule restores, over every tier. Read-only.
  absl::StatusOr<PagesFound> ExistsPages(absl::string_view pool, absl::Span<const std::string> keys,
                                         absl::Span<const std::string> parts = {});
  // Same node, write: a block per key not present (write its page into the mapped pool), then
  // CommitPages checksums and publishes them; ReleaseSequence abandons the reservation.
  absl::StatusOr<PageReservation> ReservePages(absl::string_view pool,
                                               absl::Span<const std::string> keys,
                                               absl::Span<const uint32_t> part_masks = {});
  // `page_checksums`: XXH3-64 of each reserved page written, in key order, computed while
  // copying it in (WritePages does); empty: the daemon computes them (on the device, in one
  // launch, for a device pool).
  absl::StatusOr<PagesStored> CommitPages(uint64_t sequence_id,
                                          absl::Span<const uint64_t> page_checksums = {});
  // Same node, read: pins the pages the hit rule gives (loaded up from the lower tiers) until
  // ReleaseSequence(sequence_id).
  absl::StatusOr<AcquiredPages> AcquirePages(absl::string_view pool,
                                             absl::Span<const std::string> keys,
                                             const PageReadOptions& options = {});
  // Another node: PutPages sends one whole page per key with its XXH3-64 checksum (bytes of
  // absent parts are ignored but still sent); the daemon checks every page before it publishes
  // any. GetPages returns the pages the hit rule gives, each verified against the daemon's
  // checksum (DATA_LOSS naming the page otherwise). Both are one message each way: a batch must
  // fit max_message_bytes (RESOURCE_EXHAUSTED from gRPC otherwise).
  absl::StatusOr<PagesStored> PutPages(absl::string_view pool, absl::Span<const std::string> keys,
                                       absl::Span<const absl::string_view> pages,
                                       absl::Span<const uint32_t> part_masks = {});
  absl::StatusOr<GotPages> GetPages(absl::string_view pool, absl::Span<const std::string> keys,
                                    const PageReadOptions& options = {});
  // Keeps the leading present pages resident for `ttl` (zero: touches them); returns how many.
  // `priority` (0 to 7): when the tenant's quota is tight, the tenant's pins of lower priority
  // are released to make room for this one (kvcache.proto PinPagesRequest).
  absl::StatusOr<uint32_t> PinPages(absl::string_view pool, absl::Span<const std::string> keys,
                                    absl::Duration ttl, uint32_t priority = 0);

  // Same node, through `mapped` (a mapping of the pool of the session's epoch:
  // FAILED_PRECONDITION locally for one of another epoch). WritePages reserves, copies each
  // fresh page's `pages[i]` (block_bytes each: INVALID_ARGUMENT locally otherwise) into its block
  // and commits; on any failure it releases the reservation, so nothing is published and nothing
  // held. ReadPagesInto acquires, checks each page's checksum over the mapped page while copying
  // it into `destinations[i]` (block_bytes each), and releases: DATA_LOSS naming the page on a
  // mismatch; destinations past the hit are untouched, and after an error their contents are
  // unspecified. After a read that succeeded the release is sent, not waited for, by a thread of
  // the client's: the bytes are copied and verified by then, and its round trip was a third of a
  // 128-page batch's calls. The pages stay pinned until the daemon takes it (AwaitReleases waits
  // for that; one that fails leaves them pinned until the session ends). After an error the
  // release is made before the call returns. On a host pool a batch of kParallelCopyBytes or more
  // is copied by the caller's thread and the client's page copy threads
  // (ClientOptions::page_copy_threads) together.
  //
  // Through a device mapping (CUDA IPC, MappedPool::is_device()), `pages` and `destinations` are
  // device memory on mapped.device() (or memory it reaches), 16-byte aligned (INVALID_ARGUMENT
  // locally otherwise): the engine's KV buffers. One kernel copies the batch and checksums each
  // page on the device (kernels/page_checksum.h), synchronized before the commit or release; the
  // sources must be complete before the call (the engine's stream synchronized). The pool's pages
  // must be a multiple of 64 bytes and at least 256 (FAILED_PRECONDITION locally otherwise:
  // PutPages and GetPages serve such a pool).
  absl::StatusOr<PagesStored> WritePages(const MappedPool& mapped,
                                         absl::Span<const std::string> keys,
                                         absl::Span<const absl::string_view> pages,
                                         absl::Span<const uint32_t> part_masks = {});
  absl::StatusOr<PagesRead> ReadPagesInto(const MappedPool& mapped,
                                          absl::Span<const std::string> keys,
                                          absl::Span<const absl::Span<char>> destinations,
                                          const PageReadOptions& options = {});
  // Returns once the daemon has answered every release ReadPagesInto sent before this call.
  void AwaitReleases();
  // Below this a host page batch is copied on the caller's thread alone (common/task_workers.h
  // says why; the daemon's large copies use the same threshold).
  static constexpr uint64_t kParallelCopyBytes = kSlicedCopyMinBytes;

  // True from a detected daemon restart until the next successful OpenSession.
  bool epoch_changed() const;
  // True from finding the lease ended without CloseSession (a keep-alive, or a session call,
  // answered ABORTED, NOT_FOUND or FAILED_PRECONDITION) until the next OpenSession.
  bool session_lost() const;
  // The open (or last) session's id and epoch; 0 before OpenSession.
  uint64_t session_id() const;
  uint64_t session_epoch() const;

 private:
  // Snapshot of the session fields a request carries.
  struct SessionRef {
    uint64_t session_id = 0;
    uint64_t epoch = 0;
  };

  // A unary method of the typed stub.
  template <typename Request, typename Response>
  using StubMethod = grpc::Status (v1::KvCache::StubInterface::*)(grpc::ClientContext*,
                                                                  const Request&, Response*);
  // Runs one unary call with a deadline and checks the reply's epoch against `session`'s (unless
  // that is 0). `session_call` marks requests that carried the session: their FAILED_PRECONDITION
  // means a restart and their ABORTED a lost lease.
  template <typename Request, typename Response>
  absl::Status Call(StubMethod<Request, Response> method, const char* name, const Request& request,
                    Response* response, const SessionRef& session, bool session_call);
  // Call for a request that carries the session: stamps `request` with `session` first.
  template <typename Request, typename Response>
  absl::Status SessionCall(StubMethod<Request, Response> method, const char* name,
                           const SessionRef& session, Request* request, Response* response);
  // A unary call served raw (PutPages, GetPages), for requests and replies whose bytes fields
  // should not be copied into or parsed out of messages: `request` builds the request, and may
  // lend bytes to gRPC through `stream`; `read_reply` takes the reply apart and returns its
  // epoch. Errors and the epoch fence as SessionCall's.
  absl::Status RawSessionCall(
      const char* method, const char* name, const SessionRef& session,
      absl::FunctionRef<grpc::ByteBuffer(BlockStream& stream)> request,
      absl::FunctionRef<absl::StatusOr<uint64_t>(const grpc::ByteBuffer& reply)> read_reply);
  // Sets the session id and epoch every session request carries.
  template <typename Request>
  static void StampSession(const SessionRef& session, Request* request) {
    request->set_session_id(session.session_id);
    request->set_epoch(session.epoch);
  }
  // Turns a finished call's status into the client's: on an error, notes a restart or a lost
  // lease as Call does; on success, fences on `reply_epoch`.
  absl::Status CheckReply(const char* name, const grpc::ClientContext& context,
                          const grpc::Status& grpc_status, uint64_t reply_epoch,
                          const SessionRef& session, bool session_call);
  // Readies every call's context: its deadline (now + `timeout`), wait_for_ready and the
  // authorization header.
  void PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const;
  // Adds the authorization header, if the client has a token.
  void AddCredentials(grpc::ClientContext* context) const;
  SessionRef CurrentSession() const;
  // The open session, or FAILED_PRECONDITION naming `call` when there is none.
  absl::StatusOr<SessionRef> RequireSession(const char* call) const;

  // What the data calls need of a pool's layout, cached per pool name and daemon epoch.
  struct BlockShape {
    uint64_t epoch = 0;
    uint32_t block_size = 0;
    uint64_t block_bytes = 0;
  };
  absl::StatusOr<BlockShape> PoolShape(absl::string_view pool, const SessionRef& session);
  // The GetBlocks stream: `on_header` learns how many bytes follow, in blocks of how many bytes,
  // `sink` takes them in order,
  // in `pieces` (kCacheSized for a sink that copies); with `targets`, the blocks it names are
  // copied there by the verifier instead (BlockStreamVerifier::FeedInto).
  absl::StatusOr<GetInfo> ReadBlocks(
      absl::string_view pool, absl::Span<const uint32_t> tokens, absl::string_view cache_salt,
      const ExtraKeys& extra_keys, uint32_t max_chunk_bytes,
      absl::Span<const std::string> restore_parts,
      absl::FunctionRef<absl::Status(uint64_t total, uint64_t block_bytes)> on_header,
      BlockStreamVerifier::Sink sink, BlockStreamVerifier::Pieces pieces,
      const BlockStreamVerifier::Targets* targets = nullptr);
  // The local checks of WritePages and ReadPagesInto (named `call` in errors): an open session,
  // `mapped` a host mapping of its epoch, and one page of block_bytes per key.
  absl::Status CheckMappedPages(const char* call, const MappedPool& mapped, size_t num_keys,
                                absl::Span<const size_t> page_sizes) const;
  // rpc_timeout, plus 1 s per 64 MiB.
  absl::Duration StreamTimeout(uint64_t bytes) const;
  // Latch epoch_changed_ / session_lost_ and run their callback the first time, unless `session`
  // is no longer the client's current one (a late reply about a replaced session).
  void NoteEpochChange(const SessionRef& session, uint64_t new_epoch);
  void NoteSessionLost(const SessionRef& session, const absl::Status& status);
  void KeepAliveLoop(SessionRef session, absl::Duration period);
  // REQUIRES: lifecycle_mu_ held (it owns keepalive_thread_).
  void StopKeepAlive() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lifecycle_mu_);

  // ReadPagesInto's releases, sent by a thread of their own with synchronous calls
  // (kv_cache_client_pages.cc). Not the callback API: once a channel has used it, its pollers
  // slowed every later synchronous call of the process by 15-20%.
  class PageReleases;

  // Constant after construction. The block data calls move raw bytes through generic_stub_
  // (client/block_stream.h), the other calls go through stub_. generic_stub_ is not const only
  // because PrepareCall is not; it changes nothing and is safe to call from any thread.
  const std::unique_ptr<v1::KvCache::Stub> stub_;
  grpc::GenericStub generic_stub_;
  const ClientOptions options_;
  // "Bearer <token>", or empty without a token. A secret: never in an error or a log.
  const std::string authorization_;

  // Serializes OpenSession, CloseSession and destruction. Lock order: lifecycle_mu_, then mu_.
  absl::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::thread keepalive_thread_ ABSL_GUARDED_BY(lifecycle_mu_);

  mutable absl::Mutex mu_;
  SessionRef session_ ABSL_GUARDED_BY(mu_);
  bool session_open_ ABSL_GUARDED_BY(mu_) = false;  // opened and not closed by the user
  bool epoch_changed_ ABSL_GUARDED_BY(mu_) = false;
  bool session_lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_keepalive_ ABSL_GUARDED_BY(mu_) = false;
  // The keep-alive call in flight, so StopKeepAlive can cancel it instead of waiting it out.
  grpc::ClientContext* keepalive_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::flat_hash_map<std::string, BlockShape> shapes_ ABSL_GUARDED_BY(mu_);

  // Emptied first (~KvCacheClient): it sends what is queued through stub_, then stops.
  std::unique_ptr<PageReleases> page_releases_;

  // Copies each of `copies` (pages of `page_bytes` in host memory) and sets checksums[i] to the
  // BlockChecksum of copy i, through RunOnPages.
  void CopyHostPages(absl::Span<const kernels::PageCopy> copies, uint64_t page_bytes,
                     CopyStores stores, absl::Span<uint64_t> checksums);
  // Runs run(begin, end) over the `count` pages (or blocks) of a call, `bytes` in all: on this
  // thread alone below kParallelCopyBytes, else a slice on it and one on each page copy thread.
  void RunOnPages(size_t count, uint64_t bytes,
                  absl::FunctionRef<void(size_t begin, size_t end)> run);
  // Called before a same-node batch's first round trip (reserve, acquire) when RunOnPages will
  // cut its `bytes` into slices: the page copy threads wake now and look for their slices for up
  // to kCopyThreadsReadyFor, so that they start copying as the answer arrives rather than a
  // wake-up later (on the VM: writes 8.4-8.5 -> 11.0 GB/s with threads that never sleep).
  void ReadyPageCopyThreads(uint64_t bytes);
  static constexpr absl::Duration kCopyThreadsReadyFor = absl::Milliseconds(1);
  // The threads that copy page batches with the caller (ClientOptions::page_copy_threads),
  // started by the first batch that wants them; null when there are none.
  TaskWorkers* PageCopyWorkers();
  absl::once_flag page_copy_workers_started_;
  std::unique_ptr<TaskWorkers> page_copy_workers_;  // set once, by PageCopyWorkers
};

// Here, not in kv_cache_client.cc: the page calls (kv_cache_client_pages.cc) make calls too.
template <typename Request, typename Response>
absl::Status KvCacheClient::Call(StubMethod<Request, Response> method, const char* name,
                                 const Request& request, Response* response,
                                 const SessionRef& session, bool session_call) {
  grpc::ClientContext context;
  PrepareContext(&context, options_.rpc_timeout);
  const grpc::Status status = ((*stub_).*method)(&context, request, response);
  return CheckReply(name, context, status, response->epoch(), session, session_call);
}

template <typename Request, typename Response>
absl::Status KvCacheClient::SessionCall(StubMethod<Request, Response> method, const char* name,
                                        const SessionRef& session, Request* request,
                                        Response* response) {
  StampSession(session, request);
  return Call(method, name, *request, response, session, true);
}

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_KV_CACHE_CLIENT_H_
