// Capabilities are checked at load (issue 17, item 2): a test-only backend over the CPU's devices
// ("picky") records what the engine asks of its devices and refuses the ops a predicate picks, as
// a backend lacking a kernel would.
// * A refused op fails the load with rank, device, op, format and shape, before that rank uploads
//   or allocates anything.
// * Every op a step runs (prefill and decode, TP 1 and 2, PP 2) was asked at load, with the same
//   kind, formats and fixed dimensions and no larger a batch (Shard::step_ops stays complete),
//   and no supports() call happens once the model is loaded; nor does an allocation.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "backends/registry.h"
#include "runtime/engine/model.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"

namespace sx::engine {
namespace {

using Refuse = std::function<bool(int device_index, const hal::Op&)>;

struct Record {
  std::vector<hal::Op> asked;  // supports()
  std::vector<hal::Op> ran;    // Stream::run()
  int uploads = 0, allocs = 0;
};

class PickyStream final : public hal::Stream {
 public:
  PickyStream(std::unique_ptr<hal::Stream> inner, Record& rec) : inner_(std::move(inner)), rec_(rec) {}
  hal::Stream& inner() { return *inner_; }
  Status upload(hal::Buffer& dst, std::size_t off, std::span<const std::byte> src) override {
    return inner_->upload(dst, off, src);
  }
  Status download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t off) override {
    return inner_->download(dst, src, off);
  }
  Status update(hal::Buffer& dst, std::size_t off, std::span<const std::byte> src) override {
    return inner_->update(dst, off, src);
  }
  Status copy(hal::Buffer& dst, std::size_t dst_off, const hal::Buffer& src, std::size_t src_off,
              std::size_t bytes) override {
    return inner_->copy(dst, dst_off, src, src_off, bytes);
  }
  Status fill(hal::Buffer& dst, std::size_t off, std::size_t bytes, std::uint8_t value) override {
    return inner_->fill(dst, off, bytes, value);
  }
  Status run(const hal::Op& op) override {
    rec_.ran.push_back(op);
    return inner_->run(op);
  }
  Status host_call(std::function<Status()> fn) override { return inner_->host_call(std::move(fn)); }
  Status record(hal::Event& e) override { return inner_->record(e); }
  Status wait(const hal::Event& e) override { return inner_->wait(e); }
  Status sync() override { return inner_->sync(); }

 private:
  std::unique_ptr<hal::Stream> inner_;
  Record& rec_;
};

hal::Stream& unwrap(hal::Stream& s) { return static_cast<PickyStream&>(s).inner(); }

class PickyDevice final : public hal::Device {
 public:
  PickyDevice(std::unique_ptr<hal::Device> inner, int index, Refuse refuse)
      : inner_(std::move(inner)), index_(index), refuse_(std::move(refuse)) {
    info_ = inner_->info();
    info_.backend = "picky";
    info_.name = "picky:" + std::to_string(index);
  }
  hal::Device& inner() { return *inner_; }
  Record& record() { return rec_; }

  const hal::DeviceInfo& info() const override { return info_; }
  hal::MemoryInfo memory() const override { return inner_->memory(); }
  Status supports(const hal::Op& op) const override {
    rec_.asked.push_back(op);
    if (refuse_ && refuse_(index_, op)) return Status(StatusCode::kUnimplemented, "");
    return inner_->supports(op);
  }
  std::size_t weight_bytes(const hal::WeightDesc& w) const override { return inner_->weight_bytes(w); }
  Result<std::unique_ptr<hal::Buffer>> upload_weight(hal::Stream& s, const hal::WeightDesc& w,
                                                     std::span<const std::byte> bytes) override {
    ++rec_.uploads;
    return inner_->upload_weight(unwrap(s), w, bytes);
  }
  Result<std::unique_ptr<hal::Buffer>> alloc(std::size_t bytes,
                                             hal::BufferUsage usage = hal::BufferUsage::kDevice) override {
    ++rec_.allocs;
    return inner_->alloc(bytes, usage);
  }
  Result<std::unique_ptr<hal::Stream>> create_stream() override {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Stream> s, inner_->create_stream());
    return std::unique_ptr<hal::Stream>(std::make_unique<PickyStream>(std::move(s), rec_));
  }
  Result<std::unique_ptr<hal::Event>> create_event() override { return inner_->create_event(); }

