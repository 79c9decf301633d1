// `nvidia-smi topo -m` text as a Topology (topology_text.h).
#include "runtime/hal/topology_text.h"

#include <cctype>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "runtime/base/regular_file.h"

namespace sx::hal {

namespace {

// Without the terminal's escape sequences (ESC [ ... letter) and carriage returns.
std::string plain(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\x1b' && i + 1 < text.size() && text[i + 1] == '[') {
      i += 2;
      while (i < text.size() && !std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
      continue;
    }
    if (text[i] != '\r') out += text[i];
  }
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// Cells separated by tabs, or by two or more spaces where a line has no tab (a copy that lost its
// tabs); empty cells dropped.
std::vector<std::string> header_cells(const std::string& line) {
  std::vector<std::string> out;
  const bool tabs = line.find('\t') != std::string::npos;
  std::size_t i = 0;
  while (i < line.size()) {
    std::size_t end = i;
    if (tabs) {
      end = line.find('\t', i);
      if (end == std::string::npos) end = line.size();
    } else {
      end = line.find("  ", i);
      if (end == std::string::npos) end = line.size();
    }
    std::string cell = trim(std::string_view(line).substr(i, end - i));
    if (!cell.empty()) out.push_back(std::move(cell));
    i = end + 1;
  }
  return out;
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool is_gpu_name(std::string_view s) {
  if (s.size() < 4 || s.substr(0, 3) != "GPU") return false;
  for (char c : s.substr(3)) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A link cell; nullopt when it is not one.
std::optional<Link> parse_link(std::string_view cell) {
  Link l;
  if (cell == "X") l.kind = LinkKind::kSelf;
  else if (cell == "PIX") l.kind = LinkKind::kPix;
  else if (cell == "PXB") l.kind = LinkKind::kPxb;
  else if (cell == "PHB" || cell == "CPU") l.kind = LinkKind::kPhb;
  else if (cell == "NODE") l.kind = LinkKind::kNode;
  else if (cell == "SYS" || cell == "SOC") l.kind = LinkKind::kSys;
  else if (cell.size() > 2 && cell.substr(0, 2) == "NV") {
    int n = 0;
    for (char c : cell.substr(2)) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || n > 1000) return std::nullopt;
      n = n * 10 + (c - '0');
    }
    if (n == 0) return std::nullopt;
    l.kind = LinkKind::kNvLink;
    l.nvlinks = n;
  } else {
    return std::nullopt;
  }
  return l;
}

}  // namespace

Result<Topology> parse_nvidia_smi_topo(std::string_view raw, const std::string& source) {
  const std::string text = plain(raw);
  std::vector<std::string> lines;
  {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
  }
  // The header: the first line whose first cell is GPU0.
  std::size_t h = 0;
  std::vector<std::string> header;
  for (; h < lines.size(); ++h) {
    header = header_cells(lines[h]);
    if (!header.empty() && header.front() == "GPU0") break;
  }
  if (h == lines.size()) {
    return invalid_argument_error("{}: no `nvidia-smi topo -m` matrix (no header line starting with GPU0)", source);
  }
  // Device columns (GPUs, then NICs) up to the first affinity column.
  std::size_t devices = 0, gpus = 0;
  while (devices < header.size() && header[devices].find("Affinity") == std::string::npos &&
         header[devices].find("NUMA") == std::string::npos) {
    if (is_gpu_name(header[devices])) {
      if (header[devices] != fmt::format("GPU{}", gpus)) {
        return invalid_argument_error("{}:{}: column {} is {}, expected GPU{}", source, h + 1, devices + 1,
                                      header[devices], gpus);
      }
      ++gpus;
      if (gpus > static_cast<std::size_t>(kMaxTopologyGpus)) {
        return invalid_argument_error("{}:{}: the header names more than {} GPUs; not a saved `nvidia-smi topo -m` of "
                                      "one machine", source, h + 1, kMaxTopologyGpus);
      }
    }
    ++devices;
  }
  const bool has_cpu = devices < header.size() && header[devices] == "CPU Affinity";
  Topology t = make_topology(static_cast<int>(gpus), source);
  std::size_t rows = 0;
  for (std::size_t i = h + 1; i < lines.size() && rows < gpus; ++i) {
    const std::vector<std::string> cells = words(lines[i]);
    if (cells.empty()) continue;
    if (cells.front() != fmt::format("GPU{}", rows)) {
      if (is_gpu_name(cells.front())) {
        return invalid_argument_error("{}:{}: row {} where GPU{} was expected", source, i + 1, cells.front(), rows);
      }
      break;  // the NIC rows or the legend
    }
    if (cells.size() < devices + 1) {
      return invalid_argument_error("{}:{}: {} has {} link cells; the header has {} device columns", source, i + 1,
                                    cells.front(), cells.size() - 1, devices);
    }
    for (std::size_t j = 0; j < gpus; ++j) {
      const auto link = parse_link(cells[j + 1]);
      if (!link) {
        return invalid_argument_error("{}:{}: {} to GPU{}: '{}' is not a link (X, NV#, PIX, PXB, PHB, NODE, SYS)",
                                      source, i + 1, cells.front(), j, cells[j + 1]);
      }
      if ((j == rows) != (link->kind == LinkKind::kSelf)) {
        return invalid_argument_error("{}:{}: {} to GPU{} is '{}': only a GPU's own cell is X", source, i + 1,
                                      cells.front(), j, cells[j + 1]);
      }
      t.link(static_cast<int>(rows), static_cast<int>(j)) = *link;
    }
    if (has_cpu && cells.size() > devices + 1) t.cpu_affinity.push_back(cells[devices + 1]);
    if (has_cpu && cells.size() > devices + 2) t.numa_affinity.push_back(cells[devices + 2]);
    ++rows;
  }
  if (rows < gpus) {
    return invalid_argument_error("{}: the header names {} GPUs but {} rows follow", source, gpus, rows);
  }
  if (t.cpu_affinity.size() != gpus) t.cpu_affinity.clear();
  if (t.numa_affinity.size() != gpus) t.numa_affinity.clear();
  for (int i = 0; i < t.size(); ++i) {
    for (int j = i + 1; j < t.size(); ++j) {
      if (link_letters(t.link(i, j)) != link_letters(t.link(j, i))) {
        return invalid_argument_error("{}: GPU{} to GPU{} is {} but GPU{} to GPU{} is {}: the matrix is not symmetric",
                                      source, i, j, link_letters(t.link(i, j)), j, i, link_letters(t.link(j, i)));
      }
    }
  }
  return t;
}

Result<Topology> read_nvidia_smi_topo(const std::string& path) {
  SX_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxTopologyBytes, fmt::format("topology {}", path)));
  return parse_nvidia_smi_topo(text, path);
}

}  // namespace sx::hal
