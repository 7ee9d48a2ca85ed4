// kvcache-manager: the KV-cache manager daemon. With no flags it serves one host-memory pool
// ("default") on a Unix socket; see --help.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "cache/pool_spec.h"
#include "common/byte_size.h"
#include "common/command_line.h"
#include "common/rpc/grpc_tuning.h"
#include "common/rpc/malloc_tuning.h"
#include "common/secret_file.h"
#include "common/status_macros.h"
#include "events/zmq_publisher.h"
#include "redis/redis_cluster.h"
#include "server/daemon.h"
#include "tiers/tier_keyring.h"

ABSL_FLAG(std::string, listen, "",
          "unix:///path/kv.sock or HOST:PORT (TCP needs --insecure); default: a Unix socket "
          "under $XDG_RUNTIME_DIR or /tmp/kvcache-$UID");
ABSL_FLAG(std::string, tcp_listen, "",
          "HOST:PORT served as well as a unix:// --listen address, under the same rules as a TCP "
          "--listen (TLS, or --insecure): one daemon for the pods on its node (the socket) and "
          "for clients elsewhere; default: none");
ABSL_FLAG(std::vector<std::string>, pool, {},
          "comma-separated pools, each NAME[:model=ID][:layers=N][:kv_heads=N][:head_dim=N]"
          "[:block_size=N][:dtype=fp16|bf16|fp32|fp8][:blocks=N|:bytes=SIZE][:hash=xxh3_128|sha256]"
          "[:host_tier=SIZE[:disk_tier=PATH:SIZE]] (host_tier: host memory below the pool for its "
          "evicted blocks, page-locked under a --device pool; disk_tier: a file on local disk "
          "below that, kept across "
          "restarts); "
          "default: one pool 'default' of 1024 blocks");
ABSL_FLAG(std::string, pools_file, "",
          "a JSON file of pools, for a ConfigMap: {\"pools\": [{\"name\": \"default\", \"model\": "
          "\"llama\", \"layers\": 32, \"bytes\": \"4GiB\", \"host_tier\": \"16GiB\"}, ...]}, "
          "each pool's fields those of --pool (docs/operations.md); its pools come after "
          "--pool's; default: none");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT of a plaintext TCP port that serves only grpc.health.v1.Health (for kubelet "
          "grpc probes, which reach neither a Unix socket nor TLS); default: none");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT: serve Prometheus /metrics over plain HTTP on its own port (e.g. "
          "0.0.0.0:8082); default: off");
ABSL_FLAG(absl::Duration, drain_period, absl::Seconds(1),
          "on SIGTERM/SIGINT, how long health reports NOT_SERVING and new sessions are refused "
          "(UNAVAILABLE) while the open ones are still served, so load balancers, kubelet and "
          "clients move new work elsewhere before the daemon stops");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "after the drain period, how long calls and streams in flight may take to finish "
          "before they are cancelled and the daemon exits (0)");
ABSL_FLAG(absl::Duration, session_ttl, absl::Seconds(10),
          "lease of a session that asks for no TTL of its own");
ABSL_FLAG(absl::Duration, max_session_ttl, absl::Minutes(10),
          "longest lease a session may ask for");
ABSL_FLAG(bool, insecure, false,
          "allow a TCP listen address without TLS (loopback and trusted networks only)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve TLS on the TCP address");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: require mutual TLS, clients present a certificate it signed");
ABSL_FLAG(std::string, identities, "",
          "identity file mapping uids, bearer tokens and certificate subjects to tenants, roles "
          "and quotas (see docs/security.md); reread on SIGHUP. Default: every caller is tenant "
          "'default', role worker");
ABSL_FLAG(std::string, socket_mode, "0600",
          "permissions of the Unix socket, octal; wider than 0600 needs --identities");
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "ZeroMQ endpoint of the KV-event PUB socket in vLLM's wire format, for llm-d and Dynamo "
          "(e.g. tcp://*:5557; binds when it has '*', '::', ipc:// or inproc://, else connects, "
          "as vLLM does); default: off");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "ZeroMQ ROUTER endpoint where subscribers that saw a gap ask for the buffered events "
          "(e.g. tcp://*:5558 or tcp://127.0.0.1:5558; always bound, as vLLM does); default: "
          "none");
