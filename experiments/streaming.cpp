#include "experiments/streaming.h"

#include <algorithm>

#include "experiments/query_positions.h"
#include "experiments/shard.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/strategies/strategy.h"

namespace kvb {

namespace {
// The keys and values of the recording `data` describes, in fp32 bytes.
double kv_bytes(const DataSpec& data) {
  const SyntheticSpec& s = data.synthetic;
  return 2.0 * 4.0 * static_cast<double>(s.layers) * static_cast<double>(s.kv_heads) *
         static_cast<double>(s.tokens) * static_cast<double>(s.head_dim);
}
}  // namespace

std::string streaming_obstacle(const ExperimentSpec& spec, const std::vector<SweepPoint>& points) {
  const DataSpec& data = spec.data;
  if (data.source == DataSpec::Source::Model)
    return "data.source = \"model\": the model's recording is held whole (its evaluator runs the model on it)";
  if (data.sequence_count() > 1) return data.sequences_where + ": a run over several sequences holds each whole";
  if (data.source == DataSpec::Source::Synthetic && data.max_tokens > 0 && data.max_tokens < data.synthetic.tokens)
    return "data.max_tokens = " + std::to_string(data.max_tokens) +
           " cuts the recording after it is generated; set data.synthetic.tokens instead";
  for (const SweepPoint& p : points)
    if (require_strategy_type(p.type, "strategy").plan_reads == PlanReads::Tensors)
      return "point " + p.key + ": strategy type '" + p.type +
             "' reads the recording's tensors while its plan is built (every layer held)";
  return {};
}

bool streams_layers(const ExperimentSpec& spec, const std::vector<SweepPoint>& points) {
  const std::string obstacle = streaming_obstacle(spec, points);
  if (spec.data.stream_layers) {
    if (*spec.data.stream_layers && !obstacle.empty())
      throw ConfigError(spec.data.stream_layers_where + ": stream_layers = true, but this run cannot stream its layers: " +
                        obstacle + " (experiments/streaming.h; configs/README.md, \"Long contexts\")");
    return *spec.data.stream_layers;
  }
  // A file's size is known once it is opened: it streams when stream_layers = true.
  return obstacle.empty() && spec.data.source == DataSpec::Source::Synthetic &&
         kv_bytes(spec.data) >= kStreamLayersAutoBytes;
}

bool points_need_statistics(const std::vector<SweepPoint>& points) {
  for (const SweepPoint& p : points)
    if (require_strategy_type(p.type, "strategy").make(p.params)->needs_statistics()) return true;
  return false;
}

std::vector<KeyRhoRange> points_key_rho_ranges(const std::vector<SweepPoint>& points, const Recording& rec) {
  std::vector<KeyRhoRange> ranges;
  for (const SweepPoint& p : points) {
    std::unique_ptr<Strategy> strategy;
    try {
      strategy = require_strategy_type(p.type, "strategy").make(p.params);
    } catch (const std::exception&) {
      continue;  // check_plans reports it
    }
    for (const KeyRhoRange& r : strategy->key_rho_ranges(rec))
      if (std::find(ranges.begin(), ranges.end(), r) == ranges.end()) ranges.push_back(r);
  }
  return ranges;
}

OnePassCheck::OnePassCheck(const Recording& rec, SyntheticLayers* synthetic)
    : synthetic_(synthetic), identity_(rec), layers_(rec.num_layers()) {}

void OnePassCheck::layer_loaded(Recording& rec, int64_t layer) {
  if (layer < next_) return;  // loaded before: checked and hashed then
  if (layer > next_)
    throw Error("internal: OnePassCheck: layer " + std::to_string(layer) + " loaded before layer " +
                std::to_string(next_) + " (the identity hashes the layers in order)");
  rec.validate_layer(layer);
  identity_.add_layer(rec.layers[static_cast<size_t>(layer)]);
  if (++next_ < layers_) return;
  if (synthetic_) synthetic_->finish(rec);
  identity_text_ = identity_.finish(rec);
  if (on_complete) on_complete(identity_text_);
}

StreamedData stream_recording(const ExperimentSpec& spec, const DataSpec& data, const SyntheticKeep& keep,
                              const std::vector<SweepPoint>& points, FirstPass first_pass) {
  StreamedData out;
  Recording skeleton;
  StreamedRecording::LayerLoader load;
  if (data.source == DataSpec::Source::Synthetic) {
    out.synthetic = std::make_unique<SyntheticLayers>(data.synthetic, keep);
    SyntheticLayers& layers = *out.synthetic;
    skeleton = layers.skeleton();
    load = [&layers](Recording& rec, int64_t l) { layers.generate_into(rec, l); };
  } else if (data.source == DataSpec::Source::File) {
    out.file = std::make_unique<RecordingFileLayers>(data.file);
    const RecordingFileLayers& layers = *out.file;
    skeleton = layers.skeleton();
    load = [&layers](Recording& rec, int64_t l) { layers.load_into(rec, l); };
    if (skeleton.tokens < 2)  // as build_recording says it
      throw Error(data.file.path.string() + ": the recording has " + std::to_string(skeleton.tokens) +
                  " token: its one query attends to itself alone, so attention KL would be 0 and top-k overlap 1 "
                  "whatever the cache holds; a recording needs at least 2 tokens");
  } else {
    throw Error("internal: stream_recording of a model's recording");
  }
  skeleton.validate_except_layer_tensors();
  const bool attention_statistics = points_need_statistics(points);
  const std::vector<KeyRhoRange> rho_ranges = points_key_rho_ranges(points, skeleton);
  if (first_pass == FirstPass::WhenNeeded && !attention_statistics && rho_ranges.empty()) {
    // One pass: the sweep's holds validate and hash each layer, on the sweep's thread
    // once the layer is in the recording (the loaded hook: a prefetched load runs on a
    // thread of its own, into a copy). The generators and loaders are on the heap: the
    // lambdas' references outlive `out`'s moves.
    out.one_pass = std::make_unique<OnePassCheck>(skeleton, out.synthetic.get());
    out.streamed = std::make_unique<StreamedRecording>(
        std::move(skeleton), std::move(load),
        [check = out.one_pass.get()](Recording& rec, int64_t l) { check->layer_loaded(rec, l); });
    return out;
  }
  out.streamed = std::make_unique<StreamedRecording>(std::move(skeleton), std::move(load));
  StreamedRecording& streamed = *out.streamed;
  const Recording& rec = streamed.recording();
  if (attention_statistics || !rho_ranges.empty())
    out.stats = std::make_unique<RecordingStats>(rec, resolve_positions(spec, rec.tokens).calibration);
  RecordingIdentity identity(rec);
  for (int64_t l = 0; l < rec.num_layers(); ++l) {
    const HeldLayer held(streamed, l);
    rec.validate_layer(l);
    identity.add_layer(rec.layers[static_cast<size_t>(l)]);
    if (attention_statistics) out.stats->add_layer(l);
    if (!rho_ranges.empty()) out.stats->add_key_rho_layer(l, rho_ranges);
  }
  if (attention_statistics) out.stats->finish_layers();
  if (out.synthetic) out.synthetic->finish(streamed.recording_to_complete());
  out.identity = identity.finish(rec);
  return out;
}

void finish_one_pass(StreamedData& data) {
  if (!data.one_pass) return;
  for (int64_t l = data.one_pass->layers_checked(); l < data.streamed->recording().num_layers(); ++l) {
    const HeldLayer held(*data.streamed, l);  // its load checks it
  }
}

}  // namespace kvb
