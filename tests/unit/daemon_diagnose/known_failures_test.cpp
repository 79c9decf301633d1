// The catalogue of known failures (daemon/diagnose/known_failures.h): each class of the seed's
// failures, produced by the code that reports it in Sextant (a truncated GGUF, a model missing a
// tensor, the memory planner, the CUDA preflight on an injected machine, the collectives' watch and
// the host channel's deadline, the CPU backend's and SEXTANT_CUDA_DEVICES's device checks, libuv's
// EADDRINUSE, the chat-template check, the smoke test through a corrupt rank), is recognised and answered with its cause and fix. Only
// peer access is a literal: the CUDA runtime's own text, as the module's cuda_status formats it
// (no GPU here). The real starts (port in use, a truncated model, memory too small) are
// tests/e2e's.
#include "daemon/diagnose/known_failures.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <filesystem>
#include <set>
#include <thread>

#include "backends/common/host_group.h"
#include "backends/cuda/collective_watch.h"
#include "backends/cuda/device_order.h"
#include "backends/cuda/preflight.h"
#include "backends/registry.h"
#include "daemon/chat/chatml.h"
#include "daemon/loop/uv_status.h"
#include "runtime/engine/device_group.h"
#include "runtime/engine/memory_planner.h"
#include "runtime/engine/smoke_test.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "runtime/parallel/shard_plan.h"
#include "tests/unit/model/gguf_test_util.h"
#include "tests/unit/tokenizer/tiny_vocab.h"

