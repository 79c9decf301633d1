// `sextant doctor`: the seed's checklist before serving, in seconds (issue 22 item 1). Takes the
// flags and config of `sextant serve` (the same deployment is checked) and its own --json,
// --topology FILE and --no-checksums. Each check prints ok / warn / fail / skip with its evidence
// and, where something is wrong, the fix; exit 0 when serving would start, 1 when a check failed,
// 2 for a usage error.
//
// The checks, in order: the machine (CPU, ISA, memory); every backend's devices (the chosen one
// must have them); the chosen backend's own checks (CUDA: driver vs runtime, architectures,
// visible devices and order, memory and the processes holding it, PCIe links against their
// maximum); the links between the GPUs (NVML, or a saved `nvidia-smi topo -m`) and whether the
// planned TP groups avoid SYS links; NCCL and the NCCL_* variables in effect; the model (its
// integrity checks, its SHA-256 against SHA256SUMS through libcrypto, its format, its chat
// template); the session exactly as serve would open it up to the memory plan (devices, the smoke
// test through the layout, the shard plan, the memory plan); an all-reduce over the planned ranks;
// the HTTP port and the admin socket; other sextant daemons left running.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/cuda/nccl_api.h"
#include "backends/registry.h"
#include "daemon/chat/chatml.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "daemon/config/serve_flags.h"
#include "daemon/diagnose/known_failures.h"
#include "runtime/engine/model_loader.h"
#include "runtime/hal/topology_text.h"
#include "runtime/model/model_check.h"
#include "runtime/parallel/placement.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::daemon {

namespace {

struct Check {
  std::string name;
  std::string verdict;  // "ok", "warn", "fail", "skip"
  std::string evidence;
  std::string fix;
};

class Report {
 public:
  void add(std::string name, std::string verdict, std::string evidence, std::string fix = {}) {
    checks_.push_back({std::move(name), std::move(verdict), std::move(evidence), std::move(fix)});
  }
  // A failure with the catalogue's cause and fix when it knows the error.
  void fail(std::string name, const Status& s, std::string fix = {}) {
    if (fix.empty()) {
      if (const auto known = diagnose::diagnose(s)) fix = fmt::format("{} ({})", known->fix, known->cause);
    }
    add(std::move(name), "fail", s.to_string(), std::move(fix));
  }
  bool failed() const {
    for (const Check& c : checks_) {
      if (c.verdict == "fail") return true;
    }
    return false;
  }
  const std::vector<Check>& checks() const { return checks_; }

 private:
  std::vector<Check> checks_;
};

std::string first_line_of(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(key, 0) == 0) {
      const std::size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string v = line.substr(colon + 1);
        while (!v.empty() && v.front() == ' ') v.erase(v.begin());
        return v;
      }
    }
  }
  return {};
}

void check_system(Report& r) {
  const std::string model = first_line_of("/proc/cpuinfo", "model name");
  const std::string flags = " " + first_line_of("/proc/cpuinfo", "flags") + " ";
  std::vector<std::string> isa;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
                        "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}) {
    if (flags.find(fmt::format(" {} ", f)) != std::string::npos) isa.push_back(f);
  }
  const auto kib = [](const std::string& v) { return std::strtoull(v.c_str(), nullptr, 10); };
  const double total = static_cast<double>(kib(first_line_of("/proc/meminfo", "MemTotal"))) / (1 << 20);
  const double avail = static_cast<double>(kib(first_line_of("/proc/meminfo", "MemAvailable"))) / (1 << 20);
  r.add("system", "ok",
        fmt::format("{}, {} logical CPUs ({}); {:.1f} GiB memory, {:.1f} GiB available", model.empty() ? "CPU" : model,
                    std::thread::hardware_concurrency(), isa.empty() ? "no AVX2" : fmt::format("{}", fmt::join(isa, " ")),
                    total, avail));
  // The kernels each backend chose for this machine, as it reports them (the CPU's ISA level: an
  // invalid SEXTANT_CPU_ISA fails).
  for (const std::string& name : backends::default_registry().names()) {
    const auto k = (*backends::default_registry().find(name))->kernel_report();
    if (!k) continue;
    if (!k->status.ok()) {
      r.add(fmt::format("{} kernels", name), "fail", k->evidence, k->fix);
    } else {
      r.add(fmt::format("{} kernels", name), "ok", k->evidence);
    }
  }
}

