#include "cache/pool_spec.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

absl::StatusOr<uint32_t> ParseField(absl::string_view key, absl::string_view value) {
  uint32_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool field ", key, "='", value, "' is not a non-negative integer"));
  }
  return parsed;
}

// A pool field's JSON value as the spec writes it: a string as it is, an integer in decimal.
absl::StatusOr<std::string> SpecValue(const std::string& key, const nlohmann::json& value) {
  std::string text;
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number_unsigned() || value.is_number_integer()) {
    text = value.dump();
  } else if (key == "disk_tier" && value.is_object() && value.size() == 2 &&
             value.contains("path") && value.contains("size")) {
    ASSIGN_OR_RETURN(const std::string path, SpecValue("disk_tier.path", value["path"]));
    ASSIGN_OR_RETURN(const std::string size, SpecValue("disk_tier.size", value["size"]));
    return absl::StrCat(path, ":", size);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", key, "' is a JSON ", value.type_name(),
                     key == "disk_tier" ? "; want \"PATH:SIZE\" or {\"path\": PATH, \"size\": SIZE}"
                                        : "; want a string or an integer"));
  }
  if (absl::StrContains(text, ':') && key != "disk_tier") {
    return absl::InvalidArgumentError(absl::StrCat("field '", key, "' holds ':'"));
  }
  return text;
}

// One pool object as a ParsePoolSpec spec: "NAME:key=value:...".
absl::StatusOr<std::string> SpecOf(const nlohmann::json& pool) {
  if (!pool.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("is a JSON ", pool.type_name(), ", not an object"));
  }
  if (!pool.contains("name") || !pool["name"].is_string()) {
    return absl::InvalidArgumentError("has no \"name\" string");
  }
  ASSIGN_OR_RETURN(std::string spec, SpecValue("name", pool["name"]));
  for (const auto& [key, value] : pool.items()) {
    if (key == "name") continue;
    if (absl::StrContains(key, ':') || absl::StrContains(key, '=')) {
      return absl::InvalidArgumentError(absl::StrCat("unknown pool field '", key, "'"));
    }
    ASSIGN_OR_RETURN(const std::string text, SpecValue(key, value));
    absl::StrAppend(&spec, ":", key, "=", text);
  }
  return spec;
}

}  // namespace

PoolOptions DefaultPoolOptions() {
  PoolOptions options;
  options.name = "default";
  options.model_id = "demo";
  options.layout = PoolLayout{.num_layers = 4,
                              .num_kv_heads = 2,
                              .head_dim = 64,
                              .block_size = 16,
                              .dtype = DType::kFloat16};
  options.num_blocks = 1024;
  return options;
}

