// sgemm.h: the products by OpenBLAS's cblas_sgemm when the build defines
// KVB_HAVE_OPENBLAS (this file only: CMake option KVB_BLAS), by Eigen otherwise.
#include "sim/core/sgemm.h"

#include <algorithm>
#include <climits>
#include <string>

#include "sim/core/error.h"

#ifdef KVB_HAVE_OPENBLAS
#include <cblas.h>  // OpenBLAS's own (its include directory, not /usr/include's netlib one)
#include <omp.h>

#include <atomic>
#include <mutex>
#endif

namespace kvb {

namespace {

std::string shape(const char* name, Eigen::Index rows, Eigen::Index cols) {
  return std::string(name) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

// Throws unless A [m, k], B (B [n, k] when transposed_b, else [k, n]) and C [m, n] fit.
void check_shapes(const char* op, const SgemmIn& A, const SgemmIn& B, const SgemmOut& C, bool transposed_b) {
  const Eigen::Index b_inner = transposed_b ? B.cols() : B.rows(), b_outer = transposed_b ? B.rows() : B.cols();
  if (A.cols() != b_inner || C.rows() != A.rows() || C.cols() != b_outer)
    throw Error(std::string(op) + ": shapes do not fit: " + shape("A", A.rows(), A.cols()) + ", " +
                shape("B", B.rows(), B.cols()) + ", " + shape("C", C.rows(), C.cols()));
}

#ifdef KVB_HAVE_OPENBLAS

// OpenBLAS's thread count, keeping this thread's OpenMP setting: an OpenMP build of
// OpenBLAS also sets omp_set_num_threads (it syncs the two).
void set_openblas_threads(int n) {
  const int omp_threads = omp_get_max_threads();
  openblas_set_num_threads(n);
  omp_set_num_threads(omp_threads);
}

// BlasCallScope's state: how many live, and the count the first one found.
std::mutex scope_mutex;
std::atomic<int> scope_depth{0};
int threads_before_scopes = 1;

// OpenBLAS on the calling thread alone. Outside every BlasCallScope: set once, for good,
// before the first product.
void openblas_one_thread_per_call() {
  if (scope_depth.load() > 0) return;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::lock_guard<std::mutex> lock(scope_mutex);
    if (scope_depth.load() == 0) set_openblas_threads(1);
  });
}

// A leading dimension or size as cblas takes it (int: 32-bit blasint).
blasint blas_int(Eigen::Index v, const char* op, const char* what) {
  if (v > INT_MAX) throw Error(std::string(op) + ": " + what + " " + std::to_string(v) + " exceeds the BLAS's int range");
  return static_cast<blasint>(v);
}

// The row stride of a [rows, cols] operand as cblas wants it (>= max(1, cols); a single
// row's stride is never read).
template <class M>
blasint leading_dim(const M& m, const char* op) {
  const Eigen::Index ld = m.rows() > 1 ? m.outerStride() : std::max<Eigen::Index>(m.outerStride(), m.cols());
  return blas_int(std::max<Eigen::Index>(ld, 1), op, "leading dimension");
}

// Products of fewer rows run on Eigen: OpenBLAS packs its operands for every call, which
// costs more than it saves on a few rows (greedy decoding, one row a step, ran at half
// the speed).
constexpr Eigen::Index kBlasMinRows = 8;

void blas_sgemm(const char* op, const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out, bool transposed_b) {
  check_shapes(op, A, B, C, transposed_b);
  if (C.rows() == 0 || C.cols() == 0) return;
  if (A.cols() == 0) {  // an empty sum
    if (out == GemmOutput::Overwrite) C.setZero();
    return;
  }
  if (C.rows() < kBlasMinRows) {  // a GEMV-shaped product (a decoding step): Eigen's is faster
    if (transposed_b) gemm_abt_eigen(A, B, C, out);
    else gemm_ab_eigen(A, B, C, out);
    return;
  }
  openblas_one_thread_per_call();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transposed_b ? CblasTrans : CblasNoTrans, blas_int(C.rows(), op, "m"),
              blas_int(C.cols(), op, "n"), blas_int(A.cols(), op, "k"), 1.0f, A.data(), leading_dim(A, op), B.data(),
              leading_dim(B, op), out == GemmOutput::Accumulate ? 1.0f : 0.0f, C.data(), leading_dim(C, op));
}

std::string openblas_name() {
  // openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64".
  const std::string config = openblas_get_config();
  const size_t version_end = config.find(' ', config.find(' ') + 1);
  const int parallel = openblas_get_parallel();  // 0 serial, 1 pthreads, 2 OpenMP
  const char* variant = parallel == 0 ? "openblas-serial" : parallel == 1 ? "openblas-pthread" : "openblas-openmp";
  return config.substr(0, version_end) + " (" + variant + ", " + openblas_get_corename() + " kernels)";
}

#endif

}  // namespace

void gemm_abt_eigen(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out) {
  check_shapes("gemm_abt_eigen", A, B, C, true);
  if (out == GemmOutput::Overwrite) C.noalias() = A * B.transpose();
  else C.noalias() += A * B.transpose();
}

void gemm_ab_eigen(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out) {
  check_shapes("gemm_ab_eigen", A, B, C, false);
  if (out == GemmOutput::Overwrite) C.noalias() = A * B;
  else C.noalias() += A * B;
}

#ifdef KVB_HAVE_OPENBLAS

void gemm_abt(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out) {
  blas_sgemm("gemm_abt", A, B, C, out, true);
}
void gemm_ab(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out) {
  blas_sgemm("gemm_ab", A, B, C, out, false);
}
const char* sgemm_backend() {
  static const std::string name = openblas_name();
  return name.c_str();
}
bool sgemm_uses_blas() { return true; }

BlasCallScope::BlasCallScope() {
  const std::lock_guard<std::mutex> lock(scope_mutex);
  if (scope_depth.load() == 0) {
    threads_before_scopes = openblas_get_num_threads();
    set_openblas_threads(1);
  }
  scope_depth.fetch_add(1);
}
BlasCallScope::~BlasCallScope() {
  const std::lock_guard<std::mutex> lock(scope_mutex);
  if (scope_depth.fetch_sub(1) == 1) set_openblas_threads(threads_before_scopes);
}
int blas_threads() { return openblas_get_num_threads(); }

#else

void gemm_abt(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out) { gemm_abt_eigen(A, B, C, out); }
void gemm_ab(const SgemmIn& A, const SgemmIn& B, SgemmOut C, GemmOutput out) { gemm_ab_eigen(A, B, C, out); }
const char* sgemm_backend() {
  static const std::string name = "Eigen " + std::to_string(EIGEN_WORLD_VERSION) + "." +
                                  std::to_string(EIGEN_MAJOR_VERSION) + "." + std::to_string(EIGEN_MINOR_VERSION);
  return name.c_str();
}
bool sgemm_uses_blas() { return false; }

BlasCallScope::BlasCallScope() = default;
BlasCallScope::~BlasCallScope() = default;
int blas_threads() { return 1; }

#endif

}  // namespace kvb
