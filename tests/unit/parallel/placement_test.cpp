// Topology-aware placement (runtime/parallel/placement.h) on the saved matrices of
// tests/data/topology.
#include "runtime/parallel/placement.h"

#include <gtest/gtest.h>

#include <string>

#include "runtime/hal/topology_text.h"

namespace sx::parallel {
namespace {

hal::Topology fixture(const char* name) {
  auto t = hal::read_nvidia_smi_topo(std::string(SX_TOPOLOGY_DIR) + "/" + name);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : hal::Topology{};
}

// Whether devices a and b are ring neighbours in `group`.
bool neighbours(const std::vector<int>& group, int a, int b) {
  const std::size_t k = group.size();
  for (std::size_t i = 0; i < k; ++i) {
    const int x = group[i], y = group[(i + 1) % k];
    if ((x == a && y == b) || (x == b && y == a)) return true;
  }
  return false;
}

// Every device at most once; every TP group free of SYS links when the layout's tier says so.
void check_layout(const hal::Topology& t, const Layout& l) {
  ASSERT_EQ(l.groups.size(), static_cast<std::size_t>(l.replicas * l.pp));
  std::vector<int> seen(static_cast<std::size_t>(t.size()), 0);
  LinkTier worst = LinkTier::kSwitch;
  for (const auto& g : l.groups) {
    ASSERT_EQ(g.size(), static_cast<std::size_t>(l.tp));
    for (std::size_t i = 0; i < g.size(); ++i) {
      ++seen[static_cast<std::size_t>(g[i])];
      for (std::size_t j = i + 1; j < g.size(); ++j) worst = std::max(worst, tier_of(t.link(g[i], g[j])));
    }
  }
  for (int s : seen) EXPECT_LE(s, 1);
  EXPECT_EQ(worst, l.worst) << l.describe();
}

// The seed's box: 4 x 3090 on socket 0 (switches 0-1, 2-3), 2 x 4090 on socket 1 (SYS between
// them). It ran as two TP 3 instances behind nginx; one of those groups necessarily spans the
// sockets. A model that fits on two cards gets three TP 2 replicas on PIX links; one that needs
// three cards gets TP 2 x PP 3 (the pipeline, not the all-reduces, crosses the sockets); asked
// for TP 3, the SYS link is unavoidable and named.
TEST(Placement, TheFourPlusTwoBoxKeepsSysLinksOutOfTpGroups) {
  const hal::Topology t = fixture("pcie-4+2-sys.txt");
  auto small = place(t, {});
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  check_layout(t, small->chosen);
  EXPECT_EQ(small->chosen.describe(), "3 replicas of TP 2: [0, 1] [2, 3] [4, 5]");
  EXPECT_EQ(small->chosen.worst, LinkTier::kSwitch);
  ASSERT_TRUE(small->has_alternative);
  EXPECT_EQ(small->alternative.describe(), "TP 6: [0, 1, 2, 3, 4, 5]");  // ring order
  EXPECT_NE(small->alternative_cost.find("SYS between GPU"), std::string::npos) << small->alternative_cost;

  PlacementRequest big;
  big.fits = [](int tp, int pp) { return tp * pp >= 3; };
  auto needs3 = place(t, big);
  ASSERT_TRUE(needs3.ok()) << needs3.status().to_string();
  check_layout(t, needs3->chosen);
  EXPECT_EQ(needs3->chosen.describe(), "TP 2 x PP 3: [0, 1] [2, 3] [4, 5]");
  EXPECT_NE(needs3->why.find("pipeline stages may cross any link"), std::string::npos) << needs3->why;

  PlacementRequest tp3;
  tp3.tp = 3;
  auto forced = place(t, tp3);
  ASSERT_TRUE(forced.ok()) << forced.status().to_string();
  check_layout(t, forced->chosen);
  EXPECT_EQ(forced->chosen.replicas, 2);
  EXPECT_EQ(forced->chosen.worst, LinkTier::kSocket);
  EXPECT_NE(forced->why.find("across CPU sockets (SYS between GPU"), std::string::npos) << forced->why;
}

TEST(Placement, AnNvlinkBoxRunsOneGroupOverEveryGpu) {
  const hal::Topology t = fixture("dgx-8x-h100-nvlink.txt");
  auto p = place(t, {});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  check_layout(t, p->chosen);
  EXPECT_EQ(p->chosen.describe(), "TP 8: [0, 1, 2, 3, 4, 5, 6, 7]");
  EXPECT_NE(p->why.find("NV18"), std::string::npos) << p->why;
}

TEST(Placement, NvlinkPairsStayTogetherAndAreRingNeighbours) {
  const hal::Topology t = fixture("nvlink-pairs-4x.txt");
  PlacementRequest two;
  two.fits = [](int tp, int pp) { return tp * pp >= 2; };
  auto p = place(t, two);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->chosen.describe(), "2 replicas of TP 2: [0, 1] [2, 3]");
  // TP 4 forced: PHB between the pairs is unavoidable, but each pair's NVLink is a ring edge.
  PlacementRequest four;
  four.tp = 4;
  auto q = place(t, four);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  ASSERT_EQ(q->chosen.groups.size(), 1u);
  EXPECT_TRUE(neighbours(q->chosen.groups[0], 0, 1));
  EXPECT_TRUE(neighbours(q->chosen.groups[0], 2, 3));
  EXPECT_EQ(q->chosen.worst, LinkTier::kHostBridge);
}

TEST(Placement, ADualSocketServerKeepsGroupsOnOneSocket) {
  const hal::Topology t = fixture("dual-socket-8x-pcie.txt");
  PlacementRequest tp4;
  tp4.tp = 4;
  auto p = place(t, tp4);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  check_layout(t, p->chosen);
  EXPECT_EQ(p->chosen.describe(), "2 replicas of TP 4: [0, 1, 2, 3] [4, 5, 6, 7]");
  EXPECT_EQ(p->chosen.worst, LinkTier::kHostBridge);
  PlacementRequest two_replicas;
  two_replicas.replicas = 2;
  auto q = place(t, two_replicas);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_NE(q->chosen.worst, LinkTier::kSocket) << q->chosen.describe();
}

// On every fixture, whatever number of cards the model needs: no TP group gets a SYS link (a
// layout without one always exists, if only through pipeline stages), and nothing beats the
// chosen layout by placement.h's order among all layouts tried.
TEST(Placement, NoSysLinkInsideATpGroupWhenALayoutWithoutOneExists) {
  for (const char* name : {"pcie-4+2-sys.txt", "dgx-8x-h100-nvlink.txt", "nvlink-pairs-4x.txt", "dual-socket-8x-pcie.txt"}) {
    const hal::Topology t = fixture(name);
    for (int need = 1; need <= t.size(); ++need) {
      SCOPED_TRACE(::testing::Message() << name << ", a model needing " << need << " devices");
      PlacementRequest r;
      r.fits = [need](int tp, int pp) { return tp * pp >= need; };
      auto p = place(t, r);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      check_layout(t, p->chosen);
      EXPECT_NE(p->chosen.worst, LinkTier::kSocket) << p->chosen.describe();
      EXPECT_GE(p->chosen.tp * p->chosen.pp, need);
    }
  }
}

TEST(Placement, ErrorsNameWhatWasTried) {
  const hal::Topology t = fixture("nvlink-pairs-4x.txt");
  PlacementRequest none;
  none.fits = [](int, int) { return false; };
  auto p = place(t, none);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("no layout of 4 devices holds the model (tried TP 1 x PP 1"), std::string::npos)
      << p.status().to_string();
  PlacementRequest too_many;
  too_many.tp = 4;
  too_many.replicas = 2;
  auto q = place(t, too_many);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("needs 8 devices; 4 are given"), std::string::npos) << q.status().to_string();
}

}  // namespace
}  // namespace sx::parallel
