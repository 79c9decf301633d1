// model.replicas (and --replicas): how many engines serve the model and on which devices.
//
//   "1" (default)        one replica on the first tp x pp devices (or model.devices)
//   "N"                  N replicas: the devices (model.devices, or the backend's first N x tp x pp)
//                        split into N equal groups in order, each its own tp x pp layout
//   "per-device"         one replica per device (model.devices, or every device the backend lists),
//                        for models that fit one device (tp = pp = 1)
//   "[[0,1,2],[3,4,5]]"  explicit device groups, one replica each, each of tp x pp devices
//
// Pure logic, unit-tested (tests/unit/daemon_config). Errors are INVALID_ARGUMENT whose message
// names what is wrong but not the key (the caller prefixes "model.replicas: ").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::daemon::config {

struct ReplicaSpec {
  enum class Kind { kCount, kPerDevice, kGroups };
  Kind kind = Kind::kCount;
  int count = 1;                         // kCount
  std::vector<std::vector<int>> groups;  // kGroups
  bool operator==(const ReplicaSpec&) const = default;
};

inline constexpr int kMaxReplicas = 64;

Result<ReplicaSpec> parse_replica_spec(std::string_view text);

// The canonical text: "2", "per-device", "[[0, 1, 2], [3, 4, 5]]".
std::string replica_spec_text(const ReplicaSpec& spec);

// The device indexes of each replica's ranks, rank order. `ranks` = tp x pp of one replica;
// `available` = the devices the backend lists; `devices` = model.devices (empty: 0, 1, ... in
// order). Refuses groups of the wrong size, a device used twice or not listed by the backend, and
// more devices than there are, saying what would fit.
Result<std::vector<std::vector<int>>> replica_device_groups(const ReplicaSpec& spec, int ranks, int available,
                                                            std::span<const std::int64_t> devices);

}  // namespace sx::daemon::config
