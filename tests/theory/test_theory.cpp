// Theory references (sim/theory/): Gaussian scalar quantizers against methods.md §5's
// tables and Shannon's bound, and the first-order attention-error predictions against
// exact errors.
#include <cmath>

#include "sim/formats/registry.h"
#include "sim/synthetic.h"
#include "sim/theory/first_order.h"
#include "sim/theory/gaussian.h"
#include "test_util.h"

using namespace kvb;
using namespace kvb::theory;

TEST_CASE("Lloyd-Max and best uniform quantizers of N(0,1) match the published MSE tables") {
  const double lloyd[] = {0.3634, 0.1175, 0.03454, 0.009497};
  const double uniform[] = {0.3634, 0.1188, 0.03744, 0.01154};
  for (int b = 1; b <= 4; ++b) {
    INFO("b = " << b);
    const ScalarQuantizer lm = lloyd_max_gaussian(b);
    CHECK(lm.levels.size() == (size_t{1} << b));
    CHECK(gaussian_mse(lm) == doctest::Approx(lloyd[b - 1]).epsilon(0.002));
    CHECK(gaussian_mse(uniform_quantizer(b, best_uniform_step(b))) == doctest::Approx(uniform[b - 1]).epsilon(0.002));
    // Symmetric codebooks, Shannon's bound below everything.
    CHECK(lm.levels.front() == doctest::Approx(-lm.levels.back()));
    CHECK(gaussian_mse(lm) > shannon_mse_bound(b));
    // The exact integral agrees with sampling.
    CHECK(sampled_mse(lm, 200000, 5) == doctest::Approx(gaussian_mse(lm)).epsilon(0.03));
  }
  // b = 1: levels ±sqrt(2/pi), MSE 1 − 2/pi.
  const ScalarQuantizer one = lloyd_max_gaussian(1);
  CHECK(one.levels[1] == doctest::Approx(std::sqrt(2 / M_PI)));
  CHECK(gaussian_mse(one) == doctest::Approx(1 - 2 / M_PI));
  CHECK(shannon_mse_bound(3) == 1.0 / 64);
  CHECK(normal_cdf(0) == 0.5);
  CHECK(one.quantize(-0.1) == one.levels[0]);
}

TEST_CASE("first-order attention-error predictions agree with the exact errors at small error") {
  SyntheticSpec s;
  s.seed = 3;
  s.layers = 1;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 32;
  s.tokens = 64;
  s.calibration_queries = 63;
  const Recording rec = generate_synthetic(s);
  std::vector<int64_t> pos;
  for (int64_t t = 1; t < rec.tokens; ++t) pos.push_back(t);
  const FormatPtr f = make_format("int6-asym-g32");
  const FirstOrderCheck v = value_error_first_order(rec, *f, pos, 0);
  CHECK(v.rows == 4 * 63);
  CHECK(v.measured > 0);
  CHECK(v.measured == doctest::Approx(v.predicted).epsilon(0.1));
  CHECK(v.predicted_renyi2 == doctest::Approx(v.predicted).epsilon(0.25));
  const FirstOrderCheck k = key_error_first_order(rec, *f, pos, 0);
  CHECK(k.measured > 0);
  CHECK(k.measured == doctest::Approx(k.predicted).epsilon(0.05));  // second order in Δs
  // An exact format has no error to predict.
  const FirstOrderCheck z = value_error_first_order(rec, *make_format("keep-fp32"), pos, 0);
  CHECK(z.measured == 0);
  CHECK(z.predicted == 0);
}

TEST_CASE("first-order value prediction: σ_e² comes from the tokens a row reads, not later ones") {
  SyntheticSpec s;
  s.seed = 4;
  s.layers = 1;
  s.q_heads = 2;
  s.kv_heads = 1;
  s.head_dim = 32;
  s.tokens = 48;
  s.calibration_queries = 47;
  const Recording rec = generate_synthetic(s);
  // At position 0 the row reads token 0 alone (p_0 = 1): Δo = e_0, so the measured
  // ‖Δo‖², the per-token prediction and the Rényi-2 one are all ‖e_0‖², per query head.
  const FirstOrderCheck v = value_error_first_order(rec, *make_format("int3-asym-g32"), {0, 1, 47}, 0);
  REQUIRE(v.measured_at[0] > 0);
  CHECK(v.predicted_at[0] == doctest::Approx(v.measured_at[0]).epsilon(1e-12));
  CHECK(v.predicted_renyi2_at[0] == doctest::Approx(v.measured_at[0]).epsilon(1e-12));
}
