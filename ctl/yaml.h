// ToYaml: kvcachectl's `-o yaml`, written from the same JSON document `-o json` prints, so the
// two never disagree on a key or a value. A small block-style emitter (the build has no YAML
// library): mappings as "key: value" indented by two, sequences as "- item" at their key's
// indentation (as kubectl prints them), {} and [] for empty ones. Strings are plain when no YAML
// reader could take them for anything else (they start with a letter, '/' or '_', hold only
// letters, digits and "_./-", and are no YAML 1.1 boolean or null), else double-quoted with JSON's
// escapes, which YAML's double-quoted style shares: "0000000000000001" and "2026-11-26T12:00:00Z"
// stay strings, as in the JSON.
//
// Thread safety: a function of its argument.
#ifndef KVCACHE_CTL_YAML_H_
#define KVCACHE_CTL_YAML_H_

#include <string>

#include "nlohmann/json.hpp"

namespace kvcache::ctl {

// The YAML document for `value`, ending in '\n'.
std::string ToYaml(const nlohmann::ordered_json& value);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CTL_YAML_H_
