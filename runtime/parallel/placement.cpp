// Topology-aware placement (placement.h).
#include "runtime/parallel/placement.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sx::parallel {

namespace {

constexpr int kMaxExhaustiveDevices = 12;

// The best ring of `devs`: the order whose weakest neighbour link is best, then the best sum.
struct Ring {
  std::vector<int> order;
  int weakest = 0, sum = 0;
};
Ring best_ring(const hal::Topology& t, std::vector<int> devs) {
  Ring best;
  std::sort(devs.begin(), devs.end());
  if (devs.size() <= 1) return {devs, hal::link_score(hal::Link{hal::LinkKind::kSelf}), 0};
  best.weakest = -1;
  const std::size_t k = devs.size();
  do {
    int weakest = 1 << 30, sum = 0;
    const std::size_t edges = k == 2 ? 1 : k;
    for (std::size_t i = 0; i < edges; ++i) {
      const int s = hal::link_score(t.link(devs[i], devs[(i + 1) % k]));
      weakest = std::min(weakest, s);
      sum += s;
    }
    if (weakest > best.weakest || (weakest == best.weakest && sum > best.sum)) best = {devs, weakest, sum};
  } while (std::next_permutation(devs.begin() + 1, devs.end()));  // rotations are the same ring
  return best;
}


// Better layouts first (placement.h's order).
auto rank_key(const Layout& l) {
  return std::make_tuple(static_cast<int>(l.worst), -l.devices_used(), l.pp, l.replicas, -l.weakest_ring_score,
                         -l.ring_score_sum);
}

// The best grouping of `pool` into groups of `tp` (all of them used).
struct Grouping {
  std::vector<std::vector<int>> groups;
  LinkTier worst = LinkTier::kSwitch;
  std::string worst_link;
  int weakest = 1 << 30, sum = 0;
  bool valid = false;
};
bool better(const Grouping& a, const Grouping& b) {
  if (!b.valid) return a.valid;
  return std::make_tuple(static_cast<int>(a.worst), -a.weakest, -a.sum) <
         std::make_tuple(static_cast<int>(b.worst), -b.weakest, -b.sum);
}

void partitions(const hal::Topology& t, std::vector<int>& rest, int tp, Grouping& current, Grouping& best) {
  if (rest.empty()) {
    if (better(current, best)) best = current;
    return;
  }
  // The smallest device left starts the next group; choose its tp - 1 companions.
  const int first = rest.front();
  const std::vector<int> others(rest.begin() + 1, rest.end());
  std::vector<bool> pick(others.size(), false);
  std::fill(pick.begin(), pick.begin() + (tp - 1), true);
  do {
    std::vector<int> group{first}, left;
    for (std::size_t i = 0; i < others.size(); ++i) (pick[i] ? group : left).push_back(others[i]);
    const Ring ring = best_ring(t, group);
    auto [tier, words] = worst_link(t, group);
    Grouping next = current;
    next.groups.push_back(ring.order);
    if (tier > next.worst || (tier == next.worst && next.worst_link.empty())) {
      next.worst = tier;
      next.worst_link = words;
    }
    next.weakest = std::min(next.weakest, ring.weakest);
    next.sum += ring.sum;
    next.valid = true;
    // Prune: a partial grouping already worse in tier than the best complete one.
    if (!best.valid || next.worst <= best.worst) partitions(t, left, tp, next, best);
  } while (std::prev_permutation(pick.begin(), pick.end()));
}

// The best grouping of `count` of the devices 0..n-1 into groups of `tp`.
Grouping best_grouping(const hal::Topology& t, int n, int count, int tp) {
  Grouping best;
  std::vector<bool> use(static_cast<std::size_t>(n), false);
  std::fill(use.begin(), use.begin() + count, true);
  do {
    std::vector<int> pool;
    for (int i = 0; i < n; ++i) {
      if (use[static_cast<std::size_t>(i)]) pool.push_back(i);
    }
    Grouping current;
    current.valid = true;
    partitions(t, pool, tp, current, best);
  } while (std::prev_permutation(use.begin(), use.end()));
  return best;
}

// Without trying every partition (many devices): groups of consecutive devices.
Grouping consecutive_grouping(const hal::Topology& t, int count, int tp) {
  Grouping g;
  g.valid = true;
  for (int start = 0; start < count; start += tp) {
    std::vector<int> devs(static_cast<std::size_t>(tp));
    std::iota(devs.begin(), devs.end(), start);
    const Ring ring = best_ring(t, devs);
    auto [tier, words] = worst_link(t, devs);
    if (tier > g.worst || (tier == g.worst && g.worst_link.empty())) {
      g.worst = tier;
      g.worst_link = words;
    }
    g.groups.push_back(ring.order);
    g.weakest = std::min(g.weakest, ring.weakest);
    g.sum += ring.sum;
  }
  return g;
}

std::string layout_shape(const Layout& l) {
  std::string s = l.pp > 1 ? fmt::format("TP {} x PP {}", l.tp, l.pp) : fmt::format("TP {}", l.tp);
  return l.replicas > 1 ? fmt::format("{} replicas of {}", l.replicas, s) : s;
}

std::string tier_cost(const Layout& l) {
  if (l.tp == 1) return "no links inside a group (no tensor parallelism)";
  switch (l.worst) {
    case LinkTier::kSwitch:
      return fmt::format("every TP link through a PCIe switch or NVLink at worst ({})", l.worst_link);
    case LinkTier::kHostBridge:
      return fmt::format("TP traffic through a CPU's root complex ({})", l.worst_link);
    case LinkTier::kSocket:
      return fmt::format("TP traffic across CPU sockets ({}): all-reduces over the SMP interconnect, slow and where "
                         "NCCL hangs or times out on PCIe boxes",
                         l.worst_link);
  }
  return "";
}

}  // namespace

