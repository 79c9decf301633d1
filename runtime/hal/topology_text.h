// A saved `nvidia-smi topo -m` as a Topology (topology.h; issue 22 item 2), so that placement,
// `sextant plan --topology FILE` and `sextant doctor` run on real machines' matrices without
// their GPUs. The text exactly as that command prints it (tabs or runs of spaces between cells;
// its colour escapes, NIC rows and columns, the CPU / NUMA affinity and GPU NUMA ID columns, the
// legends): the GPU x GPU links, each GPU's CPU and NUMA affinity. Older letters are accepted
// (SOC = SYS, CPU = PHB).
//
// Errors (INVALID_ARGUMENT) name `source` and the line: no header with GPU0, a row whose cells do
// not match the header, an unknown link, a diagonal that is not X, or a matrix that is not
// symmetric.
#pragma once

#include <string>
#include <string_view>

#include "runtime/base/status.h"
#include "runtime/hal/topology.h"

namespace sx::hal {

Result<Topology> parse_nvidia_smi_topo(std::string_view text, const std::string& source);
// The file at `path`, at most 1 MiB (parse_nvidia_smi_topo with the path as source).
Result<Topology> read_nvidia_smi_topo(const std::string& path);

}  // namespace sx::hal
