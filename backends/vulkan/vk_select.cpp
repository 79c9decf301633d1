// Physical-device selection (vk_select.h).
#include "backends/vulkan/vk_select.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace sx::vk {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The entry as a UUID (dashes removed, lowercase) when it is 32 hex digits; else empty.
std::string as_uuid(std::string_view s) {
  std::string hex;
  for (char c : s) {
    if (c == '-') continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) return {};
    hex += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return hex.size() == 32 ? hex : std::string();
}

}  // namespace

std::string uuid_hex(const std::uint8_t (&uuid)[16]) {
  std::string out;
  for (std::uint8_t b : uuid) out += fmt::format("{:02x}", b);
  return out;
}

std::string describe_found(std::span<const PhysicalDesc> found) {
  if (found.empty()) return "none";
  std::string out;
  for (std::size_t i = 0; i < found.size(); ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("{}: {} [{}]", i, found[i].name, found[i].type);
  }
  return out;
}

Result<std::vector<int>> select_devices(std::string_view selection, std::span<const PhysicalDesc> found) {
  std::vector<int> out;
  selection = trim(selection);
  if (selection.empty()) {
    for (std::size_t i = 0; i < found.size(); ++i) {
      if (!found[i].cpu) out.push_back(static_cast<int>(i));
    }
    return out;
  }
  std::size_t start = 0;
  while (start <= selection.size()) {
    const std::size_t comma = std::min(selection.find(',', start), selection.size());
    const std::string_view entry = trim(selection.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) {
      return invalid_argument_error("Vulkan device selection '{}': an empty entry (write e.g. 0,0,0 or llvmpipe)",
                                    selection);
    }
    int pick = -1;
    const std::string uuid = as_uuid(entry);  // before indices: a UUID may be all digits
    if (uuid.empty() && all_digits(entry)) {
      const auto index = entry.size() > 4 ? found.size() : std::stoul(std::string(entry));
      if (index >= found.size()) {
        return invalid_argument_error("Vulkan device selection '{}': there is no device {} (found: {})", selection,
                                      entry, describe_found(found));
      }
      pick = static_cast<int>(index);
    } else if (!uuid.empty()) {
      for (std::size_t i = 0; i < found.size(); ++i) {
        if (found[i].uuid == uuid) pick = static_cast<int>(i);
      }
      if (pick < 0) {
        return invalid_argument_error("Vulkan device selection '{}': no device has UUID {} (found: {})", selection,
                                      entry, describe_found(found));
      }
    } else {
      const std::string part = lower(entry);
      int matches = 0;
      for (std::size_t i = 0; i < found.size(); ++i) {
        if (lower(found[i].name).find(part) != std::string::npos) {
          if (matches++ == 0) pick = static_cast<int>(i);
        }
      }
      if (matches == 0) {
        return invalid_argument_error("Vulkan device selection '{}': no device name contains '{}' (found: {})",
                                      selection, entry, describe_found(found));
      }
      if (matches > 1) {
        return invalid_argument_error("Vulkan device selection '{}': '{}' names {} devices; use an index or a UUID "
                                      "(found: {})",
                                      selection, entry, matches, describe_found(found));
      }
    }
    out.push_back(pick);
    if (comma == selection.size()) break;
  }
  return out;
}

}  // namespace sx::vk
