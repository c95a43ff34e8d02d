// `kvbudget bounds`: the §5 bounds report (experiments/bounds.h): every bound or
// prediction next to a measurement, and whether it holds.
#include <omp.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "sim/io/atomic_file.h"
#include "experiments/bounds.h"
#include "experiments/cli/commands.h"
#include "experiments/config.h"
#include "experiments/data_spec.h"
#include "experiments/experiment.h"
#include "experiments/output_paths.h"
#include "experiments/report.h"
#include "kvb/git_info.h"
#include "sim/core/error.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// "--out DIR: cannot create PATH: why", for a run folder that cannot be made under --out.
ConfigError out_dir_error(const std::string& out_dir, const std::filesystem::filesystem_error& e) {
  return ConfigError("--out " + out_dir + ": cannot create " + e.path1().string() + ": " + e.code().message());
}

// --data's config. The report reads its [data] alone, so a config of [data] (with seed,
// data.synthetic.seed's default, and name or description if wanted) is enough, and any
// other key of it is unknown; a config with [[strategy]] blocks is an experiment
// config, loaded and checked whole as `kvbudget run` loads it. Throws ConfigError with
// file:line locations.
DataSpec load_data_config(const std::string& file) {
  std::shared_ptr<ConfigDoc> doc = ConfigDoc::load(file);
  if (doc->table().contains("strategy")) return load_experiment(file, {}).data;
  ConfigTable root = doc->root();
  root.string("name", "");
  root.string("description", "");
  const int64_t seed = root.integer("seed", 0);
  if (seed < 0) root.fail("seed", "must be >= 0");
  const std::optional<ConfigTable> data = root.opt_table("data");
  if (!data) throw ConfigError(file + ": missing [data] table (a recording path or [data.synthetic])");
  DataSpec spec = parse_data(*data, doc->file(), static_cast<uint64_t>(seed));
  doc->check_unknown_keys();
  return spec;
}

}  // namespace

