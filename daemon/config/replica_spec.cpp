// model.replicas: parsing and the device groups it gives.
#include "daemon/config/replica_spec.h"

#include <cctype>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sx::daemon::config {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A non-negative integer of at most 9 digits, or -1.
int small_int(std::string_view s) {
  if (s.empty() || s.size() > 9) return -1;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

// "[[0, 1], [2, 3]]": a list of non-empty lists of device indexes.
Result<std::vector<std::vector<int>>> parse_groups(std::string_view text) {
  std::vector<std::vector<int>> groups;
  std::size_t i = 0;
  auto skip = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  auto bad = [&](std::string_view what) {
    return invalid_argument_error("expected device groups such as [[0, 1, 2], [3, 4, 5]], got \"{}\" ({} at "
                                  "character {})", text, what, i + 1);
  };
  // After an item: ',' (another follows: 0) or ']' (the list ends: 1), else -1.
  auto separator = [&] {
    skip();
    if (i < text.size() && (text[i] == ',' || text[i] == ']')) return text[i++] == ']' ? 1 : 0;
    return -1;
  };
  skip();
  if (i >= text.size() || text[i] != '[') return bad("no opening [");
  ++i;
  for (;;) {
    skip();
    if (i < text.size() && text[i] == ']' && groups.empty()) return bad("no group");
    if (i >= text.size() || text[i] != '[') return bad("a group must be a list such as [0, 1]");
    ++i;
    std::vector<int> group;
    for (;;) {
      skip();
      std::size_t j = i;
      while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      const int v = small_int(text.substr(i, j - i));
      if (v < 0) return bad("a device index must be a non-negative integer");
      group.push_back(v);
      i = j;
      const int sep = separator();
      if (sep < 0) return bad("expected , or ]");
      if (sep == 1) break;
    }
    groups.push_back(std::move(group));
    if (groups.size() > static_cast<std::size_t>(kMaxReplicas)) return bad(fmt::format("more than {} groups", kMaxReplicas));
    const int sep = separator();
    if (sep < 0) return bad("expected , or ]");
    if (sep == 1) break;
  }
  skip();
  if (i != text.size()) return bad("text after the closing ]");
  return groups;
}

}  // namespace

Result<ReplicaSpec> parse_replica_spec(std::string_view text) {
  const std::string_view t = trim(text);
  ReplicaSpec spec;
  if (t == "per-device") {
    spec.kind = ReplicaSpec::Kind::kPerDevice;
    return spec;
  }
  if (!t.empty() && t.front() == '[') {
    spec.kind = ReplicaSpec::Kind::kGroups;
    SX_ASSIGN_OR_RETURN(spec.groups, parse_groups(t));
    return spec;
  }
  const int n = small_int(t);
  if (n < 1 || n > kMaxReplicas) {
    return invalid_argument_error("expected a replica count from 1 to {}, per-device, or device groups such as "
                                  "[[0, 1, 2], [3, 4, 5]], got \"{}\"", kMaxReplicas, text);
  }
  spec.count = n;
  return spec;
}

std::string replica_spec_text(const ReplicaSpec& spec) {
  switch (spec.kind) {
    case ReplicaSpec::Kind::kCount: return std::to_string(spec.count);
    case ReplicaSpec::Kind::kPerDevice: return "per-device";
    case ReplicaSpec::Kind::kGroups: {
      std::vector<std::string> groups;
      for (const auto& g : spec.groups) groups.push_back(fmt::format("[{}]", fmt::join(g, ", ")));
      return fmt::format("[{}]", fmt::join(groups, ", "));
    }
  }
  return "?";
}

Result<std::vector<std::vector<int>>> replica_device_groups(const ReplicaSpec& spec, int ranks, int available,
                                                            std::span<const std::int64_t> devices) {
  // The devices replicas are cut from, in order.
  std::vector<int> pool;
  if (devices.empty()) {
    for (int i = 0; i < available; ++i) pool.push_back(i);
  } else {
    for (std::int64_t d : devices) pool.push_back(static_cast<int>(d));
  }
  std::vector<std::vector<int>> groups;
  switch (spec.kind) {
    case ReplicaSpec::Kind::kCount: {
      const std::size_t need = static_cast<std::size_t>(spec.count) * static_cast<std::size_t>(ranks);
      if (need > pool.size()) {
        return invalid_argument_error("{} replicas of {} device(s) each need {} devices but {} {} ({} replica(s) of "
                                      "this layout fit)", spec.count, ranks, need, pool.size(),
                                      devices.empty() ? "are available" : "are listed in model.devices",
                                      pool.size() / static_cast<std::size_t>(ranks));
      }
      for (int r = 0; r < spec.count; ++r) {
        groups.emplace_back(pool.begin() + r * ranks, pool.begin() + (r + 1) * ranks);
      }
      break;
    }
    case ReplicaSpec::Kind::kPerDevice:
      if (ranks != 1) {
        return invalid_argument_error("per-device replicas run on one device each, but tp x pp is {}: set tp and pp "
                                      "to 1, or give a replica count or device groups", ranks);
      }
      for (int d : pool) groups.push_back({d});
      break;
    case ReplicaSpec::Kind::kGroups:
      for (std::size_t r = 0; r < spec.groups.size(); ++r) {
        if (spec.groups[r].size() != static_cast<std::size_t>(ranks)) {
          return invalid_argument_error("group {} ({}) has {} device(s) but each replica needs tp x pp = {}", r,
                                        fmt::format("[{}]", fmt::join(spec.groups[r], ", ")), spec.groups[r].size(),
                                        ranks);
        }
        groups.push_back(spec.groups[r]);
      }
      break;
  }
  std::set<int> seen;
  for (const auto& g : groups) {
    for (int d : g) {
      if (d >= available) {
        return invalid_argument_error("device {} is not among the backend's {} device(s) (0 .. {})", d, available,
                                      available - 1);
      }
      if (!seen.insert(d).second) return invalid_argument_error("device {} is in two replicas", d);
    }
  }
  if (groups.empty()) return invalid_argument_error("no replica: the backend lists no device");
  return groups;
}

}  // namespace sx::daemon::config
