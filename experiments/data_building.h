// The data an experiment runs on, built from its [data] spec: the recording (loaded,
// generated or recorded from the model's exact run) and, for a model, its evaluator.
#pragma once
#include <memory>

#include "experiments/backend.h"
#include "experiments/data_spec.h"
#include "experiments/experiment.h"
#include "experiments/sweep.h"
#include "sim/model/model_eval.h"
#include "sim/recording.h"
#include "sim/synthetic.h"

namespace kvb {

// Builds the recording the experiment describes (loads or generates, truncates; for
// a model, records the exact run). `keep`: what a synthetic recording keeps (its other
// queries and pre-RoPE keys are dropped as they are generated); files and models keep
// everything.
Recording build_recording(const DataSpec& data, const SyntheticKeep& keep = {});

// What a run of `spec` and `points` (the whole sweep's, so that every shard and resumption
// of a run sees the same data) reads of the synthetic recording `data` describes:
// the queries of its calibration and evaluated positions (every position when they
// cover them all; both backends read the sampled queries only), and the pre-RoPE keys
// only when some point's parameters name a prerope: format. Everything for data that
// is not synthetic.
SyntheticKeep synthetic_keep(const ExperimentSpec& spec, const std::vector<SweepPoint>& points, const DataSpec& data);

// For source = "model": loads the checkpoint and the tokens and runs the exact model
// (ModelEvaluator), whose recording() is the experiment's recording. `backend` is where
// its forward passes run, the quantized points' included (experiments/model_backend.h;
// a task's problems run on the CPU), `precision` the device pass's GEMMs.
std::shared_ptr<const ModelEvaluator> build_model_evaluator(const DataSpec& data,
                                                            BackendRequest backend = BackendRequest::Cpu,
                                                            MatmulPrecision precision = MatmulPrecision::Fp32);

}  // namespace kvb
