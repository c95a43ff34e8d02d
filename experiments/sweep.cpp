#include "experiments/sweep.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>

#include "experiments/calibration_data.h"
#include "experiments/query_positions.h"
#include "kvb/build_config.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/exact_attention.h"
#include "sim/model/layer_selection.h"
#include "sim/simulator.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/statistics.h"
#if KVB_HAVE_CUDA
#include "kernels/cuda_simulator.h"
#endif

namespace kvb {

namespace {

// Memory the CPU backend may spend on the run's exact attention pass (ExactAttentionCache).
constexpr size_t kExactCacheBytes = size_t(1) << 30;

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

// Which backend measures the points, once the plans are known (experiments/backend.h).
BackendChoice choose_backend(const ExperimentSpec& spec, const std::vector<SweepPoint>& points,
                             const std::vector<std::optional<Plan>>& plans, const SimOptions& opt) {
  BackendChoice c;
  c.requested = spec.backend;
  if (spec.backend == BackendRequest::Cpu) {
    c.reason = "backend = \"cpu\"";
    return c;
  }
  std::string why_not;
  c.device = cuda_device(&why_not);
  if (spec.backend == BackendRequest::Cuda) {
    if (c.device.empty()) throw Error("backend = \"cuda\": " + why_not);
    c.used = Backend::Cuda;
    c.reason = "backend = \"cuda\"";
    return c;
  }
  if (c.device.empty()) {
    c.reason = "auto: " + why_not;
    return c;
  }
#if KVB_HAVE_CUDA
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i]) continue;
    const std::string why = cuda::unsupported_reason(*plans[i], opt);
    if (!why.empty()) {
      c.reason = "auto: point " + points[i].key + ": " + why;
      return c;
    }
  }
  c.used = Backend::Cuda;
  c.reason = "auto: a CUDA device is present and every format of the sweep has a CUDA twin";
#else
  (void)points;
  (void)plans;
  (void)opt;
#endif
  return c;
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
bool sized_beyond_recording(const PointResult& r) { return r.sized_for_tokens > r.measured_tokens; }
}  // namespace

