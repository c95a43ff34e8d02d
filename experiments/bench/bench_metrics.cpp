// bench_metrics: the attention-metric path against the NumPy peer a researcher would
// write (experiments/bench/peer_numpy.py), side by side in one run, and against the
// machine's sgemm rate.
//
//   build/bench/bench_metrics [--recording PATH] [--repeats N] [--rounds R] [--python PY]
//                             [--no-peer] [--markdown]
//                             [--profile N]  (only the fast 1-thread points, N times each: for perf)
//
// 1. gpt2-bytes, every position, every attention metric (top-k 8): one sweep point per
//    uniform format, on 1 thread and on all threads (a point's (layer, KV head) tasks in
//    parallel, as a sweep runs them), the exact pass computed once beforehand
//    (ExactAttentionCache) and timed on its own; the plain fp64 reference path timed
//    too. The NumPy peer runs the same points (quantizing in NumPy, exact pass once)
//    with OPENBLAS_NUM_THREADS=1 and =2; the metrics of both are compared. kvbudget's
//    points and the peer's alternate in R rounds (default 3), each round's speed-up from
//    its own timings; the median and the lowest over the rounds are printed.
// 2. A synthetic 4096-token, head_dim-128 recording: the metric path's rate in GFLOP/s
//    (the GEMM work the fast path needs per point: Δs = Q·ΔKᵀ, (P̂ - P)·V and P̂·ΔV
//    over the causal pairs, 3 · 2·d per pair) against the machine's sgemm rate on 1024³
//    in the same process, one thread: the faster of Eigen's and the metric path's own
//    backend (sim/core/sgemm.h: OpenBLAS when the build has it).
// Times are best of N; wall and CPU seconds both (on a shared machine the CPU time of a
// one-thread run is the steadier figure). Figures go to experiments/bench/RESULTS.md.
#include <omp.h>
#include <sys/resource.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "experiments/machine_info.h"
#include "kvb/build_config.h"
#include "sim/core/allocator.h"
#include "sim/core/sgemm.h"
#include "sim/exact_attention.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"
#include "sim/synthetic.h"

using namespace kvb;

namespace {

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Timing {
  double wall = 1e30, cpu = 1e30;
};

// Best wall and CPU seconds of `repeats` calls of f.
template <class F>
Timing best_of(int repeats, F f) {
  Timing t;
  for (int r = 0; r < repeats; ++r) {
    const double c0 = process_cpu_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    f();
    t.wall = std::min(t.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count());
    t.cpu = std::min(t.cpu, process_cpu_seconds() - c0);
  }
  return t;
}

// One point as a sweep's tasks measure it (experiments/sweep.cpp): on one thread a task
// per layer; on more, a task per (layer, KV head), in parallel, merged in task order.
ErrorStats measure_point(const Recording& rec, const Plan& plan, const SimOptions& opt) {
  const int64_t layers = rec.num_layers(), per_layer = omp_get_max_threads() > 1 ? rec.kv_heads : 1;
  std::vector<ErrorStats> parts(static_cast<size_t>(layers * per_layer));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < layers * per_layer; ++t)
    parts[static_cast<size_t>(t)] = per_layer > 1 ? simulate_kv_head(rec, plan, t / per_layer, t % per_layer, opt)
                                                  : simulate_layer(rec, plan, t, opt);
  return ErrorStats::merged_in_groups(parts.data(), static_cast<size_t>(layers), static_cast<size_t>(per_layer));
}

const std::vector<std::string> kAttentionMetrics = {
    "k_rel_mse",    "v_rel_mse",        "logit_rmse",           "logit_err_max",   "attn_kl_mean", "attn_kl_p99",
    "attn_kl_max",  "topk_overlap",     "attn_out_rel_err",     "attn_out_rel_err_p99", "attn_out_rel_fro"};

double load_average() {
  std::ifstream f("/proc/loadavg");
  double a = 0;
  f >> a;
  return a;
}

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

// Runs the NumPy peer; empty json on failure (reported).
nlohmann::json run_peer(const std::string& python, const std::string& recording, const std::string& formats,
                        int threads, int repeats, const std::string& blas_env) {
  const std::string script = std::string(KVB_SOURCE_DIR) + "/experiments/bench/peer_numpy.py";
  const std::string cmd = blas_env + " OPENBLAS_NUM_THREADS=" + std::to_string(threads) +
                          " OMP_NUM_THREADS=" + std::to_string(threads) + " " + python + " " + shell_quote(script) +
                          " " + shell_quote(recording) + " --formats " + formats + " --repeats " +
                          std::to_string(repeats);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return {};
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe.get())) out.append(buf.data(), n);
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_metrics: the NumPy peer failed (%s): %s\n", cmd.c_str(), e.what());
    return {};
  }
}

