// The Vulkan backend: instance, devices, buffers, streams, events and the op pipelines
// (vk_device.h).
#include "backends/vulkan/vk_device.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backends/common/staged_channel.h"
#include "backends/vulkan/vk_api.h"
#include "backends/vulkan/vk_select.h"
#include "runtime/hal/device_options.h"
#include "runtime/hal/op_checks.h"

namespace sx::vk {

namespace {

// The SPIR-V of each shader, embedded by shaders/meson.build (glslc -mfmt=c).
const std::uint32_t kAddSpv[] =
#include "add.spv.inc"
    ;
const std::uint32_t kSiluMulSpv[] =
#include "silu_mul.spv.inc"
    ;
const std::uint32_t kRmsNormSpv[] =
#include "rmsnorm.spv.inc"
    ;
const std::uint32_t kTopKSpv[] =
#include "top_k.spv.inc"
    ;
const std::uint32_t kEmbeddingSpv[] =
#include "embedding.spv.inc"
    ;
const std::uint32_t kRopeSpv[] =
#include "rope.spv.inc"
    ;
const std::uint32_t kAttentionSpv[] =
#include "attention.spv.inc"
    ;
const std::uint32_t kMatmulSpv[] =
#include "matmul.spv.inc"
    ;
const std::uint32_t kMatmulSubgroupSpv[] =
#include "matmul_subgroup.spv.inc"
    ;
const std::uint32_t kMatmulMoeSpv[] =
#include "matmul_moe.spv.inc"
    ;
const std::uint32_t kMatmulSubgroupMoeSpv[] =
#include "matmul_subgroup_moe.spv.inc"
    ;
const std::uint32_t kMoeRouterSpv[] =
#include "moe_router.spv.inc"
    ;
const std::uint32_t kMoeRouteSpv[] =
#include "moe_route.spv.inc"
    ;
const std::uint32_t kMoeCombineSpv[] =
#include "moe_combine.spv.inc"
    ;
const std::uint32_t kQuantizeQ8Spv[] =
#include "quantize_q8.spv.inc"
    ;
const std::uint32_t kKvWriteSpv[] =
#include "kv_write.spv.inc"
    ;
const std::uint32_t kSigmoidMulSpv[] =
#include "sigmoid_mul.spv.inc"
    ;
const std::uint32_t kGatedNormSpv[] =
#include "gated_norm.spv.inc"
    ;
const std::uint32_t kConvStateSpv[] =
#include "conv_state.spv.inc"
    ;
const std::uint32_t kDeltaRuleSpv[] =
#include "delta_rule.spv.inc"
    ;

// The compute pipelines, one per shader, created with the device.
enum Shader {
  kShaderAdd,
  kShaderSiluMul,
  kShaderRmsNorm,
  kShaderTopK,
  kShaderEmbedding,
  kShaderRope,
  kShaderAttention,
  kShaderMatmul,               // one weight row per invocation, one row of x (decode)
  kShaderMatmulTiled,          // ... kMatmulTile rows of x (prefill)
  kShaderMatmulSubgroup,       // one weight row per subgroup (devices with subgroup arithmetic)
  kShaderMatmulSubgroupTiled,
  kShaderMatmulMoe,            // the same four over the experts of a mixture of experts
  kShaderMatmulMoeTiled,
  kShaderMatmulSubgroupMoe,
  kShaderMatmulSubgroupMoeTiled,
  kShaderMoeRouter,
  kShaderMoeRoute,
  kShaderMoeCombine,
  kShaderQuantizeQ8,
  kShaderKvWrite,
  kShaderSigmoidMul,
  kShaderGatedNorm,
  kShaderConvState,
  kShaderDeltaRule,
  kShaderCount
};
// A pipeline: its SPIR-V, its storage-buffer bindings, its name, and the value of its
// specialisation constant 0 where it has one (a variant of the shader).
struct ShaderSource {
  std::span<const std::uint32_t> spirv;
  std::uint32_t bindings;
  const char* name;
  std::optional<std::uint32_t> constant = std::nullopt;
  bool subgroups = false;  // needs subgroup arithmetic in compute shaders (created only where present)
};
constexpr std::uint32_t kMatmulTile = 8;  // rows of x per invocation of matmul_tiled
constexpr std::int64_t kMatmulTiledMinM = 4;
const ShaderSource kShaders[kShaderCount] = {
    {kAddSpv, 3, "add"},
    {kSiluMulSpv, 3, "silu_mul"},
    {kRmsNormSpv, 4, "rmsnorm"},
    {kTopKSpv, 3, "top_k"},
    {kEmbeddingSpv, 4, "embedding"},
    {kRopeSpv, 3, "rope"},
    {kAttentionSpv, 8, "attention"},
    {kMatmulSpv, 6, "matmul", 1},
    {kMatmulSpv, 6, "matmul_tiled", kMatmulTile},
    {kMatmulSubgroupSpv, 6, "matmul_subgroup", 1, true},
    {kMatmulSubgroupSpv, 6, "matmul_subgroup_tiled", kMatmulTile, true},
    {kMatmulMoeSpv, 8, "matmul_moe", 1},
    {kMatmulMoeSpv, 8, "matmul_moe_tiled", kMatmulTile},
    {kMatmulSubgroupMoeSpv, 8, "matmul_subgroup_moe", 1, true},
    {kMatmulSubgroupMoeSpv, 8, "matmul_subgroup_moe_tiled", kMatmulTile, true},
    {kMoeRouterSpv, 3, "moe_router"},
    {kMoeRouteSpv, 3, "moe_route"},
    {kMoeCombineSpv, 4, "moe_combine"},
    {kQuantizeQ8Spv, 3, "quantize_q8"},
    {kKvWriteSpv, 6, "kv_write"},
    {kSigmoidMulSpv, 3, "sigmoid_mul"},
    {kGatedNormSpv, 4, "gated_norm"},
    {kConvStateSpv, 7, "conv_state"},
    {kDeltaRuleSpv, 12, "delta_rule"}};

constexpr std::int64_t kMaxAttentionHeadDim = 256;  // one invocation per element of a head

constexpr std::int64_t kMaxRotDim = 512;  // rope: the frequency table each stream keeps

// The weight formats shaders/quant.glsl reads (embedding tables, matmul weights), by its codes.
int weight_format(hal::DType t) {
  switch (t) {
    case hal::DType::kF32:
      return 0;
    case hal::DType::kF16:
      return 1;
    case hal::DType::kBF16:
      return 2;
    case hal::DType::kQ8_0:
      return 3;
    case hal::DType::kQ5_0:
      return 4;
    case hal::DType::kQ4_0:
      return 5;
    case hal::DType::kQ4_1:
      return 6;
    case hal::DType::kQ5_1:
      return 7;
    case hal::DType::kQ4_K:
      return 8;
    case hal::DType::kQ5_K:
      return 9;
    case hal::DType::kQ6_K:
      return 10;
    default:
      return -1;
  }
}
constexpr const char* kWeightFormats = "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k and q6_k";

// ---------------------------------------------------------------------------------------------
// The process-wide instance and what it found.

struct Instance {
  const GlobalApi* g = nullptr;
  InstanceApi api;
  VkInstance instance = VK_NULL_HANDLE;
  std::vector<VkPhysicalDevice> physical;
  std::vector<PhysicalDesc> found;
};

std::string type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete gpu";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated gpu";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual gpu";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

hal::DeviceKind kind_of(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return hal::DeviceKind::kDiscreteGpu;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return hal::DeviceKind::kIntegratedGpu;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return hal::DeviceKind::kVirtualGpu;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return hal::DeviceKind::kCpu;
    default:
      return hal::DeviceKind::kOther;
  }
}

Result<const Instance*> instance() {
  static std::once_flag once;
  static Instance inst;
  static Status failure;
  std::call_once(once, [] {
    auto g = global_api();
    if (!g.ok()) {
      failure = g.status();
      return;
    }
    inst.g = *g;
    std::uint32_t version = VK_API_VERSION_1_0;
    if (inst.g->vkEnumerateInstanceVersion(&version) != VK_SUCCESS || version < VK_API_VERSION_1_2) {
      failure = unavailable_error("the Vulkan loader offers version {}.{}; Sextant needs 1.2", VK_API_VERSION_MAJOR(version),
                                  VK_API_VERSION_MINOR(version));
      return;
    }
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.pApplicationName = "sextant";
    app.apiVersion = VK_API_VERSION_1_2;
    VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ci.pApplicationInfo = &app;
    const VkResult r = inst.g->vkCreateInstance(&ci, nullptr, &inst.instance);
    if (r != VK_SUCCESS) {
      failure = unavailable_error("vkCreateInstance failed ({}): no usable Vulkan driver (ICD)", result_name(r));
      return;
    }
    auto api = load_instance_api(*inst.g, inst.instance);
    if (!api.ok()) {
      failure = unavailable_error("{}", api.status().message());
      return;
    }
    inst.api = *api;
    std::uint32_t n = 0;
    if (inst.api.vkEnumeratePhysicalDevices(inst.instance, &n, nullptr) != VK_SUCCESS) n = 0;
    inst.physical.resize(n);
    if (n > 0) inst.api.vkEnumeratePhysicalDevices(inst.instance, &n, inst.physical.data());
    inst.physical.resize(n);
    for (VkPhysicalDevice p : inst.physical) {
      VkPhysicalDeviceIDProperties id{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
      VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
      props.pNext = &id;
      inst.api.vkGetPhysicalDeviceProperties2(p, &props);
      PhysicalDesc d;
      d.name = props.properties.deviceName;
      d.cpu = props.properties.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
      d.type = type_name(props.properties.deviceType);
      d.uuid = uuid_hex(id.deviceUUID);
      inst.found.push_back(std::move(d));
    }
    // The instance lives for the process (drivers' own atexit teardown is not ordered with ours).
  });
  if (!failure.ok()) return failure;
  return &inst;
}

// The selection of physical devices: $SEXTANT_VULKAN_DEVICES (vk_select.h).
Result<std::vector<int>> selection(const Instance& inst) {
  const char* env = std::getenv("SEXTANT_VULKAN_DEVICES");
  auto picked = select_devices(env != nullptr ? env : "", inst.found);
  if (!picked.ok()) {
    return Status(picked.status().code(), fmt::format("SEXTANT_VULKAN_DEVICES: {}", picked.status().message()));
  }
  return picked;
}

std::uint64_t largest_device_heap(const VkPhysicalDeviceMemoryProperties& m) {
  std::uint64_t best = 0;
  for (std::uint32_t i = 0; i < m.memoryHeapCount; ++i) {
    if (m.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) best = std::max<std::uint64_t>(best, m.memoryHeaps[i].size);
  }
  return best;
}

// What devices() lists and what a created device reports: the same description. `budget` (the
// memory_budget option; 0: none) caps the memory; several Sextant devices on one physical device,
// or a device on the host's RAM, share memory unless each has its own budget.
hal::DeviceInfo describe_device(const VkPhysicalDeviceProperties& props, const VkPhysicalDeviceMemoryProperties& mem,
                                int index, bool shares_physical, std::uint64_t budget) {
  hal::DeviceInfo info;
  info.backend = "vulkan";
  info.index = index;
  info.kind = kind_of(props.deviceType);
  const std::uint64_t heap = largest_device_heap(mem);
  info.memory_bytes = budget > 0 ? std::min<std::uint64_t>(budget, heap) : heap;
  info.free_bytes = info.memory_bytes;
  info.shared_memory = budget == 0 && (shares_physical || props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU);
  info.name = fmt::format("vulkan:{} ({}, {}; Vulkan {}.{}.{})", index, props.deviceName, type_name(props.deviceType),
                          VK_API_VERSION_MAJOR(props.apiVersion), VK_API_VERSION_MINOR(props.apiVersion),
                          VK_API_VERSION_PATCH(props.apiVersion));
  return info;
}

// ---------------------------------------------------------------------------------------------

struct VkOptions {
  std::uint64_t memory_budget = 0;
  std::uint64_t max_binding = 0;  // bytes one binding may span; 0: the device's maxStorageBufferRange
  // The matmul variant: "auto" (by subgroups on GPUs with subgroup arithmetic, one row per
  // invocation elsewhere: on lavapipe that measured twice as fast), "scalar" or "subgroup".
  std::string matmul = "auto";
};

Result<VkOptions> parse_options(const hal::DeviceOptions& options) {
  hal::OptionReader r("vulkan", options);
  VkOptions o;
  SX_ASSIGN_OR_RETURN(std::int64_t budget, r.integer("memory_budget", 0, 0, INT64_MAX));
  SX_ASSIGN_OR_RETURN(std::int64_t binding, r.integer("max_binding", 0, 0, INT64_MAX));
  SX_ASSIGN_OR_RETURN(o.matmul, r.choice("matmul", "auto", {"auto", "scalar", "subgroup"}));
  SX_RETURN_IF_ERROR(r.finish());
  o.memory_budget = static_cast<std::uint64_t>(budget);
  o.max_binding = static_cast<std::uint64_t>(binding);
  return o;
}

class VulkanDevice;

class VulkanBuffer final : public hal::Buffer {
 public:
  VulkanBuffer(VulkanDevice& device, VkBuffer buffer, VkDeviceMemory memory, std::size_t size, std::size_t charged,
               hal::BufferUsage usage, std::byte* mapped)
      : device_(device), buffer_(buffer), memory_(memory), size_(size), charged_(charged), usage_(usage), mapped_(mapped) {}
  // The file format of a buffer made by upload_weight (ops read it only as that format).
  std::optional<hal::DType> weight_format;
  ~VulkanBuffer() override;
  std::size_t size() const override { return size_; }
  hal::Device& device() const override;
  hal::BufferUsage usage() const override { return usage_; }
  std::span<std::byte> host() const override {
    if (mapped_ == nullptr || usage_ == hal::BufferUsage::kDevice) return {};
    return {mapped_, size_};
  }
  VkBuffer handle() const { return buffer_; }
  VulkanDevice& vk_device() const { return device_; }
  std::byte* mapped() const { return mapped_; }

 private:
  VulkanDevice& device_;
  VkBuffer buffer_;
  VkDeviceMemory memory_;
  std::size_t size_, charged_;
  hal::BufferUsage usage_;
  std::byte* mapped_;
};

class VulkanEvent final : public hal::Event {
 public:
  VulkanEvent(VulkanDevice& device, VkSemaphore sem) : device_(device), sem_(sem) {}
  ~VulkanEvent() override;
  VulkanDevice& device_;
  VkSemaphore sem_;
  std::uint64_t value = 0;  // 0: never recorded
};

// A compute pipeline: `bindings` storage buffers pushed as descriptors, push constants.
struct Pipeline {
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  std::uint32_t bindings = 0;
};

constexpr std::uint32_t kPushConstantBytes = 128;
constexpr std::int64_t kMaxDeltaHeadDimShader = 256;  // delta_rule.comp: an invocation per state column
constexpr std::uint32_t kWorkgroup = 256;  // local_size_x of the elementwise shaders
constexpr std::uint32_t kMatmulGroup = 64;  // local_size_x of matmul.comp

class VulkanDevice final : public hal::Device {
 public:
  static Result<std::unique_ptr<VulkanDevice>> create(const Instance& inst, int index, int physical_index,
                                                      bool shares_physical, const VkOptions& options);
  ~VulkanDevice() override;

  const hal::DeviceInfo& info() const override { return info_; }
  hal::MemoryInfo memory() const override { return {info_.memory_bytes, used_.load()}; }
  Status supports(const hal::Op& op) const override;
  Result<std::unique_ptr<hal::Buffer>> alloc(std::size_t bytes, hal::BufferUsage usage) override;
  // The file's bytes as they are (no layout of its own yet), remembering their format.
  Result<std::unique_ptr<hal::Buffer>> upload_weight(hal::Stream& stream, const hal::WeightDesc& w,
                                                     std::span<const std::byte> bytes) override {
    SX_ASSIGN_OR_RETURN(auto b, hal::Device::upload_weight(stream, w, bytes));
    static_cast<VulkanBuffer*>(b.get())->weight_format = w.format;
    return b;
  }
  Result<std::unique_ptr<hal::Stream>> create_stream() override;
  Result<std::unique_ptr<hal::Event>> create_event() override;

  const DeviceApi& api() const { return api_; }
  VkDevice handle() const { return device_; }
  std::uint32_t queue_family() const { return family_; }
  const VkPhysicalDeviceLimits& limits() const { return limits_; }
  // The most bytes one storage-buffer binding spans: the device's limit, or less when the
  // max_binding option asks (so tests exercise the windows large tensors are bound in).
  std::size_t binding_limit() const { return binding_limit_; }
  const Pipeline& pipeline(Shader s) const { return pipelines_[s]; }
  // The matmul variant the device's features chose: one weight row per subgroup, or per invocation.
  bool matmul_subgroups() const { return matmul_subgroups_; }
  std::uint32_t matmul_rows_per_group() const { return matmul_rows_per_group_; }
  Status submit(const VkSubmitInfo& info) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    return check(api_.vkQueueSubmit(queue_, 1, &info, VK_NULL_HANDLE), fmt::format("{}: vkQueueSubmit", info_.name));
  }
  void release(std::size_t charged) { used_.fetch_sub(charged); }

 private:
  VulkanDevice() = default;
  Result<Pipeline> make_pipeline(const ShaderSource& source);
  void destroy(Pipeline& p);

  hal::DeviceInfo info_;
  DeviceApi api_;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::uint32_t family_ = 0;
  VkPhysicalDeviceLimits limits_{};
  std::size_t binding_limit_ = 0;
  std::uint32_t device_type_ = UINT32_MAX, upload_type_ = UINT32_MAX, readback_type_ = UINT32_MAX;
  std::mutex queue_mu_;
  std::atomic<std::uint64_t> used_{0};
  Pipeline pipelines_[kShaderCount];
  bool matmul_subgroups_ = false;
  std::uint32_t matmul_rows_per_group_ = 0;
};

VulkanBuffer::~VulkanBuffer() {
  const DeviceApi& a = device_.api();
  if (mapped_ != nullptr) a.vkUnmapMemory(device_.handle(), memory_);
  a.vkDestroyBuffer(device_.handle(), buffer_, nullptr);
  a.vkFreeMemory(device_.handle(), memory_, nullptr);
  device_.release(charged_);
}

hal::Device& VulkanBuffer::device() const { return device_; }

// A batch's signal operations need not happen together: the stream that recorded the event may
// have seen its own semaphore signalled while this one is still to be, so wait for it first.
VulkanEvent::~VulkanEvent() {
  if (value > 0) {
    VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wi.semaphoreCount = 1;
    wi.pSemaphores = &sem_;
    wi.pValues = &value;
    (void)device_.api().vkWaitSemaphores(device_.handle(), &wi, UINT64_MAX);
  }
  device_.api().vkDestroySemaphore(device_.handle(), sem_, nullptr);
}

// The memory type index for `usage` (UINT32_MAX when none): device-local for kDevice (any type
// when none is), host-visible + coherent for staging (preferring host-cached for readback).
std::uint32_t pick_memory_type(const VkPhysicalDeviceMemoryProperties& m, hal::BufferUsage usage) {
  auto find = [&](VkMemoryPropertyFlags want) -> std::uint32_t {
    for (std::uint32_t i = 0; i < m.memoryTypeCount; ++i) {
      if ((m.memoryTypes[i].propertyFlags & want) == want) return i;
    }
    return UINT32_MAX;
  };
  switch (usage) {
    case hal::BufferUsage::kDevice: {
      const std::uint32_t t = find(VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
      return t != UINT32_MAX ? t : find(0);
    }
    case hal::BufferUsage::kUpload:
      return find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    case hal::BufferUsage::kReadback: {
      const std::uint32_t t = find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                   VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
      return t != UINT32_MAX ? t : find(VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
    }
  }
  return UINT32_MAX;
}

Result<std::unique_ptr<VulkanDevice>> VulkanDevice::create(const Instance& inst, int index, int physical_index,
                                                           bool shares_physical, const VkOptions& options) {
  auto d = std::unique_ptr<VulkanDevice>(new VulkanDevice());
  const VkPhysicalDevice phys = inst.physical[static_cast<std::size_t>(physical_index)];
  VkPhysicalDeviceProperties props;
  inst.api.vkGetPhysicalDeviceProperties(phys, &props);
  d->limits_ = props.limits;
  d->binding_limit_ = props.limits.maxStorageBufferRange;
  if (options.max_binding > 0) d->binding_limit_ = std::min<std::size_t>(d->binding_limit_, options.max_binding);
  if (props.apiVersion < VK_API_VERSION_1_2) {
    return unavailable_error("vulkan:{} ({}) supports Vulkan {}.{}; Sextant needs 1.2", index, props.deviceName,
                             VK_API_VERSION_MAJOR(props.apiVersion), VK_API_VERSION_MINOR(props.apiVersion));
  }
  // A queue family with compute.
  std::uint32_t nf = 0;
  inst.api.vkGetPhysicalDeviceQueueFamilyProperties(phys, &nf, nullptr);
  std::vector<VkQueueFamilyProperties> families(nf);
  inst.api.vkGetPhysicalDeviceQueueFamilyProperties(phys, &nf, families.data());
  d->family_ = UINT32_MAX;
  for (std::uint32_t i = 0; i < nf; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      d->family_ = i;
      break;
    }
  }
  if (d->family_ == UINT32_MAX) return unavailable_error("vulkan:{} ({}) has no compute queue", index, props.deviceName);
  // Required: push descriptors and timeline semaphores.
  std::uint32_t ne = 0;
  inst.api.vkEnumerateDeviceExtensionProperties(phys, nullptr, &ne, nullptr);
  std::vector<VkExtensionProperties> exts(ne);
  inst.api.vkEnumerateDeviceExtensionProperties(phys, nullptr, &ne, exts.data());
  const bool push = std::any_of(exts.begin(), exts.end(), [](const VkExtensionProperties& e) {
    return std::strcmp(e.extensionName, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME) == 0;
  });
  if (!push) {
    return unavailable_error("vulkan:{} ({}) lacks {}, which the backend binds its buffers with", index,
                             props.deviceName, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  }
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f12;
  inst.api.vkGetPhysicalDeviceFeatures2(phys, &f2);
  if (!f12.timelineSemaphore) {
    return unavailable_error("vulkan:{} ({}) lacks timeline semaphores", index, props.deviceName);
  }
  VkPhysicalDeviceVulkan12Features enable12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  enable12.timelineSemaphore = VK_TRUE;
  const float priority = 1.0f;
  VkDeviceQueueCreateInfo q{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  q.queueFamilyIndex = d->family_;
  q.queueCount = 1;
  q.pQueuePriorities = &priority;
  const char* enabled[] = {VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME};
  VkDeviceCreateInfo ci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  ci.pNext = &enable12;
  ci.queueCreateInfoCount = 1;
  ci.pQueueCreateInfos = &q;
  ci.enabledExtensionCount = 1;
  ci.ppEnabledExtensionNames = enabled;
  SX_RETURN_IF_ERROR(check(inst.api.vkCreateDevice(phys, &ci, nullptr, &d->device_),
                           fmt::format("vulkan:{} ({}): vkCreateDevice", index, props.deviceName)));
  SX_ASSIGN_OR_RETURN(d->api_, load_device_api(inst.api, d->device_));
  d->api_.vkGetDeviceQueue(d->device_, d->family_, 0, &d->queue_);

  VkPhysicalDeviceMemoryProperties mem;
  inst.api.vkGetPhysicalDeviceMemoryProperties(phys, &mem);
  d->device_type_ = pick_memory_type(mem, hal::BufferUsage::kDevice);
  d->upload_type_ = pick_memory_type(mem, hal::BufferUsage::kUpload);
  d->readback_type_ = pick_memory_type(mem, hal::BufferUsage::kReadback);
  if (d->upload_type_ == UINT32_MAX || d->readback_type_ == UINT32_MAX) {
    return unavailable_error("vulkan:{} ({}) has no host-visible coherent memory for staging", index, props.deviceName);
  }

  d->info_ = describe_device(props, mem, index, shares_physical, options.memory_budget);

  // Shader variants by the device's features (the option matmul= forces one).
  VkPhysicalDeviceVulkan12Properties p12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_PROPERTIES};
  VkPhysicalDeviceVulkan11Properties p11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_PROPERTIES};
  p11.pNext = &p12;
  VkPhysicalDeviceProperties2 pp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  pp.pNext = &p11;
  inst.api.vkGetPhysicalDeviceProperties2(phys, &pp);
  constexpr VkSubgroupFeatureFlags kNeeded = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
  const bool can_subgroup = (p11.subgroupSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0 &&
                            (p11.subgroupSupportedOperations & kNeeded) == kNeeded && p11.subgroupSize >= 4 &&
                            p11.subgroupSize <= kMatmulGroup;
  if (options.matmul == "subgroup" && !can_subgroup) {
    return unavailable_error("vulkan:{} ({}): matmul=subgroup, but the device has no subgroup arithmetic in compute "
                             "shaders with subgroups of 4 to {} (its subgroups: {})",
                             index, props.deviceName, kMatmulGroup, p11.subgroupSize);
  }
  const bool subgroups = options.matmul == "subgroup" ||
                         (options.matmul == "auto" && can_subgroup && props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU);
  d->matmul_subgroups_ = subgroups;
  d->matmul_rows_per_group_ = subgroups ? kMatmulGroup / p11.subgroupSize : kMatmulGroup;
  const std::string variant = subgroups ? fmt::format("matmul by subgroups of {}", p11.subgroupSize)
                                        : "matmul by invocations";
  d->info_.name.pop_back();  // the closing parenthesis of describe_device's name
  d->info_.name += fmt::format("; driver {} {}; {})", p12.driverName, p12.driverInfo, variant);

  for (int i = 0; i < kShaderCount; ++i) {
    if (kShaders[i].subgroups && !subgroups) continue;
    SX_ASSIGN_OR_RETURN(d->pipelines_[i], d->make_pipeline(kShaders[i]));
  }
  return d;
}

VulkanDevice::~VulkanDevice() {
  if (device_ == VK_NULL_HANDLE) return;
  api_.vkDeviceWaitIdle(device_);
  for (Pipeline& p : pipelines_) destroy(p);
  api_.vkDestroyDevice(device_, nullptr);
}

Result<Pipeline> VulkanDevice::make_pipeline(const ShaderSource& source) {
  const std::uint32_t bindings = source.bindings;
  const char* name = source.name;
  Pipeline p;
  p.bindings = bindings;
  std::vector<VkDescriptorSetLayoutBinding> b(bindings);
  for (std::uint32_t i = 0; i < bindings; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo sl{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  sl.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  sl.bindingCount = bindings;
  sl.pBindings = b.data();
  const std::string what = fmt::format("{}: pipeline '{}'", info_.name, name);
  SX_RETURN_IF_ERROR(check(api_.vkCreateDescriptorSetLayout(device_, &sl, nullptr, &p.set_layout), what));
  VkPushConstantRange pc{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushConstantBytes};
  VkPipelineLayoutCreateInfo pl{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &p.set_layout;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &pc;
  SX_RETURN_IF_ERROR(check(api_.vkCreatePipelineLayout(device_, &pl, nullptr, &p.layout), what));
  VkShaderModuleCreateInfo sm{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  sm.codeSize = source.spirv.size_bytes();
  sm.pCode = source.spirv.data();
  VkShaderModule module = VK_NULL_HANDLE;
  SX_RETURN_IF_ERROR(check(api_.vkCreateShaderModule(device_, &sm, nullptr, &module), what));
  VkComputePipelineCreateInfo cp{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  cp.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  cp.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  cp.stage.module = module;
  cp.stage.pName = "main";
  const VkSpecializationMapEntry entry{0, 0, sizeof(std::uint32_t)};
  VkSpecializationInfo spec{1, &entry, sizeof(std::uint32_t), nullptr};
  if (source.constant) {
    spec.pData = &*source.constant;
    cp.stage.pSpecializationInfo = &spec;
  }
  cp.layout = p.layout;
  const VkResult r = api_.vkCreateComputePipelines(device_, VK_NULL_HANDLE, 1, &cp, nullptr, &p.pipeline);
  api_.vkDestroyShaderModule(device_, module, nullptr);
  SX_RETURN_IF_ERROR(check(r, what));
  return p;
}

void VulkanDevice::destroy(Pipeline& p) {
  if (p.pipeline != VK_NULL_HANDLE) api_.vkDestroyPipeline(device_, p.pipeline, nullptr);
  if (p.layout != VK_NULL_HANDLE) api_.vkDestroyPipelineLayout(device_, p.layout, nullptr);
  if (p.set_layout != VK_NULL_HANDLE) api_.vkDestroyDescriptorSetLayout(device_, p.set_layout, nullptr);
  p = {};
}

Status VulkanDevice::supports(const hal::Op& op) const {
  if (std::holds_alternative<hal::AddArgs>(op) || std::holds_alternative<hal::SiluMulArgs>(op) ||
      std::holds_alternative<hal::RmsNormArgs>(op) || std::holds_alternative<hal::TopKArgs>(op) ||
      std::holds_alternative<hal::RopeArgs>(op) || std::holds_alternative<hal::SigmoidMulArgs>(op) ||
      std::holds_alternative<hal::GatedNormArgs>(op) || std::holds_alternative<hal::ConvStateArgs>(op)) {
    return ok_status();
  }
  if (const auto* d = std::get_if<hal::DeltaRuleArgs>(&op)) {
    if (d->d_k <= kMaxDeltaHeadDimShader && d->d_v <= kMaxDeltaHeadDimShader) return ok_status();
    return unimplemented_error("the Vulkan backend's delta_rule takes heads of at most {}", kMaxDeltaHeadDimShader);
  }
  if (const auto* w = std::get_if<hal::KvWriteArgs>(&op)) {
    if ((w->cache_type == hal::DType::kF32 || w->cache_type == hal::DType::kF16) &&
        (w->cache_type == hal::DType::kF32 || w->n_kv_heads * w->head_dim % 2 == 0)) {
      return ok_status();
    }
    return unimplemented_error("the Vulkan backend's kv_write takes f32 caches, or f16 ones with rows of even length");
  }
  if (const auto* a = std::get_if<hal::AttentionArgs>(&op)) {
    if ((a->cache_type == hal::DType::kF32 || a->cache_type == hal::DType::kF16) && a->head_dim <= kMaxAttentionHeadDim) {
      return ok_status();
    }
    return unimplemented_error("the Vulkan backend's attention takes f32 or f16 caches and heads of at most {}",
                               kMaxAttentionHeadDim);
  }
  if (const auto* e = std::get_if<hal::EmbeddingArgs>(&op)) {
    if (weight_format(e->table_type) >= 0) return ok_status();
    return unimplemented_error("the Vulkan backend reads embedding tables in {}", kWeightFormats);
  }
  if (const auto* m = std::get_if<hal::MatmulArgs>(&op)) {
    if (weight_format(m->w_type) >= 0) return ok_status();
    return unimplemented_error("the Vulkan backend reads matmul weights in {}", kWeightFormats);
  }
  if (const auto* r = std::get_if<hal::MoeRouterArgs>(&op)) {
    if (r->k <= hal::kMaxTopK) return ok_status();
    return unimplemented_error("the router selects at most {} experts per token", hal::kMaxTopK);
  }
  if (const auto* m = std::get_if<hal::MoeFfnArgs>(&op)) {
    if (weight_format(m->gate_type) >= 0 && weight_format(m->up_type) >= 0 && weight_format(m->down_type) >= 0) {
      return ok_status();
    }
    return unimplemented_error("the Vulkan backend reads expert weights in {}", kWeightFormats);
  }
  return unimplemented_error("the Vulkan backend has no shader for {} yet", hal::op_name(op));
}

Result<std::unique_ptr<hal::Buffer>> VulkanDevice::alloc(std::size_t bytes, hal::BufferUsage usage) {
  const std::size_t size = std::max<std::size_t>(bytes, 4);
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkBuffer buffer = VK_NULL_HANDLE;
  SX_RETURN_IF_ERROR(check(api_.vkCreateBuffer(device_, &bi, nullptr, &buffer),
                           fmt::format("{}: a buffer of {} bytes", info_.name, bytes)));
  VkMemoryRequirements req;
  api_.vkGetBufferMemoryRequirements(device_, buffer, &req);
  const std::uint64_t used = used_.fetch_add(req.size) + req.size;
  auto undo = [&] {
    used_.fetch_sub(req.size);
    api_.vkDestroyBuffer(device_, buffer, nullptr);
  };
  if (used > info_.memory_bytes) {
    undo();
    return resource_exhausted_error("{}: cannot allocate {} bytes: {} of {} bytes in use", info_.name, bytes,
                                    used - req.size, info_.memory_bytes);
  }
  const std::uint32_t type = usage == hal::BufferUsage::kDevice   ? device_type_
                             : usage == hal::BufferUsage::kUpload ? upload_type_
                                                                  : readback_type_;
  if (type == UINT32_MAX || !(req.memoryTypeBits & (1u << type))) {
    undo();
    return resource_exhausted_error("{}: no memory type for a {} buffer", info_.name, hal::buffer_usage_name(usage));
  }
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  if (Status s = check(api_.vkAllocateMemory(device_, &ai, nullptr, &memory),
                       fmt::format("{}: {} bytes of {} memory", info_.name, bytes, hal::buffer_usage_name(usage)));
      !s.ok()) {
    undo();
    return s;
  }
  std::byte* mapped = nullptr;
  Status s = check(api_.vkBindBufferMemory(device_, buffer, memory, 0), fmt::format("{}: vkBindBufferMemory", info_.name));
  if (s.ok() && usage != hal::BufferUsage::kDevice) {
    void* p = nullptr;
    s = check(api_.vkMapMemory(device_, memory, 0, VK_WHOLE_SIZE, 0, &p), fmt::format("{}: vkMapMemory", info_.name));
    mapped = static_cast<std::byte*>(p);
  }
  if (!s.ok()) {
    api_.vkFreeMemory(device_, memory, nullptr);
    undo();
    return s;
  }
  return std::unique_ptr<hal::Buffer>(
      std::make_unique<VulkanBuffer>(*this, buffer, memory, bytes, req.size, usage, mapped));
}

Result<std::unique_ptr<hal::Event>> VulkanDevice::create_event() {
  VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  type.initialValue = 0;
  VkSemaphoreCreateInfo ci{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  ci.pNext = &type;
  VkSemaphore sem = VK_NULL_HANDLE;
  SX_RETURN_IF_ERROR(check(api_.vkCreateSemaphore(device_, &ci, nullptr, &sem), fmt::format("{}: an event", info_.name)));
  return std::unique_ptr<hal::Event>(std::make_unique<VulkanEvent>(*this, sem));
}

// ---------------------------------------------------------------------------------------------
// Streams.

// Host bytes staged by upload / update / fill edges and not yet copied out by the device: past
// this, the stream waits for its work before taking more (bounding staging during a model load).
constexpr std::size_t kMaxStagedBytes = std::size_t{256} << 20;

class VulkanStream final : public hal::Stream {
 public:
  explicit VulkanStream(VulkanDevice& d) : d_(d), a_(d.api()) {}
  ~VulkanStream() override;
  Status init();

  Status upload(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) override;
  Status download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t src_offset) override;
  Status update(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) override;
  Status copy(hal::Buffer& dst, std::size_t dst_offset, const hal::Buffer& src, std::size_t src_offset,
              std::size_t bytes) override;
  Status fill(hal::Buffer& dst, std::size_t dst_offset, std::size_t bytes, std::uint8_t value) override;
  Status run(const hal::Op& op) override;
  Status host_call(std::function<Status()> fn) override;
  Status record(hal::Event& event) override;
  Status wait(const hal::Event& event) override;
  Status sync() override;

 private:
  Status latch(Status s) {
    if (!s.ok() && latched_.ok()) latched_ = s;
    return s;
  }
  template <typename... Args>
  Status latch_invalid(fmt::format_string<Args...> f, Args&&... args) {
    return latch(invalid_argument_error(f, std::forward<Args>(args)...));
  }
  // The buffer behind `b` when it is one of this device's, with [offset, offset + bytes) inside.
  // Errors latch, like every error of a stream (the first one is returned by every later call).
  Result<VulkanBuffer*> resolve(const hal::Buffer& b, std::size_t offset, std::size_t bytes, std::string_view what,
                                bool device_only);
  Result<VulkanBuffer*> resolve_view(const hal::BufView& v, std::size_t bytes, std::string_view op,
                                     std::string_view what);
  // The command buffer being recorded (begun on first use), after a full memory barrier that
  // orders the command about to be recorded after everything before it on the queue.
  Result<VkCommandBuffer> command();
  // Submits what was recorded (and the waits), signalling the stream's semaphore and `event`.
  Status submit(VulkanEvent* event = nullptr);
  // submit(), then waits for all of this stream's work and frees what it used.
  Status drain();
  // A host-visible buffer holding `src`, kept until the work that reads it has completed.
  Result<VulkanBuffer*> stage(std::span<const std::byte> src);
  Status copy_from_host(VulkanBuffer& dst, std::size_t offset, std::span<const std::byte> src);
  // One operand of a dispatch: `bytes` of a device buffer of this device from `view`.
  struct Arg {
    hal::BufView view;
    std::size_t bytes;
    const char* name;
    bool internal = false;  // the stream's own (host-visible) buffer, not an operand
  };
  // Records `shader` over `args` (binding i = args[i], bound from its offset rounded down to the
  // device's alignment) with push constants: each operand's remaining offset in 4-byte words,
  // then `params`, then the grid's row length in workgroups (`groups` are laid out in rows of at
  // most maxComputeWorkGroupCount[0]; a shader's linear workgroup index is x + y * that).
  Status dispatch(Shader shader, const char* op, std::span<const Arg> args, std::span<const std::uint32_t> params,
                  std::uint64_t groups);
  Status run_add(const hal::AddArgs& a);
  Status run_silu_mul(const hal::SiluMulArgs& a);
  Status run_rmsnorm(const hal::RmsNormArgs& a);
  Status run_top_k(const hal::TopKArgs& a);
  Status run_embedding(const hal::EmbeddingArgs& a);
  Status run_rope(const hal::RopeArgs& a);
  Status run_attention(const hal::AttentionArgs& a);
  Status run_matmul(const hal::MatmulArgs& a);
  Status run_kv_write(const hal::KvWriteArgs& a);
  Status run_moe_router(const hal::MoeRouterArgs& a);
  Status run_moe_ffn(const hal::MoeFfnArgs& a);
  Status run_sigmoid_mul(const hal::SigmoidMulArgs& a);
  Status run_gated_norm(const hal::GatedNormArgs& a);
  Status run_conv_state(const hal::ConvStateArgs& a);
  Status run_delta_rule(const hal::DeltaRuleArgs& a);
  // `b` replaced by a device buffer of `bytes` when it is smaller (or null); the one it outgrew stays
  // alive in staged_ until the work recorded on it has completed.
  Status grow(std::unique_ptr<hal::Buffer>& b, std::size_t bytes);
  // Records quantize_q8.comp over `x` (`mk` floats, the stream's own buffer when `internal`) into
  // q8_ (grown as needed): the int8 activations and their scales of a Q8_0 matmul.
  Result<std::pair<hal::BufView, hal::BufView>> quantize_q8(const hal::BufView& x, std::size_t mk, bool internal,
                                                            const char* op);
  // The MOE matmul (matmul.comp) of one expert matrix stack: y[slot] = W_e . x[slot / x_div] for
  // every slot moe_route listed for local expert e, over windows of whole experts.
  Status moe_matmul(const hal::MoeFfnArgs& a, const hal::BufView& w, hal::DType type, std::int64_t rows,
                    std::int64_t cols, const hal::BufView& x, bool x_internal, std::uint32_t x_div,
                    const hal::BufView& y, const hal::BufView& routes, const hal::BufView& counts);
  // Rows of `row_bytes` one binding window holds (an even count, so windows start 4-byte aligned);
  // 0 when not even two rows fit.
  std::size_t window_rows(std::size_t row_bytes) const;
  // INVALID_ARGUMENT when `b` was uploaded as weights of another format than `format`.
  Status check_weight_format(const hal::BufView& b, hal::DType format, const char* op);
  // Errors the shaders found in the data (an id outside the vocabulary), written into `errors_`
  // (4 words: kind, then the op's values), turned into a latched status once the work completed.
  Status take_device_errors();

  VulkanDevice& d_;
  const DeviceApi& a_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkSemaphore done_ = VK_NULL_HANDLE;  // timeline: signalled to `submitted_` by the last submission
  std::uint64_t submitted_ = 0;
  VkCommandBuffer recording_ = VK_NULL_HANDLE;
  std::vector<VkCommandBuffer> in_flight_;
  std::vector<std::pair<VkSemaphore, std::uint64_t>> waits_;
  std::vector<std::unique_ptr<hal::Buffer>> staged_;
  std::size_t staged_bytes_ = 0;
  std::unique_ptr<hal::Buffer> errors_;  // kReadback, 16 bytes, zero when no error
  // The int8 activations of Q8_0 matmuls (quantize_q8.comp), grown on demand; a buffer it
  // outgrew stays alive in staged_ until the work recorded on it has completed.
  std::unique_ptr<hal::Buffer> q8_;
  // moe_ffn's workspace (routes, counts, gate, up and down outputs by slot), grown like q8_.
  std::unique_ptr<hal::Buffer> moe_;
  // rope's inv_freq[i] / (2 pi) as 64-bit fractions (kMaxRotDim / 2 of them) for rope_theta_ and
  // rope_rot_.
  std::unique_ptr<hal::Buffer> rope_freq_;
  float rope_theta_ = 0.0f;
  std::int64_t rope_rot_ = 0;
  Status latched_;
};

Status VulkanStream::init() {
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
  pi.queueFamilyIndex = d_.queue_family();
  SX_RETURN_IF_ERROR(check(a_.vkCreateCommandPool(d_.handle(), &pi, nullptr, &pool_), "vkCreateCommandPool"));
  VkSemaphoreTypeCreateInfo type{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
  type.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
  VkSemaphoreCreateInfo ci{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
  ci.pNext = &type;
  SX_RETURN_IF_ERROR(check(a_.vkCreateSemaphore(d_.handle(), &ci, nullptr, &done_), "vkCreateSemaphore"));
  SX_ASSIGN_OR_RETURN(errors_, d_.alloc(16, hal::BufferUsage::kReadback));
  std::memset(errors_->host().data(), 0, 16);
  SX_ASSIGN_OR_RETURN(rope_freq_, d_.alloc(kMaxRotDim * sizeof(float), hal::BufferUsage::kDevice));
  return ok_status();
}

Status VulkanStream::take_device_errors() {
  std::uint32_t w[4];
  std::memcpy(w, errors_->host().data(), sizeof w);
  if (w[0] == 0) return ok_status();
  std::memset(errors_->host().data(), 0, 16);
  if (w[0] == 3) {
    return latch(out_of_range_error("kv_write: slot {} of token {} is outside the cache of {} slots",
                                    static_cast<std::int32_t>(w[1]), w[2], w[3]));
  }
  if (w[0] == 2) {
    return latch(out_of_range_error("attention: sequence {} block {} maps to block id {} outside the cache", w[1], w[2],
                                    static_cast<std::int32_t>(w[3])));
  }
  return latch(out_of_range_error("embedding: token id {} at position {} is outside the vocabulary of {}",
                                  static_cast<std::int32_t>(w[2]), w[1], w[3]));
}

VulkanStream::~VulkanStream() {
  (void)drain();
  if (recording_ != VK_NULL_HANDLE) a_.vkEndCommandBuffer(recording_);
  if (done_ != VK_NULL_HANDLE) a_.vkDestroySemaphore(d_.handle(), done_, nullptr);
  if (pool_ != VK_NULL_HANDLE) a_.vkDestroyCommandPool(d_.handle(), pool_, nullptr);
}

Result<VulkanBuffer*> VulkanStream::resolve(const hal::Buffer& b, std::size_t offset, std::size_t bytes,
                                            std::string_view what, bool device_only) {
  auto* vb = dynamic_cast<const VulkanBuffer*>(&b);
  if (vb == nullptr || &vb->vk_device() != &d_) {
    return latch_invalid("{}: the buffer belongs to {}, not to {}", what, b.device().info().name, d_.info().name);
  }
  if (offset > vb->size() || bytes > vb->size() - offset) {
    return latch(out_of_range_error("{}: {} bytes at offset {} overrun a buffer of {} bytes", what, bytes, offset,
                                    vb->size()));
  }
  if (device_only && vb->usage() != hal::BufferUsage::kDevice) {
    return latch_invalid("{}: an {} buffer; ops take device buffers", what, hal::buffer_usage_name(vb->usage()));
  }
  return const_cast<VulkanBuffer*>(vb);
}

Result<VulkanBuffer*> VulkanStream::resolve_view(const hal::BufView& v, std::size_t bytes, std::string_view op,
                                                 std::string_view what) {
  if (!v) return latch_invalid("{}: {} is not set", op, what);
  return resolve(*v.buffer, v.offset, bytes, fmt::format("{}: {}", op, what), true);
}

Result<VkCommandBuffer> VulkanStream::command() {
  if (!latched_.ok()) return latched_;
  if (recording_ == VK_NULL_HANDLE) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool_;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    SX_RETURN_IF_ERROR(latch(check(a_.vkAllocateCommandBuffers(d_.handle(), &ai, &recording_), "vkAllocateCommandBuffers")));
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    SX_RETURN_IF_ERROR(latch(check(a_.vkBeginCommandBuffer(recording_, &bi), "vkBeginCommandBuffer")));
  }
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
  a_.vkCmdPipelineBarrier(recording_, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb,
                          0, nullptr, 0, nullptr);
  return recording_;
}

Status VulkanStream::submit(VulkanEvent* event) {
  if (!latched_.ok()) return latched_;
  if (recording_ == VK_NULL_HANDLE && waits_.empty() && event == nullptr) return ok_status();
  if (recording_ != VK_NULL_HANDLE) {
    // Device writes made visible to the host (readback buffers, the error word) once it waits.
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    a_.vkCmdPipelineBarrier(recording_, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0,
                            nullptr, 0, nullptr);
    SX_RETURN_IF_ERROR(latch(check(a_.vkEndCommandBuffer(recording_), "vkEndCommandBuffer")));
  }
  std::vector<VkSemaphore> wait_sems;
  std::vector<std::uint64_t> wait_values;
  std::vector<VkPipelineStageFlags> stages;
  for (const auto& [sem, value] : waits_) {
    wait_sems.push_back(sem);
    wait_values.push_back(value);
    stages.push_back(VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
  }
  VkSemaphore signal_sems[2] = {done_, VK_NULL_HANDLE};
  std::uint64_t signal_values[2] = {submitted_ + 1, 0};
  std::uint32_t n_signal = 1;
  if (event != nullptr) {
    signal_sems[1] = event->sem_;
    signal_values[1] = event->value + 1;
    n_signal = 2;
  }
  VkTimelineSemaphoreSubmitInfo ts{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  ts.waitSemaphoreValueCount = static_cast<std::uint32_t>(wait_values.size());
  ts.pWaitSemaphoreValues = wait_values.data();
  ts.signalSemaphoreValueCount = n_signal;
  ts.pSignalSemaphoreValues = signal_values;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.pNext = &ts;
  si.waitSemaphoreCount = static_cast<std::uint32_t>(wait_sems.size());
  si.pWaitSemaphores = wait_sems.data();
  si.pWaitDstStageMask = stages.data();
  si.commandBufferCount = recording_ != VK_NULL_HANDLE ? 1 : 0;
  si.pCommandBuffers = &recording_;
  si.signalSemaphoreCount = n_signal;
  si.pSignalSemaphores = signal_sems;
  SX_RETURN_IF_ERROR(latch(d_.submit(si)));
  ++submitted_;
  if (event != nullptr) ++event->value;
  waits_.clear();
  if (recording_ != VK_NULL_HANDLE) in_flight_.push_back(recording_);
  recording_ = VK_NULL_HANDLE;
  return ok_status();
}

Status VulkanStream::drain() {
  Status st = submit();
  if (submitted_ > 0) {
    VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wi.semaphoreCount = 1;
    wi.pSemaphores = &done_;
    wi.pValues = &submitted_;
    const Status waited = latch(check(a_.vkWaitSemaphores(d_.handle(), &wi, UINT64_MAX),
                                      fmt::format("{}: waiting for the stream", d_.info().name)));
    if (st.ok()) st = waited;
    if (st.ok()) st = take_device_errors();
  }
  if (!in_flight_.empty()) {
    a_.vkFreeCommandBuffers(d_.handle(), pool_, static_cast<std::uint32_t>(in_flight_.size()), in_flight_.data());
    in_flight_.clear();
  }
  staged_.clear();
  staged_bytes_ = 0;
  return st;
}

Result<VulkanBuffer*> VulkanStream::stage(std::span<const std::byte> src) {
  if (staged_bytes_ + src.size() > kMaxStagedBytes && staged_bytes_ > 0) SX_RETURN_IF_ERROR(drain());
  SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> b, d_.alloc(src.size(), hal::BufferUsage::kUpload));
  auto* vb = static_cast<VulkanBuffer*>(b.get());
  if (!src.empty()) std::memcpy(vb->mapped(), src.data(), src.size());
  staged_bytes_ += src.size();
  staged_.push_back(std::move(b));
  return vb;
}

Status VulkanStream::copy_from_host(VulkanBuffer& dst, std::size_t offset, std::span<const std::byte> src) {
  if (src.empty()) return ok_status();
  SX_ASSIGN_OR_RETURN(VulkanBuffer * st, stage(src));
  SX_ASSIGN_OR_RETURN(VkCommandBuffer cb, command());
  const VkBufferCopy region{0, offset, src.size()};
  a_.vkCmdCopyBuffer(cb, st->handle(), dst.handle(), 1, &region);
  return ok_status();
}

Status VulkanStream::upload(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) {
  if (!latched_.ok()) return latched_;
  SX_ASSIGN_OR_RETURN(VulkanBuffer * d, resolve(dst, dst_offset, src.size(), "upload", false));
  return copy_from_host(*d, dst_offset, src);
}

Status VulkanStream::update(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) {
  if (!latched_.ok()) return latched_;
  if (src.size() > kMaxUpdateBytes) {
    return latch_invalid("update: {} bytes; at most {} (use upload or a staging buffer)", src.size(),
                         kMaxUpdateBytes);
  }
  SX_ASSIGN_OR_RETURN(VulkanBuffer * d, resolve(dst, dst_offset, src.size(), "update", false));
  return copy_from_host(*d, dst_offset, src);  // staged now: src may change at once
}

Status VulkanStream::download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t src_offset) {
  if (!latched_.ok()) return latched_;
  SX_ASSIGN_OR_RETURN(VulkanBuffer * s, resolve(src, src_offset, dst.size(), "download", false));
  if (dst.empty()) return ok_status();
  SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> back, d_.alloc(dst.size(), hal::BufferUsage::kReadback));
  auto* vb = static_cast<VulkanBuffer*>(back.get());
  SX_ASSIGN_OR_RETURN(VkCommandBuffer cb, command());
  const VkBufferCopy region{src_offset, 0, dst.size()};
  a_.vkCmdCopyBuffer(cb, s->handle(), vb->handle(), 1, &region);
  SX_RETURN_IF_ERROR(drain());
  std::memcpy(dst.data(), vb->mapped(), dst.size());
  return ok_status();
}

Status VulkanStream::copy(hal::Buffer& dst, std::size_t dst_offset, const hal::Buffer& src, std::size_t src_offset,
                          std::size_t bytes) {
  if (!latched_.ok()) return latched_;
  SX_ASSIGN_OR_RETURN(VulkanBuffer * d, resolve(dst, dst_offset, bytes, "copy (destination)", false));
  SX_ASSIGN_OR_RETURN(VulkanBuffer * s, resolve(src, src_offset, bytes, "copy (source)", false));
  if (bytes == 0) return ok_status();
  SX_ASSIGN_OR_RETURN(VkCommandBuffer cb, command());
  const VkBufferCopy region{src_offset, dst_offset, bytes};
  a_.vkCmdCopyBuffer(cb, s->handle(), d->handle(), 1, &region);
  return ok_status();
}

Status VulkanStream::fill(hal::Buffer& dst, std::size_t dst_offset, std::size_t bytes, std::uint8_t value) {
  if (!latched_.ok()) return latched_;
  SX_ASSIGN_OR_RETURN(VulkanBuffer * d, resolve(dst, dst_offset, bytes, "fill", false));
  if (bytes == 0) return ok_status();
  // vkCmdFillBuffer writes whole 4-byte words at 4-byte offsets; the edges around them are copied
  // from staged bytes.
  const std::size_t begin = (dst_offset + 3) / 4 * 4, end = std::max(begin, (dst_offset + bytes) / 4 * 4);
  const std::vector<std::byte> edge(4, std::byte{value});
  const std::size_t head = std::min(begin, dst_offset + bytes) - dst_offset;
  SX_RETURN_IF_ERROR(copy_from_host(*d, dst_offset, std::span(edge).first(head)));
  if (end > begin) {
    SX_ASSIGN_OR_RETURN(VkCommandBuffer cb, command());
    a_.vkCmdFillBuffer(cb, d->handle(), begin, end - begin, 0x01010101u * value);
  }
  if (dst_offset + bytes > end) {  // (never when the range ends before `begin`: the head took it all)
    SX_RETURN_IF_ERROR(copy_from_host(*d, end, std::span(edge).first(dst_offset + bytes - end)));
  }
  return ok_status();
}

Status VulkanStream::host_call(std::function<Status()> fn) {
  if (!latched_.ok()) return latched_;
  SX_RETURN_IF_ERROR(drain());
  return latch(fn());
}

Status VulkanStream::record(hal::Event& event) {
  if (!latched_.ok()) return latched_;
  auto* e = dynamic_cast<VulkanEvent*>(&event);
  if (e == nullptr || &e->device_ != &d_) {
    return latch_invalid("record: the event is not one of {}", d_.info().name);
  }
  return submit(e);
}

Status VulkanStream::wait(const hal::Event& event) {
  if (!latched_.ok()) return latched_;
  const auto* e = dynamic_cast<const VulkanEvent*>(&event);
  if (e == nullptr || &e->device_ != &d_) {
    return latch_invalid("wait: the event is not one of {}", d_.info().name);
  }
  if (e->value == 0) return latch(failed_precondition_error("wait: the event was never recorded"));
  SX_RETURN_IF_ERROR(submit());  // what was enqueued before the wait need not wait
  waits_.emplace_back(e->sem_, e->value);
  return ok_status();
}

Status VulkanStream::sync() {
  const Status st = drain();
  return latched_.ok() ? st : latched_;
}

// Binds `v` (`bytes` from its offset) at `binding`: from the offset rounded down to the device's
// alignment; the returned remainder, in 4-byte elements, goes to the shader.
struct Bound {
  VkDescriptorBufferInfo info;
  std::uint32_t element_offset;
};

Result<Bound> bind_window(const VulkanDevice& d, const VulkanBuffer& b, std::size_t offset, std::size_t bytes,
                          std::string_view what) {
  const std::size_t align = std::max<std::size_t>(d.limits().minStorageBufferOffsetAlignment, 4);
  if (offset % 4 != 0) return invalid_argument_error("{}: offset {} is not a multiple of 4 bytes", what, offset);
  const std::size_t base = offset / align * align;
  const std::size_t range = offset - base + std::max<std::size_t>(bytes, 4);
  if (range > d.binding_limit()) {
    return invalid_argument_error("{}: a window of {} bytes exceeds the {} one binding may span on {}", what, range,
                                  d.binding_limit(), d.info().name);
  }
  return Bound{{b.handle(), base, std::min<std::size_t>(range, b.size() - base)},
               static_cast<std::uint32_t>((offset - base) / 4)};
}

Status VulkanStream::dispatch(Shader shader, const char* op, std::span<const Arg> args,
                              std::span<const std::uint32_t> params, std::uint64_t groups) {
  const Pipeline& p = d_.pipeline(shader);
  if (args.size() != p.bindings) return latch(internal_error("{}: {} operands for {} bindings", op, args.size(), p.bindings));
  std::vector<VkDescriptorBufferInfo> infos(args.size());
  std::vector<std::uint32_t> pc;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const Arg& a = args[i];
    SX_ASSIGN_OR_RETURN(VulkanBuffer * b, a.internal ? resolve(*a.view.buffer, a.view.offset, a.bytes, op, false)
                                                     : resolve_view(a.view, a.bytes, op, a.name));
    auto w = bind_window(d_, *b, a.view.offset, a.bytes, fmt::format("{}: {}", op, a.name));
    SX_RETURN_IF_ERROR(latch(w.status()));
    infos[i] = w->info;
    pc.push_back(w->element_offset);
  }
  pc.insert(pc.end(), params.begin(), params.end());
  if (groups == 0) return ok_status();
  const std::uint64_t max_x = d_.limits().maxComputeWorkGroupCount[0];
  const auto gx = static_cast<std::uint32_t>(std::min<std::uint64_t>(groups, max_x));
  const std::uint64_t gy = (groups + gx - 1) / gx;
  if (gy > d_.limits().maxComputeWorkGroupCount[1]) {
    return latch_invalid("{}: {} workgroups exceed the device's grid", op, groups);
  }
  pc.push_back(gx);
  if (pc.size() * 4 > kPushConstantBytes) return latch(internal_error("{}: {} push-constant words", op, pc.size()));
  std::vector<VkWriteDescriptorSet> writes(args.size());
  for (std::size_t i = 0; i < args.size(); ++i) {
    writes[i] = VkWriteDescriptorSet{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = static_cast<std::uint32_t>(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  SX_ASSIGN_OR_RETURN(VkCommandBuffer cb, command());
  a_.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  a_.vkCmdPushDescriptorSetKHR(cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0,
                               static_cast<std::uint32_t>(writes.size()), writes.data());
  a_.vkCmdPushConstants(cb, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, static_cast<std::uint32_t>(pc.size() * 4),
                        pc.data());
  a_.vkCmdDispatch(cb, gx, static_cast<std::uint32_t>(gy), 1);
  return ok_status();
}

namespace {

std::uint32_t u32(std::int64_t v) { return static_cast<std::uint32_t>(v); }
std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Counts a shader indexes with 32-bit arithmetic.
bool fits_u32(std::int64_t v) { return v >= 0 && v <= std::int64_t{UINT32_MAX}; }

}  // namespace

Status VulkanStream::run_add(const hal::AddArgs& a) {
  if (a.n < 0) return latch_invalid("add: n {} is negative", a.n);
  if (a.n == 0) return ok_status();
  // Windows of at most `chunk` elements, each within the binding limit with its alignment
  // (whole workgroups of elements when the limit allows).
  const std::size_t align = std::max<std::size_t>(d_.limits().minStorageBufferOffsetAlignment, 4);
  std::size_t chunk = std::max<std::size_t>((d_.binding_limit() - std::min(d_.binding_limit(), align)) / 4, 1);
  if (chunk >= kWorkgroup) chunk = chunk / kWorkgroup * kWorkgroup;
  const auto n = static_cast<std::size_t>(a.n);
  for (std::size_t at = 0; at < n; at += chunk) {
    const std::size_t m = std::min(chunk, n - at);
    const Arg args[] = {{a.a.at(at * 4), m * 4, "a"}, {a.b.at(at * 4), m * 4, "b"}, {a.out.at(at * 4), m * 4, "out"}};
    const std::uint32_t params[] = {static_cast<std::uint32_t>(m)};
    SX_RETURN_IF_ERROR(dispatch(kShaderAdd, "add", args, params, (m + kWorkgroup - 1) / kWorkgroup));
  }
  return ok_status();
}

Status VulkanStream::run_silu_mul(const hal::SiluMulArgs& a) {
  if (a.n_rows < 0 || a.n_cols < 0) return latch_invalid("silu_mul: {} rows of {} columns", a.n_rows, a.n_cols);
  const std::int64_t gs = a.gate_stride > 0 ? a.gate_stride : a.n_cols, us = a.up_stride > 0 ? a.up_stride : a.n_cols,
                     os = a.out_stride > 0 ? a.out_stride : a.n_cols;
  if (gs < a.n_cols || us < a.n_cols || os < a.n_cols || !fits_u32(a.n_rows * std::max({gs, us, os}))) {
    return latch_invalid("silu_mul: strides {}, {}, {} for rows of {}", gs, us, os, a.n_cols);
  }
  if (a.n_rows == 0 || a.n_cols == 0) return ok_status();
  auto bytes = [&](std::int64_t stride) { return static_cast<std::size_t>((a.n_rows - 1) * stride + a.n_cols) * 4; };
  const Arg args[] = {{a.gate, bytes(gs), "gate"}, {a.up, bytes(us), "up"}, {a.out, bytes(os), "out"}};
  const std::uint32_t params[] = {u32(a.n_rows), u32(a.n_cols), u32(gs), u32(us), u32(os)};
  return dispatch(kShaderSiluMul, "silu_mul", args, params,
                  (static_cast<std::uint64_t>(a.n_rows * a.n_cols) + kWorkgroup - 1) / kWorkgroup);
}

Status VulkanStream::run_rmsnorm(const hal::RmsNormArgs& a) {
  if (a.n_rows < 0 || a.dim <= 0 || !fits_u32(a.n_rows * a.dim)) {
    return latch_invalid("rmsnorm: {} rows of {}", a.n_rows, a.dim);
  }
  if (a.n_rows == 0) return ok_status();
  const auto bytes = static_cast<std::size_t>(a.n_rows * a.dim) * 4;
  const Arg args[] = {{a.x, bytes, "x"}, {a.add ? a.add : a.x, bytes, "add"},
                      {a.weight, static_cast<std::size_t>(a.dim) * 4, "weight"}, {a.out, bytes, "out"}};
  const std::uint32_t params[] = {u32(a.n_rows), u32(a.dim), a.add ? 1u : 0u, float_bits(a.eps)};
  return dispatch(kShaderRmsNorm, "rmsnorm", args, params, static_cast<std::uint64_t>(a.n_rows));
}

Status VulkanStream::run_top_k(const hal::TopKArgs& a) {
  if (a.n_rows < 0 || a.n_cols < 1 || a.k < 1 || a.k > std::min(a.n_cols, hal::kMaxTopK) ||
      !fits_u32(a.n_rows * a.n_cols) || a.id_offset < 0 || a.id_offset + a.n_cols > INT32_MAX) {
    return latch_invalid("top_k: k {} of rows of {} (1 <= k <= min(n_cols, {})), id offset {}", a.k, a.n_cols,
                         hal::kMaxTopK, a.id_offset);
  }
  if (a.n_rows == 0) return ok_status();
  const auto out = static_cast<std::size_t>(a.n_rows * a.k) * 4;
  const Arg args[] = {{a.x, static_cast<std::size_t>(a.n_rows * a.n_cols) * 4, "x"}, {a.values, out, "values"},
                      {a.ids, out, "ids"}};
  const std::uint32_t params[] = {u32(a.n_rows), u32(a.n_cols), u32(a.k), u32(a.id_offset)};
  return dispatch(kShaderTopK, "top_k", args, params, static_cast<std::uint64_t>(a.n_rows));
}

std::size_t VulkanStream::window_rows(std::size_t row_bytes) const {
  const std::size_t align = std::max<std::size_t>(d_.limits().minStorageBufferOffsetAlignment, 4);
  const std::size_t room = d_.binding_limit() - std::min(d_.binding_limit(), align);
  return room / row_bytes / 2 * 2;
}

Status VulkanStream::check_weight_format(const hal::BufView& b, hal::DType format, const char* op) {
  const auto* t = b ? dynamic_cast<const VulkanBuffer*>(b.buffer) : nullptr;
  if (t != nullptr && t->weight_format && *t->weight_format != format) {
    return latch_invalid("{}: the buffer was uploaded as {} weights and cannot be read as {}", op,
                         hal::dtype_name(*t->weight_format), hal::dtype_name(format));
  }
  return ok_status();
}

Status VulkanStream::run_kv_write(const hal::KvWriteArgs& a) {
  SX_RETURN_IF_ERROR(latch(d_.supports(a)));
  const std::int64_t row = a.n_kv_heads * a.head_dim;
  if (a.n_tokens < 0 || row < 1 || a.n_slots < 1 || !fits_u32(a.n_slots * row) || !fits_u32(a.n_tokens * row)) {
    return latch_invalid("kv_write: {} tokens of {} KV heads of {} into {} slots", a.n_tokens, a.n_kv_heads,
                         a.head_dim, a.n_slots);
  }
  if (a.n_tokens == 0) return ok_status();
  const bool f16 = a.cache_type == hal::DType::kF16;
  const std::size_t elem = f16 ? 2 : 4;
  const auto in = static_cast<std::size_t>(a.n_tokens * row) * 4, cache = static_cast<std::size_t>(a.n_slots * row) * elem;
  const Arg args[] = {{a.k, in, "k"},
                      {a.v, in, "v"},
                      {a.k_cache, cache, "k_cache"},
                      {a.v_cache, cache, "v_cache"},
                      {a.slot_mapping, static_cast<std::size_t>(a.n_tokens) * 4, "slot_mapping"},
                      {{errors_.get(), 0}, 16, "errors", true}};
  const std::uint32_t params[] = {u32(a.n_tokens), u32(row), u32(a.n_slots), f16 ? 1u : 0u};
  const std::uint64_t words = static_cast<std::uint64_t>(a.n_tokens * (f16 ? row / 2 : row));
  return dispatch(kShaderKvWrite, "kv_write", args, params, (words + kWorkgroup - 1) / kWorkgroup);
}

Status VulkanStream::run_matmul(const hal::MatmulArgs& a) {
  const int format = weight_format(a.w_type);
  if (format < 0) return latch(d_.supports(a));
  if (a.m < 0 || a.n < 1 || a.k < 1 || a.k % hal::dtype_info(a.w_type).block_elems != 0 || !fits_u32(a.m * a.n) ||
      !fits_u32(a.m * a.k)) {
    return latch_invalid("matmul: [{} x {}] x [{} x {}] {} weights", a.m, a.k, a.n, a.k, hal::dtype_name(a.w_type));
  }
  SX_RETURN_IF_ERROR(check_weight_format(a.w, a.w_type, "matmul"));
  if (a.m == 0) return ok_status();
  const std::size_t rb = hal::row_bytes(a.w_type, a.k);
  const std::size_t rows = window_rows(rb);
  if (rows == 0) return latch_invalid("matmul: a weight row of {} bytes does not fit one binding twice", rb);
  const auto n = static_cast<std::size_t>(a.n);
  const auto mk = static_cast<std::size_t>(a.m * a.k);
  // Q8_0: x quantised once per call into q8_ (int8 values, then one F32 scale per 32).
  const bool q8 = a.w_type == hal::DType::kQ8_0;
  hal::BufView qx = a.x, dx = a.x;
  if (q8) {
    SX_ASSIGN_OR_RETURN(std::tie(qx, dx), quantize_q8(a.x, mk, false, "matmul"));
  }
  const bool tiled = a.m >= kMatmulTiledMinM;
  const Shader shader = d_.matmul_subgroups() ? (tiled ? kShaderMatmulSubgroupTiled : kShaderMatmulSubgroup)
                                              : (tiled ? kShaderMatmulTiled : kShaderMatmul);
  const std::uint32_t per_group = d_.matmul_rows_per_group();
  const std::uint64_t tiles = tiled ? (static_cast<std::uint64_t>(a.m) + kMatmulTile - 1) / kMatmulTile
                                    : static_cast<std::uint64_t>(a.m);
  for (std::size_t begin = 0; begin < n; begin += rows) {
    const std::size_t r = std::min(rows, n - begin);
    const Arg args[] = {{a.w.at(begin * rb), r * rb, "w"},
                        {a.x, mk * 4, "x"},
                        {a.bias ? a.bias : a.x, a.bias ? n * 4 : 4, "bias"},
                        {a.y, static_cast<std::size_t>(a.m) * n * 4, "y"},
                        {qx, q8 ? mk : 4, "int8 x", q8},
                        {dx, q8 ? mk / 8 : 4, "int8 x scales", q8}};
    const std::uint32_t params[] = {u32(a.m),  u32(a.n), u32(a.k), static_cast<std::uint32_t>(format),
                                    static_cast<std::uint32_t>(rb), static_cast<std::uint32_t>(begin),
                                    static_cast<std::uint32_t>(r), a.bias ? 1u : 0u, per_group};
    SX_RETURN_IF_ERROR(dispatch(shader, "matmul", args, params, tiles * ((r + per_group - 1) / per_group)));
  }
  return ok_status();
}

Status VulkanStream::grow(std::unique_ptr<hal::Buffer>& b, std::size_t bytes) {
  if (b != nullptr && b->size() >= bytes) return ok_status();
  if (b != nullptr) staged_.push_back(std::move(b));
  auto fresh = d_.alloc(bytes, hal::BufferUsage::kDevice);
  if (!fresh.ok()) return latch(fresh.status());
  b = std::move(*fresh);
  return ok_status();
}

Result<std::pair<hal::BufView, hal::BufView>> VulkanStream::quantize_q8(const hal::BufView& x, std::size_t mk,
                                                                         bool internal, const char* op) {
  const std::size_t need = mk + mk / 8;
  SX_RETURN_IF_ERROR(grow(q8_, std::max<std::size_t>(need, std::size_t{1} << 20)));
  const hal::BufView qx{q8_.get(), 0}, dx{q8_.get(), mk};
  const Arg args[] = {{x, mk * 4, "x", internal}, {qx, mk, "int8 x", true}, {dx, mk / 8, "int8 x scales", true}};
  const std::uint32_t params[] = {static_cast<std::uint32_t>(mk / 32)};
  SX_RETURN_IF_ERROR(dispatch(kShaderQuantizeQ8, op, args, params, (mk / 32 + 63) / 64));
  return std::pair{qx, dx};
}

Status VulkanStream::run_moe_router(const hal::MoeRouterArgs& a) {
  if (a.n_tokens < 0 || a.k < 1 || a.k > hal::kMaxTopK || a.k > a.n_experts || a.n_experts > INT32_MAX ||
      !fits_u32(a.n_tokens * a.n_experts)) {
    return latch_invalid("moe_router: k {} must be in [1, {}] and at most the {} experts ({} tokens)", a.k,
                         hal::kMaxTopK, a.n_experts, a.n_tokens);
  }
  if (a.n_tokens == 0) return ok_status();
  const auto out = static_cast<std::size_t>(a.n_tokens * a.k) * 4;
  const Arg args[] = {{a.logits, static_cast<std::size_t>(a.n_tokens * a.n_experts) * 4, "logits"},
                      {a.ids, out, "ids"},
                      {a.weights, out, "weights"}};
  const std::uint32_t params[] = {u32(a.n_tokens), u32(a.n_experts), u32(a.k), a.normalize ? 1u : 0u};
  return dispatch(kShaderMoeRouter, "moe_router", args, params, static_cast<std::uint64_t>(a.n_tokens));
}

Status VulkanStream::moe_matmul(const hal::MoeFfnArgs& a, const hal::BufView& w, hal::DType type, std::int64_t rows,
                                std::int64_t cols, const hal::BufView& x, bool x_internal, std::uint32_t x_div,
                                const hal::BufView& y, const hal::BufView& routes, const hal::BufView& counts) {
  const std::size_t rb = hal::row_bytes(type, cols), expert_bytes = rb * static_cast<std::size_t>(rows);
  // Windows of whole experts, starting at whole words (row bytes are even in every format, so an
  // even number of experts always is).
  const std::size_t align = std::max<std::size_t>(d_.limits().minStorageBufferOffsetAlignment, 4);
  std::size_t per_window = (d_.binding_limit() - std::min(d_.binding_limit(), align)) / expert_bytes;
  if (expert_bytes % 4 != 0) per_window = per_window / 2 * 2;
  if (per_window == 0) {
    return latch_invalid("moe_ffn: an expert of {} bytes does not fit one binding", expert_bytes);
  }
  const auto T = static_cast<std::size_t>(a.n_tokens), slots = T * static_cast<std::size_t>(a.k);
  const std::size_t in_rows = x_div == 1 ? slots : T, mk = in_rows * static_cast<std::size_t>(cols);
  const bool q8 = type == hal::DType::kQ8_0;
  hal::BufView qx = x, dx = x;
  if (q8) {
    SX_ASSIGN_OR_RETURN(std::tie(qx, dx), quantize_q8(x, mk, x_internal, "moe_ffn"));
  }
  // Tiles of kMatmulTile rows when the experts get that many tokens on average.
  const bool tiled = slots >= static_cast<std::size_t>(kMatmulTiledMinM * a.n_local);
  const Shader shader = d_.matmul_subgroups() ? (tiled ? kShaderMatmulSubgroupMoeTiled : kShaderMatmulSubgroupMoe)
                                              : (tiled ? kShaderMatmulMoeTiled : kShaderMatmulMoe);
  const std::uint32_t per_group = d_.matmul_rows_per_group();
  const std::uint64_t tiles = tiled ? (T + kMatmulTile - 1) / kMatmulTile : T;
  const auto n_local = static_cast<std::size_t>(a.n_local);
  for (std::size_t begin = 0; begin < n_local; begin += per_window) {
    const std::size_t ne = std::min(per_window, n_local - begin);
    const Arg args[] = {{w.at(begin * expert_bytes), ne * expert_bytes, "experts"},
                        {x, mk * 4, "x", x_internal},
                        {x, 4, "bias", x_internal},
                        {y, slots * static_cast<std::size_t>(rows) * 4, "y", true},
                        {qx, q8 ? mk : 4, "int8 x", q8 || x_internal},
                        {dx, q8 ? mk / 8 : 4, "int8 x scales", q8 || x_internal},
                        {routes, n_local * T * 4, "routes", true},
                        {counts, n_local * 4, "counts", true}};
    const std::uint32_t params[] = {static_cast<std::uint32_t>(slots), u32(rows), u32(cols),
                                    static_cast<std::uint32_t>(weight_format(type)), static_cast<std::uint32_t>(rb),
                                    0u, u32(rows), 0u, per_group, x_div, static_cast<std::uint32_t>(T),
                                    static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(ne)};
    SX_RETURN_IF_ERROR(dispatch(shader, "moe_ffn", args, params,
                                ne * tiles * ((static_cast<std::uint64_t>(rows) + per_group - 1) / per_group)));
  }
  return ok_status();
}

Status VulkanStream::run_moe_ffn(const hal::MoeFfnArgs& a) {
  SX_RETURN_IF_ERROR(latch(d_.supports(a)));
  SX_RETURN_IF_ERROR(latch(hal::check_moe_ffn(a)));
  if (!fits_u32(a.n_tokens * a.k * std::max(a.dim, a.ffn)) || !fits_u32(a.n_local * a.n_tokens)) {
    return latch_invalid("moe_ffn: {} tokens x {} choices of rows of {} and {} exceed 32-bit indexing", a.n_tokens,
                         a.k, a.dim, a.ffn);
  }
  SX_RETURN_IF_ERROR(check_weight_format(a.gate, a.gate_type, "moe_ffn"));
  SX_RETURN_IF_ERROR(check_weight_format(a.up, a.up_type, "moe_ffn"));
  SX_RETURN_IF_ERROR(check_weight_format(a.down, a.down_type, "moe_ffn"));
  const auto T = static_cast<std::size_t>(a.n_tokens), H = static_cast<std::size_t>(a.dim),
             F = static_cast<std::size_t>(a.ffn), slots = T * static_cast<std::size_t>(a.k);
  if (T == 0) return ok_status();
  if (a.n_local == 0) {  // a rank without experts contributes zeros
    SX_ASSIGN_OR_RETURN(VulkanBuffer * out, resolve_view(a.out, T * H * 4, "moe_ffn", "out"));
    return fill(*out, a.out.offset, T * H * 4, 0);
  }
  // The workspace: routes [n_local][T], counts [n_local], gate and up outputs [slots][F] (the
  // gate's becoming silu(gate) * up), down outputs [slots][H].
  const auto n_local = static_cast<std::size_t>(a.n_local);
  const std::size_t align = std::max<std::size_t>(d_.limits().minStorageBufferOffsetAlignment, 4);
  auto aligned = [&](std::size_t bytes) { return (bytes + align - 1) / align * align; };
  const std::size_t routes_at = 0, counts_at = aligned(n_local * T * 4), gate_at = counts_at + aligned(n_local * 4),
                    up_at = gate_at + aligned(slots * F * 4), down_at = up_at + aligned(slots * F * 4),
                    need = down_at + slots * H * 4;
  SX_RETURN_IF_ERROR(grow(moe_, need));
  hal::Buffer* ws = moe_.get();
  const hal::BufView routes{ws, routes_at}, counts{ws, counts_at}, g{ws, gate_at}, u{ws, up_at}, y{ws, down_at};
  {
    const Arg args[] = {{a.ids, slots * 4, "ids"}, {routes, n_local * T * 4, "routes", true},
                        {counts, n_local * 4, "counts", true}};
    const std::uint32_t params[] = {static_cast<std::uint32_t>(slots), static_cast<std::uint32_t>(T),
                                    u32(a.expert_begin), u32(a.n_local)};
    SX_RETURN_IF_ERROR(dispatch(kShaderMoeRoute, "moe_ffn", args, params, (n_local + 63) / 64));
  }
  const auto k = static_cast<std::uint32_t>(a.k);
  SX_RETURN_IF_ERROR(moe_matmul(a, a.gate, a.gate_type, a.ffn, a.dim, a.x, false, k, g, routes, counts));
  SX_RETURN_IF_ERROR(moe_matmul(a, a.up, a.up_type, a.ffn, a.dim, a.x, false, k, u, routes, counts));
  {
    const Arg args[] = {{g, slots * F * 4, "gate", true}, {u, slots * F * 4, "up", true}, {g, slots * F * 4, "gate", true}};
    const std::uint32_t params[] = {static_cast<std::uint32_t>(slots), u32(a.ffn), u32(a.ffn), u32(a.ffn), u32(a.ffn)};
    SX_RETURN_IF_ERROR(dispatch(kShaderSiluMul, "moe_ffn", args, params, (slots * F + kWorkgroup - 1) / kWorkgroup));
  }
  SX_RETURN_IF_ERROR(moe_matmul(a, a.down, a.down_type, a.dim, a.ffn, g, true, 1, y, routes, counts));
  const Arg args[] = {{y, slots * H * 4, "down", true}, {a.ids, slots * 4, "ids"}, {a.weights, slots * 4, "weights"},
                      {a.out, T * H * 4, "out"}};
  const std::uint32_t params[] = {static_cast<std::uint32_t>(T), u32(a.dim), k, u32(a.expert_begin), u32(a.n_local)};
  return dispatch(kShaderMoeCombine, "moe_ffn", args, params, (T * H + kWorkgroup - 1) / kWorkgroup);
}

Status VulkanStream::run_embedding(const hal::EmbeddingArgs& a) {
  const int format = weight_format(a.table_type);
  if (format < 0) return latch(d_.supports(a));
  if (a.n_tokens < 0 || a.dim <= 0 || a.vocab <= 0 || !fits_u32(a.n_tokens * a.dim) || a.vocab > INT32_MAX ||
      a.dim % hal::dtype_info(a.table_type).block_elems != 0) {
    return latch_invalid("embedding: {} tokens of {} from a vocabulary of {} in {}", a.n_tokens, a.dim, a.vocab,
                         hal::dtype_name(a.table_type));
  }
  SX_RETURN_IF_ERROR(check_weight_format(a.table, a.table_type, "embedding"));
  if (a.n_tokens == 0) return ok_status();
  const std::size_t rb = hal::row_bytes(a.table_type, a.dim);
  const std::size_t rows = window_rows(rb);
  if (rows == 0) return latch_invalid("embedding: a row of {} bytes does not fit one binding twice", rb);
  const auto vocab = static_cast<std::size_t>(a.vocab);
  const auto n = static_cast<std::size_t>(a.n_tokens);
  for (std::size_t begin = 0; begin < vocab; begin += rows) {
    const std::size_t m = std::min(rows, vocab - begin);
    const Arg args[] = {{a.table.at(begin * rb), m * rb, "table"},
                        {a.ids, n * 4, "ids"},
                        {a.out, n * static_cast<std::size_t>(a.dim) * 4, "out"},
                        {{errors_.get(), 0}, 16, "errors", true}};
    const std::uint32_t params[] = {u32(a.n_tokens), u32(a.dim),    u32(a.vocab),    a.shard ? 1u : 0u,
                                    u32(a.vocab_offset), u32(format), static_cast<std::uint32_t>(rb),
                                    static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(m),
                                    begin == 0 ? 1u : 0u};
    SX_RETURN_IF_ERROR(dispatch(kShaderEmbedding, "embedding", args, params,
                                (static_cast<std::uint64_t>(n) * a.dim + kWorkgroup - 1) / kWorkgroup));
  }
  return ok_status();
}

Status VulkanStream::run_rope(const hal::RopeArgs& a) {
  if (a.rot_dim <= 0 || a.rot_dim > a.head_dim || a.rot_dim % 2 != 0 || a.rot_dim > kMaxRotDim) {
    return latch_invalid("rope: rot_dim {} must be even, positive, at most head_dim {} and {}", a.rot_dim, a.head_dim,
                         kMaxRotDim);
  }
  if (a.n_tokens < 0 || a.n_heads < 0 || !fits_u32(a.n_tokens * a.n_heads * a.head_dim)) {
    return latch_invalid("rope: {} tokens of {} heads of {}", a.n_tokens, a.n_heads, a.head_dim);
  }
  if (!(a.theta >= 1.0f) || !std::isfinite(a.theta)) {  // frequencies at most 1: fractions of a turn below 1
    return latch_invalid("rope: theta {} must be finite and at least 1", a.theta);
  }
  if (a.n_tokens == 0 || a.n_heads == 0) return ok_status();
  const std::int64_t half = a.rot_dim / 2;
  if (a.theta != rope_theta_ || a.rot_dim != rope_rot_) {
    // inv_freq[i] / (2 pi) as a 64-bit binary fraction, high word first (shaders/rope.comp).
    std::vector<std::uint32_t> table(static_cast<std::size_t>(2 * half));
    for (std::int64_t i = 0; i < half; ++i) {
      const double f = std::pow(static_cast<double>(a.theta), -2.0 * static_cast<double>(i) / static_cast<double>(a.rot_dim));
      const auto fixed = static_cast<std::uint64_t>(std::ldexp(f / (2.0 * M_PI), 64));  // f <= 1: below 2^62
      table[static_cast<std::size_t>(2 * i)] = static_cast<std::uint32_t>(fixed >> 32);
      table[static_cast<std::size_t>(2 * i + 1)] = static_cast<std::uint32_t>(fixed);
    }
    SX_RETURN_IF_ERROR(update(*rope_freq_, 0, std::as_bytes(std::span<const std::uint32_t>(table))));
    rope_theta_ = a.theta;
    rope_rot_ = a.rot_dim;
  }
  const Arg args[] = {{a.x, static_cast<std::size_t>(a.n_tokens * a.n_heads * a.head_dim) * 4, "x"},
                      {a.positions, static_cast<std::size_t>(a.n_tokens) * 4, "positions"},
                      {{rope_freq_.get(), 0}, static_cast<std::size_t>(2 * half) * 4, "frequencies"}};
  const std::uint32_t params[] = {u32(a.n_tokens), u32(a.n_heads), u32(a.head_dim), u32(half)};
  return dispatch(kShaderRope, "rope", args, params,
                  (static_cast<std::uint64_t>(a.n_tokens * a.n_heads * half) + kWorkgroup - 1) / kWorkgroup);
}

Status VulkanStream::run_attention(const hal::AttentionArgs& a) {
  SX_RETURN_IF_ERROR(latch(d_.supports(a)));
  if (a.n_seqs < 1 || a.n_tokens < 0 || a.n_heads < 1 || a.n_kv_heads < 1 || a.head_dim < 1 || a.block_size < 1 ||
      a.max_blocks_per_seq < 1 || a.n_slots < 1 || a.heads_per_kv < 1 || a.q_head_offset < 0 || a.kv_head_offset < 0 ||
      !fits_u32(a.n_slots * a.n_kv_heads * a.head_dim) || !fits_u32(a.n_tokens * a.n_heads * a.head_dim)) {
    return latch_invalid("attention: {} sequences, {} tokens, {} heads ({} KV) of {}, blocks of {} x {}, {} slots",
                         a.n_seqs, a.n_tokens, a.n_heads, a.n_kv_heads, a.head_dim, a.block_size, a.max_blocks_per_seq,
                         a.n_slots);
  }
  if (a.n_tokens == 0) return ok_status();
  const std::size_t elem = hal::dtype_info(a.cache_type).block_bytes;
  const auto cache = static_cast<std::size_t>(a.n_slots * a.n_kv_heads * a.head_dim) * elem;
  const auto qo = static_cast<std::size_t>(a.n_tokens * a.n_heads * a.head_dim) * 4;
  const Arg args[] = {{a.q, qo, "q"},
                      {a.k_cache, cache, "k_cache"},
                      {a.v_cache, cache, "v_cache"},
                      {a.out, qo, "out"},
                      {a.seq_token_start, static_cast<std::size_t>(a.n_seqs + 1) * 4, "seq_token_start"},
                      {a.seq_context_len, static_cast<std::size_t>(a.n_seqs) * 4, "seq_context_len"},
                      {a.block_table, static_cast<std::size_t>(a.n_seqs * a.max_blocks_per_seq) * 4, "block_table"},
                      {{errors_.get(), 0}, 16, "errors", true}};
  const std::uint32_t params[] = {u32(a.n_seqs),        u32(a.n_tokens),       u32(a.n_heads),
                                  u32(a.n_kv_heads),    u32(a.head_dim),       u32(a.block_size),
                                  u32(a.max_blocks_per_seq), u32(a.n_slots),   u32(a.q_head_offset),
                                  u32(a.kv_head_offset), u32(a.heads_per_kv),
                                  a.cache_type == hal::DType::kF16 ? 1u : 0u, float_bits(a.scale)};
  return dispatch(kShaderAttention, "attention", args, params, static_cast<std::uint64_t>(a.n_tokens * a.n_heads));
}

// ---- Gated DeltaNet and gated attention (hal::SigmoidMulArgs, GatedNormArgs, ConvStateArgs,
// DeltaRuleArgs). The batch arrays of the state ops are the engine's, checked before the step
// (Model::validate), as attention's block tables are.

Status VulkanStream::run_sigmoid_mul(const hal::SigmoidMulArgs& a) {
  const std::int64_t gate_cols = a.gate_per_row ? 1 : a.n_cols;
  const std::int64_t xs = a.x_stride > 0 ? a.x_stride : a.n_cols, gs = a.gate_stride > 0 ? a.gate_stride : gate_cols,
                     os = a.out_stride > 0 ? a.out_stride : a.n_cols;
  if (a.n_rows < 0 || a.n_cols < 0 || xs < a.n_cols || gs < gate_cols || os < a.n_cols ||
      !fits_u32(a.n_rows * std::max({xs, gs, os}))) {
    return latch_invalid("sigmoid_mul: {} rows of {} with strides {}, {}, {}", a.n_rows, a.n_cols, xs, gs, os);
  }
  if (a.n_rows == 0 || a.n_cols == 0) return ok_status();
  auto bytes = [&](std::int64_t stride, std::int64_t cols) {
    return static_cast<std::size_t>((a.n_rows - 1) * stride + cols) * 4;
  };
  const Arg args[] = {{a.x, bytes(xs, a.n_cols), "x"}, {a.gate, bytes(gs, gate_cols), "gate"},
                      {a.out, bytes(os, a.n_cols), "out"}};
  const std::uint32_t params[] = {u32(a.n_rows), u32(a.n_cols), u32(xs), u32(gs), u32(os), a.gate_per_row ? 1u : 0u};
  return dispatch(kShaderSigmoidMul, "sigmoid_mul", args, params,
                  (static_cast<std::uint64_t>(a.n_rows * a.n_cols) + kWorkgroup - 1) / kWorkgroup);
}

Status VulkanStream::run_gated_norm(const hal::GatedNormArgs& a) {
  if (a.n_rows < 0 || a.dim <= 0 || !fits_u32(a.n_rows * a.dim)) {
    return latch_invalid("gated_norm: {} rows of {}", a.n_rows, a.dim);
  }
  if (a.n_rows == 0) return ok_status();
  const auto bytes = static_cast<std::size_t>(a.n_rows * a.dim) * 4;
  const Arg args[] = {{a.x, bytes, "x"}, {a.z, bytes, "z"}, {a.weight, static_cast<std::size_t>(a.dim) * 4, "weight"},
                      {a.out, bytes, "out"}};
  const std::uint32_t params[] = {u32(a.n_rows), u32(a.dim), float_bits(a.eps)};
  return dispatch(kShaderGatedNorm, "gated_norm", args, params, static_cast<std::uint64_t>(a.n_rows));
}

Status VulkanStream::run_conv_state(const hal::ConvStateArgs& a) {
  if (Status st = hal::check_conv_state(a); !st.ok()) return latch(st);
  const std::int64_t xs = a.x_stride > 0 ? a.x_stride : a.channels;
  if (!fits_u32(std::max(a.n_tokens, std::int64_t{1}) * xs) || !fits_u32(a.n_slots * a.kernel * a.channels)) {
    return latch_invalid("conv_state: {} tokens of {} channels, {} slots", a.n_tokens, a.channels, a.n_slots);
  }
  if (a.n_seqs == 0) return ok_status();
  const auto tokens = static_cast<std::size_t>(std::max<std::int64_t>(a.n_tokens, 1));
  const auto seqs = static_cast<std::size_t>(a.n_seqs);
  const Arg args[] = {{a.x, ((tokens - 1) * static_cast<std::size_t>(xs) + static_cast<std::size_t>(a.channels)) * 4, "x"},
                      {a.weight, static_cast<std::size_t>(a.channels * a.kernel) * 4, "weight"},
                      {a.state, static_cast<std::size_t>(a.n_slots * (a.kernel - 1) * a.channels) * 4, "state"},
                      {a.out, tokens * static_cast<std::size_t>(a.channels) * 4, "out"},
                      {a.seq_token_start, (seqs + 1) * 4, "seq_token_start"},
                      {a.seq_context_len, seqs * 4, "seq_context_len"},
                      {a.seq_slot, seqs * 4, "seq_slot"}};
  const std::uint32_t params[] = {u32(a.n_seqs), u32(a.channels), u32(a.kernel), u32(xs)};
  return dispatch(kShaderConvState, "conv_state", args, params,
                  (static_cast<std::uint64_t>(a.n_seqs * a.channels) + kWorkgroup - 1) / kWorkgroup);
}

Status VulkanStream::run_delta_rule(const hal::DeltaRuleArgs& a) {
  if (Status st = hal::check_delta_rule(a); !st.ok()) return latch(st);
  if (a.d_k > kMaxDeltaHeadDimShader || a.d_v > kMaxDeltaHeadDimShader) {
    return latch(unimplemented_error("delta_rule: heads of {} x {}; the shader takes at most {}", a.d_k, a.d_v,
                                     kMaxDeltaHeadDimShader));
  }
  const std::int64_t qkv = a.qkv_stride > 0 ? a.qkv_stride : 2 * a.n_k_heads * a.d_k + a.n_v_heads * a.d_v;
  const std::int64_t gs = a.gate_stride > 0 ? a.gate_stride : a.n_v_heads;
  const std::int64_t state = a.n_slots * a.n_v_heads * a.d_k * a.d_v;
  if (!fits_u32(std::max(a.n_tokens, std::int64_t{1}) * qkv) || !fits_u32(state)) {
    return latch_invalid("delta_rule: {} tokens of rows of {}, a state pool of {} floats", a.n_tokens, qkv, state);
  }
  if (a.n_seqs == 0) return ok_status();
  const auto last = static_cast<std::size_t>(std::max<std::int64_t>(a.n_tokens, 1) - 1);
  const auto seqs = static_cast<std::size_t>(a.n_seqs);
  const std::size_t qk = (last * static_cast<std::size_t>(qkv) + static_cast<std::size_t>(a.n_k_heads * a.d_k)) * 4;
  const std::size_t gate = (last * static_cast<std::size_t>(gs) + static_cast<std::size_t>(a.n_v_heads)) * 4;
  const Arg args[] = {{a.q, qk, "q"},
                      {a.k, qk, "k"},
                      {a.v, (last * static_cast<std::size_t>(qkv) + static_cast<std::size_t>(a.n_v_heads * a.d_v)) * 4, "v"},
                      {a.alpha, gate, "alpha"},
                      {a.beta, gate, "beta"},
                      {a.a, static_cast<std::size_t>(a.n_v_heads) * 4, "a"},
                      {a.dt_bias, static_cast<std::size_t>(a.n_v_heads) * 4, "dt_bias"},
                      {a.state, static_cast<std::size_t>(state) * 4, "state"},
                      {a.out, (last + 1) * static_cast<std::size_t>(a.n_v_heads * a.d_v) * 4, "out"},
                      {a.seq_token_start, (seqs + 1) * 4, "seq_token_start"},
                      {a.seq_context_len, seqs * 4, "seq_context_len"},
                      {a.seq_slot, seqs * 4, "seq_slot"}};
  const std::uint32_t params[] = {u32(a.n_seqs),  u32(a.n_k_heads), u32(a.n_v_heads),     u32(a.d_k),
                                  u32(a.d_v),     u32(qkv),         u32(gs),              a.tiled ? 1u : 0u,
                                  float_bits(a.eps), float_bits(a.scale)};
  return dispatch(kShaderDeltaRule, "delta_rule", args, params, static_cast<std::uint64_t>(a.n_seqs * a.n_v_heads));
}

Status VulkanStream::run(const hal::Op& op) {
  if (!latched_.ok()) return latched_;
  if (const auto* a = std::get_if<hal::AddArgs>(&op)) return run_add(*a);
  if (const auto* a = std::get_if<hal::SiluMulArgs>(&op)) return run_silu_mul(*a);
  if (const auto* a = std::get_if<hal::RmsNormArgs>(&op)) return run_rmsnorm(*a);
  if (const auto* a = std::get_if<hal::TopKArgs>(&op)) return run_top_k(*a);
  if (const auto* a = std::get_if<hal::EmbeddingArgs>(&op)) return run_embedding(*a);
  if (const auto* a = std::get_if<hal::RopeArgs>(&op)) return run_rope(*a);
  if (const auto* a = std::get_if<hal::AttentionArgs>(&op)) return run_attention(*a);
  if (const auto* a = std::get_if<hal::MatmulArgs>(&op)) return run_matmul(*a);
  if (const auto* a = std::get_if<hal::KvWriteArgs>(&op)) return run_kv_write(*a);
  if (const auto* a = std::get_if<hal::MoeRouterArgs>(&op)) return run_moe_router(*a);
  if (const auto* a = std::get_if<hal::MoeFfnArgs>(&op)) return run_moe_ffn(*a);
  if (const auto* a = std::get_if<hal::SigmoidMulArgs>(&op)) return run_sigmoid_mul(*a);
  if (const auto* a = std::get_if<hal::GatedNormArgs>(&op)) return run_gated_norm(*a);
  if (const auto* a = std::get_if<hal::ConvStateArgs>(&op)) return run_conv_state(*a);
  if (const auto* a = std::get_if<hal::DeltaRuleArgs>(&op)) return run_delta_rule(*a);
  return latch(d_.supports(op));
}

Result<std::unique_ptr<hal::Stream>> VulkanDevice::create_stream() {
  auto s = std::make_unique<VulkanStream>(*this);
  SX_RETURN_IF_ERROR(s->init());
  return std::unique_ptr<hal::Stream>(std::move(s));
}

// ---------------------------------------------------------------------------------------------

class VulkanBackend final : public hal::Backend {
 public:
  std::string_view name() const override { return "vulkan"; }

  Result<std::vector<hal::DeviceInfo>> devices() const override {
    SX_ASSIGN_OR_RETURN(const Instance* inst, instance());
    SX_ASSIGN_OR_RETURN(std::vector<int> picked, selection(*inst));
    std::vector<hal::DeviceInfo> out;
    for (std::size_t i = 0; i < picked.size(); ++i) {
      const VkPhysicalDevice phys = inst->physical[static_cast<std::size_t>(picked[i])];
      VkPhysicalDeviceProperties props;
      inst->api.vkGetPhysicalDeviceProperties(phys, &props);
      VkPhysicalDeviceMemoryProperties mem;
      inst->api.vkGetPhysicalDeviceMemoryProperties(phys, &mem);
      out.push_back(describe_device(props, mem, static_cast<int>(i), shares(picked, i), 0));
    }
    if (out.empty()) {
      return unavailable_error("no Vulkan GPU (found: {}); CPU implementations such as lavapipe are used only when "
                               "named in SEXTANT_VULKAN_DEVICES, e.g. SEXTANT_VULKAN_DEVICES=0",
                               describe_found(inst->found));
    }
    return out;
  }

  Result<std::unique_ptr<hal::Device>> create_device(int index, const hal::DeviceOptions& options) override {
    SX_ASSIGN_OR_RETURN(const VkOptions o, parse_options(options));
    SX_ASSIGN_OR_RETURN(const Instance* inst, instance());
    SX_ASSIGN_OR_RETURN(std::vector<int> picked, selection(*inst));
    if (index < 0 || static_cast<std::size_t>(index) >= picked.size()) {
      return invalid_argument_error("vulkan: there is no device {} ({} selected: {})", index, picked.size(),
                                    describe_found(inst->found));
    }
    SX_ASSIGN_OR_RETURN(auto d, VulkanDevice::create(*inst, index, picked[static_cast<std::size_t>(index)],
                                                     shares(picked, static_cast<std::size_t>(index)), o));
    return std::unique_ptr<hal::Device>(std::move(d));
  }

  // Collectives staged through host-visible buffers (backends/common/staged_channel.h).
  Result<std::vector<std::unique_ptr<hal::Channel>>> create_channels(std::span<hal::Device* const> devices,
                                                                     const hal::ChannelOptions& options) override {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (dynamic_cast<VulkanDevice*>(devices[i]) == nullptr) {
        return invalid_argument_error("channel: device {} of the group is not a Vulkan device", i);
      }
    }
    return backends::create_staged_channels(devices, options);
  }

 private:
  // Another selected device is on the same physical device as picked[i].
  static bool shares(const std::vector<int>& picked, std::size_t i) {
    return std::count(picked.begin(), picked.end(), picked[i]) > 1;
  }
};

}  // namespace

std::unique_ptr<hal::Backend> make_vulkan_backend() { return std::make_unique<VulkanBackend>(); }

}  // namespace sx::vk
