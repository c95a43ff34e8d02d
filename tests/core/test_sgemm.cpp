// The fp32 products of sim/core/sgemm.h: the build's backend (OpenBLAS or Eigen) and the
// Eigen reference, each against a double-precision triple loop within fp32's error bound,
// on random shapes and strided blocks; identical results from one thread and from two
// threads calling at once.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "sim/core/error.h"
#include "sim/core/sgemm.h"
#include "test_util.h"

namespace {

using kvb::GemmOutput;
using kvb::SgemmIn;
using kvb::SgemmMatrix;
using kvb::SgemmOut;
using Product = void (*)(const SgemmIn&, const SgemmIn&, SgemmOut, GemmOutput);

struct Backend {
  const char* name;
  Product abt, ab;
};
const Backend kBackends[] = {{"build's (sgemm_backend())", kvb::gemm_abt, kvb::gemm_ab},
                             {"Eigen reference", kvb::gemm_abt_eigen, kvb::gemm_ab_eigen}};

// A random [rows, cols] matrix, uniform in [-1, 1).
SgemmMatrix random_matrix(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  SgemmMatrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

// One product's operands, each the [rows, cols] block at (1, 2) of a larger parent when
// `strided` (outer stride > cols, and C's neighbours must stay untouched).
struct Case {
  int64_t m, n, k;
  bool transposed_b, strided;
  GemmOutput out;
  SgemmMatrix A_parent, B_parent, C_parent;
  int64_t off_r = 0, off_c = 0;

  Case(int64_t m_, int64_t n_, int64_t k_, bool tb, bool strided_, GemmOutput out_, std::mt19937_64& rng)
      : m(m_), n(n_), k(k_), transposed_b(tb), strided(strided_), out(out_) {
    const int64_t pad = strided ? 3 : 0;
    off_r = strided ? 1 : 0;
    off_c = strided ? 2 : 0;
    A_parent = random_matrix(m + pad, k + pad, rng);
    B_parent = tb ? random_matrix(n + pad, k + pad, rng) : random_matrix(k + pad, n + pad, rng);
    C_parent = random_matrix(m + pad, n + pad, rng);
    if (out == GemmOutput::Overwrite) C_parent.block(off_r, off_c, m, n).setConstant(std::nanf(""));
  }
  Eigen::Block<const SgemmMatrix> A() const { return A_parent.block(off_r, off_c, m, k); }
  Eigen::Block<const SgemmMatrix> B() const {
    return transposed_b ? B_parent.block(off_r, off_c, n, k) : B_parent.block(off_r, off_c, k, n);
  }
  std::string describe() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           (transposed_b ? " A*B^T" : " A*B") + (strided ? " strided" : " contiguous") +
           (out == GemmOutput::Accumulate ? " accumulate" : " overwrite");
  }
};

// Runs the case's product into a copy of C_parent.
SgemmMatrix run(const Case& c, const Backend& b) {
  SgemmMatrix C = c.C_parent;
  auto Cb = C.block(c.off_r, c.off_c, c.m, c.n);
  (c.transposed_b ? b.abt : b.ab)(c.A(), c.B(), Cb, c.out);
  return C;
}

// The worst |C - exact| / bound over the block (<= 1 passes), where exact and the bound
// come from a double triple loop: bound = (k + 2)·2^-24·(|C0| + Σ|a||b|), fp32's
// worst-case error of a k-term dot product added to C0. Also requires the parent's
// entries outside the block to be untouched.
double worst_error_ratio(const Case& c, const SgemmMatrix& C) {
  const double eps = std::numeric_limits<float>::epsilon() / 2;
  double worst = 0;
  const auto A = c.A();
  const auto B = c.B();
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      const double c0 = c.out == GemmOutput::Accumulate ? c.C_parent(c.off_r + i, c.off_c + j) : 0.0;
      double exact = c0, magnitude = std::fabs(c0);
      for (int64_t p = 0; p < c.k; ++p) {
        const double a = A(i, p), b = c.transposed_b ? B(j, p) : B(p, j);
        exact += a * b;
        magnitude += std::fabs(a * b);
      }
      const double bound = static_cast<double>(c.k + 2) * eps * magnitude + 1e-30;
      worst = std::max(worst, std::fabs(C(c.off_r + i, c.off_c + j) - exact) / bound);
      if (std::isnan(C(c.off_r + i, c.off_c + j))) return INFINITY;
    }
  for (int64_t i = 0; i < C.rows(); ++i)
    for (int64_t j = 0; j < C.cols(); ++j) {
      const bool inside = i >= c.off_r && i < c.off_r + c.m && j >= c.off_c && j < c.off_c + c.n;
      if (!inside && C(i, j) != c.C_parent(i, j)) return INFINITY;
    }
  return worst;
}

