// bench_cuda_forward: the model forward pass on the GPU (kernels/model_forward.h)
// against the CPU's, on one checkpoint.
//
//   build/bench/bench_cuda_forward MODEL_DIR [--tokens 512] [--repeats 5] [--decode 32] [--no-cpu]
//
// Prints the load and upload times; teacher-forced evaluation of --tokens tokens
// (deterministic ids) in fp32 and tf32 (best of --repeats into a logits matrix allocated
// once, as a model-level sweep runs; then one pass into a fresh matrix, allocation and
// first touch included; tokens/s and model GFLOP/s, Transformer::flops_per_token
// summed over the positions), the largest logit
// difference relative to max |logit| of tf32 against fp32 and of fp32 against the CPU
// (one CPU pass, every core, unless --no-cpu), and greedy decoding of --decode tokens
// after the prompt on the GPU. Figures go to experiments/bench/RESULTS.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/model_forward.h"
#include "sim/core/error.h"

using namespace kvb;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double relative_difference(const RowMatrix& ref, const RowMatrix& got) {
  return static_cast<double>((ref - got).cwiseAbs().maxCoeff()) / static_cast<double>(ref.cwiseAbs().maxCoeff());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::printf("usage: bench_cuda_forward MODEL_DIR [--tokens N] [--repeats N] [--decode N] [--no-cpu]\n");
    return argc < 2 ? 2 : 0;
  }
  int64_t tokens = 512, repeats = 5, decode = 32;
  bool cpu = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-cpu") cpu = false;
    else if (i + 1 < argc && a == "--tokens") tokens = std::atoll(argv[++i]);
    else if (i + 1 < argc && a == "--repeats") repeats = std::atoll(argv[++i]);
    else if (i + 1 < argc && a == "--decode") decode = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "bench_cuda_forward: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    const cuda::DeviceInfo dev = cuda::device_info();
    if (!dev.available) {
      std::printf("bench_cuda_forward: no CUDA device (%s)\n", dev.why_not.c_str());
      return 77;
    }
    std::printf("device: %s\n", dev.describe().c_str());
    auto t0 = Clock::now();
    const std::shared_ptr<const Transformer> host = Transformer::load(argv[1]);
    const ModelConfig& c = host->config();
    std::printf("model: %s\n  %s\n  loaded in %.2f s (%.1f MiB of weights)\n", c.dir.string().c_str(),
                c.summary().c_str(), seconds_since(t0), static_cast<double>(host->weights().bytes()) / 1048576.0);
    t0 = Clock::now();
    const cuda::CudaTransformer fp32(host);
    std::printf("  uploaded in %.2f s (%.1f MiB on the device)\n", seconds_since(t0),
                static_cast<double>(fp32.weight_bytes()) / 1048576.0);
    const cuda::CudaTransformer tf32(host, cuda::ForwardMath::Tf32);
    std::vector<int64_t> ids(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i) ids[static_cast<size_t>(i)] = (i * 7919 + 13) % c.vocab_size;
    double flops = 0;
    for (int64_t t = 0; t < tokens; ++t) flops += host->flops_per_token(t + 1);

    // Each pass writes its logits into a matrix allocated once (as a model-level sweep
    // does); one more pass into a fresh matrix shows what allocating and first touching
    // the host memory adds (the returning forward()).
    RowMatrix logits32(tokens, c.vocab_size), logits_tf32(tokens, c.vocab_size);
    for (const cuda::CudaTransformer* m : {&fp32, &tf32}) {
      RowMatrix& out = m == &fp32 ? logits32 : logits_tf32;
      m->forward(ids, {}, out.data());  // warm-up: allocations, cuBLAS heuristics
      double best = INFINITY;
      for (int64_t r = 0; r < repeats; ++r) {
        t0 = Clock::now();
        m->forward(ids, {}, out.data());
        best = std::min(best, seconds_since(t0));
      }
      t0 = Clock::now();
      const RowMatrix fresh = m->forward(ids);
      const double fresh_s = seconds_since(t0);
      std::printf("%s teacher-forced, %lld tokens: %.4f s (best of %lld; logits to the host included), %.0f tokens/s, "
                  "%.0f GFLOP/s; into a fresh matrix %.4f s\n",
                  cuda::forward_math_name(m->math()), static_cast<long long>(tokens), best,
                  static_cast<long long>(repeats), static_cast<double>(tokens) / best, flops / best / 1e9, fresh_s);
      if (fresh != out) std::printf("  (the fresh matrix's logits differ from the reused one's)\n");
    }
    std::printf("tf32 vs fp32: max |Δlogit| / max |logit| = %.3g\n", relative_difference(logits32, logits_tf32));

    if (decode > 0) {
      const std::vector<int64_t> prompt(ids.begin(), ids.begin() + std::min<int64_t>(tokens, 256));
      t0 = Clock::now();
      const std::vector<int64_t> out = cuda::greedy_generate(fp32, prompt, decode, {});
      const double s = seconds_since(t0);
      std::printf("fp32 greedy decoding: prompt %zu tokens, then %lld tokens in %.3f s (%.1f tokens/s, prompt "
                  "included)\n",
                  prompt.size(), static_cast<long long>(decode), s, static_cast<double>(decode) / s);
    }
    if (cpu) {
      t0 = Clock::now();
      const RowMatrix ref = host->forward(ids);
      const double s = seconds_since(t0);
      std::printf("cpu teacher-forced, %lld tokens: %.3f s, %.0f tokens/s, %.0f GFLOP/s\n",
                  static_cast<long long>(tokens), s, static_cast<double>(tokens) / s, flops / s / 1e9);
      int64_t argmax_differ = 0;
      for (int64_t r = 0; r < ref.rows(); ++r)
        argmax_differ += argmax(ref.row(r).data(), ref.cols()) != argmax(logits32.row(r).data(), ref.cols());
      std::printf("fp32 vs cpu: max |Δlogit| / max |logit| = %.3g, argmax differs at %lld of %lld positions\n",
                  relative_difference(ref, logits32), static_cast<long long>(argmax_differ),
                  static_cast<long long>(ref.rows()));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_forward: %s\n", e.what());
    return 1;
  }
  return 0;
}
