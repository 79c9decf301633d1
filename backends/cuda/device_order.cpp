// Which GPUs the CUDA backend sees and in what order (device_order.h): PCI bus id parsing, the
// PCI-order sort that gives Sextant's device numbers, the one-line device descriptions, and the
// CUDA runtime's reading of CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER.
//
// Pure host code: no CUDA headers, no environment reads (callers pass the variables' values).
#include "backends/cuda/device_order.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include <fmt/format.h>

namespace sx::cuda {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Exactly `digits` hex digits at the front of `text`, consumed; nullopt otherwise.
std::optional<std::uint32_t> take_hex(std::string_view& text, std::size_t digits) {
  if (text.size() < digits) return std::nullopt;
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    int v = hex_value(text[i]);
    if (v < 0) return std::nullopt;
    value = value * 16 + static_cast<std::uint32_t>(v);
  }
  text.remove_prefix(digits);
  return value;
}

bool take_char(std::string_view& text, char c) {
  if (text.empty() || text.front() != c) return false;
  text.remove_prefix(1);
  return true;
}

std::string_view trim(std::string_view s) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// What CUDA accepts as one CUDA_VISIBLE_DEVICES entry: a device number or a (prefix of a) UUID.
bool is_device_number(std::string_view entry) { return all_digits(entry); }
bool is_uuid(std::string_view entry) {
  return entry.starts_with("GPU-") || entry.starts_with("MIG-");
}

// The identity used to find repeated entries: "01" and "1" are the same device number.
std::string entry_key(std::string_view entry) {
  if (!is_device_number(entry)) return std::string(entry);
  std::size_t first = entry.find_first_not_of('0');
  return first == std::string_view::npos ? "0" : std::string(entry.substr(first));
}

}  // namespace

std::optional<PciAddress> parse_pci_bus_id(std::string_view text) {
  // [domain:]bus:device.function with a 4- or 8-digit domain, 2-digit bus and device, 1-digit
  // function; device <= 0x1f and function <= 7 as PCI allows. Nothing may follow.
  PciAddress a;
  std::size_t colons = std::count(text.begin(), text.end(), ':');
  if (colons == 2) {
    std::size_t domain_digits = text.find(':');
    if (domain_digits != 4 && domain_digits != 8) return std::nullopt;
    auto domain = take_hex(text, domain_digits);
    if (!domain || !take_char(text, ':')) return std::nullopt;
    a.domain = *domain;
  } else if (colons != 1) {
    return std::nullopt;
  }
  auto bus = take_hex(text, 2);
  if (!bus || !take_char(text, ':')) return std::nullopt;
  auto device = take_hex(text, 2);
  if (!device || !take_char(text, '.')) return std::nullopt;
  auto function = take_hex(text, 1);
  if (!function || !text.empty() || *device > 0x1f || *function > 7) return std::nullopt;
  a.bus = *bus;
  a.device = *device;
  a.function = *function;
  return a;
}

std::vector<GpuIdentity> in_pci_order(std::vector<GpuIdentity> devices) {
  // Parse once; sort keys are (unparseable?, address, CUDA ordinal) for the unparseable ones.
  std::vector<std::pair<std::optional<PciAddress>, GpuIdentity>> keyed;
  keyed.reserve(devices.size());
  for (auto& d : devices) keyed.emplace_back(parse_pci_bus_id(d.pci_bus_id), std::move(d));
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& x, const auto& y) {
    if (x.first.has_value() != y.first.has_value()) return x.first.has_value();
    if (x.first) return *x.first < *y.first;
    return x.second.cuda_ordinal < y.second.cuda_ordinal;
  });
  std::vector<GpuIdentity> out;
  out.reserve(keyed.size());
  for (auto& [address, d] : keyed) out.push_back(std::move(d));
  return out;
}

std::vector<std::string> describe_devices(std::span<const GpuIdentity> devices) {
  std::vector<std::string> lines;
  lines.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const GpuIdentity& d = devices[i];
    std::string line = fmt::format("cuda:{}  {}  sm_{}{}  {:.1f} GiB ({:.1f} GiB free)", i,
                                   d.name.empty() ? "unknown GPU" : d.name, d.cc_major, d.cc_minor,
                                   static_cast<double>(d.total_bytes) / kGiB,
                                   static_cast<double>(d.free_bytes) / kGiB);
    if (!d.pci_bus_id.empty()) line += fmt::format("  PCI {}", d.pci_bus_id);
    line += fmt::format("  CUDA ordinal {}", d.cuda_ordinal);
    if (!d.uuid.empty()) line += fmt::format("  {}", d.uuid);
    lines.push_back(std::move(line));
  }
  return lines;
}

VisibleDevices parse_visible_devices(const char* value) {
  VisibleDevices v;
  if (value == nullptr) return v;
  v.set = true;
  std::string_view rest = value;
  std::vector<std::string> seen_keys;
  // Walk the comma-separated entries; the first one CUDA cannot read ends the list (an empty
  // value is one empty entry, which CUDA cannot read either).
  while (true) {
    std::size_t comma = rest.find(',');
    std::string_view raw = rest.substr(0, comma);
    std::string_view entry = trim(raw);
    if (!is_device_number(entry) && !is_uuid(entry)) {
      v.ignored = std::string(trim(rest));
      break;
    }
    std::string key = entry_key(entry);
    if (std::find(seen_keys.begin(), seen_keys.end(), key) != seen_keys.end()) {
      if (std::find(v.duplicates.begin(), v.duplicates.end(), std::string(entry)) ==
          v.duplicates.end())
        v.duplicates.emplace_back(entry);
    } else {
      seen_keys.push_back(std::move(key));
    }
    if (is_device_number(entry)) v.by_index = true;
    v.entries.emplace_back(entry);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  v.hides_all = v.entries.empty();
  return v;
}

std::optional<DeviceOrder> parse_device_order(const char* value) {
  if (value == nullptr) return DeviceOrder::kFastestFirst;
  std::string_view v = value;
  if (v == "FASTEST_FIRST") return DeviceOrder::kFastestFirst;
  if (v == "PCI_BUS_ID") return DeviceOrder::kPciBusId;
  return std::nullopt;
}

namespace {
// A decimal number of at most 4 digits; -1 otherwise.
int small_number(std::string_view s) {
  if (s.empty() || s.size() > 4) return -1;
  int v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}
}  // namespace

Result<std::vector<int>> select_gpus(const char* value, int gpus) {
  std::vector<int> out;
  if (value == nullptr || *value == '\0') {
    for (int i = 0; i < gpus; ++i) out.push_back(i);
    return out;
  }
  std::string_view rest(value);
  while (true) {
    const std::size_t comma = rest.find(',');
    std::string_view entry = rest.substr(0, comma);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    // "G" or "GxN" (GPU G, N times: "0x6" = "0,0,0,0,0,0").
    std::string_view gpu = entry, times = "1";
    if (const std::size_t x = entry.find('x'); x != std::string_view::npos) {
      gpu = entry.substr(0, x);
      times = entry.substr(x + 1);
    }
    const int v = small_number(gpu);
    const int n = small_number(times);
    if (v < 0 || v >= gpus || n < 1 || n > 64) {
      return invalid_argument_error("SEXTANT_CUDA_DEVICES=\"{}\": entry \"{}\" is not a GPU index or GPUxCOUNT "
                                    "(this machine has {} GPU{}, 0 to {}; a count is 1 to 64)",
                                    value, entry, gpus, gpus == 1 ? "" : "s", gpus - 1);
    }
    out.insert(out.end(), static_cast<std::size_t>(n), v);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace sx::cuda