ABSL_FLAG(std::string, kv_events_encoding, "array",
          "msgpack encoding of each ZeroMQ KV event: 'array' (vLLM's positional arrays, "
          "[\"BlockStored\", ...], what llm-d's decoder reads) or 'map' (current vLLM's tagged "
          "maps, {\"type\": \"BlockStored\", ...})");
ABSL_FLAG(std::string, kv_events_replay_layout, "topic_seq_payload",
          "frames of a ZeroMQ replay reply after the DEALER's empty frame: 'topic_seq_payload' "
          "(current vLLM) or 'seq_payload' (older vLLM, SGLang)");
ABSL_FLAG(std::string, kv_events_topic, "",
          "topic frame of every KV-event message; default kv@<hostname>@<model of the first "
          "pool>, llm-d's kv@<pod-id>@<model> (llm-d splits it on '@' into three parts, so "
          "neither part may contain '@')");
ABSL_FLAG(uint64_t, kv_events_buffer, 10000,
          "KV events kept for watchers (WatchEvents, the ZeroMQ replay socket) to resume from; "
          "one further behind gets a snapshot of the index");
ABSL_FLAG(uint32_t, max_streams_per_connection, 64,
          "long calls (PutBlocks, GetBlocks, WatchEvents, a waiting AwaitRendezvous) one "
          "connection may have open; more get RESOURCE_EXHAUSTED at once");
ABSL_FLAG(uint32_t, max_streams, 1024,
          "long calls the daemon serves at once over all connections; more get UNAVAILABLE at "
          "once");
ABSL_FLAG(std::string, max_put_bytes_per_connection, "4GiB",
          "SIZE of the puts one connection may have unfinished; beyond it a put gets "
          "RESOURCE_EXHAUSTED at once");
ABSL_FLAG(std::string, max_put_bytes, "16GiB",
          "SIZE of the puts the daemon takes unfinished over all connections; beyond it a put "
          "gets UNAVAILABLE at once");
ABSL_FLAG(int32_t, max_calls_per_connection, 256,
          "calls of any kind one connection may have open in the daemon (HTTP/2 "
          "MAX_CONCURRENT_STREAMS; a client's further calls wait in its own gRPC library); more "
          "than --max_streams_per_connection");
ABSL_FLAG(std::string, cluster_tier, "",
          "redis://HOST:PORT[,HOST:PORT...]: a Redis Cluster (or Valkey) shared by the nodes' "
          "daemons as every pool's cluster tier: blocks leaving the node are written there, "
          "and a prefix the node lacks is loaded from there, verified (docs/design.md §10); "
          "default: none. The daemon starts and serves with the cluster unreachable (it says "
          "how many masters and slots it reached), but not when Redis refuses its password");
ABSL_FLAG(std::string, cluster_tier_password_file, "",
          "file holding the cluster's AUTH password (first line; never logged). Refused unless "
          "owner-only (0600, 0400), or root's and readable by its group only (a Kubernetes "
          "Secret under fsGroup, 0440); default: no AUTH");
ABSL_FLAG(absl::Duration, cluster_tier_timeout, absl::Milliseconds(500),
          "how long the cluster tier waits for a Redis node's replies before it counts the node "
          "as failed and rests it for --cluster_tier_retry_after (a request's max_load_ms, when "
          "shorter, bounds its own loads; a node silent for all of it is rested too)");
ABSL_FLAG(absl::Duration, cluster_tier_retry_after, absl::Seconds(1),
          "how long a failed or hung Redis node is left alone (its keys are misses, its copies "
          "skipped) before one request probes it again");
