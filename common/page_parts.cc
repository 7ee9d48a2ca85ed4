#include "common/page_parts.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/compatibility_manifest.h"

namespace kvcache {
namespace {

absl::Status BadParts(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("parts '", spec, "': ", why));
}

}  // namespace

absl::Status ValidatePageKeys(absl::Span<const std::string> keys) {
  if (keys.empty()) return absl::InvalidArgumentError("no page keys");
  if (keys.size() > kMaxPagesPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat(keys.size(), " page keys; at most ", kMaxPagesPerCall, " per call"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty() || keys[i].size() > kMaxPageKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat("page key ", i, " has ", keys[i].size(),
                                                     " bytes; want 1 to ", kMaxPageKeyBytes));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PagePartLayout>> ParsePageParts(absl::string_view spec,
                                                           uint64_t page_bytes) {
  std::vector<PagePartLayout> parts;
  absl::flat_hash_set<std::string> names;
  uint64_t offset = 0;
  for (absl::string_view item : absl::StrSplit(spec, '+')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(item, '/');
    if (fields.size() < 2 || fields.size() > 3) {
      return BadParts(spec, absl::StrCat("'", item, "' is not NAME/SIZE[/trailingN]"));
    }
    PagePartLayout part;
    part.name = std::string(fields[0]);
    if (part.name.empty() || part.name.size() > kMaxManifestNameBytes ||
        !IsManifestName(part.name)) {
      return BadParts(spec, absl::StrCat("part name '", fields[0], "' must have 1 to ",
                                         kMaxManifestNameBytes, " of [A-Za-z0-9._-]"));
    }
    if (!names.insert(part.name).second) {
      return BadParts(spec, absl::StrCat("part '", part.name, "' is named twice"));
    }
    absl::StatusOr<uint64_t> bytes = ParseByteSize(fields[1]);
    if (!bytes.ok() || *bytes == 0) {
      return BadParts(spec, absl::StrCat("part '", part.name, "' needs a size of at least 1 byte"));
    }
    part.bytes = *bytes;
    if (fields.size() == 3) {
      absl::string_view policy = fields[2];
      uint32_t pages = 0;
      if (policy == "all") {
        part.policy = PartHitPolicy::kAllPages;
      } else if (absl::ConsumePrefix(&policy, "trailing") && absl::SimpleAtoi(policy, &pages) &&
                 pages >= 1) {
        part.policy = PartHitPolicy::kTrailingPages;
        part.trailing_pages = pages;
      } else {
        return BadParts(spec, absl::StrCat("part '", part.name, "' has policy '", fields[2],
                                           "'; want all or trailingN with N >= 1"));
      }
    }
    part.offset = offset;
    offset += part.bytes;
    parts.push_back(std::move(part));
    if (parts.size() > kMaxPageParts) {
      return BadParts(spec, absl::StrCat("more than ", kMaxPageParts, " parts"));
    }
  }
  if (offset != page_bytes) {
    return BadParts(
        spec, absl::StrCat("parts sum to ", offset, " bytes but a page (block) has ", page_bytes));
  }
  return parts;
}

std::vector<PagePartLayout> SinglePagePart(uint64_t page_bytes) {
  return {PagePartLayout{.name = "kv", .offset = 0, .bytes = page_bytes}};
}

absl::StatusOr<uint32_t> PartMaskOf(absl::Span<const PagePartLayout> parts,
                                    absl::Span<const std::string> names) {
  if (names.empty()) return AllPartsMask(parts.size());
  uint32_t mask = 0;
  for (const std::string& name : names) {
    const auto it = std::find_if(parts.begin(), parts.end(),
                                 [&](const PagePartLayout& part) { return part.name == name; });
    if (it == parts.end()) {
      std::string known;
      for (const PagePartLayout& part : parts)
        absl::StrAppend(&known, known.empty() ? "" : ", ", part.name);
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown part '", name.substr(0, kMaxManifestNameBytes), "'; the pool has ", known));
    }
    mask |= uint32_t{1} << (it - parts.begin());
  }
  return mask;
}

uint32_t RequiredPartsMask(absl::Span<const PagePartLayout> parts) {
  uint32_t mask = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p].policy == PartHitPolicy::kAllPages) mask |= uint32_t{1} << p;
  }
  return mask;
}

absl::Status ValidateBlockPartMasks(absl::Span<const PagePartLayout> parts,
                                    absl::Span<const uint32_t> masks) {
  const uint32_t all = AllPartsMask(parts.size());
  const uint32_t required = RequiredPartsMask(parts);
  for (size_t i = 0; i < masks.size(); ++i) {
    if ((masks[i] & ~all) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", i, " has part mask 0x", absl::Hex(masks[i]), " but the pool has ",
                       parts.size(), " part(s), mask 0x", absl::Hex(all)));
    }
    if (masks[i] == 0 || (masks[i] & required) != required) {
      for (size_t p = 0; p < parts.size(); ++p) {
        if ((required & ~masks[i]) & (uint32_t{1} << p)) {
          return absl::InvalidArgumentError(
              absl::StrCat("block ", i, " has part mask 0x", absl::Hex(masks[i]), " without part '",
                           parts[p].name, "', which every block up to a hit needs"));
        }
      }
      return absl::InvalidArgumentError(absl::StrCat("block ", i, " has no parts"));
    }
  }
  return absl::OkStatus();
}

size_t RestorablePages(absl::Span<const PagePartLayout> parts, uint32_t wanted,
                       absl::Span<const uint32_t> page_masks) {
  size_t end = page_masks.size();
  // All-pages parts: the endpoint stops before the first page without one.
  for (size_t p = 0; p < parts.size(); ++p) {
    const uint32_t bit = uint32_t{1} << p;
    if ((wanted & bit) == 0 || parts[p].policy != PartHitPolicy::kAllPages) continue;
    for (size_t i = 0; i < end; ++i) {
      if ((page_masks[i] & bit) == 0) {
        end = i;
        break;
      }
    }
  }
  // Trailing parts: the greatest endpoint whose last trailing_pages pages (fewer at the start)
  // all hold each of them.
  for (; end > 0; --end) {
    bool restorable = true;
    for (size_t p = 0; p < parts.size() && restorable; ++p) {
      const uint32_t bit = uint32_t{1} << p;
      if ((wanted & bit) == 0 || parts[p].policy != PartHitPolicy::kTrailingPages) continue;
      const size_t first = end > parts[p].trailing_pages ? end - parts[p].trailing_pages : 0;
      for (size_t i = first; i < end; ++i) {
        if ((page_masks[i] & bit) == 0) {
          restorable = false;
          break;
        }
      }
    }
    if (restorable) break;
  }
  return end;
}

}  // namespace kvcache
