// The CUDA device, buffers, events and streams (cuda_device.h; DESIGN.md §4's HAL contract).
//
// - Device memory comes from two arenas (arena.h): weights, and everything else (KV pool,
//   activations, workspaces); upload and readback buffers are pinned host memory.
// - A stream is one cudaStream_t with its cuBLAS handle, a dequantisation workspace for prefill
//   matmuls, a pinned ring for update() and the device error word of the kernels (launch.h).
//   run() validates and resolves the op at once (errors latch there, naming the op and operand)
//   and defers its launch; the next call of any other kind launches the pending ops, eagerly or
//   as a CUDA graph (launch_plan.h GraphCache), so that a decode step's kernels replay from one
//   graph launch.
// - Every CUDA call is checked where it is made; the first error latches (sync() returns it).
#include "backends/cuda/cuda_device.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backends/common/staged_channel.h"
#include "backends/cuda/arena.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/launch_plan.h"
#include "backends/cuda/loopback_channel.h"
#include "backends/cuda/nccl_api.h"
#include "backends/cuda/nccl_channel.h"
#include "kernels/launch.h"
#include "runtime/base/log.h"
#include "runtime/hal/op_checks.h"

namespace sx::cuda {

namespace {

static_assert(static_cast<int>(hal::DType::kF32) == 0 && static_cast<int>(hal::DType::kQ8_0) == 3 &&
              static_cast<int>(hal::DType::kQ4_K) == 6 && static_cast<int>(hal::DType::kAwqInt4) == 8 &&
              static_cast<int>(hal::DType::kQ5_K) == 14,
              "kernels/dequant.cuh numbers the weight formats in hal::DType's order");

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kUpdateRingBytes = 4 * kMiB;
constexpr std::size_t kCublasWorkspaceBytes = 32 * kMiB;
constexpr std::size_t kAttentionPartialBytes = 8 * kMiB;

bool weight_type_ok(hal::DType t) { return t != hal::DType::kI32; }

class CudaDevice;

class CudaBuffer final : public hal::Buffer {
 public:
  CudaBuffer(CudaDevice& d, void* ptr, std::size_t size, hal::BufferUsage usage, Arena* arena)
      : d_(d), ptr_(ptr), size_(size), usage_(usage), arena_(arena) {}
  ~CudaBuffer() override;
  std::size_t size() const override { return size_; }
  hal::Device& device() const override;
  hal::BufferUsage usage() const override { return usage_; }
  std::span<std::byte> host() const override {
    if (usage_ == hal::BufferUsage::kDevice) return {};
    return {static_cast<std::byte*>(ptr_), size_};
  }
  std::byte* ptr() const { return static_cast<std::byte*>(ptr_); }
  CudaDevice& cuda_device() const { return d_; }
  std::optional<hal::DType> weight_format;

 private:
  CudaDevice& d_;
  void* ptr_;
  std::size_t size_;
  hal::BufferUsage usage_;
  Arena* arena_;  // null: pinned host memory (cudaFreeHost)
};

class CudaEvent final : public hal::Event {
 public:
  CudaEvent(CudaDevice& d, cudaEvent_t e) : d_(d), e_(e) {}
  ~CudaEvent() override;
  CudaDevice& d_;
  cudaEvent_t e_;
  bool recorded = false;
};

struct CudaOptions {
  bool graphs = true;
  std::size_t pool_chunk_bytes = 512 * kMiB;
  std::size_t workspace_bytes = 64 * kMiB;
};

Result<CudaOptions> parse_options(const hal::DeviceOptions& options) {
  hal::OptionReader r("cuda", options);
  CudaOptions o;
  SX_ASSIGN_OR_RETURN(o.graphs, r.flag("graphs", true));
  SX_ASSIGN_OR_RETURN(std::int64_t chunk, r.integer("pool_chunk_mib", 512, 2, 1 << 20));
  SX_ASSIGN_OR_RETURN(std::int64_t ws, r.integer("workspace_mib", 64, 1, 1 << 16));
  SX_RETURN_IF_ERROR(r.finish());
  o.pool_chunk_bytes = static_cast<std::size_t>(chunk) * kMiB;
  o.workspace_bytes = static_cast<std::size_t>(ws) * kMiB;
  // SEXTANT_CUDA_GRAPHS=0 turns graphs off without a config change (bug reports, comparisons).
  if (const char* env = std::getenv("SEXTANT_CUDA_GRAPHS"); env != nullptr && std::string_view(env) == "0") {
    o.graphs = false;
  }
  return o;
}

class CudaDevice final : public hal::Device {
 public:
  CudaDevice(hal::DeviceInfo info, int ordinal, CudaOptions options)
      : info_(std::move(info)),
        ordinal_(ordinal),
        options_(options),
        weights_(arena_alloc(), arena_free(), options.pool_chunk_bytes),
        general_(arena_alloc(), arena_free(), options.pool_chunk_bytes / 2) {}

  const hal::DeviceInfo& info() const override { return info_; }
  hal::MemoryInfo memory() const override {
    return {info_.memory_bytes, weights_.live_bytes() + general_.live_bytes() + host_bytes_.load()};
  }
  Status supports(const hal::Op& op) const override;
  Result<std::unique_ptr<hal::Buffer>> upload_weight(hal::Stream& stream, const hal::WeightDesc& w,
                                                     std::span<const std::byte> bytes) override;
  Result<std::unique_ptr<hal::Buffer>> alloc(std::size_t bytes, hal::BufferUsage usage) override;
  Result<std::unique_ptr<hal::Stream>> create_stream() override;
  Result<std::unique_ptr<hal::Event>> create_event() override;

  // Makes this device current on the calling thread (the CUDA runtime's current device is per
  // thread); every entry point that calls CUDA starts with it.
  Status activate() const { return cuda_status(cudaSetDevice(ordinal_), fmt::format("{}: cudaSetDevice", info_.name)); }
  const CudaOptions& options() const { return options_; }
  int multiprocessors() const { return multiprocessors_; }
  int ordinal() const { return ordinal_; }
  void set_multiprocessors(int n) { multiprocessors_ = n; }
  void host_freed(std::size_t bytes) { host_bytes_ -= bytes; }

 private:
  Arena::AllocFn arena_alloc() {
    return [this](std::size_t bytes) -> Result<void*> {
      SX_RETURN_IF_ERROR(activate());
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, bytes);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();  // not sticky: clear it
        std::size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        return resource_exhausted_error("{}: cannot allocate {:.2f} GiB of device memory ({:.2f} GiB free of {:.2f}): {}",
                                        info_.name, static_cast<double>(bytes) / (1 << 30),
                                        static_cast<double>(free_b) / (1 << 30), static_cast<double>(total_b) / (1 << 30),
                                        cudaGetErrorString(e));
      }
      return p;
    };
  }
  Arena::FreeFn arena_free() {
    return [this](void* p) {
      (void)cudaSetDevice(ordinal_);
      (void)cudaFree(p);
    };
  }

  hal::DeviceInfo info_;
  int ordinal_;
  int multiprocessors_ = 1;
  CudaOptions options_;
  mutable Arena weights_, general_;
  std::atomic<std::size_t> host_bytes_{0};
};

CudaBuffer::~CudaBuffer() {
  if (arena_ != nullptr) {
    arena_->release(ptr_);
  } else {
    (void)d_.activate();
    (void)cudaFreeHost(ptr_);
    d_.host_freed(size_);
  }
}
hal::Device& CudaBuffer::device() const { return d_; }

CudaEvent::~CudaEvent() {
  (void)d_.activate();
  (void)cudaEventDestroy(e_);
}