ABSL_FLAG(std::string, tier_key_file, "",
          "file of master keys that seal what leaves the daemon's memory: every pool's disk tier "
          "records and cluster tier values, AES-256-GCM under a key per tenant derived with "
          "HKDF-SHA-256, never stored (docs/security.md). One key a line, ID:HEX (ID 1 to "
          "4294967295, HEX 64 hex digits: openssl rand -hex 32), newest first: the first seals "
          "new records, every one listed still opens its own (rotation: add a line on top, "
          "SIGHUP, remove the old one later). Refused unless owner-only (0600, 0400), or root's "
          "and readable by its group only (0440); reread on SIGHUP. Default: none, records below "
          "tier 2 are plaintext");
ABSL_FLAG(std::string, device, "host",
          "where pools live: host (POSIX shared memory) or cuda:N (GPU N, shared over CUDA IPC)");

namespace kvcache {
namespace {

// --socket_mode: an octal permission mode.
absl::StatusOr<mode_t> SocketModeFromFlag() {
  unsigned socket_mode = 0;
  if (std::sscanf(absl::GetFlag(FLAGS_socket_mode).c_str(), "%o", &socket_mode) != 1 ||
      socket_mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket_mode ", absl::GetFlag(FLAGS_socket_mode), " is not an octal mode"));
  }
  return static_cast<mode_t>(socket_mode);
}

// --max_put_bytes_per_connection and --max_put_bytes: byte sizes.
absl::Status PutByteLimitsFromFlags(CallLimitOptions* limits) {
  for (const auto& [flag, name, out] :
       {std::tuple{&FLAGS_max_put_bytes_per_connection, "max_put_bytes_per_connection",
                   &limits->max_put_bytes_per_connection},
        std::tuple{&FLAGS_max_put_bytes, "max_put_bytes", &limits->max_put_bytes}}) {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(absl::GetFlag(*flag));
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " ", absl::GetFlag(*flag), ": ", bytes.status().message()));
    }
    *out = *bytes;
  }
  return absl::OkStatus();
}

absl::Status KvEventsWireFromFlags(ZmqPublisherOptions* options) {
  const std::string encoding = absl::GetFlag(FLAGS_kv_events_encoding);
  if (encoding == "array") {
    options->encoding = VllmEventEncoding::kArray;
  } else if (encoding == "map") {
    options->encoding = VllmEventEncoding::kMap;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_events_encoding ", encoding, ": not 'array' or 'map'"));
  }
  const std::string layout = absl::GetFlag(FLAGS_kv_events_replay_layout);
  if (layout == "topic_seq_payload") {
    options->replay_layout = ZmqReplayLayout::kTopicSeqPayload;
  } else if (layout == "seq_payload") {
    options->replay_layout = ZmqReplayLayout::kSeqPayload;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--kv_events_replay_layout ", layout,
                                                   ": not 'topic_seq_payload' or 'seq_payload'"));
  }
  return absl::OkStatus();
}

// --pools_file's contents. INVALID_ARGUMENT naming the path and the system's reason.
absl::StatusOr<std::string> ReadPoolsFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::string contents;
  if (file) contents.assign(std::istreambuf_iterator<char>(file), {});
  if (!file && !file.eof()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pools_file ", path, ": ", std::strerror(errno)));
  }
  return contents;
}

// --pool: each spec parsed, then --pools_file's pools; the default pool when there is none.
absl::StatusOr<std::vector<PoolOptions>> PoolsFromFlags() {
  std::vector<PoolOptions> pools;
  for (const std::string& spec : absl::GetFlag(FLAGS_pool)) {
    absl::StatusOr<PoolOptions> pool = ParsePoolSpec(spec);
    if (!pool.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pool ", spec, ": ", pool.status().message()));
    }
    pools.push_back(*std::move(pool));
  }
  if (const std::string path = absl::GetFlag(FLAGS_pools_file); !path.empty()) {
    ASSIGN_OR_RETURN(const std::string json, ReadPoolsFile(path));
    absl::StatusOr<std::vector<PoolOptions>> from_file = ParsePoolsJson(json);
    if (!from_file.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pools_file ", path, ": ", from_file.status().message()));
    }
    for (PoolOptions& pool : *from_file) pools.push_back(std::move(pool));
  }
  if (pools.empty()) pools.push_back(DefaultPoolOptions());
  return pools;
}

