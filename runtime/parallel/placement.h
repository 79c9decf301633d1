// Topology-aware placement (issue 22 item 3): which devices form each TP group, in which rank
// order, and how many replicas, from the links between the GPUs (hal/topology.h).
//
// Candidates are every layout of `replicas` copies of a TP x PP group that the model fits
// (PlacementRequest::fits, from the shard and memory plans), each with its best grouping of the
// devices (every partition is tried; 16 devices at most) and, inside each TP group, the ring
// order whose neighbours share the best links. Layouts are compared by, in order:
//   1. the worst link inside any TP group, by tier: NVLink / PIX / PXB (a switch at most), then
//      PHB / NODE (through a CPU's root complex), then SYS (across sockets, the seed's NCCL hangs)
//      and unknown. A TP group never gets a SYS link when a fitting layout without one exists,
//      nor PHB / NODE when one without those exists. Pipeline boundaries may cross any link (they
//      carry one activation per token);
//   2. more devices used;
//   3. fewer pipeline stages (each adds a hop to every token);
//   4. fewer replicas (one group over all devices when its links are good, as vLLM's users run
//      it; replicas of smaller groups when they are not);
//   5. the weakest ring-neighbour link, then the sum of them.
// A layout given in part (tp, pp or replicas fixed) is completed the same way.
//
// Threading: pure functions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/topology.h"

namespace sx::parallel {

struct PlacementRequest {
  int devices = 0;   // GPUs 0 .. devices-1 of the topology take part (0: all of them)
  int tp = 0;        // 0: chosen
  int pp = 0;        // 0: chosen (1 or more)
  int replicas = 0;  // 0: chosen
  // Whether one replica of tp x pp ranks holds the model (and tp is a split the heads allow):
  // the shard and memory plans. Unset: every layout fits.
  std::function<bool(int tp, int pp)> fits;
};

// How good a layout's TP groups are (lower is better); see placement.h's rule 1.
enum class LinkTier { kSwitch = 0, kHostBridge = 1, kSocket = 2 };
LinkTier tier_of(const hal::Link& link);
const char* tier_words(LinkTier tier);

// The worst link between any two of `devices` (the lowest tier, then the lowest link_score) and its
// words, "SYS between GPU3 and GPU4"; kSwitch and "" for fewer than two devices.
struct WorstLink {
  LinkTier tier = LinkTier::kSwitch;
  std::string words;
};
WorstLink worst_link(const hal::Topology& topology, const std::vector<int>& devices);

struct Layout {
  int tp = 1, pp = 1, replicas = 1;
  // replicas x pp x tp device indices: groups[r * pp + s] is stage s of replica r, TP rank order.
  std::vector<std::vector<int>> groups;
  LinkTier worst = LinkTier::kSwitch;     // inside any TP group
  std::string worst_link;                 // "SYS between GPU3 and GPU4", "" when tp == 1
  int weakest_ring_score = 0, ring_score_sum = 0;
  int devices_used() const { return tp * pp * replicas; }
  // "3 replicas of TP 2 x PP 1: [0, 1] [2, 3] [4, 5]"
  std::string describe() const;
};

struct Placement {
  Layout chosen;
  std::string why;                // the reasons, for `sextant plan` and the start-up log
  bool has_alternative = false;   // the best layout of another shape
  Layout alternative;
  std::string alternative_cost;   // what it would cost instead
  int candidates = 0;             // fitting layouts compared
};

// INVALID_ARGUMENT when nothing fits (naming what was tried) or the request is inconsistent
// (tp x pp x replicas above the devices, a device count above the topology's).
Result<Placement> place(const hal::Topology& topology, const PlacementRequest& request);

}  // namespace sx::parallel
