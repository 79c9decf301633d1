// Which CPU kernels run (issue 23): the kernel units (kernel_table.h) are compiled once per ISA
// level; at start-up the best level this machine and its OS support is chosen, or the one
// SEXTANT_CPU_ISA names (refused when the machine lacks it).
//
// Levels, best first (x86-64; elsewhere only "baseline"):
//   amx          avx512-bf16 + AMX-TILE/INT8 with the OS's permission (arch_prctl(ARCH_REQ_XCOMP_PERM)):
//                its kernels, with the int8 GEMM of Q8_0-valued weights from 8 tokens up on the tiles
//                (gemm_q8_0_amx.cpp); only where the compiler knows AMX
//   avx512-bf16  avx512-vnni + AVX512_BF16
//   avx512-vnni  avx512 + AVX512_VNNI (vpdpbusd on 256-bit registers for the int8 kernels)
//   avx512       AVX-512 F/BW/VL/DQ on top of avx2, the OS saving ZMM/opmask state (XCR0 bits 5-7)
//   avx-vnni     avx2 + AVX-VNNI (the VEX vpdpbusd of AVX2-only machines such as Alder Lake)
//   avx2         AVX2 + FMA + F16C, the OS saving YMM state (XCR0 bits 1-2)
//   baseline     the compiler's default target (x86-64), scalar kernels
// AMX present but not permitted (or not built) is reported in the choice's note.
// A build with -Dcpu_march=... compiles everything for that target and has one level, "native".
//
// Threading: detection and the choice happen once (the first call, thread-safe); afterwards every
// function is a read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::cpu {

// What CPUID and XGETBV say (the OS's enabled state folded in: a feature whose register state the
// OS does not save reads as absent).
struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;  // CPUID and XCR0 (tile state)
  bool amx_permitted = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded
  std::string model;           // the processor's brand string ("" where unknown)
};

// This machine's features (CPUID leaves 1, 7.0, 7.1, 0x80000002-4; XGETBV; arch_prctl for AMX).
const CpuFeatures& detected_features();

// Every level this build has, best first (see above).
std::vector<std::string_view> isa_levels();
// Whether `f` has what level `name` needs (false for an unknown name).
bool isa_supported(std::string_view name, const CpuFeatures& f);

struct IsaChoice {
  std::string level;                   // the kernels in use
  std::vector<std::string> available;  // the levels built and supported here, best first
  std::string forced;                  // SEXTANT_CPU_ISA as given ("" when unset)
  std::string note;                    // e.g. "amx present but not permitted by the OS"
};
// The choice for features `f` and a SEXTANT_CPU_ISA value `forced` ("" or "auto": the best level):
// INVALID_ARGUMENT naming the variable and the levels there are when `forced` is not a level of
// this build or not supported by `f`. Pure: unit-tested with made-up feature sets.
Result<IsaChoice> choose_isa(const CpuFeatures& f, std::string_view forced);

// The process's choice (detected_features() and SEXTANT_CPU_ISA, made once). The CPU device calls it
// when it opens and fails with its error; kernels() exits with the error if it was not checked.
const Result<IsaChoice>& cpu_isa();
// "cpu: using avx512-vnni kernels (amx present but not permitted by the OS)", or the error.
std::string cpu_isa_line();

}  // namespace sx::cpu