// --cluster_tier "redis://HOST:PORT[,HOST:PORT...]" (the scheme optional on each), its password
// file, timeout and rest period.
absl::StatusOr<RedisClusterOptions> ClusterTierFromFlags() {
  RedisClusterOptions options;
  for (absl::string_view seed :
       absl::StrSplit(absl::GetFlag(FLAGS_cluster_tier), ',', absl::SkipEmpty())) {
    absl::ConsumePrefix(&seed, "redis://");
    options.seeds.emplace_back(seed);
  }
  if (options.seeds.empty())
    return absl::InvalidArgumentError("--cluster_tier: no HOST:PORT given");
  const std::string password_file = absl::GetFlag(FLAGS_cluster_tier_password_file);
  if (!password_file.empty()) {
    absl::StatusOr<std::string> contents = ReadSecretFile(password_file);
    if (!contents.ok()) {
      return absl::Status(contents.status().code(), absl::StrCat("--cluster_tier_password_file: ",
                                                                 contents.status().message()));
    }
    options.password = std::string(absl::StripTrailingAsciiWhitespace(
        absl::string_view(*contents).substr(0, contents->find('\n'))));
    if (options.password.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster_tier_password_file: ", password_file, " has no password on its first line"));
    }
  }
  // A refused password is an operator's mistake no retry mends: said once per node, on stderr.
  options.on_credentials_refused = [](const std::string& line) {
    std::fprintf(stderr, "kvcache-manager: cluster tier: %s; check --cluster_tier_password_file\n",
                 line.c_str());
    std::fflush(stderr);
  };
  options.io_timeout = absl::GetFlag(FLAGS_cluster_tier_timeout);
  options.retry_down_after = absl::GetFlag(FLAGS_cluster_tier_retry_after);
  if (options.io_timeout <= absl::ZeroDuration() ||
      options.retry_down_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--cluster_tier_timeout must be > 0 and --cluster_tier_retry_after >= 0");
  }
  return options;
}

// kv@<hostname>@<model of the first pool, or its name>.
std::string DefaultKvEventsTopic(const PoolOptions& first) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat("kv@", host, "@", first.model_id.empty() ? first.name : first.model_id);
}