BootstrapSettings bootstrap_settings(const ExperimentSpec& spec) {
  BootstrapSettings b;
  b.seed = spec.seed;
  return b;
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

// A point's plan on `rec`, checked (Plan::check, the declared columns); throws what
// a point that cannot run throws.
Plan build_point_plan(const ExperimentSpec& spec, const Recording& rec, const SweepPoint& point,
                      const Strategy& strategy, RecordingStats& stats) {
  const CalibrationResolver calibration = calibration_resolver(spec, rec);
  Plan plan = strategy.build(StrategyInput{rec, spec.seed, &stats, &calibration});
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

PlanCheck check_plans(const ExperimentSpec& spec, const Recording& rec, const std::vector<SweepPoint>& points,
                      const std::atomic<bool>* stop) {
  const size_t n = points.size();
  auto stopped = [&] { return stop && stop->load(); };
  if (spec.threads > 0) omp_set_num_threads(spec.threads);
  const QueryPositions positions = resolve_positions(spec, rec.tokens);
  RecordingStats stats(rec, positions.calibration);
  std::vector<std::unique_ptr<Strategy>> strategies(n);
  std::vector<std::string> errors(n), warnings(n);
  PlanCheck check;
  check.plans.resize(n);
  check.plan_seconds.assign(n, 0.0);
  bool need_stats = false;
  for (size_t i = 0; i < n; ++i) {
    try {
      strategies[i] = require_strategy_type(points[i].type, "strategy").make(points[i].params);
      need_stats |= strategies[i]->needs_statistics();
    } catch (const std::exception& e) {
      errors[i] = points[i].key + ": " + e.what();
    }
  }
  if (need_stats && !stopped()) stats.warm_up();
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < n; ++i) {
    if (!strategies[i] || stopped()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      Plan plan = build_point_plan(spec, rec, points[i], *strategies[i], stats);
      if (allocates(points[i]))
        if (const std::string one = uniform_allocation(plan); !one.empty())
          warnings[i] = points[i].key + ": the allocation is uniform, " + one +
                        " in every unit (at this budget the family's widths leave no room to allocate: the point is "
                        "uniform quantization; give other widths or budgets)";
      check.plans[i] = std::move(plan);
    } catch (const std::exception& e) {
      errors[i] = points[i].key + ": " + e.what();
    }
    check.plan_seconds[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) check.errors.push_back(errors[i]);
    if (!warnings[i].empty()) check.warnings.push_back(warnings[i]);
  }
  return check;
}

std::vector<PointResult> run_sweep(const ExperimentSpec& spec, const Recording& rec,
                                   const std::vector<SweepPoint>& points, const PointCallback& on_point,
                                   const std::atomic<bool>* stop, BackendChoice* chosen, const ModelEvaluator* model,
                                   std::vector<std::string>* callback_errors, PlanCheck* prepared) {
  const size_t n = points.size();
  const size_t L = static_cast<size_t>(rec.num_layers());
  std::vector<PointResult> results(n);
  std::vector<std::optional<Plan>> plans(n);
  auto stopped = [&] { return stop && stop->load(); };

  std::vector<const MetricDef*> metrics;
  bool need_sim = false, need_model = false;
  for (const std::string& m : spec.metrics.report) {
    metrics.push_back(&require_metric(m, "metrics.report"));
    (metrics.back()->level == MetricLevel::Model ? need_model : need_sim) = true;
  }
  if (need_model && !model)
    throw ConfigError("metrics.report: model-level metrics need [data] source = \"model\"");

  const QueryPositions positions = resolve_positions(spec, rec.tokens);
  SimOptions opt;
  opt.topk = spec.metrics.topk;
  opt.seed = spec.seed;
  opt.positions = positions.evaluation;
  opt.stop = stop;  // a layer task stops within a few row blocks (SimulationStopped)

  if (spec.threads > 0) omp_set_num_threads(spec.threads);

  // Statistics every strategy reads, on the calibration positions: computed once, in
  // parallel, when some point needs them.
  // Plans check_plans() built for these points are taken as they are.
  if (prepared && prepared->plans.size() != n) throw Error("run_sweep: the prepared plans are for other points");
  auto prebuilt = [&](size_t i) { return prepared && prepared->plans[i].has_value(); };
  RecordingStats stats(rec, positions.calibration);
  std::vector<std::unique_ptr<Strategy>> strategies(n);
  bool need_stats = false;
  for (size_t i = 0; i < n; ++i) {
    if (prebuilt(i)) continue;
    try {
      strategies[i] = require_strategy_type(points[i].type, "strategy").make(points[i].params);
      need_stats |= strategies[i]->needs_statistics();
    } catch (const std::exception&) {
      // reported when the plan is built
    }
  }
  if (need_stats && !stopped()) stats.warm_up();

    // Phase 1: plans.
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < n; ++i) {
    results[i].id = points[i].id;
    if (stopped()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (prebuilt(i)) results[i].seconds += prepared->plan_seconds[i];
      else if (!strategies[i]) strategies[i] = require_strategy_type(points[i].type, "strategy").make(points[i].params);
      Plan plan = prebuilt(i) ? std::move(*prepared->plans[i])
                              : build_point_plan(spec, rec, points[i], *strategies[i], stats);
      results[i].bpe = plan.bpe();
      results[i].bpe_target = plan.bpe_at(spec.output.target_context);
      results[i].bytes = plan.bytes_at(rec.tokens);
      results[i].bytes_target = plan.bytes_at(spec.output.target_context);
      results[i].measured_tokens = rec.tokens;
      results[i].sized_for_tokens = plan.sized_for_context().value_or(rec.tokens);
      results[i].target_extrapolated = spec.output.target_context > rec.tokens && !plan.stores_tokens_alike();
      results[i].plan = plan.describe();
      results[i].annotations = plan.annotations();
      plans[i] = std::move(plan);
    } catch (const std::exception& e) {
      results[i].error = points[i].key + ": " + e.what() + " (seed " + std::to_string(spec.seed) + ")";
    }
    results[i].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  const BackendChoice backend = choose_backend(spec, points, plans, opt);
  if (chosen) *chosen = backend;

  // Attribution regions per point: each is one more simulation of every layer (CPU
  // backend only; on CUDA, attribution has its per-layer and per-head shares).
  std::vector<std::vector<AttributionRegion>> regions(n);
  for (size_t i = 0; i < n; ++i)
    if (plans[i] && spec.attribution.selects(points[i].id) && spec.attribution.regions &&
        backend.used == Backend::Cpu)
      regions[i] = attribution_regions(*plans[i], rec);

  // Phase 2: (point, variant, layer) tasks; variant 0 is the point, v > 0 region v-1;
  // then, with a model, one (point, model) task. A point's layer tasks are left out
  // when it needs neither tensor/attention metrics nor attribution.
  struct Task {
    size_t point, variant, layer;
    bool model = false;
  };
  std::vector<Task> tasks;
  std::vector<size_t> first_task(n), layer_tasks(n, 0), point_tasks(n, 0);
  for (size_t i = 0; i < n; ++i) {
    first_task[i] = tasks.size();
    if (!plans[i]) continue;
    if (need_sim || spec.attribution.selects(points[i].id))
      for (size_t v = 0; v <= regions[i].size(); ++v)
        for (size_t l = 0; l < L; ++l) tasks.push_back({i, v, l});
    layer_tasks[i] = tasks.size() - first_task[i];
    if (need_model) tasks.push_back({i, 0, 0, true});
    point_tasks[i] = tasks.size() - first_task[i];
  }
  std::vector<ErrorStats> stats_of(tasks.size());
  std::vector<double> task_seconds(tasks.size(), 0.0);
  std::vector<std::string> task_error(tasks.size());
  std::vector<std::atomic<size_t>> remaining(n);
  std::vector<char> finished(n, 0);
  for (size_t i = 0; i < n; ++i) remaining[i] = point_tasks[i];
  std::mutex mu;
  size_t done = 0;

  // The model task of point i: its forward pass and continuations, position-level
  // metrics on the evaluated positions (never on calibration ones).
  auto run_model_task = [&](size_t i, size_t k) {
    try {
      stats_of[k].model = model->evaluate(*plans[i], spec.seed, nullptr, &positions.evaluation);
    } catch (const std::exception& e) {
      task_error[k] = points[i].key + ": model: " + e.what();
    }
  };

  // Runs inside the parallel loops: nothing may escape it (an exception leaving an
  // OpenMP region terminates the program). A failure merging the point's results
  // fails the point; one in on_point (e.g. an I/O error writing points.csv) is
  // recorded in sweep_errors and the sweep goes on.
  std::vector<std::string> sweep_errors;  // guarded by mu
  auto finalize = [&](size_t i) {
    PointResult& r = results[i];
    try {
      const size_t variants = layer_tasks[i] ? regions[i].size() + 1 : (plans[i] ? 1 : 0);
      const size_t layers_per_variant = layer_tasks[i] ? L : 0;
      const size_t t0 = first_task[i];
      for (size_t t = t0; t < t0 + point_tasks[i] && r.error.empty(); ++t) r.error = task_error[t];
      if (r.error.empty() && plans[i]) {
        std::vector<ErrorStats> merged(variants);
        for (size_t v = 0; v < variants; ++v)
          merged[v] = ErrorStats::merged(stats_of.data() + t0 + v * L, layers_per_variant);
        if (point_tasks[i] > layer_tasks[i]) merged[0].merge(stats_of[t0 + layer_tasks[i]]);  // the model task
        // The CPU simulator refuses such a reconstruction itself (reconstruct_unit/
        // _window); this catches it on every backend (windows reach only the rows).
        require_finite_errors(merged[0], rec);
        for (const MetricDef* m : metrics) {
          r.metrics.push_back(m->compute(merged[0]));
          r.standard_errors.push_back(m->standard_error ? m->standard_error(merged[0]) : std::nan(""));
        }
        // Over several sequences the resamples feed the aggregate's interval.
        r.intervals = bootstrap_intervals(merged[0], metrics, bootstrap_settings(spec),
                                          spec.data.sequence_count() > 1 ? &r.resamples : nullptr);
        for (size_t k = 0; k < metrics.size(); ++k)  // closed-form intervals (answer_accuracy)
          if (metrics[k]->interval) r.intervals[k] = metrics[k]->interval(merged[0]);
        for (const MetricDef* m : metrics) r.block_sums.push_back(metric_block_sums(*m, merged[0]));
        if (spec.attribution.selects(points[i].id) && variants > 0)
          r.attribution = attribute(merged[0], regions[i], std::vector<ErrorStats>(merged.begin() + 1, merged.end()),
                                    rec.num_layers(), rec.q_heads, spec.attribution.attributed_errors());
        r.ok = true;
      }
      for (size_t t = t0; t < t0 + point_tasks[i]; ++t) {
        r.seconds += task_seconds[t];
        stats_of[t] = ErrorStats();
      }
    } catch (...) {
      r.ok = false;
      r.metrics.clear();
      r.standard_errors.clear();
      r.intervals.clear();
      r.resamples.clear();
      r.attribution.reset();
      if (r.error.empty()) r.error = points[i].key + ": " + describe_current_exception();
    }
    plans[i].reset();
    std::lock_guard<std::mutex> lock(mu);
    finished[i] = 1;
    ++done;
    if (!on_point) return;
    try {
      on_point(points[i], r, done, n);
    } catch (...) {
      sweep_errors.push_back("after point " + points[i].key + ": " + describe_current_exception());
    }
  };
  // What the caller learns about sweep_errors once every point is finished.
  auto report_sweep_errors = [&] {
    if (sweep_errors.empty()) return;
    if (!callback_errors)
      throw Error(sweep_errors.front() +
                  (sweep_errors.size() > 1 ? " (and " + std::to_string(sweep_errors.size() - 1) + " more)" : ""));
    *callback_errors = sweep_errors;
  };

  // Points that failed in phase 1 are reported right away, and so are points that
  // have no task (nothing to measure).
  for (size_t i = 0; i < n; ++i)
    if (!results[i].error.empty() || (plans[i] && point_tasks[i] == 0)) finalize(i);

#if KVB_HAVE_CUDA
  if (backend.used == Backend::Cuda) {
    // Points one after another, each on the whole device; the recording is uploaded once.
    cuda::CudaSimulator gpu(rec);
    for (size_t i = 0; i < n; ++i) {
      if (!plans[i] || finished[i] || stopped()) continue;
      const size_t t0 = first_task[i];
      const auto start = std::chrono::steady_clock::now();
      const std::string why = cuda::unsupported_reason(*plans[i], opt);
      bool cut_short = false;
      if (!why.empty()) {
        task_error[t0] = points[i].key + ": " + why + " (backend = \"cuda\"; run this point with backend = \"cpu\")";
      } else {
        for (size_t l = 0; l < layer_tasks[i]; ++l) {
          if (stopped()) {  // the point stays unfinished (below)
            cut_short = true;
            break;
          }
          try {
            stats_of[t0 + l] = gpu.simulate_layer(*plans[i], static_cast<int64_t>(l), opt);
          } catch (const std::exception& e) {
            task_error[t0 + l] = points[i].key + ": layer " + std::to_string(l) + ": " + e.what();
            break;
          }
        }
      }
      if (cut_short) continue;  // stopped between its layers: not finished, not reported
      if (point_tasks[i] > layer_tasks[i]) run_model_task(i, t0 + layer_tasks[i]);  // the model runs on the CPU
      task_seconds[t0] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      finalize(i);
    }
    report_sweep_errors();
    std::vector<PointResult> out;
    for (size_t i = 0; i < n; ++i)
      if (finished[i]) out.push_back(std::move(results[i]));
    return out;
  }
#endif

  // The exact pass (reference attention, its top-k, ‖o‖²) is the same for every point:
  // computed once for as many heads as fit in kExactCacheBytes, reused by every
  // point's layer tasks (results are identical with or without it).
  std::unique_ptr<ExactAttentionCache> exact;
  if (std::any_of(layer_tasks.begin(), layer_tasks.end(), [](size_t t) { return t > 0; }) && !stopped()) {
    try {
      exact = std::make_unique<ExactAttentionCache>(rec, opt, kExactCacheBytes);
      opt.exact = exact.get();
    } catch (const SimulationStopped&) {  // stopped while it was built: no task runs
    }
  }

  const long ntasks = static_cast<long>(tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (long k = 0; k < ntasks; ++k) {
    const Task& task = tasks[static_cast<size_t>(k)];
    const size_t i = task.point;
    if (stopped()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    if (task.model) {
      run_model_task(i, static_cast<size_t>(k));
    } else {
      try {
        SimOptions o = opt;
        if (task.variant > 0) o.region = &regions[i][task.variant - 1].region;
        stats_of[static_cast<size_t>(k)] = simulate_layer(rec, *plans[i], static_cast<int64_t>(task.layer), o);
      } catch (const SimulationStopped&) {
        continue;  // the point stays unfinished, as one whose tasks a stop skipped
      } catch (const std::exception& e) {
        task_error[static_cast<size_t>(k)] = points[i].key + ": layer " + std::to_string(task.layer) + ": " + e.what();
      }
    }
    task_seconds[static_cast<size_t>(k)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (--remaining[i] == 0) finalize(i);
  }

  report_sweep_errors();
  std::vector<PointResult> out;
  for (size_t i = 0; i < n; ++i)
    if (finished[i]) out.push_back(std::move(results[i]));
  return out;
}

}  // namespace kvb
