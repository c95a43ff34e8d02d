#include "kernels/keep_twin.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "sim/core/store_dtype.h"
#include "sim/formats/int_format.h"
#include "sim/formats/keep_format.h"

namespace kvb::cuda {

namespace {

constexpr int kThreads = 256;

// Four consecutive codes as one 8-byte (uint16) or 16-byte (uint32) access.
__device__ __forceinline__ void store4(uint16_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  *reinterpret_cast<ushort4*>(p) = make_ushort4(a, b, c, d);
}
__device__ __forceinline__ void store4(uint32_t* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
}
__device__ __forceinline__ uint4 load4(const uint16_t* p) {
  const ushort4 v = *reinterpret_cast<const ushort4*>(p);
  return make_uint4(v.x, v.y, v.z, v.w);
}
__device__ __forceinline__ uint4 load4(const uint32_t* p) { return *reinterpret_cast<const uint4*>(p); }

// Codes of a 16-bit dtype are uint16, of fp32 uint32: Code is the storage word.
template <typename Code>
__global__ void __launch_bounds__(kThreads)
    keep_quantize_kernel(const float* __restrict__ x, int64_t n, StoreDtype dt, bool vec4, Code* __restrict__ codes) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t quads = vec4 ? n / 4 : 0;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[q];
    store4(codes + 4 * q, store_bits(v.x, dt), store_bits(v.y, dt), store_bits(v.z, dt), store_bits(v.w, dt));
  }
  for (int64_t e = 4 * quads + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    codes[e] = static_cast<Code>(store_bits(x[e], dt));
}

template <typename Code>
__global__ void __launch_bounds__(kThreads)
    keep_dequantize_kernel(const Code* __restrict__ codes, int64_t n, StoreDtype dt, bool vec4, float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t quads = vec4 ? n / 4 : 0;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
    const uint4 c = load4(codes + 4 * q);
    reinterpret_cast<float4*>(out)[q] = make_float4(store_bits_value(c.x, dt), store_bits_value(c.y, dt),
                                                    store_bits_value(c.z, dt), store_bits_value(c.w, dt));
  }
  for (int64_t e = 4 * quads + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = store_bits_value(codes[e], dt);
}

__global__ void __launch_bounds__(kThreads)
    keep_roundtrip_kernel(const float* __restrict__ x, int64_t n, StoreDtype dt, bool vec4, float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t quads = vec4 ? n / 4 : 0;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < quads; q += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[q];
    reinterpret_cast<float4*>(out)[q] =
        make_float4(round_to_store(v.x, dt), round_to_store(v.y, dt), round_to_store(v.z, dt), round_to_store(v.w, dt));
  }
  for (int64_t e = 4 * quads + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride)
    out[e] = round_to_store(x[e], dt);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n / 4 + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 1 << 20));
}

class KeepTwin final : public FormatTwin {
 public:
  explicit KeepTwin(StoreDtype dt) : dt_(dt) {}

  std::string name() const override { return std::string("keep-") + store_dtype_name(dt_); }

  CodeBytes code_bytes(SpanBatch b) const override {
    return {static_cast<size_t>(b.elements()) * (store_dtype_bits(dt_) / 8), 0};
  }

  void quantize(const float* x, SpanBatch b, void* codes, void*, cudaStream_t stream) const override {
    const int64_t n = b.elements();
    if (n == 0) return;
    const bool vec4 = aligned16(x) && aligned16(codes);
    if (dt_ == StoreDtype::F32)
      keep_quantize_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(x, n, dt_, vec4, static_cast<uint32_t*>(codes));
    else
      keep_quantize_kernel<uint16_t><<<grid_for(n), kThreads, 0, stream>>>(x, n, dt_, vec4, static_cast<uint16_t*>(codes));
    KVB_CUDA_CHECK_LAUNCH(keep_quantize_kernel);
  }

  void dequantize(const void* codes, const void*, SpanBatch b, float* out, cudaStream_t stream) const override {
    const int64_t n = b.elements();
    if (n == 0) return;
    const bool vec4 = aligned16(out) && aligned16(codes);
    if (dt_ == StoreDtype::F32)
      keep_dequantize_kernel<uint32_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const uint32_t*>(codes), n,
                                                                             dt_, vec4, out);
    else
      keep_dequantize_kernel<uint16_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const uint16_t*>(codes), n,
                                                                             dt_, vec4, out);
    KVB_CUDA_CHECK_LAUNCH(keep_dequantize_kernel);
  }

  void roundtrip(const float* x, SpanBatch b, float* out, cudaStream_t stream) const override {
    const int64_t n = b.elements();
    if (n == 0) return;
    keep_roundtrip_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, dt_, aligned16(x) && aligned16(out), out);
    KVB_CUDA_CHECK_LAUNCH(keep_roundtrip_kernel);
  }

 private:
  StoreDtype dt_;
};

}  // namespace

std::unique_ptr<FormatTwin> make_keep_twin(const Format& format) {
  const auto* f = dynamic_cast<const KeepFormat*>(&format);
  if (!f) return nullptr;
  return std::make_unique<KeepTwin>(f->dtype());
}

}  // namespace kvb::cuda