// The daemon's options as the flags give them, and the tier keyring (--tier_key_file) they
// share, null without one. An error naming the flag at fault.
absl::StatusOr<DaemonOptions> OptionsFromFlags(std::shared_ptr<TierKeyring>* keyring) {
  DaemonOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  if (options.listen.empty()) options.listen = DefaultListenAddress();
  options.tcp_listen = absl::GetFlag(FLAGS_tcp_listen);
  options.allow_insecure_tcp = absl::GetFlag(FLAGS_insecure);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.tls = TlsServerOptions{.cert_file = absl::GetFlag(FLAGS_tls_cert),
                                 .key_file = absl::GetFlag(FLAGS_tls_key),
                                 .client_ca_file = absl::GetFlag(FLAGS_tls_client_ca)};
  options.identities_path = absl::GetFlag(FLAGS_identities);
  ASSIGN_OR_RETURN(options.socket_mode, SocketModeFromFlag());
  options.device = absl::GetFlag(FLAGS_device);
  options.kv_events_buffer = absl::GetFlag(FLAGS_kv_events_buffer);
  options.kv_events.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  options.kv_events.replay_endpoint = absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  options.kv_events.topic = absl::GetFlag(FLAGS_kv_events_topic);
  RETURN_IF_ERROR(KvEventsWireFromFlags(&options.kv_events));
  options.session_limits.default_ttl = absl::GetFlag(FLAGS_session_ttl);
  options.session_limits.max_ttl = absl::GetFlag(FLAGS_max_session_ttl);
  options.session_limits.min_ttl =
      std::min(options.session_limits.min_ttl, options.session_limits.default_ttl);
  options.call_limits.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  options.call_limits.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.max_calls_per_connection = absl::GetFlag(FLAGS_max_calls_per_connection);
  RETURN_IF_ERROR(PutByteLimitsFromFlags(&options.call_limits));
  ASSIGN_OR_RETURN(options.pools, PoolsFromFlags());
  if (!absl::GetFlag(FLAGS_cluster_tier).empty()) {
    ASSIGN_OR_RETURN(const RedisClusterOptions cluster, ClusterTierFromFlags());
    for (PoolOptions& pool : options.pools) pool.cluster_tier = cluster;
  }
  if (!absl::GetFlag(FLAGS_tier_key_file).empty()) {
    // Missing, unreadable, open to others or malformed: the daemon does not start.
    ASSIGN_OR_RETURN(*keyring, TierKeyring::Load(absl::GetFlag(FLAGS_tier_key_file)));
    for (PoolOptions& pool : options.pools) pool.tier_keyring = *keyring;
  }
  // One set of workers for every pool (PoolOptions::workers).
  const auto workers = std::make_shared<TaskWorkers>(TaskWorkers::DefaultThreads());
  for (PoolOptions& pool : options.pools) pool.workers = workers;
  if (options.kv_events.topic.empty()) {
    options.kv_events.topic = DefaultKvEventsTopic(options.pools.front());
  }
  return options;
}

// Blocks the stop signals (and SIGHUP, which reloads the identity and tier key files) and returns
// them. Called before any server thread exists, so that only ServeUntilStopSignal's sigwait sees
// them.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);  // reloads the identity and tier key files
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// One pool's lines of the startup report, with its tiers'.
void PrintPool(Pool& pool) {
  const PoolOptions& pool_options = pool.options();
  std::printf("  pool '%s' model=%s %s blocks=%u block_bytes=%llu hash=%s memory=%s\n",
              pool_options.name.c_str(), pool_options.model_id.c_str(),
              pool_options.layout.DebugString().c_str(), pool_options.num_blocks,
              static_cast<unsigned long long>(pool_options.layout.BlockBytes()),
              std::string(HashAlgorithmName(pool_options.hash_algorithm)).c_str(),
              pool.memory().kind().c_str());
  const PoolMemory::Setup setup = pool.memory().setup();
  const MappingInfo mapping = pool.memory().mapping();
  if (mapping.kind == MappingInfo::Kind::kShm) {
    std::printf("  pool '%s': %llu MiB pre-faulted in %.0f ms, shared memory %s%s\n",
                pool_options.name.c_str(),
                static_cast<unsigned long long>(mapping.size_bytes >> 20),
                absl::ToDoubleMilliseconds(setup.prefault_time), mapping.shm_name.c_str(),
                setup.reclaimed_stale ? " (reclaimed from a daemon that died)" : "");
  }
  if (pool_options.host_tier_bytes != 0) {
    std::printf("    host tier: %u blocks (%llu bytes%s), offload window %u blocks\n",
                pool.host_tier()->num_slots(),
                static_cast<unsigned long long>(pool_options.host_tier_bytes),
                pool.memory().HostBlock(0) == nullptr ? ", page-locked" : "",
                pool.offload_window());
  }
  if (DiskTier* disk = pool.disk_tier()) {
    const DiskTierStats stats = disk->stats();
    std::printf(
        "    disk tier: %s, %llu slots of %llu bytes%s, %s; found %llu records (%llu slots "
        "skipped) in %.1f ms\n",
        pool_options.disk_tier_path.c_str(), static_cast<unsigned long long>(stats.slots),
        static_cast<unsigned long long>(stats.slot_bytes),
        disk->direct_io() ? ", O_DIRECT" : ", buffered (no O_DIRECT here)",
        disk->io_backend() == IoBackend::kIoUring
            ? "io_uring"
            : "system calls (the kernel refused io_uring: seccomp or io_uring_disabled)",
        static_cast<unsigned long long>(stats.restart_records),
        static_cast<unsigned long long>(stats.restart_torn + stats.restart_foreign +
                                        stats.restart_old_format + stats.restart_duplicates),
        absl::ToDoubleMilliseconds(stats.restart_scan_time));
    // Said once, here: what the file holds that this daemon does not serve, and why.
    if (stats.restart_unopened > 0) {
      std::printf(
          "    WARNING: disk tier: %llu sealed records do not open with --tier_key_file's keys "
          "(sealed with another master key or one the file no longer lists, another pool's, or "
          "changed): none is served, their slots are reused\n",
          static_cast<unsigned long long>(stats.restart_unopened));
    }
    if (stats.restart_other_sealing > 0) {
      std::printf(disk->sealed() ? "    WARNING: disk tier: %llu records written unsealed (without "
                                   "--tier_key_file) are not read as sealed: none is served\n"
                                 : "    WARNING: disk tier: %llu sealed records (written with "
                                   "--tier_key_file) are not read without it: none is served\n",
                  static_cast<unsigned long long>(stats.restart_other_sealing));
    }
  }
}

