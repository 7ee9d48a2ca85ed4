// ScopedTempDir: a fresh empty directory for one test (or one fixture, or one suite), removed
// with everything in it when the object dies. Declare it before whatever uses the directory
// (a daemon's socket, a tier's file), so that it outlives them.
// Thread-safety: thread-compatible.
#ifndef KVCACHE_TESTS_TESTING_SCOPED_TEMP_DIR_H_
#define KVCACHE_TESTS_TESTING_SCOPED_TEMP_DIR_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace kvcache::testing {

class ScopedTempDir {
 public:
  // Made in `parent` (by default the test temp dir, gtest's TempDir(): $TEST_TMPDIR or /tmp/),
  // named `name`_XXXXXX; the test fails if it cannot be made.
  explicit ScopedTempDir(const std::string& name = "kvcache",
                         std::string parent = ::testing::TempDir()) {
    if (!parent.empty() && parent.back() != '/') parent += '/';
    std::string pattern = parent + name + "_XXXXXX";
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
  // path()/name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_SCOPED_TEMP_DIR_H_
