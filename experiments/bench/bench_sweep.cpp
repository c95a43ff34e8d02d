// bench_sweep: time per sweep point on the bundled gpt2-bytes recording.
//
//   build/bench/bench_sweep [--recording PATH] [--repeats N] [--markdown]
//
// For several uniform formats it times one point end to end on one thread
// (quantize + dequantize every unit, then the attention-level metrics of every
// layer, head and position), and then the whole quickstart sweep with all threads.
// Figures and the machine they came from are recorded in experiments/bench/RESULTS.md.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/machine_info.h"
#include "experiments/sweep.h"
#include "sim/core/allocator.h"
#include "kvb/build_config.h"
#include "sim/formats/registry.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"

using namespace kvb;

int main(int argc, char** argv) {
  kvb::keep_freed_memory();  // as the CLI does
  std::string path = std::string(KVB_SOURCE_DIR) + "/data/records/gpt2-bytes-record.safetensors";
  int repeats = 3;
  bool markdown = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--recording") && i + 1 < argc) path = argv[++i];
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--markdown")) markdown = true;
    else {
      std::fprintf(stderr, "usage: bench_sweep [--recording PATH] [--repeats N] [--markdown]\n");
      return 2;
    }
  }
  RecordingSpec rs;
  rs.path = path;
  const Recording rec = load_recording(rs);
  std::printf("recording: %s (%s)\nCPU: %s, %d OpenMP threads\n\n", rec.name.c_str(), rec.summary().c_str(),
              cpu_model().c_str(), omp_get_max_threads());

  const std::vector<std::string> formats = {"int8-sym-tok", "int4-asym-g32", "int2-asym-g64", "int3-sym-g32",
                                            "int2-asym-ch32"};
  if (markdown) std::printf("| format | bpe | ms per point (1 thread, best of %d) |\n|---|---|---|\n", repeats);
  else std::printf("%-18s %7s %26s\n", "format", "bpe", "ms/point (1 thread, best)");
  omp_set_num_threads(1);
  for (const std::string& f : formats) {
    const Plan plan = UniformStrategy(make_format(f), make_format(f)).build({rec, 0});
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const ErrorStats s = simulate(rec, plan, SimOptions{});
      best = std::min(best, seconds_since(t0));
      if (s.rows.empty()) return 1;
    }
    if (markdown) std::printf("| %s | %.3f | %.1f |\n", f.c_str(), plan.bpe(), best * 1e3);
    else std::printf("%-18s %7.3f %26.1f\n", f.c_str(), plan.bpe(), best * 1e3);
  }
  omp_set_num_threads(omp_get_num_procs());

  // The whole quickstart sweep, all threads, as `kvbudget run` does it.
  const std::string config = std::string(KVB_SOURCE_DIR) + "/configs/quickstart.toml";
  ExperimentSpec spec = load_experiment(config, {"data.path=" + path});
  const std::vector<SweepPoint> points = expand_sweep(spec);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<PointResult> results = run_sweep(spec, rec, points, nullptr, nullptr);
  const double wall = seconds_since(t0);
  std::printf("\nquickstart sweep: %zu points in %.2f s wall with %d threads (%.1f ms per point)\n", results.size(),
              wall, omp_get_max_threads(), wall * 1e3 / static_cast<double>(results.size()));
  return 0;
}