// Which tiers seal what leaves the daemon's memory (with a key file every pool's disk and cluster
// tiers do), or that none does.
void PrintSealing(Daemon& daemon, const TierKeyring* keyring) {
  std::vector<std::string> tiers;
  for (Pool* pool : daemon.manager().pools()) {
    const std::string& name = pool->options().name;
    if (pool->disk_tier() != nullptr) {
      tiers.push_back(absl::StrCat("disk tier of pool '", name, "'"));
    }
    if (pool->lower_tiers().has_cluster()) {
      tiers.push_back(absl::StrCat("cluster tier of pool '", name, "'"));
    }
  }
  if (keyring != nullptr) {
    const std::vector<uint32_t> ids = keyring->key_ids();
    std::printf(
        "  sealed (AES-256-GCM, a key per tenant): %s; key file %s, sealing with key %u (%zu "
        "key%s)\n",
        tiers.empty() ? "nothing (no disk or cluster tier)" : absl::StrJoin(tiers, ", ").c_str(),
        keyring->path().c_str(), ids.front(), ids.size(), ids.size() == 1 ? "" : "s");
  } else if (!tiers.empty()) {
    std::printf("  unsealed: %s hold plaintext KV and tokens (--tier_key_file seals them)\n",
                absl::StrJoin(tiers, ", ").c_str());
  }
}

// How much of the cluster tier's Redis Cluster answers at start (a client of its own, closed
// after). An error, which stops the start, when nodes answered but every one refused the
// password: a wrong password, unlike an outage, does not mend itself.
absl::StatusOr<RedisCluster::Reach> CheckClusterTier(RedisClusterOptions options) {
  options.on_credentials_refused = nullptr;  // the error says it
  ASSIGN_OR_RETURN(std::unique_ptr<RedisCluster> cluster, RedisCluster::Create(options));
  RedisCluster::Reach reach = cluster->CheckReach();
  if (reach.credentials_refused > 0 && reach.masters_reached == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--cluster_tier: Redis refused the credentials (",
                     absl::StrJoin(reach.problems, "; "), "); check --cluster_tier_password_file"));
  }
  return reach;
}

