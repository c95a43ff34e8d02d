#include "experiments/model_backend.h"

#include <algorithm>
#include <iostream>
#include <mutex>

#include "kvb/build_config.h"
#include "sim/core/error.h"
#if KVB_HAVE_CUDA
#include "kernels/model_forward.h"
#endif

namespace kvb {

std::string ModelBackend::precision_note() const {
  return choice.used == Backend::Cuda && precision == MatmulPrecision::Tf32 ? ", precision tf32" : "";
}

ModelBackend make_model_backend(const std::shared_ptr<const Transformer>& model, BackendRequest request,
                                const std::string& where, MatmulPrecision precision) {
  ModelBackend b;
  b.precision = precision;
  b.choice.requested = request;
  if (request == BackendRequest::Cpu) {
    b.choice.reason = "requested";
    return b;
  }
  std::string why;
  b.choice.device = cuda_device(&why);
  if (b.choice.device.empty()) {
    if (request == BackendRequest::Cuda)
      throw ConfigError(where + ": backend cuda, but " + why + "; use --backend cpu or auto");
    b.choice.reason = why;
    return b;
  }
#if KVB_HAVE_CUDA
  // One device model serves every caller, one at a time (it keeps device scratch).
  struct Shared {
    std::mutex mutex;
    std::unique_ptr<cuda::CudaTransformer> gpu;
  };
  auto shared = std::make_shared<Shared>();
  shared->gpu = std::make_unique<cuda::CudaTransformer>(
      model, precision == MatmulPrecision::Tf32 ? cuda::ForwardMath::Tf32 : cuda::ForwardMath::Fp32);
  const bool strict = request == BackendRequest::Cuda;
  // auto: a plan the device cannot run goes to the CPU, said once per format.
  auto on_host = [strict](const CacheQuantization& cache) {
    if (strict || !cache.plan) return false;
    const std::string why_not = cuda::forward_unsupported_reason(*cache.plan);
    if (why_not.empty()) return false;
    static std::once_flag said;
    std::call_once(said, [&] { std::cerr << "backend auto: " << why_not << "; this plan runs on the CPU\n"; });
    return true;
  };
  b.forward.name = "cuda";
  b.forward.forward = [shared, model, on_host](std::span<const int64_t> tokens, const ExtendOptions& opt) {
    if (on_host(opt.cache)) return model->forward(tokens, opt);
    const std::lock_guard<std::mutex> lock(shared->mutex);
    return shared->gpu->forward(tokens, opt);
  };
  b.forward.forward_into = [shared, model, on_host](std::span<const int64_t> tokens, const ExtendOptions& opt,
                                                    float* logits) {
    if (on_host(opt.cache)) {
      model->forward_into(tokens, opt, logits);
      return;
    }
    const std::lock_guard<std::mutex> lock(shared->mutex);
    shared->gpu->forward(tokens, opt, logits);
  };
  b.forward.generate = [shared, model, on_host](std::span<const int64_t> prompt, int64_t max_new_tokens,
                                                const CacheQuantization& cache, const TokenChooser& choose,
                                                const std::function<bool(const std::vector<int64_t>&)>& stop) {
    if (on_host(cache)) return generate(*model, prompt, max_new_tokens, cache, choose, stop);
    const std::lock_guard<std::mutex> lock(shared->mutex);
    return cuda::generate(*shared->gpu, prompt, max_new_tokens, cache, choose, stop);
  };
  b.choice.used = Backend::Cuda;
  b.choice.reason = request == BackendRequest::Cuda ? "requested" : "a CUDA device is present";
#else
  (void)model;
#endif
  return b;
}

}  // namespace kvb
