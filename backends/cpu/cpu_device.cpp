// CpuDevice / CpuBuffer / CpuStream: buffers, copies and op dispatch with argument checking.
#include "backends/cpu/cpu_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_channel.h"
#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/base/log.h"
#include "runtime/hal/op_checks.h"

namespace sx::cpu {

namespace {

// A /proc/meminfo field ("MemTotal:", "MemAvailable:") in bytes, or `fallback`.
std::uint64_t meminfo_bytes(std::string_view field, std::uint64_t fallback) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == field) return kb * 1024;
  }
  return fallback;
}

std::uint64_t system_memory_bytes() { return meminfo_bytes("MemTotal:", 8ull << 30); }

// The host's RAM as every logical device sees it: `budget` when one is set.
void describe_memory(hal::DeviceInfo& info, std::uint64_t budget) {
  info.kind = hal::DeviceKind::kCpu;
  info.shared_memory = true;
  info.memory_bytes = budget > 0 ? budget : system_memory_bytes();
  info.free_bytes = std::min(info.memory_bytes, meminfo_bytes("MemAvailable:", info.memory_bytes));
}

constexpr std::size_t kAlign = 64;
constexpr std::size_t kHugePage = std::size_t{2} << 20;
// Buffers from this size on are mappings of their own (CpuDevice::alloc); under AddressSanitizer
// none are, so that its checks see every buffer's bounds.
#if defined(__SANITIZE_ADDRESS__)
#define SX_CPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SX_CPU_ASAN 1
#endif
#endif
#if defined(SX_CPU_ASAN)
constexpr std::size_t kOwnMapping = SIZE_MAX;
#else
constexpr std::size_t kOwnMapping = std::size_t{64} << 10;
#endif

}  // namespace

CpuBuffer::CpuBuffer(CpuDevice& device, std::byte* data, std::size_t size, std::size_t mapped_bytes,
                     hal::BufferUsage usage)
    : device_(device), data_(data), size_(size), mapped_bytes_(mapped_bytes), usage_(usage) {}

CpuBuffer::~CpuBuffer() {
  device_.release(this);
  if (mapped_bytes_ > 0) {
    munmap(data_, mapped_bytes_);
  } else {
    std::free(data_);
  }
}

hal::Device& CpuBuffer::device() const { return device_; }

std::span<std::byte> CpuBuffer::host() const {
  if (usage_ == hal::BufferUsage::kDevice) return {};
  return {data_, size_};
}

Result<CpuOptions> parse_cpu_options(const hal::DeviceOptions& options) {
  hal::OptionReader r("cpu", options);
  CpuOptions o;
  SX_ASSIGN_OR_RETURN(std::int64_t threads, r.integer("threads", 0, 0, 4096));
  SX_ASSIGN_OR_RETURN(std::int64_t budget, r.integer("memory_budget", 0, 0, INT64_MAX));
  SX_ASSIGN_OR_RETURN(o.strict, r.flag("strict", false));
  SX_ASSIGN_OR_RETURN(std::int64_t fail_at, r.integer("fail_at_op", 0, 0, INT64_MAX));
  SX_ASSIGN_OR_RETURN(std::int64_t corrupt, r.integer("corrupt_device", -1, -1, 4096));
  SX_RETURN_IF_ERROR(r.finish());
  o.corrupt_device = static_cast<int>(corrupt);
  o.threads = static_cast<int>(threads);
  o.memory_budget = static_cast<std::uint64_t>(budget);
  o.fail_at_op = static_cast<std::uint64_t>(fail_at);
  return o;
}

CpuDevice::CpuDevice(int index, const CpuOptions& options)
    : pool_(options.threads > 0 ? options.threads : hardware_threads()),
      strict_(options.strict),
      fail_at_op_(options.fail_at_op),
      corrupt_(options.corrupt_device == index) {
  info_.backend = "cpu";
  info_.index = index;
  describe_memory(info_, options.memory_budget);
  info_.name = fmt::format("cpu:{} ({} threads{})", index, pool_.size(), strict_ ? ", strict" : "");
}

hal::MemoryInfo CpuDevice::memory() const { return {info_.memory_bytes, used_.load()}; }

Result<std::unique_ptr<hal::Buffer>> CpuDevice::alloc(std::size_t bytes, hal::BufferUsage usage) {
  const std::size_t size = bytes == 0 ? 1 : bytes;
  const std::uint64_t used = used_.fetch_add(size) + size;
  if (used > info_.memory_bytes) {
    used_.fetch_sub(size);
    return resource_exhausted_error("{}: cannot allocate {} bytes: {} of {} bytes in use", info_.name, bytes,
                                    used - size, info_.memory_bytes);
  }
  if (strict_ && usage == hal::BufferUsage::kDevice) {
    // Device memory apart from host memory: no access until the device executes (sync()).
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t mapped = (size + page - 1) / page * page;
    void* p = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      used_.fetch_sub(size);
      return resource_exhausted_error("{}: mapping {} bytes failed", info_.name, bytes);
    }
    auto buffer = std::make_unique<CpuBuffer>(*this, static_cast<std::byte*>(p), size, mapped, usage);
    std::lock_guard<std::mutex> lock(buffers_mu_);
    mapped_buffers_.insert(buffer.get());
    return std::unique_ptr<hal::Buffer>(std::move(buffer));
  }
  // Buffers of 64 KiB and more (weights, the KV pool, states, activations) are mappings of their
  // own, which go back to the system when freed: from malloc's heap they did not (glibc raises its
  // mmap threshold to the size of each mapped block freed, so a reloaded model's buffers came from
  // the heap and stayed there: a daemon's RSS grew from 1.0 to 2.6 GiB over 20 reloads, issue 53
  // item 9). From 2 MiB on they are 2 MiB-aligned, in transparent huge pages where the kernel allows
  // them ("madvise" mode included): a decode step streams every weight once, and with 4 KiB pages
  // each W stream takes a TLB miss every 4 KiB.
  if (size >= kOwnMapping) {
    const std::size_t align = size >= kHugePage ? kHugePage : static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t mapped = (size + align - 1) / align * align;
    const std::size_t slack = align > kOwnMapping ? align : 0;  // room to align to 2 MiB
    void* region = mmap(nullptr, mapped + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) {
      used_.fetch_sub(size);
      return resource_exhausted_error("{}: mapping {} bytes failed", info_.name, bytes);
    }
    // The aligned part of it; the rest unmapped again.
    auto* base = static_cast<std::byte*>(region);
    if (slack > 0) {
      const std::size_t head = (align - reinterpret_cast<std::uintptr_t>(base) % align) % align;
      if (head > 0) munmap(base, head);
      munmap(base + head + mapped, slack - head);
      base += head;
      madvise(base, mapped, MADV_HUGEPAGE);  // a hint: errors are harmless
    }
    return std::unique_ptr<hal::Buffer>(std::make_unique<CpuBuffer>(*this, base, size, mapped, usage));
  }
  void* p = std::aligned_alloc(kAlign, (size + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr) {
    used_.fetch_sub(size);
    return resource_exhausted_error("{}: host allocation of {} bytes failed", info_.name, bytes);
  }
  return std::unique_ptr<hal::Buffer>(std::make_unique<CpuBuffer>(*this, static_cast<std::byte*>(p), size, 0, usage));
}