Status CudaDevice::supports(const hal::Op& op) const {
  if (const auto* a = std::get_if<hal::AttentionArgs>(&op)) {
    if ((a->cache_type == hal::DType::kF32 || a->cache_type == hal::DType::kF16) &&
        a->head_dim <= kMaxAttentionHeadDim) {
      return ok_status();
    }
    return unimplemented_error("the CUDA backend's attention takes f32 or f16 caches and heads of at most {}",
                               kMaxAttentionHeadDim);
  }
  if (const auto* w = std::get_if<hal::KvWriteArgs>(&op)) {
    if (w->cache_type == hal::DType::kF32 || w->cache_type == hal::DType::kF16) return ok_status();
    return unimplemented_error("the CUDA backend's kv_write takes f32 or f16 caches");
  }
  if (const auto* e = std::get_if<hal::EmbeddingArgs>(&op)) {
    if (weight_type_ok(e->table_type)) return ok_status();
    return unimplemented_error("embedding tables are weights, not {}", hal::dtype_name(e->table_type));
  }
  if (const auto* m = std::get_if<hal::MatmulArgs>(&op)) {
    if (weight_type_ok(m->w_type)) return ok_status();
    return unimplemented_error("matmul weights are weights, not {}", hal::dtype_name(m->w_type));
  }
  if (const auto* m = std::get_if<hal::MoeFfnArgs>(&op)) {
    for (const hal::DType t : {m->gate_type, m->up_type, m->down_type}) {
      if (!weight_type_ok(t)) return unimplemented_error("expert weights are weights, not {}", hal::dtype_name(t));
    }
    return ok_status();
  }
  if (const auto* r = std::get_if<hal::MoeRouterArgs>(&op); r != nullptr && r->k > hal::kMaxTopK) {
    return unimplemented_error("the router selects at most {} experts per token", hal::kMaxTopK);
  }
  if (const auto* d = std::get_if<hal::DeltaRuleArgs>(&op); d != nullptr && (d->d_k > 256 || d->d_v > 256)) {
    return unimplemented_error("the CUDA backend's delta_rule takes heads of at most 256");
  }
  return ok_status();  // add, silu_mul, rmsnorm, rope, top_k, moe_router, the DeltaNet ops, sigmoid_mul
}

Result<std::unique_ptr<hal::Buffer>> CudaDevice::alloc(std::size_t bytes, hal::BufferUsage usage) {
  const std::size_t size = std::max<std::size_t>(bytes, 4);
  if (usage == hal::BufferUsage::kDevice) {
    SX_ASSIGN_OR_RETURN(void* p, general_.allocate(size));
    return std::unique_ptr<hal::Buffer>(std::make_unique<CudaBuffer>(*this, p, bytes, usage, &general_));
  }
  SX_RETURN_IF_ERROR(activate());
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return resource_exhausted_error("{}: cannot allocate {} bytes of pinned host memory for an {} buffer: {}",
                                    info_.name, size, hal::buffer_usage_name(usage), cudaGetErrorString(e));
  }
  host_bytes_ += bytes;
  return std::unique_ptr<hal::Buffer>(std::make_unique<CudaBuffer>(*this, p, bytes, usage, nullptr));
}

Result<std::unique_ptr<hal::Buffer>> CudaDevice::upload_weight(hal::Stream& stream, const hal::WeightDesc& w,
                                                               std::span<const std::byte> bytes) {
  SX_RETURN_IF_ERROR(hal::check_weight_bytes(w, bytes));
  SX_ASSIGN_OR_RETURN(void* p, weights_.allocate(std::max<std::size_t>(bytes.size(), 4)));
  auto b = std::make_unique<CudaBuffer>(*this, p, bytes.size(), hal::BufferUsage::kDevice, &weights_);
  b->weight_format = w.format;
  SX_RETURN_IF_ERROR(stream.upload(*b, 0, bytes));
  return std::unique_ptr<hal::Buffer>(std::move(b));
}

Result<std::unique_ptr<hal::Event>> CudaDevice::create_event() {
  SX_RETURN_IF_ERROR(activate());
  cudaEvent_t e = nullptr;
  SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), fmt::format("{}: an event", info_.name)));
  return std::unique_ptr<hal::Event>(std::make_unique<CudaEvent>(*this, e));
}

// ---------------------------------------------------------------------------------------------
// Streams.

class CudaStream final : public hal::Stream {
 public:
  explicit CudaStream(CudaDevice& d)
      : d_(d), graphs_(GraphPolicy{d.options().graphs, 64, 64, 1}) {}
  ~CudaStream() override;
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
  // The CUDA stream after the deferred ops were launched (native_stream in cuda_device.h).
  Result<cudaStream_t> native() {
    SX_RETURN_IF_ERROR(flush());
    return stream_;
  }
  const CudaDevice& cuda_device() const { return d_; }
  void add_sync_check(std::function<Status()> check) { sync_checks_.push_back(std::move(check)); }

 private:
  using Launch = std::function<Status(cudaStream_t)>;
  Status latch(Status s) {
    if (!s.ok() && latched_.ok()) latched_ = s;
    return s;
  }
  template <typename... Args>
  Status latch_invalid(fmt::format_string<Args...> f, Args&&... args) {
    return latch(invalid_argument_error(f, std::forward<Args>(args)...));
  }
  Status check(cudaError_t e, std::string_view what) { return latch(cuda_status(e, what)); }
  // The buffer behind `b` when it is one of this device's, with [offset, offset + bytes) inside.
  Result<CudaBuffer*> resolve(const hal::Buffer& b, std::size_t offset, std::size_t bytes, std::string_view what,
                              bool device_only);
  // The device address of `bytes` at a view for operand `what` of `op` (null view: an error).
  Result<std::byte*> operand(const hal::BufView& v, std::size_t bytes, std::string_view op, std::string_view what);
  Result<std::byte*> optional_operand(const hal::BufView& v, std::size_t bytes, std::string_view op,
                                      std::string_view what) {
    if (!v) return static_cast<std::byte*>(nullptr);
    return operand(v, bytes, op, what);
  }
  // Defers `launch` (of an op whose key was appended to key_ with the resolved addresses).
  void defer(const hal::Op& op, std::span<const void* const> addresses, Launch launch);
  // Launches the pending ops, eagerly or through a graph.
  Status flush();
  // Forgets the pending ops (launched, or not to be launched after an error).
  void drop_pending() {
    pending_.clear();
    key_.clear();
    pending_tokens_ = 0;
  }
  Status launch_eagerly();
  Status run_matmul(const hal::MatmulArgs& a);
  Status run_moe_ffn(const hal::MoeFfnArgs& a);
  Status gemm(cudaStream_t s, const hal::MatmulArgs& a, const std::byte* w, const float* x, const float* bias, float* y);
  Status take_device_errors();
  Status check_weight_format(const hal::BufView& b, hal::DType format, const char* op);

  CudaDevice& d_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  // workspace_: prefill matmuls' dequantised rows; partials_: split attention's partial states.
  std::unique_ptr<hal::Buffer> workspace_, blas_workspace_, errors_, partials_;
  // moe_ffn's workspace (plan_moe_workspace), grown on demand; one it outgrew is kept in
  // moe_retired_ until the next sync (ops deferred before the growth still use it).
  std::unique_ptr<hal::Buffer> moe_;
  std::vector<std::unique_ptr<hal::Buffer>> moe_retired_;
  int* errors_host_ = nullptr;  // pinned, 4 ints
  std::byte* ring_ = nullptr;   // pinned, kUpdateRingBytes
  std::size_t ring_at_ = 0;
  std::vector<Launch> pending_;
  std::string key_;
  std::int64_t pending_tokens_ = 0;
  GraphCache graphs_;
  std::map<std::uint64_t, cudaGraphExec_t> execs_;
  std::vector<std::function<Status()>> sync_checks_;  // add_sync_check
  Status latched_;
};

Status CudaStream::init() {
  SX_RETURN_IF_ERROR(d_.activate());
  const std::string& name = d_.info().name;
  SX_RETURN_IF_ERROR(cuda_status(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), name + ": a stream"));
  SX_RETURN_IF_ERROR(cublas_status(cublasCreate(&blas_), name + ": cublasCreate"));
  SX_RETURN_IF_ERROR(cublas_status(cublasSetStream(blas_, stream_), name + ": cublasSetStream"));
  // The same math as the CPU reference: no TF32 (cuBLAS uses it for SGEMM only when asked).
  SX_RETURN_IF_ERROR(cublas_status(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH), name + ": cublasSetMathMode"));
  // A workspace of cuBLAS's own, so that it allocates nothing inside a graph capture.
  SX_ASSIGN_OR_RETURN(blas_workspace_, d_.alloc(kCublasWorkspaceBytes, hal::BufferUsage::kDevice));
  SX_RETURN_IF_ERROR(cublas_status(
      cublasSetWorkspace(blas_, static_cast<CudaBuffer*>(blas_workspace_.get())->ptr(), kCublasWorkspaceBytes),
      name + ": cublasSetWorkspace"));
  SX_ASSIGN_OR_RETURN(workspace_, d_.alloc(d_.options().workspace_bytes, hal::BufferUsage::kDevice));
  SX_ASSIGN_OR_RETURN(partials_, d_.alloc(kAttentionPartialBytes, hal::BufferUsage::kDevice));
  SX_ASSIGN_OR_RETURN(errors_, d_.alloc(16, hal::BufferUsage::kDevice));
  SX_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(static_cast<CudaBuffer*>(errors_.get())->ptr(), 0, 16, stream_),
                                 name + ": clearing the error word"));
  SX_RETURN_IF_ERROR(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&errors_host_), 16, cudaHostAllocPortable),
                                 name + ": pinned memory for the error word"));
  SX_RETURN_IF_ERROR(cuda_status(cudaHostAlloc(reinterpret_cast<void**>(&ring_), kUpdateRingBytes, cudaHostAllocPortable),
                                 name + ": pinned memory for updates"));
  return cuda_status(cudaStreamSynchronize(stream_), name + ": a new stream");
}

