// bench_cuda: the CUDA backend's throughput, CPU and GPU in one run.
//
//   build/bench/bench_cuda [--layers 32] [--kv-heads 8] [--q-heads 32] [--tokens 32768]
//                          [--head-dim 128] [--positions 64] [--calibration 64]
//                          [--quant-spans 64] [--reps 10] [--formats a,b,...] [--formats-only]
//                          [--markdown FILE]
//
//  1. device copy bandwidth (cudaMemcpy device to device, bytes read + written);
//  2. quantize / dequantize / round-trip GB/s of each format's twin on [spans, T, d]
//     keys of the recording below, against the copy bandwidth, with a bit-exactness
//     check of one span against the CPU format (int, keep, ggml, fp8, fp4, nf4);
//  3. attention-error throughput of layer 0 (rows/s, GFLOP/s), GPU on every position,
//     GPU and one CPU thread on the evaluated-position subset;
//  4. a whole sweep (uniform int2/3/4/8-asym-g32 and KIVI-2) on a synthetic recording
//     of layers × kv-heads × tokens × head-dim at the evaluated positions, on the CPU
//     (every core) and on the GPU, with the largest metric difference between them.
// --formats-only runs sections 1 and 2 alone; --formats times the named formats in section 2.
// Figures and the device they came from go to experiments/bench/RESULTS.md.
#include <cuda_runtime_api.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "experiments/data_building.h"
#include "experiments/experiment.h"
#include "experiments/machine_info.h"
#include "experiments/query_positions.h"
#include "experiments/sweep.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_simulator.h"
#include "kernels/device.h"
#include "kernels/device_buffer.h"
#include "kernels/format_twin.h"
#include "kvb/build_config.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/metrics/metric_table.h"
#include "sim/simulator.h"
#include "sim/strategies/uniform.h"

using namespace kvb;
using kvb::cuda::DeviceBuffer;