void CpuDevice::release(CpuBuffer* buffer) {
  used_.fetch_sub(buffer->size());
  if (buffer->mapped_bytes() > 0) {
    std::lock_guard<std::mutex> lock(buffers_mu_);
    mapped_buffers_.erase(buffer);
  }
}

void CpuDevice::set_buffers_accessible(bool accessible) {
  std::lock_guard<std::mutex> lock(buffers_mu_);
  for (CpuBuffer* b : mapped_buffers_) {
    if (mprotect(b->data(), b->mapped_bytes(), accessible ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
      fatal("cpu strict mode", fmt::format("mprotect of a {}-byte buffer failed: errno {}", b->mapped_bytes(), errno));
    }
  }
}

Status CpuDevice::count_op(std::string_view op_name) {
  const std::uint64_t n = ops_run_.fetch_add(1) + 1;
  if (fail_at_op_ != 0 && n == fail_at_op_) {
    return internal_error("{}: injected failure at op {} ({})", info_.name, n, op_name);
  }
  return ok_status();
}

Result<std::unique_ptr<hal::Stream>> CpuDevice::create_stream() {
  return std::unique_ptr<hal::Stream>(std::make_unique<CpuStream>(*this));
}

namespace {

struct CpuEvent final : hal::Event {
  const CpuDevice* device = nullptr;
  bool recorded = false;
  std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace

Result<std::unique_ptr<hal::Event>> CpuDevice::create_event() {
  auto e = std::make_unique<CpuEvent>();
  e->device = this;
  return std::unique_ptr<hal::Event>(std::move(e));
}

namespace {

// The layout a weight is kept in: weight_layout's, unless its row groups would straddle the stacked
// matrices of w.row_unit rows (then the file's format: an expert must start on a group).
hal::DType layout_of(const hal::WeightDesc& w) {
  const hal::DType layout = weight_layout(w.format, w.cols);
  return w.row_unit > 0 && w.row_unit % interleaved_rows(layout) != 0 ? w.format : layout;
}

}  // namespace

std::size_t CpuDevice::weight_bytes(const hal::WeightDesc& w) const {
  return cpu::tensor_bytes(layout_of(w), w.rows, w.cols);
}

Result<std::unique_ptr<hal::Buffer>> CpuDevice::upload_weight(hal::Stream& stream, const hal::WeightDesc& w,
                                                              std::span<const std::byte> bytes) {
  SX_RETURN_IF_ERROR(hal::check_weight_bytes(w, bytes));
  const hal::DType layout = layout_of(w);
  SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> b, alloc(weight_bytes(w)));
  if (layout == w.format) {
    SX_RETURN_IF_ERROR(stream.upload(*b, 0, bytes));
  } else {
    if (hal::dtype_info(w.format).quantized && w.cols % hal::kQK != 0) {
      return invalid_argument_error("upload_weight: {} x {} {}: columns are not a multiple of 32", w.rows, w.cols,
                                    hal::dtype_name(w.format));
    }
    std::vector<std::byte> repacked(b->size());
    repack_rows(layout, bytes.data(), w.rows, w.cols, repacked.data());
    SX_RETURN_IF_ERROR(stream.upload(*b, 0, repacked));
    SX_RETURN_IF_ERROR(stream.sync());  // the upload reads `repacked` until then
  }
  static_cast<CpuBuffer&>(*b).set_layout(layout, w.rows);
  return b;
}

namespace {

// Every GGML block format (the CPU kernels dequantise what they have no int8 kernel for).
bool weight_format_ok(hal::DType t) {
  return t == hal::DType::kF32 || t == hal::DType::kF16 || t == hal::DType::kBF16 ||
         (hal::dtype_info(t).quantized && hal::can_dequantize(t));
}
bool cache_format_ok(hal::DType t) { return t == hal::DType::kF32 || t == hal::DType::kF16 || t == hal::DType::kBF16; }

constexpr std::int64_t kMaxHeadsPerKv = 64, kMaxRotDim = 512;  // what the kernels are written for
constexpr std::string_view kWeightFormats = "the CPU kernels read f32, f16, bf16 and the GGML block formats";
constexpr std::string_view kCacheFormats = "the CPU's KV cache is f32, f16 or bf16";

}  // namespace

// The same rules as the ops' own argument checks (resolve_rows, kv_write, attention), which is
// where a stream meets them: run() does not call this.
Status CpuDevice::supports(const hal::Op& op) const {
  if (const auto* m = std::get_if<hal::MatmulArgs>(&op); m != nullptr && !weight_format_ok(m->w_type)) {
    return unimplemented_error("{}", kWeightFormats);
  }
  if (const auto* e = std::get_if<hal::EmbeddingArgs>(&op); e != nullptr && !weight_format_ok(e->table_type)) {
    return unimplemented_error("{}", kWeightFormats);
  }
  if (const auto* k = std::get_if<hal::KvWriteArgs>(&op); k != nullptr && !cache_format_ok(k->cache_type)) {
    return unimplemented_error("{}", kCacheFormats);
  }
  if (const auto* a = std::get_if<hal::AttentionArgs>(&op); a != nullptr) {
    if (!cache_format_ok(a->cache_type)) return unimplemented_error("{}", kCacheFormats);
    if (a->heads_per_kv > kMaxHeadsPerKv) {
      return unimplemented_error("the CPU's attention takes at most {} query heads per KV head", kMaxHeadsPerKv);
    }
  }
  if (const auto* m = std::get_if<hal::MoeFfnArgs>(&op);
      m != nullptr && !(weight_format_ok(m->gate_type) && weight_format_ok(m->up_type) && weight_format_ok(m->down_type))) {
    return unimplemented_error("{}", kWeightFormats);
  }
  if (const auto* r = std::get_if<hal::MoeRouterArgs>(&op); r != nullptr && r->k > hal::kMaxTopK) {
    return unimplemented_error("the router selects at most {} experts per token", hal::kMaxTopK);
  }
  if (const auto* t = std::get_if<hal::TopKArgs>(&op); t != nullptr && t->k > hal::kMaxTopK) {
    return unimplemented_error("top-k selects at most {} per row", hal::kMaxTopK);
  }
  if (const auto* r = std::get_if<hal::RopeArgs>(&op); r != nullptr && r->rot_dim > kMaxRotDim) {
    return unimplemented_error("the CPU's rope rotates at most {} dimensions", kMaxRotDim);
  }
  return ok_status();
}

Status CpuStream::latch(Status s) {
  if (latched_.ok() && !s.ok()) latched_ = s;
  return s;
}

Result<std::byte*> resolve_view(const CpuDevice& device, const hal::BufView& v, std::size_t bytes, std::string_view op,
                                std::string_view what, bool any_usage) {
  if (v.buffer == nullptr) return invalid_argument_error("{}: {} buffer is missing", op, what);
  auto* cb = dynamic_cast<CpuBuffer*>(v.buffer);
  if (cb == nullptr) return invalid_argument_error("{}: {} buffer does not belong to the CPU backend", op, what);
  if (&cb->cpu_device() != &device) {
    return invalid_argument_error("{}: {} buffer belongs to {}, not to {} where the work runs (move data between "
                                  "devices with a Channel or through the host)",
                                  op, what, cb->cpu_device().info().name, device.info().name);
  }
  if (!any_usage && cb->usage() != hal::BufferUsage::kDevice) {
    return invalid_argument_error("{}: {} is an {} buffer; ops take device buffers (copy() it to one)", op, what,
                                  hal::buffer_usage_name(cb->usage()));
  }
  if (v.offset > cb->size() || bytes > cb->size() - v.offset) {
    return out_of_range_error("{}: {} needs bytes [{}, {}) but its buffer holds {}", op, what, v.offset,
                              v.offset + bytes, cb->size());
  }
  return cb->data() + v.offset;
}

namespace {

template <typename T>
Result<T*> resolve_as(const CpuDevice& d, const hal::BufView& v, std::int64_t count, std::string_view op,
                      std::string_view what) {
  if (count < 0) return invalid_argument_error("{}: negative size for {}", op, what);
  SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(d, v, static_cast<std::size_t>(count) * sizeof(T), op, what));
  return reinterpret_cast<T*>(p);
}

// A weight or table named by its file format `format`: its memory and the type the kernels read
// it as (the buffer's layout when upload_weight made it, else the format itself).
Result<const void*> resolve_rows(const CpuDevice& d, const hal::BufView& v, hal::DType format, std::int64_t rows,
                                 std::int64_t cols, std::string_view op, std::string_view what, hal::DType* kernel_type) {
  if (!weight_format_ok(format)) {
    return unimplemented_error("{}: {} {}: {}", op, hal::dtype_name(format), what, kWeightFormats);
  }
  hal::DType t = format;
  if (const auto* cb = dynamic_cast<const CpuBuffer*>(v.buffer); cb != nullptr && cb->layout()) {
    if (layout_source(*cb->layout()) != format) {
      return invalid_argument_error("{}: the {} buffer holds {} weights, the op names {}", op, what,
                                    type_name(*cb->layout()), hal::dtype_name(format));
    }
    t = *cb->layout();
    // A float layout's plain tail begins where the uploaded rows' last whole panel ends: an op takes
    // all of its rows, or whole panels from its start (layouts.h).
    if ((t == kF32R16 || t == kF16R16 || t == kBF16R16) && rows != cb->layout_rows() &&
        (rows % kFloatR16Rows != 0 || v.offset != 0 || rows > cb->layout_rows())) {
      return invalid_argument_error("{}: {} rows of the {} weight's {} (in 16-row panels) can be read only all of them "
                                    "or whole panels from its first row",
                                    op, rows, what, cb->layout_rows());
    }
  }
  const int block = hal::dtype_info(format).block_elems;
  if (cols % block != 0) {
    return invalid_argument_error("{}: {} rows of {} elements are not a multiple of the {} block ({})", op, what,
                                  cols, hal::dtype_name(format), block);
  }
  SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(d, v, cpu::tensor_bytes(t, rows, cols), op, what));
  *kernel_type = t;
  return static_cast<const void*>(p);
}

}  // namespace