 private:
  std::unique_ptr<hal::Device> inner_;
  int index_;
  Refuse refuse_;
  hal::DeviceInfo info_;
  mutable Record rec_;
};

class PickyChannel final : public hal::Channel {
 public:
  explicit PickyChannel(std::unique_ptr<hal::Channel> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status all_reduce(hal::Stream& s, hal::BufView data, std::int64_t count, hal::DType dtype) override {
    return inner_->all_reduce(unwrap(s), data, count, dtype);
  }
  Status all_gather(hal::Stream& s, hal::BufView send, hal::BufView recv, std::size_t bytes) override {
    return inner_->all_gather(unwrap(s), send, recv, bytes);
  }
  Status broadcast(hal::Stream& s, hal::BufView data, std::size_t bytes, int root) override {
    return inner_->broadcast(unwrap(s), data, bytes, root);
  }
  Status send(hal::Stream& s, hal::BufView data, std::size_t bytes, int peer) override {
    return inner_->send(unwrap(s), data, bytes, peer);
  }
  Status recv(hal::Stream& s, hal::BufView data, std::size_t bytes, int peer) override {
    return inner_->recv(unwrap(s), data, bytes, peer);
  }
  Status barrier(hal::Stream& s) override { return inner_->barrier(unwrap(s)); }
  void abort(const Status& why) override { inner_->abort(why); }

 private:
  std::unique_ptr<hal::Channel> inner_;
};

class PickyBackend final : public hal::Backend {
 public:
  explicit PickyBackend(Refuse refuse) : cpu_(**backends::default_registry().find("cpu")), refuse_(std::move(refuse)) {}
  std::string_view name() const override { return "picky"; }
  Result<std::vector<hal::DeviceInfo>> devices() const override { return cpu_.devices(); }
  Result<std::unique_ptr<hal::Device>> create_device(int index, const hal::DeviceOptions& options) override {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Device> d, cpu_.create_device(index, options));
    return std::unique_ptr<hal::Device>(std::make_unique<PickyDevice>(std::move(d), index, refuse_));
  }
  Result<std::vector<std::unique_ptr<hal::Channel>>> create_channels(std::span<hal::Device* const> devices,
                                                                     const hal::ChannelOptions& options) override {
    std::vector<hal::Device*> inner;
    for (hal::Device* d : devices) inner.push_back(&static_cast<PickyDevice*>(d)->inner());
    SX_ASSIGN_OR_RETURN(auto channels, cpu_.create_channels(inner, options));
    std::vector<std::unique_ptr<hal::Channel>> out;
    for (auto& c : channels) out.push_back(std::make_unique<PickyChannel>(std::move(c)));
    return out;
  }

 private:
  hal::Backend& cpu_;
  Refuse refuse_;
};

