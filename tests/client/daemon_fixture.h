// A real kvcache daemon in this process, on a Unix socket in a temp dir, with a connected
// KvCacheClient: the fixture of the client tests that need a daemon's pools (shared memory,
// block streams). Pools: "default" (kDefaultBlocks), "tiny" (kTinyBlocks) and "large"
// (kLargeBlocks, room for a get past kStreamingCopyMinTotalBytes), all of DefaultPoolOptions'
// layout. Without an identity file (every caller is tenant "default") unless a test asks for a
// second tenant (with_other_tenant_). Leases run on the fixture's FakeClock (clock_): they end only
// when a test advances it. TearDown checks every pool's invariants.
#ifndef KVCACHE_TESTS_CLIENT_DAEMON_FIXTURE_H_
#define KVCACHE_TESTS_CLIENT_DAEMON_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "auth/identity_file.h"
#include "cache/pool_spec.h"
#include "client/kv_cache_client.h"
#include "server/daemon.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {

// After a daemon restart a call may still leave on the dead connection and fail UNAVAILABLE
// ("Broken pipe") before the channel notices; this retries such a call until it gets another
// answer (bounded by 10 s).
template <typename Call>
auto RetryWhileUnavailable(Call call) -> decltype(call()) {
  auto result = call();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (GetStatus(result).code() == absl::StatusCode::kUnavailable && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    result = call();
  }
  return result;
}

class DaemonFixture : public ::testing::Test {
 protected:
  static constexpr uint32_t kBlockSize = 16;  // DefaultPoolOptions' block size
  static constexpr uint32_t kDefaultBlocks = 64;
  static constexpr uint32_t kTinyBlocks = 4;
  static constexpr uint32_t kLargeBlocks = 160;  // 5 MiB of 32 KiB blocks

  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    address_ = "unix://" + dir_.File("kv.sock");
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
    client_ = Connect();
    ASSERT_NE(client_, nullptr);
  }

  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr) {
      for (Pool* pool : daemon_->manager().pools()) EXPECT_OK(pool->CheckInvariants());
      daemon_.reset();
    }
  }

  void StartDaemon() {
    DaemonOptions options;
    options.listen = address_;
    if (with_other_tenant_) {
      // The test's own uid stays tenant "default"; kOtherTenantToken is tenant "globex",
      // kAdminToken an admin (of tenant "ops").
      const auto digest = [](absl::string_view token) {
        std::string hex;
        for (uint8_t byte : Sha256Of(token))
          absl::StrAppend(&hex, absl::Hex(byte, absl::kZeroPad2));
        return hex;
      };
      options.identities_path = dir_.File("identities");
      std::ofstream(options.identities_path)
          << "uid " << getuid() << " default worker\n"
          << "token globex sha256:" << digest(kOtherTenantToken) << " globex worker\n"
          << "token ops sha256:" << digest(kAdminToken) << " ops admin\n";
    }
    PoolOptions pool = DefaultPoolOptions();
    pool.num_blocks = kDefaultBlocks;
    options.pools.push_back(pool);
    pool.name = "tiny";
    pool.num_blocks = kTinyBlocks;
    options.pools.push_back(pool);
    pool.name = "large";
    pool.num_blocks = kLargeBlocks;
    options.pools.push_back(pool);
    options.pools.insert(options.pools.end(), extra_pools_.begin(), extra_pools_.end());
    options.reaper_period = absl::Milliseconds(20);
    options.clock = &clock_;
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
    ASSERT_OK(daemon);
    daemon_ = *std::move(daemon);
  }

  std::unique_ptr<KvCacheClient> Connect(ClientOptions options = {}) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client =
        KvCacheClient::Connect(address_, std::move(options));
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  // A client of tenant "globex" (needs with_other_tenant_ set before SetUp).
  std::unique_ptr<KvCacheClient> ConnectAsOtherTenant() {
    ClientOptions options;
    options.bearer_token = kOtherTenantToken;
    return Connect(std::move(options));
  }

  // An admin of tenant "ops" (needs with_other_tenant_ set before SetUp).
  std::unique_ptr<KvCacheClient> ConnectAsAdmin() {
    ClientOptions options;
    options.bearer_token = kAdminToken;
    return Connect(std::move(options));
  }

  // The principal that opened a live session (to end it from the daemon's side).
  std::string OwnerOf(uint64_t session_id) {
    absl::StatusOr<std::shared_ptr<Session>> session =
        daemon_->manager().sessions().Get(session_id);
    return session.ok() ? (*session)->principal : std::string();
  }

  static std::vector<uint32_t> Tokens(size_t count, uint32_t first = 100) {
    std::vector<uint32_t> tokens(count);
    for (size_t i = 0; i < count; ++i) tokens[i] = first + static_cast<uint32_t>(i);
    return tokens;
  }

  // When set (in the test's constructor), the daemon runs with an identity file that adds a
  // second tenant, "globex", reached with kOtherTenantToken (ConnectAsOtherTenant).
  bool with_other_tenant_ = false;
  // Pools the daemon serves besides the three above (set in the test's constructor).
  std::vector<PoolOptions> extra_pools_;
  static constexpr char kOtherTenantToken[] = "globex-token-for-tests";
  static constexpr char kAdminToken[] = "ops-admin-token-for-tests";
  ScopedTempDir dir_{"kvcache_client_test"};  // the socket and the identity file
  std::string address_;
  FakeClock clock_;  // the daemon's: declared first, so it outlives the daemon
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<KvCacheClient> client_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_CLIENT_DAEMON_FIXTURE_H_