Status CpuStream::enqueue(std::function<Status()> work) {
  if (!latched_.ok()) return latched_;
  if (device_.strict()) {
    pending_.push_back(std::move(work));
    return ok_status();
  }
  std::lock_guard<std::mutex> lock(device_.exec_mutex());
  return latch(work());
}

Status CpuStream::sync() {
  if (pending_.empty()) return latched_;
  std::vector<std::function<Status()>> work;
  work.swap(pending_);
  std::lock_guard<std::mutex> lock(device_.exec_mutex());
  device_.set_buffers_accessible(true);
  for (auto& w : work) {
    if (!latched_.ok()) break;
    (void)latch(w());
  }
  device_.set_buffers_accessible(false);
  return latched_;
}

Status CpuStream::upload(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) {
  if (!latched_.ok()) return latched_;
  SX_RETURN_IF_ERROR(latch(resolve_view(device_, {&dst, dst_offset}, src.size(), "upload", "destination", true).status()));
  return enqueue([this, &dst, dst_offset, src]() -> Status {
    SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, {&dst, dst_offset}, src.size(), "upload", "destination", true));
    if (!src.empty()) std::memcpy(p, src.data(), src.size());
    return ok_status();
  });
}

Status CpuStream::download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t src_offset) {
  if (!latched_.ok()) return latched_;
  const hal::BufView view{const_cast<hal::Buffer*>(&src), src_offset};
  SX_RETURN_IF_ERROR(latch(resolve_view(device_, view, dst.size(), "download", "source", true).status()));
  // Strict mode: until sync() the destination holds 0xFF bytes (NaN as floats), never stale data.
  if (device_.strict() && !dst.empty()) std::memset(dst.data(), 0xFF, dst.size());
  return enqueue([this, dst, view]() -> Status {
    SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, view, dst.size(), "download", "source", true));
    if (!dst.empty()) std::memcpy(dst.data(), p, dst.size());
    return ok_status();
  });
}

