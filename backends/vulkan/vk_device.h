// The Vulkan backend (DESIGN.md §4; issue 18): one Sextant device = one VkDevice with one compute
// queue on a physical device chosen by vk_select.h. Buffers are VkBuffers in device-local memory
// (kDevice) or host-visible, persistently mapped memory (kUpload, kReadback). A stream records
// into command buffers and submits them on the device's queue, signalling its own timeline
// semaphore; every command is preceded by a full memory barrier (correct first: no hazard
// tracking yet). Transfers of host bytes go through staging buffers taken at the call (so upload
// and update never read `src` after they return); download and host_call wait for the stream's
// work, then run on the calling thread. Events are timeline-semaphore values. Errors from the
// driver latch as Status (device lost: UNAVAILABLE, out of memory: RESOURCE_EXHAUSTED).
//
// Channels: collectives staged through host-visible buffers around host calls
// (backends/common/staged_channel.h).
//
// Ops are compute shaders from shaders/ (SPIR-V embedded at build time), bound with push
// descriptors; operands are bound from their offset rounded down to the device's storage-buffer
// offset alignment, the remainder passed as an element offset. Implemented so far: add, silu_mul,
// rmsnorm, top_k, rope, paged attention (f32 and f16 caches, heads up to 256), embedding and
// matmul over weights in their file formats (shaders/quant.glsl: f32, f16, bf16, q8_0, q4_0, q4_1,
// q5_0, q5_1, q4_k, q5_k, q6_k; bound in windows of whole rows) and kv_write: the whole op set.
// What a shader cannot do (e.g. a head over 256) is refused by supports(), so at load.
//
// Device options ("vulkan"): memory_budget (bytes; 0 = the largest device-local heap) emulates a
// smaller device, so the memory planner has something real to plan against on lavapipe;
// max_binding (bytes; 0 = maxStorageBufferRange) binds operands in smaller windows, so that tests
// on small tensors take the paths large ones take.
//
// Threading: one thread per stream; a device's queue is shared by its streams under a mutex.
#pragma once

#include <memory>

#include "runtime/hal/registry.h"

namespace sx::vk {

std::unique_ptr<hal::Backend> make_vulkan_backend();

}  // namespace sx::vk
