#include "experiments/calibration_data.h"

#include <map>
#include <memory>
#include <mutex>

#include "experiments/data_building.h"
#include "experiments/data_spec.h"
#include "experiments/query_positions.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/strategies/statistics.h"

namespace kvb {

namespace {

// One loaded calibration data set; lives as long as the process (plans of every
// sequence and of check_plans and run_sweep share its distortion tables).
struct LoadedCalibration {
  Recording rec;
  std::unique_ptr<RecordingStats> stats;
  std::string name;
};

// The [data] spec the value names (one sequence of [data], the value's path or seed).
DataSpec calibration_data_spec(const ExperimentSpec& spec, const std::string& value) {
  const std::string where = "calibration_data \"" + value + "\"";
  DataSpec one = spec.data;
  one.sequence_paths.clear();
  one.sequence_seeds.clear();
  if (value.empty()) throw ConfigError(where + ": names no data; give a recording or text path, or \"seed N\"");
  if (one.source == DataSpec::Source::Synthetic) {
    const std::string prefix = "seed ";
    size_t used = 0;
    uint64_t seed = 0;
    bool ok = value.rfind(prefix, 0) == 0 && value.size() > prefix.size();
    if (ok) {
      try {
        seed = std::stoull(value.substr(prefix.size()), &used);
        ok = used == value.size() - prefix.size() && value[prefix.size()] != '-';
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok)
      throw ConfigError(where + ": [data] is synthetic (" + spec.data.where +
                        "), so calibration data is named by its seed, as \"seed 7\"");
    one.synthetic.seed = seed;
    return one;
  }
  if (value.rfind("seed ", 0) == 0)
    throw ConfigError(where + ": a seed names synthetic data, but [data] (" + spec.data.where +
                      ") is not synthetic; give a " +
                      (one.source == DataSpec::Source::Model ? "text path" : "recording path"));
  const std::filesystem::path path = resolve_data_path(value, spec.config_path, where);
  if (!std::filesystem::exists(path)) throw ConfigError(where + ": data path '" + value + "' not found");
  if (one.source == DataSpec::Source::Model)
    (one.model.tokens.text.empty() ? one.model.tokens.token_file : one.model.tokens.text) = path;
  else
    one.file.path = path;
  return one;
}

const LoadedCalibration& load_calibration(const ExperimentSpec& spec, const std::string& value) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<LoadedCalibration>> loaded;
  const DataSpec one = calibration_data_spec(spec, value);
  // What identifies the loaded data: the value as resolved, and the [data] settings
  // that shape it.
  const SyntheticSpec& syn = one.synthetic;
  const std::string key = spec.config_path.string() + "\n" + spec.data.where + "\n" + value + "\n" +
                          sequence_source(one) + "\n" + std::to_string(static_cast<int>(one.source)) + "/" +
                          std::to_string(one.max_tokens) + "/" + one.file.key + "/" + std::to_string(syn.layers) +
                          "x" + std::to_string(syn.q_heads) + "x" + std::to_string(syn.kv_heads) + "x" +
                          std::to_string(syn.head_dim) + "x" + std::to_string(syn.tokens);
  const std::lock_guard<std::mutex> lock(mu);  // plans are built in parallel: one loads, the others wait
  std::unique_ptr<LoadedCalibration>& slot = loaded[key];
  if (slot) return *slot;
  auto out = std::make_unique<LoadedCalibration>();
  out->name = sequence_source(one);
  try {
    out->rec = build_recording(one);
  } catch (const ConfigError& e) {
    throw ConfigError("calibration_data \"" + value + "\": " + e.what());
  } catch (const Error& e) {
    throw Error("calibration_data \"" + value + "\": " + e.what());
  }
  out->stats = std::make_unique<RecordingStats>(out->rec, calibration_positions(spec.calibration, out->rec.tokens));
  slot = std::move(out);
  return *slot;
}

}  // namespace

CalibrationResolver calibration_resolver(const ExperimentSpec& spec, const Recording& evaluated) {
  return [&spec, &evaluated](const std::string& value) {
    const LoadedCalibration& c = load_calibration(spec, value);
    const Recording& r = c.rec;
    if (r.num_layers() != evaluated.num_layers() || r.q_heads != evaluated.q_heads ||
        r.kv_heads != evaluated.kv_heads || r.head_dim != evaluated.head_dim)
      throw Error("calibration_data \"" + value + "\" (" + c.name + ") has " + r.summary() +
                  ", but the evaluated recording has " + evaluated.summary() +
                  ": calibration data needs the same layers, query and KV heads and head_dim (its token count may "
                  "differ)");
    return CalibrationData{&c.rec, c.stats.get(), c.name};
  };
}

}  // namespace kvb
