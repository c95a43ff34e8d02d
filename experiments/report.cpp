#include "experiments/report.h"

#include "experiments/budget_uncertainty.h"
#include "experiments/comparisons.h"

#include "experiments/machine_info.h"

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "sim/io/atomic_file.h"
#include "experiments/point_log.h"
#include "experiments/run_state.h"
#include "experiments/sequences.h"
#include "kvb/build_config.h"
#include "kvb/git_info.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/metric_table.h"
#include "sim/strategies/strategy.h"

namespace kvb {

namespace {

std::string num(double v) { return format_double(v); }

// points.csv's fixed columns: before the coordinates, and between them and the metrics.
// `strategy` is the block's name (default its preset or type), `label` the point's
// display label (SweepPoint::display_label).
const std::vector<std::string> kPointColumnsLead = {"id", "strategy", "type", "key", "label"};
// `extrapolated`: which memory figures are taken at a longer context than the error
// (extrapolated_label, methods.md §1).
// `bpe_read`: the memory of the caches the evaluated queries read (Plan::mean_bpe_read).
const std::vector<std::string> kPointColumnsPlan = {"plan",  "bpe",          "bpe_target",  "bytes",
                                                    "bytes_target", "compression", "extrapolated", "bpe_read"};
constexpr const char* kPointColumnLast = "seconds";

// The points.csv columns of one metric: its value, then `<name>_se` when the metric has
// a standard error (MetricDef::standard_error), or `<name>_lo`, `<name>_hi` when it
// has an interval (MetricDef::has_interval: the bootstrap's, or a closed form).
std::vector<std::string> metric_columns(const std::string& name) {
  std::vector<std::string> cols = {name};
  const MetricDef& def = require_metric(name, "metrics.report");
  if (def.standard_error) cols.push_back(name + "_se");
  if (def.has_interval()) {
    cols.push_back(name + "_lo");
    cols.push_back(name + "_hi");
  }
  return cols;
}

std::vector<std::string> coordinate_names(const std::vector<SweepPoint>& points) {
  std::set<std::string> cols;
  for (const SweepPoint& p : points)
    for (const auto& [k, v] : p.coords) cols.insert(k);
  return {cols.begin(), cols.end()};
}

// Fixed-width number for console tables.
std::string short_num(double v) {
  char buf[32];
  if (v == 0 || (std::fabs(v) >= 1e-3 && std::fabs(v) < 1e5)) std::snprintf(buf, sizeof buf, "%.4g", v);
  else std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

// " [lo, hi]" of an interval, "" when it has none.
std::string interval_words(const Interval& i) {
  if (!std::isfinite(i.lo) || !std::isfinite(i.hi)) return "";
  return " [" + short_num(i.lo) + ", " + short_num(i.hi) + "]";
}
nlohmann::json interval_json(const Interval& i) {
  if (!std::isfinite(i.lo) || !std::isfinite(i.hi)) return nullptr;
  return nlohmann::json::array({i.lo, i.hi});
}

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

namespace {

// `name` as execvp would find it: itself when it has a '/', else the first executable
// of that name on PATH; empty when there is none.
std::string resolve_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : std::string();
  const char* path = std::getenv("PATH");
  for (const std::string& dir : split(path ? path : "", ':')) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// Whether `python` runs and imports what the plot scripts need (matplotlib, numpy).
bool imports_matplotlib(const std::string& python) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (FILE* null = std::fopen("/dev/null", "w")) {
      ::dup2(::fileno(null), STDOUT_FILENO);
      ::dup2(::fileno(null), STDERR_FILENO);
    }
    ::execl(python.c_str(), python.c_str(), "-c", "import matplotlib, numpy", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::string plot_python(std::string* why) {
  std::vector<std::pair<std::string, std::string>> candidates;  // (what, as written)
  if (const char* p = std::getenv("KVB_PYTHON"); p && *p) candidates.emplace_back("$KVB_PYTHON", p);
  else candidates = {{"Debian's", "/usr/bin/python3"}, {"the first on PATH", "python3"}};
  std::vector<std::string> tried;
  for (const auto& [what, name] : candidates) {
    const std::string path = resolve_executable(name);
    if (path.empty()) {
      tried.push_back(what + " " + name + " (not found)");
    } else if (imports_matplotlib(path)) {
      return path;
    } else {
      tried.push_back(what + " " + path + " (cannot import matplotlib and numpy)");
    }
  }
  if (why)
    *why = "plots need a Python 3 with matplotlib and numpy; tried " + join(tried, ", ") +
           ". Install Debian's python3-matplotlib (scripts/setup.sh does) or set KVB_PYTHON to an interpreter "
           "that has it (output.plots = false or --no-plots skips the plots)";
  return {};
}

std::filesystem::path make_run_dir(const std::filesystem::path& base, const std::string& name,
                                   const std::string& suffix) {
  const std::filesystem::path parent = base / name;
  std::filesystem::create_directories(parent);
  const std::string stamp = time_now("%Y%m%d-%H%M%S") + suffix;
  // create_directory is false when the folder exists: another process got it first.
  std::filesystem::path dir = parent / stamp;
  for (int i = 2; !std::filesystem::create_directory(dir); ++i) dir = parent / (stamp + "-" + std::to_string(i));
  // results/<name>/latest -> <timestamp> (best effort).
  const std::filesystem::path latest = parent / "latest";
  std::error_code ec;
  const std::filesystem::path tmp_link = parent / (".latest.tmp." + std::to_string(::getpid()));
  std::filesystem::remove(tmp_link, ec);
  std::filesystem::create_directory_symlink(dir.filename(), tmp_link, ec);
  if (!ec) std::filesystem::rename(tmp_link, latest, ec);
  return dir;
}

Report::Report(const ExperimentSpec& spec, std::vector<SweepPoint> points, std::filesystem::path dir)
    : spec_(spec), points_(std::move(points)), dir_(std::move(dir)) {}

void Report::write_config() const { write_file_atomic(dir_ / "config.toml", spec_.resolved_toml + "\n"); }

void Report::write_manifest(const RunInfo& info) const { write_file_atomic(manifest_path(), manifest_text(info)); }

std::string Report::manifest_text(const RunInfo& info) const {
  nlohmann::json j;
  j["name"] = spec_.name;
  j["description"] = spec_.description;
  // Absolute, so that a --resume or merge elsewhere finds the config's folder (its
  // relative data paths); a config given as text ("<config>") is named as it is.
  std::error_code ec;
  const bool config_is_file = std::filesystem::is_regular_file(spec_.config_path, ec);
  j["config"] = (config_is_file ? std::filesystem::absolute(spec_.config_path).lexically_normal() : spec_.config_path).string();
  j["command"] = info.command_line;
  j["status"] = info.status;
  if (!info.signal.empty()) j["signal"] = info.signal;
  if (!info.error.empty()) j["error"] = info.error;
  j["started"] = info.started_iso;
  j["wall_seconds"] = info.wall_seconds;
  if (!info.phase_seconds.empty()) {
    nlohmann::json phases = nlohmann::json::object();
    for (const auto& [phase, seconds] : info.phase_seconds) phases[phase] = seconds;
    j["phase_seconds"] = phases;
  }
  j["git_commit"] = KVB_GIT_COMMIT;
  j["kvbudget_version"] = KVB_VERSION;
  j["build_type"] = KVB_BUILD_TYPE;
  j["compiler"] = KVB_CXX_COMPILER;
  j["cuda_built"] = static_cast<bool>(KVB_HAVE_CUDA);
  j["backend_requested"] = backend_request_name(info.backend.requested);
  if (info.backend_decided) {
    j["backend"] = backend_name(info.backend.used);
    j["backend_reason"] = info.backend.reason;
    if (!info.backend.device.empty()) j["cuda_device"] = info.backend.device;
    if (info.backend.used == Backend::Cuda) j["precision"] = matmul_precision_name(spec_.precision);
  }
  if (!info.point_backends.empty()) j["point_backends"] = info.point_backends;
  j["cpu"] = cpu_model();
  j["cpu_cores_online"] = static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN));
  j["threads"] = spec_.threads > 0 ? spec_.threads : omp_get_max_threads();
  j["seed"] = spec_.seed;
  j["points_total"] = info.points_total;
  j["sweep_points_total"] = info.sweep_points_total ? info.sweep_points_total : info.points_total;
  j["shard"] = {{"index", info.shard.index}, {"count", info.shard.count}};
  j["points_resumed"] = info.points_resumed;
  j["plots_in_config"] = info.plots_in_config;
  if (!info.config_hash.empty()) j["config_hash"] = info.config_hash;
  if (!info.data_identity.empty()) j["data_identity"] = info.data_identity;
  j["recording"] = info.recording_summary;
  if (const auto& task = spec_.data.model.task) {  // [task], as configured
    j["task"] = {{"file", task->file.string()},
                 {"answer_regex", task->answer_regex},
                 {"max_new_tokens", task->max_new_tokens},
                 {"max_problems", task->max_problems},
                 {"problem_prefix", task->problem_prefix}};
    if (task->answer_after) j["task"]["answer_after"] = *task->answer_after;
  }
  std::vector<std::string> warnings = info.warnings;
  add_warnings(warnings, info.earlier_warnings);
  j["warnings"] = warnings;
  // Derived from point_backends, so that a resumed run (which does not carry the
  // earlier manifest's warnings) keeps it.
  if (info.point_backends.size() > 1) j["warnings"].push_back(mixed_backends_note(info.point_backends));
  j["calibration"] = {{"rule", spec_.calibration.text},
                      {"overlap_allowed", spec_.calibration.overlap},
                      {"count", info.positions.calibration.size()},
                      {"positions", info.positions.calibration}};
  j["evaluation"] = {{"rule", info.positions.evaluation_text}, {"count", info.positions.evaluation.size()}};
  if (!info.positions.evaluation.empty()) {
    j["evaluation"]["first"] = info.positions.evaluation.front();
    j["evaluation"]["last"] = info.positions.evaluation.back();
  }
  if (spec_.metrics.positions_text != "all") j["evaluation"]["positions"] = info.positions.evaluation;
  // What was measured and asked, including what --budget and the budget queries added
  // (config.toml holds the config after --set, with the --budget queries appended).
  j["metrics_reported"] = spec_.metrics.report;
  // How points.csv states the uncertainty of a metric (methods.md §4, "Uncertainty").
  const BootstrapSettings bootstrap = bootstrap_settings(spec_);
  const auto evaluated = static_cast<int64_t>(info.positions.evaluation.size());
  if (!info.sequences.empty()) {
    j["sequences"] = info.sequences;
    j["sequence_aggregate"] =
        "each metric: the mean over the sequences of its value on each (every sequence weighs the same; they have "
        "the same tokens and evaluated positions); per-sequence rows in points_by_sequence.csv; memory is the same "
        "on every sequence";
  }
  j["uncertainty"] = {
      {"attention_interval",
       {{"columns", "<metric>_lo, <metric>_hi"},
        {"method", "percentile bootstrap over blocks of consecutive evaluated query positions; a block holds "
                   "every layer and query head of its positions; each resample draws as many blocks as there "
                   "are, with replacement; the same draws for every point"},
        {"level", bootstrap.level},
        {"resamples", bootstrap.resamples},
        {"block_positions", bootstrap_block_positions(evaluated)},
        {"blocks", bootstrap_blocks(evaluated)},
        {"seed", bootstrap.seed}}},
      {"model_standard_error",
       {{"columns", "<metric>_se"},
        {"method", "as llama.cpp's perplexity tool: SE of a mean = sqrt((mean(x^2) - mean(x)^2) / (n - 1)) over "
                   "evaluated positions; ppl: PPL * SE(mean NLL); ppl_ratio: ratio * SE(mean(nll - nll_base)), "
                   "the SE of ln(ppl_ratio) times the ratio; same_top_rate: sqrt(p (1 - p) / (n - 1))"}}},
      {"answer_interval",
       {{"columns", "answer_accuracy_lo, answer_accuracy_hi"},
        {"method", "Wilson score interval of the proportion of the task's problems answered right (each problem "
                   "one Bernoulli trial)"},
        {"level", 0.95}}}};
  if (!spec_.metrics.baseline.empty())
    j["uncertainty"]["paired_comparison"] = {
        {"file", "comparisons.csv"},
        {"baseline", spec_.metrics.baseline},
        {"method", "paired percentile bootstrap of (point - baseline) over the same resampled blocks (attention: "
                   "the blocks above; model: blocks of consecutive next-token positions of the same length rule; "
                   "answer accuracy: single problems); the baseline point is the baseline strategy's nearest in "
                   "memory (output.x); better/worse only when the interval excludes zero"},
        {"level", bootstrap.level},
        {"resamples", bootstrap.resamples},
        {"seed", bootstrap.seed}};
  if (!info.sequences.empty()) {  // several sequences: how the aggregate's uncertainty is formed
    j["uncertainty"]["sequences"] = {
        {"count", info.sequences.size()},
        {"interval_method",
         "two-level (hierarchical) percentile bootstrap of the mean over sequences: each resample draws as many "
         "sequences as there are, with replacement, and within each drawn sequence one resample of its own block "
         "bootstrap above (attention metrics) or of its problems (answer_accuracy); replaces the one-sequence "
         "intervals above"},
        {"standard_error_method", "sqrt(sum over sequences of se^2) / sequences: the sum of the sequences' variances "
                                  "(sequences independent)"},
        {"paired_method",
         "two-level paired bootstrap: the same sequences and, within each, the same blocks for point and baseline; "
         "the difference of the means over sequences"}};
  }
  j["primary_metric"] = spec_.metrics.primary;
  // The settings budgets.json and the plots were made with, defaults resolved (config.toml
  // holds only the keys the config wrote): what Python's Result.budget() and plot() read.
  j["pareto_metrics"] = spec_.metrics.pareto;
  j["memory_axis"] = spec_.output.x;
  j["target_context"] = spec_.output.target_context;
  nlohmann::json budgets = nlohmann::json::array();
  for (const BudgetQuery& q : spec_.budgets) budgets.push_back(q.text);
  j["budget_queries"] = budgets;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  j["host"] = host;
  j["pid"] = static_cast<int64_t>(::getpid());
  j["heartbeat"] = time_now("%Y-%m-%dT%H:%M:%S%z");
  j["heartbeat_unix"] = static_cast<int64_t>(std::time(nullptr));
  if (info.heartbeat_interval_s > 0) j["heartbeat_interval_s"] = info.heartbeat_interval_s;
  return j.dump(2) + "\n";
}

std::vector<std::string> points_csv_columns(const ExperimentSpec& spec, const std::vector<SweepPoint>& points) {
  std::vector<std::string> cols = kPointColumnsLead;
  auto add = [&](const std::string& c) {
    if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
  };
  for (const std::string& c : coordinate_names(points)) add(c);
  for (const std::string& c : kPointColumnsPlan) add(c);
  for (const std::string& m : spec.metrics.report)
    for (const std::string& c : metric_columns(m)) add(c);
  for (const SweepPoint& p : points)
    for (const std::string& c : require_strategy_type(p.type, "strategy").columns) add(c);
  add(kPointColumnLast);
  return cols;
}

void check_plot_columns(const ExperimentSpec& spec, const std::vector<SweepPoint>& points) {
  const std::vector<std::string> cols = points_csv_columns(spec, points);
  for (const auto& [name, where] : {std::pair{spec.output.series, spec.output.series_where},
                                    std::pair{spec.output.marker, spec.output.marker_where}}) {
    if (name.empty() || std::find(cols.begin(), cols.end(), name) != cols.end()) continue;
    throw ConfigError(where + ": '" + name + "' is not a points.csv column of this sweep" + did_you_mean(name, cols) +
                      "; columns: " + join(cols, ", "));
  }
}

namespace {

// The fewest units per sequence of block sums (one sequence: its blocks).
int64_t units_per_sequence(const BlockSums& sums) {
  if (sums.sequence_blocks.empty()) return static_cast<int64_t>(sums.num.size());
  return *std::min_element(sums.sequence_blocks.begin(), sums.sequence_blocks.end());
}

// "1 block", "3 problems".
std::string counted(int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::vector<std::string> too_few_interval_units_warnings(const ExperimentSpec& spec, int64_t evaluated_positions,
                                                        const std::vector<PointResult>& results) {
  const std::string fewer = " (fewer than " + std::to_string(kMinIntervalUnits) + ")";
  const std::string on_each = spec.data.sequence_count() > 1 ? " on each sequence" : "";
  std::vector<std::string> parts;
  // Attention metrics: the block bootstrap over the evaluated positions.
  const int64_t blocks = bootstrap_blocks(evaluated_positions);
  const bool attention = std::any_of(spec.metrics.report.begin(), spec.metrics.report.end(), [](const std::string& m) {
    return require_metric(m, "metrics.report").rows.kind != RowReduction::Kind::None;
  });
  if (attention && !enough_units_for_interval(blocks))
    parts.push_back(counted(blocks, "block", "blocks") + " of evaluated positions" + on_each + fewer +
                    ": no bootstrap intervals or paired verdicts; evaluate more positions (metrics.positions)");
  // Model metrics: paired over blocks of next-token positions, or over problems.
  std::vector<std::string> by_positions, by_problems;
  int64_t position_blocks_seen = -1, problems_seen = -1;
  for (size_t k = 0; k < spec.metrics.report.size(); ++k) {
    const MetricDef& m = require_metric(spec.metrics.report[k], "metrics.report");
    if (m.level != MetricLevel::Model || !m.samples.value) continue;
    const auto finished = std::find_if(results.begin(), results.end(), [&](const PointResult& r) {
      return r.ok && k < r.block_sums.size() && !r.block_sums[k].empty();
    });
    if (finished == results.end()) continue;
    const int64_t units = units_per_sequence(finished->block_sums[k]);
    if (enough_units_for_interval(units)) continue;
    const bool problems = m.samples.unit == SampleReduction::Unit::Problems;
    (problems ? by_problems : by_positions).push_back(m.name);
    (problems ? problems_seen : position_blocks_seen) = units;
  }
  if (!by_positions.empty())
    parts.push_back(counted(position_blocks_seen, "block", "blocks") + " of next-token positions" + on_each + fewer +
                    ": no paired verdicts on " + join(by_positions, ", ") +
                    "; evaluate more positions (metrics.positions)");
  if (!by_problems.empty())
    parts.push_back(counted(problems_seen, "problem", "problems") + " of the answer task" + on_each + fewer +
                    ": no paired verdicts on " + join(by_problems, ", ") +
                    " (its Wilson interval stays); give the task more problems (task.max_problems)");
  return parts;
}

std::vector<std::string> Report::coord_columns() const { return coordinate_names(points_); }

std::vector<std::string> Report::annotation_columns(const std::vector<PointResult>& results) const {
  const std::vector<std::string> coords = coord_columns();
  std::vector<std::string> notes;
  for (const PointResult& r : results)
    if (r.ok)
      for (const Annotation& a : r.annotations)
        if (std::find(notes.begin(), notes.end(), a.name) == notes.end() &&
            std::find(coords.begin(), coords.end(), a.name) == coords.end())
          notes.push_back(a.name);
  return notes;
}

std::string Report::points_csv(const std::vector<PointResult>& results) const {
  return points_csv(results, annotation_columns(results));
}

std::string Report::points_csv(const std::vector<PointResult>& results, const std::vector<std::string>& notes) const {
  const std::vector<std::string> coords = coord_columns();
  auto annotation_text = [](const Annotation& a) {
    if (const double* d = std::get_if<double>(&a.value)) return num(*d);
    return csv_field(std::get<std::string>(a.value));
  };
  std::ostringstream os;
  os << join(kPointColumnsLead, ",");
  for (const std::string& c : coords) os << "," << csv_field(c);
  os << "," << join(kPointColumnsPlan, ",");
  for (const std::string& m : spec_.metrics.report)
    for (const std::string& c : metric_columns(m)) os << "," << c;
  for (const std::string& a : notes) os << "," << csv_field(a);
  os << "," << kPointColumnLast << "\n";
  for (const PointResult& r : results) {
    if (!r.ok) continue;
    const SweepPoint& p = points_[r.id];
    os << p.id << "," << csv_field(p.label) << "," << csv_field(p.type) << "," << csv_field(p.key) << ","
       << csv_field(p.display_label);
    for (const std::string& c : coords) {
      std::optional<std::string> v;
      for (const auto& [k, val] : p.coords)
        if (k == c) v = csv_field(val);
      for (const Annotation& a : r.annotations)
        if (!v && a.name == c) v = annotation_text(a);
      os << "," << v.value_or("");
    }
    os << "," << csv_field(r.plan) << "," << num(r.bpe) << "," << num(r.bpe_target) << "," << num(r.bytes) << ","
       << num(r.bytes_target) << "," << num(16.0 / r.bpe) << "," << extrapolated_label(r) << "," << num(r.bpe_read);
    for (size_t k = 0; k < r.metrics.size(); ++k) {
      os << "," << num(r.metrics[k]);
      const MetricDef& def = require_metric(spec_.metrics.report[k], "metrics.report");
      if (def.standard_error) os << "," << num(r.standard_errors[k]);
      if (def.has_interval())
        os << "," << num(r.intervals[k].lo) << "," << num(r.intervals[k].hi);
    }
    for (const std::string& name : notes) {
      os << ",";
      for (const Annotation& a : r.annotations)
        if (a.name == name) os << annotation_text(a);
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f", r.seconds);
    os << "," << secs << "\n";
  }
  return os.str();
}

std::vector<size_t> Report::write_points_by_sequence(const std::vector<std::string>& sources,
                                                     const std::vector<PointResult>& results) const {
  std::vector<const PointResult*> sorted;
  for (const PointResult& r : results) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](const PointResult* a, const PointResult* b) { return a->id < b->id; });
  std::vector<std::vector<PointResult>> rows(sources.size());  // [sequence][point], by id
  std::vector<PointResult> every_row;                           // for one set of columns
  std::vector<size_t> unknown;
  for (const PointResult* r : sorted) {
    if (r->sequences.size() != sources.size()) {
      if (r->ok) unknown.push_back(r->id);  // a failed point has no row in points.csv either
      continue;
    }
    for (size_t s = 0; s < sources.size(); ++s) {
      rows[s].push_back(r->sequences[s]);
      every_row.push_back(r->sequences[s]);
    }
  }
  // The annotation columns of every point on every sequence (points.csv's rule), so
  // that points of different strategy blocks share one header.
  const std::vector<std::string> notes = annotation_columns(every_row);
  std::vector<std::string> texts;
  for (const std::vector<PointResult>& on_sequence : rows) texts.push_back(points_csv(on_sequence, notes));
  write_file_atomic(dir_ / "points_by_sequence.csv", points_by_sequence_csv(sources, texts));
  return unknown;
}

void Report::write_point_log(const std::vector<PointResult>& results) const {
  std::vector<const PointResult*> sorted;
  for (const PointResult& r : results) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](const PointResult* a, const PointResult* b) { return a->id < b->id; });
  std::string text;
  for (const PointResult* r : sorted) text += point_result_json(*r, points_[r->id].key) + "\n";
  write_file_atomic(dir_ / kPointLogFile, text);
}

void Report::write_points(const std::vector<PointResult>& results) const {
  std::vector<PointResult> sorted = results;
  std::sort(sorted.begin(), sorted.end(), [](const PointResult& a, const PointResult& b) { return a.id < b.id; });
  write_file_atomic(dir_ / "points.csv", points_csv(sorted));
  std::ostringstream err;
  bool any = false;
  err << "id,key,label,error\n";
  for (const PointResult& r : sorted) {
    if (r.ok) continue;
    any = true;
    err << r.id << "," << csv_field(points_[r.id].key) << "," << csv_field(points_[r.id].display_label) << ","
        << csv_field(r.error) << "\n";
  }
  if (any) write_file_atomic(dir_ / "errors.csv", err.str());
}

std::string Report::attribution_csv(const std::vector<PointResult>& results) const {
  std::string out = kAttributionHeader;
  for (const PointResult& r : results)
    if (r.ok && r.attribution) out += attribution_rows(r.id, csv_field(points_[r.id].key), *r.attribution);
  return out;
}

std::string Report::concentration_csv(const std::vector<PointResult>& results) const {
  std::string out = kConcentrationHeader;
  for (const PointResult& r : results)
    if (r.ok && r.attribution) out += concentration_rows(r.id, csv_field(points_[r.id].key), *r.attribution);
  return out;
}

void Report::write_attribution(const std::vector<PointResult>& results) const {
  std::vector<PointResult> sorted = results;
  std::sort(sorted.begin(), sorted.end(), [](const PointResult& a, const PointResult& b) { return a.id < b.id; });
  if (std::none_of(sorted.begin(), sorted.end(), [](const PointResult& r) { return r.ok && r.attribution; })) return;
  write_file_atomic(dir_ / "attribution.csv", attribution_csv(sorted));
  write_file_atomic(dir_ / "concentration.csv", concentration_csv(sorted));
}

FrontierInput Report::frontier_input(const std::vector<const PointResult*>& ok) const {
  FrontierInput in;
  in.metric_names = spec_.metrics.report;
  in.metric_values.resize(in.metric_names.size());
  in.pareto_metrics = spec_.metrics.pareto;
  in.memory = spec_.output.x;
  for (const PointResult* r : ok) {
    for (const std::string& c : memory_columns()) frontier_memory_column(in, c).push_back(memory_value(*r, c));
    for (size_t m = 0; m < in.metric_names.size(); ++m) in.metric_values[m].push_back(r->metrics[m]);
  }
  return in;
}

Report::Frontier Report::frontier(const std::vector<PointResult>& results) const {
  std::vector<const PointResult*> ok;
  for (const PointResult& r : results)
    if (r.ok) ok.push_back(&r);
  std::sort(ok.begin(), ok.end(), [](const PointResult* a, const PointResult* b) { return a->id < b->id; });
  const FrontierInput in = frontier_input(ok);
  auto metric_index = [&](const std::string& m) {
    return static_cast<size_t>(std::find(in.metric_names.begin(), in.metric_names.end(), m) - in.metric_names.begin());
  };
  // The frontiers' memory axis (output.x) and how the console names it.
  const std::string& x = spec_.output.x;
  const bool at_target = x == "bpe_target" || x == "bytes_target";
  const std::string target = std::to_string(spec_.output.target_context);
  const bool read = x == "bpe_read";
  const std::string x_words = (x.rfind("bpe", 0) == 0 ? std::string("bits per element") : std::string("bytes")) +
                              (at_target ? " at target_context " + target + " tokens"
                               : read    ? " of the caches the evaluated queries read (bpe_read)"
                                         : std::string());
  const std::vector<double>& cost = frontier_column(in, x);
  // The table's bits-per-element and bytes columns: those of output.x's context (bytes
  // at T beside bpe_read, which has no bytes of its own).
  const std::string bpe_column = at_target ? "bpe_target" : read ? "bpe_read" : "bpe";
  const std::string bytes_column = at_target ? "bytes_target" : "bytes";
  constexpr const char* kUncertainMark = " ~";

  const BootstrapSettings settings = bootstrap_settings(spec_);
  char level[32];
  std::snprintf(level, sizeof level, "%g %%", settings.level * 100);
  // A point as an uncertainty note names it: label, bpe and the memory column in use
  // (`memory`, when not bpe: "bpe 4.625, bpe_target 3.025"), marked "extrapolated" when
  // that memory is (its note added to `notes`), value [interval].
  auto point_words = [&](size_t row, const std::string& metric, const std::string& memory,
                         std::vector<std::string>& notes) {
    const PointResult& r = *ok[row];
    const size_t k = metric_index(metric);
    const std::string note = extrapolation_note(r, memory, spec_.output.target_context);
    append_once(notes, note);
    return points_[r.id].display_label + " (bpe " + short_num(r.bpe) +
           (memory == "bpe" ? "" : ", " + memory + " " + short_num(frontier_column(in, memory)[row])) +
           (note.empty() ? "" : " extrapolated") + ", " + short_num(r.metrics[k]) +
           interval_words(metric_interval(r, k, settings.level)) + ")";
  };
  // A front point whose place is within uncertainty, and the cheaper points it cannot
  // be told from (the first few), on the frontier's memory axis output.x.
  auto front_rival_words = [&](const PointResult& r, const std::vector<size_t>& rivals, const std::string& metric,
                               std::vector<std::string>& notes) {
    constexpr size_t kListed = 3;
    std::string words = points_[r.id].display_label + ": ";
    for (size_t i = 0; i < std::min(kListed, rivals.size()); ++i)
      words += (i ? "; " : "") + point_words(rivals[i], metric, x, notes);
    if (rivals.size() > kListed) words += "; and " + std::to_string(rivals.size() - kListed) + " more";
    return words;
  };
  std::ostringstream csv, console;
  csv << "metric,rank,id,key,strategy,label," << join(memory_columns(), ",")
      << ",value,value_lo,value_hi,memory,extrapolated,within_uncertainty,may_be_dominated_by\n";
  for (const std::string& m : spec_.metrics.pareto) {
    const MetricDef& def = *find_metric(m);
    const std::vector<size_t> front = pareto_front(cost, in.metric_values[metric_index(m)], def.better);
    const std::vector<FrontPointUncertainty> places = front_uncertainty(front, metric_index(m), cost, in, ok, settings);
    for (size_t k = 0; k < front.size(); ++k) {
      const PointResult& r = *ok[front[k]];
      const SweepPoint& point = points_[r.id];
      const FrontPointUncertainty& u = places[k];
      std::string rivals;  // point ids, ';'-separated
      for (size_t row : u.may_be_dominated_by) rivals += (rivals.empty() ? "" : ";") + std::to_string(ok[row]->id);
      csv << m << "," << k << "," << r.id << "," << csv_field(point.key) << "," << csv_field(point.label) << ","
          << csv_field(point.display_label) << ",";
      for (const std::string& c : memory_columns()) csv << num(memory_value(r, c)) << ",";
      csv << num(r.metrics[metric_index(m)]) << "," << num(u.interval.lo) << "," << num(u.interval.hi) << "," << x
          << "," << (extrapolated_on(r, x) ? "true" : "false") << ","
          << (!u.known ? "" : u.may_be_dominated_by.empty() ? "false" : "true") << "," << rivals << "\n";
    }
    // Console: the frontier of this metric with the other Pareto metrics beside it.
    console << "\nPareto frontier: " << m << " (" << (def.better == Better::Lower ? "lower" : "higher")
            << " is better) vs " << x_words << ", " << front.size() << " of " << ok.size() << " points\n";
    char line[512];
    const int bpe_width = at_target ? 10 : 8;  // fits the column's name
    std::snprintf(line, sizeof line, "  %*s %7s %12s", bpe_width, bpe_column.c_str(), "x fp16",
                  read ? "bytes at T" : bytes_column.c_str());
    console << line;
    for (const std::string& o : spec_.metrics.pareto) {
      std::snprintf(line, sizeof line, " %20s", o.substr(0, 20).c_str());
      console << line;
    }
    console << "  point\n";
    std::vector<std::string> notes;  // why the marked points are extrapolated, each once
    std::vector<std::string> uncertain;  // the front's points whose place is within uncertainty
    for (size_t f = 0; f < front.size(); ++f) {
      const size_t i = front[f];
      const PointResult& r = *ok[i];
      const double bpe = memory_value(r, bpe_column);
      std::snprintf(line, sizeof line, "  %*.4f %7.3f %12.0f", bpe_width, bpe, 16.0 / bpe, memory_value(r, bytes_column));
      console << line;
      for (const std::string& o : spec_.metrics.pareto) {
        std::snprintf(line, sizeof line, " %20s", short_num(r.metrics[metric_index(o)]).c_str());
        console << line;
      }
      const std::string note = extrapolation_note(r, x, spec_.output.target_context);
      const std::vector<size_t>& rivals = places[f].may_be_dominated_by;
      console << "  " << points_[r.id].display_label << (note.empty() ? "" : kExtrapolatedMark)
              << (rivals.empty() ? "" : kUncertainMark) << "\n";
      append_once(notes, note);
      if (!rivals.empty()) uncertain.push_back(front_rival_words(r, rivals, m, notes));
    }
    for (const std::string& note : notes) console << "  " << extrapolation_line(note) << "\n";
    if (!uncertain.empty())
      console << "  ~ within uncertainty: not told apart (" << level
              << " paired bootstrap interval of the difference holds 0, or overlapping intervals) from a point "
                 "with no more memory, so it may be no better (pareto.csv may_be_dominated_by):\n";
    for (const std::string& words : uncertain) console << "    " << words << "\n";
  }
  nlohmann::json budgets = nlohmann::json::array();
  // A point an answer's uncertainty names, on the memory column the query used
  // (`memory`: an error budget's output.x, a memory budget's own column), with whether
  // that memory is extrapolated and why (as the pick's `extrapolated`, `extrapolation`).
  auto point_json = [&](size_t row, const std::string& metric, const std::string& memory) {
    const PointResult& r = *ok[row];
    const size_t k = metric_index(metric);
    const std::string note = extrapolation_note(r, memory, spec_.output.target_context);
    nlohmann::json j{{"id", r.id},
                     {"point", points_[r.id].key},
                     {"label", points_[r.id].display_label},
                     {"bpe", r.bpe},
                     {"memory", memory},
                     {"memory_value", frontier_column(in, memory)[row]},
                     {"extrapolated", !note.empty()},
                     {"value", r.metrics[k]},
                     {"interval", interval_json(metric_interval(r, k, settings.level))}};
    if (!note.empty()) j["extrapolation"] = note;
    return j;
  };
  // What the pick's uncertainty leaves open, as console lines (none when nothing) and
  // budgets.json fields of the answer `jp`. The points it names stand on the answer's
  // `memory` column; why those are extrapolated follows them, each note once, unless it
  // is the pick's (`pick_note`, on the pick's line).
  auto budget_uncertainty_words = [&](const BudgetQuery& q, const BudgetAnswer::Pick& p, const PickUncertainty& u,
                                      const std::string& memory, const std::string& pick_note, nlohmann::json& jp) {
    const char* level_text = level;
    std::vector<std::string> notes{pick_note};
    auto rival_words = [&](size_t row) { return point_words(row, p.metric, memory, notes); };
    auto rival_json = [&](size_t row) { return point_json(row, p.metric, memory); };
    // The notes of the points named, after the pick's.
    auto with_notes = [&](std::string words) {
      for (size_t i = 1; i < notes.size(); ++i)
        words += "      " + extrapolation_line(notes[i]) + "\n";
      return words;
    };
    std::string words;
    if (!u.known) {  // no interval: nothing said of the bound or the rivals
      if (!q.memory) {
        jp["meets_bound_for_certain"] = nullptr;
        jp["cheaper_within_uncertainty"] = nullptr;
      } else {
        jp["indistinguishable"] = nullptr;
      }
      return words;
    }
    if (!q.memory) {
      jp["meets_bound_for_certain"] = u.meets_for_certain ? nlohmann::json(*u.meets_for_certain) : nlohmann::json();
      jp["cheaper_within_uncertainty"] = nlohmann::json::array();
      for (size_t row : u.cheaper_within_uncertainty) jp["cheaper_within_uncertainty"].push_back(rival_json(row));
      if (!u.cheaper_within_uncertainty.empty()) {
        words += std::string("      with less memory, within uncertainty of the bound (") + level_text +
                 " interval reaches it): ";
        constexpr size_t kListed = 3;
        for (size_t i = 0; i < std::min(kListed, u.cheaper_within_uncertainty.size()); ++i)
          words += (i ? "; " : "") + rival_words(u.cheaper_within_uncertainty[i]);
        if (u.cheaper_within_uncertainty.size() > kListed)
          words += "; and " + std::to_string(u.cheaper_within_uncertainty.size() - kListed) + " more (budgets.json)";
        words += "\n";
      }
      if (u.meets_for_certain && !*u.meets_for_certain) {
        jp["least_memory_for_certain"] =
            u.least_memory_for_certain ? rival_json(*u.least_memory_for_certain) : nlohmann::json();
        words += std::string("      within uncertainty: its ") + level_text + " interval reaches past " +
                 short_num(q.bound) + "; the least memory whose whole interval meets it: " +
                 (u.least_memory_for_certain ? rival_words(*u.least_memory_for_certain) : "none") + "\n";
      }
      return with_notes(words);
    }
    jp["indistinguishable"] = nlohmann::json::array();
    for (const PickUncertainty::Rival& rival : u.indistinguishable) {
      nlohmann::json j = rival_json(rival.index);
      j["paired"] = rival.paired;
      if (rival.paired) {
        j["difference"] = rival.difference.value;
        j["difference_interval"] = interval_json(rival.difference.interval);
      }
      jp["indistinguishable"].push_back(std::move(j));
    }
    if (u.indistinguishable.empty()) return words;
    words += std::string("      not distinguishable from it (") + level_text +
             " paired bootstrap interval of the difference holds 0, or overlapping intervals): ";
    constexpr size_t kListed = 4;
    for (size_t i = 0; i < std::min(kListed, u.indistinguishable.size()); ++i)
      words += (i ? "; " : "") + rival_words(u.indistinguishable[i].index);
    if (u.indistinguishable.size() > kListed)
      words += "; and " + std::to_string(u.indistinguishable.size() - kListed) + " more (budgets.json)";
    return with_notes(words + "\n");
  };
  if (!spec_.budgets.empty()) console << "\nBudget queries:\n";
  for (const BudgetQuery& q : spec_.budgets) {
    const BudgetAnswer a = answer_budget(q, in);
    nlohmann::json jq;
    jq["query"] = q.text;
    jq["kind"] = q.memory ? "least error within a memory budget" : "least memory meeting an error budget";
    jq["answers"] = nlohmann::json::array();
    for (const BudgetAnswer::Pick& p : a.picks) {
      nlohmann::json jp;
      jp["metric"] = p.metric;
      if (!p.index) {
        jp["point"] = nullptr;
        console << "  " << q.text << (q.memory ? " -> best " + p.metric : std::string()) << ": no point qualifies\n";
      } else {
        const PointResult& r = *ok[*p.index];
        const double value = r.metrics[metric_index(p.metric)];
        jp["point"] = points_[r.id].key;
        jp["strategy"] = points_[r.id].label;
        jp["label"] = points_[r.id].display_label;
        jp["id"] = r.id;
        for (const std::string& c : memory_columns()) jp[c] = memory_value(r, c);
        jp["value"] = value;
        // A memory budget reads its own column; an error budget minimizes output.x.
        const std::string& memory = q.memory ? q.lhs : spec_.output.x;
        const std::string note = extrapolation_note(r, memory, spec_.output.target_context);
        jp["memory"] = memory;
        jp["extrapolated"] = !note.empty();
        if (!note.empty()) jp["extrapolation"] = note;
        const double picked_memory = frontier_column(in, memory)[*p.index];
        jp["memory_value"] = picked_memory;
        const PickUncertainty u = pick_uncertainty(q, p, in, ok, settings);
        jp["interval"] = interval_json(u.interval);
        console << "  " << q.text << (q.memory ? " -> best " + p.metric : std::string(" -> least memory")) << ": "
                << points_[r.id].display_label << "  (bpe " << short_num(r.bpe)
                << (memory == "bpe" ? "" : ", " + memory + " " + short_num(picked_memory)) << ", " << p.metric << " "
                << short_num(value) << interval_words(u.interval) << ")"
                << (note.empty() ? "" : "  extrapolated: " + note) << "\n";
        console << budget_uncertainty_words(q, p, u, memory, note, jp);
      }
      jq["answers"].push_back(jp);
    }
    budgets.push_back(jq);
  }
  return Frontier{csv.str(), budgets.dump(2) + "\n", console.str()};
}

std::string Report::write_frontier(const std::vector<PointResult>& results, std::string* write_error) const {
  const Frontier f = frontier(results);
  for (const auto& [file, text] : {std::pair{"pareto.csv", f.pareto_csv}, std::pair{"budgets.json", f.budgets_json}}) {
    try {
      write_file_atomic(dir_ / file, text);
    } catch (const std::exception& e) {
      if (write_error) *write_error += std::string(write_error->empty() ? "" : "; ") + e.what();
    }
  }
  return f.console;
}

std::string Report::write_comparisons(const std::vector<PointResult>& results, std::string* write_error) const {
  if (spec_.metrics.baseline.empty()) return "";
  const std::vector<Comparison> comparisons = compare_with_baseline(spec_, points_, results);
  try {
    write_file_atomic(dir_ / "comparisons.csv", comparisons_csv(points_, comparisons));
  } catch (const std::exception& e) {
    if (write_error) *write_error = e.what();
  }
  return comparisons_console(spec_, points_, comparisons);
}

namespace {

// A plot script's process: `argv` started with stdout and stderr into `log`. Its BLAS
// runs on one thread unless the caller's environment says otherwise: the scripts do
// no linear algebra worth a thread pool, and OpenBLAS's idle threads spin, taking CPU
// from the other script running beside it.
struct LoggedProcess {
  std::vector<std::string> argv;
  std::filesystem::path log;
  pid_t pid = -1;
};

LoggedProcess start_logged(std::vector<std::string> argv, const std::filesystem::path& log) {
  // Arguments and environment built before fork: the child of a threaded process only
  // redirects and execs.
  LoggedProcess p{std::move(argv), log};
  std::vector<char*> args;
  for (std::string& a : p.argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::string one_blas_thread = "OPENBLAS_NUM_THREADS=1";
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  if (!std::getenv("OPENBLAS_NUM_THREADS")) env.push_back(one_blas_thread.data());
  env.push_back(nullptr);
  p.pid = ::fork();
  if (p.pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
    ::execve(args[0], args.data(), env.data());  // argv[0]: plot_python()'s resolved path
    std::fprintf(stderr, "cannot run %s\n", args[0]);
    ::_exit(127);
  }
  return p;
}

// Waits for a started script: empty on success, else the log tail.
std::string finish_logged(const LoggedProcess& p) {
  if (p.pid < 0) return "fork failed";
  int status = 0;
  ::waitpid(p.pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    std::filesystem::remove(p.log);
    return {};
  }
  std::ifstream in(p.log);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string tail = ss.str();
  if (tail.size() > 800) tail = "..." + tail.substr(tail.size() - 800);
  // The setup hint only where the interpreter or matplotlib is what is missing.
  const bool missing = tail.find("No module named") != std::string::npos || tail.find("cannot run") != std::string::npos;
  return p.argv[0] + " " + p.argv[1] + " failed (see " + p.log.string() + "):\n" + tail +
         (missing ? "\n(plots need Debian's python3-matplotlib: scripts/setup.sh installs it)" : "");
}

}  // namespace

std::string Report::write_plots() const {
  const std::filesystem::path scripts = std::filesystem::path(KVB_SOURCE_DIR) / "experiments";
  const std::filesystem::path pareto = scripts / "plot_pareto.py", attribution = scripts / "plot_attribution.py";
  if (!std::filesystem::exists(pareto)) return "plot script not found at " + pareto.string();
  std::string no_python;
  const std::string python = plot_python(&no_python);
  if (python.empty()) return no_python;
  std::vector<std::string> argv = {python, pareto.string(), "--results", dir_.string(), "--metrics",
                                   join(spec_.metrics.pareto, ","), "--title", spec_.name, "--x", spec_.output.x,
                                   "--target-context", std::to_string(spec_.output.target_context)};
  std::vector<std::string> higher_is_better;  // the plot labels and scales each metric by its direction
  for (const std::string& m : spec_.metrics.pareto)
    if (const MetricDef* def = find_metric(m); def != nullptr && def->better == Better::Higher)
      higher_is_better.push_back(m);
  if (!higher_is_better.empty()) {
    argv.push_back("--higher-is-better");
    argv.push_back(join(higher_is_better, ","));
  }
  // Axis labels from the metric table: quantity, unit, direction.
  for (const std::string& m : spec_.metrics.pareto)
    if (const MetricDef* def = find_metric(m)) {
      argv.push_back("--metric-label");
      argv.push_back(m + "=" + metric_axis_label(*def));
    }
  if (!spec_.output.series.empty()) {
    argv.push_back("--series");
    argv.push_back(spec_.output.series);
  }
  if (!spec_.output.marker.empty()) {
    argv.push_back("--marker");
    argv.push_back(spec_.output.marker);
  }
  // The two scripts write different files: they run side by side (each is minutes of
  // matplotlib at most, seconds for most runs, and one thread).
  std::vector<LoggedProcess> scripts_run = {start_logged(argv, dir_ / "plots.log")};
  std::vector<std::string> errors;
  if (std::filesystem::exists(dir_ / "attribution.csv")) {
    if (std::filesystem::exists(attribution))
      scripts_run.push_back(start_logged({python, attribution.string(), "--results", dir_.string(), "--title", spec_.name},
                                         dir_ / "plots_attribution.log"));
    else
      errors.push_back("plot script not found at " + attribution.string());
  }
  for (const LoggedProcess& p : scripts_run)
    if (std::string err = finish_logged(p); !err.empty()) errors.push_back(std::move(err));
  return join(errors, "\n");
}

}  // namespace kvb