// Every backend's devices; the chosen one (pick's answer for "auto") must have some.
hal::Backend* check_backends(Report& r, const std::string& chosen) {
  std::string why;
  auto picked = backends::default_registry().pick(chosen, &why);
  for (const std::string& name : backends::default_registry().names()) {
    hal::Backend* b = *backends::default_registry().find(name);
    auto infos = hal::list_devices(*b);
    const bool is_chosen = picked.ok() && *picked == b;
    if (infos.ok()) {
      std::vector<std::string> names;
      for (const hal::DeviceInfo& d : *infos) names.push_back(d.name);
      if (names.size() > 4) names.resize(4), names.push_back("...");
      r.add(fmt::format("backend {}", name), "ok",
            fmt::format("{}{} device(s): {}", is_chosen ? "chosen; " : "", infos->size(), fmt::join(names, ", ")));
    } else if (name == chosen) {
      r.fail(fmt::format("backend {}", name), infos.status());
    } else {
      r.add(fmt::format("backend {}", name), "skip", infos.status().message());
    }
  }
  if (!picked.ok()) {
    if (chosen == "auto") r.fail("backend auto", picked.status());
    return nullptr;
  }
  return *picked;
}

void check_machine(Report& r, hal::Backend& b) {
  for (const hal::MachineCheck& c : b.machine_checks()) {
    const char* v = c.verdict == hal::MachineCheck::Verdict::kFail   ? "fail"
                    : c.verdict == hal::MachineCheck::Verdict::kWarn ? "warn"
                                                                     : "ok";
    r.add(fmt::format("{} {}", b.name(), c.check), v, c.message);
  }
}

void check_links(Report& r, hal::Backend* b, const std::string& topology_file, int tp, int pp,
                 const std::vector<int>& devices) {
  std::optional<hal::Topology> topo;
  if (!topology_file.empty()) {
    auto t = hal::read_nvidia_smi_topo(topology_file);
    if (!t.ok()) return r.fail("links", t.status());
    topo = *std::move(t);
  } else if (b != nullptr) {
    if (auto t = b->topology(); t.ok()) topo = *std::move(t);
  }
  if (!topo) {
    return r.add("links", "skip",
                 fmt::format("the {} backend reports no links between its devices (--topology FILE: a saved "
                             "`nvidia-smi topo -m`)",
                             b != nullptr ? std::string(b->name()) : std::string("chosen")));
  }
  std::string matrix = hal::format_topology(*topo);
  while (!matrix.empty() && matrix.back() == '\n') matrix.pop_back();
  if (tp <= 1) return r.add("links", "ok", matrix);
  // The TP groups this deployment would use: its devices (or the first ones) in rank order.
  std::vector<int> ranks = devices;
  for (int i = static_cast<int>(ranks.size()); i < tp * pp; ++i) ranks.push_back(i);
  parallel::WorstLink worst;
  for (int s = 0; s < pp; ++s) {
    std::vector<int> group;  // stage s's TP group, GPUs the topology knows
    for (int i = 0; i < tp; ++i) {
      const int d = ranks[static_cast<std::size_t>(s * tp + i)];
      if (d < topo->size()) group.push_back(d);
    }
    parallel::WorstLink w = parallel::worst_link(*topo, group);
    if (w.tier > worst.tier || worst.words.empty()) worst = std::move(w);
  }
  const std::string& worst_words = worst.words;
  // What the links suggest for a model needing as many devices as this layout has (`sextant plan
  // --topology` checks the memory too).
  std::string suggestion;
  parallel::PlacementRequest req;
  req.devices = std::min(topo->size(), std::max(tp * pp, static_cast<int>(devices.size())));
  req.fits = [need = tp * pp](int t, int p) { return t * p >= need; };
  if (auto p = parallel::place(*topo, req); p.ok()) suggestion = p->chosen.describe();
  if (worst.tier == parallel::LinkTier::kSocket) {
    return r.add("links", "warn",
                 fmt::format("a TP group crosses CPU sockets ({}): NCCL over the SMP interconnect is slow and hangs "
                             "on some PCIe boxes\n{}",
                             worst_words, matrix),
                 fmt::format("place the groups with `sextant plan --topology` ({}), or use replicas of smaller groups",
                             suggestion.empty() ? "no better layout of this shape" : suggestion));
  }
  r.add("links", "ok", fmt::format("worst link inside a TP group: {}\n{}", worst_words, matrix));
}

