#include <cuda_runtime.h>

#include "kernels/device.h"

namespace kvb::cuda {

DeviceInfo device_info() {
  DeviceInfo info;
  const cudaError_t err = cudaGetDeviceCount(&info.count);
  if (err != cudaSuccess || info.count == 0) {
    info.why_not = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    info.count = 0;
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    info.why_not = "cudaGetDeviceProperties failed";
    return info;
  }
  info.available = true;
  info.name = prop.name;
  info.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  return info;
}

}  // namespace kvb::cuda
