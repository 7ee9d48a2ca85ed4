#include "common/byte_size.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvcache {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  uint64_t multiplier = 1;
  for (auto [suffix, factor] : {std::pair{"tib", 1ull << 40},
                                {"gib", 1ull << 30},
                                {"mib", 1ull << 20},
                                {"kib", 1ull << 10},
                                {"t", 1ull << 40},
                                {"g", 1ull << 30},
                                {"m", 1ull << 20},
                                {"k", 1ull << 10}}) {
    if (absl::EndsWith(lower, suffix)) {
      lower.resize(lower.size() - strlen(suffix));
      multiplier = factor;
      break;
    }
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(lower, &value) || value > (~0ull) / multiplier) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a byte size"));
  }
  return value * multiplier;
}

}  // namespace kvcache
