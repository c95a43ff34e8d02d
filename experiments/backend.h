// Backend selection: which implementation measures a sweep's points.
//
//   config `backend = "cpu" | "cuda" | "auto"` (top level), `kvbudget run --backend`
//   cpu   the CPU simulator (sim/simulator.h), the reference; the default
//   cuda  the CUDA simulator (kernels/cuda_simulator.h); a point whose plan uses a
//         format without a CUDA twin fails naming the format (never a silent CPU
//         fallback); no device, or a build without nvcc, is an error
//   auto  cuda when a device is present and every format of the sweep has a CUDA
//         twin, else cpu; the manifest says which and why
#pragma once
#include <string>

#include "sim/formats/format.h"

namespace kvb {

enum class BackendRequest { Cpu, Cuda, Auto };
// What measures the points (whether a format runs on cuda: has_cuda_twin,
// sim/formats/registry.h).
enum class Backend { Cpu, Cuda };

// Throws ConfigError naming `where` for anything but "cpu", "cuda", "auto", and for
// "cuda" in a build without CUDA.
BackendRequest parse_backend_request(const std::string& name, const std::string& where);
const char* backend_request_name(BackendRequest r);

// Whether this build has the CUDA backend (nvcc was found at build time).
bool cuda_backend_built();

// The CUDA device the backend would use ("NVIDIA H100 ... driver CUDA 13.0"), or empty
// when there is none; then *why says why (no device, built without CUDA).
std::string cuda_device(std::string* why);

// What a sweep ran on, for the manifest.
struct BackendChoice {
  BackendRequest requested = BackendRequest::Cpu;
  Backend used = Backend::Cpu;
  std::string reason;  // why `used` (for auto: the deciding fact)
  std::string device;  // the CUDA device, when one was found
};

const char* backend_name(Backend b);

}  // namespace kvb
