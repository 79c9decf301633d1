// CPU feature detection and the choice of kernel level (isa.h). Compiled for the baseline target.
#include "backends/cpu/kernels/isa.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include <fmt/format.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace sx::cpu {

namespace {

#if defined(SX_CPU_ISA_NATIVE)
constexpr bool kX86Variants = false;
#elif defined(SX_CPU_ISA_VARIANTS)
constexpr bool kX86Variants = true;
#else
constexpr bool kX86Variants = false;
#endif

#if defined(__x86_64__) || defined(__i386__)
std::uint64_t xgetbv0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  unsigned ext = __get_cpuid_max(0x80000000u, nullptr);
  if (ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    f.model = brand;
    while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
    while (!f.model.empty() && f.model.front() == ' ') f.model.erase(f.model.begin());
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const std::uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_os = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm_os = ymm_os && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM hi256, hi16 ZMM
  const bool tile_os = (xcr0 & (3ull << 17)) == (3ull << 17);  // XTILECFG, XTILEDATA
  f.avx = ymm_os && ((c >> 28) & 1);
  f.fma = f.avx && ((c >> 12) & 1);
  f.f16c = f.avx && ((c >> 29) & 1);
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned max_sub = a;
  f.avx2 = f.avx && ((b >> 5) & 1);
  f.avx512f = zmm_os && ((b >> 16) & 1);
  f.avx512dq = f.avx512f && ((b >> 17) & 1);
  f.avx512bw = f.avx512f && ((b >> 30) & 1);
  f.avx512vl = f.avx512f && ((b >> 31) & 1);
  f.avx512vnni = f.avx512f && ((c >> 11) & 1);
  f.amx_bf16 = tile_os && ((d >> 22) & 1);
  f.amx_tile = tile_os && ((d >> 24) & 1);
  f.amx_int8 = tile_os && ((d >> 25) & 1);
  if (max_sub >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = f.avx2 && ((a >> 4) & 1);
    f.avx512bf16 = f.avx512f && ((a >> 5) & 1);
  }
#if defined(__linux__) && defined(SYS_arch_prctl)
  if (f.amx_tile) {
    constexpr int kArchReqXcompPerm = 0x1023;  // asm/prctl.h
    constexpr unsigned long kXfeatureXtiledata = 18;
    f.amx_permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
#endif
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

constexpr std::string_view kLevels[] = {
#if defined(SX_CPU_ISA_AMX)
    "amx",
#endif
    "avx512-bf16", "avx512-vnni", "avx512", "avx-vnni", "avx2", "baseline"};

#if defined(SX_CPU_ISA_NATIVE)
constexpr std::string_view kOnlyLevel = "native";
#else
constexpr std::string_view kOnlyLevel = "baseline";
#endif

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const CpuFeatures& detected_features() {
  static const CpuFeatures f = detect();
  return f;
}

std::vector<std::string_view> isa_levels() {
  if (!kX86Variants) return {kOnlyLevel};
  return {std::begin(kLevels), std::end(kLevels)};
}

bool isa_supported(std::string_view name, const CpuFeatures& f) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  if (name == "baseline" || name == "native") return true;
  if (name == "avx2") return avx2;
  if (name == "avx-vnni") return avx2 && f.avxvnni;
  if (name == "avx512") return avx512;
  if (name == "avx512-vnni") return avx512 && f.avx512vnni;
  if (name == "avx512-bf16") return avx512 && f.avx512vnni && f.avx512bf16;
  if (name == "amx") return isa_supported("avx512-bf16", f) && f.amx_tile && f.amx_int8 && f.amx_permitted;
  return false;
}

Result<IsaChoice> choose_isa(const CpuFeatures& f, std::string_view forced) {
  IsaChoice c;
  c.forced = std::string(forced);
  const std::vector<std::string_view> levels = isa_levels();
  for (const std::string_view l : levels) {
    if (isa_supported(l, f)) c.available.emplace_back(l);
  }
  if (f.amx_tile && !f.amx_permitted) {
    c.note = "amx present but not permitted by the OS";
  } else if (isa_supported("amx", f) && std::find(levels.begin(), levels.end(), "amx") == levels.end()) {
    c.note = "amx present and permitted; no amx kernels in this build";
  }
  if (forced.empty() || forced == "auto") {
    c.level = c.available.front();  // baseline (or native) is always there
    return c;
  }
  bool known = false;
  for (const std::string_view l : levels) known = known || l == forced;
  for (const std::string& a : c.available) {
    if (a == forced) {
      c.level = a;
      return c;
    }
  }
  std::string all;
  for (const std::string_view l : levels) all += (all.empty() ? "" : ", ") + std::string(l);
  if (!known) {
    return invalid_argument_error("SEXTANT_CPU_ISA={}: not a kernel level of this build (levels: {}; or auto)",
                                  forced, all);
  }
  return invalid_argument_error(
      "SEXTANT_CPU_ISA={}: this machine{} lacks what the {} kernels need; it can run: {} (unset the variable "
      "or name one of those)",
      forced, f.model.empty() ? "" : " (" + f.model + ")", forced, join(c.available));
}

const Result<IsaChoice>& cpu_isa() {
  static const Result<IsaChoice> choice = [] {
    const char* env = std::getenv("SEXTANT_CPU_ISA");
    return choose_isa(detected_features(), env != nullptr ? env : "");
  }();
  return choice;
}

std::string cpu_isa_line() {
  const Result<IsaChoice>& c = cpu_isa();
  if (!c.ok()) return "cpu: " + c.status().message();
  std::string why = c->forced.empty() || c->forced == "auto" ? "" : "forced by SEXTANT_CPU_ISA";
  if (!c->note.empty()) why += (why.empty() ? "" : "; ") + c->note;
  return fmt::format("cpu: using {} kernels{}", c->level, why.empty() ? "" : " (" + why + ")");
}

}  // namespace sx::cpu
