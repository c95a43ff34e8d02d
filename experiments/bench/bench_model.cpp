// bench_model: speed of the built-in forward pass on the bundled checkpoints, and the
// fraction of this machine's GEMM rate it reaches.
//
//   build/bench/bench_model [--tokens N] [--repeats N] [--markdown]
//
// For each fixture model and for 1 and 2 OpenMP threads (all cores when fewer):
//  - teacher-forced evaluation of N tokens (BOS + Revelation) with the exact cache,
//    and with an int4-asym-g32 cache (quantize -> dequantize every layer's cache);
//  - greedy generation: 64 tokens after a 256-token prompt, exact cache;
// and Eigen's sgemm rate measured in the same program: one 1024x1024x1024 product
// (split into column halves over the threads, as the forward pass splits its GEMMs).
// Rates are model FLOPs (2 per multiply-add: projections, MLP, LM head, q·k and p·v
// over the causal prefix) per second, best of --repeats. Figures and the machine they
// came from go to experiments/bench/RESULTS.md.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "kvb/build_config.h"
#include "sim/formats/registry.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"
#include "sim/strategies/uniform.h"

using namespace kvb;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// sgemm GFLOP/s of an n x n x n product on the current thread count: the columns of
// the result are split into as many blocks as threads, each one Eigen GEMM.
double sgemm_gflops(int64_t n, int repeats) {
  const RowMatrix a = RowMatrix::Random(n, n), b = RowMatrix::Random(n, n);
  RowMatrix c(n, n);
  const int threads = omp_get_max_threads();
  const double secs = best_seconds(repeats, [&] {
#pragma omp parallel for schedule(static, 1)
    for (int t = 0; t < threads; ++t) {
      const int64_t c0 = n * t / threads, c1 = n * (t + 1) / threads;
      c.middleCols(c0, c1 - c0).noalias() = a * b.middleCols(c0, c1 - c0);
    }
  });
  return 2.0 * static_cast<double>(n) * n * n / secs / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 512;
  int repeats = 5;
  bool markdown = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::max<int64_t>(2, std::atoll(argv[++i]));
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--markdown")) markdown = true;
    else {
      std::fprintf(stderr, "usage: bench_model [--tokens N] [--repeats N] [--markdown]\n");
      return 2;
    }
  }
  const std::string root = std::string(KVB_SOURCE_DIR) + "/data/";
  const int cores = omp_get_num_procs();
  std::vector<int> thread_counts = {1};
  if (cores >= 2) thread_counts.push_back(2);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::localtime(&now));
  std::printf("CPU: %s, %d cores online; %s; load average before: %s\n\n", cpu_model().c_str(), cores, date,
              load_average().c_str());

  std::vector<double> gemm(3, 0.0);
  for (int th : thread_counts) {
    omp_set_num_threads(th);
    gemm[th] = sgemm_gflops(1024, repeats);
  }
  if (markdown)
    std::printf("| model | threads | evaluation | tokens/s | GFLOP/s | of sgemm |\n|---|---|---|---|---|---|\n");
  for (const char* name : {"gpt2-bytes", "llama-bytes"}) {
    const auto model = Transformer::load(root + "models/" + name);
    TokenSource src;
    src.text = root + "text/eval_kjv_revelation.txt";
    src.max_tokens = tokens;
    const std::vector<int64_t> ids = load_tokens(src, model->config());
    const int64_t T = static_cast<int64_t>(ids.size());
    double flops = 0;
    for (int64_t t = 0; t < T; ++t) flops += model->flops_per_token(t + 1);
    const ModelEvaluator ev(model, std::vector<int64_t>(ids.begin(), ids.begin() + std::min<int64_t>(T, 8)), {}, "bench");
    // The plan covers T tokens of the same shape as the model's cache.
    Recording shape = ev.recording();
    shape.tokens = T;
    const Plan int4 = UniformStrategy(make_format("int4-asym-g32"), make_format("int4-asym-g32")).build({shape, 0});
    const std::vector<int64_t> prompt(ids.begin(), ids.begin() + std::min<int64_t>(T, 256));
    double gen_flops = 0;
    for (int64_t t = 0; t < 64; ++t) gen_flops += model->flops_per_token(static_cast<int64_t>(prompt.size()) + t + 1);

    for (int th : thread_counts) {
      omp_set_num_threads(th);
      struct Row {
        const char* what;
        double secs, tokens, flops;
      };
      std::vector<Row> rows;
      ExtendOptions exact, quant;
      quant.cache.plan = &int4;
      rows.push_back({"teacher-forced, exact cache", best_seconds(repeats, [&] { model->forward(ids, exact); }),
                      static_cast<double>(T), flops});
      rows.push_back({"teacher-forced, int4-asym-g32 cache", best_seconds(repeats, [&] { model->forward(ids, quant); }),
                      static_cast<double>(T), flops});
      // Generation: 64 single-token steps after an (untimed) prompt prefill.
      double decode = 1e30;
      for (int r = 0; r < repeats; ++r) {
        Transformer::State state = model->new_state();
        ExtendOptions step;
        step.all_logits = false;
        RowMatrix logits = model->extend(state, prompt, step);
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 64; ++i) {
          const int64_t next = argmax(logits.data(), logits.cols());
          logits = model->extend(state, std::span<const int64_t>(&next, 1), step);
        }
        decode = std::min(decode, seconds_since(t0));
      }
      rows.push_back({"greedy decoding after 256 tokens, exact cache", decode, 64.0, gen_flops});
      for (const Row& r : rows) {
        const double gf = r.flops / r.secs / 1e9;
        if (markdown)
          std::printf("| %s | %d | %s | %.0f | %.1f | %.0f%% |\n", name, th, r.what, r.tokens / r.secs, gf,
                      100.0 * gf / gemm[th]);
        else
          std::printf("%-12s %d thr  %-46s %9.0f tok/s %8.1f GFLOP/s  %5.1f%% of sgemm\n", name, th, r.what,
                      r.tokens / r.secs, gf, 100.0 * gf / gemm[th]);
      }
    }
  }
  std::printf("\nEigen sgemm 1024^3, same program:");
  for (int th : thread_counts) std::printf(" %.1f GFLOP/s on %d thread%s;", gemm[th], th, th > 1 ? "s" : "");
  std::printf("\nteacher-forced evaluation of %lld tokens, best of %d; load average after: %s\n",
              static_cast<long long>(tokens), repeats, load_average().c_str());
  return 0;
}
