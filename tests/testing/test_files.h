// Helpers for worker tests: a fresh temporary directory per test, whole-file writes and reads,
// and a minimal safetensors writer (header text given verbatim, so tests can make broken files).
// Thread-safety: not thread-safe; for single-threaded tests.
#ifndef KVCACHE_TESTS_TESTING_TEST_FILES_H_
#define KVCACHE_TESTS_TESTING_TEST_FILES_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace kvcache::worker::testing {

// A new empty directory under the test temp dir, removed when the object dies.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string pattern = ::testing::TempDir() + "kvcache_worker_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed for " << pattern;
    path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The 8-byte little-endian length of `header`, `header`, then `data`.
inline std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  std::string bytes;
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return bytes + header + data;
}

}  // namespace kvcache::worker::testing

#endif  // KVCACHE_TESTS_TESTING_TEST_FILES_H_