// Random shapes in [1, 600] (most small, as the metric path's row blocks; some large),
// plus the metric path's own: 64 rows x head_dim 64 against 64..512 keys.
std::vector<Case> random_cases(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> small(1, 80), large(1, 600);
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i) {
    const bool big = i % 8 == 7;
    const int64_t m = big ? large(rng) : small(rng), n = big ? large(rng) : small(rng), k = big ? large(rng) : small(rng);
    cases.emplace_back(m, n, k, i % 2 == 0, i % 3 != 0, i % 4 < 2 ? GemmOutput::Overwrite : GemmOutput::Accumulate, rng);
  }
  for (int64_t cols : {64, 65, 192, 512}) {
    cases.emplace_back(64, cols, 64, true, true, GemmOutput::Overwrite, rng);  // S = Q·Kᵀ
    cases.emplace_back(64, 64, cols, false, true, GemmOutput::Accumulate, rng);  // O += P·V
  }
  cases.emplace_back(600, 600, 600, false, false, GemmOutput::Overwrite, rng);
  cases.emplace_back(1, 1, 1, true, false, GemmOutput::Accumulate, rng);
  cases.emplace_back(1, 600, 1, false, true, GemmOutput::Overwrite, rng);
  return cases;
}

}  // namespace

TEST_CASE("sgemm: both backends match a double triple loop within fp32's error bound") {
  MESSAGE("sgemm backend: " << std::string(kvb::sgemm_backend()));
  // OpenBLAS is set to one thread before its first product: this thread's OpenMP
  // thread count must not change with it.
  const int omp_threads = omp_get_max_threads();
  const uint64_t seed = 20261127;
  for (const Backend& b : kBackends) {
    double worst = 0;
    std::string worst_case;
    for (const Case& c : random_cases(seed, 48)) {
      const double ratio = worst_error_ratio(c, run(c, b));
      if (ratio > worst) {
        worst = ratio;
        worst_case = c.describe();
      }
      INFO(std::string(b.name) << ", " << c.describe() << ", seed " << seed);
      REQUIRE(ratio <= 1.0);
    }
    CHECK(omp_get_max_threads() == omp_threads);
    MESSAGE(std::string(b.name) << ": worst error " << worst << " of fp32's bound (" << worst_case << ")");
  }
}

TEST_CASE("sgemm: empty products") {
  SgemmMatrix A(3, 0), B(4, 0), C = SgemmMatrix::Constant(3, 4, 7.0f), Bab(0, 4);
  for (const Backend& b : kBackends) {
    INFO(std::string(b.name));
    b.abt(A, B, C, GemmOutput::Accumulate);
    CHECK((C.array() == 7.0f).all());
    b.ab(A, Bab, C, GemmOutput::Accumulate);
    CHECK((C.array() == 7.0f).all());
    b.abt(A, B, C, GemmOutput::Overwrite);
    CHECK((C.array() == 0.0f).all());
    C.setConstant(7.0f);
    SgemmMatrix none(0, 4);
    b.ab(SgemmMatrix(0, 5), SgemmMatrix(5, 4), none, GemmOutput::Overwrite);
  }
}

TEST_CASE("sgemm: shapes that do not fit throw, naming them") {
  SgemmMatrix A(3, 5), B(4, 6), C(3, 4);
  for (const Backend& b : kBackends) {
    INFO(std::string(b.name));
    CHECK_THROWS_WITH_AS(b.abt(A, B, C, GemmOutput::Overwrite),
                         doctest::Contains("shapes do not fit: A [3, 5], B [4, 6], C [3, 4]"), kvb::Error);
    CHECK_THROWS_AS(b.ab(A, B, C, GemmOutput::Overwrite), kvb::Error);
  }
}

TEST_CASE("sgemm: identical results from one thread and from two threads at once") {
  const std::vector<Case> cases = random_cases(7, 40);
  for (const Backend& b : kBackends) {
    INFO(std::string(b.name));
    std::vector<SgemmMatrix> one(cases.size()), two(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) one[i] = run(cases[i], b);
    for (int round = 0; round < 3; ++round) {
#pragma omp parallel for num_threads(2) schedule(dynamic, 1)
      for (int64_t i = 0; i < static_cast<int64_t>(cases.size()); ++i)
        two[static_cast<size_t>(i)] = run(cases[static_cast<size_t>(i)], b);
      for (size_t i = 0; i < cases.size(); ++i) {
        INFO(cases[i].describe() << ", round " << round);
        // Bitwise: the NaN-free results compare equal element by element.
        REQUIRE(one[i].cwiseEqual(two[i]).all());
      }
    }
  }
}

TEST_CASE("sgemm: the backend names itself") {
  const std::string name = kvb::sgemm_backend();
  CHECK(name.rfind(kvb::sgemm_uses_blas() ? "OpenBLAS " : "Eigen ", 0) == 0);
}

// OpenBLAS's own setter, when the process has it (the build's backend is OpenBLAS).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

TEST_CASE("BlasCallScope: one thread per product inside, the count it found put back after the last") {
  if (kvb::sgemm_uses_blas() && openblas_set_num_threads != nullptr) openblas_set_num_threads(2);
  const int before = kvb::blas_threads();
  SgemmMatrix a = SgemmMatrix::Random(40, 30), b = SgemmMatrix::Random(50, 30), c(40, 50);
  {
    const kvb::BlasCallScope outer;
    CHECK(kvb::blas_threads() == 1);
    {
      const kvb::BlasCallScope inner;
      kvb::gemm_abt(a, b, c);
      CHECK(kvb::blas_threads() == 1);
    }
    CHECK(kvb::blas_threads() == 1);  // the outer one still lives
  }
  CHECK(kvb::blas_threads() == before);
  CHECK(c.isApprox(SgemmMatrix(a * b.transpose()), 1e-5f));
}