// sgemm on 1024³, one thread, by Eigen and by the metric path's backend (sim/core/sgemm.h:
// OpenBLAS when the build has it): GFLOP/s by wall and by CPU time.
struct SgemmRate {
  double eigen_wall, eigen_cpu, backend_wall, backend_cpu;
  // The machine's rate: the faster of the two.
  double best_wall() const { return std::max(eigen_wall, backend_wall); }
  double best_cpu() const { return std::max(eigen_cpu, backend_cpu); }
};
SgemmRate sgemm_gflops(int repeats) {
  const int n = 1024;
  SgemmMatrix a = SgemmMatrix::Random(n, n), b = SgemmMatrix::Random(n, n), c(n, n);
  const double flops = 2.0 * n * n * static_cast<double>(n);
  const Timing e = best_of(repeats, [&] { c.noalias() = a * b; });
  const Timing k = best_of(repeats, [&] { gemm_ab(a, b, c); });
  return {flops / e.wall * 1e-9, flops / e.cpu * 1e-9, flops / k.wall * 1e-9, flops / k.cpu * 1e-9};
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = std::string(KVB_SOURCE_DIR) + "/data/records/gpt2-bytes-record.safetensors";
  std::string python = "/usr/bin/python3";
  int repeats = 3;
  bool markdown = false, peer = true;
  int rounds = 3;   // kvbudget's points and the peer's, alternately
  int profile = 0;  // > 0: only the fast points on one thread, this many times each (for perf)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--recording") && i + 1 < argc) path = argv[++i];
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--python") && i + 1 < argc) python = argv[++i];
    else if (!std::strcmp(argv[i], "--no-peer")) peer = false;
    else if (!std::strcmp(argv[i], "--markdown")) markdown = true;
    else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) profile = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: bench_metrics [--recording PATH] [--repeats N] [--rounds R] [--python PY] [--no-peer] [--markdown] [--profile N]\n");
      return 2;
    }
  }
  keep_freed_memory();  // as the CLI does
  const int max_threads = omp_get_num_procs();
  std::printf("CPU: %s, %d threads; load average %.2f at the start\n", cpu_model().c_str(), max_threads, load_average());
  std::printf("attention-metric GEMMs (sim/core/sgemm.h): %s\n", sgemm_backend());

  // 1. gpt2-bytes, every position.
  RecordingSpec rs;
  rs.path = path;
  const Recording rec = load_recording(rs);
  std::printf("recording: %s (%s)\n\n", rec.name.c_str(), rec.summary().c_str());
  const std::vector<std::string> formats = {"int4-asym-g32", "int2-sym-g64", "int2-asym-ch32", "int8-sym-g32"};
  SimOptions opt;
  opt.topk = 8;
  omp_set_num_threads(max_threads);
  Timing exact_time;
  std::unique_ptr<ExactAttentionCache> cache;
  exact_time = best_of(1, [&] { cache = std::make_unique<ExactAttentionCache>(rec, opt, size_t(1) << 30); });
  std::printf("exact pass (once per run, %d threads): %.3f s wall, %.1f MB cached\n", max_threads, exact_time.wall,
              static_cast<double>(cache->bytes()) / 1e6);
  SimOptions cached = opt;
  cached.exact = cache.get();
  SimOptions reference = opt;
  reference.reference = true;

  // kvbudget's points and the peer's alternate, round by round: each round's speed-up
  // compares timings taken seconds apart (a round is about 25 s on the dev VM), so a
  // change in the machine's speed during the run moves both sides of a ratio (the VM's
  // speed drifts by 15-20 %).
  std::vector<Plan> plans;
  for (const std::string& f : formats)
    plans.push_back(UniformStrategy(make_format(f), make_format(f)).build({rec, 0}));
  // Seconds per point of each format: the best of `repeats` point runs on `threads`.
  auto time_points = [&](int threads, int n, std::vector<ErrorStats>* stats) {
    std::vector<Timing> t;
    omp_set_num_threads(threads);
    for (size_t i = 0; i < plans.size(); ++i) {
      ErrorStats s;
      t.push_back(best_of(n, [&] { s = measure_point(rec, plans[i], cached); }));
      if (stats) stats->push_back(std::move(s));
    }
    return t;
  };
  // The mean over the formats of one field of their timings (&Timing::wall or ::cpu).
  auto mean_of = [](const std::vector<Timing>& t, double Timing::*field) {
    double sum = 0;
    for (const Timing& x : t) sum += x.*field;
    return sum / static_cast<double>(t.size());
  };
  auto mean_wall = [&](const std::vector<Timing>& t) { return mean_of(t, &Timing::wall); };
  auto mean_cpu = [&](const std::vector<Timing>& t) { return mean_of(t, &Timing::cpu); };
  if (profile > 0) {
    const std::vector<Timing> t = time_points(1, profile, nullptr);
    for (size_t i = 0; i < formats.size(); ++i)
      std::printf("%-16s %10.1f ms (best of %d, 1 thread)\n", formats[i].c_str(), t[i].wall * 1e3, profile);
    return 0;
  }

  // Round 1 also gives the metrics compared with the peer's, and the fp64 reference's time.
  std::vector<ErrorStats> stats;
  std::vector<Timing> fast1 = time_points(1, repeats, &stats), fastn = time_points(max_threads, repeats, nullptr);
  std::vector<Timing> ref1;
  omp_set_num_threads(1);
  for (const Plan& plan : plans) ref1.push_back(best_of(1, [&] { (void)measure_point(rec, plan, reference); }));
  std::printf("round 1, every point best of %d:\n", repeats);
  std::printf("%-16s %12s %12s %12s %14s\n", "point (uniform)", "fast 1 thr", "fast all", "fp64 ref 1", "(CPU s, 1 thr)");
  for (size_t i = 0; i < formats.size(); ++i)
    std::printf("%-16s %10.1f ms %10.1f ms %10.1f ms %11.1f ms\n", formats[i].c_str(), fast1[i].wall * 1e3,
                fastn[i].wall * 1e3, ref1[i].wall * 1e3, fast1[i].cpu * 1e3);
  std::printf("%-16s %10.1f ms %10.1f ms %10.1f ms %11.1f ms\n\n", "mean", mean_wall(fast1) * 1e3,
              mean_wall(fastn) * 1e3, mean_wall(ref1) * 1e3, mean_cpu(fast1) * 1e3);

  struct Round {
    double fast1, fast1_cpu, fastn, peer1, peer1_cpu, peer2;
  };
  std::vector<Round> done;
  std::string fmts;
  for (const std::string& f : formats) fmts += (fmts.empty() ? "" : ",") + f;
  for (int round = 1; peer && round <= rounds; ++round) {
    if (round > 1) {
      fast1 = time_points(1, repeats, nullptr);
      fastn = time_points(max_threads, repeats, nullptr);
    }
    const nlohmann::json p1 = run_peer(python, path, fmts, 1, repeats, "");
    const nlohmann::json p2 = run_peer(python, path, fmts, 2, repeats, "");
    if (p1.is_null() || p2.is_null()) break;
    Round r{mean_wall(fast1), mean_cpu(fast1), mean_wall(fastn), 0, 0, 0};
    const double n = static_cast<double>(formats.size());
    for (const std::string& f : formats) {
      r.peer1 += p1["points"][f]["seconds"].get<double>() / n;
      r.peer1_cpu += p1["points"][f]["cpu_seconds"].get<double>() / n;
      r.peer2 += p2["points"][f]["seconds"].get<double>() / n;
    }
    if (round == 1) {
      std::printf("NumPy peer (float64, %s): exact pass %.3f s (1 thread)\n", p1["blas"].dump().c_str(),
                  p1["exact_seconds"].get<double>());
      double worst = 0;
      std::string worst_what;
      for (size_t i = 0; i < formats.size(); ++i)
        for (const std::string& m : kAttentionMetrics) {
          const double theirs = p1["points"][formats[i]]["metrics"][m].get<double>();
          const double ours = find_metric(m)->compute(stats[i]);
          const double rel = std::fabs(theirs - ours) / std::max(std::fabs(theirs), 1e-30);
          if (rel > worst) {
            worst = rel;
            worst_what = formats[i] + " " + m + ": " + std::to_string(ours) + " vs " + std::to_string(theirs);
          }
        }
      std::printf("largest metric difference against the peer: %.2e relative (%s)\n\n", worst, worst_what.c_str());
    }
    std::printf("round %d: per point, mean of the %zu formats, each best of %d: kvbudget %.1f ms on 1 thread, "
                "%.1f ms on %d; NumPy %.1f ms on 1 thread, %.1f ms on 2 (CPU s on 1 thread: %.1f / %.1f ms) -> "
                "%.1fx on 1 thread (%.1fx in CPU time), %.1fx on %d threads; kvbudget 1 -> %d threads %.2fx\n",
                round, formats.size(), repeats, r.fast1 * 1e3, r.fastn * 1e3, max_threads, r.peer1 * 1e3,
                r.peer2 * 1e3, r.fast1_cpu * 1e3, r.peer1_cpu * 1e3, r.peer1 / r.fast1, r.peer1_cpu / r.fast1_cpu,
                r.peer2 / r.fastn, max_threads, max_threads, r.fast1 / r.fastn);
    std::fflush(stdout);
    done.push_back(r);
  }
  if (!done.empty()) {
    auto median_of = [&](auto get) {
      std::vector<double> v;
      for (const Round& r : done) v.push_back(get(r));
      std::sort(v.begin(), v.end());
      const size_t m = v.size() / 2;
      return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
    };
    auto lowest_of = [&](auto get) {
      double lo = 1e30;
      for (const Round& r : done) lo = std::min(lo, get(r));
      return lo;
    };
    auto one = [](const Round& r) { return r.peer1 / r.fast1; };
    auto many = [](const Round& r) { return r.peer2 / r.fastn; };
    std::printf("\nkvbudget / NumPy speed-up over %zu rounds: median %.1fx on 1 thread (lowest %.1fx), median %.1fx "
                "on %d threads against NumPy on 2 (lowest %.1fx)\n\n",
                done.size(), median_of(one), lowest_of(one), median_of(many), max_threads, lowest_of(many));
    if (markdown) {
      std::printf("| round | kvbudget 1 thr | kvbudget %d thr | NumPy 1 thr | NumPy 2 thr | speed-up 1 thr | speed-up %d "
                  "thr |\n|---:|---:|---:|---:|---:|---:|---:|\n",
                  max_threads, max_threads);
      for (size_t i = 0; i < done.size(); ++i)
        std::printf("| %zu | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.1fx | %.1fx |\n", i + 1, done[i].fast1 * 1e3,
                    done[i].fastn * 1e3, done[i].peer1 * 1e3, done[i].peer2 * 1e3, one(done[i]), many(done[i]));
      std::printf("| median | | | | | **%.1fx** | **%.1fx** |\n\n", median_of(one), median_of(many));
    }
  }

  // 2. The metric path's GEMM rate on a 4096-token, head_dim-128 recording.
  SyntheticSpec spec;
  spec.layers = 1;
  spec.q_heads = 2;
  spec.kv_heads = 2;
  spec.head_dim = 128;
  spec.tokens = 4096;
  spec.calibration_queries = 64;
  const Recording big = generate_synthetic(spec);
  SimOptions big_opt;
  big_opt.topk = 8;
  omp_set_num_threads(1);
  const ExactAttentionCache big_cache(big, big_opt, size_t(4) << 30);
  big_opt.exact = &big_cache;
  const Plan big_plan = UniformStrategy(make_format("int4-asym-g32"), make_format("int4-asym-g32")).build({big, 0});
  const Timing t = best_of(repeats, [&] { (void)simulate(big, big_plan, big_opt); });
  const double pairs = static_cast<double>(big.q_heads) * static_cast<double>(big.tokens) *
                       static_cast<double>(big.tokens + 1) / 2.0;
  const double flops = 3.0 * 2.0 * static_cast<double>(big.head_dim) * pairs;
  const SgemmRate sgemm = sgemm_gflops(repeats);
  std::printf("4096 tokens x head_dim 128, %lld heads, int4-asym-g32, 1 thread: %.3f s per point (%.3f CPU s) = %.1f "
              "GFLOP/s (%.1f by CPU time); sgemm 1024^3: Eigen %.1f GFLOP/s (%.1f by CPU time), %s %.1f (%.1f); metric "
              "path at %.0f%% of the faster sgemm (%.0f%% by CPU time)\n",
              static_cast<long long>(big.q_heads), t.wall, t.cpu, flops / t.wall * 1e-9, flops / t.cpu * 1e-9,
              sgemm.eigen_wall, sgemm.eigen_cpu, sgemm_backend(), sgemm.backend_wall, sgemm.backend_cpu,
              100.0 * flops / t.wall * 1e-9 / sgemm.best_wall(), 100.0 * flops / t.cpu * 1e-9 / sgemm.best_cpu());
  std::printf("load average %.2f at the end\n", load_average());
  return 0;
}
