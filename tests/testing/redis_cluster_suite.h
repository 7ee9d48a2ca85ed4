// A test suite with one Redis Cluster for all its tests (a start takes seconds): redis_ from
// SetUpTestSuite to TearDownTestSuite, its nodes' files in redis_dir_, which outlives it. Tests
// keep to keys of their own, or flush the nodes first. `Base` is ::testing::Test or a
// ::testing::TestWithParam; a suite with more to set up calls these first and last.
#ifndef KVCACHE_TESTS_TESTING_REDIS_CLUSTER_SUITE_H_
#define KVCACHE_TESTS_TESTING_REDIS_CLUSTER_SUITE_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/testing/redis_cluster_process.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {

template <typename Base = ::testing::Test>
class RedisClusterSuite : public Base {
 protected:
  static void SetUpTestSuite() { StartRedisCluster(); }
  static void TearDownTestSuite() { StopRedisCluster(); }

  // `masters` masters started with `redis_args` (redis-server flags) beside the cluster's own.
  static void StartRedisCluster(int masters = 3, const std::vector<std::string>& redis_args = {}) {
    redis_dir_ = new ScopedTempDir("kvcache-redis-cluster");
    absl::StatusOr<std::unique_ptr<RedisClusterProcess>> redis =
        RedisClusterProcess::Start(redis_dir_->path(), masters, redis_args);
    ASSERT_OK(redis);
    redis_ = redis->release();
  }
  static void StopRedisCluster() {
    delete redis_;
    redis_ = nullptr;
    delete redis_dir_;
    redis_dir_ = nullptr;
  }

  // Every test fails at once when the suite's cluster did not start.
  void SetUp() override { ASSERT_NE(redis_, nullptr) << "the suite's Redis Cluster did not start"; }

  static inline ScopedTempDir* redis_dir_ = nullptr;
  static inline RedisClusterProcess* redis_ = nullptr;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_REDIS_CLUSTER_SUITE_H_
