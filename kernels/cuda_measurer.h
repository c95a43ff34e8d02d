// CudaMeasurer: the CUDA backend behind the Measurer interface (sim/measurer.h),
// created by make_measurer() (experiments/backend.h) for backend = "cuda" or an auto
// choice of it. It holds one CudaSimulator (kernels/cuda_simulator.h): the recording
// is uploaded once (a streamed recording's layers one at a time, as the sweep holds
// them: layer_held / layer_released), and every measurement fills the whole device, so measurements run
// one at a time (concurrency() == 1); calls from several threads (plans built in
// parallel, each measuring distortion tables) wait for each other. Host-only header.
#pragma once
#include <mutex>
#include <string>

#include "kernels/cuda_simulator.h"
#include "sim/measurer.h"

namespace kvb::cuda {

class CudaMeasurer final : public Measurer {
 public:
  // Uploads the recording (nothing yet when `layers_streamed`); throws kvb::Error when
  // no device is usable or it does not fit. `precision`: the simulator's plan-dependent
  // products (sim/matmul_precision.h).
  explicit CudaMeasurer(const Recording& rec, MatmulPrecision precision = MatmulPrecision::Fp32,
                        bool layers_streamed = false);

  const char* name() const override { return "cuda"; }
  const Recording& recording() const override { return sim_.recording(); }
  // cuda::unsupported_reason: a format without a CUDA twin, top-k beyond kMaxTopK, a region.
  std::string unsupported_reason(const Plan& plan, const SimOptions& opt) const override;
  bool measures_regions() const override { return false; }
  int concurrency() const override { return 1; }
  ErrorStats measure_layer(const Plan& plan, int64_t layer, const SimOptions& opt) override;
  ErrorStats measure_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) override;
  ErrorStats measure(const Plan& plan, const SimOptions& opt) override;
  void layer_held(int64_t layer) override;
  void layer_released(int64_t layer) override;

 private:
  std::mutex mu_;  // held by each measurement: the simulator's stream and scratch are shared
  CudaSimulator sim_;
};

}  // namespace kvb::cuda
