// Host/device portability for code shared between sim/ (CPU) and kernels/ (CUDA).
//
// Everything marked KVB_HD is compiled by both g++ and nvcc, so the CPU reference
// and the CUDA kernels execute the same per-element arithmetic. Rules for such code:
//  - no std:: containers, no exceptions, no virtual calls;
//  - multiplies and adds go through kvb::mul_rn / add_rn (sim/core/hd_math.h) where the
//    result must be bit-identical: nvcc would otherwise contract a*b+c into an FMA.
#pragma once

#if defined(__CUDACC__)
#define KVB_HD __host__ __device__ __forceinline__
#else
#define KVB_HD inline
#endif

// After a switch that lists every value of an enum (each case returns): says the end is
// never reached, on host and device, without a fallback value.
#define KVB_UNREACHABLE() __builtin_unreachable()
