// bench_formats: quantize + dequantize throughput of every format in the table, next
// to this machine's memory-copy bandwidth measured the same way, and each format's
// relative MSE on the benchmark span (quantize_tensor, as `kvbudget quantize`).
//
// Throughput = fp32 input bytes per second through Format::roundtrip() on a
// realistic [tokens, head_dim] span (default 4096 x 128 = 2 MiB), on one thread and
// on all OpenMP threads (each thread its own span). Memory copy = bytes copied per
// second by std::memcpy between two buffers larger than the caches, also on one and
// on all threads (each thread loops on its own until the time is up). Every
// measurement repeats until --seconds have passed and reports the best of --trials
// runs. On a machine shared with other work, the all-threads figures mostly show how
// much CPU the other work left.
//
// usage: bench_formats [--tokens T] [--head-dim D] [--seconds S] [--trials N]
//                      [--filter SUBSTRING] [--markdown]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sim/formats/registry.h"
#include "sim/core/error.h"
#include "sim/core/tensor.h"
#include "sim/reconstruction.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int64_t tokens = 4096;
  int64_t head_dim = 128;
  double seconds = 0.3;
  int trials = 3;
  std::string filter;
  bool markdown = false;
};

double elapsed(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Best bytes/second over trials of fn(iterations) -> bytes, each trial running at
// least `seconds`.
template <class Fn>
double best_rate(const Options& o, Fn fn) {
  double best = 0;
  for (int t = 0; t < o.trials; ++t) {
    double bytes = 0;
    const auto t0 = Clock::now();
    do bytes += fn();
    while (elapsed(t0) < o.seconds);
    best = std::max(best, bytes / elapsed(t0));
  }
  return best;
}

// Best bytes/second over trials of `threads` threads each calling fn(thread) -> bytes
// until `seconds` have passed (one parallel region per trial, no per-call barrier).
template <class Fn>
double best_parallel_rate(const Options& o, int threads, Fn fn) {
  double best = 0;
  for (int t = 0; t < o.trials; ++t) {
    std::vector<double> bytes(static_cast<size_t>(threads), 0.0);
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int i = omp_get_thread_num();
      do bytes[i] += fn(i);
      while (elapsed(t0) < o.seconds);
    }
    double total = 0;
    for (double b : bytes) total += b;
    best = std::max(best, total / elapsed(t0));
  }
  return best;
}

double memcpy_rate(const Options& o, int threads) {
  const size_t per_thread = (size_t{256} << 20) / static_cast<size_t>(threads);  // 256 MiB in all
  std::vector<std::vector<char>> src(static_cast<size_t>(threads)), dst(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    src[i].assign(per_thread, static_cast<char>(i + 1));
    dst[i].assign(per_thread, 0);
  }
  return best_parallel_rate(o, threads, [&](int i) {
    std::memcpy(dst[i].data(), src[i].data(), per_thread);
    return static_cast<double>(per_thread);
  });
}

struct Row {
  std::string name;
  double bpe = 0;
  double single = 0, multi = 0;  // bytes/s
  double rel_mse = 0;            // ||x̂ - x||² / ||x||² of the span
  std::string error;
};

