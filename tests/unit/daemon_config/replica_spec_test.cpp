// model.replicas: the three forms, their canonical text, the YAML and flag spellings, and the
// device groups each gives (with the errors that say what would fit).
#include <gtest/gtest.h>

#include "daemon/config/replica_spec.h"
#include "daemon/config/serve_flags.h"
#include "daemon/config/yaml_io.h"

namespace sx::daemon::config {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(ReplicaSpec, ParsesCountsPerDeviceAndGroups) {
  auto two = parse_replica_spec(" 2 ");
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(two->kind, ReplicaSpec::Kind::kCount);
  EXPECT_EQ(two->count, 2);
  EXPECT_EQ(replica_spec_text(*two), "2");
  auto per = parse_replica_spec("per-device");
  ASSERT_TRUE(per.ok());
  EXPECT_EQ(per->kind, ReplicaSpec::Kind::kPerDevice);
  auto groups = parse_replica_spec("[[0,1,2], [ 3 ,4,5 ]]");
  ASSERT_TRUE(groups.ok()) << groups.status().to_string();
  EXPECT_EQ(groups->groups, (Groups{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(replica_spec_text(*groups), "[[0, 1, 2], [3, 4, 5]]");
  for (const char* bad : {"0", "65", "-1", "two", "", "[]", "[[]]", "[[0,1],", "[[0,1]]x", "[0,1]", "[[0,,1]]",
                          "[[a]]", "per_device"}) {
    auto r = parse_replica_spec(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
}

TEST(ReplicaSpec, YamlTakesANumberAWordOrASequenceAndFlagsTheSameText) {
  auto c = load_config_string("model:\n  path: m.gguf\n  tp: 3\n  replicas: [[0, 1, 2], [3, 4, 5]]\n", "r.yaml");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->model.replicas, "[[0, 1, 2], [3, 4, 5]]");
  EXPECT_TRUE(validate(*c).ok()) << validate(*c).to_string();
  // Printed and read back: the same setting.
  auto again = load_config_string(to_yaml(*c), "printed.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string() << "\n" << to_yaml(*c);
  EXPECT_EQ(again->model.replicas, c->model.replicas);
  auto n = load_config_string("model:\n  replicas: 2\n", "n.yaml");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->model.replicas, "2");
  auto bad = load_config_string("model:\n  replicas: [[0, x]]\n", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.yaml:2:13: model.replicas: expected device groups"), std::string::npos)
      << bad.status().message();
  auto flags = parse_serve_flags(std::vector<std::string_view>{"--model", "m.gguf", "--replicas", "per-device"});
  ASSERT_TRUE(flags.ok()) << flags.status().to_string();
  EXPECT_EQ(flags->config.model.replicas, "per-device");
}

TEST(ReplicaSpec, DeviceGroupsSplitInOrderAndRefuseWhatDoesNotFit) {
  auto spec = [](const char* t) { return *parse_replica_spec(t); };
  auto two = replica_device_groups(spec("2"), 3, 8, {});
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  EXPECT_EQ(*two, (Groups{{0, 1, 2}, {3, 4, 5}}));
  const std::int64_t listed[] = {5, 4, 3, 2};
  auto from_list = replica_device_groups(spec("2"), 2, 8, listed);
  ASSERT_TRUE(from_list.ok());
  EXPECT_EQ(*from_list, (Groups{{5, 4}, {3, 2}}));
  auto per = replica_device_groups(spec("per-device"), 1, 3, {});
  ASSERT_TRUE(per.ok());
  EXPECT_EQ(*per, (Groups{{0}, {1}, {2}}));
  auto explicit_groups = replica_device_groups(spec("[[0, 2], [1, 3]]"), 2, 4, {});
  ASSERT_TRUE(explicit_groups.ok());
  EXPECT_EQ(*explicit_groups, (Groups{{0, 2}, {1, 3}}));

  auto too_many = replica_device_groups(spec("3"), 3, 8, {});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().message(),
            "3 replicas of 3 device(s) each need 9 devices but 8 are available (2 replica(s) of this layout fit)");
  auto per_tp = replica_device_groups(spec("per-device"), 2, 8, {});
  ASSERT_FALSE(per_tp.ok());
  EXPECT_NE(per_tp.status().message().find("tp x pp is 2"), std::string::npos);
  auto wrong_size = replica_device_groups(spec("[[0, 1], [2]]"), 2, 8, {});
  ASSERT_FALSE(wrong_size.ok());
  EXPECT_EQ(wrong_size.status().message(), "group 1 ([2]) has 1 device(s) but each replica needs tp x pp = 2");
  auto twice = replica_device_groups(spec("[[0, 1], [1, 2]]"), 2, 8, {});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().message(), "device 1 is in two replicas");
  auto absent = replica_device_groups(spec("[[0], [9]]"), 1, 8, {});
  ASSERT_FALSE(absent.ok());
  EXPECT_EQ(absent.status().message(), "device 9 is not among the backend's 8 device(s) (0 .. 7)");
}

}  // namespace
}  // namespace sx::daemon::config