void check_nccl(Report& r, hal::Backend* b, int tp) {
  // NCCL's own variables (nccl_api.h), then the two that size its buffers and choose the channel.
  std::vector<std::string> set;
  if (const std::string nccl = cuda::nccl_environment(); !nccl.empty()) set.push_back(nccl);
  for (const char* name : {"NCCL_BUFFSIZE", "SEXTANT_CUDA_CHANNEL"}) {
    if (const char* v = std::getenv(name); v != nullptr) set.push_back(fmt::format("{}={}", name, v));
  }
  std::string implies;
  if (const char* p2p = std::getenv("NCCL_P2P_DISABLE"); p2p != nullptr && std::string_view(p2p) == "1") {
    implies += "; P2P off: GPU-to-GPU traffic goes through host memory (slower, avoids PCIe P2P hangs)";
  }
  if (const char* lvl = std::getenv("NCCL_P2P_LEVEL"); lvl != nullptr) {
    implies += fmt::format("; P2P only up to {} links", lvl);
  }
  const std::string vars = set.empty() ? "no NCCL_* variable set" : fmt::format("{}", fmt::join(set, ", "));
  if (b == nullptr || b->name() != "cuda") {
    return r.add("nccl", "skip", fmt::format("only for tensor parallelism on CUDA ({}{})", vars, implies));
  }
  auto api = cuda::load_nccl();
  if (!api.ok()) {
    const char* ch = std::getenv("SEXTANT_CUDA_CHANNEL");
    const bool needed = tp > 1 && ch != nullptr && std::string_view(ch) == "nccl";
    return r.add("nccl", needed ? "fail" : "warn", fmt::format("{} ({}{})", api.status().message(), vars, implies),
                 "install NCCL 2.12 or newer (libnccl2) or set SEXTANT_NCCL_LIBRARY; without it TP stages through "
                 "host memory");
  }
  r.add("nccl", "ok",
        fmt::format("NCCL {} from {} ({}{})", cuda::nccl_version_string((*api)->version), (*api)->path, vars, implies));
}