Status CpuStream::update(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) {
  if (!latched_.ok()) return latched_;
  if (src.size() > kMaxUpdateBytes) {
    return latch(invalid_argument_error("update: {} bytes is more than the {} an update takes (upload them)",
                                        src.size(), kMaxUpdateBytes));
  }
  SX_RETURN_IF_ERROR(latch(resolve_view(device_, {&dst, dst_offset}, src.size(), "update", "destination", true).status()));
  return enqueue([this, &dst, dst_offset, bytes = std::vector<std::byte>(src.begin(), src.end())]() -> Status {
    SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, {&dst, dst_offset}, bytes.size(), "update", "destination", true));
    if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
    return ok_status();
  });
}

Status CpuStream::fill(hal::Buffer& dst, std::size_t dst_offset, std::size_t bytes, std::uint8_t value) {
  if (!latched_.ok()) return latched_;
  SX_RETURN_IF_ERROR(latch(resolve_view(device_, {&dst, dst_offset}, bytes, "fill", "destination", true).status()));
  return enqueue([this, &dst, dst_offset, bytes, value]() -> Status {
    SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, {&dst, dst_offset}, bytes, "fill", "destination", true));
    if (bytes > 0) std::memset(p, value, bytes);
    return ok_status();
  });
}

Status CpuStream::copy(hal::Buffer& dst, std::size_t dst_offset, const hal::Buffer& src, std::size_t src_offset,
                       std::size_t bytes) {
  if (!latched_.ok()) return latched_;
  const hal::BufView d{&dst, dst_offset}, s{const_cast<hal::Buffer*>(&src), src_offset};
  SX_RETURN_IF_ERROR(latch(resolve_view(device_, d, bytes, "copy", "destination", true).status()));
  SX_RETURN_IF_ERROR(latch(resolve_view(device_, s, bytes, "copy", "source", true).status()));
  return enqueue([this, d, s, bytes]() -> Status {
    SX_ASSIGN_OR_RETURN(std::byte * dp, resolve_view(device_, d, bytes, "copy", "destination", true));
    SX_ASSIGN_OR_RETURN(std::byte * sp, resolve_view(device_, s, bytes, "copy", "source", true));
    if (bytes > 0) std::memmove(dp, sp, bytes);
    return ok_status();
  });
}

Status CpuStream::record(hal::Event& event) {
  if (!latched_.ok()) return latched_;
  auto* e = dynamic_cast<CpuEvent*>(&event);
  if (e == nullptr || e->device != &device_) {
    return latch(invalid_argument_error("record: the event does not belong to {}", device_.info().name));
  }
  e->recorded = true;
  e->done->store(false);
  return enqueue([done = e->done]() -> Status {
    done->store(true);
    return ok_status();
  });
}

Status CpuStream::wait(const hal::Event& event) {
  if (!latched_.ok()) return latched_;
  const auto* e = dynamic_cast<const CpuEvent*>(&event);
  if (e == nullptr || e->device != &device_) {
    return latch(invalid_argument_error("wait: the event does not belong to {}", device_.info().name));
  }
  if (!e->recorded) return latch(failed_precondition_error("wait: the event was never recorded"));
  return enqueue([done = e->done, name = device_.info().name]() -> Status {
    if (!done->load()) {
      return failed_precondition_error("{}: a stream waits on an event whose work has not run (sync the stream "
                                       "that recorded it first)",
                                       name);
    }
    return ok_status();
  });
}

namespace {

struct Dispatch {
  CpuDevice& dev;
  Scratch& scratch;
  ThreadPool& pool() { return dev.pool(); }

