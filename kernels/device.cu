#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/device.h"

namespace kvb::cuda {

namespace {

std::string cuda_version(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

}  // namespace

std::string DeviceInfo::describe() const {
  if (!available) return "no CUDA device (" + why_not + ")";
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f", memory_gib);
  return name + " (sm_" + std::to_string(sm_major) + std::to_string(sm_minor) + ", " + std::to_string(multiprocessors) +
         " SMs, " + mem + " GiB), driver CUDA " + cuda_version(driver_version) + ", runtime " +
         cuda_version(runtime_version);
}

DeviceInfo device_info() {
  DeviceInfo info;
  cudaDriverGetVersion(&info.driver_version);
  cudaRuntimeGetVersion(&info.runtime_version);
  const cudaError_t err = cudaGetDeviceCount(&info.count);
  if (err != cudaSuccess || info.count == 0) {
    info.why_not = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    info.count = 0;
    cudaGetLastError();  // clear the sticky error of a failed query
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
  info.multiprocessors = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  return info;
}

}  // namespace kvb::cuda
