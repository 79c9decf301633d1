// GPU link facts (topology.h).
#include "runtime/hal/topology.h"

#include <algorithm>

#include <fmt/format.h>

namespace sx::hal {

Topology make_topology(int n, std::string source) {
  Topology t;
  t.source = std::move(source);
  for (int i = 0; i < n; ++i) t.gpus.push_back(fmt::format("GPU{}", i));
  t.links.assign(static_cast<std::size_t>(n) * static_cast<std::size_t>(n), Link{});
  for (int i = 0; i < n; ++i) t.link(i, i).kind = LinkKind::kSelf;
  return t;
}

std::string link_letters(const Link& link) {
  switch (link.kind) {
    case LinkKind::kSelf: return "X";
    case LinkKind::kNvLink: return fmt::format("NV{}", link.nvlinks);
    case LinkKind::kPix: return "PIX";
    case LinkKind::kPxb: return "PXB";
    case LinkKind::kPhb: return "PHB";
    case LinkKind::kNode: return "NODE";
    case LinkKind::kSys: return "SYS";
    case LinkKind::kUnknown: break;
  }
  return "?";
}

int link_score(const Link& link) {
  switch (link.kind) {
    case LinkKind::kSelf: return 1000;
    case LinkKind::kNvLink: return 100 + std::min(link.nvlinks, 99);
    case LinkKind::kPix: return 50;
    case LinkKind::kPxb: return 40;
    case LinkKind::kPhb: return 30;
    case LinkKind::kNode: return 20;
    case LinkKind::kSys: return 10;
    case LinkKind::kUnknown: break;
  }
  return 0;
}

std::string format_topology(const Topology& t) {
  const int n = t.size();
  std::size_t w = 5;
  for (const std::string& g : t.gpus) w = std::max(w, g.size() + 1);
  std::string out = fmt::format("{:<{}}", "", w);
  for (int j = 0; j < n; ++j) out += fmt::format("{:<{}}", t.gpus[static_cast<std::size_t>(j)], w);
  const bool cpu = !t.cpu_affinity.empty(), numa = !t.numa_affinity.empty();
  if (cpu) out += "CPU Affinity   ";
  if (numa) out += "NUMA Affinity";
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  bool used[8] = {};
  for (int i = 0; i < n; ++i) {
    std::string row = fmt::format("{:<{}}", t.gpus[static_cast<std::size_t>(i)], w);
    for (int j = 0; j < n; ++j) {
      row += fmt::format("{:<{}}", link_letters(t.link(i, j)), w);
      used[static_cast<int>(t.link(i, j).kind)] = true;
    }
    if (cpu) row += fmt::format("{:<15}", t.cpu_affinity[static_cast<std::size_t>(i)]);
    if (numa) row += t.numa_affinity[static_cast<std::size_t>(i)];
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + '\n';
  }
  std::string peers;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const Link& l = t.link(i, j);
      if (l.peer_access < 0) continue;
      peers += fmt::format("{}{}-{}: {}", peers.empty() ? "" : "; ", i, j,
                           l.peer_access == 1 ? (l.p2p_rank >= 0 ? fmt::format("peer access, P2P rank {}", l.p2p_rank)
                                                                 : std::string("peer access"))
                                              : std::string("no peer access"));
    }
  }
  if (!peers.empty()) out += "Peer access: " + peers + '\n';
  static constexpr const char* kLegend[] = {
      "X    = self",
      "NV#  = NVLink, # links",
      "PIX  = at most one PCIe switch",
      "PXB  = several PCIe switches, no host bridge",
      "PHB  = through a PCIe host bridge (a CPU)",
      "NODE = between host bridges of one NUMA node",
      "SYS  = across NUMA nodes (QPI/UPI, Infinity Fabric)",
      "?    = not known",
  };
  out += "Legend:";
  for (int k = 1; k < 8; ++k) {
    if (used[k]) out += fmt::format("\n  {}", kLegend[k]);
  }
  out += '\n';
  if (!t.source.empty()) out += fmt::format("(from {})\n", t.source);
  return out;
}

}  // namespace sx::hal