// The cluster tier's start-up line: masters reached and slots covered, a warning when short.
void PrintClusterReach(const RedisCluster::Reach& reach) {
  const std::string problems =
      reach.problems.empty() ? "" : absl::StrCat(" (", absl::StrJoin(reach.problems, "; "), ")");
  if (reach.masters == 0) {
    std::printf(
        "  WARNING: cluster tier: no Redis node gave a slot map%s; serving without it, every "
        "block a miss, until one answers\n",
        problems.c_str());
  } else if (reach.masters_reached < reach.masters || reach.slots_covered < kRedisClusterSlots) {
    std::printf(
        "  WARNING: cluster tier: %d of %d masters reached, %d of %d slots covered%s; the other "
        "slots' blocks are misses until their masters answer\n",
        reach.masters_reached, reach.masters, reach.slots_covered, kRedisClusterSlots,
        problems.c_str());
  } else {
    std::printf("  cluster tier: %d of %d masters reached, %d of %d slots covered\n",
                reach.masters_reached, reach.masters, reach.slots_covered, kRedisClusterSlots);
  }
}

// What the daemon serves, where: its addresses, event sockets, pools, sealing and warnings.
void PrintStartup(Daemon& daemon, const DaemonOptions& options,
                  const std::optional<RedisCluster::Reach>& cluster_reach,
                  const TierKeyring* keyring) {
  std::printf("kvcache-manager: listening on %s, epoch %llu\n", daemon.address().c_str(),
              static_cast<unsigned long long>(daemon.manager().epoch()));
  if (!daemon.tcp_address().empty()) {
    std::printf("  also on TCP %s\n", daemon.tcp_address().c_str());
  }
  if (!options.kv_events.endpoint.empty()) {
    // vLLM's rule decides from the endpoint's spelling; say which, since a subscriber that binds
    // too (or a router expecting to be dialled) waits in silence otherwise.
    std::printf("  kv events: PUB %s %s, replay %s, topic %s, encoding %s, replay layout %s\n",
                ZmqEventPublisher::Binds(options.kv_events.endpoint) ? "bound at" : "connecting to",
                options.kv_events.endpoint.c_str(),
                options.kv_events.replay_endpoint.empty()
                    ? "off"
                    : options.kv_events.replay_endpoint.c_str(),
                options.kv_events.topic.c_str(), absl::GetFlag(FLAGS_kv_events_encoding).c_str(),
                absl::GetFlag(FLAGS_kv_events_replay_layout).c_str());
  }
  if (!daemon.metrics_address().empty()) {
    std::printf("  metrics on http://%s/metrics\n", daemon.metrics_address().c_str());
  }
  if (!daemon.health_address().empty()) {
    std::printf("  health on %s (grpc.health.v1 only, plaintext)\n",
                daemon.health_address().c_str());
  }
  for (Pool* pool : daemon.manager().pools()) PrintPool(*pool);
  if (cluster_reach.has_value()) PrintClusterReach(*cluster_reach);
  PrintSealing(daemon, keyring);
  if (options.identities_path.empty()) {
    std::printf("  no --identities: every caller is tenant 'default', role worker\n");
  }
  if (!daemon.plaintext_tcp_address().empty()) {
    std::printf(
        "  WARNING: plaintext TCP (--insecure): anyone who reaches %s can read and write "
        "this cache's prompts' KV\n",
        daemon.plaintext_tcp_address().c_str());
  }
  std::fflush(stdout);
}