CudaStream::~CudaStream() {
  (void)d_.activate();
  if (stream_ != nullptr) {
    (void)flush();
    (void)cudaStreamSynchronize(stream_);
  }
  for (auto& [id, exec] : execs_) (void)cudaGraphExecDestroy(exec);
  if (blas_ != nullptr) (void)cublasDestroy(blas_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  if (errors_host_ != nullptr) (void)cudaFreeHost(errors_host_);
  if (ring_ != nullptr) (void)cudaFreeHost(ring_);
}

Result<CudaBuffer*> CudaStream::resolve(const hal::Buffer& b, std::size_t offset, std::size_t bytes,
                                        std::string_view what, bool device_only) {
  auto* cb = dynamic_cast<const CudaBuffer*>(&b);
  if (cb == nullptr || &cb->cuda_device() != &d_) {
    return latch_invalid("{}: the buffer belongs to {}, not to {}", what, b.device().info().name, d_.info().name);
  }
  if (offset > cb->size() || bytes > cb->size() - offset) {
    return latch(out_of_range_error("{}: {} bytes at offset {} overrun a buffer of {} bytes", what, bytes, offset,
                                    cb->size()));
  }
  if (device_only && cb->usage() != hal::BufferUsage::kDevice) {
    return latch_invalid("{}: an {} buffer; ops take device buffers", what, hal::buffer_usage_name(cb->usage()));
  }
  return const_cast<CudaBuffer*>(cb);
}

Result<std::byte*> CudaStream::operand(const hal::BufView& v, std::size_t bytes, std::string_view op,
                                       std::string_view what) {
  if (!v) return latch_invalid("{}: {} is not set", op, what);
  SX_ASSIGN_OR_RETURN(CudaBuffer * b, resolve(*v.buffer, v.offset, bytes, fmt::format("{}: {}", op, what), true));
  return b->ptr() + v.offset;
}

Status CudaStream::check_weight_format(const hal::BufView& b, hal::DType format, const char* op) {
  const auto* t = b ? dynamic_cast<const CudaBuffer*>(b.buffer) : nullptr;
  if (t != nullptr && t->weight_format && *t->weight_format != format) {
    return latch_invalid("{}: the buffer was uploaded as {} weights and cannot be read as {}", op,
                         hal::dtype_name(*t->weight_format), hal::dtype_name(format));
  }
  return ok_status();
}

void CudaStream::defer(const hal::Op& op, std::span<const void* const> addresses, Launch launch) {
  append_op_key(key_, op);
  for (const void* a : addresses) key_.append(reinterpret_cast<const char*>(&a), sizeof a);
  pending_tokens_ = std::max(pending_tokens_, op_tokens(op));
  pending_.push_back(std::move(launch));
}

Status CudaStream::launch_eagerly() {
  for (Launch& l : pending_) SX_RETURN_IF_ERROR(latch(l(stream_)));
  return ok_status();
}

Status CudaStream::flush() {
  // Every entry point but run() starts here: the device made current on this thread first (a
  // thread may have worked on another device since; cudaMemsetAsync needs the stream's device).
  SX_RETURN_IF_ERROR(latch(d_.activate()));
  if (pending_.empty()) return latched_;
  struct Clear {
    CudaStream* s;
    ~Clear() { s->drop_pending(); }
  } clear{this};
  if (!latched_.ok()) return latched_;
  const GraphCache::Decision d = graphs_.decide(key_, pending_tokens_);
  if (d.evict) {
    auto it = execs_.find(*d.evict);
    if (it != execs_.end()) {
      (void)cudaGraphExecDestroy(it->second);
      execs_.erase(it);
    }
  }
  if (d.action == GraphCache::Action::kReplay) {
    auto it = execs_.find(d.id);
    if (it != execs_.end()) return check(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
    graphs_.forget(d.id);
    return launch_eagerly();
  }
  if (d.action == GraphCache::Action::kEager) return launch_eagerly();
  // Capture: the ops are recorded, not run; then the graph is launched.
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    graphs_.forget(d.id);
    return launch_eagerly();
  }
  Status captured = ok_status();
  for (Launch& l : pending_) {
    captured = l(stream_);
    if (!captured.ok()) break;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  if (captured.ok() && ended == cudaSuccess && graph != nullptr &&
      cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
    (void)cudaGraphDestroy(graph);
    execs_[d.id] = exec;
    log_debug("{}: captured a CUDA graph of {} ops ({} graphs)", d_.info().name, pending_.size(), graphs_.graphs());
    return check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
  }
  // Not capturable (or the capture failed): eager from now on for this sequence.
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  graphs_.forget(d.id);
  log_debug("{}: a sequence of {} ops could not be captured ({}); launching it eagerly", d_.info().name,
            pending_.size(), captured.ok() ? cudaGetErrorString(ended) : captured.message());
  return launch_eagerly();
}

Status CudaStream::take_device_errors() {
  const int* w = errors_host_;
  if (w[0] == 0) return ok_status();
  const int kind = w[0], a = w[1], b = w[2], c = w[3];
  std::memset(errors_host_, 0, 16);
  (void)cudaMemsetAsync(static_cast<CudaBuffer*>(errors_.get())->ptr(), 0, 16, stream_);
  switch (kind) {
    case kernels::kErrKvSlot:
      return latch(out_of_range_error("kv_write: slot {} of token {} is outside the cache of {} slots", a, b, c));
    case kernels::kErrAttentionContext:
      return latch(invalid_argument_error(
          "attention: sequence {} has {} new tokens and context {} (fewer than its new tokens, or more than its "
          "blocks hold)", a, b, c));
    case kernels::kErrAttentionBlock:
      return latch(out_of_range_error("attention: sequence {} block {} maps to block id {} outside the cache", a, b, c));
    default:
      return latch(out_of_range_error("embedding: token id {} at position {} is outside the vocabulary of {}", b, a, c));
  }
}

Status CudaStream::sync() {
  SX_RETURN_IF_ERROR(latch(d_.activate()));
  if (!latched_.ok()) {  // still wait: work enqueued before the error may use the caller's buffers
    drop_pending();
    (void)cudaStreamSynchronize(stream_);
    return latched_;
  }
  SX_RETURN_IF_ERROR(flush());
  SX_RETURN_IF_ERROR(check(cudaMemcpyAsync(errors_host_, static_cast<CudaBuffer*>(errors_.get())->ptr(), 16,
                                           cudaMemcpyDeviceToHost, stream_),
                           "reading the device error word"));
  SX_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream_), fmt::format("{}: the stream's work", d_.info().name)));
  ring_at_ = 0;
  moe_retired_.clear();
  SX_RETURN_IF_ERROR(take_device_errors());
  for (const auto& c : sync_checks_) SX_RETURN_IF_ERROR(latch(c()));
  return ok_status();
}

Status CudaStream::upload(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) {
  SX_RETURN_IF_ERROR(flush());
  SX_ASSIGN_OR_RETURN(CudaBuffer * d, resolve(dst, dst_offset, src.size(), "upload", false));
  if (src.empty()) return ok_status();
  return check(cudaMemcpyAsync(d->ptr() + dst_offset, src.data(), src.size(), cudaMemcpyDefault, stream_), "upload");
}

Status CudaStream::download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t src_offset) {
  SX_RETURN_IF_ERROR(flush());
  SX_ASSIGN_OR_RETURN(CudaBuffer * s, resolve(src, src_offset, dst.size(), "download", false));
  if (dst.empty()) return ok_status();
  return check(cudaMemcpyAsync(dst.data(), s->ptr() + src_offset, dst.size(), cudaMemcpyDefault, stream_), "download");
}

