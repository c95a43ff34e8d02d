#include "kernels/cuda_measurer.h"

namespace kvb::cuda {

CudaMeasurer::CudaMeasurer(const Recording& rec, MatmulPrecision precision, bool layers_streamed)
    : sim_(rec, precision, layers_streamed) {}

std::string CudaMeasurer::unsupported_reason(const Plan& plan, const SimOptions& opt) const {
  return cuda::unsupported_reason(plan, opt);
}

ErrorStats CudaMeasurer::measure_layer(const Plan& plan, int64_t layer, const SimOptions& opt) {
  const std::lock_guard<std::mutex> lock(mu_);
  return sim_.simulate_layer(plan, layer, opt);
}

ErrorStats CudaMeasurer::measure_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) {
  const std::lock_guard<std::mutex> lock(mu_);
  return sim_.simulate_kv_head(plan, layer, kv_head, opt);
}

ErrorStats CudaMeasurer::measure(const Plan& plan, const SimOptions& opt) {
  const std::lock_guard<std::mutex> lock(mu_);
  return sim_.simulate(plan, opt);
}

void CudaMeasurer::layer_held(int64_t layer) {
  const std::lock_guard<std::mutex> lock(mu_);
  sim_.upload_layer(layer);
}

void CudaMeasurer::layer_released(int64_t layer) {
  const std::lock_guard<std::mutex> lock(mu_);
  sim_.drop_layer(layer);
}

}  // namespace kvb::cuda
