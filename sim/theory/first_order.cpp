#include "sim/theory/first_order.h"

#include <cmath>

#include "sim/metrics/attention.h"

namespace kvb::theory {

namespace {

// e = x̂ − x of one unit [T, d].
std::vector<double> unit_error(const Recording& rec, const Format& f, int64_t layer, int64_t g, bool key,
                               uint64_t seed) {
  const LayerTensors& L = rec.layers[static_cast<size_t>(layer)];
  const float* x = (key ? L.key : L.value).slice(g);
  const int64_t T = rec.tokens, d = rec.head_dim;
  std::vector<float> out(static_cast<size_t>(T * d));
  f.roundtrip(ConstMatView{x, T, d, d}, MatView{out.data(), T, d, d}, SpanInfo{layer, g, key, 0, seed});
  std::vector<double> e(out.size());
  for (size_t i = 0; i < e.size(); ++i) e[i] = static_cast<double>(out[i]) - static_cast<double>(x[i]);
  return e;
}

}  // namespace

FirstOrderCheck value_error_first_order(const Recording& rec, const Format& format,
                                        const std::vector<int64_t>& positions, uint64_t seed) {
  const int64_t T = rec.tokens, d = rec.head_dim;
  FirstOrderCheck c;
  c.measured_at.assign(positions.size(), 0.0);
  c.predicted_at.assign(positions.size(), 0.0);
  c.predicted_renyi2_at.assign(positions.size(), 0.0);
  std::vector<float> s(static_cast<size_t>(T));
  std::vector<double> p(static_cast<size_t>(T)), dout(static_cast<size_t>(d)), enorm2(static_cast<size_t>(T));
  std::vector<double> prefix_enorm2(static_cast<size_t>(T));  // Σ_{j ≤ t} ‖e_j‖²
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < rec.kv_heads; ++g) {
      const std::vector<double> e = unit_error(rec, format, l, g, false, seed);
      double running = 0;
      for (int64_t j = 0; j < T; ++j) {
        double n2 = 0;
        for (int64_t c2 = 0; c2 < d; ++c2) n2 += e[j * d + c2] * e[j * d + c2];
        enorm2[static_cast<size_t>(j)] = n2;
        running += n2;
        prefix_enorm2[static_cast<size_t>(j)] = running;
      }
      const LayerTensors& L = rec.layers[static_cast<size_t>(l)];
      for (int64_t h = g * rec.group_size(); h < (g + 1) * rec.group_size(); ++h)
        for (size_t at = 0; at < positions.size(); ++at) {
          const int64_t t = positions[at];
          // σ_e² of the tokens this row reads (0..t), not of later ones.
          const double sigma2 = prefix_enorm2[static_cast<size_t>(t)] / static_cast<double>(t + 1);
          attention_scores(L.query_row(h, t), L.key.slice(g), t + 1, d, 0, 1, s.data());
          softmax_row(s.data(), t + 1, p.data());
          std::fill(dout.begin(), dout.end(), 0.0);
          double pred = 0, sum_p2 = 0;
          for (int64_t j = 0; j <= t; ++j) {
            const double pj = p[static_cast<size_t>(j)];
            for (int64_t c2 = 0; c2 < d; ++c2) dout[static_cast<size_t>(c2)] += pj * e[j * d + c2];
            pred += pj * pj * enorm2[static_cast<size_t>(j)];
            sum_p2 += pj * pj;
          }
          double meas = 0;
          for (double x : dout) meas += x * x;
          c.measured += meas;
          c.predicted += pred;
          c.predicted_renyi2 += sum_p2 * sigma2;  // 2^(−H₂) = Σ p²
          c.measured_at[at] += meas;
          c.predicted_at[at] += pred;
          c.predicted_renyi2_at[at] += sum_p2 * sigma2;
          ++c.rows;
        }
    }
  if (c.rows) {
    c.measured /= static_cast<double>(c.rows);
    c.predicted /= static_cast<double>(c.rows);
    c.predicted_renyi2 /= static_cast<double>(c.rows);
  }
  return c;
}

FirstOrderCheck key_error_first_order(const Recording& rec, const Format& format, const std::vector<int64_t>& positions,
                                      uint64_t seed) {
  const int64_t T = rec.tokens, d = rec.head_dim;
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  FirstOrderCheck c;
  c.measured_at.assign(positions.size(), 0.0);
  c.predicted_at.assign(positions.size(), 0.0);
  std::vector<float> s(static_cast<size_t>(T));
  std::vector<double> p(static_cast<size_t>(T)), ds(static_cast<size_t>(T));
  for (int64_t l = 0; l < rec.num_layers(); ++l)
    for (int64_t g = 0; g < rec.kv_heads; ++g) {
      const std::vector<double> e = unit_error(rec, format, l, g, true, seed);
      const LayerTensors& L = rec.layers[static_cast<size_t>(l)];
      for (int64_t h = g * rec.group_size(); h < (g + 1) * rec.group_size(); ++h)
        for (size_t at = 0; at < positions.size(); ++at) {
          const int64_t t = positions[at];
          const float* q = L.query_row(h, t);
          attention_scores(L.query_row(h, t), L.key.slice(g), t + 1, d, 0, 1, s.data());
          softmax_row(s.data(), t + 1, p.data());
          // KL(p ‖ p̂) = log Σ p_j e^{Δs_j} − Σ p_j Δs_j, with a shift for range.
          double mean = 0, mean2 = 0, mx = -INFINITY;
          for (int64_t j = 0; j <= t; ++j) {
            double dot = 0;
            for (int64_t c2 = 0; c2 < d; ++c2) dot += static_cast<double>(q[c2]) * e[j * d + c2];
            ds[static_cast<size_t>(j)] = dot * inv_sqrt_d;
            mx = std::max(mx, ds[static_cast<size_t>(j)]);
          }
          double z = 0;
          for (int64_t j = 0; j <= t; ++j) {
            const double pj = p[static_cast<size_t>(j)], x = ds[static_cast<size_t>(j)];
            z += pj * std::exp(x - mx);
            mean += pj * x;
            mean2 += pj * x * x;
          }
          const double kl = std::max(0.0, std::log(z) + mx - mean), pred = 0.5 * (mean2 - mean * mean);
          c.measured += kl;
          c.predicted += pred;
          c.measured_at[at] += kl;
          c.predicted_at[at] += pred;
          ++c.rows;
        }
    }
  if (c.rows) {
    c.measured /= static_cast<double>(c.rows);
    c.predicted /= static_cast<double>(c.rows);
  }
  return c;
}

}  // namespace kvb::theory
