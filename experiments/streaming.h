// Layer streaming for a run (issue 20, "Long contexts"): instead of holding every
// layer's keys, values and queries for the whole run, the run holds one layer at a time.
//
// Two passes, when some point's plan reads what only the layers give (its strategy
// needs the attention statistics or names key ρ ranges: StrategyType::plan_reads,
// points_need_statistics, points_key_rho_ranges), or when the data's identity must be
// known before anything is measured (a --resume run checks it against the folder's):
//   pass 1 (stream_recording): each layer is generated, validated, hashed into the
//     data identity, and what the points' plans read of it computed into their
//     RecordingStats: its attention statistics when some point reads them, its key
//     redundancy ρ over the token ranges phase and taqg points name
//     (Strategy::key_rho_ranges, RecordingStats::add_key_rho_layer); the generator's
//     measured metadata is completed after the last;
//   plans: built on the statistics (check_plans with them), the layers not held;
//   pass 2 (run_sweep with the StreamedRecording): each layer generated again and every
//     point's tasks of that layer measured, then it is dropped.
// One pass otherwise (FirstPass::WhenNeeded with no point reading either: uniform
// formats, KIVI, windows with fixed sinks): stream_recording only opens the source, the
// plans are built on the shapes, and the sweep's pass does pass 1's work as it loads
// each layer the first time (OnePassCheck): generated once, validated, hashed into the
// identity, measured, dropped. The identity (the same hash over the same layers in the
// same order) and the generator's measured metadata are complete once the last layer is
// loaded, before its tasks run and so before any point finishes (every point has tasks
// on every layer): the runner then writes them into manifest.json, so that a point in
// results.jsonl always has the identity --resume and merge compare beside it (until
// then the manifest has no data_identity: a run stopped or killed before has none, and
// no finished point; the synthetic data's warnings, printed before the sweep in two
// passes, are printed then). A layer
// that fails validation ends the sweep with Recording::validate_layer's error (the
// layer and tensor named), and the runner marks the manifest "failed".
//
// So the run's memory is one layer's keys, values and kept queries (plus the per-layer
// exact pass, per-thread scratch and the points' rows), at the cost of generating every
// layer twice when the plans need a first pass. Results are the held recording's bit
// for bit (every per-layer quantity is computed by the same code on the same tensors,
// and merged in the same order), in one pass or two.
//
// For a recording file, "generated" is "read" (RecordingFileLayers: the file stays
// open, each layer read and cut to max_tokens when a pass needs it).
//
// Which runs stream (data.stream_layers, configs/README.md): a synthetic recording or a
// recording file, one sequence, (synthetic) without data.max_tokens cutting it after
// generation, on either backend (the CUDA one uploads the held layer alone, as the
// sweep holds it: Measurer::layer_held; meanwhile the host loads the next layer,
// StreamedRecording::set_prefetch), whose points' strategies plan on attention
// statistics and key ρ at most (StrategyType::plan_reads; not optimal, which measures
// distortion tables on the layers' tensors).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "experiments/experiment.h"
#include "experiments/shard.h"
#include "experiments/sweep.h"
#include "sim/layer_stream.h"
#include "sim/strategies/statistics.h"
#include "sim/synthetic.h"