Status CudaStream::update(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) {
  SX_RETURN_IF_ERROR(flush());
  if (src.size() > kMaxUpdateBytes) {
    return latch_invalid("update: {} bytes; at most {} (use upload)", src.size(), kMaxUpdateBytes);
  }
  SX_ASSIGN_OR_RETURN(CudaBuffer * d, resolve(dst, dst_offset, src.size(), "update", false));
  if (src.empty()) return ok_status();
  if (ring_at_ + src.size() > kUpdateRingBytes) {  // every earlier copy out of the ring must be done
    SX_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream_), "update"));
    ring_at_ = 0;
  }
  std::byte* staged = ring_ + ring_at_;
  std::memcpy(staged, src.data(), src.size());
  ring_at_ += (src.size() + 15) / 16 * 16;
  return check(cudaMemcpyAsync(d->ptr() + dst_offset, staged, src.size(), cudaMemcpyDefault, stream_), "update");
}

Status CudaStream::copy(hal::Buffer& dst, std::size_t dst_offset, const hal::Buffer& src, std::size_t src_offset,
                        std::size_t bytes) {
  SX_RETURN_IF_ERROR(flush());
  SX_ASSIGN_OR_RETURN(CudaBuffer * d, resolve(dst, dst_offset, bytes, "copy destination", false));
  SX_ASSIGN_OR_RETURN(CudaBuffer * s, resolve(src, src_offset, bytes, "copy source", false));
  if (bytes == 0) return ok_status();
  return check(cudaMemcpyAsync(d->ptr() + dst_offset, s->ptr() + src_offset, bytes, cudaMemcpyDefault, stream_), "copy");
}

Status CudaStream::fill(hal::Buffer& dst, std::size_t dst_offset, std::size_t bytes, std::uint8_t value) {
  SX_RETURN_IF_ERROR(flush());
  SX_ASSIGN_OR_RETURN(CudaBuffer * d, resolve(dst, dst_offset, bytes, "fill", false));
  if (bytes == 0) return ok_status();
  if (d->usage() != hal::BufferUsage::kDevice) {  // pinned host memory: after the work before it
    SX_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream_), "fill"));
    std::memset(d->ptr() + dst_offset, value, bytes);
    return ok_status();
  }
  return check(cudaMemsetAsync(d->ptr() + dst_offset, value, bytes, stream_), "fill");
}

Status CudaStream::host_call(std::function<Status()> fn) {
  SX_RETURN_IF_ERROR(flush());
  SX_RETURN_IF_ERROR(check(cudaStreamSynchronize(stream_), "host_call"));
  return latch(fn());
}

Status CudaStream::record(hal::Event& event) {
  SX_RETURN_IF_ERROR(flush());
  auto* e = dynamic_cast<CudaEvent*>(&event);
  if (e == nullptr || &e->d_ != &d_) return latch_invalid("record: the event is not one of {}'s", d_.info().name);
  SX_RETURN_IF_ERROR(check(cudaEventRecord(e->e_, stream_), "record"));
  e->recorded = true;
  return ok_status();
}

Status CudaStream::wait(const hal::Event& event) {
  SX_RETURN_IF_ERROR(flush());
  const auto* e = dynamic_cast<const CudaEvent*>(&event);
  if (e == nullptr) return latch_invalid("wait: not a CUDA event");
  if (!e->recorded) return latch(failed_precondition_error("wait: the event was never recorded"));
  return check(cudaStreamWaitEvent(stream_, e->e_, 0), "wait");
}

// ---- ops -------------------------------------------------------------------------------------

std::size_t f32s(std::int64_t n) { return static_cast<std::size_t>(n) * 4; }

Status launched(cudaError_t e, const char* op) { return cuda_status(e, fmt::format("{}: kernel launch", op)); }

Status CudaStream::gemm(cudaStream_t s, const hal::MatmulArgs& a, const std::byte* w, const float* x, const float* bias,
                        float* y) {
  const float one = 1.0f, zero = 0.0f;
  // Row-major y[m][n] = x[m][k] W[n][k]^T is column-major y^T (n x m) = W^T' ... : with W as the
  // column-major k x n matrix (lda k) transposed, and x as the column-major k x m matrix (ldb k).
  auto sgemm = [&](const float* wf, std::int64_t row0, std::int64_t rows) {
    return cublas_status(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(a.m),
                                     static_cast<int>(a.k), &one, wf, static_cast<int>(a.k), x, static_cast<int>(a.k),
                                     &zero, y + row0, static_cast<int>(a.n)),
                         "matmul: cublasSgemm");
  };
  // blas_ is bound to stream_ (== s) with its workspace since init(); cublasSetStream here would
  // reset the workspace to cuBLAS's own pool, which allocates inside a graph capture.
  const MatmulPlan plan = plan_matmul(a.w_type, a.m, a.n, a.k, workspace_->size());
  if (plan.chunk_rows == 0) {
    SX_RETURN_IF_ERROR(sgemm(reinterpret_cast<const float*>(w), 0, a.n));
  } else {
    auto* ws = reinterpret_cast<float*>(static_cast<CudaBuffer*>(workspace_.get())->ptr());
    const std::size_t rb = hal::row_bytes(a.w_type, a.k);
    for (std::int64_t r = 0; r < a.n; r += plan.chunk_rows) {
      const std::int64_t rows = std::min(plan.chunk_rows, a.n - r);
      SX_RETURN_IF_ERROR(launched(kernels::launch_dequantize_rows(s, static_cast<int>(a.w_type),
                                                                  reinterpret_cast<const std::uint8_t*>(w), rb, r,
                                                                  rows, a.k, ws),
                                  "matmul"));
      SX_RETURN_IF_ERROR(sgemm(ws, r, rows));
    }
  }
  if (bias != nullptr) SX_RETURN_IF_ERROR(launched(kernels::launch_add_bias(s, y, bias, a.m, a.n), "matmul"));
  return ok_status();
}

Status CudaStream::run_matmul(const hal::MatmulArgs& a) {
  SX_RETURN_IF_ERROR(latch(d_.supports(a)));
  if (a.m < 0 || a.n < 1 || a.k < 1 || a.k % hal::dtype_info(a.w_type).block_elems != 0 || a.n > INT32_MAX ||
      a.k > INT32_MAX || a.m > INT32_MAX) {
    return latch_invalid("matmul: [{} x {}] x [{} x {}] {} weights", a.m, a.k, a.n, a.k, hal::dtype_name(a.w_type));
  }
  SX_RETURN_IF_ERROR(check_weight_format(a.w, a.w_type, "matmul"));
  if (a.m == 0) return ok_status();
  const std::size_t rb = hal::row_bytes(a.w_type, a.k);
  SX_ASSIGN_OR_RETURN(std::byte * w, operand(a.w, rb * static_cast<std::size_t>(a.n), "matmul", "w"));
  SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, f32s(a.m * a.k), "matmul", "x"));
  SX_ASSIGN_OR_RETURN(std::byte * bias, optional_operand(a.bias, f32s(a.n), "matmul", "bias"));
  SX_ASSIGN_OR_RETURN(std::byte * y, operand(a.y, f32s(a.m * a.n), "matmul", "y"));
  const void* addrs[] = {w, x, bias, y};
  if (a.w_type == hal::DType::kQ8_0) {  // 8-bit activations at every m, as on the CPU
    const std::int64_t per_pass = q8_rows_per_pass(a.k, workspace_->size());
    if (per_pass < 1) {
      return latch_invalid("matmul: q8_0 activations of {} columns do not fit the {}-byte workspace (device option "
                           "workspace_mib)", a.k, workspace_->size());
    }
    defer(a, addrs, [this, a, w, x, bias, y, per_pass](cudaStream_t s) -> Status {
      std::byte* ws = static_cast<CudaBuffer*>(workspace_.get())->ptr();
      for (std::int64_t r = 0; r < a.m; r += per_pass) {
        const std::int64_t rows = std::min(per_pass, a.m - r);
        auto* qs = reinterpret_cast<std::int8_t*>(ws);
        auto* d = reinterpret_cast<float*>(ws + rows * a.k);  // k is a multiple of 32: 4-byte aligned
        SX_RETURN_IF_ERROR(launched(kernels::launch_quantize_q8(s, reinterpret_cast<const float*>(x) + r * a.k, rows,
                                                                a.k, qs, d),
                                    "matmul"));
        SX_RETURN_IF_ERROR(launched(kernels::launch_gemm_q8(s, reinterpret_cast<const std::uint8_t*>(w), qs, d,
                                                            reinterpret_cast<const float*>(bias),
                                                            reinterpret_cast<float*>(y) + r * a.n, rows, a.n, a.k),
                                    "matmul"));
      }
      return ok_status();
    });
    return ok_status();
  }
  const MatmulPlan plan = plan_matmul(a.w_type, a.m, a.n, a.k, workspace_->size());
  if (plan.path == MatmulPath::kGemm && a.w_type != hal::DType::kF32 && workspace_->size() < min_workspace_bytes(a.k)) {
    return latch_invalid("matmul: rows of {} columns do not fit the {}-byte workspace (device option workspace_mib)",
                         a.k, workspace_->size());
  }
  if (plan.path == MatmulPath::kGemv) {
    defer(a, addrs, [a, w, x, bias, y](cudaStream_t s) {
      return launched(kernels::launch_gemv(s, a, reinterpret_cast<const std::uint8_t*>(w),
                                           reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(bias),
                                           reinterpret_cast<float*>(y)),
                      "matmul");
    });
  } else {
    defer(a, addrs, [this, a, w, x, bias, y](cudaStream_t s) {
      return gemm(s, a, w, reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(bias),
                  reinterpret_cast<float*>(y));
    });
  }
  return ok_status();
}

