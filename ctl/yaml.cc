#include "ctl/yaml.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

namespace kvcache::ctl {
namespace {

using Json = nlohmann::ordered_json;

// Whether `text` reads back as this same string when written unquoted.
bool Plain(absl::string_view text) {
  if (text.empty()) return false;
  const unsigned char first = text.front();
  if (!absl::ascii_isalpha(first) && first != '/' && first != '_') return false;
  for (const char c : text) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' &&
        c != '-') {
      return false;
    }
  }
  // YAML 1.1 readers (PyYAML among them) take these for booleans and null.
  const std::string lower = absl::AsciiStrToLower(text);
  for (const char* word : {"true", "false", "yes", "no", "on", "off", "y", "n", "null"}) {
    if (lower == word) return false;
  }
  return true;
}

std::string Scalar(const Json& value) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    return Plain(text) ? text : value.dump();
  }
  return value.dump();  // null, true, false and numbers are written as in JSON
}

bool NonEmptyContainer(const Json& value) {
  return (value.is_object() || value.is_array()) && !value.empty();
}

void Emit(const Json& value, size_t indent, std::string* out);

// A sequence item: "- " then the item; an item that is itself a mapping or sequence starts on
// the dash's line and continues two columns in.
void EmitItem(const Json& item, size_t indent, std::string* out) {
  if (!NonEmptyContainer(item)) {
    out->append(indent, ' ');
    *out += "- " + Scalar(item) + "\n";
    return;
  }
  std::string nested;
  Emit(item, indent + 2, &nested);
  nested.replace(indent, 2, "- ");
  *out += nested;
}

// A non-empty mapping or sequence, each line starting `indent` spaces in.
void Emit(const Json& value, size_t indent, std::string* out) {
  if (value.is_array()) {
    for (const Json& item : value) EmitItem(item, indent, out);
    return;
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    out->append(indent, ' ');
    *out += Scalar(Json(it.key())) + ":";
    const Json& child = it.value();
    if (!NonEmptyContainer(child)) {
      *out += " " + (child.is_object()  ? std::string("{}")
                     : child.is_array() ? std::string("[]")
                                        : Scalar(child));
      *out += "\n";
    } else if (child.is_object()) {
      *out += "\n";
      Emit(child, indent + 2, out);
    } else {
      *out += "\n";
      Emit(child, indent, out);
    }
  }
}

}  // namespace

std::string ToYaml(const Json& value) {
  if (!NonEmptyContainer(value)) {
    if (value.is_object()) return "{}\n";
    if (value.is_array()) return "[]\n";
    return Scalar(value) + "\n";
  }
  std::string out;
  Emit(value, 0, &out);
  return out;
}

}  // namespace kvcache::ctl
