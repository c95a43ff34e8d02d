// Measurer: where a measurement backend plugs in. A Measurer applies a Plan to one
// Recording and measures the error it causes (methods.md §4, tensor and attention
// level) into ErrorStats, as the CPU simulator (sim/simulator.h) defines it:
//
//   unsupported_reason  which plans (with which options) it can measure, and why not;
//   measure_layer       one layer of a plan: a sweep's (point, variant, layer) task;
//   measure_kv_head     the query heads of one KV head: a distortion-table entry of the
//                       optimal allocator (sim/strategies/optimal.h);
//   measure             every layer, merged (the optimal allocator's additivity check);
//   concurrency         how many measurements it runs at once, so the sweep knows
//                       whether to run its tasks in parallel.
//
// The implementations: CpuMeasurer (below, the reference) and cuda::CudaMeasurer
// (kernels/cuda_measurer.h). Both are created in one place, make_measurer()
// (experiments/backend.h); a new backend implements this interface and is added
// there. Each is bound to one recording (the CUDA one holds it on the device: every
// layer, or for a streamed recording the one layer it holds).
// Every method may be called from several threads at once; a measurer that cannot run
// measurements concurrently (concurrency() == 1) serializes them itself.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "sim/metrics/error_stats.h"
#include "sim/plan.h"
#include "sim/recording.h"
#include "sim/simulator.h"

namespace kvb {

class Measurer {
 public:
  virtual ~Measurer() = default;

  // The backend's name as configs spell it: "cpu", "cuda".
  virtual const char* name() const = 0;
  virtual const Recording& recording() const = 0;

  // Empty when the measure_* calls can run `plan` with `opt`; otherwise why not (for
  // cuda: the first format without a CUDA twin and its unit, a top-k beyond the
  // device's, an attribution region). Needs no device.
  virtual std::string unsupported_reason(const Plan& plan, const SimOptions& opt) const = 0;
  // Whether SimOptions::region (error attribution by region) can be honoured.
  virtual bool measures_regions() const = 0;
  // How many measurements run at once: the CPU's OpenMP threads, 1 for a device that
  // every measurement fills. A sweep runs its tasks in parallel only when it is > 1.
  virtual int concurrency() const = 0;

  // Work every later measurement with `opt` shares, done once before a sweep's tasks
  // (the CPU's exact attention pass, sim/exact_attention.h); results are identical
  // without it. Throws SimulationStopped when opt.stop becomes true meanwhile.
  virtual void prepare(const SimOptions& opt) { (void)opt; }
  // prepare() for layer `layer` only, while a streamed recording holds it
  // (sim/layer_stream.h); replaces what an earlier prepare built. Results are identical
  // without it.
  virtual void prepare_layer(const SimOptions& opt, int64_t layer) {
    (void)opt;
    (void)layer;
  }
  // Drops what prepare() or prepare_layer() built.
  virtual void release_prepared() {}

  // A streamed recording (sim/layer_stream.h) holds layer `layer`'s tensors from
  // layer_held(layer) to layer_released(layer), and that layer is measured only in
  // between. A measurer that keeps its own copy of the layers (CUDA's, on the device)
  // takes that layer's copy at layer_held and drops it at layer_released; the CPU one
  // reads the recording directly. Called only on a measurer made for a streamed
  // recording (make_measurer's `layers_streamed`), one layer at a time.
  virtual void layer_held(int64_t layer) { (void)layer; }
  virtual void layer_released(int64_t layer) { (void)layer; }

  // As kvb::simulate_layer: one layer (index into recording().layers), rows in
  // (q_head, position) order.
  virtual ErrorStats measure_layer(const Plan& plan, int64_t layer, const SimOptions& opt) = 0;
  // As kvb::simulate_kv_head: only that KV head's K and V units of `plan` are read.
  // Throws NonFiniteReconstruction (sim/reconstruction.h) when a format turns finite
  // keys or values of those units into Inf or NaN.
  virtual ErrorStats measure_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) = 0;
  // As kvb::simulate: every layer in order, merged.
  virtual ErrorStats measure(const Plan& plan, const SimOptions& opt) = 0;
};

// The reference: the CPU simulator (sim/simulator.h). Measurements are
// single-threaded and run concurrently, one per OpenMP thread.
class CpuMeasurer final : public Measurer {
 public:
  // `exact_cache_bytes`: the memory prepare() may give the run's exact attention pass
  // (ExactAttentionCache); 0 = none.
  explicit CpuMeasurer(const Recording& rec, size_t exact_cache_bytes = 0);
  ~CpuMeasurer() override;

  const char* name() const override { return "cpu"; }
  const Recording& recording() const override { return rec_; }
  std::string unsupported_reason(const Plan& plan, const SimOptions& opt) const override;
  bool measures_regions() const override { return true; }
  int concurrency() const override;
  void prepare(const SimOptions& opt) override;
  void prepare_layer(const SimOptions& opt, int64_t layer) override;
  void release_prepared() override;
  ErrorStats measure_layer(const Plan& plan, int64_t layer, const SimOptions& opt) override;
  ErrorStats measure_kv_head(const Plan& plan, int64_t layer, int64_t kv_head, const SimOptions& opt) override;
  ErrorStats measure(const Plan& plan, const SimOptions& opt) override;

 private:
  // `opt` with the exact pass prepare() built, unless it names one already.
  SimOptions with_exact(const SimOptions& opt) const;

  const Recording& rec_;
  size_t exact_cache_bytes_ = 0;
  std::unique_ptr<ExactAttentionCache> exact_;  // built by prepare()
};

// The measurer of the run's backend for a recording (the evaluated one, or the
// optimal allocator's calibration data): what StrategyInput::measurer_for holds.
using MeasurerFor = std::function<Measurer&(const Recording& rec)>;

}  // namespace kvb
