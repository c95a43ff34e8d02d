#include "experiments/experiment.h"

#include <algorithm>
#include <regex>
#include <sstream>

#include "experiments/attribution.h"
#include "experiments/range_grammar.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/metrics/metric_table.h"

namespace kvb {

namespace {

CalibrationSpec parse_calibration(const std::optional<ConfigTable>& t) {
  CalibrationSpec c;
  if (!t) return c;
  c.overlap = t->boolean("overlap", false);
  if (const toml::node* n = t->node("positions")) {
    if (t->has("stride") || t->has("offset")) t->fail("positions", "give positions or stride/offset, not both");
    c.explicit_positions = true;
    if (n->is_string()) {
      const std::string text = *n->value<std::string>();
      auto r = parse_range_at(*t, "positions", text);
      if (!r || r->empty()) t->fail("positions", "expected a range \"a..b\" / \"a..b:step\" or an array of positions");
      for (const ParamValue& v : *r) {
        if (!std::holds_alternative<int64_t>(v)) t->fail("positions", "positions must be integers");
        c.positions.push_back(std::get<int64_t>(v));
      }
      c.text = text;
    } else {
      c.positions = t->int_list("positions");
      std::vector<std::string> parts;
      for (int64_t p : c.positions) parts.push_back(std::to_string(p));
      c.text = "[" + join(parts, ", ") + "]";
    }
    std::sort(c.positions.begin(), c.positions.end());
    c.positions.erase(std::unique(c.positions.begin(), c.positions.end()), c.positions.end());
    if (c.positions.empty()) t->fail("positions", "no calibration position given");
    if (c.positions.front() < 0) t->fail("positions", "positions must be >= 0");
    return c;
  }
  c.stride = t->integer("stride", c.stride);
  c.offset = t->integer("offset", c.offset);
  if (c.stride < 1) t->fail("stride", "must be >= 1");
  if (c.offset < 0) t->fail("offset", "must be >= 0");
  c.text = "stride " + std::to_string(c.stride) + " from " + std::to_string(c.offset);
  return c;
}

AttributionSpec parse_attribution(const std::optional<ConfigTable>& t) {
  AttributionSpec a;
  if (!t) return a;
  if (const toml::node* n = t->node("points")) {
    if (n->is_string()) {
      const std::string v = *n->value<std::string>();
      if (v == "all") a.select = AttributionSpec::Select::All;
      else if (v == "none") a.select = AttributionSpec::Select::None;
      else t->fail("points", "expected \"all\", \"none\" or an array of point ids, got \"" + v + "\"");
    } else {
      a.select = AttributionSpec::Select::Ids;
      a.ids = t->int_list("points");
      a.ids_where = t->where("points");
    }
  }
  a.regions = t->boolean("regions", a.regions);
  if (t->has("metrics")) {
    const std::vector<std::string> names = t->string_list("metrics", {});
    if (names.empty())
      t->fail("metrics", "an empty list attributes nothing; leave `metrics` out for the default "
                         "(attn_kl_mean, attn_out_rel_fro), or set points = \"none\"");
    for (size_t i = 0; i < names.size(); ++i) {
      const AdditiveError& e = require_additive_error(names[i], t->where("metrics"));
      if (std::find(a.errors.begin(), a.errors.end(), &e) != a.errors.end())
        t->fail("metrics", "'" + names[i] + "' is listed twice");
      a.errors.push_back(&e);
    }
  }
  return a;
}

MetricsSpec parse_metrics(const std::optional<ConfigTable>& t, const DataSpec& data) {
  MetricsSpec m;
  std::vector<std::string> all;
  for (const MetricDef& d : metric_table()) {
    if (d.level == MetricLevel::Model && data.source != DataSpec::Source::Model) continue;
    if (d.needs_task && !data.model.task) continue;
    if (!d.defined_for(data.model.continuations.count, data.model.continuations.tokens)) continue;
    if (!d.in_default_report) continue;  // named in metrics.report when wanted
    all.push_back(d.name);
  }
  const std::vector<std::string> default_pareto =
      data.source == DataSpec::Source::Model ? std::vector<std::string>{"ppl_ratio", "next_token_kl_mean"}
                                             : std::vector<std::string>{"attn_kl_mean", "attn_out_rel_err"};
  if (!t) {
    m.report = all;
    m.pareto = default_pareto;
    m.primary = m.pareto.front();
    return m;
  }
  m.report = t->string_list("report", all);
  if (t->node("report")) m.report_where = t->where("report");
  m.pareto = t->string_list("pareto", default_pareto);
  for (const std::string& name : m.report) check_metric_source(require_metric(name, t->where("report")), data, t->where("report"));
  for (const std::string& name : m.pareto) {
    check_metric_source(require_metric(name, t->where("pareto")), data, t->where("pareto"));
    if (std::find(m.report.begin(), m.report.end(), name) == m.report.end()) m.report.push_back(name);
  }
  m.primary = t->string("primary", m.pareto.empty() ? "" : m.pareto.front());
  if (t->has("primary")) {
    check_metric_source(require_metric(m.primary, t->where("primary")), data, t->where("primary"));
    if (std::find(m.report.begin(), m.report.end(), m.primary) == m.report.end()) m.report.push_back(m.primary);
  }
  // Report in table order.
  std::vector<std::string> ordered;
  for (const MetricDef& d : metric_table())
    if (std::find(m.report.begin(), m.report.end(), d.name) != m.report.end()) ordered.push_back(d.name);
  m.report = ordered;
  m.baseline = t->string("baseline", "");
  if (t->has("baseline")) m.baseline_where = t->where("baseline");
  m.topk = t->integer("topk", m.topk);
  if (m.topk < 1) t->fail("topk", "must be >= 1");
  if (t->has("topk")) m.topk_where = t->where("topk");
  if (const toml::node* n = t->node("positions")) {
    m.positions_where = t->where("positions");
    if (n->is_string()) {
      m.positions_text = *n->value<std::string>();
      m.every_position = m.positions_text == "all";
      if (!m.every_position) {
        auto r = parse_range_at(*t, "positions", m.positions_text);
        if (!r) t->fail("positions", "expected \"all\", a range \"a..b\" or an array of positions");
        if (r->empty())
          t->fail("positions", "range '" + m.positions_text + "' is empty (LO..HI:STEP needs LO <= HI and STEP > 0)");
        for (const ParamValue& v : *r) {
          if (!std::holds_alternative<int64_t>(v)) t->fail("positions", "positions must be integers");
          m.positions.push_back(std::get<int64_t>(v));
        }
      }
    } else {
      m.positions = t->int_list("positions");
      m.positions_text = "list";
      if (m.positions.empty()) t->fail("positions", "empty list of positions (write \"all\" for every position)");
    }
    std::sort(m.positions.begin(), m.positions.end());
    m.positions.erase(std::unique(m.positions.begin(), m.positions.end()), m.positions.end());
    if (!m.positions.empty() && m.positions.front() < 0) t->fail("positions", "positions must be >= 0");
  }
  return m;
}

// metrics.baseline must name one of the [[strategy]] blocks.
void check_baseline(const ExperimentSpec& e) {
  if (e.metrics.baseline.empty()) return;
  std::vector<std::string> labels;
  for (const StrategyBlock& b : e.strategies) labels.push_back(b.label);
  if (std::find(labels.begin(), labels.end(), e.metrics.baseline) == labels.end())
    throw ConfigError(e.metrics.baseline_where + ": '" + e.metrics.baseline + "' names no [[strategy]] block" +
                      did_you_mean(e.metrics.baseline, labels) + " (the names are the blocks' `name`)");
}

OutputSpec parse_output(const std::optional<ConfigTable>& t) {
  OutputSpec o;
  if (!t) return o;
  o.dir = t->string("dir", o.dir.string());
  if (t->has("dir")) o.dir_where = t->where("dir");
  if (o.dir.empty()) t->fail("dir", "must name a directory (\".\" for the working directory)");
  o.plots = t->boolean("plots", o.plots);
  o.target_context = t->integer("target_context", o.target_context);
  if (o.target_context < 1 || o.target_context > (int64_t{1} << 40))
    t->fail("target_context", "must be between 1 and 2^40 tokens");
  o.x = t->string("x", o.x);
  if (t->has("x")) o.x_where = t->where("x");
  const std::vector<std::string>& axes = memory_columns();
  if (std::find(axes.begin(), axes.end(), o.x) == axes.end()) {
    t->fail("x", "'" + o.x + "' is not a memory column" + did_you_mean(o.x, axes) +
                     "; one of " + join(axes, ", "));
  }
  o.series = t->string("series", "");
  o.marker = t->string("marker", "");
  if (!o.series.empty()) o.series_where = t->where("series");
  if (!o.marker.empty()) o.marker_where = t->where("marker");
  return o;
}

}  // namespace

const std::vector<std::string>& memory_columns() {
  static const std::vector<std::string> columns = {"bpe", "bpe_target", "bytes", "bytes_target", "bpe_read"};
  return columns;
}

namespace {

toml::table& subtable(toml::table& root, const char* name) {
  if (!root[name].is_table()) root.insert_or_assign(name, toml::table{});
  return *root[name].as_table();
}

}  // namespace

void record_run_options(ExperimentSpec& spec, const RunOptionsInConfig& o) {
  toml::table root = toml::parse(std::string_view(spec.resolved_toml));
  // The name defaults to the config file's stem, which is "config" for the saved copy.
  if (!root.contains("name")) root.insert("name", spec.name);
  if (o.threads > 0) root.insert_or_assign("threads", int64_t{o.threads});
  if (!o.backend.empty()) root.insert_or_assign("backend", o.backend);
  if (!o.precision.empty()) root.insert_or_assign("precision", o.precision);
  if (!o.out_dir.empty()) subtable(root, "output").insert_or_assign("dir", o.out_dir);
  if (o.no_plots) subtable(root, "output").insert_or_assign("plots", false);
  if (!o.budgets.empty()) {
    toml::table& budgets = subtable(root, "budgets");
    toml::array queries;  // the config's own first: a list, or one string
    if (const toml::array* a = budgets["queries"].as_array()) queries = *a;
    else if (const auto one = budgets["queries"].value<std::string>()) queries.push_back(*one);
    for (const std::string& q : o.budgets) queries.push_back(q);
    budgets.insert_or_assign("queries", std::move(queries));
  }
  std::ostringstream os;
  os << toml::toml_formatter(root);
  spec.resolved_toml = os.str();
}

ExperimentSpec parse_experiment(std::shared_ptr<ConfigDoc> doc, const std::filesystem::path& data_config) {
  ExperimentSpec e;
  ConfigTable root = doc->root();
  e.config_path = data_config.empty() ? doc->file() : data_config;
  e.name = root.string("name", doc->file().stem().string());
  static const std::regex safe_name(R"(^[A-Za-z0-9_.-]+$)");
  if (!std::regex_match(e.name, safe_name) || e.name == "." || e.name == "..")
    root.fail("name", "'" + e.name + "' is used as a directory name: letters, digits, '_', '-', '.' only (not '.' or '..')");
  e.description = root.string("description", "");
  const int64_t seed = root.integer("seed", 0);
  if (seed < 0) root.fail("seed", "must be >= 0");
  e.seed = static_cast<uint64_t>(seed);
  const int64_t threads = root.integer("threads", 0);
  if (threads < 0 || threads > kMaxThreads)
    root.fail("threads", "must be between 0 (all cores) and " + std::to_string(kMaxThreads));
  e.threads = static_cast<int>(threads);
  e.backend = parse_backend_request(root.string("backend", "cpu"), root.where("backend"));
  e.precision = parse_matmul_precision(root.string("precision", "fp32"), root.where("precision"));
  check_precision_backend(e.precision, e.backend, root.where("precision"));

  auto data = root.opt_table("data");
  if (!data) throw ConfigError(doc->file().string() + ": missing [data] table (a recording path or [data.synthetic])");
  e.data = parse_data(*data, e.config_path, e.seed);
  if (auto task = root.opt_table("task")) parse_task(*task, e.config_path, e.data);

  const std::vector<ConfigTable> blocks = root.table_array("strategy");
  if (blocks.empty())
    throw ConfigError(doc->file().string() + ": no [[strategy]] blocks: the sweep is empty");
  for (size_t i = 0; i < blocks.size(); ++i) e.strategies.push_back(parse_strategy(blocks[i], i));

  e.calibration = parse_calibration(root.opt_table("calibration"));
  e.metrics = parse_metrics(root.opt_table("metrics"), e.data);
  check_baseline(e);
  e.attribution = parse_attribution(root.opt_table("attribution"));
  e.output = parse_output(root.opt_table("output"));
  if (auto b = root.opt_table("budgets")) {
    for (const std::string& q : b->string_list("queries", {})) add_budget_query(e, q, b->where("queries"));
  }
  if (e.metrics.report.empty())
    throw ConfigError(e.metrics.report_where + ": empty (and no pareto metric or budget query adds "
                      "one): a point would measure nothing; name at least one metric (`kvbudget metrics` lists them)");
  doc->check_unknown_keys();

  std::ostringstream os;
  os << toml::toml_formatter(doc->table());
  e.resolved_toml = os.str();
  return e;
}

ExperimentSpec load_experiment(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  auto doc = ConfigDoc::load(file);
  for (const std::string& o : overrides) doc->apply_override(o);
  return parse_experiment(doc);
}

const std::vector<const AdditiveError*>& AttributionSpec::attributed_errors() const {
  return errors.empty() ? default_attributed_errors() : errors;
}

bool AttributionSpec::selects(size_t id) const {
  if (select == Select::All) return true;
  if (select == Select::None) return false;
  return std::find(ids.begin(), ids.end(), static_cast<int64_t>(id)) != ids.end();
}

}  // namespace kvb
