// Fuzz target: a saved `nvidia-smi topo -m` (runtime/hal/topology_text.h) on arbitrary text, the
// reader of `model.topology`, `serve/plan/doctor --topology` (issue 39: a 0.9 MB header naming
// 100,000 GPUs made it allocate the 10^10-cell matrix and abort the daemon). Invariants:
// * never an exception or a crash, whatever the text;
// * failure is INVALID_ARGUMENT whose message starts with the source name;
// * success is at most kMaxTopologyGpus GPUs named GPU0.. in order, an N x N matrix whose diagonal
//   and only the diagonal is X, symmetric in its letters, affinity lists empty or one per GPU;
// * the same text with "\r\n" line ends, or parsed again, gives the same matrix.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "runtime/base/status.h"
#include "runtime/hal/topology.h"
#include "runtime/hal/topology_text.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using sx::hal::LinkKind;
using sx::hal::Topology;

std::string letters(const Topology& t) {
  std::string out;
  for (int i = 0; i < t.size(); ++i) {
    for (int j = 0; j < t.size(); ++j) out += sx::hal::link_letters(t.link(i, j)) + ",";
    out += ";";
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz.txt";
  const auto parsed = sx::hal::parse_nvidia_smi_topo(text, source);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == sx::StatusCode::kInvalidArgument);
    FUZZ_CHECK(parsed.status().message().rfind(source, 0) == 0);
    return 0;
  }
  const Topology& t = *parsed;
  const int n = t.size();
  FUZZ_CHECK(n >= 1 && n <= sx::hal::kMaxTopologyGpus);
  FUZZ_CHECK(t.links.size() == static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
  FUZZ_CHECK(t.cpu_affinity.empty() || t.cpu_affinity.size() == static_cast<std::size_t>(n));
  FUZZ_CHECK(t.numa_affinity.empty() || t.numa_affinity.size() == static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    FUZZ_CHECK(t.gpus[static_cast<std::size_t>(i)] == fmt::format("GPU{}", i));
    for (int j = 0; j < n; ++j) {
      FUZZ_CHECK((i == j) == (t.link(i, j).kind == LinkKind::kSelf));
      FUZZ_CHECK(t.link(i, j).kind != LinkKind::kUnknown);
      FUZZ_CHECK(sx::hal::link_letters(t.link(i, j)) == sx::hal::link_letters(t.link(j, i)));
    }
  }
  // Windows line ends change nothing (the reader drops carriage returns).
  std::string crlf;
  for (char c : text) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  const auto again = sx::hal::parse_nvidia_smi_topo(crlf, source);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(letters(*again) == letters(t));
  (void)sx::hal::format_topology(t);  // prints any matrix it read
  return 0;
}
