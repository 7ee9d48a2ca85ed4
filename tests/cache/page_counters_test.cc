// PageCounters: counts per tenant and manifest label, and the cap that keeps the labels few.
#include "cache/page_counters.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

std::string Digest(int n) {
  return absl::StrCat(absl::Hex(n, absl::kZeroPad16), "0123456789abcdef");
}

TEST(PageCountersTest, CountsByTenantAndManifestPrefix) {
  PageCounters counters;
  counters.Count("b", Digest(1), PageOp::kHit, 3);
  counters.Count("a", Digest(2), PageOp::kPublished, 2);
  counters.Count("a", Digest(2), PageOp::kPublished, 1);
  counters.Count("a", Digest(2), PageOp::kMiss, 4);
  const std::vector<PageCounters::Row> rows = counters.Rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].tenant, "a");
  EXPECT_EQ(rows[0].manifest, "0000000000000002");
  EXPECT_EQ(rows[0].pages[static_cast<size_t>(PageOp::kPublished)], 3u);
  EXPECT_EQ(rows[0].pages[static_cast<size_t>(PageOp::kMiss)], 4u);
  EXPECT_EQ(rows[0].pages[static_cast<size_t>(PageOp::kHit)], 0u);
  EXPECT_EQ(rows[1].tenant, "b");
  EXPECT_EQ(rows[1].pages[static_cast<size_t>(PageOp::kHit)], 3u);
  EXPECT_EQ(PageOpName(PageOp::kExists), "exists");
  EXPECT_EQ(PageOpName(PageOp::kDuplicate), "duplicate");
}

TEST(PageCountersTest, ManifestsPastATenantsCapShareOneRow) {
  PageCounters counters;
  const int cap = static_cast<int>(PageCounters::kMaxManifestsPerTenant);
  for (int n = 0; n < cap + 3; ++n) counters.Count("a", Digest(n), PageOp::kHit, 1);
  counters.Count("a", Digest(0), PageOp::kHit, 1);        // a named one stays named
  counters.Count("b", Digest(cap + 1), PageOp::kHit, 1);  // another tenant has its own cap
  size_t named = 0;
  uint64_t other = 0;
  for (const PageCounters::Row& row : counters.Rows()) {
    if (row.tenant != "a") {
      EXPECT_EQ(row.manifest, Digest(cap + 1).substr(0, PageCounters::kManifestLabelDigits));
      continue;
    }
    if (row.manifest == PageCounters::kOtherManifests) {
      other = row.pages[static_cast<size_t>(PageOp::kHit)];
    } else {
      ++named;
      EXPECT_EQ(row.pages[static_cast<size_t>(PageOp::kHit)],
                row.manifest == Digest(0).substr(0, 16) ? 2u : 1u);
    }
  }
  EXPECT_EQ(named, PageCounters::kMaxManifestsPerTenant);
  EXPECT_EQ(other, 3u);
}

}  // namespace
}  // namespace kvcache