Row bench_format(const Options& o, const std::string& name, int threads) {
  Row row;
  row.name = name;
  const kvb::FormatPtr f = kvb::make_format(name);
  const int64_t T = o.tokens, d = o.head_dim;
  row.bpe = f->bpe(T, d);
  const std::string bad = f->check_shape(T, d);
  if (!bad.empty()) {
    row.error = bad;
    return row;
  }
  // Keys drawn from a fixed pseudo-random stream with a few outlier channels; the
  // same data serve as pre-RoPE keys for prerope: formats.
  std::vector<float> x(static_cast<size_t>(T * d));
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < x.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>(s >> 40) / 16777216.0f - 0.5f;
    x[i] = (i % static_cast<size_t>(d) < 4 ? 8.0f : 1.0f) * u;
  }
  kvb::SpanSource source;  // post-RoPE keys whose pre-RoPE copy is x itself (prerope formats)
  source.rope_applied = true;
  auto span_of = [&](int64_t unit) { return kvb::unit_span(source, 0, unit, kvb::Kind::Key, 1, x.data(), d); };
  kvb::Tensor keys({T, d});
  keys.data = x;
  row.rel_mse = kvb::quantize_tensor(keys, *f, T, kvb::Kind::Key, 1, source, &keys).relative_mse();
  const kvb::ConstMatView in{x.data(), T, d, d};
  std::vector<std::vector<float>> out(static_cast<size_t>(threads), std::vector<float>(x.size()));
  const double bytes = static_cast<double>(x.size() * sizeof(float));
  f->roundtrip(in, kvb::MatView{out[0].data(), T, d, d}, span_of(0));  // warm-up (caches, codebooks)
  row.single = best_rate(o, [&] {
    f->roundtrip(in, kvb::MatView{out[0].data(), T, d, d}, span_of(0));
    return bytes;
  });
  row.multi = best_parallel_rate(o, threads, [&](int i) {
    f->roundtrip(in, kvb::MatView{out[i].data(), T, d, d}, span_of(i));
    return bytes;
  });
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_formats: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") o.tokens = std::stoll(next());
    else if (a == "--head-dim") o.head_dim = std::stoll(next());
    else if (a == "--seconds") o.seconds = std::stod(next());
    else if (a == "--trials") o.trials = std::stoi(next());
    else if (a == "--filter") o.filter = next();
    else if (a == "--markdown") o.markdown = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_formats [--tokens T] [--head-dim D] [--seconds S] [--trials N] [--filter SUBSTRING] "
                   "[--markdown]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const int threads = omp_get_max_threads();
  const double copy1 = memcpy_rate(o, 1), copyN = memcpy_rate(o, threads);
  std::vector<Row> rows;
  for (const kvb::FormatFamily& fam : kvb::format_families())
    for (const kvb::FormatExample& example : fam.examples)
      if (const std::string& name = example.name; o.filter.empty() || name.find(o.filter) != std::string::npos) {
        try {
          rows.push_back(bench_format(o, name, threads));
        } catch (const std::exception& e) {
          rows.push_back(Row{name, 0, 0, 0, 0, e.what()});
        }
        if (!o.markdown) std::fprintf(stderr, "  %s done\n", name.c_str());
      }
  const double GB = 1e9;
  if (o.markdown) {
    std::printf("Span [%lld tokens, %lld head_dim] fp32 (%.1f MiB); %d threads. memcpy: %.2f GB/s on 1 thread, "
                "%.2f GB/s on %d.\n\n",
                static_cast<long long>(o.tokens), static_cast<long long>(o.head_dim),
                static_cast<double>(o.tokens * o.head_dim * 4) / (1 << 20), threads, copy1 / GB, copyN / GB, threads);
    std::printf("| format | bpe | rel. MSE | GB/s, 1 thread | GB/s, %d threads | 1 thread vs memcpy |\n"
                "|---|---:|---:|---:|---:|---:|\n",
                threads);
    for (const Row& r : rows) {
      if (!r.error.empty()) std::printf("| `%s` | %.4f | | (%s) | | |\n", r.name.c_str(), r.bpe, r.error.c_str());
      else
        std::printf("| `%s` | %.4f | %.3g | %.3f | %.3f | %.1f%% |\n", r.name.c_str(), r.bpe, r.rel_mse,
                    r.single / GB, r.multi / GB, 100.0 * r.single / copy1);
    }
    return 0;
  }
  std::printf("span [%lld, %lld] fp32, %d threads\n", static_cast<long long>(o.tokens),
              static_cast<long long>(o.head_dim), threads);
  std::printf("%-36s %8s %10s %12s %12s %9s\n", "format", "bpe", "rel MSE", "GB/s 1thr", "GB/s all", "vs copy");
  std::printf("%-36s %8s %10s %12.3f %12.3f %9s\n", "memcpy", "", "", copy1 / GB, copyN / GB, "100%");
  for (const Row& r : rows) {
    if (!r.error.empty()) std::printf("%-36s %8.4f  (%s)\n", r.name.c_str(), r.bpe, r.error.c_str());
    else
      std::printf("%-36s %8.4f %10.3g %12.3f %12.3f %8.1f%%\n", r.name.c_str(), r.bpe, r.rel_mse, r.single / GB,
                  r.multi / GB, 100.0 * r.single / copy1);
  }
  return 0;
}
