// The pool spec's parts and the hit rule (common/page_parts.h) on hand-built cases.
#include "common/page_parts.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

TEST(PagePartsTest, ParsesNamesSizesPoliciesAndOffsets) {
  absl::StatusOr<std::vector<PagePartLayout>> parts =
      ParsePageParts("kv/12K+swa/2K/trailing4+state/2K/trailing1", 16384);
  ASSERT_OK(parts);
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[0], (PagePartLayout{.name = "kv", .offset = 0, .bytes = 12288}));
  EXPECT_EQ((*parts)[1], (PagePartLayout{.name = "swa",
                                         .offset = 12288,
                                         .bytes = 2048,
                                         .policy = PartHitPolicy::kTrailingPages,
                                         .trailing_pages = 4}));
  EXPECT_EQ((*parts)[2].offset, 14336u);
  EXPECT_EQ((*parts)[2].trailing_pages, 1u);
}

TEST(PagePartsTest, BadPartsAreInvalidArgumentNamingWhat) {
  const struct {
    const char* spec;
    const char* message;
  } cases[] = {
      {"kv/8K", "parts sum to 8192 bytes but a page (block) has 16384"},
      {"kv/8K+kv/8K", "part 'kv' is named twice"},
      {"kv", "is not NAME/SIZE[/trailingN]"},
      {"k v/16K", "part name 'k v'"},
      {"kv/0+x/16K", "needs a size of at least 1 byte"},
      {"kv/8K+s/8K/trailing0", "want all or trailingN with N >= 1"},
      {"kv/8K+s/8K/last", "has policy 'last'"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParsePageParts(c.spec, 16384),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.spec;
  }
  std::string seventeen;
  for (int i = 0; i < 17; ++i) absl::StrAppend(&seventeen, i ? "+" : "", "p", i, "/1");
  EXPECT_THAT(ParsePageParts(seventeen, 17),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than 16 parts")));
}

// kv on every page, swa on the last two, state on the last one.
const std::vector<PagePartLayout>& Hybrid() {
  static const auto* parts =
      new std::vector<PagePartLayout>(*ParsePageParts("kv/4+swa/2/trailing2+state/2/trailing1", 8));
  return *parts;
}
constexpr uint32_t kKv = 1, kSwa = 2, kState = 4, kAll = 7;

TEST(PagePartsTest, TheEndpointIsTheGreatestEveryPartCanRestore) {
  const std::vector<PagePartLayout>& parts = Hybrid();
  // Full pages everywhere: all of them.
  EXPECT_EQ(RestorablePages(parts, kAll, {kAll, kAll, kAll}), 3u);
  // The state only at page 1: the endpoint is 2 (swa on pages 0-1, state on 1).
  EXPECT_EQ(RestorablePages(parts, kAll, {kKv | kSwa, kAll, kKv | kSwa}), 2u);
  // Per part, kv reaches 3, swa 3 and state 2; yet no endpoint but 0 restores them all: 2 needs
  // swa on page 0 too, 3 the state on page 2, 1 the state on page 0.
  EXPECT_EQ(RestorablePages(parts, kAll, {kKv, kAll, kKv | kSwa}), 0u);
  // swa missing at page 0 only matters for endpoints 1 and 2.
  EXPECT_EQ(RestorablePages(parts, kAll, {kKv, kKv | kSwa, kAll}), 3u);
  // kv missing ends every hit there, whatever the trailing parts hold after.
  EXPECT_EQ(RestorablePages(parts, kAll, {kAll, kSwa | kState, kAll}), 1u);
  // Nothing restorable: 0.
  EXPECT_EQ(RestorablePages(parts, kAll, {kKv, kKv}), 0u);
  EXPECT_EQ(RestorablePages(parts, kAll, {}), 0u);
  // Only kv asked: the leading pages with kv.
  EXPECT_EQ(RestorablePages(parts, kKv, {kKv, kKv, kSwa}), 2u);
  // Nothing asked: the leading pages present.
  EXPECT_EQ(RestorablePages(parts, 0, {kSwa, kKv, kState}), 3u);
}

TEST(PagePartsTest, PartMasksByName) {
  EXPECT_EQ(*PartMaskOf(Hybrid(), {}), kAll);
  EXPECT_EQ(*PartMaskOf(Hybrid(), std::vector<std::string>{"state", "kv"}), kKv | kState);
  EXPECT_THAT(PartMaskOf(Hybrid(), std::vector<std::string>{"indexer"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown part 'indexer'; the pool has kv, swa, state")));
  EXPECT_EQ(SinglePagePart(32768)[0], (PagePartLayout{.name = "kv", .bytes = 32768}));
}

}  // namespace
}  // namespace kvcache
