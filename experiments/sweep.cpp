#include "experiments/sweep.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>

#include "experiments/backend.h"
#include "experiments/calibration_data.h"
#include "experiments/query_positions.h"
#include "sim/core/background_queue.h"
#include "sim/core/buffer_pool.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/prerope_format.h"
#include "sim/layer_stream.h"
#include "sim/measurer.h"
#include "sim/metrics/point_metrics.h"
#include "sim/model/layer_selection.h"
#include "sim/simulator.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/statistics.h"

namespace kvb {

namespace {

std::string substitute(std::string s, const std::vector<std::pair<std::string, std::string>>& vars) {
  for (const auto& [name, value] : vars) s = replace_all(std::move(s), name, value);
  return s;
}

// "name(axis=v, ...)": a named block's point by its name and the values that tell its
// points apart (its axes and variables); just the name when it has none.
std::string point_display_label(const std::string& name,
                                const std::vector<std::pair<std::string, std::string>>& coords) {
  if (coords.empty()) return name;
  std::vector<std::string> parts;
  for (const auto& [axis, value] : coords) parts.push_back(axis + "=" + value);
  return name + "(" + join(parts, ", ") + ")";
}

// "type(p=v,...)" listing the parameters that differ from what is implied: the
// preset's value where the preset sets one, else the default. A preset point is
// named after its preset, and also lists a default-valued parameter the block sets
// that overrides another of the preset's (window_mode over its key_window_mode).
std::string point_key(const StrategyBlock& b, const Params& p, const std::vector<ParamDef>& defs) {
  std::vector<std::string> parts;
  auto overrides_preset = [&](const std::string& name) {
    if (b.preset.empty() || b.preset_values.count(name)) return false;
    const bool set = std::any_of(b.axes.begin(), b.axes.end(),
                                 [&](const Axis& a) { return a.name == name && !a.is_var && !a.from_preset; });
    if (!set) return false;
    const StrategyType& type = require_strategy_type(b.type, b.where);
    for (const auto& [preset_name, value] : b.preset_values)
      if (preset_value_overridden(type, preset_name, [&](const std::string& k) { return k == name; })) return true;
    return false;
  };
  for (const ParamDef& d : defs) {
    auto it = p.values().find(d.name);
    if (it == p.values().end()) continue;
    const ParamValue& v = it->second;
    auto preset = b.preset_values.find(d.name);
    const bool implied =
        preset != b.preset_values.end() ? preset->second == v : (d.default_value && *d.default_value == v);
    if (implied && !overrides_preset(d.name)) continue;
    parts.push_back(d.name + "=" + param_to_string(v));
  }
  return (b.preset.empty() ? b.type : b.preset) + "(" + join(parts, ",") + ")";
}

// Advances idx to the next combination of axis values (the last axis fastest);
// false once every combination was visited.
bool next_combination(std::vector<size_t>& idx, const std::vector<Axis>& axes) {
  for (size_t a = axes.size(); a-- > 0;) {
    if (++idx[a] < axes[a].values.size()) return true;
    idx[a] = 0;
  }
  return false;
}

// Throws kvb::Error when a point's error sums or attention rows are not finite: a
// format turned finite keys or values into Inf or NaN, and every metric would be
// meaningless (a KL of 0 next to a NaN output error).
void require_finite_errors(const ErrorStats& s, const Recording& rec) {
  const char* why = ": a format turned finite keys or values into Inf or NaN (values beyond its range)";
  if (!std::isfinite(s.k_err2) || !std::isfinite(s.v_err2))
    throw Error(std::string("the key/value error sums are not finite") + why);
  for (const AttentionRow& r : s.rows)
    if (first_nonfinite_value(r))
      throw Error("attention of layer " + std::to_string(rec.layer_ids[static_cast<size_t>(r.layer)]) + " head " +
                  std::to_string(r.q_head) + " at position " + std::to_string(r.position) + " is not finite" + why);
}

}  // namespace

void require_declared_columns(const Plan& plan, const std::string& type_name) {
  const StrategyType& type = require_strategy_type(type_name, "strategy");
  for (const Annotation& a : plan.annotations())
    if (std::find(type.columns.begin(), type.columns.end(), a.name) == type.columns.end())
      throw Error("internal: strategy '" + type_name + "' reported column '" + a.name +
                  "', which its entry in sim/strategies/registry.cpp does not list");
}

namespace {
bool target_column(const std::string& memory) { return memory == "bpe_target" || memory == "bytes_target"; }
// A plan stored alike at every length (no window, sink tokens, phases or groups along
// tokens) is the same cache at any context: allocated for a longer one, its memory and
// error still come from the cache measured.
bool sized_beyond_recording(const PointResult& r) {
  return r.sized_for_tokens > r.measured_tokens && !r.stores_tokens_alike;
}
}  // namespace

BootstrapSettings bootstrap_settings(const ExperimentSpec& spec) {
  BootstrapSettings b;
  b.seed = spec.seed;
  return b;
}

std::string extrapolation_line(const std::string& note) {
  return "extrapolated: " + note + " (docs/methods.md §1)";
}

double memory_value(const PointResult& r, const std::string& column) {
  if (column == "bpe") return r.bpe;
  if (column == "bpe_target") return r.bpe_target;
  if (column == "bytes") return r.bytes;
  if (column == "bytes_target") return r.bytes_target;
  if (column == "bpe_read") return r.bpe_read;
  throw Error("internal: '" + column + "' is not a memory column (memory_columns())");
}

bool extrapolated_on(const PointResult& r, const std::string& memory) {
  return sized_beyond_recording(r) || (target_column(memory) && r.target_extrapolated);
}

std::string extrapolated_label(const PointResult& r) {
  std::vector<std::string> what;
  if (sized_beyond_recording(r)) what.push_back("budget_context");
  if (r.target_extrapolated) what.push_back("target_context");
  return what.empty() ? "no" : join(what, "+");
}

std::string extrapolation_note(const PointResult& r, const std::string& memory, int64_t target_context) {
  if (!extrapolated_on(r, memory)) return "";
  std::vector<std::string> what;
  if (sized_beyond_recording(r))
    what.push_back("allocated for budget_context " + std::to_string(r.sized_for_tokens) + " tokens");
  if (target_column(memory) && r.target_extrapolated)
    what.push_back("memory at target_context " + std::to_string(target_context) + " tokens");
  return join(what, ", ") + ", error measured on " + std::to_string(r.measured_tokens);
}

namespace {
constexpr const char* kMemoryReadNoteMark = " point(s) have their error averaged over caches whose memory differs";
}  // namespace

bool is_memory_read_note(const std::string& warning) { return warning.find(kMemoryReadNoteMark) != std::string::npos; }

std::string memory_read_note(const std::vector<PointResult>& results, const std::vector<SweepPoint>& points) {
  size_t count = 0;
  const PointResult* most = nullptr;
  auto gap = [](const PointResult& r) { return std::fabs(r.bpe_read - r.bpe) / r.bpe; };
  for (const PointResult& r : results) {
    if (!r.ok || !std::isfinite(r.bpe_read) || !(r.bpe > 0) || !(gap(r) > kMemoryReadTolerance)) continue;
    ++count;
    if (!most || gap(r) > gap(*most)) most = &r;
  }
  if (!most) return "";
  return std::to_string(count) + kMemoryReadNoteMark + " from their bpe at " + std::to_string(most->measured_tokens) + " tokens by more than " +
         four_digits(kMemoryReadTolerance * 100) + " % (most: " + points.at(most->id).display_label + ", bpe " +
         four_digits(most->bpe) + ", " + four_digits(most->bpe_read) +
         " over the caches its evaluated queries read; points.csv bpe_read): a window, sink tokens, phases or a "
         "prefill make their memory depend on the length. Compare them on bpe_read, or evaluate positions near the "
         "end (metrics.positions) so that memory and error come from one cache (docs/methods.md §1)";
}

std::vector<SweepPoint> expand_sweep(const ExperimentSpec& spec) {
  // The cartesian products are sized before anything is expanded: a sweep of millions
  // of points would exhaust memory long before it finished.
  double total = 0;
  std::string sizes;
  for (const StrategyBlock& b : spec.strategies) {
    double n = 1;
    std::string axes;
    for (const Axis& a : b.axes) {
      n *= static_cast<double>(a.values.size());
      if (a.values.size() > 1) axes += (axes.empty() ? "" : " x ") + a.name + " " + std::to_string(a.values.size());
    }
    total += n;
    sizes += "\n  " + b.where + ": " + format_double(n) + " point(s)" + (axes.empty() ? "" : " (" + axes + ")");
  }
  if (total > static_cast<double>(kMaxSweepPoints))
    throw ConfigError(spec.config_path.string() + ": the sweep has " + format_double(total) + " points, more than " +
                      std::to_string(kMaxSweepPoints) + "; split it into several configs or use coarser axes:" + sizes);
  std::vector<SweepPoint> points;
  for (const StrategyBlock& b : spec.strategies) {
    const StrategyType& type = require_strategy_type(b.type, b.where);
    const std::vector<ParamDef> defs = type.all_params();
    std::vector<size_t> idx(b.axes.size(), 0);
    do {
      std::vector<std::pair<std::string, std::string>> vars;
      for (size_t a = 0; a < b.axes.size(); ++a)
        if (b.axes[a].is_var) vars.emplace_back(b.axes[a].name, param_to_string(b.axes[a].values[idx[a]]));
      std::map<std::string, ParamValue> values;
      for (const ParamDef& d : defs)
        if (d.default_value) values[d.name] = *d.default_value;
      SweepPoint pt;
      for (size_t a = 0; a < b.axes.size(); ++a) {
        const Axis& axis = b.axes[a];
        const ParamValue& v = axis.values[idx[a]];
        if (axis.values.size() > 1 || axis.is_var) pt.coords.emplace_back(axis.name, param_to_string(v));
        if (axis.is_var) continue;
        if (const std::string* s = std::get_if<std::string>(&v))
          values[axis.name] = substitute(*s, vars);
        else
          values[axis.name] = v;
      }
      for (const ParamDef& d : defs)
        if (!values.count(d.name) && !d.optional)
          throw ConfigError(b.where + ": strategy '" + b.type + "' needs `" + d.name + "`");
      pt.id = points.size();
      pt.block = b.index;
      pt.label = b.label;
      pt.type = b.type;
      pt.preset = b.preset;
      pt.params = Params(values);
      pt.key = point_key(b, pt.params, defs);
      pt.display_label = b.named ? point_display_label(b.label, pt.coords) : pt.key;
      try {
        (void)type.make(pt.params);  // validates formats and parameter combinations
      } catch (const Error& e) {
        std::string from_preset;  // a conflict may come from what the preset sets
        if (!b.preset.empty()) {
          std::vector<std::string> sets;
          for (const auto& [k, v] : b.preset_values) sets.push_back(k + " = " + param_to_string(v));
          from_preset = " (preset '" + b.preset + "' sets " + join(sets, ", ") + ")";
        }
        throw ConfigError(b.where + ": point " + pt.key + ": " + e.what() + from_preset);
      }
      points.push_back(std::move(pt));
    } while (next_combination(idx, b.axes));
  }
  if (points.empty()) throw ConfigError(spec.config_path.string() + ": the sweep has no points");
  if (spec.attribution.select == AttributionSpec::Select::Ids)
    for (int64_t id : spec.attribution.ids)
      if (id < 0 || id >= static_cast<int64_t>(points.size()))
        throw ConfigError(spec.attribution.ids_where + ": point id " + std::to_string(id) + " is not one of the sweep's " +
                          std::to_string(points.size()) + " points (ids 0.." + std::to_string(points.size() - 1) +
                          ", the id column of points.csv)");
  return points;
}

namespace {

// Whether the recording's layers carry pre-RoPE keys, also for a streamed recording
// whose layers are not held (its skeleton says what they hold).
bool records_pre_rope_keys(const Recording& rec) {
  return rec.streamed_extras ? rec.streamed_extras->key_pre_rope : rec.has_pre_rope_keys();
}

// Why the plan cannot run on `rec` because a key format (segment or window) quantizes
// the pre-RoPE keys (prerope:) and `rec` has none, or no RoPE; empty when it can. The
// format would throw the same while the point runs, after other points ran.
std::string pre_rope_keys_missing(const Plan& plan, const Recording& rec) {
  const bool has_keys = records_pre_rope_keys(rec);
  if (rec.rope.applied && has_keys) return {};
  auto reason = [&](const Format& f, const char* where) -> std::string {
    if (!f.reads_pre_rope_keys()) return {};
    const auto* prerope = dynamic_cast<const PreRopeFormat*>(&f);
    const std::string inner = prerope ? prerope->inner()->name() : "";
    const std::string head =
        std::string(where) + " format " + f.name() + " quantizes keys before RoPE, but recording '" + rec.name + "' ";
    if (!rec.rope.applied)
      return head + "has no RoPE (its keys are not rotated), so there is nothing to quantize before RoPE" +
             (prerope ? "; use '" + inner + "'" : "");
    return head + "has no pre-RoPE keys (key_pre_rope); record them (kvbudget record keeps them)" +
           (prerope ? ", or use '" + inner + "' on the post-RoPE keys" : "");
  };
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g) {
      const UnitPlan& u = plan.unit(l, g, Kind::Key);
      for (const Segment& s : u.segments)
        if (s.format)
          if (std::string bad = reason(*s.format, "key"); !bad.empty())
            return "layer " + std::to_string(l) + " kv_head " + std::to_string(g) + ": " + bad;
      if (u.window.active() && u.window.format)
        if (std::string bad = reason(*u.window.format, "key window"); !bad.empty())
          return "layer " + std::to_string(l) + " kv_head " + std::to_string(g) + ": " + bad;
    }
  return {};
}

// A point's plan on `rec`, checked (Plan::check, pre-RoPE keys for prerope: formats, the
// declared columns); throws what a point that cannot run throws. `measurer_for`: the planning backend's measurers.
// `warnings` (when given) receives what the strategy said about the plan (StrategyInput::warnings).
Plan build_point_plan(const ExperimentSpec& spec, const Recording& rec, const SweepPoint& point,
                      const Strategy& strategy, RecordingStats& stats, const MeasurerFor* measurer_for,
                      std::vector<std::string>* warnings = nullptr) {
  const CalibrationResolver calibration = calibration_resolver(spec, rec);
  Plan plan = strategy.build(StrategyInput{rec, spec.seed, &stats, &calibration, measurer_for, warnings});
  const ModelDataSpec& model = spec.data.model;
  if (spec.data.source == DataSpec::Source::Model && !model.quantize_layers.empty()) {
    // A budget is met over every layer: storing some layers at another format afterwards would break it.
    for (const char* budget : {"budget_bpe", "key_budget_bpe", "value_budget_bpe"})
      if (point.params.has(budget))
        throw ConfigError(model.quantize_layers_where + " with " + budget +
                          ": the strategy meets its budget over every layer, which quantize_layers would break by "
                          "storing the others at " + model.other_layers_format->name() + "; give a fixed format");
    quantize_only_layers(plan, model.quantize_layers, model.other_layers_format);
  }
  const std::string bad = plan.check();
  if (!bad.empty()) throw Error(bad);
  if (const std::string missing = pre_rope_keys_missing(plan, rec); !missing.empty()) throw Error(missing);
  require_declared_columns(plan, point.type);
  return plan;
}

// Whether the point allocates widths to meet a budget (budget_bpe over a family).
bool allocates(const SweepPoint& point) {
  if (point.type == "uniform") return false;  // one width by design
  for (const char* budget : {"budget_bpe", "key_budget_bpe", "value_budget_bpe"})
    if (point.params.has(budget)) return true;
  return false;
}

}  // namespace