namespace {

struct Options {
  int64_t layers = 32, kv_heads = 8, q_heads = 32, tokens = 32768, head_dim = 128;
  int64_t positions = 64, calibration = 64, quant_spans = 64;
  int reps = 10;
  bool formats_only = false;
  std::vector<std::string> formats;  // --formats a,b,c: these instead of the default list
  std::string markdown;
};

std::string now_iso() { return time_now("%Y-%m-%d %H:%M UTC", true); }

// Median device time in seconds of `reps` runs of f (after two warm-ups), by events.
template <typename F>
double median_seconds(int reps, F&& f) {
  cudaEvent_t a, b;
  KVB_CUDA_CHECK(cudaEventCreate(&a));
  KVB_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    KVB_CUDA_CHECK(cudaEventRecord(a));
    f();
    KVB_CUDA_CHECK(cudaEventRecord(b));
    KVB_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KVB_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  KVB_CUDA_CHECK(cudaEventDestroy(a));
  KVB_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Collects the report: printed as it goes, written as markdown at the end.
struct Report {
  std::ostringstream md;
  void line(const std::string& s) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
    md << s << "\n";
  }
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The sweep's calibration grid: every kCalibrationStride-th position from kCalibrationOffset.
constexpr int64_t kCalibrationStride = 8, kCalibrationOffset = 7;

std::string sweep_config(const Options& o) {
  std::ostringstream c;
  c << "name = \"bench_cuda_sweep\"\nseed = 0\n[data.synthetic]\n"
    << "layers = " << o.layers << "\nq_heads = " << o.q_heads << "\nkv_heads = " << o.kv_heads
    << "\nhead_dim = " << o.head_dim << "\ntokens = " << o.tokens << "\ncalibration_queries = " << o.calibration
    << "\nentropy_mean = 9.0\nentropy_spread = 4.0\n"
    << "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-asym-g32\"\n[strategy.vars]\nbits = [2, 3, 4, 8]\n"
    << "[[strategy]]\ntype = \"uniform\"\nname = \"kivi2\"\nkey_format = \"int2-asym-ch32\"\n"
    << "value_format = \"int2-asym-tok\"\n"
    << "[calibration]\nstride = " << kCalibrationStride << "\noffset = " << kCalibrationOffset << "\n"
    << "[metrics]\ntopk = 8\npositions = [";
  // Spread over the context up to its last token; a position on the calibration grid
  // moves one back, since calibration queries are not evaluated.
  for (int64_t i = 0; i < o.positions; ++i) {
    const int64_t p = ((i + 1) * o.tokens) / o.positions - 1;
    c << (i ? ", " : "") << (p % kCalibrationStride == kCalibrationOffset ? p - 1 : p);
  }
  c << "]\n";
  return c.str();
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("bench_cuda: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--layers") o.layers = std::stoll(next());
    else if (a == "--kv-heads") o.kv_heads = std::stoll(next());
    else if (a == "--q-heads") o.q_heads = std::stoll(next());
    else if (a == "--tokens") o.tokens = std::stoll(next());
    else if (a == "--head-dim") o.head_dim = std::stoll(next());
    else if (a == "--positions") o.positions = std::stoll(next());
    else if (a == "--calibration") o.calibration = std::stoll(next());
    else if (a == "--quant-spans") o.quant_spans = std::stoll(next());
    else if (a == "--reps") o.reps = std::stoi(next());
    else if (a == "--markdown") o.markdown = next();
    else if (a == "--formats-only") o.formats_only = true;
    else if (a == "--formats") o.formats = split(next(), ',');
    else
      throw Error("bench_cuda: unknown option '" + a + "'");
  }
  return o;
}

// Runs the sections above into r; returns the exit status (1 when a sweep point failed).
int run_bench(const Options& o, const cuda::DeviceInfo& dev, Report& r) {
  r.line("### CUDA backend (" + now_iso() + ")");
  r.line("");
  r.line("- device: " + dev.describe());
  r.line("- host: " + cpu_model() + ", " + std::to_string(omp_get_max_threads()) + " OpenMP threads; kvbudget " +
         KVB_VERSION + " (" + KVB_BUILD_TYPE + ", " + KVB_CXX_COMPILER + ")");
  r.line("- command: `bench_cuda --layers " + std::to_string(o.layers) + " --kv-heads " + std::to_string(o.kv_heads) +
         " --q-heads " + std::to_string(o.q_heads) + " --tokens " + std::to_string(o.tokens) + " --head-dim " +
         std::to_string(o.head_dim) + " --positions " + std::to_string(o.positions) + " --calibration " +
         std::to_string(o.calibration) + " --quant-spans " + std::to_string(o.quant_spans) + " --reps " +
         std::to_string(o.reps) + (o.formats.empty() ? "" : " --formats " + join(o.formats, ",")) +
         (o.formats_only ? " --formats-only" : "") + "`");

  // The synthetic recording every section uses.
  ExperimentSpec spec = parse_experiment(ConfigDoc::parse(sweep_config(o), "bench_cuda"));
  auto t0 = std::chrono::steady_clock::now();
  const Recording rec = build_recording(spec.data);
  resolve_positions(spec, rec.tokens);  // a config error shows now, not after the formats
  r.line("- recording: synthetic " + rec.summary() + " (calibration_queries " + std::to_string(o.calibration) +
         "), generated on the host in " + fmt("%.1f", seconds_since(t0)) + " s");
  r.line("");

  // 1. Copy bandwidth.
  const int64_t T = rec.tokens, d = rec.head_dim;
  const int64_t spans = std::min<int64_t>(o.quant_spans, rec.num_layers() * rec.kv_heads);
  const int64_t n = spans * T * d;
  DeviceBuffer<float> x(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int64_t s = 0; s < spans; ++s) {  // keys of layer s / kv_heads, head s % kv_heads
    const Tensor& k = rec.layers[static_cast<size_t>(s / rec.kv_heads)].key;
    x.upload(k.slice(s % rec.kv_heads), static_cast<size_t>(T * d), static_cast<size_t>(s * T * d));
  }
  const double copy_s = median_seconds(o.reps, [&] {
    KVB_CUDA_CHECK(cudaMemcpyAsync(out.data(), x.data(), x.bytes(), cudaMemcpyDeviceToDevice));
  });
  const double copy_gbs = 2.0 * static_cast<double>(x.bytes()) / copy_s * 1e-9;
  r.line("Device-to-device copy of " + fmt("%.2f", x.bytes() / double(1 << 30)) + " GiB: " +
         fmt("%.0f", copy_gbs) + " GB/s (bytes read + written, median of " + std::to_string(o.reps) + ")");
  r.line("");

  // 2. Quantizers on [spans, T, d] keys.
  r.line("Quantizer twins on " + std::to_string(spans) + " key spans of [" + std::to_string(T) + ", " +
         std::to_string(d) + "] fp32 (" + fmt("%.2f", x.bytes() / double(1 << 30)) +
         " GiB; codes as each twin stores them: one byte per element for int and fp8, the storage word for keep, "
         "ggml's block bytes, packed nibbles for fp4 and nf4, plus their scales). GB/s counts bytes read + written "
         "(x, codes and metadata; x and the values for the round trip); % is of the copy bandwidth; exact = the round "
         "trip of span 0 byte-identical to the CPU format.");
  r.line("");
  r.line("| format | quantize GB/s | % | dequantize GB/s | % | round trip GB/s | % | exact |");
  r.line("|---|---|---|---|---|---|---|---|");
  const std::vector<std::string> all_formats = {
      "int4-asym-g32", "int4-sym-g32",   "int2-asym-g64",  "int8-sym-tok",   "int3-asym-tok",  "int1-sym-g32",
      "int2-asym-ch32", "int4-sym-ch128", "int3-asym-ch",   "int1-sym-ch32",  "keep-fp16",      "keep-bf16",
      "keep-fp32",     "q4_0",           "q4_1",           "q5_0",           "q5_1",           "q8_0",
      "iq4_nl",        "iq4_nl-ntry7",   "fp8-e4m3",       "fp8-e5m2",       "fp8-e4m3-s0.25", "fp8-e4m3-cal64",
      "fp8-e5m2-cal64", "fp8-e4m3-tok",  "mxfp4",          "nvfp4",          "nf4-g64",        "nf4-g32",
      "nf4-g64-sfp32"};
  for (const std::string& name : o.formats.empty() ? all_formats : o.formats) {
    const FormatPtr f = make_format(name);
    const std::unique_ptr<cuda::FormatTwin> twin = cuda::require_twin(*f);
    const cuda::SpanBatch b{spans, T, d};
    const cuda::CodeBytes cb = twin->code_bytes(b);
    DeviceBuffer<uint8_t> codes(cb.codes), meta(std::max<size_t>(cb.meta, 1));
    const double tq = median_seconds(o.reps, [&] { twin->quantize(x.data(), b, codes.data(), meta.data(), nullptr); });
    const double td = median_seconds(o.reps, [&] { twin->dequantize(codes.data(), meta.data(), b, out.data(), nullptr); });
    const double tr = median_seconds(o.reps, [&] { twin->roundtrip(x.data(), b, out.data(), nullptr); });
    const double q_bytes = static_cast<double>(x.bytes() + cb.codes + cb.meta);
    const double r_bytes = 2.0 * static_cast<double>(x.bytes());
    // Exactness of span 0 against the CPU format.
    KVB_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> gpu0 = out.download(static_cast<size_t>(T * d));
    std::vector<float> cpu0(static_cast<size_t>(T * d));
    const Tensor& k0 = rec.layers[0].key;
    f->roundtrip(ConstMatView{k0.slice(0), T, d, d}, MatView{cpu0.data(), T, d, d}, SpanInfo{});
    const bool exact = std::memcmp(gpu0.data(), cpu0.data(), cpu0.size() * sizeof(float)) == 0;
    auto gbs = [](double bytes, double s) { return bytes / s * 1e-9; };
    r.line("| " + name + " | " + fmt("%.0f", gbs(q_bytes, tq)) + " | " + fmt("%.0f", 100 * gbs(q_bytes, tq) / copy_gbs) +
           " | " + fmt("%.0f", gbs(q_bytes, td)) + " | " + fmt("%.0f", 100 * gbs(q_bytes, td) / copy_gbs) + " | " +
           fmt("%.0f", gbs(r_bytes, tr)) + " | " + fmt("%.0f", 100 * gbs(r_bytes, tr) / copy_gbs) + " | " +
           (exact ? "yes" : "NO") + " |");
  }
  r.line("");
  x.resize(0);
  out.resize(0);
  if (o.formats_only) return 0;

  // 3. Attention-error throughput of layer 0.
  const Plan plan0 = UniformStrategy(make_format("int4-asym-g32"), make_format("int4-asym-g32")).build({rec, 0});
  SimOptions all_pos;
  SimOptions subset;
  subset.positions = spec.metrics.positions;
  auto useful_gflop = [&](const std::vector<int64_t>& pos) {  // 5 GEMMs of 2·(t+1)·d per row
    double f = 0;
    if (pos.empty())
      for (int64_t t = 0; t < T; ++t) f += 10.0 * static_cast<double>(t + 1) * static_cast<double>(d);
    else
      for (int64_t t : pos) f += 10.0 * static_cast<double>(t + 1) * static_cast<double>(d);
    return f * static_cast<double>(rec.q_heads) * 1e-9;
  };
  r.line("Attention-error throughput, layer 0, uniform int4-asym-g32 (" + std::to_string(rec.q_heads) +
         " query heads; GFLOP/s counts the 5 causal GEMMs, 10·(t+1)·d per row):");
  r.line("");
  r.line("| backend | positions | rows | seconds | rows/s | GFLOP/s |");
  r.line("|---|---|---|---|---|---|");
  {
    cuda::CudaSimulator gpu(rec);
    (void)gpu.simulate_layer(plan0, 0, subset);  // warm-up: twins, cuBLAS, scratch
    for (const SimOptions* opt : {&all_pos, &subset}) {
      t0 = std::chrono::steady_clock::now();
      const ErrorStats s = gpu.simulate_layer(plan0, 0, *opt);
      const double sec = seconds_since(t0);
      r.line("| cuda | " + std::string(opt->positions.empty() ? "all" : std::to_string(opt->positions.size())) +
             " | " + std::to_string(s.rows.size()) + " | " + fmt("%.3f", sec) + " | " +
             fmt("%.3g", static_cast<double>(s.rows.size()) / sec) + " | " +
             fmt("%.0f", useful_gflop(opt->positions) / sec) + " |");
    }
  }
  t0 = std::chrono::steady_clock::now();
  const ErrorStats cpu_layer = simulate_layer(rec, plan0, 0, subset);
  const double cpu_sec = seconds_since(t0);
  r.line("| cpu, 1 thread | " + std::to_string(subset.positions.size()) + " | " + std::to_string(cpu_layer.rows.size()) +
         " | " + fmt("%.3f", cpu_sec) + " | " + fmt("%.3g", static_cast<double>(cpu_layer.rows.size()) / cpu_sec) +
         " | " + fmt("%.1f", useful_gflop(subset.positions) / cpu_sec) + " |");
  r.line("");

  // 4. The whole sweep, CPU then GPU.
  const std::vector<SweepPoint> points = expand_sweep(spec);
  r.line("Sweep of " + std::to_string(points.size()) + " points (uniform int{2,3,4,8}-asym-g32, KIVI-2 int2-asym-ch32 "
         "keys / int2-asym-tok values) at " + std::to_string(spec.metrics.positions.size()) +
         " evaluated positions spread over the context, every layer and head:");
  r.line("");
  r.line("| backend | wall s | s per point |");
  r.line("|---|---|---|");
  std::vector<PointResult> results[2];
  for (int which = 0; which < 2; ++which) {
    spec.backend = which == 0 ? BackendRequest::Cpu : BackendRequest::Cuda;
    BackendChoice chosen;
    t0 = std::chrono::steady_clock::now();
    results[which] = run_sweep(spec, rec, points, nullptr, nullptr, &chosen);
    const double sec = seconds_since(t0);
    const std::string who = which == 0 ? "cpu, " + std::to_string(omp_get_max_threads()) + " threads" : "cuda";
    r.line("| " + who + " | " + fmt("%.1f", sec) + " | " + fmt("%.2f", sec / static_cast<double>(points.size())) + " |");
  }
  double worst = 0;
  std::string worst_what = "(all identical)";
  size_t failed = 0;
  for (size_t i = 0; i < results[0].size() && i < results[1].size(); ++i) {
    if (!results[0][i].ok || !results[1][i].ok) {
      ++failed;
      continue;
    }
    for (size_t m = 0; m < results[0][i].metrics.size(); ++m) {
      const double c = results[0][i].metrics[m], g = results[1][i].metrics[m];
      if (std::isinf(c) && std::isinf(g)) continue;
      const double rel = std::fabs(g - c) / std::max(std::fabs(c), 1e-300);
      if (rel > worst) {
        worst = rel;
        worst_what = points[i].key + " " + spec.metrics.report[m] + " (cpu " + fmt("%.9g", c) + ", gpu " +
                     fmt("%.9g", g) + ")";
      }
    }
  }
  r.line("");
  r.line("Largest CPU/GPU metric difference over the sweep: " + fmt("%.2e", worst) + " relative, " + worst_what +
         (failed ? "; " + std::to_string(failed) + " point(s) failed" : ""));
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\nusage: bench_cuda [--layers N] [--kv-heads N] [--q-heads N] [--tokens N] [--head-dim N]\n"
                         "                  [--positions N] [--calibration N] [--quant-spans N] [--reps N] "
                         "[--formats a,b,...] [--formats-only] [--markdown FILE]\n", e.what());
    return 2;
  }
  const cuda::DeviceInfo dev = cuda::device_info();
  if (!dev.available) {
    std::fprintf(stderr, "bench_cuda: %s\n", dev.describe().c_str());
    return 77;
  }
  Report r;
  int status = 1;
  try {
    status = run_bench(o, dev, r);
  } catch (const std::exception& e) {  // the sections measured so far are kept below
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    r.md << "\nbench_cuda stopped: " << e.what() << "\n";
  }
  if (!o.markdown.empty()) std::ofstream(o.markdown) << r.md.str();
  return status;
}