// The model: open_model's integrity checks, SHA-256 of its files, its format and chat template.
std::optional<engine::OpenedModel> check_model(Report& r, const std::string& given, bool checksums) {
  if (given.empty()) {
    r.add("model", "skip", "no model given (--model PATH or model.path in --config)");
    return std::nullopt;
  }
  auto resolved = resolve_model_path(given, false);  // ORG/NAME: its cached snapshot
  if (!resolved.ok()) {
    r.fail("model", resolved.status());
    return std::nullopt;
  }
  const std::string& path = *resolved;
  auto opened = engine::open_model(path);
  if (!opened.ok()) {
    r.fail("model", opened.status());
    return std::nullopt;
  }
  const bool gguf = opened->gguf() != nullptr;
  std::string warnings;
  for (const std::string& w : opened->check.warnings) warnings += "; warning: " + w;
  r.add("model", "ok",
        fmt::format("{}: {}; {}{}", path, model::model_summary(opened->config),
                    gguf ? "GGUF (Sextant, llama.cpp and Ollama load it; vLLM only some of it)"
                         : "a safetensors directory (Sextant, vLLM, SGLang and TGI load it; llama.cpp converts it)",
                    warnings));
  if (checksums) {
    model::ModelCheck c;
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t bytes = 0;
    model::verify_checksums(*opened->weights, c, [&](const std::string&, std::uint64_t, std::uint64_t total) {
      bytes = std::max(bytes, total);
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!c.ok()) {
      r.fail("checksums", c.status());
    } else if (!c.warnings.empty()) {
      r.add("checksums", "warn", c.warnings.front(),
            "keep the SHA256SUMS the model was published with beside its files");
    } else {
      r.add("checksums", "ok", fmt::format("SHA-256 of every file matches ({:.1f} MB/s)",
                                           secs > 0 ? static_cast<double>(bytes) / 1e6 / secs : 0.0));
    }
  } else {
    r.add("checksums", "skip", "--no-checksums");
  }
  if (Status chat = chat::check_chat_tokens(*opened->tokenizer); !chat.ok()) {
    r.add("chat template", "warn", chat.message(), "serve it for /v1/completions only");
  } else {
    r.add("chat template", "ok", "ChatML (<|im_start|> / <|im_end|>) for /v1/chat/completions");
  }
  return std::move(opened).value();
}

// One all-reduce over the session's ranks through the backend's channels, its sums checked.
void check_collectives(Report& r, hal::Backend& b, const std::vector<hal::Device*>& devices) {
  const std::size_t n = devices.size();
  if (n <= 1) return r.add("collectives", "skip", "one rank: no collective");
  hal::ChannelOptions co;
  co.name = "doctor's group";
  co.timeout = std::chrono::milliseconds(30'000);
  const auto t0 = std::chrono::steady_clock::now();
  auto channels = b.create_channels(devices, co);
  if (!channels.ok()) return r.fail("collectives", channels.status());
  constexpr std::int64_t kCount = 4096;
  std::vector<Status> st(n);
  std::vector<std::vector<float>> got(n, std::vector<float>(kCount));
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      st[i] = [&]() -> Status {
        SX_ASSIGN_OR_RETURN(auto stream, devices[i]->create_stream());
        SX_ASSIGN_OR_RETURN(auto buf, devices[i]->alloc(kCount * sizeof(float)));
        std::vector<float> mine(kCount);
        for (std::int64_t k = 0; k < kCount; ++k) mine[static_cast<std::size_t>(k)] = static_cast<float>(i + 1) + k % 7;
        SX_RETURN_IF_ERROR(stream->upload(*buf, 0, std::as_bytes(std::span(mine))));
        SX_RETURN_IF_ERROR((*channels)[i]->all_reduce(*stream, {buf.get(), 0}, kCount, hal::DType::kF32));
        SX_RETURN_IF_ERROR(stream->download(std::as_writable_bytes(std::span(got[i])), *buf, 0));
        return stream->sync();
      }();
      if (!st[i].ok()) (*channels)[i]->abort(st[i]);
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < n; ++i) {
    if (!st[i].ok()) return r.fail("collectives", st[i]);
    for (std::int64_t k = 0; k < kCount; ++k) {
      const float want = static_cast<float>(n * (n + 1) / 2) + static_cast<float>(n) * static_cast<float>(k % 7);
      if (got[i][static_cast<std::size_t>(k)] != want) {
        return r.fail("collectives",
                      internal_error("all_reduce over {} ranks: rank {} ({}) holds {} at element {}, not {}", n, i,
                                     devices[i]->info().name, got[i][static_cast<std::size_t>(k)], k, want),
                      "a channel sums wrong: SEXTANT_CUDA_CHANNEL=staged to rule out NCCL / the loopback channel");
      }
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.add("collectives", "ok", fmt::format("all_reduce of {} floats over {} ranks: the sums are right on every rank "
                                         "({:.1f} ms with the group's set-up)",
                                         kCount, n, ms));
}

void check_port(Report& r, const std::string& host, std::int64_t port) {
  if (port == 0) return r.add("http port", "ok", "port 0: any free port, chosen at start");
  const int fd = ::socket(host.find(':') != std::string::npos ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return r.add("http port", "skip", fmt::format("socket(): {}", std::strerror(errno)));
  int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = -1, err = 0;
  if (host.find(':') != std::string::npos) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) == 1) rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  err = errno;
  ::close(fd);
  if (rc == 0) return r.add("http port", "ok", fmt::format("{}:{} is free", host, port));
  r.fail("http port", unavailable_error("bind {}:{}: {}{}", host, port, std::strerror(err),
                                        err == EADDRINUSE ? " (address already in use)" : ""));
}

void check_admin_socket(Report& r, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return r.add("admin socket", "ok", fmt::format("{} (free; created at start)", path));
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  const int rc = fd < 0 ? -1 : ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  if (fd >= 0) ::close(fd);
  if (rc == 0) {
    return r.fail("admin socket", failed_precondition_error("another sextant daemon is listening on {}", path));
  }
  r.add("admin socket", "ok", fmt::format("{} (a stale file nobody listens on; replaced at start)", path));
}

// Other sextant daemons still running: the seed's "leftover process" trap.
void check_processes(Report& r) {
  std::vector<std::string> others;
  const int self = static_cast<int>(::getpid());
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || std::stoi(pid) == self) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::string> argv;
    for (std::size_t at = 0; at < cmd.size();) {
      const std::size_t end = cmd.find('\0', at);
      argv.push_back(cmd.substr(at, end == std::string::npos ? std::string::npos : end - at));
      if (end == std::string::npos) break;
      at = end + 1;
    }
    if (argv.size() < 2 || std::filesystem::path(argv[0]).filename() != "sextant" || argv[1] != "serve") continue;
    std::string line;
    for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
    others.push_back(fmt::format("{} ({})", pid, line.size() > 100 ? line.substr(0, 97) + "..." : line));
  }
  if (others.empty()) return r.add("processes", "ok", "no other sextant daemon is running");
  r.add("processes", "warn", fmt::format("other sextant daemons: {}", fmt::join(others, "; ")),
        "stop the ones left over (they hold device memory and ports): `sextant ctl drain` or kill PID");
}

