// NCCL opened at run time (issue 21 item 2): the functions Sextant's CUDA channel calls, looked up
// in libnccl.so.2 ($SEXTANT_NCCL_LIBRARY overrides the name), so that a machine without NCCL
// still runs the CUDA backend at TP 1 and reports why tensor parallelism over several GPUs is
// unavailable. Declared with the C ABI of nccl.h (stable since NCCL 2.0: opaque handles as
// pointers, enums as int) so this file needs no CUDA header and is unit-tested here.
// Threading: load_nccl() is safe to call from any thread (loaded once).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/base/status.h"

namespace sx::cuda {

// nccl.h's values.
inline constexpr int kNcclSuccess = 0, kNcclInProgress = 7;
inline constexpr int kNcclUint8 = 1, kNcclFloat32 = 7;
inline constexpr int kNcclSum = 0;
inline constexpr std::size_t kNcclUniqueIdBytes = 128;

struct NcclApi {
  using Comm = void*;    // ncclComm_t
  using Stream = void*;  // cudaStream_t
  int version = 0;       // ncclGetVersion: 22809 for 2.28.9
  std::string path;      // the library opened
  int (*comm_init_all)(Comm* comms, int ndev, const int* devlist) = nullptr;
  int (*all_reduce)(const void* send, void* recv, std::size_t count, int dtype, int op, Comm comm,
                    Stream stream) = nullptr;
  int (*all_gather)(const void* send, void* recv, std::size_t send_count, int dtype, Comm comm,
                    Stream stream) = nullptr;
  int (*broadcast)(const void* send, void* recv, std::size_t count, int dtype, int root, Comm comm,
                   Stream stream) = nullptr;
  int (*send)(const void* buf, std::size_t count, int dtype, int peer, Comm comm, Stream stream) = nullptr;
  int (*recv)(void* buf, std::size_t count, int dtype, int peer, Comm comm, Stream stream) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*comm_get_async_error)(Comm comm, int* error) = nullptr;
  int (*comm_abort)(Comm comm) = nullptr;
  int (*comm_destroy)(Comm comm) = nullptr;
  const char* (*get_error_string)(int result) = nullptr;
  const char* (*get_last_error)(Comm comm) = nullptr;  // null before NCCL 2.13
};

// "2.28.9" from 22809 (and the pre-2.9 encoding 2708 -> "2.7.8").
std::string nccl_version_string(int code);
// NCCL from `library` (a file name the loader searches for, or a path). UNAVAILABLE, naming the
// library, the loader's error and what to do, when it cannot be opened, lacks a function, or is
// older than 2.12 (ncclCommGetAsyncError and ncclCommAbort semantics Sextant relies on).
Result<NcclApi> open_nccl(const std::string& library);
// The process's NCCL: open_nccl($SEXTANT_NCCL_LIBRARY or "libnccl.so.2"), once.
Result<const NcclApi*> load_nccl();
// How the ranks of a CUDA group exchange data. $SEXTANT_CUDA_CHANNEL:
// - "nccl": NCCL (ranks on distinct GPUs; several devices of one GPU, which NCCL refuses, or no
//   NCCL: an error naming the way out);
// - "loopback": the loopback channel (every device of the group on one GPU, else an error);
// - "staged": through host memory (any group; correct but slow);
// - unset or "auto": staged for now. Neither NCCL nor the loopback channel has run on a GPU yet;
//   once tests/device/run has validated them, auto becomes nccl for distinct GPUs and loopback
//   for devices of one GPU.
// `nccl` is load_nccl()'s answer.
enum class CudaChannelKind { kNccl, kStaged, kLoopback };
Result<CudaChannelKind> choose_cuda_channel(const std::vector<int>& ordinals, const char* env,
                                            const Status& nccl);

// The device memory NCCL takes per GPU for a group of `ranks` (its connection buffers, for the
// memory plan) when the group will use NCCL ($SEXTANT_CUDA_CHANNEL=nccl and ranks > 1; else 0):
// an estimate, NCCL_BUFFSIZE (default 4 MiB, `buffsize_env` as NCCL reads it) x 2 protocols x 4
// connections (ring and tree neighbours) x 16 channels + 64 MiB, 576 MiB with the defaults. The
// channel logs what NCCL actually took at its creation, to check it on a real machine.
std::uint64_t nccl_reserve_bytes(int ranks, const char* channel_env, const char* buffsize_env);

// The NCCL_* variables set that change how NCCL connects (P2P, IB, socket interface, debug,
// algorithm, protocol): "NCCL_P2P_DISABLE=1, NCCL_DEBUG=INFO"; empty when none is.
std::string nccl_environment();

// "ncclUnhandledCudaError: ... (last error: ...)" for a result of a call on `comm` (may be null).
std::string nccl_error(const NcclApi& api, int result, NcclApi::Comm comm);

}  // namespace sx::cuda
