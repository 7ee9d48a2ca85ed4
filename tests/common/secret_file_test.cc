// The owner-only rule of files holding a secret: the owner's own file with no group or world
// bits, or root's readable by its group (a Secret's files under a pod's fsGroup); nothing else.
#include "common/secret_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uid_t kDaemon = 65532;

TEST(CheckSecretFileAccessTest, TheReadersOwnFileMustBeOwnerOnly) {
  EXPECT_OK(CheckSecretFileAccess("pw", 0600, kDaemon, kDaemon));
  EXPECT_OK(CheckSecretFileAccess("pw", 0400, kDaemon, kDaemon));
  for (const mode_t open_to_others : {0640, 0604, 0644, 0660, 0610, 0601}) {
    EXPECT_THAT(CheckSecretFileAccess("pw", open_to_others, kDaemon, kDaemon),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("pw is open to others"), HasSubstr("chmod 600"))))
        << std::oct << open_to_others;
  }
  // Root reading root's file is held to the same rule.
  EXPECT_THAT(CheckSecretFileAccess("pw", 0640, 0, 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("mode 0640")));
}

TEST(CheckSecretFileAccessTest, RootsFileMayBeReadableByItsGroupOnly) {
  EXPECT_OK(CheckSecretFileAccess("pw", 0440, 0, kDaemon));  // kubelet's Secret under fsGroup
  EXPECT_OK(CheckSecretFileAccess("pw", 0640, 0, kDaemon));
  EXPECT_THAT(CheckSecretFileAccess("pw", 0444, 0, kDaemon),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("mode 0444")));
  EXPECT_THAT(CheckSecretFileAccess("pw", 0460, 0, kDaemon),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("readable by its group")));
}

TEST(CheckSecretFileAccessTest, AnotherUsersFileIsRefused) {
  EXPECT_THAT(CheckSecretFileAccess("pw", 0400, 1000, kDaemon),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("belongs to uid 1000")));
}

TEST(ReadSecretFileTest, ReadsAnOwnerOnlyFileAndRefusesAWorldReadableOne) {
  ScopedTempDir dir("kvcache-secret");
  const std::string path = dir.File("password");
  std::ofstream(path) << "s3cret-value\n";
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  absl::StatusOr<std::string> read = ReadSecretFile(path);
  ASSERT_OK(read);
  EXPECT_EQ(*read, "s3cret-value\n");
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(ReadSecretFile(path),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path + " is open to others (mode 0644)"),
                             Not(HasSubstr("s3cret-value")))));
  // Through a symlink (a Secret's key is one): the file it names is checked.
  const std::string link = dir.File("link");
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_THAT(ReadSecretFile(link), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_EQ(chmod(path.c_str(), 0400), 0);
  EXPECT_OK(ReadSecretFile(link));
}

TEST(ReadSecretFileTest, AMissingFileOrADirectoryIsRefused) {
  ScopedTempDir dir("kvcache-secret");
  EXPECT_THAT(ReadSecretFile(dir.File("absent")), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ReadSecretFile(dir.path()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a regular file")));
}

}  // namespace
}  // namespace kvcache
