#include "experiments/backend.h"

#include "kvb/build_config.h"
#include "sim/core/error.h"
#if KVB_HAVE_CUDA
#include "kernels/device.h"
#endif

namespace kvb {

bool cuda_backend_built() { return KVB_HAVE_CUDA != 0; }

std::string cuda_device(std::string* why) {
#if KVB_HAVE_CUDA
  const cuda::DeviceInfo dev = cuda::device_info();
  if (dev.available) return dev.describe();
  if (why) *why = "no usable CUDA device (" + dev.why_not + ")";
#else
  if (why) *why = "built without CUDA";
#endif
  return {};
}

BackendRequest parse_backend_request(const std::string& name, const std::string& where) {
  BackendRequest r;
  if (name == "cpu") r = BackendRequest::Cpu;
  else if (name == "cuda") r = BackendRequest::Cuda;
  else if (name == "auto") r = BackendRequest::Auto;
  else throw ConfigError(where + ": backend must be \"cpu\", \"cuda\" or \"auto\", got \"" + name + "\"");
  if (r == BackendRequest::Cuda && !cuda_backend_built())
    throw ConfigError(where + ": backend = \"cuda\", but this kvbudget was built without CUDA (nvcc was not found "
                              "at build time); use backend = \"cpu\" or \"auto\"");
  return r;
}

const char* backend_request_name(BackendRequest r) {
  switch (r) {
    case BackendRequest::Cuda: return "cuda";
    case BackendRequest::Auto: return "auto";
    default: return "cpu";
  }
}

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu"; }

}  // namespace kvb
