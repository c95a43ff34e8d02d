// Which forward pass runs a model for `kvbudget eval` and `kvbudget generate`:
//   cpu   the host Transformer (sim/model/transformer.h), the reference; the default
//   cuda  the CUDA forward pass (kernels/model_forward.h); a plan with a format that
//         has no CUDA twin fails naming the format and unit; no device, or a build
//         without nvcc, is an error
//   auto  cuda when this build has CUDA and a device is present, else cpu; a plan
//         with a format that has no twin then runs on the CPU, saying so on stderr
// `precision` (--precision, a model config's `precision`): the device pass's GEMMs in
// fp32 (the default) or on TF32 tensor cores (ForwardMath::Tf32, kernels/model_forward.h;
// its logit error against fp32 is in experiments/bench/RESULTS.md); the CPU ignores it.
#pragma once
#include <memory>
#include <string>

#include "experiments/backend.h"
#include "sim/model/transformer.h"

namespace kvb {

struct ModelBackend {
  BackendChoice choice;    // what was asked for, what runs, why
  ForwardBackend forward;  // empty for the CPU
  MatmulPrecision precision = MatmulPrecision::Fp32;  // of the device pass, when choice.used is cuda
  // ", precision tf32" when the device pass runs in tf32, else "": for the backend lines.
  std::string precision_note() const;
};

// Uploads the model to the device for cuda (and auto with a device). Throws
// ConfigError naming `where` for cuda without a device or in a build without CUDA.
ModelBackend make_model_backend(const std::shared_ptr<const Transformer>& model, BackendRequest request,
                                const std::string& where, MatmulPrecision precision = MatmulPrecision::Fp32);

}  // namespace kvb