Status CudaStream::run_moe_ffn(const hal::MoeFfnArgs& a) {
  SX_RETURN_IF_ERROR(latch(d_.supports(a)));
  SX_RETURN_IF_ERROR(latch(hal::check_moe_ffn(a)));
  if (a.n_local > kMaxMoeLocalExperts || a.n_tokens > kMaxMoeTokens) {
    return latch_invalid("moe_ffn: {} local experts and {} tokens exceed the kernels' grid ({} and {} a call)",
                         a.n_local, a.n_tokens, kMaxMoeLocalExperts, kMaxMoeTokens);
  }
  SX_RETURN_IF_ERROR(check_weight_format(a.gate, a.gate_type, "moe_ffn"));
  SX_RETURN_IF_ERROR(check_weight_format(a.up, a.up_type, "moe_ffn"));
  SX_RETURN_IF_ERROR(check_weight_format(a.down, a.down_type, "moe_ffn"));
  if (a.n_tokens == 0) return ok_status();
  kernels::MoePtrs p{};
  const std::int64_t slots = a.n_tokens * a.k;
  SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, f32s(a.n_tokens * a.dim), "moe_ffn", "x"));
  SX_ASSIGN_OR_RETURN(std::byte * ids, operand(a.ids, f32s(slots), "moe_ffn", "ids"));
  SX_ASSIGN_OR_RETURN(std::byte * weights, operand(a.weights, f32s(slots), "moe_ffn", "weights"));
  SX_ASSIGN_OR_RETURN(std::byte * out, operand(a.out, f32s(a.n_tokens * a.dim), "moe_ffn", "out"));
  std::byte *gate = nullptr, *up = nullptr, *down = nullptr;
  if (a.n_local > 0) {
    const auto stack = [&](hal::DType t, std::int64_t rows, std::int64_t cols) {
      return hal::row_bytes(t, cols) * static_cast<std::size_t>(a.n_local * rows);
    };
    SX_ASSIGN_OR_RETURN(gate, operand(a.gate, stack(a.gate_type, a.ffn, a.dim), "moe_ffn", "gate experts"));
    SX_ASSIGN_OR_RETURN(up, operand(a.up, stack(a.up_type, a.ffn, a.dim), "moe_ffn", "up experts"));
    SX_ASSIGN_OR_RETURN(down, operand(a.down, stack(a.down_type, a.dim, a.ffn), "moe_ffn", "down experts"));
  }
  p.x = reinterpret_cast<const float*>(x);
  p.ids = reinterpret_cast<const std::int32_t*>(ids);
  p.weights = reinterpret_cast<const float*>(weights);
  p.gate = reinterpret_cast<const std::uint8_t*>(gate);
  p.up = reinterpret_cast<const std::uint8_t*>(up);
  p.down = reinterpret_cast<const std::uint8_t*>(down);
  p.out = reinterpret_cast<float*>(out);
  const MoeWorkspace plan = plan_moe_workspace(a.n_tokens, a.k, a.dim, a.ffn, a.n_local);
  if (moe_ == nullptr || moe_->size() < plan.bytes) {
    if (moe_ != nullptr) moe_retired_.push_back(std::move(moe_));
    auto b = d_.alloc(plan.bytes, hal::BufferUsage::kDevice);
    if (!b.ok()) return latch(b.status());
    moe_ = std::move(*b);
  }
  std::byte* ws = static_cast<CudaBuffer*>(moe_.get())->ptr();
  const kernels::MoeScratch scratch{reinterpret_cast<std::int32_t*>(ws + plan.routes),
                                    reinterpret_cast<std::int32_t*>(ws + plan.counts),
                                    reinterpret_cast<float*>(ws + plan.gate), reinterpret_cast<float*>(ws + plan.up),
                                    reinterpret_cast<float*>(ws + plan.down)};
  // The workspace's address is part of the key: a graph captured over an outgrown one is never replayed.
  const void* addrs[] = {x, ids, weights, out, gate, up, down, ws};
  defer(a, addrs, [a, p, scratch](cudaStream_t s) { return launched(kernels::launch_moe_ffn(s, a, p, scratch), "moe_ffn"); });
  return ok_status();
}