  Status operator()(const hal::EmbeddingArgs& a) {
    hal::DType table_type{};
    SX_ASSIGN_OR_RETURN(const void* table,
                        resolve_rows(dev, a.table, a.table_type, a.vocab, a.dim, "embedding", "table", &table_type));
    SX_ASSIGN_OR_RETURN(const std::int32_t* ids, resolve_as<const std::int32_t>(dev, a.ids, a.n_tokens, "embedding", "ids"));
    SX_ASSIGN_OR_RETURN(float* out, resolve_as<float>(dev, a.out, a.n_tokens * a.dim, "embedding", "out"));
    if (a.shard) {
      // Rows this shard holds are gathered; the others are zero.
      std::vector<std::int32_t> local(static_cast<std::size_t>(a.n_tokens));
      for (std::int64_t t = 0; t < a.n_tokens; ++t) {
        const std::int64_t i = ids[t] - a.vocab_offset;
        local[static_cast<std::size_t>(t)] = i >= 0 && i < a.vocab ? static_cast<std::int32_t>(i) : 0;
      }
      embedding(pool(), table, table_type, a.vocab, local.data(), out, a.n_tokens, a.dim);
      for (std::int64_t t = 0; t < a.n_tokens; ++t) {
        const std::int64_t i = ids[t] - a.vocab_offset;
        if (i < 0 || i >= a.vocab) std::fill_n(out + t * a.dim, a.dim, 0.0f);
      }
      return ok_status();
    }
    for (std::int64_t t = 0; t < a.n_tokens; ++t) {
      if (ids[t] < 0 || ids[t] >= a.vocab) {
        return out_of_range_error("embedding: token id {} at position {} is outside the vocabulary of {}", ids[t], t,
                                  a.vocab);
      }
    }
    embedding(pool(), table, table_type, a.vocab, ids, out, a.n_tokens, a.dim);
    return ok_status();
  }
  Status operator()(const hal::RmsNormArgs& a) {
    SX_ASSIGN_OR_RETURN(float* x, resolve_as<float>(dev, a.x, a.n_rows * a.dim, "rmsnorm", "x"));
    const float* add_p = nullptr;
    if (a.add) {
      SX_ASSIGN_OR_RETURN(add_p, resolve_as<const float>(dev, a.add, a.n_rows * a.dim, "rmsnorm", "add"));
    }
    SX_ASSIGN_OR_RETURN(const float* w, resolve_as<const float>(dev, a.weight, a.dim, "rmsnorm", "weight"));
    SX_ASSIGN_OR_RETURN(float* out, resolve_as<float>(dev, a.out, a.n_rows * a.dim, "rmsnorm", "out"));
    rmsnorm(pool(), x, add_p, w, out, a.n_rows, a.dim, a.eps);
    return ok_status();
  }
  Status operator()(const hal::MatmulArgs& a) {
    hal::DType w_type{};
    SX_ASSIGN_OR_RETURN(const void* w, resolve_rows(dev, a.w, a.w_type, a.n, a.k, "matmul", "weight", &w_type));
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.x, a.m * a.k, "matmul", "x"));
    const float* bias = nullptr;
    if (a.bias) {
      SX_ASSIGN_OR_RETURN(bias, resolve_as<const float>(dev, a.bias, a.n, "matmul", "bias"));
    }
    SX_ASSIGN_OR_RETURN(float* y, resolve_as<float>(dev, a.y, a.m * a.n, "matmul", "y"));
    matmul(pool(), scratch, MatmulProblem{w, w_type, x, bias, y, a.m, a.n, a.k});
    return ok_status();
  }
  Status operator()(const hal::RopeArgs& a) {
    if (a.rot_dim <= 0 || a.rot_dim > a.head_dim || a.rot_dim % 2 != 0 || a.rot_dim > kMaxRotDim) {
      return invalid_argument_error("rope: rot_dim {} must be even, positive, at most head_dim {} and {}", a.rot_dim,
                                    a.head_dim, kMaxRotDim);
    }
    SX_ASSIGN_OR_RETURN(float* x, resolve_as<float>(dev, a.x, a.n_tokens * a.n_heads * a.head_dim, "rope", "x"));
    SX_ASSIGN_OR_RETURN(const std::int32_t* pos, resolve_as<const std::int32_t>(dev, a.positions, a.n_tokens, "rope", "positions"));
    rope_neox(pool(), x, pos, a.n_tokens, a.n_heads, a.head_dim, a.rot_dim, a.theta);
    return ok_status();
  }
  Status operator()(const hal::KvWriteArgs& a) {
    if (!cache_format_ok(a.cache_type)) return unimplemented_error("kv_write: {}", kCacheFormats);
    const std::int64_t row = a.n_kv_heads * a.head_dim;
    const std::size_t elem = hal::dtype_info(a.cache_type).block_bytes;
    SX_ASSIGN_OR_RETURN(const float* k, resolve_as<const float>(dev, a.k, a.n_tokens * row, "kv_write", "k"));
    SX_ASSIGN_OR_RETURN(const float* v, resolve_as<const float>(dev, a.v, a.n_tokens * row, "kv_write", "v"));
    SX_ASSIGN_OR_RETURN(std::byte * kc, resolve_view(dev, a.k_cache, elem * static_cast<std::size_t>(a.n_slots * row), "kv_write", "k_cache"));
    SX_ASSIGN_OR_RETURN(std::byte * vc, resolve_view(dev, a.v_cache, elem * static_cast<std::size_t>(a.n_slots * row), "kv_write", "v_cache"));
    SX_ASSIGN_OR_RETURN(const std::int32_t* slots, resolve_as<const std::int32_t>(dev, a.slot_mapping, a.n_tokens, "kv_write", "slot_mapping"));
    for (std::int64_t t = 0; t < a.n_tokens; ++t) {
      if (slots[t] >= a.n_slots) {
        return out_of_range_error("kv_write: slot {} of token {} is outside the cache of {} slots", slots[t], t, a.n_slots);
      }
    }
    kv_write(pool(), k, v, kc, vc, a.cache_type, slots, a.n_tokens, a.n_kv_heads, a.head_dim);
    return ok_status();
  }
  Status operator()(const hal::AttentionArgs& a) {
    if (a.heads_per_kv <= 0 || a.heads_per_kv > kMaxHeadsPerKv || a.block_size <= 0) {
      return invalid_argument_error("attention: heads_per_kv {} must be in [1, {}] and block_size {} positive",
                                    a.heads_per_kv, kMaxHeadsPerKv, a.block_size);
    }
    if (!cache_format_ok(a.cache_type)) return unimplemented_error("attention: {}", kCacheFormats);
    const std::int64_t row = a.n_kv_heads * a.head_dim;
    const std::size_t elem = hal::dtype_info(a.cache_type).block_bytes;
    AttentionPtrs p{};
    SX_ASSIGN_OR_RETURN(p.q, resolve_as<const float>(dev, a.q, a.n_tokens * a.n_heads * a.head_dim, "attention", "q"));
    SX_ASSIGN_OR_RETURN(std::byte * kc, resolve_view(dev, a.k_cache, elem * static_cast<std::size_t>(a.n_slots * row), "attention", "k_cache"));
    SX_ASSIGN_OR_RETURN(std::byte * vc, resolve_view(dev, a.v_cache, elem * static_cast<std::size_t>(a.n_slots * row), "attention", "v_cache"));
    p.k_cache = kc;
    p.v_cache = vc;
    SX_ASSIGN_OR_RETURN(p.out, resolve_as<float>(dev, a.out, a.n_tokens * a.n_heads * a.head_dim, "attention", "out"));
    SX_ASSIGN_OR_RETURN(p.seq_token_start, resolve_as<const std::int32_t>(dev, a.seq_token_start, a.n_seqs + 1, "attention", "seq_token_start"));
    SX_ASSIGN_OR_RETURN(p.seq_context_len, resolve_as<const std::int32_t>(dev, a.seq_context_len, a.n_seqs, "attention", "seq_context_len"));
    SX_ASSIGN_OR_RETURN(p.block_table, resolve_as<const std::int32_t>(dev, a.block_table, a.n_seqs * a.max_blocks_per_seq, "attention", "block_table"));
    // Validate the batch description so that no kernel reads out of bounds.
    if (p.seq_token_start[0] != 0 || p.seq_token_start[a.n_seqs] != a.n_tokens) {
      return invalid_argument_error("attention: seq_token_start must span [0, {}]", a.n_tokens);
    }
    for (std::int64_t s = 0; s < a.n_seqs; ++s) {
      const std::int64_t n_new = p.seq_token_start[s + 1] - p.seq_token_start[s];
      const std::int64_t ctx = p.seq_context_len[s];
      if (n_new < 0 || ctx < n_new || ctx > a.max_blocks_per_seq * a.block_size) {
        return invalid_argument_error("attention: sequence {} has {} new tokens and context {} (capacity {})", s, n_new,
                                      ctx, a.max_blocks_per_seq * a.block_size);
      }
      for (std::int64_t b = 0; b < (ctx + a.block_size - 1) / a.block_size; ++b) {
        const std::int64_t blk = p.block_table[s * a.max_blocks_per_seq + b];
        if (blk < 0 || (blk + 1) * a.block_size > a.n_slots) {
          return out_of_range_error("attention: sequence {} block {} maps to block id {} outside the cache", s, b, blk);
        }
      }
    }
    for (std::int64_t h = 0; h < a.n_heads; ++h) {
      const std::int64_t g = (a.q_head_offset + h) / a.heads_per_kv - a.kv_head_offset;
      if (g < 0 || g >= a.n_kv_heads) {
        return invalid_argument_error("attention: query head {} maps to KV head {} not held here", h, g);
      }
    }
    cpu::paged_attention(pool(), p,
                         AttentionShape{a.cache_type, a.n_seqs, a.n_tokens, a.n_heads, a.n_kv_heads, a.head_dim,
                                        a.block_size, a.max_blocks_per_seq, a.q_head_offset, a.kv_head_offset,
                                        a.heads_per_kv, a.scale});
    return ok_status();
  }
  Status operator()(const hal::SiluMulArgs& a) {
    const std::int64_t gs = a.gate_stride ? a.gate_stride : a.n_cols;
    const std::int64_t us = a.up_stride ? a.up_stride : a.n_cols;
    const std::int64_t os = a.out_stride ? a.out_stride : a.n_cols;
    const std::int64_t last = a.n_rows > 0 ? a.n_rows - 1 : 0;
    SX_ASSIGN_OR_RETURN(const float* g, resolve_as<const float>(dev, a.gate, last * gs + a.n_cols, "silu_mul", "gate"));
    SX_ASSIGN_OR_RETURN(const float* u, resolve_as<const float>(dev, a.up, last * us + a.n_cols, "silu_mul", "up"));
    SX_ASSIGN_OR_RETURN(float* o, resolve_as<float>(dev, a.out, last * os + a.n_cols, "silu_mul", "out"));
    silu_mul(pool(), g, u, o, a.n_rows, a.n_cols, gs, us, os);
    return ok_status();
  }
  Status operator()(const hal::AddArgs& a) {
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.a, a.n, "add", "a"));
    SX_ASSIGN_OR_RETURN(const float* y, resolve_as<const float>(dev, a.b, a.n, "add", "b"));
    SX_ASSIGN_OR_RETURN(float* o, resolve_as<float>(dev, a.out, a.n, "add", "out"));
    add(pool(), x, y, o, a.n);
    return ok_status();
  }
  Status operator()(const hal::MoeRouterArgs& a) {
    if (a.k < 1 || a.k > hal::kMaxTopK || a.k > a.n_experts) {
      return invalid_argument_error("moe_router: k {} must be in [1, {}] and at most the {} experts", a.k,
                                    hal::kMaxTopK, a.n_experts);
    }
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.logits, a.n_tokens * a.n_experts, "moe_router", "logits"));
    SX_ASSIGN_OR_RETURN(std::int32_t* ids, resolve_as<std::int32_t>(dev, a.ids, a.n_tokens * a.k, "moe_router", "ids"));
    SX_ASSIGN_OR_RETURN(float* w, resolve_as<float>(dev, a.weights, a.n_tokens * a.k, "moe_router", "weights"));
    moe_router(pool(), x, ids, w, a.n_tokens, a.n_experts, a.k, a.normalize);
    return ok_status();
  }
  Status operator()(const hal::MoeFfnArgs& a) {
    SX_RETURN_IF_ERROR(hal::check_moe_ffn(a));
    MoeFfnPtrs p{};
    SX_ASSIGN_OR_RETURN(p.x, resolve_as<const float>(dev, a.x, a.n_tokens * a.dim, "moe_ffn", "x"));
    SX_ASSIGN_OR_RETURN(p.ids, resolve_as<const std::int32_t>(dev, a.ids, a.n_tokens * a.k, "moe_ffn", "ids"));
    SX_ASSIGN_OR_RETURN(p.weights, resolve_as<const float>(dev, a.weights, a.n_tokens * a.k, "moe_ffn", "weights"));
    SX_ASSIGN_OR_RETURN(p.out, resolve_as<float>(dev, a.out, a.n_tokens * a.dim, "moe_ffn", "out"));
    if (a.n_local > 0) {
      SX_ASSIGN_OR_RETURN(p.gate, resolve_rows(dev, a.gate, a.gate_type, a.n_local * a.ffn, a.dim, "moe_ffn",
                                               "gate experts", &p.gate_type));
      SX_ASSIGN_OR_RETURN(p.up, resolve_rows(dev, a.up, a.up_type, a.n_local * a.ffn, a.dim, "moe_ffn", "up experts",
                                             &p.up_type));
      SX_ASSIGN_OR_RETURN(p.down, resolve_rows(dev, a.down, a.down_type, a.n_local * a.dim, a.ffn, "moe_ffn",
                                               "down experts", &p.down_type));
    }
    return moe_ffn(pool(), scratch, p, a);
  }
  // The batch arrays of a state op, checked (hal::check_state_batch).
  Result<StateBatch> state_batch(std::string_view op, const hal::BufView& start, const hal::BufView& ctx,
                                 const hal::BufView& slot, std::int64_t n_seqs, std::int64_t n_tokens,
                                 std::int64_t n_slots) {
    StateBatch b{nullptr, nullptr, nullptr, n_seqs};
    SX_ASSIGN_OR_RETURN(b.seq_token_start, resolve_as<const std::int32_t>(dev, start, n_seqs + 1, op, "seq_token_start"));
    SX_ASSIGN_OR_RETURN(b.seq_context_len, resolve_as<const std::int32_t>(dev, ctx, n_seqs, op, "seq_context_len"));
    SX_ASSIGN_OR_RETURN(b.seq_slot, resolve_as<const std::int32_t>(dev, slot, n_seqs, op, "seq_slot"));
    SX_RETURN_IF_ERROR(hal::check_state_batch(op, b.seq_token_start, b.seq_context_len, b.seq_slot, n_seqs, n_tokens,
                                              n_slots));
    return b;
  }
  Status operator()(const hal::ConvStateArgs& a) {
    SX_RETURN_IF_ERROR(hal::check_conv_state(a));
    const std::int64_t xs = a.x_stride ? a.x_stride : a.channels;
    const std::int64_t last = a.n_tokens > 0 ? a.n_tokens - 1 : 0;
    SX_ASSIGN_OR_RETURN(const StateBatch b, state_batch("conv_state", a.seq_token_start, a.seq_context_len, a.seq_slot,
                                                        a.n_seqs, a.n_tokens, a.n_slots));
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.x, last * xs + a.channels, "conv_state", "x"));
    SX_ASSIGN_OR_RETURN(const float* w, resolve_as<const float>(dev, a.weight, a.channels * a.kernel, "conv_state",
                                                                "weight"));
    SX_ASSIGN_OR_RETURN(float* st, resolve_as<float>(dev, a.state, a.n_slots * (a.kernel - 1) * a.channels,
                                                     "conv_state", "state"));
    SX_ASSIGN_OR_RETURN(float* o, resolve_as<float>(dev, a.out, a.n_tokens * a.channels, "conv_state", "out"));
    conv_state(pool(), x, xs, w, st, o, b, a.channels, a.kernel);
    return ok_status();
  }
  Status operator()(const hal::DeltaRuleArgs& a) {
    SX_RETURN_IF_ERROR(hal::check_delta_rule(a));
    DeltaRulePtrs p{};
    p.qkv_stride = a.qkv_stride ? a.qkv_stride : 2 * a.n_k_heads * a.d_k + a.n_v_heads * a.d_v;
    p.gate_stride = a.gate_stride ? a.gate_stride : a.n_v_heads;
    const std::int64_t last = a.n_tokens > 0 ? a.n_tokens - 1 : 0;
    SX_ASSIGN_OR_RETURN(p.batch, state_batch("delta_rule", a.seq_token_start, a.seq_context_len, a.seq_slot, a.n_seqs,
                                             a.n_tokens, a.n_slots));
    const std::int64_t qk_row = last * p.qkv_stride + a.n_k_heads * a.d_k;
    SX_ASSIGN_OR_RETURN(p.q, resolve_as<const float>(dev, a.q, qk_row, "delta_rule", "q"));
    SX_ASSIGN_OR_RETURN(p.k, resolve_as<const float>(dev, a.k, qk_row, "delta_rule", "k"));
    SX_ASSIGN_OR_RETURN(p.v, resolve_as<const float>(dev, a.v, last * p.qkv_stride + a.n_v_heads * a.d_v, "delta_rule",
                                                     "v"));
    const std::int64_t gate_row = last * p.gate_stride + a.n_v_heads;
    SX_ASSIGN_OR_RETURN(p.alpha, resolve_as<const float>(dev, a.alpha, gate_row, "delta_rule", "alpha"));
    SX_ASSIGN_OR_RETURN(p.beta, resolve_as<const float>(dev, a.beta, gate_row, "delta_rule", "beta"));
    SX_ASSIGN_OR_RETURN(p.a, resolve_as<const float>(dev, a.a, a.n_v_heads, "delta_rule", "a"));
    SX_ASSIGN_OR_RETURN(p.dt_bias, resolve_as<const float>(dev, a.dt_bias, a.n_v_heads, "delta_rule", "dt_bias"));
    SX_ASSIGN_OR_RETURN(p.state, resolve_as<float>(dev, a.state, a.n_slots * a.n_v_heads * a.d_k * a.d_v,
                                                   "delta_rule", "state"));
    SX_ASSIGN_OR_RETURN(p.out, resolve_as<float>(dev, a.out, a.n_tokens * a.n_v_heads * a.d_v, "delta_rule", "out"));
    delta_rule(pool(), p, a);
    return ok_status();
  }
  Status operator()(const hal::GatedNormArgs& a) {
    if (a.n_rows < 0 || a.dim <= 0) {
      return invalid_argument_error("gated_norm: {} rows of {}", a.n_rows, a.dim);
    }
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.x, a.n_rows * a.dim, "gated_norm", "x"));
    SX_ASSIGN_OR_RETURN(const float* z, resolve_as<const float>(dev, a.z, a.n_rows * a.dim, "gated_norm", "z"));
    SX_ASSIGN_OR_RETURN(const float* w, resolve_as<const float>(dev, a.weight, a.dim, "gated_norm", "weight"));
    SX_ASSIGN_OR_RETURN(float* o, resolve_as<float>(dev, a.out, a.n_rows * a.dim, "gated_norm", "out"));
    gated_norm(pool(), x, z, w, o, a.n_rows, a.dim, a.eps);
    return ok_status();
  }
  Status operator()(const hal::SigmoidMulArgs& a) {
    const std::int64_t xs = a.x_stride ? a.x_stride : a.n_cols;
    const std::int64_t gate_cols = a.gate_per_row ? 1 : a.n_cols;
    const std::int64_t gs = a.gate_stride ? a.gate_stride : gate_cols;
    const std::int64_t os = a.out_stride ? a.out_stride : a.n_cols;
    if (a.n_rows < 0 || a.n_cols <= 0 || xs < a.n_cols || gs < gate_cols || os < a.n_cols) {
      return invalid_argument_error("sigmoid_mul: {} rows of {} with strides {}, {}, {}", a.n_rows, a.n_cols, xs, gs, os);
    }
    const std::int64_t last = a.n_rows > 0 ? a.n_rows - 1 : 0;
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.x, last * xs + a.n_cols, "sigmoid_mul", "x"));
    SX_ASSIGN_OR_RETURN(const float* g, resolve_as<const float>(dev, a.gate, last * gs + gate_cols, "sigmoid_mul",
                                                                "gate"));
    SX_ASSIGN_OR_RETURN(float* o, resolve_as<float>(dev, a.out, last * os + a.n_cols, "sigmoid_mul", "out"));
    sigmoid_mul(pool(), x, g, o, a.n_rows, a.n_cols, xs, gs, os, a.gate_per_row);
    return ok_status();
  }
  Status operator()(const hal::TopKArgs& a) {
    if (a.k < 1 || a.k > hal::kMaxTopK || a.k > a.n_cols) {
      return invalid_argument_error("top_k: k {} must be in [1, {}] and at most the row length {}", a.k,
                                    hal::kMaxTopK, a.n_cols);
    }
    SX_ASSIGN_OR_RETURN(const float* x, resolve_as<const float>(dev, a.x, a.n_rows * a.n_cols, "top_k", "x"));
    SX_ASSIGN_OR_RETURN(float* v, resolve_as<float>(dev, a.values, a.n_rows * a.k, "top_k", "values"));
    SX_ASSIGN_OR_RETURN(std::int32_t* ids, resolve_as<std::int32_t>(dev, a.ids, a.n_rows * a.k, "top_k", "ids"));
    top_k_rows(pool(), x, v, ids, a.n_rows, a.n_cols, a.k, a.id_offset);
    return ok_status();
  }
};

}  // namespace