int cmd_bounds(const Args& args) {
  po::options_description opts("kvbudget bounds [options]");
  BoundsOptions b;
  std::string out_dir = "results", data_config;
  int threads = 0;
  int64_t seed = 0;
  opts.add_options()("help,h", "show this help")("out", po::value(&out_dir),
                                                 "results base directory: writes OUT/bounds/<timestamp>/ (default results/)")(
      "seed", po::value(&seed), "seed of the synthetic data and samples (default 0)")(
      "samples", po::value(&b.samples),
      "Gaussian samples per sampled MSE (default 1048576; at least 160: 5 rows of 32 for an interval)")(
      "data", po::value(&data_config),
      "a config whose [data] recording replaces the GPT-2-like synthetic one for the first-order and entropy-rule "
      "rows: [data] alone (and seed), or an experiment config, checked whole (its [calibration] is not read: the "
      "entropy rule calibrates on every 8th position from 7; "
      "a recording of 7 tokens or fewer, or of a head_dim their g32 formats cannot store, leaves those rows not "
      "tested; a sliding-window model's recording past its window is refused)")("threads", po::value(&threads), "OpenMP threads (default all cores)")(
      "quick", "smaller recordings and coarser grids (for tests)")(
      "json", "print the report as one JSON object (README \"Command line conventions\")");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return option_error("bounds", e);
  }
  if (vm.count("help")) {
    std::cout << opts << "\nWrites results/bounds/<timestamp>/: bounds.csv, bounds.md, manifest.json.\n";
    return kExitOk;
  }
  if (vm.count("samples") && b.samples < kBoundsMinSamples) {
    std::cerr << "kvbudget bounds: --samples must be >= " << kBoundsMinSamples << ", got " << b.samples
              << " (the int formats' MSE on Gaussian samples is measured over rows of 32, and its 95 % interval "
                 "needs at least "
              << kMinIntervalUnits << " of them)\n";
    return kExitUsage;
  }
  b.seed = checked_seed(seed, "--seed");
  b.quick = vm.count("quick") != 0;
  if (b.quick && !vm.count("samples")) b.samples = 1 << 16;
  if (!data_config.empty()) {
    b.data = load_data_config(data_config);
    if (b.data->sequence_count() > 1)
      throw ConfigError(b.data->sequences_where + ": --data takes one recording, but " + data_config + " names " +
                        std::to_string(b.data->sequence_count()) + " sequences; give a config with one");
  }
  check_threads(threads, "--threads");
  if (threads > 0) omp_set_num_threads(threads);
  // An --out where no run folder can be made fails now, not after the report's minutes of
  // computing (nothing is created yet).
  require_writable_dir(std::filesystem::path(out_dir) / "bounds", "--out");

  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<BoundRow> rows = bounds_report(b);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::path dir;
  try {
    dir = make_run_dir(out_dir, "bounds");
  } catch (const std::filesystem::filesystem_error& e) {
    throw out_dir_error(out_dir, e);
  }
  write_file_atomic(dir / "bounds.csv", bounds_csv(rows));
  const std::string md = bounds_markdown(rows);
  write_file_atomic(dir / "bounds.md", "# Bounds report (methods.md §5)\n\n" + md);
  nlohmann::json j;
  j["command"] = "kvbudget bounds";
  j["seed"] = b.seed;
  j["samples"] = b.samples;
  j["quick"] = b.quick;
  j["data"] = data_config.empty() ? "synthetic (built in)" : data_config;
  j["git_commit"] = KVB_GIT_COMMIT;
  j["wall_seconds"] = secs;
  size_t held = 0, violated = 0, uncertain = 0, untested = 0;
  for (const BoundRow& r : rows) {
    held += r.verdict == "holds" ? 1 : 0;
    violated += r.verdict == "violated" ? 1 : 0;
    uncertain += r.verdict == "within uncertainty" ? 1 : 0;
    untested += r.verdict == "not tested" ? 1 : 0;
  }
  j["rows"] = rows.size();
  j["rows_holding"] = held;
  j["rows_violated"] = violated;
  j["rows_within_uncertainty"] = uncertain;
  j["rows_not_tested"] = untested;
  j["verdicts"] = "holds / violated only when the 95 % interval of the tested quantity lies wholly inside / outside "
                  "what the criterion accepts, else within uncertainty (also a sampled row without an interval); "
                  "exact rows are computed, not sampled; not tested: the recording cannot give the measurement";
  write_file_atomic(dir / "manifest.json", j.dump(2) + "\n");
  if (vm.count("json")) {
    nlohmann::ordered_json out_rows = nlohmann::ordered_json::array();
    for (const BoundRow& r : rows)
      out_rows.push_back({{"section", r.section},
                          {"name", r.name},
                          {"claim", r.claim},
                          {"predicted", std::isfinite(r.predicted) ? nlohmann::ordered_json(r.predicted) : nullptr},
                          {"measured", std::isfinite(r.measured) ? nlohmann::ordered_json(r.measured) : nullptr},
                          {"holds", r.holds},
                          {"verdict", r.verdict},
                          {"interval", std::isnan(r.interval.lo)
                                           ? nlohmann::ordered_json(nullptr)
                                           : nlohmann::ordered_json::array({r.interval.lo, r.interval.hi})},
                          {"interval_of", r.interval_of},
                          {"criterion", r.criterion},
                          {"note", r.note}});
    const nlohmann::ordered_json summary = {{"command", "bounds"},     {"dir", dir.string()},
                                            {"rows_total", rows.size()}, {"rows_holding", held},
                                            {"rows_violated", violated},
                                            {"rows_within_uncertainty", uncertain},
                                            {"rows_not_tested", untested},
                                            {"wall_seconds", secs},      {"rows", out_rows}};
    std::printf("%s\n", summary.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s\n%zu of %zu rows hold, %zu violated, %zu within uncertainty%s; written to %s (%.1f s)\n",
              md.c_str(), held, rows.size(), violated, uncertain,
              untested ? (", " + std::to_string(untested) + " not tested").c_str() : "", dir.string().c_str(), secs);
  return kExitOk;
}

}  // namespace kvb::cli
