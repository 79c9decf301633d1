// The links between the GPUs, as the CUDA module reads them (issue 21 item 5): NVML's common
// ancestor per pair (PIX / PXB / PHB / NODE / SYS) and NVLink counts (active links whose remote
// end is the other GPU, or NVSwitch on both), the CUDA runtime's peer access and P2P performance
// rank, and each GPU's CPU list and NUMA node from sysfs. Without NVML the link kinds stay
// unknown and the source says why.
#pragma once

#include <vector>

#include "backends/cuda/device_order.h"
#include "runtime/hal/registry.h"
#include "runtime/hal/topology.h"

namespace sx::cuda {

// `gpus` in PCI order (GPU i of the result is gpus[i]).
hal::Topology gather_topology(const std::vector<GpuIdentity>& gpus);
// Each GPU's PCIe link now against its maximum (NVML): a narrower link than the card and slot
// allow is a warning (a card stuck at x4 explains NCCL time-outs); a lower generation is reported
// but fine at idle (links train down to save power). Empty without NVML.
std::vector<hal::MachineCheck> pcie_checks(const std::vector<GpuIdentity>& gpus);

}  // namespace sx::cuda
