// The RoPE inverse frequencies a checkpoint's config implies: Hugging Face's default
// theta^(-2i/d) (sim/core/rope.h), divided by `factor` for linear scaling, or blended
// by wavelength for llama3 scaling. The rotation itself is sim/core/rope.h's.
#pragma once
#include <cstdint>
#include <vector>

#include "sim/model/model_config.h"

namespace kvb {

// inv_freq[i] for i < head_dim/2, in fp32 as Hugging Face computes the default ones.
std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim);

}  // namespace kvb