absl::Status ValidatePoolNames(absl::Span<const PoolOptions> pools) {
  absl::flat_hash_set<absl::string_view> seen;
  for (const PoolOptions& pool : pools) {
    RETURN_IF_ERROR(ValidatePoolName(pool.name));
    if (!seen.insert(pool.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("two pools are named '", pool.name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolOptions> ParsePoolSpec(absl::string_view spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  PoolOptions options = DefaultPoolOptions();
  options.name = std::string(parts[0]);
  if (options.name.empty()) return absl::InvalidArgumentError("pool spec has no name");
  RETURN_IF_ERROR(ValidatePoolName(options.name));
  uint64_t bytes = 0;
  std::optional<absl::string_view> parts_spec;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(parts[i], '=');
    const absl::string_view key = kv.first, value = kv.second;
    if (key == "model") {
      options.model_id = std::string(value);
    } else if (key == "layers") {
      ASSIGN_OR_RETURN(options.layout.num_layers, ParseField(key, value));
    } else if (key == "kv_heads") {
      ASSIGN_OR_RETURN(options.layout.num_kv_heads, ParseField(key, value));
    } else if (key == "head_dim") {
      ASSIGN_OR_RETURN(options.layout.head_dim, ParseField(key, value));
    } else if (key == "block_size") {
      ASSIGN_OR_RETURN(options.layout.block_size, ParseField(key, value));
    } else if (key == "blocks") {
      ASSIGN_OR_RETURN(options.num_blocks, ParseField(key, value));
    } else if (key == "dtype") {
      ASSIGN_OR_RETURN(options.layout.dtype, ParseDType(value));
    } else if (key == "hash") {
      ASSIGN_OR_RETURN(options.hash_algorithm, ParseHashAlgorithm(value));
    } else if (key == "bytes") {
      ASSIGN_OR_RETURN(bytes, ParseByteSize(value));
    } else if (key == "disk_tier") {
      // disk_tier=PATH:SIZE — the size is the next field (so a path cannot hold ':').
      if (value.empty() || i + 1 >= parts.size()) {
        return absl::InvalidArgumentError(
            "disk_tier wants PATH:SIZE (a file on local disk, then its size), e.g. "
            "disk_tier=/var/lib/kvcache/p0.tier:64G");
      }
      if (value.front() != '/') {
        return absl::InvalidArgumentError(
            absl::StrCat("disk_tier path '", value, "' must be absolute"));
      }
      options.disk_tier_path = std::string(value);
      ASSIGN_OR_RETURN(options.disk_tier_bytes, ParseByteSize(parts[++i]));
      if (options.disk_tier_bytes == 0) {
        return absl::InvalidArgumentError("disk_tier size 0: give at least one block");
      }
    } else if (key == "disk_admission") {
      if (value == "all") {
        options.disk_admission = DiskAdmission::kAll;
      } else if (value == "reused") {
        options.disk_admission = DiskAdmission::kReused;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("disk_admission='", value, "' (want all or reused)"));
      }
    } else if (key == "parts") {
      parts_spec = value;  // parsed once the layout, and so the page's bytes, is known
    } else if (key == "host_tier") {
      ASSIGN_OR_RETURN(options.host_tier_bytes, ParseByteSize(value));
      if (options.host_tier_bytes == 0) {
        return absl::InvalidArgumentError("host_tier=0: give a size of at least one block");
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown pool field '", key,
                       "' (want model, layers, kv_heads, head_dim, block_size, "
                       "dtype, blocks, bytes, hash, parts, host_tier, disk_tier, disk_admission)"));
    }
  }
  RETURN_IF_ERROR(options.layout.Validate());
  if (parts_spec.has_value()) {
    ASSIGN_OR_RETURN(options.parts, ParsePageParts(*parts_spec, options.layout.BlockBytes()));
  }
  if (bytes != 0) {
    const uint64_t blocks = bytes / options.layout.BlockBytes();
    if (blocks == 0 || blocks >= kNoBlock) {
      return absl::InvalidArgumentError(absl::StrCat("bytes=", bytes, " holds ", blocks,
                                                     " blocks of ", options.layout.BlockBytes()));
    }
    options.num_blocks = static_cast<uint32_t>(blocks);
  }
  if (options.host_tier_bytes != 0 && options.host_tier_bytes < options.layout.BlockBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_tier=", options.host_tier_bytes, " bytes holds no block of ",
                     options.layout.BlockBytes(), " bytes; give at least one block"));
  }
  if (!options.disk_tier_path.empty() && options.host_tier_bytes == 0) {
    return absl::InvalidArgumentError(
        "disk_tier sits below a host_tier: give host_tier=SIZE too (tier 2 passes its oldest "
        "records to disk)");
  }
  return options;
}

absl::StatusOr<std::vector<PoolOptions>> ParsePoolsJson(absl::string_view json) {
  const nlohmann::json root =
      nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!root.is_object() || !root.contains("pools") || !root["pools"].is_array()) {
    return absl::InvalidArgumentError("want an object with a \"pools\" array");
  }
  for (const auto& [key, value] : root.items()) {
    if (key != "pools")
      return absl::InvalidArgumentError(absl::StrCat("unknown field '", key, "'"));
  }
  std::vector<PoolOptions> pools;
  for (size_t i = 0; i < root["pools"].size(); ++i) {
    const nlohmann::json& pool = root["pools"][i];
    std::string where = absl::StrCat("pools[", i, "]");
    if (pool.is_object() && pool.contains("name") && pool["name"].is_string()) {
      absl::StrAppend(&where, " ('", pool["name"].get<std::string>(), "')");
    }
    const absl::StatusOr<std::string> spec = SpecOf(pool);
    absl::StatusOr<PoolOptions> options = spec.ok() ? ParsePoolSpec(*spec) : spec.status();
    if (!options.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", options.status().message()));
    }
    pools.push_back(*std::move(options));
  }
  if (pools.empty()) return absl::InvalidArgumentError("\"pools\" is empty");
  return pools;
}

}  // namespace kvcache
