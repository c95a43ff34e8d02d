#include "experiments/backend.h"

#include "kvb/build_config.h"
#include "sim/core/error.h"
#if KVB_HAVE_CUDA
#include "kernels/cuda_measurer.h"
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

MatmulPrecision parse_matmul_precision(const std::string& name, const std::string& where) {
  if (name == "fp32") return MatmulPrecision::Fp32;
  if (name == "tf32") return MatmulPrecision::Tf32;
  throw ConfigError(where + ": precision must be \"fp32\" or \"tf32\", got \"" + name + "\"");
}

void check_precision_backend(MatmulPrecision precision, BackendRequest b, const std::string& where) {
  if (precision == MatmulPrecision::Tf32 && b == BackendRequest::Cpu)
    throw ConfigError(where + ": precision = \"tf32\" is the CUDA backend's fast mode, but backend = \"cpu\" "
                              "(the CPU always computes in fp32/fp64); use backend = \"cuda\" or \"auto\", or "
                              "precision = \"fp32\"");
}

const char* backend_name(Backend b) { return b == Backend::Cuda ? "cuda" : "cpu"; }

std::unique_ptr<Measurer> make_measurer(Backend b, const Recording& rec, MatmulPrecision precision,
                                        bool layers_streamed) {
  if (b == Backend::Cpu) return std::make_unique<CpuMeasurer>(rec, kExactCacheBytes);
#if KVB_HAVE_CUDA
  return std::make_unique<cuda::CudaMeasurer>(rec, precision, layers_streamed);
#else
  (void)precision;
  (void)layers_streamed;
  throw Error("CUDA backend: built without CUDA");
#endif
}

std::string backend_unsupported_reason(Backend b, const Plan& plan, const SimOptions& opt) {
  if (b == Backend::Cpu) return {};
#if KVB_HAVE_CUDA
  return cuda::unsupported_reason(plan, opt);
#else
  (void)plan;
  (void)opt;
  return "built without CUDA";
#endif
}

Backend planning_backend(BackendRequest r) {
  if (r != BackendRequest::Cuda) return Backend::Cpu;
  std::string why_not;
  if (cuda_device(&why_not).empty()) throw Error("backend = \"cuda\": " + why_not);
  return Backend::Cuda;
}

Measurer& Measurers::of(Backend b, const Recording& rec) {
  // Held while a measurer is made: two threads asking for the same one get one upload.
  const std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Measurer>& m = made_[{b, &rec}];
  if (!m) m = make_measurer(b, rec, precision_, &rec == streamed_);
  return *m;
}

MeasurerFor Measurers::source(Backend b) {
  return [this, b](const Recording& rec) -> Measurer& { return of(b, rec); };
}

}  // namespace kvb
