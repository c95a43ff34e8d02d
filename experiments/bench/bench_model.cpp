// bench_model: speed of the built-in forward pass on the bundled checkpoints, and the
// fraction of this machine's GEMM rate it reaches.
//
//   build/bench/bench_model [--tokens N] [--repeats N] [--markdown]
//
// For each fixture model and for 1 and 2 OpenMP threads (1 when there is one core):
//  - teacher-forced evaluation of N tokens (BOS + Revelation) with the exact cache,
//    and with an int4-asym-g32 cache (quantize -> dequantize every layer's cache);
//  - greedy generation: 64 tokens after a 256-token prompt, exact cache;
// and the machine's sgemm rate measured in the same program: one 1024x1024x1024 product
// (split into column halves over the threads, as the forward pass splits its GEMMs), by
// Eigen and by the forward pass's backend (sim/core/sgemm.h), the faster counting.
// Rates are model FLOPs (2 per multiply-add: projections, MLP, LM head, q·k and p·v
// over the causal prefix) per second, best of --repeats rounds (each round runs every
// measurement once). Figures and the machine they came from go to
// experiments/bench/RESULTS.md.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvb/build_config.h"
#include "experiments/machine_info.h"
#include "sim/core/sgemm.h"
#include "sim/formats/registry.h"
#include "sim/model/model_eval.h"
#include "sim/model/transformer.h"

using namespace kvb;

namespace {

template <class F>
double timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return seconds_since(t0);
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// One timed measurement: `run` does the work once on `threads` threads; its best
// time over the rounds is kept.
struct Measurement {
  std::string model, what;
  int threads = 1;
  double tokens = 0, flops = 0;  // per run
  std::function<double()> run;   // returns the seconds to count
  double best = 1e30;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 512;
  int repeats = 9;
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

  // Every measurement runs once per round, rounds repeated --repeats times, and the
  // best time of each is kept: a burst of load from other processes then spoils one
  // round of several measurements rather than every repeat of one.
  std::vector<Measurement> ms;
  const int64_t n = 1024;
  const RowMatrix ga = RowMatrix::Random(n, n), gb = RowMatrix::Random(n, n);
  RowMatrix gc(n, n);
  // One 1024^3 product, the result's columns split over th threads, `product(b, c)`
  // computing each share (c = ga * b); timed.
  auto split_sgemm = [&](int th, auto product) {
    return timed([&] {
#pragma omp parallel for schedule(static, 1)
      for (int t = 0; t < th; ++t) {
        const int64_t c0 = n * t / th, c1 = n * (t + 1) / th;
        product(gb.middleCols(c0, c1 - c0), gc.middleCols(c0, c1 - c0));
      }
    });
  };
  for (int th : thread_counts) {
    // sgemm: one Eigen GEMM per thread.
    ms.push_back({"sgemm", "1024^3", th, 0, 2.0 * n * n * n, [&, th] {
                    return split_sgemm(th, [&](auto b, auto c) { c.noalias() = ga * b; });
                  }});
    // The same through sim/core/sgemm.h: the forward pass's own backend (OpenBLAS when
    // the build has it).
    ms.push_back({"sgemm-backend", "1024^3", th, 0, 2.0 * n * n * n, [&, th] {
                    return split_sgemm(th, [&](auto b, auto c) { gemm_ab(ga, b, c); });
                  }});
  }
  struct Fixture {
    std::shared_ptr<const Transformer> model;
    std::vector<int64_t> ids, prompt;
    Plan int4;
  };
  std::vector<std::unique_ptr<Fixture>> fixtures;
  for (const char* name : {"gpt2-bytes", "llama-bytes"}) {
    auto f = std::make_unique<Fixture>();
    f->model = Transformer::load(root + "models/" + name);
    TokenSource src;
    src.text = root + "text/eval_kjv_revelation.txt";
    src.max_tokens = tokens;
    f->ids = load_tokens(src, f->model->config());
    const int64_t T = static_cast<int64_t>(f->ids.size());
    f->prompt.assign(f->ids.begin(), f->ids.begin() + std::min<int64_t>(T, 256));
    const ModelConfig& c = f->model->config();
    f->int4 = Plan(c.layers, c.kv_heads, T, c.head_dim);
    f->int4.assign_all(Kind::Key, make_format("int4-asym-g32"));
    f->int4.assign_all(Kind::Value, make_format("int4-asym-g32"));
    double flops = 0, gen_flops = 0;
    for (int64_t t = 0; t < T; ++t) flops += f->model->flops_per_token(t + 1);
    for (int64_t t = 0; t < 64; ++t)
      gen_flops += f->model->flops_per_token(static_cast<int64_t>(f->prompt.size()) + t + 1);
    const Fixture* fx = f.get();
    for (int th : thread_counts) {
      ms.push_back({name, "teacher-forced, exact cache", th, double(T), flops,
                    [fx] { return timed([&] { fx->model->forward(fx->ids); }); }});
      ms.push_back({name, "teacher-forced, int4-asym-g32 cache", th, double(T), flops, [fx] {
                      ExtendOptions q;
                      q.cache.plan = &fx->int4;
                      return timed([&] { fx->model->forward(fx->ids, q); });
                    }});
      // 64 single-token steps after an untimed prefill of the prompt.
      ms.push_back({name, "greedy decoding after 256 tokens, exact cache", th, 64.0, gen_flops, [fx] {
                      Transformer::State state = fx->model->new_state();
                      ExtendOptions step;
                      step.all_logits = false;
                      RowMatrix logits = fx->model->extend(state, fx->prompt, step);
                      return timed([&] {
                        for (int i = 0; i < 64; ++i) {
                          const int64_t next = argmax(logits.data(), logits.cols());
                          logits = fx->model->extend(state, std::span<const int64_t>(&next, 1), step);
                        }
                      });
                    }});
    }
    fixtures.push_back(std::move(f));
  }
  // Rounds run model by model (with the sgemm measurements in every round), so that a
  // model's passes reuse the per-thread buffers sized for it, as in a real run.
  for (const char* model : {"gpt2-bytes", "llama-bytes"})
    for (int r = 0; r < repeats; ++r)
      for (Measurement& m : ms) {
        if (m.model != model && m.model.rfind("sgemm", 0) != 0) continue;
        omp_set_num_threads(m.threads);
        m.best = std::min(m.best, m.run());
      }

