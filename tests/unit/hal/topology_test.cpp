// The topology structure and its nvidia-smi-style rendering (runtime/hal/topology.h).
#include "runtime/hal/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sx::hal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Topology, LettersAndScoresOrderLinksAsNcclSeesThem) {
  Link nv4{LinkKind::kNvLink, 4}, nv12{LinkKind::kNvLink, 12};
  EXPECT_EQ(link_letters(nv4), "NV4");
  EXPECT_EQ(link_letters(Link{LinkKind::kSelf}), "X");
  EXPECT_EQ(link_letters(Link{LinkKind::kNode}), "NODE");
  EXPECT_EQ(link_letters(Link{}), "?");
  // NVLink (more links better) > PIX > PXB > PHB > NODE > SYS > unknown.
  const Link order[] = {nv12, nv4, {LinkKind::kPix}, {LinkKind::kPxb}, {LinkKind::kPhb}, {LinkKind::kNode},
                        {LinkKind::kSys}, {}};
  for (std::size_t i = 1; i < std::size(order); ++i) {
    EXPECT_GT(link_score(order[i - 1]), link_score(order[i])) << link_letters(order[i - 1]) << " vs "
                                                               << link_letters(order[i]);
  }
}

TEST(Topology, FormatsTheMatrixAffinityPeersAndTheLegendOfWhatIsUsed) {
  Topology t = make_topology(3, "a test");
  ASSERT_EQ(t.size(), 3);
  EXPECT_EQ(t.link(1, 1).kind, LinkKind::kSelf);
  EXPECT_EQ(t.link(0, 2).kind, LinkKind::kUnknown);
  t.link(0, 1) = t.link(1, 0) = Link{LinkKind::kNvLink, 4, 1, 0};
  t.link(0, 2) = t.link(2, 0) = Link{LinkKind::kSys, 0, 0, -1};
  t.link(1, 2) = t.link(2, 1) = Link{LinkKind::kPhb, 0, 1, 1};
  t.cpu_affinity = {"0-15", "0-15", "16-31"};
  t.numa_affinity = {"0", "0", "1"};
  const std::string s = format_topology(t);
  EXPECT_THAT(s, HasSubstr("GPU0 GPU1 GPU2 CPU Affinity   NUMA Affinity\n"));
  EXPECT_THAT(s, HasSubstr("GPU0 X    NV4  SYS  0-15           0\n"));
  EXPECT_THAT(s, HasSubstr("GPU2 SYS  PHB  X    16-31          1\n"));
  EXPECT_THAT(s, HasSubstr("Peer access: 0-1: peer access, P2P rank 0; 0-2: no peer access; 1-2: peer access, P2P rank 1"));
  EXPECT_THAT(s, HasSubstr("SYS  = across NUMA nodes"));
  EXPECT_THAT(s, HasSubstr("NV#  = NVLink"));
  EXPECT_THAT(s, Not(HasSubstr("PIX  =")));  // only the letters used
  EXPECT_THAT(s, HasSubstr("(from a test)"));
}

}  // namespace
}  // namespace sx::hal
