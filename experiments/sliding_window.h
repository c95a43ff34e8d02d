// Where simulated attention is not the model's: a sliding-window model attends, at
// query t, to the last W keys only (Recording::attention_windows), while the simulator
// computes full causal attention. `kvbudget run` (check_full_causal_metrics) and
// `kvbudget bounds` refuse to measure attention on such a recording past W.
#pragma once
#include <string>

#include "sim/recording.h"

namespace kvb {

// Why attention simulated on `rec` is not the model's: "NAME slides over the last W = 16
// tokens (layers 0,1) and 64 tokens are evaluated: the simulator computes full causal
// attention, which the model does not compute for queries at or beyond W" when `rec` is
// a sliding-window model's recorded past its smallest window W
// (Recording::full_causal_queries() < T), else "".
std::string beyond_window_reason(const Recording& rec);

}  // namespace kvb