namespace kvb {

// data.stream_layers unset streams when the keys and values the run would hold
// (2 x layers x kv_heads x tokens x head_dim fp32) reach this many bytes.
inline constexpr double kStreamLayersAutoBytes = 1024.0 * 1024.0 * 1024.0;

// Why a run cannot stream its layers ("" when it can): the first reason, naming the
// config key or point.
std::string streaming_obstacle(const ExperimentSpec& spec, const std::vector<SweepPoint>& points);

// Whether the run streams: data.stream_layers when given (true with an obstacle throws
// kvb::ConfigError at data.stream_layers naming it), else when there is no obstacle, the
// recording is synthetic and its keys and values reach kStreamLayersAutoBytes.
bool streams_layers(const ExperimentSpec& spec, const std::vector<SweepPoint>& points);

// Pass 1's work done by the sweep's pass, for a recording streamed in one pass: the
// StreamedRecording's loaded hook calls layer_loaded after each load, on the sweep's
// thread, once the layer is in the recording (also when it was prefetched). The first load of layer
// l validates it (Recording::validate_layer: throws kvb::Error naming the layer and
// tensor) and hashes it into the identity; the first loads must come in layer order (the
// streamed sweep's), later loads of a layer do nothing. After the last layer's first
// load, the generator's measured metadata is added to the recording
// (SyntheticLayers::finish), the identity finished, and on_complete called with it.
class OnePassCheck {
 public:
  // `synthetic`: the generator whose layers are loaded, or nullptr (a recording file).
  OnePassCheck(const Recording& rec, SyntheticLayers* synthetic);
  void layer_loaded(Recording& rec, int64_t layer);
  // Whether every layer has been loaded (and the identity is known).
  bool complete() const { return next_ == layers_; }
  const std::string& identity() const { return identity_text_; }
  // Layers loaded for the first time so far (0..layers).
  int64_t layers_checked() const { return next_; }
  // When set: called once, by the first load of the last layer, with the identity (an
  // exception it throws leaves that load as one that threw).
  std::function<void(const std::string& identity)> on_complete;

 private:
  SyntheticLayers* synthetic_;
  RecordingIdentity identity_;
  int64_t layers_, next_ = 0;
  std::string identity_text_;
};

// How stream_recording treats pass 1.
enum class FirstPass {
  Always,      // runs it before returning: the identity and statistics known
  WhenNeeded,  // runs it when some point's plan reads the statistics or key ρ; else one pass
};

// A recording streamed, after its first pass (or, in one pass, before the sweep's).
struct StreamedData {
  std::unique_ptr<SyntheticLayers> synthetic;   // the layers' source: the generator,
  std::unique_ptr<RecordingFileLayers> file;    // or the recording file
  std::unique_ptr<StreamedRecording> streamed;  // its recording(): every field, no layer held
  // The statistics every point's plan reads, computed in the first pass: the attention
  // statistics when some point's strategy needs them (then complete, else never warmed
  // up), the key ρ of every range some point names; nullptr when no point reads either.
  std::unique_ptr<RecordingStats> stats;
  // recording_identity, as on the held recording; empty in one pass (one_pass->identity()
  // gives it once one_pass->complete()).
  std::string identity;
  // In one pass: what validates and hashes the layers as the sweep loads them; else nullptr.
  std::unique_ptr<OnePassCheck> one_pass;
};

// Opens the synthetic recording or recording file `data` describes (a synthetic one
// keeping what `keep` says) and runs the first pass over its layers (above), computing
// the statistics the plans of `points` read (attention statistics on spec's calibration
// positions, key ρ) -- or, with FirstPass::WhenNeeded and no point reading either,
// leaves that pass's work to the sweep (StreamedData::one_pass). Throws what
// generate_synthetic, load_recording and Recording::validate throw (in one pass,
// validate_layer's errors come from the sweep's loads); a point that cannot plan on the
// data (a bad rho_layers, a phase_marker absent) is left to check_plans to report, as
// on a held recording.
StreamedData stream_recording(const ExperimentSpec& spec, const DataSpec& data, const SyntheticKeep& keep,
                              const std::vector<SweepPoint>& points, FirstPass first_pass = FirstPass::Always);

// In one pass: loads (and drops) each layer the sweep's pass has not loaded yet, in
// order, so that the identity and metadata are complete (a sweep with no task on some
// layer). Does nothing when complete, or not in one pass.
void finish_one_pass(StreamedData& data);

// Whether some point's strategy reads the attention statistics (Strategy::needs_statistics).
bool points_need_statistics(const std::vector<SweepPoint>& points);

// The key ρ ranges the points' plans will read on `rec` (Strategy::key_rho_ranges),
// each once, in the order of the points. A point whose strategy cannot be made is
// skipped (check_plans reports it).
std::vector<KeyRhoRange> points_key_rho_ranges(const std::vector<SweepPoint>& points, const Recording& rec);

}  // namespace kvb
