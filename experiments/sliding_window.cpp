#include "experiments/sliding_window.h"

#include <vector>

#include "sim/core/strings.h"

namespace kvb {

std::string beyond_window_reason(const Recording& rec) {
  const int64_t W = rec.full_causal_queries();
  if (W >= rec.tokens) return "";
  std::vector<std::string> sliding;
  for (size_t l = 0; l < rec.attention_windows.size(); ++l)
    if (rec.attention_windows[l] > 0) sliding.push_back(std::to_string(l));
  return rec.name + " slides over the last W = " + std::to_string(W) + " tokens (layers " + join(sliding, ",") +
         ") and " + std::to_string(rec.tokens) +
         " tokens are evaluated: the simulator computes full causal attention, which the model does not compute "
         "for queries at or beyond W";
}

}  // namespace kvb