void print_text(const Report& r, const std::string& what) {
  std::printf("sextant doctor: %s\n", what.c_str());
  int counts[4] = {};
  for (const Check& c : r.checks()) {
    const int k = c.verdict == "ok" ? 0 : c.verdict == "warn" ? 1 : c.verdict == "fail" ? 2 : 3;
    ++counts[k];
    std::istringstream lines(c.evidence);
    std::string first;
    std::getline(lines, first);
    std::printf("  %-4s  %-22s %s\n", c.verdict.c_str(), c.name.c_str(), first.c_str());
    for (std::string more; std::getline(lines, more);) std::printf("  %-4s  %-22s %s\n", "", "", more.c_str());
    if (!c.fix.empty()) std::printf("  %-4s  %-22s fix: %s\n", "", "", c.fix.c_str());
  }
  std::printf("%zu checks: %d ok, %d warn, %d failed, %d skipped. %s\n", r.checks().size(), counts[0], counts[1],
              counts[2], counts[3], r.failed() ? "Serving would not start." : "Serving would start.");
}

}  // namespace

int cmd_doctor(int argc, char** argv) {
  // doctor's own flags; the rest are serve's.
  bool json = false, checksums = true;
  std::string topology;
  std::vector<std::string_view> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--no-checksums") {
      checksums = false;
    } else if (a == "--topology" || a.rfind("--topology=", 0) == 0) {
      if (a == "--topology") {
        if (i + 1 >= argc) return report_error("doctor", invalid_argument_error("--topology needs a FILE"));
        topology = argv[++i];
      } else {
        topology = std::string(a.substr(11));
      }
    } else if (a == "-h" || a == "--help") {
      std::fputs("usage: sextant doctor [serve's flags: --config FILE, --model PATH, --backend NAME, --tp N, ...]\n"
                 "                      [--topology FILE] [--no-checksums] [--json]\n"
                 "Checks the machine, the backends, the GPUs' links, NCCL, the model, the session up to the memory\n"
                 "plan (with the smoke test), the collectives, the port, the admin socket and leftover daemons, each\n"
                 "with its evidence and fix. Exit 0 when serving would start, 1 when a check failed.\n",
                 stdout);
      return 0;
    } else {
      rest.push_back(a);
    }
  }
  auto inv = config::parse_serve_flags(rest);
  if (!inv.ok()) return report_error("doctor", inv.status());
  const config::ServeConfig& c = inv->config;
  Report r;
  check_system(r);
  hal::Backend* backend = check_backends(r, c.model.backend);
  if (backend != nullptr) check_machine(r, *backend);
  std::vector<int> devices(c.model.devices.begin(), c.model.devices.end());
  check_links(r, backend, topology, static_cast<int>(c.model.tp), static_cast<int>(c.model.pp), devices);
  check_nccl(r, backend, static_cast<int>(c.model.tp));
  std::optional<engine::OpenedModel> opened = check_model(r, c.model.path, checksums);
  if (opened && backend != nullptr) {
    SessionOptions so = session_options(c);
    so.plan_only = true;
    so.threads = static_cast<int>(c.model.threads);
    if (!devices.empty()) {
      devices.resize(std::min(devices.size(), static_cast<std::size_t>(c.model.tp * c.model.pp)));
      so.device_indices = devices;
    }
    std::string smoke;
    so.on_phase = [&](std::string_view phase, const std::string& detail) {
      if (phase == "smoke test") smoke = detail;
    };
    auto session = open_session(so, std::move(*opened));
    if (!session.ok()) {
      r.fail("session", session.status());
    } else {
      auto shards = parallel::plan_shards(
          session->opened.config,
          *parallel::weight_types_from_source(*session->opened.weights, session->opened.config),
          {so.tp, so.pp, hal::DType::kF32, so.requantize_unaligned});
      std::string heads;
      if (shards.ok() && shards->ranks.size() > 1) {
        std::vector<std::string> each;
        for (const parallel::RankPlan& rp : shards->ranks) each.push_back(std::to_string(rp.q_heads.size()));
        heads = fmt::format("; query heads per rank: {}", fmt::join(each, ", "));
      }
      r.add("session", "ok",
            fmt::format("{}{}\nmemory plan: {}{}", session->devices_summary(), heads, session->plan_summary,
                        smoke.empty() ? std::string() : "\nsmoke test: " + smoke));
      check_collectives(r, *backend, session->devices.devices);
    }
  }
  check_port(r, c.http.host, c.http.port);
  check_admin_socket(r, c.admin.socket);
  check_processes(r);

  const std::string what = c.model.path.empty() ? std::string("no model") : c.model.path;
  if (json) {
    nlohmann::json j;
    j["model"] = c.model.path;
    j["serving_would_start"] = !r.failed();
    j["checks"] = nlohmann::json::array();
    for (const Check& ch : r.checks()) {
      j["checks"].push_back({{"check", ch.name}, {"verdict", ch.verdict}, {"evidence", ch.evidence}, {"fix", ch.fix}});
    }
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    print_text(r, what);
  }
  return r.failed() ? 1 : 0;
}

}  // namespace sx::daemon
