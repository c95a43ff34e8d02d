#include "sim/model/rope_scaling.h"

#include <cmath>

#include "sim/core/error.h"
#include "sim/core/rope.h"

namespace kvb {

std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) inv[static_cast<size_t>(i)] = rope_inv_freq(i, head_dim, rope.theta);
  if (rope.type == "linear") {
    for (float& f : inv) f = static_cast<float>(f / rope.factor);
  } else if (rope.type == "llama3") {
    // Wavelengths longer than original / low_freq_factor are slowed by `factor`;
    // shorter than original / high_freq_factor are kept; in between, a linear blend
    // in original / wavelength.
    const double old_ctx = static_cast<double>(rope.original_max_positions);
    const double low_wavelen = old_ctx / rope.low_freq_factor;
    const double high_wavelen = old_ctx / rope.high_freq_factor;
    for (float& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rope.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / rope.factor + smooth * f);
      }
    }
  } else if (rope.type != "default") {
    throw Error("internal: RoPE type '" + rope.type + "' reached the forward pass");
  }
  return inv;
}

}  // namespace kvb
