// ToYaml (`kvcachectl -o yaml`): block style as kubectl prints it, and strings quoted wherever a
// YAML reader would take them for a number, a boolean, null or a timestamp.
#include "ctl/yaml.h"

#include <gtest/gtest.h>

#include "ctl/format.h"

namespace kvcache::ctl {
namespace {

TEST(YamlTest, MappingsNestTwoSpacesAndSequencesSitAtTheirKey) {
  const Json document = Json::parse(R"({
    "name": "default", "num_blocks": 64, "ratio": 0.25, "hash": null, "shm": true,
    "layout": {"num_layers": 4, "dtype": "fp16"},
    "pools": [{"name": "a", "counts": {"free": 1}}, {"name": "b", "counts": {}}],
    "hashes": ["5f63370890007b05", "e81198118f4fa0f4"],
    "tiers": [], "nested": [[1, 2], []]
  })");
  EXPECT_EQ(ToYaml(document),
            "name: default\n"
            "num_blocks: 64\n"
            "ratio: 0.25\n"
            "hash: null\n"
            "shm: true\n"
            "layout:\n"
            "  num_layers: 4\n"
            "  dtype: fp16\n"
            "pools:\n"
            "- name: a\n"
            "  counts:\n"
            "    free: 1\n"
            "- name: b\n"
            "  counts: {}\n"
            "hashes:\n"
            "- \"5f63370890007b05\"\n"
            "- e81198118f4fa0f4\n"
            "tiers: []\n"
            "nested:\n"
            "- - 1\n"
            "  - 2\n"
            "- []\n");
}

TEST(YamlTest, StringsAYamlReaderWouldRetypeAreQuoted) {
  for (const char* text : {"0000000000000001", "1e5", "2026-11-26T12:00:00.000Z", "true", "No",
                           "null", "~", "", "-", "a b", "key: value", "#x", "uid:0", "*", "'q'"}) {
    EXPECT_EQ(ToYaml(Json::array({text})), "- " + Json(text).dump() + "\n") << text;
  }
  for (const char* text : {"default", "kvcache.v1.KvCache", "L4/H2/D64/fp16", "xxh3_128", "SERVING",
                           "/run/kv.sock", "e81198118f4fa0f4"}) {
    EXPECT_EQ(ToYaml(Json::array({text})), std::string("- ") + text + "\n") << text;
  }
  EXPECT_EQ(ToYaml(Json::array({"a\"b\nc"})), "- \"a\\\"b\\nc\"\n");
}

TEST(YamlTest, EmptyAndScalarDocuments) {
  EXPECT_EQ(ToYaml(Json::object()), "{}\n");
  EXPECT_EQ(ToYaml(Json::array()), "[]\n");
  EXPECT_EQ(ToYaml(Json(7)), "7\n");
  EXPECT_EQ(ToYaml(Json("0.1.0")), "\"0.1.0\"\n");
}

TEST(YamlTest, KeysKeepTheDocumentsOrder) {
  Json document = Json::object();
  document["zeta"] = 1;
  document["alpha"] = 2;
  EXPECT_EQ(ToYaml(document), "zeta: 1\nalpha: 2\n");
}

}  // namespace
}  // namespace kvcache::ctl
