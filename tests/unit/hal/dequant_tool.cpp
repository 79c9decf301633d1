// Test helper for dequant_reference_test.py: runs the HAL reference (de)quantisers on raw files.
//   dequant_tool dequantize <type> <in: raw blocks> <out: float32>
//   dequant_tool quantize <type> <in: float32> <out: raw blocks>
// <type> is a hal dtype name ("q4_k"); the element count comes from the input size, which must be
// whole blocks (dequantize) or whole blocks of floats (quantize). Exit 0 on success, 2 on bad use.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/hal/dtype.h"

namespace {

bool read_all(const char* path, std::vector<char>& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

bool write_all(const char* path, const void* data, std::size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  return static_cast<bool>(f);
}

int usage(const char* why) {
  std::fprintf(stderr, "dequant_tool: %s\nusage: dequant_tool dequantize|quantize <type> <in> <out>\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sx::hal;
  if (argc != 5) return usage("wrong number of arguments");
  const std::string mode = argv[1];
  const auto t = dtype_from_name(argv[2]);
  if (!t) return usage("unknown type");
  const DTypeInfo& info = dtype_info(*t);
  std::vector<char> in;
  if (!read_all(argv[3], in)) return usage("cannot read input");
  if (mode == "dequantize") {
    if (!can_dequantize(*t)) return usage("type cannot be dequantized");
    if (in.size() % static_cast<std::size_t>(info.block_bytes) != 0) return usage("input is not whole blocks");
    const std::int64_t n = static_cast<std::int64_t>(in.size() / static_cast<std::size_t>(info.block_bytes)) * info.block_elems;
    std::vector<float> out(static_cast<std::size_t>(n));
    dequantize_row(*t, in.data(), out.data(), n);
    return write_all(argv[4], out.data(), out.size() * sizeof(float)) ? 0 : usage("cannot write output");
  }
  if (mode == "quantize") {
    if (!can_quantize(*t)) return usage("type cannot be quantized");
    const std::size_t n = in.size() / sizeof(float);
    if (in.size() % sizeof(float) != 0 || n % static_cast<std::size_t>(info.block_elems) != 0) {
      return usage("input is not whole blocks of float32");
    }
    std::vector<float> x(n);
    std::copy(in.begin(), in.end(), reinterpret_cast<char*>(x.data()));
    std::vector<std::uint8_t> out(row_bytes(*t, static_cast<std::int64_t>(n)));
    quantize_row(*t, x.data(), out.data(), static_cast<std::int64_t>(n));
    return write_all(argv[4], out.data(), out.size()) ? 0 : usage("cannot write output");
  }
  return usage("unknown mode");
}
