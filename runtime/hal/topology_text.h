// A saved `nvidia-smi topo -m` as a Topology (topology.h; issue 22 item 2), so that placement,
// `sextant plan --topology FILE` and `sextant doctor` run on real machines' matrices without
// their GPUs. The text exactly as that command prints it (tabs or runs of spaces between cells;
// its colour escapes, NIC rows and columns, the CPU / NUMA affinity and GPU NUMA ID columns, the
// legends): the GPU x GPU links, each GPU's CPU and NUMA affinity. Older letters are accepted
// (SOC = SYS, CPU = PHB).
//
// Errors (INVALID_ARGUMENT) name `source` and the line: no header with GPU0, a row whose cells do
// not match the header, an unknown link, a diagonal that is not X, or a matrix that is not
// symmetric, or a header naming more than kMaxTopologyGpus GPUs. Memory stays linear in the text:
// the matrix is allocated only for a GPU count within the cap.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/base/status.h"
#include "runtime/hal/topology.h"

namespace sx::hal {

// The most GPUs a saved matrix may name: more than any one machine holds (NVSwitch systems show
// 8-16), and a bound on the N x N matrix a hostile header could make the reader allocate.
inline constexpr int kMaxTopologyGpus = 64;
// The most bytes of a saved matrix (an 8-GPU one with NICs is about 2 KiB).
inline constexpr std::uint64_t kMaxTopologyBytes = std::uint64_t{1} << 20;

Result<Topology> parse_nvidia_smi_topo(std::string_view text, const std::string& source);
// The file at `path`: a regular file (a FIFO or a device is refused at once, never waited on) of
// at most kMaxTopologyBytes, parsed with the path as source.
Result<Topology> read_nvidia_smi_topo(const std::string& path);

}  // namespace sx::hal