LinkTier tier_of(const hal::Link& link) {
  switch (link.kind) {
    case hal::LinkKind::kSelf:
    case hal::LinkKind::kNvLink:
    case hal::LinkKind::kPix:
    case hal::LinkKind::kPxb:
      return LinkTier::kSwitch;
    case hal::LinkKind::kPhb:
    case hal::LinkKind::kNode:
      return LinkTier::kHostBridge;
    case hal::LinkKind::kSys:
    case hal::LinkKind::kUnknown:
      break;
  }
  return LinkTier::kSocket;
}

const char* tier_words(LinkTier tier) {
  switch (tier) {
    case LinkTier::kSwitch: return "NVLink or a PCIe switch";
    case LinkTier::kHostBridge: return "a CPU's PCIe root complex (PHB / NODE)";
    case LinkTier::kSocket: return "across CPU sockets (SYS) or unknown";
  }
  return "";
}

WorstLink worst_link(const hal::Topology& t, const std::vector<int>& devs) {
  LinkTier worst = LinkTier::kSwitch;
  int worst_score = 1 << 30;
  std::string words;
  for (std::size_t i = 0; i < devs.size(); ++i) {
    for (std::size_t j = i + 1; j < devs.size(); ++j) {
      const hal::Link& l = t.link(devs[i], devs[j]);
      const LinkTier tier = tier_of(l);
      const int s = hal::link_score(l);
      if (tier > worst || (tier == worst && s < worst_score)) {
        worst = tier;
        worst_score = s;
        words = fmt::format("{} between {} and {}", hal::link_letters(l), t.gpus[static_cast<std::size_t>(devs[i])],
                            t.gpus[static_cast<std::size_t>(devs[j])]);
      }
    }
  }
  return {worst, words};
}

std::string Layout::describe() const {
  std::vector<std::string> parts;
  for (const auto& g : groups) parts.push_back(fmt::format("[{}]", fmt::join(g, ", ")));
  return fmt::format("{}: {}", layout_shape(*this), fmt::join(parts, " "));
}