// Reloads the identity file and the tier key file (`keyring`, when there is one) on each SIGHUP
// until SIGTERM or SIGINT, which it returns.
int ServeUntilStopSignal(Daemon& daemon, const sigset_t& stop_signals,
                         const std::string& identities_path, TierKeyring* keyring) {
  int signal_number = 0;
  while (sigwait(&stop_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    const absl::Status reloaded = daemon.ReloadIdentities();
    if (reloaded.ok()) {
      std::printf("kvcache-manager: reloaded %s\n", identities_path.c_str());
    } else {
      std::printf("kvcache-manager: SIGHUP: %s; the previous identities stay\n",
                  std::string(reloaded.message()).c_str());
    }
    if (keyring != nullptr) {
      const absl::Status keys = keyring->Reload();
      if (keys.ok()) {
        const std::vector<uint32_t> ids = keyring->key_ids();
        std::printf("kvcache-manager: reloaded %s: sealing with key %u (%zu key%s)\n",
                    keyring->path().c_str(), ids.front(), ids.size(), ids.size() == 1 ? "" : "s");
      } else {
        std::printf("kvcache-manager: SIGHUP: %s; the previous tier keys stay\n",
                    std::string(keys.message()).c_str());
      }
    }
    std::fflush(stdout);
  }
  return signal_number;
}

// Refuses new sessions for --drain_period while the open ones are served, then gives the calls in
// flight --drain_timeout to finish and stops the daemon.
void DrainAndShutDown(Daemon& daemon, int signal_number) {
  const absl::Duration drain = absl::GetFlag(FLAGS_drain_period);
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  // Draining before saying so: whoever reads the line (an operator, a test) must find new
  // sessions refused already.
  daemon.Drain();
  std::printf("kvcache-manager: signal %d, draining for %s\n", signal_number,
              absl::FormatDuration(drain).c_str());
  std::fflush(stdout);
  absl::SleepFor(drain);
  std::printf("kvcache-manager: shutting down; calls in flight have %s to finish\n",
              absl::FormatDuration(drain_timeout).c_str());
  std::fflush(stdout);
  daemon.Shutdown(drain_timeout);
  std::printf("kvcache-manager: stopped\n");
  std::fflush(stdout);
}

// The daemon's exit code: 0, or 3 if a pool's bookkeeping is no longer whole. Every pool's must
// still be (free + evictable + referenced = capacity, no block both free and referenced, every
// hash one block and back, every reference held by a sequence of its tenant): a daemon that ends
// otherwise says so and exits 3, so that every test that stops one (and an operator's restart)
// notices corruption nothing else shows.
int CheckPoolsWhole(Daemon& daemon) {
  int exit_code = 0;
  for (const Pool* pool : daemon.manager().pools()) {
    const absl::Status whole = pool->CheckInvariants();
    if (!whole.ok()) {
      std::fprintf(stderr, "kvcache-manager: pool %s: invariant broken: %s\n",
                   pool->options().name.c_str(), std::string(whole.message()).c_str());
      exit_code = 3;
    }
  }
  return exit_code;
}

int Run() {
  // Before the options make the pools' workers: a thread started earlier would not block them,
  // and a stop signal the kernel handed to it would end the daemon undrained.
  const sigset_t stop_signals = BlockStopSignals();
  std::shared_ptr<TierKeyring> keyring;
  const absl::StatusOr<DaemonOptions> options = OptionsFromFlags(&keyring);
  if (!options.ok()) {
    std::fprintf(stderr, "kvcache-manager: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  // A peer that closed its end of a socket (a Redis node restarting under the cluster tier) must
  // fail that write with EPIPE, never end the daemon.
  ::signal(SIGPIPE, SIG_IGN);

  std::optional<RedisCluster::Reach> cluster_reach;
  if (const std::optional<RedisClusterOptions>& cluster = options->pools.front().cluster_tier) {
    absl::StatusOr<RedisCluster::Reach> reach = CheckClusterTier(*cluster);
    if (!reach.ok()) {
      std::fprintf(stderr, "kvcache-manager: %s\n", std::string(reach.status().message()).c_str());
      return 1;
    }
    cluster_reach = *std::move(reach);
  }
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(*options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvcache-manager: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  PrintStartup(**daemon, *options, cluster_reach, keyring.get());
  const int signal_number =
      ServeUntilStopSignal(**daemon, stop_signals, options->identities_path, keyring.get());
  DrainAndShutDown(**daemon, signal_number);
  return CheckPoolsWhole(**daemon);
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  kvcache::TuneGrpcForBlockStreams();
  kvcache::ParseCommandLineFlags(argc, argv,
                                 "KV-cache manager daemon: block pools, prefix index, gRPC API v1");
  // Debian's abseil checks every Mutex acquisition for lock-order cycles, through a global graph
  // (1.7% of the daemon's CPU in rpc_bench). The tests keep the check; the daemon drops it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  kvcache::TuneMallocForBlockStreams();
  return kvcache::Run();
}
