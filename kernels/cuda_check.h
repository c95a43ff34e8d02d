// Error checking for CUDA runtime and cuBLAS calls: every failure becomes a kvb::Error
// naming the call, the source line and CUDA's message. Host-only.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "sim/core/error.h"

namespace kvb::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(std::string("CUDA error in ") + call + " (" + file + ":" + std::to_string(line) +
              "): " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace kvb::cuda

#define KVB_CUDA_CHECK(call)                                                           \
  do {                                                                                 \
    const cudaError_t kvb_err_ = (call);                                               \
    if (kvb_err_ != cudaSuccess) ::kvb::cuda::throw_cuda_error(kvb_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define KVB_CUDA_CHECK_LAUNCH(kernel_name) KVB_CUDA_CHECK(cudaPeekAtLastError())
