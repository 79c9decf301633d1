// What joins a machine's GPUs (issue 21 item 5; issue 22 item 2): one structure for every
// topology fact, filled by a backend at run time (the CUDA backend from NVML and the CUDA runtime:
// Backend::topology) or, for planning and tests without GPUs, from a saved `nvidia-smi topo -m`
// (topology_text.h), and printed in that command's letters:
//   X     the GPU itself
//   NV#   NVLink, # links (directly or through NVSwitch)
//   PIX   at most one PCIe switch between them
//   PXB   several PCIe switches, no host bridge
//   PHB   through a PCIe host bridge (a CPU's root complex)
//   NODE  between host bridges of one NUMA node
//   SYS   across NUMA nodes (the SMP interconnect: QPI/UPI, Infinity Fabric)
// Placement (issue 22) and NCCL's behaviour depend on these: a SYS link inside a TP group is the
// seed's "NCCL hangs on PCIe" box.
//
// Threading: a plain value.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sx::hal {

enum class LinkKind { kSelf, kNvLink, kPix, kPxb, kPhb, kNode, kSys, kUnknown };

struct Link {
  LinkKind kind = LinkKind::kUnknown;
  int nvlinks = 0;       // the number of NVLinks (kNvLink)
  int peer_access = -1;  // cudaDeviceCanAccessPeer: 1 yes, 0 no, -1 not known
  int p2p_rank = -1;     // cudaDevP2PAttrPerformanceRank (0 best), -1 not known
};

struct Topology {
  std::vector<std::string> gpus;           // names in index order ("GPU0", or the device's name)
  std::vector<Link> links;                 // gpus.size() x gpus.size(), row-major; [i][i] is kSelf
  std::vector<std::string> cpu_affinity;   // per GPU ("0-31,64-95"), empty when not known
  std::vector<std::string> numa_affinity;  // per GPU ("0"), empty when not known
  std::string source;                      // where the facts came from ("NVML", a file name)

  int size() const { return static_cast<int>(gpus.size()); }
  const Link& link(int i, int j) const { return links[static_cast<std::size_t>(i * size() + j)]; }
  Link& link(int i, int j) { return links[static_cast<std::size_t>(i * size() + j)]; }
};

// `n` GPUs named GPU0.., every link unknown but the diagonal.
Topology make_topology(int n, std::string source);
// "X", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS", "?".
std::string link_letters(const Link& link);
// How good a link is for collectives (higher is better): NVLink by link count above every PCIe
// kind, then PIX > PXB > PHB > NODE > SYS > unknown.
int link_score(const Link& link);
// The matrix in nvidia-smi's letters with the CPU / NUMA affinity columns, then peer access and
// P2P rank where known, then the legend of the letters used.
std::string format_topology(const Topology& topology);

}  // namespace sx::hal
