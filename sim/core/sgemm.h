// Row-major fp32 matrix products of the attention-metric path (Q·Kᵀ, P·V) and of the
// forward pass's dense layers, run by an optimised BLAS when the build found one
// (OpenBLAS, CMake option KVB_BLAS), by Eigen otherwise and for products of fewer than 8
// rows (a decoding step's: OpenBLAS's packing costs more there). The Eigen versions
// (*_eigen) are always built: they are the plain reference the BLAS one is tested
// against (tests/core/test_sgemm.cpp).
//
// Operands are row-major blocks of any outer stride (a matrix, a Map, a topRows() or
// topLeftCorner() of one): row r of a [rows, cols] operand starts at data() + r·outerStride().
// C must not overlap A or B. Shapes that do not fit throw kvb::Error naming them.
//
// Results do not depend on the thread that calls nor on how many call at once: OpenBLAS
// runs each call on its calling thread alone (openblas_set_num_threads(1), set once
// before the first call), as Eigen does here (EIGEN_DONT_PARALLELIZE). Both backends
// give the same result for the same shapes on every call; they differ from each other
// by fp32 rounding (the order of the sums).
#pragma once
#include <Eigen/Core>

namespace kvb {

using SgemmMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using SgemmIn = Eigen::Ref<const SgemmMatrix, 0, Eigen::OuterStride<>>;  // [rows, cols], row-major
using SgemmOut = Eigen::Ref<SgemmMatrix, 0, Eigen::OuterStride<>>;       // [rows, cols], row-major

// Whether a product replaces C or adds to it.
enum class GemmOutput { Overwrite, Accumulate };

// C = A·Bᵀ (or C += A·Bᵀ): A [m, k], B [n, k], C [m, n].
void gemm_abt(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out = GemmOutput::Overwrite);
// C = A·B (or C += A·B): A [m, k], B [k, n], C [m, n].
void gemm_ab(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out = GemmOutput::Overwrite);

// The same products by Eigen (.noalias()), whatever the build uses.
void gemm_abt_eigen(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out = GemmOutput::Overwrite);
void gemm_ab_eigen(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out = GemmOutput::Overwrite);

// What gemm_abt / gemm_ab run on: "OpenBLAS 0.3.21 (openblas-pthread, Zen kernels)" or "Eigen 3.4.0".
const char* sgemm_backend();
// Whether that is a BLAS (false: the Eigen products).
bool sgemm_uses_blas();

// OpenBLAS's thread count is one setting for the whole process, shared with anything
// else that loaded the same library (NumPy in a Python process). A product called outside
// any BlasCallScope sets it to 1 for good (the CLI's and the C++ programs' case). While a
// BlasCallScope lives, products run on one thread and nothing is set for good: when the
// last scope ends, the count it found is put back (the Python package wraps every call
// into the engine in one, so NumPy's BLAS keeps its threads). Results do not depend on it
// either way. Without OpenBLAS these do nothing.
class BlasCallScope {
 public:
  BlasCallScope();
  ~BlasCallScope();
  BlasCallScope(const BlasCallScope&) = delete;
  BlasCallScope& operator=(const BlasCallScope&) = delete;
};
// OpenBLAS's thread count now (1 without OpenBLAS).
int blas_threads();

}  // namespace kvb
