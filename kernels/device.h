// CUDA device discovery. Host-only header: callable from code built without nvcc.
#pragma once
#include <string>

namespace kvb::cuda {

struct DeviceInfo {
  bool available = false;  // a usable device exists
  int count = 0;
  std::string name;        // device 0
  double memory_gib = 0;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int l2_bytes = 0;
  int driver_version = 0;   // CUDA version the driver supports, e.g. 13000
  int runtime_version = 0;  // CUDA runtime this program was built with
  std::string why_not;      // when !available: the CUDA error text

  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.2 GiB), driver CUDA 13.0, runtime 13.0"
  std::string describe() const;
};

DeviceInfo device_info();

}  // namespace kvb::cuda
