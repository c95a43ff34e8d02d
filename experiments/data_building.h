// The data an experiment runs on, built from its [data] spec: the recording (loaded,
// generated or recorded from the model's exact run) and, for a model, its evaluator.
#pragma once
#include <memory>

#include "experiments/backend.h"
#include "experiments/data_spec.h"
#include "sim/model/model_eval.h"
#include "sim/recording.h"

namespace kvb {

// Builds the recording the experiment describes (loads or generates, truncates; for
// a model, records the exact run).
Recording build_recording(const DataSpec& data);

// For source = "model": loads the checkpoint and the tokens and runs the exact model
// (ModelEvaluator), whose recording() is the experiment's recording. `backend` is where
// its forward passes run, the quantized points' included (experiments/model_backend.h;
// a task's problems run on the CPU).
std::shared_ptr<const ModelEvaluator> build_model_evaluator(const DataSpec& data,
                                                            BackendRequest backend = BackendRequest::Cpu);

}  // namespace kvb