std::string uniform_allocation(const Plan& plan) {
  if (plan.layers() * plan.kv_heads() < 2) return {};
  std::string out;
  for (Kind kind : {Kind::Key, Kind::Value}) {
    std::set<std::string> formats;
    for (int64_t l = 0; l < plan.layers(); ++l)
      for (int64_t g = 0; g < plan.kv_heads(); ++g)
        for (const Segment& s : plan.unit(l, g, kind).segments)
          if (s.role == SegmentRole::Allocated && s.format) formats.insert(s.format->name());
    if (formats.size() != 1) return {};
    out += (out.empty() ? "" : " ") + std::string(kind_name(kind)) + ":" + *formats.begin();
  }
  return out;
}

std::string point_location(const ExperimentSpec& spec, const SweepPoint& point) {
  if (point.block >= spec.strategies.size()) return point.key + ": ";
  const StrategyBlock& b = spec.strategies[point.block];
  return b.where + (b.named ? " (name \"" + b.label + "\")" : std::string()) + ": point " + point.key + ": ";
}

std::string uniform_allocation_warning(const Plan& plan) {
  const std::string one = uniform_allocation(plan);
  if (one.empty()) return {};
  const size_t space = one.find(' ');
  const bool same = space != std::string::npos && one.substr(2, space - 2) == one.substr(space + 3);
  return (same ? "the allocation is uniform, " + one + " in every unit: the point is uniform quantization"
               : "the allocation gives one width per kind, " + one +
                     " in every unit: the point is uniform quantization of keys and of values") +
         " (the allocator spread no widths across units at this budget; give other widths or budgets)";
}

