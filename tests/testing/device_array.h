// Test helpers for CUDA kernels (include only from CUDA-built tests): a typed device array and
// the float comparison the GPU tests use against their CPU references.
// Thread-safety: not thread-safe; for single-threaded tests.
#ifndef KVCACHE_TESTS_TESTING_DEVICE_ARRAY_H_
#define KVCACHE_TESTS_TESTING_DEVICE_ARRAY_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace kvcache::testing {

// A typed device allocation; copies are synchronous (cudaMemcpy waits for the work enqueued on
// blocking streams before it, which is all the tests use).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (cudaMalloc(&ptr_, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  void Upload(const std::vector<T>& host) {
    ASSERT_NE(ptr_, nullptr);
    ASSERT_EQ(host.size(), count_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t count_;
};

// Every element within rtol * (|want| + max |want|): relative to the value and to the array's
// magnitude, so outputs that cancel to near zero are not held to a relative bound no summation
// order could meet. NaN must match NaN. Reports the first five differences.
inline void ExpectAllNear(const std::vector<float>& got, const std::vector<float>& want, float rtol,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float magnitude = 0;
  for (float w : want) {
    if (std::isfinite(w)) magnitude = std::max(magnitude, std::fabs(w));
  }
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      if (!std::isnan(got[i]) && ++bad <= 5) {
        ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want NaN";
      }
      continue;
    }
    const float tol = rtol * (std::fabs(want[i]) + magnitude);
    if (!(std::fabs(got[i] - want[i]) <= tol) && ++bad <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", want " << want[i]
                    << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_DEVICE_ARRAY_H_