namespace sx::daemon::diagnose {
namespace {

using namespace std::chrono_literals;

// `error` is a known failure `id` whose one line names the cause and the fix.
void expect_known(const Status& error, std::string_view id) {
  ASSERT_FALSE(error.ok());
  const auto f = diagnose(error);
  ASSERT_TRUE(f.has_value()) << "not recognised: " << error.to_string();
  EXPECT_EQ(f->id, id) << error.to_string();
  const std::string line = cause_and_fix(error);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.rfind("cause: ", 0), 0u) << line;
  EXPECT_NE(line.find("; fix: "), std::string::npos) << line;
  std::printf("%-18s %s\n  -> %s\n", std::string(id).c_str(), error.to_string().c_str(), line.c_str());
}

struct ModelFile {
  std::string path;
  model::ModelConfig config;
  explicit ModelFile(const char* stem) {
    path = (std::filesystem::temp_directory_path() / fmt::format("{}_{}.gguf", stem, ::getpid())).string();
    model::RandomModelSpec spec;
    spec.config = model::testing::tiny_qwen2_config(300, true);
    const Status written = model::write_random_gguf(spec, path);
    EXPECT_TRUE(written.ok()) << written.to_string();
    config = spec.config;
  }
  ~ModelFile() { std::filesystem::remove(path); }
};

TEST(KnownFailures, ATruncatedModelFile) {
  ModelFile m("sx_diag_trunc");
  ASSERT_TRUE(std::filesystem::exists(m.path));
  std::filesystem::resize_file(m.path, std::filesystem::file_size(m.path) * 2 / 3);
  auto f = model::GgufFile::open(m.path);
  ASSERT_FALSE(f.ok());
  expect_known(f.status(), "truncated-file");
}

TEST(KnownFailures, AMissingTensor) {
  ModelFile m("sx_diag_missing");
  auto f = model::GgufFile::open(m.path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  model::ModelConfig more = m.config;
  more.n_layers += 1;  // the file has no blk.2.*
  expect_known(model::check_qwen2_tensors(**f, more), "missing-tensor");
}

TEST(KnownFailures, MemoryThatHoldsNeitherWeightsNorTheKvCache) {
  const model::ModelConfig c = model::qwen2_5_config("7b");
  const parallel::WeightTypes types = parallel::uniform_weight_types(c, hal::DType::kBF16);
  auto shards = parallel::plan_shards(c, types, {});
  ASSERT_TRUE(shards.ok());
  engine::MemoryPlanOptions o;
  o.max_model_len = 32768;
  const std::vector<engine::DeviceBudget> small = {{"gpu0", std::uint64_t{8} << 30, 0}};
  auto tiny = engine::plan_memory(c, types, *shards, small, o);
  ASSERT_TRUE(tiny.ok());
  expect_known(engine::memory_plan_status(*tiny), "weights-oom");
  o.max_num_seqs = 1;
  o.max_model_len = 131072;
  const std::vector<engine::DeviceBudget> medium = {{"gpu0", std::uint64_t{20} << 30, 0}};
  auto short_kv = engine::plan_memory(c, types, *shards, medium, o);
  ASSERT_TRUE(short_kv.ok());
  expect_known(engine::memory_plan_status(*short_kv), "kv-oom");
}

cuda::PreflightInput h200() {
  cuda::PreflightInput in;
  in.driver_version = 13000;
  in.runtime_version = 13000;
  in.archs = *cuda::parse_arch_list("90");
  cuda::GpuIdentity g;
  g.cuda_ordinal = 0;
  g.name = "NVIDIA H200";
  g.pci_bus_id = "0000:1b:00.0";
  g.cc_major = 9;
  g.total_bytes = g.free_bytes = std::uint64_t{140} << 30;
  in.devices = {g};
  return in;
}

TEST(KnownFailures, TheCudaPreflightsRefusals) {
  cuda::PreflightInput arch = h200();
  arch.devices[0].name = "NVIDIA GeForce RTX 3090";
  arch.devices[0].cc_major = 8;
  arch.devices[0].cc_minor = 6;
  expect_known(cuda::preflight_status(cuda::run_preflight(arch)), "no-kernel-image");
  cuda::PreflightInput old = h200();
  old.driver_version = 12020;
  expect_known(cuda::preflight_status(cuda::run_preflight(old)), "driver-too-old");
  cuda::PreflightInput none = h200();
  none.driver_error = "libcuda.so.1: cannot open shared object file: No such file or directory";
  expect_known(cuda::preflight_status(cuda::run_preflight(none)), "no-driver");
  // The CUDA runtime's own words for a launch without code for the GPU (the module's cuda_status).
  expect_known(failed_precondition_error("cuda:0: probe: cudaErrorNoKernelImageForDevice: no kernel image is "
                                         "available for execution on the device"),
               "no-kernel-image");
}

TEST(KnownFailures, ADeviceIndexBeyondTheDevices) {
  auto cpu = backends::default_registry().find("cpu");
  ASSERT_TRUE(cpu.ok());
  auto d = (*cpu)->create_device(999, hal::DeviceOptions{});
  ASSERT_FALSE(d.ok());
  expect_known(d.status(), "invalid-device");
  expect_known(cuda::select_gpus("5", 2).status(), "invalid-device");
  // The CUDA runtime's words (cudaSetDevice on an ordinal it does not have).
  expect_known(internal_error("cuda:3: cudaSetDevice: cudaErrorInvalidDevice: invalid device ordinal"),
               "invalid-device");
}

TEST(KnownFailures, PeerAccessNotSupported) {
  expect_known(internal_error("cudaDeviceEnablePeerAccess: cudaErrorPeerAccessUnsupported: peer access is not "
                              "supported between these two devices"),
               "peer-access");
}

struct FakeComm : cuda::RankComm {
  Status async_error() override { return ok_status(); }
  void abort() override {}
};

TEST(KnownFailures, ACollectiveTimeOut) {
  // The NCCL channel's watch: rank 1 never issues the all_reduce ranks 0 and 2 wait in.
  FakeComm comms[3];
  cuda::CollectiveWatch w({"tp group of stage 0", {"cuda:0", "cuda:1", "cuda:2"}, "NCCL 2.28.9", 100ms},
                          {&comms[0], &comms[1], &comms[2]}, 0ms);
  const auto t0 = cuda::CollectiveWatch::Clock::now();
  w.watch(0, "all_reduce", 4096, [] { return false; }, t0);
  w.watch(2, "all_reduce", 4096, [] { return false; }, t0);
  w.poll(t0 + 200ms);
  expect_known(w.status(), "collective-timeout");
  // The host channels' deadline (CPU, Vulkan, staged CUDA): a rank that never arrives.
  hal::ChannelOptions o;
  o.timeout = 50ms;
  o.name = "tp group of 2 ranks";
  backends::HostGroup g({"cpu:0", "cpu:1"}, o);
  expect_known(g.barrier(0, 0), "collective-timeout");
}

TEST(KnownFailures, APortInUseAndAChatWithoutTemplate) {
  expect_known(loop::uv_status(UV_EADDRINUSE, "listen on 127.0.0.1:8000"), "port-in-use");
  auto tok = tokenizer::Tokenizer::from_data(tokenizer::testing::tiny_data({}));
  ASSERT_TRUE(tok.ok());
  expect_known(chat::check_chat_tokens(**tok), "no-chat-template");
}

TEST(KnownFailures, ASmokeTestThroughAWrongRank) {
  hal::Backend& cpu = **backends::default_registry().find("cpu");
  hal::DeviceOptions o;
  o.set("threads", 1);
  o.set("corrupt_device", std::int64_t{2});
  auto g = engine::create_device_group(cpu, 3, o);
  ASSERT_TRUE(g.ok());
  auto r = engine::run_smoke_test(SX_MODELS_DIR "/memorise-f16.gguf", cpu, g->devices, 3, 1);
  ASSERT_FALSE(r.ok());
  expect_known(r.status(), "smoke-test");
}

TEST(KnownFailures, OtherErrorsAreNotGuessed) {
  EXPECT_FALSE(diagnose(ok_status()).has_value());
  EXPECT_FALSE(diagnose(invalid_argument_error("--tp must be a number, got 'two'")).has_value());
  EXPECT_EQ(cause_and_fix(internal_error("something new")), "");
  // Every entry has an id, a cause and a fix, and no two share an id.
  std::set<std::string_view> ids;
  for (const KnownFailure& f : known_failures()) {
    EXPECT_FALSE(f.id.empty());
    EXPECT_FALSE(f.cause.empty());
    EXPECT_FALSE(f.fix.empty());
    EXPECT_TRUE(ids.insert(f.id).second) << f.id;
  }
}

}  // namespace
}  // namespace sx::daemon::diagnose