std::string whole_recording_windows(const Plan& plan) {
  const int64_t T = plan.tokens(), prefill = plan.prefill();
  std::map<std::string, int64_t> covering;  // "K:window=100 at keep-fp16" -> units
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value})
        if (const RecentWindow& w = plan.unit(l, g, kind).window; w.active() && w.size >= T - prefill)
          ++covering[std::string(kind_name(kind)) + ":window=" + std::to_string(w.size) + " at " + w.format->name()];
  if (covering.empty()) return {};
  std::vector<std::string> parts;
  for (const auto& [what, units] : covering)
    parts.push_back(what + " in " + std::to_string(units) + " of " + std::to_string(plan.layers() * plan.kv_heads()) +
                    " units");
  const std::string stored = prefill == 0 ? "those units are stored entirely at the window's precision"
                                          : "those units store every token after the " + std::to_string(prefill) +
                                                "-token prompt at the window's precision";
  return "a window covers all of the recording's " + std::to_string(T) + " tokens (" + join(parts, ", ") + "): " +
         stored + ", so the point measures the window's format there, not the quantizer; give a window shorter than " +
         "the recording, or more tokens";
}

PlanCheck check_plans(const ExperimentSpec& spec, const Recording& rec, const std::vector<SweepPoint>& points,
                      const std::atomic<bool>* stop, RecordingStats* computed_stats) {
  const size_t n = points.size();
  auto stopped = [&] { return stop && stop->load(); };
  if (spec.threads > 0) omp_set_num_threads(spec.threads);
  const QueryPositions positions = resolve_positions(spec, rec.tokens);
  Measurers measurers(spec.precision);  // the planning backend's, for the distortion tables
  const MeasurerFor measurer_for = measurers.source(planning_backend(spec.backend));
  std::optional<RecordingStats> own_stats;
  if (!computed_stats) own_stats.emplace(rec, positions.calibration);
  RecordingStats& stats = computed_stats ? *computed_stats : *own_stats;
  std::vector<std::unique_ptr<Strategy>> strategies(n);
  std::vector<std::string> errors(n);
  std::vector<std::vector<std::string>> warnings(n);  // per point, each point_location + why
  PlanCheck check;
  check.plans.resize(n);
  check.plan_seconds.assign(n, 0.0);
  bool need_stats = false;
  for (size_t i = 0; i < n; ++i) {
    try {
      strategies[i] = require_strategy_type(points[i].type, "strategy").make(points[i].params);
      need_stats |= strategies[i]->needs_statistics();
    } catch (const std::exception& e) {
      errors[i] = point_location(spec, points[i]) + e.what();
    }
  }
  if (need_stats && !stopped()) stats.warm_up();
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < n; ++i) {
    if (!strategies[i] || stopped()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::vector<std::string> said;  // the strategy's own warnings
      Plan plan = build_point_plan(spec, rec, points[i], *strategies[i], stats, &measurer_for, &said);
      const std::string where = point_location(spec, points[i]);
      for (const std::string& w : said) warnings[i].push_back(where + w);
      if (allocates(points[i]))
        if (const std::string w = uniform_allocation_warning(plan); !w.empty()) warnings[i].push_back(where + w);
      if (const std::string w = whole_recording_windows(plan); !w.empty()) warnings[i].push_back(where + w);
      check.plans[i] = std::move(plan);
    } catch (const std::exception& e) {
      errors[i] = point_location(spec, points[i]) + e.what();
    }
    check.plan_seconds[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) check.errors.push_back(errors[i]);
    check.warnings.insert(check.warnings.end(), warnings[i].begin(), warnings[i].end());
  }
  return check;
}

