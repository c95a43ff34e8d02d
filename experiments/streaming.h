// Layer streaming for a run (issue 20, "Long contexts"): instead of holding every
// layer's keys, values and queries for the whole run, the run holds one layer at a time.
//
//   pass 1 (stream_recording): each layer is generated, validated, hashed into the
//     data identity, and what the points' plans read of it computed into their
//     RecordingStats: its attention statistics when some point reads them, its key
//     redundancy ρ over the token ranges phase and taqg points name
//     (Strategy::key_rho_ranges, RecordingStats::add_key_rho_layer); the generator's
//     measured metadata is completed after the last;
//   plans: built on the statistics (check_plans with them), the layers not held;
//   pass 2 (run_sweep with the StreamedRecording): each layer generated again and every
//     point's tasks of that layer measured, then it is dropped.
//
// So the run's memory is one layer's keys, values and kept queries (plus the per-layer
// exact pass, per-thread scratch and the points' rows), at the cost of generating every
// layer twice. Results are the held recording's bit for bit (every per-layer quantity is
// computed by the same code on the same tensors, and merged in the same order).
//
// For a recording file, "generated" is "read" (RecordingFileLayers: the file stays
// open, each layer read and cut to max_tokens when a pass needs it).
//
// Which runs stream (data.stream_layers, configs/README.md): a synthetic recording or a
// recording file, one sequence, (synthetic) without data.max_tokens cutting it after
// generation, on either backend (the CUDA one uploads the held layer alone, as the
// sweep holds it: Measurer::layer_held), whose points' strategies plan on attention
// statistics and key ρ at most (StrategyType::plan_reads; not optimal, which measures
// distortion tables on the layers' tensors).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "experiments/experiment.h"
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

// A recording streamed, after its first pass.
struct StreamedData {
  std::unique_ptr<SyntheticLayers> synthetic;   // the layers' source: the generator,
  std::unique_ptr<RecordingFileLayers> file;    // or the recording file
  std::unique_ptr<StreamedRecording> streamed;  // its recording(): every field, no layer held
  // The statistics every point's plan reads, computed in the first pass: the attention
  // statistics when some point's strategy needs them (then complete, else never warmed
  // up), the key ρ of every range some point names; nullptr when no point reads either.
  std::unique_ptr<RecordingStats> stats;
  std::string identity;  // recording_identity, as on the held recording
};

// Opens the synthetic recording or recording file `data` describes (a synthetic one
// keeping what `keep` says) and runs the first pass over its layers (above), computing
// the statistics the plans of `points` read (attention statistics on spec's calibration
// positions, key ρ). Throws what generate_synthetic, load_recording and
// Recording::validate throw; a point that cannot plan on the data (a bad rho_layers, a
// phase_marker absent) is left to check_plans to report, as on a held recording.
StreamedData stream_recording(const ExperimentSpec& spec, const DataSpec& data, const SyntheticKeep& keep,
                              const std::vector<SweepPoint>& points);

// Whether some point's strategy reads the attention statistics (Strategy::needs_statistics).
bool points_need_statistics(const std::vector<SweepPoint>& points);

// The key ρ ranges the points' plans will read on `rec` (Strategy::key_rho_ranges),
// each once, in the order of the points. A point whose strategy cannot be made is
// skipped (check_plans reports it).
std::vector<KeyRhoRange> points_key_rho_ranges(const std::vector<SweepPoint>& points, const Recording& rec);

}  // namespace kvb