Status CpuStream::run(const hal::Op& op) {
  if (!latched_.ok()) return latched_;
  return enqueue([this, op]() -> Status {
    SX_RETURN_IF_ERROR(device_.count_op(hal::op_name(op)));
    SX_RETURN_IF_ERROR(std::visit(Dispatch{device_, scratch_}, op));
    if (const auto* mm = std::get_if<hal::MatmulArgs>(&op); mm != nullptr && device_.corrupt()) {
      SX_ASSIGN_OR_RETURN(float* y, resolve_as<float>(device_, mm->y, mm->m * mm->n, "matmul", "y"));
      for (std::int64_t i = 0; i < mm->m * mm->n; ++i) y[i] = 1.0f - 2.0f * y[i];  // fault injection: corrupt_device
    }
    return ok_status();
  });
}

namespace {

// The kernels' ISA level (kernels/isa.h): an invalid SEXTANT_CPU_ISA fails the device's creation;
// the choice is logged once per process.
Status check_isa() {
  const Result<IsaChoice>& c = cpu_isa();
  if (!c.ok()) return c.status();
  static std::once_flag logged;
  std::call_once(logged, [] { log_info("{}", cpu_isa_line()); });
  return ok_status();
}

class CpuBackend final : public hal::Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  // The ISA level of the kernels (isa.h), for bench and doctor: a SEXTANT_CPU_ISA this machine or
  // build cannot honour is a failure, as create_device's.
  std::optional<hal::KernelReport> kernel_report() const override {
    const Result<IsaChoice>& isa = cpu_isa();
    hal::KernelReport k;
    k.line = cpu_isa_line();
    if (!isa.ok()) {
      k.status = isa.status();
      k.evidence = isa.status().message();
      k.fix = "unset SEXTANT_CPU_ISA or name a level this machine has";
      return k;
    }
    std::string levels;
    for (const std::string& l : isa->available) levels += (levels.empty() ? "" : ", ") + l;
    k.evidence = fmt::format("{}; levels this machine can run: {}", k.line.substr(name().size() + 2), levels);
    return k;
  }
  // Logical devices share the host's cores and memory: each is one rank of a TP/PP group.
  Result<std::vector<hal::DeviceInfo>> devices() const override {
    std::vector<hal::DeviceInfo> out;
    hal::DeviceInfo memory;
    describe_memory(memory, 0);
    for (int i = 0; i < kCpuLogicalDevices; ++i) {
      hal::DeviceInfo info = memory;
      info.backend = "cpu";
      info.index = i;
      const Result<IsaChoice>& isa = cpu_isa();
      info.name = fmt::format("cpu:{} (logical; {} hardware threads shared; {} kernels)", i, hardware_threads(),
                              isa.ok() ? isa->level : "no");
      out.push_back(std::move(info));
    }
    return out;
  }
  Result<std::unique_ptr<hal::Device>> create_device(int index, const hal::DeviceOptions& options) override {
    if (index < 0 || index >= kCpuLogicalDevices) {
      return invalid_argument_error("cpu: device index {} is outside cpu:0 .. cpu:{}", index, kCpuLogicalDevices - 1);
    }
    SX_ASSIGN_OR_RETURN(const CpuOptions o, parse_cpu_options(options));
    SX_RETURN_IF_ERROR(check_isa());
    return std::unique_ptr<hal::Device>(std::make_unique<CpuDevice>(index, o));
  }
  // The group's ranks share the host's cores: `threads` (0: all of them) is split evenly.
  Result<std::vector<std::unique_ptr<hal::Device>>> create_devices_at(std::span<const int> indices,
                                                                      const hal::DeviceOptions& options) override {
    SX_ASSIGN_OR_RETURN(CpuOptions o, parse_cpu_options(options));
    SX_RETURN_IF_ERROR(check_isa());
    const auto count = static_cast<int>(indices.size());
    if (count < 1 || count > kCpuLogicalDevices) {
      return invalid_argument_error("cpu: a group of {} devices is outside 1 .. {}", count, kCpuLogicalDevices);
    }
    for (int index : indices) {
      if (index < 0 || index >= kCpuLogicalDevices) {
        return invalid_argument_error("cpu: device index {} is outside cpu:0 .. cpu:{}", index, kCpuLogicalDevices - 1);
      }
    }
    const int total = o.threads > 0 ? o.threads : hardware_threads();
    o.threads = std::max(1, total / count);
    std::vector<std::unique_ptr<hal::Device>> out;
    for (int index : indices) out.push_back(std::make_unique<CpuDevice>(index, o));
    return out;
  }
  int host_threads() const override { return hardware_threads(); }
  Result<std::vector<std::unique_ptr<hal::Channel>>> create_channels(std::span<hal::Device* const> devices,
                                                                     const hal::ChannelOptions& options) override {
    return create_cpu_channels(devices, options);
  }
};

}  // namespace

std::unique_ptr<hal::Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace sx::cpu