namespace {

// Tells a measurer that a streamed recording's layer is held for a scope
// (Measurer::layer_held / layer_released: the CUDA one uploads it meanwhile).
class MeasuredLayer {
 public:
  MeasuredLayer(Measurer& m, int64_t layer) : m_(m), layer_(layer) { m_.layer_held(layer_); }
  ~MeasuredLayer() { m_.layer_released(layer_); }
  MeasuredLayer(const MeasuredLayer&) = delete;
  MeasuredLayer& operator=(const MeasuredLayer&) = delete;

 private:
  Measurer& m_;
  int64_t layer_;
};

// One run_sweep: phase 1 builds the points' plans on the CPU (build_plans); then the
// chosen backend's measurer runs the (point, variant, layer) tasks, split by KV head
// where the measurer runs tasks in parallel, and, with a model, one (point, model)
// task per point (plan_tasks, run_tasks); a point is finalized (merged in a fixed
// order, its metrics computed, reported) once its last task is done.
class SweepRun {
 public:
  SweepRun(const ExperimentSpec& spec, const Recording& rec, const std::vector<SweepPoint>& points,
           const PointCallback& on_point, const std::atomic<bool>* stop, const ModelEvaluator* model,
           PlanCheck* prepared, StreamedRecording* streamed)
      : spec_(spec), rec_(rec), points_(points), on_point_(on_point), stop_(stop), model_(model),
        prepared_(prepared), streamed_(streamed), n_(points.size()), layers_(static_cast<size_t>(rec.num_layers())),
        positions_(resolve_positions(spec, rec.tokens)),
        measurers_(spec.precision, streamed ? &streamed->recording() : nullptr), results_(n_), plans_(n_) {
    for (const std::string& m : spec.metrics.report) {
      metrics_.push_back(&require_metric(m, "metrics.report"));
      (metrics_.back()->level == MetricLevel::Model ? need_model_ : need_sim_) = true;
    }
    if (need_model_ && !model)
      throw ConfigError("metrics.report: model-level metrics need [data] source = \"model\"");
    opt_.topk = spec.metrics.topk;
    opt_.seed = spec.seed;
    opt_.positions = positions_.evaluation;
    opt_.stop = stop;  // a layer task stops within a few row blocks (SimulationStopped)
    if (prepared && prepared->plans.size() != n_) throw Error("run_sweep: the prepared plans are for other points");
    if (streamed && &streamed->recording() != &rec) throw Error("internal: run_sweep: `rec` is not the streamed recording");
    if (streamed && need_model_) throw Error("internal: run_sweep: a model source's recording is not streamed");
  }

