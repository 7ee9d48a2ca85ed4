// Helpers for worker tests: whole-file writes and reads, and a minimal safetensors writer (header
// text given verbatim, so tests can make broken files). Temporary directories:
// tests/testing/scoped_temp_dir.h.
// Thread-safety: not thread-safe; for single-threaded tests.
#ifndef KVCACHE_TESTS_TESTING_TEST_FILES_H_
#define KVCACHE_TESTS_TESTING_TEST_FILES_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/testing/scoped_temp_dir.h"

namespace kvcache::worker::testing {

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
