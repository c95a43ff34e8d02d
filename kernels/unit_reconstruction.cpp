#include "kernels/unit_reconstruction.h"

#include "sim/core/error.h"
#include "sim/formats/registry.h"

namespace kvb::cuda {

std::string unit_name(int64_t layer, int64_t kv_head, Kind kind) {
  return "layer " + std::to_string(layer) + " kv_head " + std::to_string(kv_head) + " " + kind_name(kind);
}

std::string missing_twin(const Plan& plan) {
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const UnitPlan& u = plan.unit(l, g, kind);
        for (const Segment& s : u.segments)
          if (!has_cuda_twin(*s.format))
            return "format '" + s.format->name() + "' has no CUDA twin (" + unit_name(l, g, kind) + ", tokens [" +
                   std::to_string(s.begin) + ", " + std::to_string(s.end) + "))";
        if (u.window.active() && !has_cuda_twin(*u.window.format))
          return "format '" + u.window.format->name() + "' has no CUDA twin (" + unit_name(l, g, kind) + " window)";
      }
  return {};
}

const FormatTwin& TwinCache::twin(const Format& format) {
  auto it = twins_.find(format.name());
  if (it == twins_.end()) it = twins_.emplace(format.name(), require_twin(format)).first;
  return *it->second;
}

void reconstruct_unit_on_device(TwinCache& twins, const UnitPlan& unit, const float* x, int64_t T, int64_t d,
                                float* stored, float* window, cudaStream_t stream) {
  for (const Segment& s : unit.segments) {
    if (s.begin < 0 || s.end > T || s.begin >= s.end)
      throw Error("internal: segment [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                  ") outside a unit of " + std::to_string(T) + " tokens");
    twins.twin(*s.format).roundtrip(x + s.begin * d, SpanBatch{1, s.end - s.begin, d}, stored + s.begin * d, stream);
  }
  if (unit.window.active()) twins.twin(*unit.window.format).roundtrip(x, SpanBatch{1, T, d}, window, stream);
}

}  // namespace kvb::cuda
