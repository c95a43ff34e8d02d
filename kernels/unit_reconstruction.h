// What a Plan makes of one unit of a KV cache, on the device: the stored version (each
// of the unit's segments through its format's twin) and the window version, as
// sim/reconstruction.h's reconstruct_unit_versions() does on the CPU. Shared by the
// attention-error path (cuda_simulator.cpp) and the model forward pass
// (model_forward.cpp). Host-only header.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "kernels/format_twin.h"
#include "sim/plan.h"

namespace kvb::cuda {

// "layer 3 kv_head 1 K": how errors name a unit.
std::string unit_name(int64_t layer, int64_t kv_head, Kind kind);

// Empty when every format of the plan (segments and windows of every unit) has a CUDA
// twin; otherwise names the first that has none and its unit:
//   "format 'turbo3' has no CUDA twin (layer 0 kv_head 1 K, tokens [0, 512))".
std::string missing_twin(const Plan& plan);

// The twins of the formats met so far, by format name (one per format: a twin may keep
// device scratch, so one cache serves one host thread).
class TwinCache {
 public:
  // Throws kvb::Error naming the format when it has no twin.
  const FormatTwin& twin(const Format& format);

 private:
  std::map<std::string, std::unique_ptr<FormatTwin>> twins_;
};

// x [T, d] (device) -> stored [T, d]: segment [b, e) of `unit` is x's rows [b, e) through
// the twin of the segment's format; with an active window also window [T, d]: all of x
// through the window's format (nullptr without a window). The segments must cover [0, T)
// (Plan::check, Plan::unit_at). Enqueued on `stream`.
void reconstruct_unit_on_device(TwinCache& twins, const UnitPlan& unit, const float* x, int64_t T, int64_t d,
                                float* stored, float* window, cudaStream_t stream);

}  // namespace kvb::cuda
