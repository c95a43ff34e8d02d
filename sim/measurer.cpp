#include "sim/measurer.h"

#include <omp.h>

#include "sim/exact_attention.h"

namespace kvb {

CpuMeasurer::CpuMeasurer(const Recording& rec, size_t exact_cache_bytes)
    : rec_(rec), exact_cache_bytes_(exact_cache_bytes) {}

CpuMeasurer::~CpuMeasurer() = default;

std::string CpuMeasurer::unsupported_reason(const Plan&, const SimOptions&) const { return {}; }

int CpuMeasurer::concurrency() const { return omp_get_max_threads(); }

void CpuMeasurer::prepare(const SimOptions& opt) {
  if (exact_cache_bytes_ == 0) return;
  exact_.reset();  // a cache for other options is of no use
  exact_ = std::make_unique<ExactAttentionCache>(rec_, opt, exact_cache_bytes_);
}

void CpuMeasurer::prepare_layer(const SimOptions& opt, int64_t layer) {
  if (exact_cache_bytes_ == 0) return;
  exact_.reset();  // the previous layer's, released before this one's is built
  exact_ = std::make_unique<ExactAttentionCache>(rec_, opt, exact_cache_bytes_, layer);
}

void CpuMeasurer::release_prepared() { exact_.reset(); }

SimOptions CpuMeasurer::with_exact(const SimOptions& opt) const {
  SimOptions o = opt;
  if (!o.exact) o.exact = exact_.get();  // used only for the options it was built for
  return o;
}

ErrorStats CpuMeasurer::measure_layer(const Plan& plan, int64_t layer, const SimOptions& opt) {
  return simulate_layer(rec_, plan, layer, with_exact(opt));
}

ErrorStats CpuMeasurer::measure_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) {
  return simulate_kv_head(rec_, plan, layer, kv_head, with_exact(opt));
}

ErrorStats CpuMeasurer::measure(const Plan& plan, const SimOptions& opt) { return simulate(rec_, plan, with_exact(opt)); }

}  // namespace kvb
