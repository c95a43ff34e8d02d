// The data a strategy's `calibration_data` parameter names (the optimal allocator
// measuring its distortion tables on one recording or text and evaluated on another,
// methods.md §3 "Calibration on other data").
//
// The value names data as [data] names one of several sequences, with every other
// [data] setting kept (tensor names and layout, max_tokens, the checkpoint and
// tokenizer, the synthetic shape):
//   data.source = "file"       a recording path (as data.recordings);
//   data.source = "model"      a text path, or a token-file path when [data] reads
//                              token_file (as data.texts / data.token_files);
//   data.source = "synthetic"  "seed N": the synthetic recording with seed N (as
//                              data.synthetic.seeds).
// Paths are looked up as data paths are (working directory, config directory, source
// tree). The data is loaded once per process and value; its statistics are measured
// on the [calibration] positions resolved for its own length.
#pragma once
#include "experiments/experiment.h"
#include "sim/strategies/strategy.h"

namespace kvb {

// A resolver bound to the experiment and the evaluated recording: checks that the
// calibration data has the evaluated recording's layers, query and KV heads and
// head_dim (its token count may differ). Errors name the parameter and the value:
// ConfigError for a value of the wrong form or a missing file, Error for a shape
// mismatch or data that does not load.
CalibrationResolver calibration_resolver(const ExperimentSpec& spec, const Recording& evaluated);

}  // namespace kvb