// A small Qwen2 with every matrix in Q8_0: 4 query heads on 2 KV heads of 32, hidden 128, FFN 256.
class Capability : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model::RandomModelSpec spec;
    model::ModelConfig& c = spec.config;
    c.name = "capability-test";
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 32;
    c.hidden = 128;
    c.ffn = 256;
    c.vocab = 320;
    c.context_length = 128;
    c.rope_theta = 1e6;
    c.rms_eps = 1e-6;
    c.tied_embeddings = false;
    c.qkv_bias = true;
    spec.weight_type = hal::DType::kQ8_0;
    spec.seed = 3;
    path_ = (std::filesystem::temp_directory_path() / ("sx_capability_" + std::to_string(::getpid()) + ".gguf"))
                .string();
    const Status written = model::write_random_gguf(spec, path_);
    ASSERT_TRUE(written.ok()) << written.to_string();
  }
  static void TearDownTestSuite() { std::filesystem::remove(path_); }

  struct Loaded {
    std::vector<std::unique_ptr<hal::Device>> devices;
    Result<std::unique_ptr<Model>> model = internal_error("not loaded");
  };

  // The model on tp x pp devices of `backend`; its file must outlive the result (kept in file_).
  Loaded load(PickyBackend& backend, int tp, int pp, const std::string& path = path_) {
    Loaded out;
    auto file = model::GgufFile::open(path);
    EXPECT_TRUE(file.ok()) << file.status().to_string();
    if (!file.ok()) return out;
    file_ = std::move(*file);
    auto config = model::model_config_from_gguf(*file_);
    EXPECT_TRUE(config.ok()) << config.status().to_string();
    if (!config.ok()) return out;
    std::vector<hal::Device*> raw;
    hal::DeviceOptions opts;
    opts.set("threads", 1);
    for (int i = 0; i < tp * pp; ++i) {
      auto d = backend.create_device(i, opts);
      EXPECT_TRUE(d.ok()) << d.status().to_string();
      if (!d.ok()) return out;
      raw.push_back(d->get());
      out.devices.push_back(std::move(*d));
    }
    ModelOptions mo;
    mo.kv.num_blocks = 8;
    mo.max_batch_tokens = 16;
    mo.max_logit_rows = 2;
    ParallelOptions po;
    po.tp = tp;
    po.pp = pp;
    out.model = Model::load(*file_, *config, backend, raw, po, mo);
    return out;
  }

  void expect_every_op_asked_at_load(const std::string& path);

  static std::string path_;
  std::unique_ptr<model::GgufFile> file_;
};
std::string Capability::path_;

PickyDevice& picky(const std::unique_ptr<hal::Device>& d) { return static_cast<PickyDevice&>(*d); }

