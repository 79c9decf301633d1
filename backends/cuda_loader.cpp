// Opening the CUDA module at run time (cuda_loader.h).
#include "backends/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "backends/cuda/module_abi.h"
#include "runtime/base/log.h"
#include "runtime/base/regular_file.h"

namespace sx::backends {

namespace {

void host_log_line(int level, const char* text, std::size_t size) {
  log_line(static_cast<LogLevel>(level), std::string_view(text, size));
}
int host_log_level() { return static_cast<int>(log_level()); }

const SxCudaHostHooks kHooks = {cuda::kAbi, sizeof(hal::Op), sizeof(Status), &host_log_line, &host_log_level};

std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("SEXTANT_CUDA_MODULE"); env != nullptr && *env != '\0') out.emplace_back(env);
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / "libsextant-cuda.so").string());
    out.push_back((exe.parent_path().parent_path() / "lib" / "sextant" / "libsextant-cuda.so").string());
  }
#ifdef SX_CUDA_MODULE_BUILD_PATH
  out.emplace_back(SX_CUDA_MODULE_BUILD_PATH);
#endif
  return out;
}

class CudaProxy final : public hal::Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  Result<std::vector<hal::DeviceInfo>> devices() const override {
    SX_RETURN_IF_ERROR(load());
    return inner_->devices();
  }
  Result<std::unique_ptr<hal::Device>> create_device(int index, const hal::DeviceOptions& options) override {
    SX_RETURN_IF_ERROR(load());
    return inner_->create_device(index, options);
  }
  Result<std::vector<std::unique_ptr<hal::Device>>> create_devices_at(std::span<const int> indices,
                                                                      const hal::DeviceOptions& options) override {
    SX_RETURN_IF_ERROR(load());
    return inner_->create_devices_at(indices, options);
  }
  Result<std::vector<std::unique_ptr<hal::Channel>>> create_channels(std::span<hal::Device* const> devices,
                                                                     const hal::ChannelOptions& options) override {
    SX_RETURN_IF_ERROR(load());
    return inner_->create_channels(devices, options);
  }
  std::uint64_t channel_reserve_bytes(int group_size) const override {
    return load().ok() ? inner_->channel_reserve_bytes(group_size) : 0;
  }
  std::vector<hal::MachineCheck> machine_checks() const override {
    return load().ok() ? inner_->machine_checks() : std::vector<hal::MachineCheck>{};
  }
  Result<hal::Topology> topology() const override {
    SX_RETURN_IF_ERROR(load());
    return inner_->topology();
  }

 private:
  Status load() const {
    std::call_once(once_, [this] { status_ = open(); });
    return status_;
  }
  Status open() const {
#ifndef SX_CUDA_MODULE_BUILD_PATH
    if (std::getenv("SEXTANT_CUDA_MODULE") == nullptr) {
      return unavailable_error("this build has no CUDA module (configure with nvcc installed, meson -Dcuda=enabled)");
    }
#endif
    std::string tried;
    for (const std::string& path : candidates()) {
      if (access(path.c_str(), R_OK) != 0) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      // dlopen() would block on a FIFO (SEXTANT_CUDA_MODULE is the user's): a regular file only.
      if (Status regular = check_library_path(path, fmt::format("the CUDA module {}", path)); !regular.ok()) {
        return unavailable_error("{}", regular.message());
      }
      void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        return unavailable_error("cannot load the CUDA module {}: {} (it needs the CUDA runtime libraries it was built "
                                 "with, cuBLAS among them: install them or add them to LD_LIBRARY_PATH)",
                                 path, dlerror());
      }
      auto entry = reinterpret_cast<SxCudaModuleEntry>(dlsym(lib, SX_CUDA_MODULE_ENTRY));
      if (entry == nullptr) return unavailable_error("{} is not a Sextant CUDA module (no {})", path, SX_CUDA_MODULE_ENTRY);
      const char* why = nullptr;
      hal::Backend* b = entry(&kHooks, &why);
      if (b == nullptr) return unavailable_error("{}: {}", path, why != nullptr ? why : "the module refused to start");
      inner_.reset(b);  // the module stays loaded for the life of the process
      log_debug("cuda: module {}", path);
      return ok_status();
    }
    return unavailable_error("the CUDA module libsextant-cuda.so was not found (looked at {}); set SEXTANT_CUDA_MODULE",
                             tried);
  }
  mutable std::once_flag once_;
  mutable Status status_;
  mutable std::unique_ptr<hal::Backend> inner_;
};

}  // namespace

std::unique_ptr<hal::Backend> make_cuda_backend() { return std::make_unique<CudaProxy>(); }

}  // namespace sx::backends