  // The machine's rate: the faster of Eigen's and the backend's.
  std::vector<double> gemm(3, 0.0), eigen(3, 0.0), backend(3, 0.0);
  for (const Measurement& m : ms) {
    const size_t th = static_cast<size_t>(m.threads);
    if (m.model == "sgemm") eigen[th] = m.flops / m.best / 1e9;
    if (m.model == "sgemm-backend") backend[th] = m.flops / m.best / 1e9;
    gemm[th] = std::max(eigen[th], backend[th]);
  }
  if (markdown)
    std::printf("| model | threads | evaluation | tokens/s | GFLOP/s | of sgemm |\n|---|---|---|---|---|---|\n");
  for (const Measurement& m : ms) {
    if (m.model.rfind("sgemm", 0) == 0) continue;
    const double gf = m.flops / m.best / 1e9, share = 100.0 * gf / gemm[static_cast<size_t>(m.threads)];
    if (markdown)
      std::printf("| %s | %d | %s | %.0f | %.1f | %.0f%% |\n", m.model.c_str(), m.threads, m.what.c_str(),
                  m.tokens / m.best, gf, share);
    else
      std::printf("%-12s %d thr  %-46s %9.0f tok/s %8.1f GFLOP/s  %5.1f%% of sgemm\n", m.model.c_str(), m.threads,
                  m.what.c_str(), m.tokens / m.best, gf, share);
  }
  std::printf("\nsgemm 1024^3, same program (\"of sgemm\": the faster):");
  for (int th : thread_counts)
    std::printf(" Eigen %.1f, %s %.1f GFLOP/s on %d thread%s;", eigen[th], sgemm_backend(), backend[th], th,
                th > 1 ? "s" : "");
  std::printf("\nteacher-forced evaluation of %lld tokens, best of %d; load average after: %s\n",
              static_cast<long long>(tokens), repeats, load_average().c_str());
  return 0;
}
