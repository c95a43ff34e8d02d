#include "sim/model/rotary.h"

#include <cmath>

#include "sim/core/error.h"

namespace kvb {

std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  // Hugging Face: 1 / theta ** (arange(0, d, 2) / d), evaluated in fp32.
  const float theta = static_cast<float>(rope.theta);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(theta, exponent);
  }
  if (rope.type == "linear") {
    for (float& f : inv) f = static_cast<float>(f / rope.factor);
  } else if (rope.type == "llama3") {
    // Wavelengths longer than the original context / low_freq_factor are slowed by
    // `factor`; shorter than original / high_freq_factor are kept; in between, a
    // linear blend in 1/wavelength.
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

RotaryTable make_rotary_table(const std::vector<float>& inv_freq, int64_t first_position, int64_t count) {
  RotaryTable t;
  t.first_position = first_position;
  t.positions = count;
  t.half = static_cast<int64_t>(inv_freq.size());
  t.cos.resize(static_cast<size_t>(count * t.half));
  t.sin.resize(static_cast<size_t>(count * t.half));
  for (int64_t p = 0; p < count; ++p) {
    const float pos = static_cast<float>(first_position + p);
    for (int64_t i = 0; i < t.half; ++i) {
      // The angle is rounded to fp32 first, as Hugging Face forms it (inv_freq @ positions).
      const float angle = pos * inv_freq[static_cast<size_t>(i)];
      t.cos[static_cast<size_t>(p * t.half + i)] = static_cast<float>(std::cos(static_cast<double>(angle)));
      t.sin[static_cast<size_t>(p * t.half + i)] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return t;
}

void rotate_rows(float* x, int64_t rows, int64_t stride, const RotaryTable& table) {
  const int64_t half = table.half;
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * stride;
    const float* c = table.cos.data() + r * half;
    const float* s = table.sin.data() + r * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace kvb