Status CudaStream::run(const hal::Op& op) {
  if (!latched_.ok()) return latched_;
  int* err = reinterpret_cast<int*>(static_cast<CudaBuffer*>(errors_.get())->ptr());
  if (const auto* a = std::get_if<hal::MatmulArgs>(&op)) return run_matmul(*a);
  if (const auto* p = std::get_if<hal::AddArgs>(&op)) {
    const hal::AddArgs a = *p;
    if (a.n < 0) return latch_invalid("add: n {} is negative", a.n);
    if (a.n == 0) return ok_status();
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.a, f32s(a.n), "add", "a"));
    SX_ASSIGN_OR_RETURN(std::byte * y, operand(a.b, f32s(a.n), "add", "b"));
    SX_ASSIGN_OR_RETURN(std::byte * out, operand(a.out, f32s(a.n), "add", "out"));
    const void* addrs[] = {x, y, out};
    defer(op, addrs, [a, x, y, out](cudaStream_t s) {
      return launched(kernels::launch_add(s, a, reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(y),
                                          reinterpret_cast<float*>(out)),
                      "add");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::SiluMulArgs>(&op)) {
    const hal::SiluMulArgs a = *p;
    const std::int64_t gs = a.gate_stride > 0 ? a.gate_stride : a.n_cols, us = a.up_stride > 0 ? a.up_stride : a.n_cols,
                       os = a.out_stride > 0 ? a.out_stride : a.n_cols;
    if (a.n_rows < 0 || a.n_cols < 0 || gs < a.n_cols || us < a.n_cols || os < a.n_cols) {
      return latch_invalid("silu_mul: {} rows of {} columns, strides {}, {}, {}", a.n_rows, a.n_cols, gs, us, os);
    }
    if (a.n_rows == 0 || a.n_cols == 0) return ok_status();
    auto bytes = [&](std::int64_t stride) { return f32s((a.n_rows - 1) * stride + a.n_cols); };
    SX_ASSIGN_OR_RETURN(std::byte * g, operand(a.gate, bytes(gs), "silu_mul", "gate"));
    SX_ASSIGN_OR_RETURN(std::byte * u, operand(a.up, bytes(us), "silu_mul", "up"));
    SX_ASSIGN_OR_RETURN(std::byte * o, operand(a.out, bytes(os), "silu_mul", "out"));
    const void* addrs[] = {g, u, o};
    defer(op, addrs, [a, g, u, o](cudaStream_t s) {
      return launched(kernels::launch_silu_mul(s, a, reinterpret_cast<const float*>(g),
                                               reinterpret_cast<const float*>(u), reinterpret_cast<float*>(o)),
                      "silu_mul");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::RmsNormArgs>(&op)) {
    const hal::RmsNormArgs a = *p;
    if (a.n_rows < 0 || a.dim <= 0) return latch_invalid("rmsnorm: {} rows of {}", a.n_rows, a.dim);
    if (a.n_rows == 0) return ok_status();
    const std::size_t bytes = f32s(a.n_rows * a.dim);
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, bytes, "rmsnorm", "x"));
    SX_ASSIGN_OR_RETURN(std::byte * add, optional_operand(a.add, bytes, "rmsnorm", "add"));
    SX_ASSIGN_OR_RETURN(std::byte * w, operand(a.weight, f32s(a.dim), "rmsnorm", "weight"));
    SX_ASSIGN_OR_RETURN(std::byte * out, operand(a.out, bytes, "rmsnorm", "out"));
    const void* addrs[] = {x, add, w, out};
    defer(op, addrs, [a, x, add, w, out](cudaStream_t s) {
      return launched(kernels::launch_rmsnorm(s, a, reinterpret_cast<float*>(x), reinterpret_cast<const float*>(add),
                                              reinterpret_cast<const float*>(w), reinterpret_cast<float*>(out)),
                      "rmsnorm");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::TopKArgs>(&op)) {
    const hal::TopKArgs a = *p;
    if (a.n_rows < 0 || a.n_cols < 1 || a.k < 1 || a.k > std::min(a.n_cols, hal::kMaxTopK) || a.id_offset < 0 ||
        a.id_offset + a.n_cols > INT32_MAX) {
      return latch_invalid("top_k: k {} of rows of {} (1 <= k <= min(n_cols, {})), id offset {}", a.k, a.n_cols,
                           hal::kMaxTopK, a.id_offset);
    }
    if (a.n_rows == 0) return ok_status();
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, f32s(a.n_rows * a.n_cols), "top_k", "x"));
    SX_ASSIGN_OR_RETURN(std::byte * v, operand(a.values, f32s(a.n_rows * a.k), "top_k", "values"));
    SX_ASSIGN_OR_RETURN(std::byte * ids, operand(a.ids, f32s(a.n_rows * a.k), "top_k", "ids"));
    const void* addrs[] = {x, v, ids};
    defer(op, addrs, [a, x, v, ids](cudaStream_t s) {
      return launched(kernels::launch_top_k(s, a, reinterpret_cast<const float*>(x), reinterpret_cast<float*>(v),
                                            reinterpret_cast<std::int32_t*>(ids)),
                      "top_k");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::EmbeddingArgs>(&op)) {
    const hal::EmbeddingArgs a = *p;
    SX_RETURN_IF_ERROR(latch(d_.supports(a)));
    if (a.n_tokens < 0 || a.dim <= 0 || a.vocab <= 0 || a.vocab > INT32_MAX ||
        a.dim % hal::dtype_info(a.table_type).block_elems != 0) {
      return latch_invalid("embedding: {} tokens of {} from a vocabulary of {} in {}", a.n_tokens, a.dim, a.vocab,
                           hal::dtype_name(a.table_type));
    }
    SX_RETURN_IF_ERROR(check_weight_format(a.table, a.table_type, "embedding"));
    if (a.n_tokens == 0) return ok_status();
    const std::size_t rb = hal::row_bytes(a.table_type, a.dim);
    SX_ASSIGN_OR_RETURN(std::byte * table, operand(a.table, rb * static_cast<std::size_t>(a.vocab), "embedding", "table"));
    SX_ASSIGN_OR_RETURN(std::byte * ids, operand(a.ids, f32s(a.n_tokens), "embedding", "ids"));
    SX_ASSIGN_OR_RETURN(std::byte * out, operand(a.out, f32s(a.n_tokens * a.dim), "embedding", "out"));
    const void* addrs[] = {table, ids, out};
    defer(op, addrs, [a, table, ids, out, err](cudaStream_t s) {
      return launched(kernels::launch_embedding(s, a, reinterpret_cast<const std::uint8_t*>(table),
                                                reinterpret_cast<const std::int32_t*>(ids),
                                                reinterpret_cast<float*>(out), err),
                      "embedding");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::RopeArgs>(&op)) {
    const hal::RopeArgs a = *p;
    if (a.rot_dim <= 0 || a.rot_dim > a.head_dim || a.rot_dim % 2 != 0) {
      return latch_invalid("rope: rot_dim {} must be even, positive and at most head_dim {}", a.rot_dim, a.head_dim);
    }
    if (a.n_tokens < 0 || a.n_heads < 0) return latch_invalid("rope: {} tokens of {} heads", a.n_tokens, a.n_heads);
    if (!(a.theta >= 1.0f) || !std::isfinite(a.theta)) {
      return latch_invalid("rope: theta {} must be finite and at least 1", a.theta);
    }
    if (a.n_tokens == 0 || a.n_heads == 0) return ok_status();
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, f32s(a.n_tokens * a.n_heads * a.head_dim), "rope", "x"));
    SX_ASSIGN_OR_RETURN(std::byte * pos, operand(a.positions, f32s(a.n_tokens), "rope", "positions"));
    const void* addrs[] = {x, pos};
    defer(op, addrs, [a, x, pos](cudaStream_t s) {
      return launched(kernels::launch_rope(s, a, reinterpret_cast<float*>(x), reinterpret_cast<const std::int32_t*>(pos)),
                      "rope");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::KvWriteArgs>(&op)) {
    const hal::KvWriteArgs a = *p;
    SX_RETURN_IF_ERROR(latch(d_.supports(a)));
    const std::int64_t row = a.n_kv_heads * a.head_dim;
    if (a.n_tokens < 0 || row < 1 || a.n_slots < 1) {
      return latch_invalid("kv_write: {} tokens of {} KV heads of {} into {} slots", a.n_tokens, a.n_kv_heads,
                           a.head_dim, a.n_slots);
    }
    if (a.n_tokens == 0) return ok_status();
    const std::size_t elem = a.cache_type == hal::DType::kF16 ? 2 : 4;
    const std::size_t cache = static_cast<std::size_t>(a.n_slots * row) * elem;
    SX_ASSIGN_OR_RETURN(std::byte * k, operand(a.k, f32s(a.n_tokens * row), "kv_write", "k"));
    SX_ASSIGN_OR_RETURN(std::byte * v, operand(a.v, f32s(a.n_tokens * row), "kv_write", "v"));
    SX_ASSIGN_OR_RETURN(std::byte * kc, operand(a.k_cache, cache, "kv_write", "k_cache"));
    SX_ASSIGN_OR_RETURN(std::byte * vc, operand(a.v_cache, cache, "kv_write", "v_cache"));
    SX_ASSIGN_OR_RETURN(std::byte * slots, operand(a.slot_mapping, f32s(a.n_tokens), "kv_write", "slot_mapping"));
    const void* addrs[] = {k, v, kc, vc, slots};
    defer(op, addrs, [a, k, v, kc, vc, slots, err](cudaStream_t s) {
      return launched(kernels::launch_kv_write(s, a, reinterpret_cast<const float*>(k), reinterpret_cast<const float*>(v),
                                               kc, vc, reinterpret_cast<const std::int32_t*>(slots), err),
                      "kv_write");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::AttentionArgs>(&op)) {
    const hal::AttentionArgs a = *p;
    SX_RETURN_IF_ERROR(latch(d_.supports(a)));
    if (a.n_seqs < 1 || a.n_tokens < 0 || a.n_heads < 1 || a.n_kv_heads < 1 || a.head_dim < 1 || a.block_size < 1 ||
        a.max_blocks_per_seq < 1 || a.n_slots < 1 || a.heads_per_kv < 1 || a.q_head_offset < 0 ||
        a.kv_head_offset < 0 || a.n_tokens * a.n_heads > INT32_MAX) {
      return latch_invalid("attention: {} sequences, {} tokens, {} heads ({} KV) of {}, blocks of {} x {}, {} slots",
                           a.n_seqs, a.n_tokens, a.n_heads, a.n_kv_heads, a.head_dim, a.block_size,
                           a.max_blocks_per_seq, a.n_slots);
    }
    for (std::int64_t h = 0; h < a.n_heads; ++h) {  // the kernel indexes the cache with this KV head
      const std::int64_t g = (a.q_head_offset + h) / a.heads_per_kv - a.kv_head_offset;
      if (g < 0 || g >= a.n_kv_heads) return latch_invalid("attention: query head {} maps to KV head {} not held here", h, g);
    }
    if (a.n_tokens == 0) return ok_status();
    const std::size_t elem = a.cache_type == hal::DType::kF16 ? 2 : 4;
    const std::size_t cache = static_cast<std::size_t>(a.n_slots * a.n_kv_heads * a.head_dim) * elem;
    const std::size_t qo = f32s(a.n_tokens * a.n_heads * a.head_dim);
    SX_ASSIGN_OR_RETURN(std::byte * q, operand(a.q, qo, "attention", "q"));
    SX_ASSIGN_OR_RETURN(std::byte * kc, operand(a.k_cache, cache, "attention", "k_cache"));
    SX_ASSIGN_OR_RETURN(std::byte * vc, operand(a.v_cache, cache, "attention", "v_cache"));
    SX_ASSIGN_OR_RETURN(std::byte * out, operand(a.out, qo, "attention", "out"));
    SX_ASSIGN_OR_RETURN(std::byte * sts, operand(a.seq_token_start, f32s(a.n_seqs + 1), "attention", "seq_token_start"));
    SX_ASSIGN_OR_RETURN(std::byte * scl, operand(a.seq_context_len, f32s(a.n_seqs), "attention", "seq_context_len"));
    SX_ASSIGN_OR_RETURN(std::byte * bt, operand(a.block_table, f32s(a.n_seqs * a.max_blocks_per_seq), "attention",
                                                "block_table"));
    const kernels::AttentionPtrs ptrs{reinterpret_cast<const float*>(q), kc, vc, reinterpret_cast<float*>(out),
                                      reinterpret_cast<const std::int32_t*>(sts),
                                      reinterpret_cast<const std::int32_t*>(scl),
                                      reinterpret_cast<const std::int32_t*>(bt)};
    const AttentionPlan plan = plan_attention(a.n_tokens, a.n_heads, a.n_kv_heads, a.head_dim,
                                              a.max_blocks_per_seq * a.block_size, d_.multiprocessors(),
                                              partials_->size() / sizeof(float));
    auto* partials = reinterpret_cast<float*>(static_cast<CudaBuffer*>(partials_.get())->ptr());
    const void* addrs[] = {q, kc, vc, out, sts, scl, bt};
    defer(op, addrs, [a, ptrs, err, plan, partials](cudaStream_t s) {
      return launched(kernels::launch_attention(s, a, ptrs, err, plan.splits, plan.chunk, partials), "attention");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::MoeRouterArgs>(&op)) {
    const hal::MoeRouterArgs a = *p;
    if (a.n_tokens < 0 || a.k < 1 || a.k > hal::kMaxTopK || a.k > a.n_experts || a.n_experts > INT32_MAX) {
      return latch_invalid("moe_router: k {} must be in [1, {}] and at most the {} experts ({} tokens)", a.k,
                           hal::kMaxTopK, a.n_experts, a.n_tokens);
    }
    if (a.n_tokens == 0) return ok_status();
    SX_ASSIGN_OR_RETURN(std::byte * l, operand(a.logits, f32s(a.n_tokens * a.n_experts), "moe_router", "logits"));
    SX_ASSIGN_OR_RETURN(std::byte * ids, operand(a.ids, f32s(a.n_tokens * a.k), "moe_router", "ids"));
    SX_ASSIGN_OR_RETURN(std::byte * w, operand(a.weights, f32s(a.n_tokens * a.k), "moe_router", "weights"));
    const void* addrs[] = {l, ids, w};
    defer(op, addrs, [a, l, ids, w](cudaStream_t s) {
      return launched(kernels::launch_moe_router(s, a, reinterpret_cast<const float*>(l),
                                                 reinterpret_cast<std::int32_t*>(ids), reinterpret_cast<float*>(w)),
                      "moe_router");
    });
    return ok_status();
  }
  if (const auto* a = std::get_if<hal::MoeFfnArgs>(&op)) return run_moe_ffn(*a);
  if (const auto* p = std::get_if<hal::SigmoidMulArgs>(&op)) {
    const hal::SigmoidMulArgs a = *p;
    const std::int64_t gate_cols = a.gate_per_row ? 1 : a.n_cols;
    const std::int64_t xs = a.x_stride > 0 ? a.x_stride : a.n_cols, gs = a.gate_stride > 0 ? a.gate_stride : gate_cols,
                       os = a.out_stride > 0 ? a.out_stride : a.n_cols;
    if (a.n_rows < 0 || a.n_cols < 0 || xs < a.n_cols || gs < gate_cols || os < a.n_cols) {
      return latch_invalid("sigmoid_mul: {} rows of {} with strides {}, {}, {}", a.n_rows, a.n_cols, xs, gs, os);
    }
    if (a.n_rows == 0 || a.n_cols == 0) return ok_status();
    auto bytes = [&](std::int64_t stride, std::int64_t cols) { return f32s((a.n_rows - 1) * stride + cols); };
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, bytes(xs, a.n_cols), "sigmoid_mul", "x"));
    SX_ASSIGN_OR_RETURN(std::byte * g, operand(a.gate, bytes(gs, gate_cols), "sigmoid_mul", "gate"));
    SX_ASSIGN_OR_RETURN(std::byte * o, operand(a.out, bytes(os, a.n_cols), "sigmoid_mul", "out"));
    const void* addrs[] = {x, g, o};
    defer(op, addrs, [a, x, g, o](cudaStream_t s) {
      return launched(kernels::launch_sigmoid_mul(s, a, reinterpret_cast<const float*>(x),
                                                  reinterpret_cast<const float*>(g), reinterpret_cast<float*>(o)),
                      "sigmoid_mul");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::GatedNormArgs>(&op)) {
    const hal::GatedNormArgs a = *p;
    if (a.n_rows < 0 || a.dim <= 0) return latch_invalid("gated_norm: {} rows of {}", a.n_rows, a.dim);
    if (a.n_rows == 0) return ok_status();
    const std::size_t bytes = f32s(a.n_rows * a.dim);
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, bytes, "gated_norm", "x"));
    SX_ASSIGN_OR_RETURN(std::byte * z, operand(a.z, bytes, "gated_norm", "z"));
    SX_ASSIGN_OR_RETURN(std::byte * w, operand(a.weight, f32s(a.dim), "gated_norm", "weight"));
    SX_ASSIGN_OR_RETURN(std::byte * o, operand(a.out, bytes, "gated_norm", "out"));
    const void* addrs[] = {x, z, w, o};
    defer(op, addrs, [a, x, z, w, o](cudaStream_t s) {
      return launched(kernels::launch_gated_norm(s, a, reinterpret_cast<const float*>(x),
                                                 reinterpret_cast<const float*>(z), reinterpret_cast<const float*>(w),
                                                 reinterpret_cast<float*>(o)),
                      "gated_norm");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::ConvStateArgs>(&op)) {
    const hal::ConvStateArgs a = *p;
    if (Status st = hal::check_conv_state(a); !st.ok()) return latch(st);
    if (a.n_seqs == 0) return ok_status();
    const std::int64_t xs = a.x_stride > 0 ? a.x_stride : a.channels, T = std::max<std::int64_t>(a.n_tokens, 1);
    SX_ASSIGN_OR_RETURN(std::byte * x, operand(a.x, f32s((T - 1) * xs + a.channels), "conv_state", "x"));
    SX_ASSIGN_OR_RETURN(std::byte * w, operand(a.weight, f32s(a.channels * a.kernel), "conv_state", "weight"));
    SX_ASSIGN_OR_RETURN(std::byte * st,
                        operand(a.state, f32s(a.n_slots * (a.kernel - 1) * a.channels), "conv_state", "state"));
    SX_ASSIGN_OR_RETURN(std::byte * o, operand(a.out, f32s(T * a.channels), "conv_state", "out"));
    SX_ASSIGN_OR_RETURN(std::byte * b0, operand(a.seq_token_start, f32s(a.n_seqs + 1), "conv_state", "seq_token_start"));
    SX_ASSIGN_OR_RETURN(std::byte * b1, operand(a.seq_context_len, f32s(a.n_seqs), "conv_state", "seq_context_len"));
    SX_ASSIGN_OR_RETURN(std::byte * b2, operand(a.seq_slot, f32s(a.n_seqs), "conv_state", "seq_slot"));
    const void* addrs[] = {x, w, st, o, b0, b1, b2};
    const kernels::ConvStatePtrs ptrs{reinterpret_cast<const float*>(x), reinterpret_cast<const float*>(w),
                                      reinterpret_cast<float*>(st), reinterpret_cast<float*>(o),
                                      reinterpret_cast<const std::int32_t*>(b0),
                                      reinterpret_cast<const std::int32_t*>(b1),
                                      reinterpret_cast<const std::int32_t*>(b2)};
    defer(op, addrs, [a, ptrs](cudaStream_t s) {
      return launched(kernels::launch_conv_state(s, a, ptrs), "conv_state");
    });
    return ok_status();
  }
  if (const auto* p = std::get_if<hal::DeltaRuleArgs>(&op)) {
    const hal::DeltaRuleArgs a = *p;
    if (Status st = hal::check_delta_rule(a); !st.ok()) return latch(st);
    if (a.d_k > 256 || a.d_v > 256) return latch(unimplemented_error("delta_rule: heads of at most 256"));
    if (a.n_seqs == 0) return ok_status();
    const std::int64_t qkv = a.qkv_stride > 0 ? a.qkv_stride : 2 * a.n_k_heads * a.d_k + a.n_v_heads * a.d_v;
    const std::int64_t gs = a.gate_stride > 0 ? a.gate_stride : a.n_v_heads;
    const std::int64_t last = std::max<std::int64_t>(a.n_tokens, 1) - 1;
    const char* op_name = "delta_rule";
    SX_ASSIGN_OR_RETURN(std::byte * q, operand(a.q, f32s(last * qkv + a.n_k_heads * a.d_k), op_name, "q"));
    SX_ASSIGN_OR_RETURN(std::byte * k, operand(a.k, f32s(last * qkv + a.n_k_heads * a.d_k), op_name, "k"));
    SX_ASSIGN_OR_RETURN(std::byte * v, operand(a.v, f32s(last * qkv + a.n_v_heads * a.d_v), op_name, "v"));
    SX_ASSIGN_OR_RETURN(std::byte * al, operand(a.alpha, f32s(last * gs + a.n_v_heads), op_name, "alpha"));
    SX_ASSIGN_OR_RETURN(std::byte * be, operand(a.beta, f32s(last * gs + a.n_v_heads), op_name, "beta"));
    SX_ASSIGN_OR_RETURN(std::byte * av, operand(a.a, f32s(a.n_v_heads), op_name, "a"));
    SX_ASSIGN_OR_RETURN(std::byte * dt, operand(a.dt_bias, f32s(a.n_v_heads), op_name, "dt_bias"));
    SX_ASSIGN_OR_RETURN(std::byte * st,
                        operand(a.state, f32s(a.n_slots * a.n_v_heads * a.d_k * a.d_v), op_name, "state"));
    SX_ASSIGN_OR_RETURN(std::byte * o, operand(a.out, f32s((last + 1) * a.n_v_heads * a.d_v), op_name, "out"));
    SX_ASSIGN_OR_RETURN(std::byte * b0, operand(a.seq_token_start, f32s(a.n_seqs + 1), op_name, "seq_token_start"));
    SX_ASSIGN_OR_RETURN(std::byte * b1, operand(a.seq_context_len, f32s(a.n_seqs), op_name, "seq_context_len"));
    SX_ASSIGN_OR_RETURN(std::byte * b2, operand(a.seq_slot, f32s(a.n_seqs), op_name, "seq_slot"));
    const void* addrs[] = {q, k, v, al, be, av, dt, st, o, b0, b1, b2};
    auto f = [](std::byte* b) { return reinterpret_cast<const float*>(b); };
    auto i32 = [](std::byte* b) { return reinterpret_cast<const std::int32_t*>(b); };
    const kernels::DeltaRulePtrs ptrs{f(q),  f(k), f(v), f(al), f(be), f(av), f(dt), reinterpret_cast<float*>(st),
                                      reinterpret_cast<float*>(o), i32(b0), i32(b1), i32(b2)};
    defer(op, addrs, [a, ptrs](cudaStream_t s) {
      return launched(kernels::launch_delta_rule(s, a, ptrs), "delta_rule");
    });
    return ok_status();
  }
  return latch(unimplemented_error("the CUDA backend has no kernel for {}", hal::op_name(op)));
}

Result<std::unique_ptr<hal::Stream>> CudaDevice::create_stream() {
  auto s = std::make_unique<CudaStream>(*this);
  SX_RETURN_IF_ERROR(s->init());
  return std::unique_ptr<hal::Stream>(std::move(s));
}

}  // namespace

Result<std::unique_ptr<hal::Device>> create_cuda_device(const hal::DeviceInfo& info, int ordinal,
                                                        const hal::DeviceOptions& options) {
  SX_ASSIGN_OR_RETURN(const CudaOptions o, parse_options(options));
  auto d = std::make_unique<CudaDevice>(info, ordinal, o);
  SX_RETURN_IF_ERROR(d->activate());
  int sms = 0;
  SX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
                                 info.name + ": multiprocessor count"));
  d->set_multiprocessors(sms);
  // The probe (kernels/probe.cu): "no kernel image" found here, before any weight is read.
  int* probe = nullptr;
  SX_RETURN_IF_ERROR(cuda_status(cudaMalloc(reinterpret_cast<void**>(&probe), sizeof(int)), info.name + ": probe"));
  cudaError_t e = kernels::launch_probe(nullptr, probe);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  int value = 0;
  if (e == cudaSuccess) e = cudaMemcpy(&value, probe, sizeof value, cudaMemcpyDeviceToHost);
  (void)cudaFree(probe);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, fmt::format("{}: the probe kernel (built for {})", info.name, compiled_archs_text()));
  }
  if (value != 0x5e7a47) return internal_error("{}: the probe kernel wrote {:#x}", info.name, value);
  return std::unique_ptr<hal::Device>(std::move(d));
}

Result<void*> native_stream(hal::Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  if (s == nullptr) return invalid_argument_error("channel: the stream is not a CUDA stream");
  SX_ASSIGN_OR_RETURN(cudaStream_t cs, s->native());
  return static_cast<void*>(cs);
}

Result<std::byte*> device_address(const hal::BufView& view, std::size_t bytes, const hal::Device& device) {
  const auto* b = view ? dynamic_cast<const CudaBuffer*>(view.buffer) : nullptr;
  if (b == nullptr || &b->device() != &device) {
    return invalid_argument_error("channel: the buffer is not one of {}'s", device.info().name);
  }
  if (view.offset > b->size() || bytes > b->size() - view.offset) {
    return out_of_range_error("channel: {} bytes at offset {} overrun a buffer of {} bytes", bytes, view.offset,
                              b->size());
  }
  if (b->usage() != hal::BufferUsage::kDevice) {
    return invalid_argument_error("channel: an {} buffer; collectives take device buffers",
                                  hal::buffer_usage_name(b->usage()));
  }
  return b->ptr() + view.offset;
}

void add_sync_check(hal::Stream& stream, std::function<Status()> check) {
  if (auto* s = dynamic_cast<CudaStream*>(&stream); s != nullptr) s->add_sync_check(std::move(check));
}

int cuda_ordinal(const hal::Device& device) {
  const auto* d = dynamic_cast<const CudaDevice*>(&device);
  return d != nullptr ? d->ordinal() : -1;
}

Result<std::vector<std::unique_ptr<hal::Channel>>> create_cuda_channels(std::span<hal::Device* const> devices,
                                                                         const hal::ChannelOptions& options) {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (dynamic_cast<CudaDevice*>(devices[i]) == nullptr) {
      return invalid_argument_error("channel: device {} of the group is not a CUDA device", i);
    }
  }
  // A group of one needs no transport, unless NCCL is asked for (a communicator of one rank and its
  // self-test validate NCCL on a machine with one GPU: tests/device/run).
  const char* env = std::getenv("SEXTANT_CUDA_CHANNEL");
  if (devices.size() <= 1 && (env == nullptr || std::string_view(env) != "nccl")) {
    return backends::create_staged_channels(devices, options);
  }
  std::vector<int> ordinals;
  for (hal::Device* d : devices) ordinals.push_back(cuda_ordinal(*d));
  const Result<const NcclApi*> nccl = load_nccl();
  SX_ASSIGN_OR_RETURN(const CudaChannelKind kind,
                      choose_cuda_channel(ordinals, env, nccl.status()));
  if (kind == CudaChannelKind::kLoopback) return create_loopback_channels(devices, options);
  if (kind == CudaChannelKind::kStaged) {
    log_info("{}: collectives staged through host memory ({} devices; SEXTANT_CUDA_CHANNEL=nccl for distinct GPUs "
             "or loopback for devices of one GPU keeps them on the GPUs)",
             options.name.empty() ? "channel" : options.name, devices.size());
    return backends::create_staged_channels(devices, options);
  }
  return create_nccl_channels(**nccl, devices, options);
}

}  // namespace sx::cuda