  // Phase 1: every point's plan, and what results say about it before it is measured.
  // The distortion tables strategies measure meanwhile run on the planning backend.
  void build_plans();
  // The backend that measures the points (experiments/backend.h), once the plans are known.
  const BackendChoice& choose_backend();
  // Phase 2 on the chosen backend: the tasks, run as many at once as its measurer
  // does; points that failed in phase 1 or have no task are finalized first.
  void run_tasks();
  // The finished points, by id; sweep_errors_ reported as run_sweep documents.
  std::vector<PointResult> finished_results(std::vector<std::string>* callback_errors);
  // Wall seconds of the exact pass (run_tasks) and of the points' finalize, summed.
  double exact_pass_seconds() const { return exact_pass_seconds_; }
  double finalize_seconds() const { return finalize_seconds_; }

 private:
  struct Task {
    size_t point, variant, layer;  // variant 0: the point; v > 0: attribution region v-1
    size_t kv_head = 0;            // with unit_tasks_ > 1: the layer's KV head this task measures
    bool model = false;            // the point's model task (variant and layer unused)
  };
  bool stopped() const { return stop_ && stop_->load(); }
  // Attribution regions and the task list, on the chosen backend's measurer.
  void plan_tasks(Measurer& measurer);
  void run_task(Measurer& measurer, size_t k);
  // The tasks of a held recording, after the exact pass every measurement shares when
  // `share_exact`; `parallel`: as many at once as OpenMP runs, else in task order.
  void run_tasks_held(Measurer& measurer, bool share_exact, bool parallel);
  // The layer tasks of a streamed recording, layer by layer: each layer held (by the
  // recording and the measurer) while its tasks of every point run (and its exact
  // pass, when `share_exact`), then released.
  void run_tasks_streamed(Measurer& measurer, bool share_exact, bool parallel);
  void run_model_task(size_t i, size_t k);
  void finalize(size_t i);
  void merge_point(size_t i);
  // Variant v's stats of point i from its tasks, merged as layer tasks merge: each
  // layer's KV-head tasks first, in order (the sums a layer task adds), then the layers.
  ErrorStats merged_variant(size_t i, size_t v);  // its rows in memory from merged_rows_

  const ExperimentSpec& spec_;
  const Recording& rec_;
  const std::vector<SweepPoint>& points_;
  const PointCallback& on_point_;
  const std::atomic<bool>* stop_;
  const ModelEvaluator* model_;
  PlanCheck* prepared_;
  StreamedRecording* streamed_;  // the recording's layers streamed (sim/layer_stream.h), or nullptr
  const size_t n_, layers_;
  const QueryPositions positions_;
  std::vector<const MetricDef*> metrics_;  // spec.metrics.report
  bool need_sim_ = false, need_model_ = false;
  SimOptions opt_;
  Measurers measurers_;  // the planning and the chosen backend's, for this run
  BackendChoice backend_;

