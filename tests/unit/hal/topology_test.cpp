// The topology structure and its nvidia-smi-style rendering (runtime/hal/topology.h).
#include "runtime/hal/topology.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/hal/topology_text.h"

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

std::string fixture(const char* name) { return std::string(SX_TOPOLOGY_DIR) + "/" + name; }

// The saved matrices of tests/data/topology read back: GPU links, NIC columns ignored, affinity kept.
TEST(TopologyText, ReadsSavedNvidiaSmiMatrices) {
  auto dgx = read_nvidia_smi_topo(fixture("dgx-8x-h100-nvlink.txt"));
  ASSERT_TRUE(dgx.ok()) << dgx.status().to_string();
  ASSERT_EQ(dgx->size(), 8);  // four NIC columns and rows dropped
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) EXPECT_EQ(link_letters(dgx->link(i, j)), i == j ? "X" : "NV18") << i << "," << j;
  }
  EXPECT_EQ(dgx->cpu_affinity[5], "56-111,168-223");
  EXPECT_EQ(dgx->numa_affinity[2], "0");
  EXPECT_THAT(dgx->source, HasSubstr("dgx-8x-h100-nvlink.txt"));

  auto box = read_nvidia_smi_topo(fixture("pcie-4+2-sys.txt"));
  ASSERT_TRUE(box.ok()) << box.status().to_string();
  ASSERT_EQ(box->size(), 6);
  EXPECT_EQ(box->link(0, 1).kind, LinkKind::kPix);
  EXPECT_EQ(box->link(1, 2).kind, LinkKind::kNode);
  EXPECT_EQ(box->link(3, 4).kind, LinkKind::kSys);
  EXPECT_EQ(box->link(4, 5).kind, LinkKind::kPix);
  EXPECT_EQ(box->numa_affinity, (std::vector<std::string>{"0", "0", "0", "0", "1", "1"}));

  auto pairs = read_nvidia_smi_topo(fixture("nvlink-pairs-4x.txt"));
  ASSERT_TRUE(pairs.ok()) << pairs.status().to_string();
  EXPECT_EQ(link_letters(pairs->link(2, 3)), "NV4");
  EXPECT_EQ(pairs->link(1, 2).kind, LinkKind::kPhb);

  auto dual = read_nvidia_smi_topo(fixture("dual-socket-8x-pcie.txt"));
  ASSERT_TRUE(dual.ok()) << dual.status().to_string();
  EXPECT_EQ(dual->link(0, 1).kind, LinkKind::kPxb);
  EXPECT_EQ(dual->link(0, 3).kind, LinkKind::kNode);
  EXPECT_EQ(dual->link(3, 4).kind, LinkKind::kSys);
  // Printed again in the same letters.
  EXPECT_THAT(format_topology(*dual), HasSubstr("GPU3 NODE NODE PXB  X    SYS  SYS  SYS  SYS  0-23,48-71     0\n"));
}

// Terminal colours, spaces instead of tabs, old letters (SOC), no affinity columns.
TEST(TopologyText, ToleratesColoursSpacesAndOldLetters) {
  const std::string text =
      "\x1b[4mGPU0    GPU1    GPU2    CPU Affinity\x1b[0m\r\n"
      "GPU0     X      PHB     SOC     0-7\r\n"
      "GPU1    PHB      X      SOC     0-7\n"
      "GPU2    SOC     SOC      X      8-15\n\nLegend:\n  X = Self\n";
  auto t = parse_nvidia_smi_topo(text, "pasted");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 3);
  EXPECT_EQ(t->link(0, 2).kind, LinkKind::kSys);
  EXPECT_EQ(t->link(0, 1).kind, LinkKind::kPhb);
  EXPECT_EQ(t->cpu_affinity, (std::vector<std::string>{"0-7", "0-7", "8-15"}));
  EXPECT_TRUE(t->numa_affinity.empty());
}

TEST(TopologyText, ErrorsNameTheFileLineAndCell) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"nothing here\n", "no header line starting with GPU0"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\tWAT\n", "bad.txt:3: GPU1 to GPU1: 'WAT' is not a link"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\tPIX\n", "bad.txt:3: GPU1 to GPU1 is 'PIX': only a GPU's own cell is X"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\n", "the header names 2 GPUs but 1 rows follow"},
      {"\tGPU0\tGPU1\nGPU0\t X\nGPU1\tPIX\t X\n", "bad.txt:2: GPU0 has 1 link cells; the header has 2"},
      {"\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tSYS\t X\n", "GPU0 to GPU1 is PIX but GPU1 to GPU0 is SYS"},
      {"\tGPU0\tGPU2\n", "bad.txt:1: column 2 is GPU2, expected GPU1"},
  };
  for (const Case& c : cases) {
    auto t = parse_nvidia_smi_topo(c.text, "bad.txt");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(c.says));
  }
  auto missing = read_nvidia_smi_topo("/nonexistent/topo.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/topo.txt"));
}

// Issue 39 item 1: a header naming 100,000 GPUs (0.9 MB) made the reader allocate the 10^10-cell
// matrix and abort the daemon (std::bad_alloc); 10,000 allocated 1.6 GB before refusing. The count
// is capped before anything is allocated; a whole matrix at the cap still reads.
TEST(TopologyText, AHeaderNamingMoreGpusThanTheCapIsRefusedBeforeAllocating) {
  for (int n : {kMaxTopologyGpus + 1, 10000, 100000}) {
    std::string text;
    for (int i = 0; i < n; ++i) text += "\tGPU" + std::to_string(i);
    text += "\tCPU Affinity\nGPU0\t X \n";
    auto t = parse_nvidia_smi_topo(text, "huge.txt");
    ASSERT_FALSE(t.ok()) << n;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("huge.txt:1: the header names more than 64 GPUs"));
  }
  std::string text;
  for (int i = 0; i < kMaxTopologyGpus; ++i) text += "\tGPU" + std::to_string(i);
  text += "\n";
  for (int i = 0; i < kMaxTopologyGpus; ++i) {
    text += "GPU" + std::to_string(i);
    for (int j = 0; j < kMaxTopologyGpus; ++j) text += i == j ? "\t X " : "\tSYS";
    text += "\n";
  }
  auto t = parse_nvidia_smi_topo(text, "64.txt");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->size(), kMaxTopologyGpus);
}

// Issue 39 item 2: a FIFO as model.topology wedged the daemon's reload (and plan, doctor) in open().
TEST(TopologyText, AFifoOrADeviceIsRefusedAtOnce) {
  char tmpl[] = "/tmp/sx_topology_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string fifo = std::string(tmpl) + "/topo.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { return read_nvidia_smi_topo(fifo); });
  if (read.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) {
    ADD_FAILURE() << "still blocked after 5 s on " << fifo;
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  const auto t = read.get();
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "topology " + fifo + ": not a regular file (a FIFO)");
  ::unlink(fifo.c_str());
  ::rmdir(tmpl);
  const auto dev = read_nvidia_smi_topo("/dev/zero");
  ASSERT_FALSE(dev.ok());
  EXPECT_THAT(dev.status().message(), HasSubstr("not a regular file (a character device)"));
}

}  // namespace
}  // namespace sx::hal