TEST_F(Capability, ARefusedOpFailsTheLoadNamingRankDeviceOpFormatAndShape) {
  // Rank 1's device has no Q8_0 matmul: rank 1 holds query heads 2..3 (64 rows of q) of 128 columns.
  PickyBackend backend([](int device, const hal::Op& op) {
    const auto* m = std::get_if<hal::MatmulArgs>(&op);
    return device == 1 && m != nullptr && m->w_type == hal::DType::kQ8_0;
  });
  Loaded l = load(backend, 2, 1);
  ASSERT_FALSE(l.model.ok());
  EXPECT_EQ(l.model.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(l.model.status().message(),
            "rank 1 (picky:1): matmul with q8_0 weights [64 x 128] is not supported by this backend");
  // Refused before anything was put on that device.
  EXPECT_EQ(picky(l.devices[1]).record().uploads, 0);
  EXPECT_EQ(picky(l.devices[1]).record().allocs, 0);
  EXPECT_GT(picky(l.devices[0]).record().uploads, 0);

  // A reason the backend gives follows the op; other ops are named by what they depend on.
  PickyBackend no_f16_attention([](int, const hal::Op& op) { return std::holds_alternative<hal::AttentionArgs>(op); });
  Loaded a = load(no_f16_attention, 1, 1);
  ASSERT_FALSE(a.model.ok());
  EXPECT_EQ(a.model.status().message(),
            "rank 0 (picky:0): attention with head size 32, 2 query heads per KV head, KV cache in f32 is not "
            "supported by this backend");
}

// Same kind, same formats and fixed dimensions, a batch no larger than the one asked about.
bool covers(const hal::Op& asked, const hal::Op& ran) {
  if (asked.index() != ran.index()) return false;
  return std::visit(
      [&](const auto& r) -> bool {
        using T = std::decay_t<decltype(r)>;
        const T& a = std::get<T>(asked);
        if constexpr (std::is_same_v<T, hal::MatmulArgs>) {
          return a.w_type == r.w_type && a.n == r.n && a.k == r.k && r.m <= a.m;
        } else if constexpr (std::is_same_v<T, hal::EmbeddingArgs>) {
          return a.table_type == r.table_type && a.dim == r.dim && a.vocab == r.vocab && a.shard == r.shard &&
                 a.vocab_offset == r.vocab_offset && r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::RmsNormArgs>) {
          return a.dim == r.dim && a.eps == r.eps && r.n_rows <= a.n_rows;
        } else if constexpr (std::is_same_v<T, hal::RopeArgs>) {
          return a.n_heads == r.n_heads && a.head_dim == r.head_dim && a.rot_dim == r.rot_dim && a.theta == r.theta &&
                 r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::KvWriteArgs>) {
          return a.cache_type == r.cache_type && a.n_kv_heads == r.n_kv_heads && a.head_dim == r.head_dim &&
                 a.n_slots == r.n_slots && r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::AttentionArgs>) {
          return a.cache_type == r.cache_type && a.n_heads == r.n_heads && a.n_kv_heads == r.n_kv_heads &&
                 a.head_dim == r.head_dim && a.block_size == r.block_size && a.n_slots == r.n_slots &&
                 a.q_head_offset == r.q_head_offset && a.kv_head_offset == r.kv_head_offset &&
                 a.heads_per_kv == r.heads_per_kv && a.scale == r.scale && r.n_tokens <= a.n_tokens &&
                 r.n_seqs <= a.n_seqs && r.max_blocks_per_seq <= a.max_blocks_per_seq;
        } else if constexpr (std::is_same_v<T, hal::SiluMulArgs>) {
          return a.n_cols == r.n_cols && r.n_rows <= a.n_rows;
        } else if constexpr (std::is_same_v<T, hal::AddArgs>) {
          return r.n <= a.n;
        } else if constexpr (std::is_same_v<T, hal::MoeRouterArgs>) {
          return a.n_experts == r.n_experts && a.k == r.k && a.normalize == r.normalize && r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::MoeFfnArgs>) {
          return a.gate_type == r.gate_type && a.up_type == r.up_type && a.down_type == r.down_type && a.dim == r.dim &&
                 a.ffn == r.ffn && a.k == r.k && a.expert_begin == r.expert_begin && a.n_local == r.n_local &&
                 r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::ConvStateArgs>) {
          return a.channels == r.channels && a.kernel == r.kernel && a.n_slots == r.n_slots && r.n_seqs <= a.n_seqs &&
                 r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::DeltaRuleArgs>) {
          return a.n_k_heads == r.n_k_heads && a.n_v_heads == r.n_v_heads && a.d_k == r.d_k && a.d_v == r.d_v &&
                 a.chunk == r.chunk && a.tiled == r.tiled && a.n_slots == r.n_slots && r.n_seqs <= a.n_seqs &&
                 r.n_tokens <= a.n_tokens;
        } else if constexpr (std::is_same_v<T, hal::GatedNormArgs>) {
          return a.dim == r.dim && a.eps == r.eps && r.n_rows <= a.n_rows;
        } else if constexpr (std::is_same_v<T, hal::SigmoidMulArgs>) {
          return a.n_cols == r.n_cols && a.gate_per_row == r.gate_per_row && r.n_rows <= a.n_rows;
        } else {
          static_assert(std::is_same_v<T, hal::TopKArgs>);
          return a.n_cols == r.n_cols && a.id_offset == r.id_offset && r.n_rows <= a.n_rows && r.k <= a.k;
        }
      },
      ran);
}

// Loads `path` at TP 1, TP 2 and PP 2 on picky devices, runs a prefill and decode steps, and checks
// that every op a step ran was put to supports() at load, and nothing after.
void Capability::expect_every_op_asked_at_load(const std::string& path) {
  struct Layout {
    int tp, pp;
  };
  for (const Layout lay : {Layout{1, 1}, Layout{2, 1}, Layout{1, 2}}) {
    SCOPED_TRACE(::testing::Message() << path << " tp " << lay.tp << " pp " << lay.pp);
    PickyBackend backend(nullptr);
    Loaded l = load(backend, lay.tp, lay.pp, path);
    ASSERT_TRUE(l.model.ok()) << l.model.status().to_string();
    Model& m = **l.model;
    std::vector<std::size_t> asked_at_load;
    std::vector<int> allocs_at_load;
    for (const auto& d : l.devices) {
      EXPECT_FALSE(picky(d).record().asked.empty());
      asked_at_load.push_back(picky(d).record().asked.size());
      allocs_at_load.push_back(picky(d).record().allocs);
      picky(d).record().ran.clear();  // load's own ops (none today) are not a step's
    }
    // A prefill of 9 tokens, then decode steps reading back logits, the greedy choice and the
    // top 3 candidates.
    std::vector<std::int32_t> prompt = {5, 17, 3, 200, 41, 9, 77, 1, 250};
    std::vector<float> logits, values;
    std::vector<std::int32_t> ids;
    ASSERT_TRUE(m.forward(single_sequence_batch(prompt, 0, m.options().kv.num_blocks), logits).ok());
    for (int step = 0; step < 3; ++step) {
      const std::int32_t one[1] = {static_cast<std::int32_t>(10 + step)};
      const ForwardBatch b =
          single_sequence_batch(one, static_cast<std::int32_t>(prompt.size()) + step, m.options().kv.num_blocks);
      ASSERT_TRUE((step == 0 ? m.forward(b, logits) : m.forward_top_k(b, step == 1 ? 1 : 3, values, ids)).ok());
    }
    for (std::size_t i = 0; i < l.devices.size(); ++i) {
      const Record& rec = picky(l.devices[i]).record();
      EXPECT_EQ(rec.asked.size(), asked_at_load[i]) << "device " << i << " was asked after the load";
      EXPECT_EQ(rec.allocs, allocs_at_load[i]) << "device " << i << " allocated during a step";
      EXPECT_FALSE(rec.ran.empty());
      for (const hal::Op& op : rec.ran) {
        bool found = false;
        for (const hal::Op& a : rec.asked) found = found || covers(a, op);
        EXPECT_TRUE(found) << "device " << i << " ran " << hal::describe_op(op) << " (m/rows/tokens up to the "
                           << "batch), which load() never put to supports()";
      }
    }
  }
}

TEST_F(Capability, EveryOpAStepRunsWasAskedAtLoadAndNothingIsAskedAfter) { expect_every_op_asked_at_load(path_); }

// The same for a hybrid MoE (Qwen3.5: DeltaNet and gated attention layers, routed and shared experts).
TEST_F(Capability, EveryOpOfAHybridStepWasAskedAtLoad) {
  model::RandomModelSpec spec;
  spec.config = *model::find_qwen35moe_config("35b-a3b");
  model::ModelConfig& c = spec.config;
  model::set_hybrid_layers(c, 4);
  c.hidden = 128, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 32, c.rot_dim = 8, c.rope_sections = {1, 1, 2, 0};
  c.ssm_k_heads = 2, c.ssm_v_heads = 4, c.ssm_head_dim = 32, c.vocab = 320, c.context_length = 128;
  c.n_experts = 4, c.n_experts_used = 2, c.expert_ffn = 32, c.shared_expert_ffn = 32, c.ffn = 32;
  spec.weight_type = hal::DType::kQ8_0;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("sx_capability_hybrid_" + std::to_string(::getpid()) + ".gguf")).string();
  ASSERT_TRUE(model::write_random_gguf(spec, path).ok());
  expect_every_op_asked_at_load(path);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sx::engine