  std::vector<PointResult> results_;
  std::vector<std::optional<Plan>> plans_;  // reset once the point is finalized
  std::vector<std::vector<AttributionRegion>> regions_;
  // Why the measurer cannot run a point's plan ("" when it can): its first task fails with it.
  std::vector<std::string> refused_;
  std::vector<Task> tasks_;  // a point's tasks are contiguous, layer tasks first
  // Tasks per (point, variant, layer): 1 (the layer), or the recording's KV heads when
  // the measurer runs tasks in parallel (more tasks than threads: a sweep of one point
  // of 4 layers still keeps 16 threads busy).
  size_t unit_tasks_ = 1;
  std::vector<size_t> first_task_, layer_tasks_, point_tasks_;
  std::vector<ErrorStats> stats_of_;  // per task, released once its point is finalized
  // The memory of finalized points' merged rows and bootstrap buffers, reused by the
  // next (fresh, 75 MB of rows and about 100 MB of buffers a point at the Llama-3-8B
  // shape were mostly page faults: experiments/bench/bench_finalize).
  ScratchPool<std::vector<AttentionRow>> merged_rows_;
  ScratchPool<std::vector<BootstrapScratch>> bootstrap_scratch_;  // one per metric
  std::vector<double> task_seconds_;
  std::vector<std::string> task_error_;
  std::vector<std::atomic<size_t>> remaining_;  // per point, tasks not yet done
  std::vector<char> finished_;                  // guarded by mu_
  std::mutex mu_;
  size_t done_ = 0;                        // guarded by mu_
  std::vector<std::string> sweep_errors_;  // guarded by mu_
  double exact_pass_seconds_ = 0;
  double finalize_seconds_ = 0;  // guarded by mu_
  // While a device's measurer works, one task at a time: where finished points go to be
  // finalized (merging a point's layers' rows, its metrics and their bootstrap
  // intervals take about 0.2-0.4 s of one host thread for the 2.1 million rows of a
  // Llama-3-8B-shaped point at 2048 positions, overlapped with the next point's tasks).
  BackgroundQueue* background_ = nullptr;
  // Threads a point's metrics may use (point_metrics): the run's, read where run_sweep
  // has set them (a BackgroundQueue's thread starts with OpenMP's default count); one
  // fewer while a finalize runs beside the thread that drives the device (run_tasks).
  int finalize_threads_ = omp_get_max_threads();
};

void SweepRun::build_plans() {
  // Statistics every strategy reads, on the calibration positions: computed once, in
  // parallel, when some point needs them.
  // Plans check_plans() built for these points are taken as they are.
  auto prebuilt = [&](size_t i) { return prepared_ && prepared_->plans[i].has_value(); };
  const MeasurerFor measurer_for = measurers_.source(planning_backend(spec_.backend));
  RecordingStats stats(rec_, positions_.calibration);
  std::vector<std::unique_ptr<Strategy>> strategies(n_);
  bool need_stats = false;
  for (size_t i = 0; i < n_; ++i) {
    if (prebuilt(i)) continue;
    try {
      strategies[i] = require_strategy_type(points_[i].type, "strategy").make(points_[i].params);
      need_stats |= strategies[i]->needs_statistics();
    } catch (const std::exception&) {
      // reported when the plan is built
    }
  }
  if (need_stats && !stopped() && !streamed_) stats.warm_up();

#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < n_; ++i) {
    PointResult& r = results_[i];
    r.id = points_[i].id;
    if (stopped()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (streamed_ && !prebuilt(i))  // its layers' tensors are not held: no statistics or tensors to plan on
        throw Error("internal: a streamed recording's plan was not built by check_plans");
      if (prebuilt(i)) r.seconds += prepared_->plan_seconds[i];
      else if (!strategies[i]) strategies[i] = require_strategy_type(points_[i].type, "strategy").make(points_[i].params);
      Plan plan = prebuilt(i) ? std::move(*prepared_->plans[i])
                              : build_point_plan(spec_, rec_, points_[i], *strategies[i], stats, &measurer_for);
      r.bpe = plan.bpe();
      r.bpe_target = plan.bpe_at(spec_.output.target_context);
      r.bytes = plan.bytes_at(rec_.tokens);
      r.bpe_read = plan.mean_bpe_read(positions_.evaluation);
      r.bytes_target = plan.bytes_at(spec_.output.target_context);
      r.measured_tokens = rec_.tokens;
      r.sized_for_tokens = plan.sized_for_context().value_or(rec_.tokens);
      r.stores_tokens_alike = plan.stores_tokens_alike();
      r.target_extrapolated = spec_.output.target_context > rec_.tokens && !plan.stores_tokens_alike();
      r.plan = plan.describe();
      r.annotations = plan.annotations();
      plans_[i] = std::move(plan);
    } catch (const std::exception& e) {
      r.error = points_[i].key + ": " + e.what() + " (seed " + std::to_string(spec_.seed) + ")";
    }
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

const BackendChoice& SweepRun::choose_backend() {
  BackendChoice& c = backend_;
  c.requested = spec_.backend;
  if (spec_.backend == BackendRequest::Cpu) {
    c.reason = "backend = \"cpu\"";
    return c;
  }
  std::string why_not;
  c.device = cuda_device(&why_not);
  if (spec_.backend == BackendRequest::Cuda) {
    if (c.device.empty()) throw Error("backend = \"cuda\": " + why_not);
    c.used = Backend::Cuda;
    c.reason = "backend = \"cuda\"";
    return c;
  }
  if (c.device.empty()) {
    c.reason = "auto: " + why_not;
    return c;
  }
  for (size_t i = 0; i < n_; ++i) {
    if (!plans_[i]) continue;
    const std::string why = backend_unsupported_reason(Backend::Cuda, *plans_[i], opt_);
    if (!why.empty()) {
      c.reason = "auto: point " + points_[i].key + ": " + why;
      return c;
    }
  }
  c.used = Backend::Cuda;
  c.reason = "auto: a CUDA device is present and every format of the sweep has a CUDA twin";
  return c;
}

void SweepRun::plan_tasks(Measurer& measurer) {
  // Attribution regions per point: each is one more measurement of every layer, on a
  // measurer that honours regions (the CPU; on CUDA, attribution has its per-layer and
  // per-head shares).
  regions_.assign(n_, {});
  refused_.assign(n_, {});
  for (size_t i = 0; i < n_; ++i) {
    if (!plans_[i]) continue;
    if (spec_.attribution.selects(points_[i].id) && spec_.attribution.regions && measurer.measures_regions())
      regions_[i] = attribution_regions(*plans_[i], rec_);
    if (const std::string why = measurer.unsupported_reason(*plans_[i], opt_); !why.empty())
      refused_[i] = points_[i].key + ": " + why + " (backend = \"" + measurer.name() +
                    "\"; run this point with backend = \"cpu\")";
  }
  // A point's layer tasks are left out when it needs neither tensor/attention metrics
  // nor attribution.
  unit_tasks_ = measurer.concurrency() > 1 ? static_cast<size_t>(rec_.kv_heads) : 1;
  first_task_.assign(n_, 0);
  layer_tasks_.assign(n_, 0);
  point_tasks_.assign(n_, 0);
  for (size_t i = 0; i < n_; ++i) {
    first_task_[i] = tasks_.size();
    if (!plans_[i]) continue;
    if (need_sim_ || spec_.attribution.selects(points_[i].id))
      for (size_t v = 0; v <= regions_[i].size(); ++v)
        for (size_t l = 0; l < layers_; ++l)
          for (size_t g = 0; g < unit_tasks_; ++g) tasks_.push_back({i, v, l, g});
    layer_tasks_[i] = tasks_.size() - first_task_[i];
    if (need_model_) tasks_.push_back({i, 0, 0, 0, true});
    point_tasks_[i] = tasks_.size() - first_task_[i];
  }
  stats_of_.resize(tasks_.size());
  task_seconds_.assign(tasks_.size(), 0.0);
  task_error_.resize(tasks_.size());
  remaining_ = std::vector<std::atomic<size_t>>(n_);
  for (size_t i = 0; i < n_; ++i) remaining_[i] = point_tasks_[i];
  finished_.assign(n_, 0);
}

// The model task of point i: its forward pass and continuations (on the CPU),
// position-level metrics on the evaluated positions (never on calibration ones).
void SweepRun::run_model_task(size_t i, size_t k) {
  try {
    stats_of_[k].model = model_->evaluate(*plans_[i], spec_.seed, nullptr, &positions_.evaluation);
    // A quantized cache whose logits hold NaN or +inf (NaN nll): the model metrics over
    // those positions are NaN in points.csv; say why (as `kvbudget eval` does).
    const std::vector<double>& nll = stats_of_[k].model.nll;
    const auto bad = std::count_if(nll.begin(), nll.end(), [](double v) { return std::isnan(v); });
    if (bad > 0)
      std::fprintf(stderr,
                   "kvbudget run: warning: %s: %lld of %zu compared positions have non-finite logits (NaN or +inf) "
                   "with the quantized cache: its PPL, KL and Δp are NaN, and they count as a different top token\n",
                   points_[i].display_label.c_str(), static_cast<long long>(bad), nll.size());
  } catch (const std::exception& e) {
    task_error_[k] = points_[i].key + ": model: " + e.what();
  }
}

// Runs inside the task loop: nothing may escape it (an exception leaving an OpenMP
// region terminates the program).
void SweepRun::run_task(Measurer& measurer, size_t k) {
  const Task& task = tasks_[k];
  const size_t i = task.point;
  if (stopped()) return;  // the point stays unfinished, not reported
  const auto t0 = std::chrono::steady_clock::now();
  if (!refused_[i].empty()) {  // the point fails with the measurer's reason, on its first task
    if (k == first_task_[i]) task_error_[k] = refused_[i];
  } else if (task.model) {
    run_model_task(i, k);
  } else {
    try {
      SimOptions o = opt_;
      if (task.variant > 0) o.region = &regions_[i][task.variant - 1].region;
      const int64_t layer = static_cast<int64_t>(task.layer);
      stats_of_[k] = unit_tasks_ > 1 ? measurer.measure_kv_head(*plans_[i], layer, static_cast<int64_t>(task.kv_head), o)
                                     : measurer.measure_layer(*plans_[i], layer, o);
    } catch (const SimulationStopped&) {
      return;  // the point stays unfinished, as one whose tasks a stop skipped
    } catch (const std::exception& e) {
      task_error_[k] = points_[i].key + ": layer " + std::to_string(task.layer) + ": " + e.what();
    }
  }
  task_seconds_[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (--remaining_[i] != 0) return;
  if (background_) background_->submit(i);
  else finalize(i);
}

ErrorStats SweepRun::merged_variant(size_t i, size_t v) {
  const ErrorStats* first = stats_of_.data() + first_task_[i] + v * layers_ * unit_tasks_;
  if (unit_tasks_ == 1) return ErrorStats::merged(first, layers_, merged_rows_.take());
  // (layer, KV head) tasks, in task order (layer, q head, position): the same bits.
  return ErrorStats::merged_in_groups(first, layers_, unit_tasks_, merged_rows_.take());
}

// The point's results from its tasks' (in task order): the first task error fails it,
// else its metrics, intervals, block sums and attribution. Throws on a failure merging.
void SweepRun::merge_point(size_t i) {
  PointResult& r = results_[i];
  const size_t variants = layer_tasks_[i] ? regions_[i].size() + 1 : (plans_[i] ? 1 : 0);
  const size_t t0 = first_task_[i];
  for (size_t t = t0; t < t0 + point_tasks_[i] && r.error.empty(); ++t) r.error = task_error_[t];
  if (r.error.empty() && plans_[i]) {
    std::vector<ErrorStats> merged(variants);
    // The merged rows' memory goes back to merged_rows_ however this ends.
    struct GiveBack {
      ScratchPool<std::vector<AttentionRow>>& pool;
      std::vector<ErrorStats>& stats;
      ~GiveBack() {
        for (ErrorStats& m : stats) pool.give_back(std::move(m.rows));
      }
    } give_back{merged_rows_, merged};
    if (layer_tasks_[i])
      for (size_t v = 0; v < variants; ++v) merged[v] = merged_variant(i, v);
    if (point_tasks_[i] > layer_tasks_[i]) merged[0].merge(stats_of_[t0 + layer_tasks_[i]]);  // the model task
    // The CPU simulator refuses such a reconstruction itself (reconstruct_unit/
    // _window); this catches it on every backend (windows reach only the rows).
    require_finite_errors(merged[0], rec_);
    // The metrics, their intervals and block sums, with the attribution shares beside
    // them: one metric per thread (point_metrics), on the threads of a device's
    // finalize (on the CPU, inside the task loop, on this thread alone).
    PointMetricsOptions options;
    options.bootstrap = bootstrap_settings(spec_);
    // Over several sequences the resamples feed the aggregate's interval.
    options.keep_resamples = spec_.data.sequence_count() > 1;
    options.threads = finalize_threads_;
    if (spec_.attribution.selects(points_[i].id) && variants > 0)
      options.beside = [&] {
        r.attribution = attribute(merged[0], regions_[i], std::vector<ErrorStats>(merged.begin() + 1, merged.end()),
                                  rec_.num_layers(), rec_.q_heads, spec_.attribution.attributed_errors());
      };
    ScratchPool<std::vector<BootstrapScratch>>::Lease scratch(bootstrap_scratch_);
    PointMetrics figures = point_metrics(merged[0], metrics_, options, &*scratch);
    r.metrics = std::move(figures.values);
    r.standard_errors = std::move(figures.standard_errors);
    r.intervals = std::move(figures.intervals);
    r.resamples = std::move(figures.resamples);
    r.block_sums = std::move(figures.block_sums);
    r.ok = true;
  }
  for (size_t t = t0; t < t0 + point_tasks_[i]; ++t) {
    r.seconds += task_seconds_[t];
    stats_of_[t] = ErrorStats();
  }
}

// Runs inside the task loop: nothing may escape it. A failure merging the point's
// results fails the point; one in on_point (e.g. an I/O error writing points.csv) is
// recorded in sweep_errors_ and the sweep goes on.
void SweepRun::finalize(size_t i) {
  PointResult& r = results_[i];
  const auto t0 = std::chrono::steady_clock::now();
  try {
    merge_point(i);
  } catch (...) {
    r.ok = false;
    r.metrics.clear();
    r.standard_errors.clear();
    r.intervals.clear();
    r.resamples.clear();
    r.attribution.reset();
    if (r.error.empty()) r.error = points_[i].key + ": " + describe_current_exception();
  }
  plans_[i].reset();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  finalize_seconds_ += seconds;
  finished_[i] = 1;
  ++done_;
  if (!on_point_) return;
  try {
    on_point_(points_[i], r, done_, n_);
  } catch (...) {
    sweep_errors_.push_back("after point " + points_[i].key + ": " + describe_current_exception());
  }
}

void SweepRun::run_tasks() {
  Measurer& measurer = measurers_.of(backend_.used, rec_);
  plan_tasks(measurer);

  // Points that failed in phase 1 are reported right away, and so are points that
  // have no task (nothing to measure).
  for (size_t i = 0; i < n_; ++i)
    if (!results_[i].error.empty() || (plans_[i] && point_tasks_[i] == 0)) finalize(i);

  // What every point's layer tasks share (the CPU's exact attention pass) is done once,
  // when some layer is measured more than once (several points, attribution regions).
  // For a single measurement it would only add its memory (fresh: about 8.7 MB a query
  // head at 2048 tokens, a page fault per 4 KiB) to the arithmetic the measurement does
  // as well without it; the results are the same either way.
  size_t measurements_per_layer = 0;
  for (size_t i = 0; i < n_; ++i)
    if (layer_tasks_[i] > 0) measurements_per_layer += regions_[i].size() + 1;
  // As many tasks at once as the measurer runs: one OpenMP thread each on the CPU;
  // on CUDA one after another in task order (points one after another, each on the
  // whole device), outside any parallel region, a finished point being finalized on a
  // host thread of its own, its metrics on the run's other threads, while the device
  // runs the next point's tasks (not on the CPU, whose thread count the user chose).
  const bool parallel = measurer.concurrency() > 1;
  std::optional<BackgroundQueue> background;
  if (!parallel && backend_.used != Backend::Cpu) {
    finalize_threads_ = std::max(1, finalize_threads_ - 1);  // set before the queue's thread reads it
    background.emplace([this](size_t i) { finalize(i); });
  }
  background_ = background ? &*background : nullptr;
  if (streamed_) {
    run_tasks_streamed(measurer, measurements_per_layer > 1, parallel);
  } else {
    run_tasks_held(measurer, measurements_per_layer > 1, parallel);
  }
  if (background) background->drain();
  background_ = nullptr;
}

void SweepRun::run_tasks_held(Measurer& measurer, bool share_exact, bool parallel) {
  if (share_exact && !stopped()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      measurer.prepare(opt_);
    } catch (const SimulationStopped&) {  // stopped while it was prepared: no task runs
    }
    exact_pass_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  const long ntasks = static_cast<long>(tasks_.size());
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (long k = 0; k < ntasks; ++k) run_task(measurer, static_cast<size_t>(k));
}

void SweepRun::run_tasks_streamed(Measurer& measurer, bool share_exact, bool parallel) {
  // Every task is a layer task (a streamed recording has no model task), each point's
  // finalized as its last layer's last task is done; the task order within a layer is
  // the held path's, and results are merged in the same fixed order.
  std::vector<std::vector<long>> of_layer(layers_);
  for (size_t k = 0; k < tasks_.size(); ++k) {
    if (tasks_[k].model) throw Error("internal: a model task in a streamed sweep");
    of_layer[tasks_[k].layer].push_back(static_cast<long>(k));
  }
  // A device measures a layer while the host's cores idle: the next layer is loaded
  // (generated, read) meanwhile (StreamedRecording::set_prefetch). Not on the CPU,
  // whose threads measure.
  const PrefetchingLayers prefetching(*streamed_, !parallel && backend_.used != Backend::Cpu);
  for (size_t l = 0; l < layers_ && !stopped(); ++l) {
    if (of_layer[l].empty()) continue;
    const HeldLayer held(*streamed_, static_cast<int64_t>(l));
    const MeasuredLayer measured(measurer, static_cast<int64_t>(l));
    if (share_exact) {
      try {
        measurer.prepare_layer(opt_, static_cast<int64_t>(l));
      } catch (const SimulationStopped&) {  // the layer's tasks see the stop and return
      }
    }
    const std::vector<long>& ks = of_layer[l];
    const long n = static_cast<long>(ks.size());
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (long j = 0; j < n; ++j) run_task(measurer, static_cast<size_t>(ks[static_cast<size_t>(j)]));
    measurer.release_prepared();
  }
}

std::vector<PointResult> SweepRun::finished_results(std::vector<std::string>* callback_errors) {
  if (!sweep_errors_.empty()) {
    if (!callback_errors)
      throw Error(sweep_errors_.front() +
                  (sweep_errors_.size() > 1 ? " (and " + std::to_string(sweep_errors_.size() - 1) + " more)" : ""));
    *callback_errors = sweep_errors_;
  }
  std::vector<PointResult> out;
  for (size_t i = 0; i < n_; ++i)
    if (finished_[i]) out.push_back(std::move(results_[i]));
  return out;
}

}  // namespace

std::vector<PointResult> run_sweep(const ExperimentSpec& spec, const Recording& rec,
                                   const std::vector<SweepPoint>& points, const PointCallback& on_point,
                                   const std::atomic<bool>* stop, BackendChoice* chosen, const ModelEvaluator* model,
                                   std::vector<std::string>* callback_errors, PlanCheck* prepared,
                                   StreamedRecording* streamed, SweepSeconds* seconds) {
  if (spec.threads > 0) omp_set_num_threads(spec.threads);
  const auto t_plans = std::chrono::steady_clock::now();
  SweepRun run(spec, rec, points, on_point, stop, model, prepared, streamed);
  run.build_plans();
  const BackendChoice& backend = run.choose_backend();
  if (chosen) *chosen = backend;
  const auto t_tasks = std::chrono::steady_clock::now();
  run.run_tasks();
  if (seconds) {
    const auto since = [](auto t) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(); };
    seconds->plans += std::chrono::duration<double>(t_tasks - t_plans).count();
    seconds->exact_pass += run.exact_pass_seconds();
    seconds->tasks += since(t_tasks) - run.exact_pass_seconds();
    seconds->finalize += run.finalize_seconds();
  }
  return run.finished_results(callback_errors);
}

}  // namespace kvb
