// `sextant ctl`: the human formatting of results and the key=value argument parsing
// (daemon/commands/ctl_format.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/commands/ctl_format.h"

namespace sx::daemon {
namespace {

using nlohmann::json;

TEST(CtlFormatTest, ScalarsAndEmptyResults) {
  EXPECT_EQ(format_ctl_human(json()), "ok\n");
  EXPECT_EQ(format_ctl_human(json::object()), "ok\n");
  EXPECT_EQ(format_ctl_human(json::array()), "(none)\n");
  EXPECT_EQ(format_ctl_human(json("draining")), "draining\n");
  EXPECT_EQ(format_ctl_human(json(42)), "42\n");
  EXPECT_EQ(format_ctl_human(json(true)), "true\n");
  EXPECT_EQ(format_ctl_human(json("line 1\nline 2\n")), "line 1\nline 2\n");
}

TEST(CtlFormatTest, NestedObjectsAreIndented) {
  json r = {{"state", "serving"},
            {"uptime_s", 12.5},
            {"draining", false},
            {"model", {{"name", "qwen2.5-0.5b"}, {"memory", {{"kv_blocks", 512}, {"free", nullptr}}}}},
            {"empty", json::object()}};
  EXPECT_EQ(format_ctl_human(r),
            "draining: false\n"
            "empty: (none)\n"
            "model:\n"
            "  memory:\n"
            "    free: null\n"
            "    kv_blocks: 512\n"
            "  name: qwen2.5-0.5b\n"
            "state: serving\n"
            "uptime_s: 12.5\n");
}

TEST(CtlFormatTest, ArraysOfScalarsAreJoinedAndArraysOfObjectsAreItems) {
  json r = {{"devices", {0, 1, 2}},
            {"names", {"a", "b"}},
            {"none", json::array()},
            {"replicas", {{{"id", 0}, {"state", "ready"}, {"devices", {0, 1}}}, {{"id", 1}, {"state", "draining"}}}},
            {"mixed", {1, {{"k", "v"}}, {2, 3}}}};
  EXPECT_EQ(format_ctl_human(r),
            "devices: 0, 1, 2\n"
            "mixed:\n"
            "  - 1\n"
            "  - k: v\n"
            "  - 2, 3\n"
            "names: a, b\n"
            "none: (none)\n"
            "replicas:\n"
            "  - devices: 0, 1\n"
            "    id: 0\n"
            "    state: ready\n"
            "  - id: 1\n"
            "    state: draining\n");
}

TEST(CtlFormatTest, MultilineStringsAreIndentedBlocks) {
  json r = {{"plan", "rank 0: heads 0-6\nrank 1: heads 7-13\n\ntotal: 2 ranks\n"}, {"tp", 2}};
  EXPECT_EQ(format_ctl_human(r),
            "plan:\n"
            "  rank 0: heads 0-6\n"
            "  rank 1: heads 7-13\n"
            "\n"
            "  total: 2 ranks\n"
            "tp: 2\n");
  json nested = {{"replica", {{"plan", "a\nb"}}}};
  EXPECT_EQ(format_ctl_human(nested), "replica:\n  plan:\n    a\n    b\n");
  json top_array = json::array({"x\ny", 3});
  EXPECT_EQ(format_ctl_human(top_array), "-\n  x\n  y\n- 3\n");
}

TEST(CtlFormatTest, ValuesParseAsJsonLiteralsOrStrings) {
  EXPECT_EQ(parse_ctl_value("3"), json(3));
  EXPECT_EQ(parse_ctl_value("-2"), json(-2));
  EXPECT_EQ(parse_ctl_value("0.25"), json(0.25));
  EXPECT_EQ(parse_ctl_value("true"), json(true));
  EXPECT_EQ(parse_ctl_value("false"), json(false));
  EXPECT_EQ(parse_ctl_value("null"), json());
  EXPECT_EQ(parse_ctl_value("[1, \"a\"]"), json({1, "a"}));
  EXPECT_EQ(parse_ctl_value("{\"a\": 1}"), (json{{"a", 1}}));
  EXPECT_EQ(parse_ctl_value("\"12\""), json("12"));
  EXPECT_EQ(parse_ctl_value("draft"), json("draft"));
  EXPECT_EQ(parse_ctl_value("/models/a b.gguf"), json("/models/a b.gguf"));
  EXPECT_EQ(parse_ctl_value("0600"), json("0600"));
  EXPECT_EQ(parse_ctl_value("1 2"), json("1 2"));
  EXPECT_EQ(parse_ctl_value(""), json(""));
}

TEST(CtlFormatTest, ArgumentsAreKeyValuePairs) {
  auto a = parse_ctl_argument("timeout_s=30");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "timeout_s");
  EXPECT_EQ(a->second, json(30));
  auto b = parse_ctl_argument("path=/a=b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "path");
  EXPECT_EQ(b->second, json("/a=b"));
  EXPECT_EQ(parse_ctl_argument("verbose").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_ctl_argument("=1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_ctl_argument("cmd=status").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sx::daemon
