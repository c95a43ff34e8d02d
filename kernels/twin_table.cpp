#include "kernels/format_twin.h"

#include "kernels/fp4_twin.h"
#include "kernels/fp8_twin.h"
#include "kernels/ggml_twin.h"
#include "kernels/int_twin.h"
#include "kernels/keep_twin.h"
#include "kernels/nf4_twin.h"
#include "sim/core/error.h"

namespace kvb::cuda {

// The twin table: one entry per format family with a CUDA twin.
const std::vector<TwinFamily>& twin_families() {
  static const std::vector<TwinFamily> families = {
      {"int", &make_int_twin},
      {"keep", &make_keep_twin},
      {"ggml", &make_ggml_twin},
      {"fp8", &make_fp8_twin},
      {"fp4", &make_fp4_twin},
      {"nf4", &make_nf4_twin},
  };
  return families;
}

std::unique_ptr<FormatTwin> make_twin(const Format& format) {
  for (const TwinFamily& f : twin_families())
    if (std::unique_ptr<FormatTwin> twin = f.make(format)) return twin;
  return nullptr;
}

std::unique_ptr<FormatTwin> require_twin(const Format& format) {
  std::unique_ptr<FormatTwin> twin = make_twin(format);
  if (!twin) throw Error("format '" + format.name() + "' has no CUDA twin");
  return twin;
}

}  // namespace kvb::cuda
