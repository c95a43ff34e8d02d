// Backend selection: which implementation measures a sweep's points.
//
//   config `backend = "cpu" | "cuda" | "auto"` (top level), `kvbudget run --backend`
//   cpu   the CPU simulator (sim/simulator.h), the reference; the default
//   cuda  the CUDA simulator (kernels/cuda_simulator.h); a point whose plan uses a
//         format without a CUDA twin fails naming the format (never a silent CPU
//         fallback); no device, or a build without nvcc, is an error
//   auto  cuda when a device is present and every format of the sweep has a CUDA
//         twin, else cpu; the manifest says which and why
//
// Where a backend plugs in: it implements the Measurer interface (sim/measurer.h:
// which plans it supports, measuring one layer or one KV head of a plan, how many
// measurements it runs at once), and make_measurer() below is the one place that
// creates it. The sweep (experiments/sweep.h) runs its tasks on the chosen backend's
// measurer, and the optimal allocator measures its distortion tables on the planning
// backend's (planning_backend(): the CUDA one on backend = "cuda").
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "sim/formats/format.h"
#include "sim/matmul_precision.h"
#include "sim/measurer.h"

namespace kvb {

enum class BackendRequest { Cpu, Cuda, Auto };
// What measures the points (whether a format runs on cuda: has_cuda_twin,
// sim/formats/registry.h).
enum class Backend { Cpu, Cuda };

// Throws ConfigError naming `where` for anything but "cpu", "cuda", "auto", and for
// "cuda" in a build without CUDA.
BackendRequest parse_backend_request(const std::string& name, const std::string& where);
const char* backend_request_name(BackendRequest r);

// Config `precision` / --precision: "fp32" or "tf32" (sim/matmul_precision.h); throws
// ConfigError naming `where` for anything else.
MatmulPrecision parse_matmul_precision(const std::string& name, const std::string& where);
// Throws ConfigError naming `where` when `precision` cannot apply to backend `b`
// (tf32 with backend = "cpu": the CPU has no such mode).
void check_precision_backend(MatmulPrecision precision, BackendRequest b, const std::string& where);

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

// Memory the CPU backend may spend on a run's exact attention pass (ExactAttentionCache,
// built by CpuMeasurer::prepare).
inline constexpr size_t kExactCacheBytes = size_t(1) << 30;

// The one place a backend's Measurer is created: CpuMeasurer (with kExactCacheBytes for
// its exact pass) or cuda::CudaMeasurer, which uploads `rec` (kvb::Error when no
// device is usable, or in a build without CUDA). `rec` must outlive it.
// `layers_streamed`: `rec` is a StreamedRecording's (sim/layer_stream.h), whose layers
// the measurer is told of by Measurer::layer_held / layer_released (the CUDA one then
// uploads one layer at a time instead of every layer up front).
std::unique_ptr<Measurer> make_measurer(Backend b, const Recording& rec,
                                        MatmulPrecision precision = MatmulPrecision::Fp32,
                                        bool layers_streamed = false);

// Why backend `b` cannot measure `plan` with `opt` ("" when it can), without creating
// a measurer or touching a device (Measurer::unsupported_reason of that backend): an
// auto choice asks it of every plan.
std::string backend_unsupported_reason(Backend b, const Plan& plan, const SimOptions& opt);

// The backend the strategies measure on while plans are built (the optimal
// allocator's distortion tables), before the plans decide an auto choice: cuda for
// backend = "cuda" (throws kvb::Error as the sweep does when no device is usable),
// else cpu (auto calibrates on the CPU: its choice depends on the plans).
Backend planning_backend(BackendRequest r);

// The measurers of one run, one per (backend, recording), each made by make_measurer()
// on first use and kept until the run ends (the CUDA one holds its recording on the
// device). Thread-safe.
class Measurers {
 public:
  // `precision`: what make_measurer gives the CUDA measurer (the CPU ignores it).
  // `streamed`: the run's recording when its layers are streamed (its measurers are made
  // with layers_streamed), else nullptr.
  explicit Measurers(MatmulPrecision precision = MatmulPrecision::Fp32, const Recording* streamed = nullptr)
      : precision_(precision), streamed_(streamed) {}
  Measurer& of(Backend b, const Recording& rec);
  // of(b, ·), as StrategyInput::measurer_for holds it; valid while this object lives.
  MeasurerFor source(Backend b);

 private:
  MatmulPrecision precision_;
  const Recording* streamed_;
  std::mutex mu_;
  std::map<std::pair<Backend, const Recording*>, std::unique_ptr<Measurer>> made_;
};

}  // namespace kvb
