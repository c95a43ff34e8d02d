// How a measurement backend runs its matrix products: the config's `precision`
// (configs/README.md). The CPU computes in fp32/fp64 always; the CUDA simulator
// (kernels/cuda_simulator.h) runs the products that change with the plan, and the CUDA
// forward pass (kernels/model_forward.h, ForwardMath) its GEMMs, either in fp32 (the
// default: metrics within 1e-5 of the CPU) or, in the declared fast mode, on TF32
// tensor cores (10-bit mantissas of the products' inputs; measured: the metrics'
// means within 1e-5 of fp32, experiments/bench/RESULTS.md).
#pragma once

namespace kvb {

enum class MatmulPrecision { Fp32, Tf32 };

inline const char* matmul_precision_name(MatmulPrecision p) { return p == MatmulPrecision::Tf32 ? "tf32" : "fp32"; }

}  // namespace kvb
