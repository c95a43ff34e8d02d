// bench_sgemm: the attention-metric path's GEMM shapes (sim/core/sgemm.h) on the build's
// backend against the Eigen reference, in one process, interleaved, one thread.
//
//   build/bench/bench_sgemm [--head-dim D] [--tokens T] [--rounds N]
//
// Per row block (64 query rows, as SimOptions::row_block) against cols = 64, 128, ..., T
// keys: S = Q·Kᵀ ([64, D] x [cols, D]ᵀ, gemm_abt) and O += P·V ([64, cols] x [cols, D],
// gemm_ab), operands strided as the metric path's scratch is ([64, T] blocks). Each
// backend runs every shape once per round, rounds alternate the backends' order; a
// shape's time is its best round (on a shared machine the best is the steadier figure).
// Prints GFLOP/s per shape group and over the whole causal sweep of cols.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "sim/core/sgemm.h"

using namespace kvb;

namespace {

SgemmMatrix random_matrix(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  SgemmMatrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t d = 64, T = 512;
  int rounds = 20;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--head-dim") && i + 1 < argc) d = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::max(64, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_sgemm [--head-dim D] [--tokens T] [--rounds N]\n");
      return 2;
    }
  }
  const int64_t rows = 64;
  std::mt19937_64 rng(1);
  const SgemmMatrix Q = random_matrix(rows, d, rng), K = random_matrix(T, d, rng), V = random_matrix(T, d, rng);
  SgemmMatrix S(rows, T), P = random_matrix(rows, T, rng), O = SgemmMatrix::Zero(rows, d);
  std::vector<int64_t> cols_list;
  for (int64_t c = 64; c <= T; c += 64) cols_list.push_back(c);

  // best[backend][shape][0: S = Q·Kᵀ, 1: O += P·V] seconds.
  const int backends = sgemm_uses_blas() ? 2 : 1;
  std::vector<std::vector<std::array<double, 2>>> best(
      2, std::vector<std::array<double, 2>>(cols_list.size(), {1e30, 1e30}));
  for (int r = 0; r < rounds; ++r)
    for (int o = 0; o < backends; ++o) {
      const int b = (r + o) % backends;  // 0: the build's, 1: Eigen
      for (size_t i = 0; i < cols_list.size(); ++i) {
        const int64_t c = cols_list[i];
        auto t0 = std::chrono::steady_clock::now();
        if (b == 0) gemm_abt(Q, K.topRows(c), S.leftCols(c));
        else gemm_abt_eigen(Q, K.topRows(c), S.leftCols(c));
        best[b][i][0] = std::min(best[b][i][0], seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        if (b == 0) gemm_ab(P.leftCols(c), V.topRows(c), O, GemmOutput::Accumulate);
        else gemm_ab_eigen(P.leftCols(c), V.topRows(c), O, GemmOutput::Accumulate);
        best[b][i][1] = std::min(best[b][i][1], seconds_since(t0));
      }
    }
  std::printf("sgemm backend: %s; row block %lld x head_dim %lld, cols 64..%lld, best of %d rounds, 1 thread\n",
              sgemm_backend(), static_cast<long long>(rows), static_cast<long long>(d), static_cast<long long>(T),
              rounds);
  std::printf("%-8s %22s %22s\n", "cols", "S = Q*K^T GFLOP/s", "O += P*V GFLOP/s");
  std::printf("%-8s %11s %10s %11s %10s\n", "", "backend", "Eigen", "backend", "Eigen");
  const int eigen = backends - 1;
  double total_flops = 0, total[2][2] = {{0, 0}, {0, 0}};
  for (size_t i = 0; i < cols_list.size(); ++i) {
    const double flops = 2.0 * static_cast<double>(rows * d * cols_list[i]);
    total_flops += flops;
    for (int b = 0; b < 2; ++b)
      for (int p = 0; p < 2; ++p) total[b][p] += best[b == 0 ? 0 : eigen][i][p];
    if (cols_list.size() <= 16 || i % (cols_list.size() / 8) == 0 || i + 1 == cols_list.size())
      std::printf("%-8lld %11.1f %10.1f %11.1f %10.1f\n", static_cast<long long>(cols_list[i]),
                  flops / best[0][i][0] * 1e-9, flops / best[eigen][i][0] * 1e-9, flops / best[0][i][1] * 1e-9,
                  flops / best[eigen][i][1] * 1e-9);
  }
  std::printf("%-8s %11.1f %10.1f %11.1f %10.1f   (the causal sweep: every cols once)\n", "all",
              total_flops / total[0][0] * 1e-9, total_flops / total[1][0] * 1e-9, total_flops / total[0][1] * 1e-9,
              total_flops / total[1][1] * 1e-9);
  return 0;
}
