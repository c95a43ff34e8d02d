// [data] and [task] of an experiment config: where the recording comes from (a
// recording file, a seeded synthetic one, or a model run on a text), its sequences,
// and which metrics such data can measure. configs/README.md documents the keys.
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "experiments/config.h"
#include "sim/metrics/metric_table.h"
#include "sim/model/model_eval.h"
#include "sim/recording.h"
#include "sim/synthetic.h"

namespace kvb {

// [data] source = "model": a checkpoint run on a text; the recording strategies see is
// the exact model's, and every point also gets the model-level metrics.
struct ModelDataSpec {
  std::filesystem::path checkpoint;  // Hugging Face checkpoint directory
  TokenSource tokens;                // text or token ids, tokenizer, BOS, max_tokens
  ContinuationSpec continuations;    // greedy continuations for token match and BLEU
  WindowSpec windows;                // data.n_ctx, data.score: chunked evaluation of a long text
  // [task]: an answer task for answer_accuracy and the flips (sim/model/answer_task.h);
  // its tokenizer and BOS setting are [data]'s.
  std::optional<AnswerTaskSpec> task;
  std::string task_where;            // "file:line: task.file", for messages about the task
  // data.quantize_layers: the layers every point's plan quantizes (resolved against
  // config.json's layer types; empty = every layer), the others stored whole at
  // other_layers_format (sim/model/layer_selection.h).
  std::vector<int64_t> quantize_layers;
  std::string quantize_layers_where;  // "file:line: data.quantize_layers"
  FormatPtr other_layers_format;
};

struct DataSpec {
  enum class Source { File, Synthetic, Model } source = Source::File;
  RecordingSpec file;
  SyntheticSpec synthetic;
  ModelDataSpec model;
  int64_t max_tokens = 0;  // applied to synthetic and model data too
  // data.stream_layers: whether the run streams the recording's layers, one held at a
  // time (experiments/streaming.h); nullopt = automatic (when the keys and values are
  // large and the run allows it).
  std::optional<bool> stream_layers;
  std::string stream_layers_where;  // "file:line: data.stream_layers"
  std::string where;       // config location, for messages
  // Several sequences (methods.md §4 "Several sequences"): every point is measured on
  // each and results aggregate over them. data.recordings (source = "file"),
  // data.texts or data.token_files (source = "model"): the paths, resolved, in order
  // (a glob expanded in place, sorted), with the fields above holding the first;
  // data.synthetic.seeds: the seeds, synthetic.seed the first. Both empty: one
  // sequence, the fields above.
  std::vector<std::filesystem::path> sequence_paths;
  std::vector<uint64_t> sequence_seeds;
  std::string sequences_where;  // "file:line: data.recordings", for messages
  size_t sequence_count() const {
    return std::max<size_t>(1, std::max(sequence_paths.size(), sequence_seeds.size()));
  }
};

// A data path as a config names it: relative paths are looked up from the working
// directory, then from the config file's directory, then from the source tree. Throws
// kvb::ConfigError "WHERE: data path '...' not found (looked in ...)".
std::filesystem::path resolve_data_path(const std::string& raw, const std::filesystem::path& config,
                                        const std::string& where);

// One DataSpec per sequence of `data` (a copy of `data` with its path or seed set and
// the lists cleared); `data` itself when it names one sequence.
std::vector<DataSpec> expand_sequences(const DataSpec& data);
// How messages and per-sequence results name a sequence of expand_sequences(): its
// recording, text or token file path, or "synthetic seed N".
std::string sequence_source(const DataSpec& one);

// Reads [data] (`config`: the config file, whose folder relative data paths are also
// looked up in; `seed`: the experiment's, the default of data.synthetic.seed). Throws
// ConfigError with file:line locations.
DataSpec parse_data(const ConfigTable& t, const std::filesystem::path& config, uint64_t seed);

// [task]: an answer task for the model of [data] (configs/README.md), stored in
// data.model.task. Throws ConfigError unless data.source is Model.
void parse_task(const ConfigTable& t, const std::filesystem::path& config, DataSpec& data);

// Model-level metrics need a model data source, those of greedy continuations need
// continuations, and those of an answer task a [task]: throws ConfigError naming
// `where` when `def` cannot be measured on `data`.
void check_metric_source(const MetricDef& def, const DataSpec& data, const std::string& where);

}  // namespace kvb