Result<Placement> place(const hal::Topology& topology, const PlacementRequest& request) {
  const int n = request.devices > 0 ? request.devices : topology.size();
  if (n < 1) return invalid_argument_error("placement: the topology has no GPU");
  if (n > topology.size()) {
    return invalid_argument_error("placement: {} devices asked for, the topology ({}) has {}", n, topology.source,
                                  topology.size());
  }
  if (request.tp < 0 || request.pp < 0 || request.replicas < 0) {
    return invalid_argument_error("placement: tp, pp and replicas must be positive (or 0: chosen)");
  }
  const auto fixed_product = static_cast<long long>(std::max(request.tp, 1)) * std::max(request.pp, 1) *
                             std::max(request.replicas, 1);
  if (fixed_product > n) {
    return invalid_argument_error("placement: tp {} x pp {} x replicas {} needs {} devices; {} are given",
                                  std::max(request.tp, 1), std::max(request.pp, 1), std::max(request.replicas, 1),
                                  fixed_product, n);
  }
  std::vector<Layout> layouts;
  std::vector<std::string> refused;
  for (int tp = 1; tp <= n; ++tp) {
    if (request.tp > 0 && tp != request.tp) continue;
    for (int pp = 1; tp * pp <= n; ++pp) {
      if (request.pp > 0 && pp != request.pp) continue;
      if (request.fits && !request.fits(tp, pp)) {
        refused.push_back(fmt::format("TP {} x PP {}", tp, pp));
        continue;
      }
      for (int r = 1; r * tp * pp <= n; ++r) {
        if (request.replicas > 0 && r != request.replicas) continue;
        // With nothing fixed but what fits, use as many devices as the shape can (fewer only when
        // the replica count is given).
        if (request.replicas == 0 && (r + 1) * tp * pp <= n) continue;
        const int count = r * tp * pp;
        const Grouping g =
            n <= kMaxExhaustiveDevices ? best_grouping(topology, n, count, tp) : consecutive_grouping(topology, count, tp);
        Layout l;
        l.tp = tp;
        l.pp = pp;
        l.replicas = r;
        l.groups = g.groups;
        l.worst = tp > 1 ? g.worst : LinkTier::kSwitch;
        l.worst_link = tp > 1 ? g.worst_link : "";
        l.weakest_ring_score = g.weakest;
        l.ring_score_sum = g.sum;
        layouts.push_back(std::move(l));
      }
    }
  }
  if (layouts.empty()) {
    return invalid_argument_error("placement: no layout of {} devices holds the model (tried {})", n,
                                  refused.empty() ? std::string("none") : fmt::format("{}", fmt::join(refused, ", ")));
  }
  std::stable_sort(layouts.begin(), layouts.end(), [](const Layout& a, const Layout& b) { return rank_key(a) < rank_key(b); });
  Placement p;
  p.candidates = static_cast<int>(layouts.size());
  p.chosen = layouts.front();
  const Layout& c = p.chosen;
  p.why = fmt::format("{} on {} of {} devices; {}", layout_shape(c), c.devices_used(), n, tier_cost(c));
  if (c.pp > 1) p.why += "; pipeline stages may cross any link (one activation per token crosses them)";
  // The alternative to explain: one group over everything when that was not chosen, else the
  // runner-up of another shape.
  const Layout* alt = nullptr;
  for (const Layout& l : layouts) {
    if (l.replicas == 1 && l.pp == 1 && l.devices_used() == n && (l.tp != c.tp || l.pp != c.pp || l.replicas != c.replicas)) {
      alt = &l;
      break;
    }
  }
  for (std::size_t i = 1; alt == nullptr && i < layouts.size(); ++i) {
    const Layout& l = layouts[i];
    if (l.tp != c.tp || l.pp != c.pp || l.replicas != c.replicas) alt = &l;
  }
  if (alt != nullptr) {
    p.has_alternative = true;
    p.alternative = *alt;
    std::string reason;
    if (alt->worst > c.worst) {
      reason = tier_cost(*alt);
    } else if (alt->devices_used() < c.devices_used()) {
      reason = fmt::format("uses {} of the {} devices", alt->devices_used(), n);
    } else if (alt->pp > c.pp) {
      reason = fmt::format("{} pipeline stages, a hop more for every token", alt->pp);
    } else if (alt->replicas > c.replicas) {
      reason = fmt::format("{} engines, each holding the model (more memory for weights, less for the KV cache)",
                           alt->replicas);
    } else {
      reason = fmt::format("weaker ring neighbours ({})", tier_cost(*alt));
    }
    p.alternative_cost = reason;
  }
  return p;
}

}  // namespace sx::parallel
