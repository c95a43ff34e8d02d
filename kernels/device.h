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
  std::string why_not;     // when !available: the CUDA error text
};

DeviceInfo device_info();

}  // namespace kvb::cuda
