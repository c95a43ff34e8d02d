// CudaSimulator: the CPU simulator's attention-error measurement (sim/simulator.h)
// on the GPU. Per (layer, KV head) it reconstructs K̂ and V̂ with the formats' CUDA
// twins, then for the query heads of that KV head and the evaluated positions computes
// scores, softmax, KL(p || p̂), top-k overlap, logit errors and ‖Δo‖ with
//   Δs = Q·ΔKᵀ/√d,  Δo = (P̂ - P)·V + P̂_stored·ΔV_stored + P̂_window·ΔV_window,
// honouring the Plan's time semantics (segments, sliding/chunked windows, prefill)
// exactly as the CPU does. Every tensor stays on the device; only the AttentionRow
// results and the tensor-level sums come back.
//
// The results agree with kvb::simulate within float GEMM rounding (scores are fp32
// dot products in a different order): tests/gpu/test_attention.cpp bounds every
// metric at 1e-5 relative. Host-only header. The sweep and the optimal allocator reach
// it through cuda::CudaMeasurer (kernels/cuda_measurer.h, the Measurer interface of
// sim/measurer.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "sim/metrics/error_stats.h"
#include "sim/matmul_precision.h"
#include "sim/plan.h"
#include "sim/recording.h"
#include "sim/simulator.h"

namespace kvb::cuda {

// Empty when CudaSimulator can run `plan` with `opt`; otherwise why not, naming the
// first format without a CUDA twin (has_cuda_twin, sim/formats/registry.h) and its unit.
// Needs no device.
std::string unsupported_reason(const Plan& plan, const SimOptions& opt);

class CudaSimulator {
 public:
  // Uploads every layer's queries, keys and values to device 0 (fp32). Throws
  // kvb::Error when no device is usable or the recording does not fit.
  // `precision`: the plan-dependent matrix products in fp32 (default) or on TF32
  // tensor cores (sim/matmul_precision.h); the exact ones are always fp32.
  // `layers_streamed`: `rec` is a StreamedRecording's (sim/layer_stream.h): nothing is
  // uploaded here; upload_layer(l) uploads layer l while the recording holds it, and
  // only layers on the device are measured (so the device holds one layer, not all).
  explicit CudaSimulator(const Recording& rec, MatmulPrecision precision = MatmulPrecision::Fp32,
                         bool layers_streamed = false);
  ~CudaSimulator();
  CudaSimulator(const CudaSimulator&) = delete;
  CudaSimulator& operator=(const CudaSimulator&) = delete;

  const Recording& recording() const;

  // As kvb::simulate_layer: rows in (q_head, position) order. opt.row_block is not
  // used (the GPU blocks rows by memory). Throws kvb::Error for unsupported plans.
  ErrorStats simulate_layer(const Plan& plan, int64_t layer, const SimOptions& opt);
  // As kvb::simulate_kv_head: the query heads of one KV head, only its units read.
  // Unlike simulate_layer (whose non-finite values reach the rows and the sweep's
  // finiteness check), throws NonFiniteReconstruction when a format turns finite keys
  // or values of its units into Inf or NaN, as the CPU does.
  ErrorStats simulate_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt);
  // As kvb::simulate: all layers in order, merged.
  ErrorStats simulate(const Plan& plan, const SimOptions& opt);

  // A streamed recording's layer l (index into recording().layers), held by the
  // recording now: uploads its tensors. drop_layer(l) frees them and everything kept
  // for layer l (its exact-pass cache entries and norms). Both throw kvb::Error on a
  // simulator whose layers are not streamed; measuring a layer not on the device does too.
  void upload_layer(int64_t layer);
  void drop_layer(int64_t layer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvb::cuda
