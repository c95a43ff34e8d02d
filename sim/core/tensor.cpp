#include "sim/core/tensor.h"

#include <cmath>
#include <sstream>

#include "sim/core/error.h"

namespace kvb {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

void require_finite(const Tensor& t, const std::string& what) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = t.data[static_cast<size_t>(i)];
    if (std::isfinite(v)) continue;
    std::vector<int64_t> idx(t.shape.size());
    int64_t rem = i;
    for (int d = t.rank() - 1; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rem % t.shape[static_cast<size_t>(d)];
      rem /= t.shape[static_cast<size_t>(d)];
    }
    std::ostringstream os;
    os << what << shape_str(idx) << " is " << (std::isnan(v) ? "NaN" : (v > 0 ? "+Inf" : "-Inf"))
       << " (tensor shape " << shape_str(t.shape) << "); recordings must be finite";
    throw Error(os.str());
  }
}

}  // namespace kvb
