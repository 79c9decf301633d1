// The catalogue of known failures (known_failures.h).
#include "daemon/diagnose/known_failures.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace sx::daemon::diagnose {

namespace {

struct Rule {
  KnownFailure failure;
  std::vector<StatusCode> codes;            // any of these codes (empty: any code)
  std::vector<std::string_view> any_words;  // the message (lower case) holds one of these
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> kRules = {
      {{"port-in-use", "another process listens on the HTTP port",
        "stop it (`ss -ltnp 'sport = :PORT'` names it) or choose another --port / http.port"},
       {},
       {"address already in use", "eaddrinuse"}},
      {{"another-daemon", "another sextant daemon is running with the same admin socket",
        "stop it (`sextant ctl drain` or its service), or give this one its own admin.socket"},
       {},
       {"another sextant daemon is listening"}},
      // Before the model-file rules below, whose fix (download it again) cannot help when the hub
      // itself sends what its API does not give (hub_client.h says "the hub sent" for each).
      {{"hub-answer", "the model hub (or a mirror or proxy on the way) sent what its API does not give: a listing "
                      "that is not safe to use, an answer past its size bound, or a file other than the one it "
                      "lists",
        "nothing on this machine can repair it: report it to the hub's operator, or pull from another endpoint "
        "(HF_ENDPOINT / MODELSCOPE_DOMAIN; the hub itself rather than a mirror)"},
       {StatusCode::kDataLoss},
       {"the hub sent"}},
      {{"disk-full", "the disk (or quota) that the files are written to is full",
        "free space, or point HF_HUB_CACHE / HF_HOME (or --local-dir) at a larger disk, then run the same command: "
        "a pull resumes from its .partial files"},
       {StatusCode::kResourceExhausted, StatusCode::kInternal},
       {"no space left on device", "disk quota exceeded"}},
      {{"truncated-file", "the model file is shorter than its header says (an interrupted download or copy)",
        "download or copy it again and compare its size (and SHA256SUMS) with the source"},
       {StatusCode::kDataLoss},
       {"truncated", "too short", "shorter than"}},
      {{"missing-tensor", "the model lacks a tensor its architecture needs (an incomplete shard set or a foreign "
                          "conversion)",
        "check that every shard is present (`sextant inspect` lists the tensors) or convert the model again"},
       {StatusCode::kNotFound, StatusCode::kInvalidArgument, StatusCode::kDataLoss},
       {"is missing", "missing tensor", "missing shard"}},
      {{"corrupt-file", "the model file's bytes are not what its header or checksums say",
        "download or copy it again; `sextant inspect --verify` checks every shard"},
       {StatusCode::kDataLoss},
       {""}},
      {{"no-kernel-image", "this build has no GPU code for the GPU's architecture (\"no kernel image\")",
        "rebuild with -Dnvcc_archs=<the GPU's compute capability> (`sextant doctor` shows both)"},
       {},
       {"no kernel image", "nokernelimage", "this build has sm_", "invaliddevicefunction"}},
      {{"driver-too-old", "the NVIDIA driver is older than the CUDA runtime this build needs",
        "update the driver (nvidia-smi shows its CUDA version) or use a build for an older CUDA"},
       {},
       {"insufficientdriver", "the nvidia driver supports cuda"}},
      // Before invalid-device, whose words ("there is no device") a Vulkan selection error shares
      // but whose fix is CUDA's.
      {{"vulkan-device", "SEXTANT_VULKAN_DEVICES or model.devices names a Vulkan device this machine does not have",
        "list the devices with `sextant doctor --backend vulkan` (or `vulkaninfo --summary`) and name one of them by "
        "index, UUID or name, or unset SEXTANT_VULKAN_DEVICES"},
       {},
       {"vulkan device selection"}},
      {{"invalid-device", "a device index names a GPU this process does not see (\"invalid device ordinal\")",
        "compare CUDA_VISIBLE_DEVICES, model.devices and SEXTANT_CUDA_DEVICES with `nvidia-smi -L` (Sextant "
        "numbers GPUs in PCI order)"},
       {},
       {"invalid device ordinal", "invaliddevice", "there is no device", "is outside cpu:",
        "is not a gpu index"}},
      {{"peer-access", "the GPUs cannot reach each other's memory directly (peer access not supported over "
                       "this link)",
        "NCCL_P2P_DISABLE=1 (NCCL stages through host memory) or SEXTANT_CUDA_CHANNEL=staged; or place the TP "
        "group under one PCIe switch (sextant plan --topology)"},
       {},
       {"peer access is not supported", "peeraccessunsupported", "peer access not supported"}},
      {{"collective-timeout", "a collective between the ranks did not finish in time (NCCL hung on a PCIe / SYS "
                              "path, or a rank stopped)",
        "check `nvidia-smi topo -m` for SYS links inside the TP group, try NCCL_P2P_DISABLE=1 or "
        "NCCL_P2P_LEVEL=PHB, or place the groups with sextant plan --topology"},
       {StatusCode::kDeadlineExceeded},
       {"all_reduce", "all_gather", "broadcast", "barrier", "nccl", "waited", "collective"}},
      {{"weights-oom", "the weights (with the step workspace) alone do not fit in a device's usable memory",
        "a smaller weight format (q4_k_m, awq-int4), more devices (--tp / --pp), or a larger memory_utilization "
        "(`sextant plan` lists what fits)"},
       {StatusCode::kResourceExhausted},
       {"the weights do not fit"}},
      {{"kv-oom", "the KV cache does not fit in the memory left after the weights",
        "lower engine.max_model_len or max_num_seqs, raise memory_utilization, use a smaller weight format or "
        "more devices (`sextant plan` shows what fits)"},
       {StatusCode::kResourceExhausted},
       {"memory plan", "kv cache", "kv pool", "out of memory", "memoryallocation", "alloc"}},
      {{"no-chat-template", "the model has no chat template (its tokenizer has no ChatML tokens), so "
                            "/v1/chat/completions cannot format a conversation",
        "use /v1/completions with your own prompt format, or a model whose tokenizer defines a chat template"},
       {},
       {"no chat template"}},
      {{"smoke-test", "the bundled model gave a wrong token through this TP x PP layout on these devices: a rank "
                      "computes wrong results or a collective moves wrong data",
        "run `sextant doctor` with the same layout; try --tp 1 on each device to find the bad one, and "
        "SEXTANT_CUDA_CHANNEL=staged (or NCCL_P2P_DISABLE=1) to rule out the transport"},
       {StatusCode::kFailedPrecondition},
       {"smoke test:"}},
      {{"no-driver", "no NVIDIA driver is loaded on this machine (libcuda.so.1 is missing)",
        "install the NVIDIA driver (nvidia-smi must work), or run with --backend cpu or vulkan"},
       {},
       {"libcuda.so.1 cannot be loaded", "no nvidia driver"}},
  };
  return kRules;
}

}  // namespace

const std::vector<KnownFailure>& known_failures() {
  static const std::vector<KnownFailure> kAll = [] {
    std::vector<KnownFailure> out;
    for (const Rule& r : rules()) out.push_back(r.failure);
    return out;
  }();
  return kAll;
}

std::optional<KnownFailure> diagnose(const Status& error) {
  if (error.ok()) return std::nullopt;
  const std::string text = lower(error.message());
  for (const Rule& r : rules()) {
    if (!r.codes.empty() && std::find(r.codes.begin(), r.codes.end(), error.code()) == r.codes.end()) continue;
    for (std::string_view w : r.any_words) {
      if (text.find(w) != std::string::npos) return r.failure;
    }
  }
  return std::nullopt;
}

std::string cause_and_fix(const Status& error) {
  const auto f = diagnose(error);
  if (!f) return {};
  return fmt::format("cause: {}; fix: {}", f->cause, f->fix);
}

}  // namespace sx::daemon::diagnose
