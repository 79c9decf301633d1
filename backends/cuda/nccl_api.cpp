// NCCL opened at run time (nccl_api.h).
#include "backends/cuda/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

namespace sx::cuda {

std::string nccl_version_string(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

namespace {

template <typename F>
bool find(void* lib, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  return out != nullptr;
}

constexpr const char* kHint =
    "tensor parallelism over several CUDA GPUs needs NCCL 2.12 or newer (Debian's libnccl2, NVIDIA's "
    "nvidia-nccl wheel, or a path in SEXTANT_NCCL_LIBRARY); one GPU, and several Sextant devices of one GPU, "
    "work without it";

}  // namespace

Result<NcclApi> open_nccl(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return unavailable_error("NCCL unavailable: {}; {}", dlerror(), kHint);
  NcclApi api;
  api.path = library;
  int (*get_version)(int*) = nullptr;
  const char* missing = nullptr;
  if (!find(lib, "ncclGetVersion", get_version)) missing = "ncclGetVersion";
  else if (!find(lib, "ncclCommInitAll", api.comm_init_all)) missing = "ncclCommInitAll";
  else if (!find(lib, "ncclAllReduce", api.all_reduce)) missing = "ncclAllReduce";
  else if (!find(lib, "ncclAllGather", api.all_gather)) missing = "ncclAllGather";
  else if (!find(lib, "ncclBroadcast", api.broadcast)) missing = "ncclBroadcast";
  else if (!find(lib, "ncclSend", api.send)) missing = "ncclSend";
  else if (!find(lib, "ncclRecv", api.recv)) missing = "ncclRecv";
  else if (!find(lib, "ncclGroupStart", api.group_start)) missing = "ncclGroupStart";
  else if (!find(lib, "ncclGroupEnd", api.group_end)) missing = "ncclGroupEnd";
  else if (!find(lib, "ncclCommGetAsyncError", api.comm_get_async_error)) missing = "ncclCommGetAsyncError";
  else if (!find(lib, "ncclCommAbort", api.comm_abort)) missing = "ncclCommAbort";
  else if (!find(lib, "ncclCommDestroy", api.comm_destroy)) missing = "ncclCommDestroy";
  else if (!find(lib, "ncclGetErrorString", api.get_error_string)) missing = "ncclGetErrorString";
  if (missing != nullptr) {
    dlclose(lib);
    return unavailable_error("NCCL unavailable: {} has no {}; {}", library, missing, kHint);
  }
  find(lib, "ncclGetLastError", api.get_last_error);  // optional
  if (get_version(&api.version) != kNcclSuccess || api.version < 21200) {
    const std::string v = api.version > 0 ? nccl_version_string(api.version) : "an unknown version";
    dlclose(lib);
    return unavailable_error("NCCL unavailable: {} is NCCL {}; {}", library, v, kHint);
  }
  return api;  // the library stays loaded for the life of the process
}

Result<const NcclApi*> load_nccl() {
  static std::once_flag once;
  static Result<NcclApi> loaded = unavailable_error("NCCL not loaded");
  std::call_once(once, [] {
    const char* env = std::getenv("SEXTANT_NCCL_LIBRARY");
    loaded = open_nccl(env != nullptr && *env != '\0' ? env : "libnccl.so.2");
  });
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

Result<CudaChannelKind> choose_cuda_channel(const std::vector<int>& ordinals, const char* env, const Status& nccl) {
  const std::string_view mode = env != nullptr && *env != '\0' ? std::string_view(env) : "auto";
  if (mode != "auto" && mode != "nccl" && mode != "staged" && mode != "loopback") {
    return invalid_argument_error("SEXTANT_CUDA_CHANNEL={}: expected auto, nccl, loopback or staged", mode);
  }
  // Neither NCCL nor the loopback channel has run on GPUs yet: opt-in until tests/device/run has
  // validated them.
  if (mode == "staged" || mode == "auto") return CudaChannelKind::kStaged;
  bool shared = false, one_gpu = true;
  for (std::size_t i = 0; i < ordinals.size(); ++i) {
    one_gpu = one_gpu && ordinals[i] == ordinals[0];
    for (std::size_t j = 0; j < i; ++j) shared = shared || ordinals[i] == ordinals[j];
  }
  if (mode == "loopback") {
    if (!one_gpu) {
      return invalid_argument_error("SEXTANT_CUDA_CHANNEL=loopback: the group spans several GPUs; the loopback "
                                    "channel joins devices of one GPU (SEXTANT_CUDA_DEVICES=0x6); use nccl or staged");
    }
    return CudaChannelKind::kLoopback;
  }
  if (shared) {
    return invalid_argument_error("SEXTANT_CUDA_CHANNEL=nccl: the group has several devices on one GPU, which NCCL "
                                  "refuses; use distinct GPUs, SEXTANT_CUDA_CHANNEL=loopback (all on one GPU) or staged");
  }
  if (!nccl.ok()) {
    return Status(nccl.code(), fmt::format("{} (or SEXTANT_CUDA_CHANNEL=staged: collectives staged through host "
                                           "memory, correct but slow)",
                                           nccl.message()));
  }
  return CudaChannelKind::kNccl;
}

std::string nccl_environment() {
  std::string set;
  for (const char* name : {"NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_SOCKET_IFNAME",
                           "NCCL_DEBUG", "NCCL_ALGO", "NCCL_PROTO"}) {
    if (const char* v = std::getenv(name); v != nullptr) set += fmt::format("{}{}={}", set.empty() ? "" : ", ", name, v);
  }
  return set;
}

std::uint64_t nccl_reserve_bytes(int ranks, const char* channel_env, const char* buffsize_env) {
  if (ranks <= 1 || channel_env == nullptr || std::string_view(channel_env) != "nccl") return 0;
  std::uint64_t buffsize = std::uint64_t{4} << 20;
  if (buffsize_env != nullptr && *buffsize_env != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(buffsize_env, &end, 0);
    if (end != nullptr && *end == '\0' && v > 0 && v <= (std::uint64_t{1} << 32)) buffsize = v;
  }
  return buffsize * 2 * 4 * 16 + (std::uint64_t{64} << 20);
}

std::string nccl_error(const NcclApi& api, int result, NcclApi::Comm comm) {
  std::string s = fmt::format("NCCL error {}: {}", result, api.get_error_string(result));
  if (api.get_last_error != nullptr) {
    const char* last = api.get_last_error(comm);
    if (last != nullptr && *last != '\0') s += fmt::format(" ({})", last);
  }
  return s;
}

}  // namespace sx::cuda
