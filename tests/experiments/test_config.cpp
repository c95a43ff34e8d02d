// Experiment configs (experiments/config.*, experiment.*): exact error locations,
// overrides, sweep expansion. Configs are parsed from strings; the data path points
// at the bundled recording (not loaded here).
#include <sys/stat.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "experiments/attribution.h"
#include "experiments/data_building.h"
#include "experiments/experiment.h"
#include "experiments/query_positions.h"
#include "experiments/range_grammar.h"
#include "experiments/sweep.h"
#include "sim/core/error.h"
#include "test_util.h"

using namespace kvb;

namespace {

const std::string kData = "[data]\npath = \"" + (test::data_dir() / "records/gpt2-bytes-record.safetensors").string() + "\"\n";

ExperimentSpec parse(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto doc = ConfigDoc::parse(text, "test.toml");
  for (const std::string& s : sets) doc->apply_override(s);
  return parse_experiment(doc);
}

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    ExperimentSpec e = parse(text, sets);
    (void)expand_sweep(e);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a minimal config expands into the cartesian product of its axes") {
  const ExperimentSpec e = parse("name = \"t\"\nseed = 3\n" + kData +
                                 "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-{mode}-g{group}\"\n"
                                 "[strategy.vars]\nbits = \"2..4\"\nmode = [\"sym\", \"asym\"]\ngroup = [32, 64]\n");
  CHECK(e.name == "t");
  CHECK(e.seed == 3);
  const std::vector<SweepPoint> pts = expand_sweep(e);
  REQUIRE(pts.size() == 3u * 2u * 2u);
  CHECK(pts[0].key == "uniform(format=int2-sym-g32)");  // axes sorted by name, last fastest
  CHECK(pts[1].key == "uniform(format=int2-asym-g32)");
  CHECK(pts[2].key == "uniform(format=int2-sym-g64)");
  CHECK(pts.back().key == "uniform(format=int4-asym-g64)");
  CHECK(pts[5].coords == std::vector<std::pair<std::string, std::string>>{{"bits", "3"}, {"group", "32"}, {"mode", "asym"}});
  // Default metrics: every tensor and attention metric; two Pareto metrics.
  CHECK(e.metrics.report.size() >= 10);
  CHECK(e.metrics.pareto == std::vector<std::string>{"attn_kl_mean", "attn_out_rel_err"});
}

TEST_CASE("parameters can be axes directly; ranges accept steps and reals") {
  const ExperimentSpec e = parse(kData + "[[strategy]]\ntype = \"uniform\"\nkey_format = [\"int4-asym-g32\", \"int8-sym-tok\"]\n"
                                         "value_format = \"int2-asym-g32\"\n");
  CHECK(expand_sweep(e).size() == 2);
  const auto r = parse_range("2..8:2");
  REQUIRE(r);
  CHECK(r->size() == 4);
  CHECK(std::get<int64_t>(r->back()) == 8);
  const auto f = parse_range("0.1..0.5:0.1");
  REQUIRE(f);
  CHECK(f->size() == 5);
  CHECK(std::get<double>((*f)[2]) == 0.3);  // as written, not 0.1 + 2·0.1 = 0.30000000000000004
  const auto e3 = parse_range("1e-3..5e-3:1e-3");
  REQUIRE(e3);
  CHECK(std::get<double>((*e3)[2]) == 0.003);
  const auto across = parse_range("-0.3..0.3:0.1");  // crosses zero: exactly 0, not 5.6e-17
  REQUIRE(across);
  REQUIRE(across->size() == 7);
  CHECK(std::get<double>((*across)[3]) == 0.0);
  CHECK(!std::signbit(std::get<double>((*across)[3])));
  CHECK(std::get<double>(parse_range("0.12345678901234567..1")->front()) == 0.12345678901234567);  // as written
  const auto fine = parse_range("1..1.000000000000003:1e-15");  // tiny steps stay distinct
  REQUIRE(fine);
  REQUIRE(fine->size() == 4);
  CHECK(std::get<double>((*fine)[1]) > 1.0);
  CHECK(std::get<double>((*fine)[2]) > std::get<double>((*fine)[1]));
  CHECK(!parse_range("int4"));
}

TEST_CASE("a misspelled key is an error naming the file, the line and the likely key") {
  std::string err = error_of(kData + "\n[metrcs]\ntopk = 4\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("test.toml:4") != std::string::npos);
  CHECK(err.find("unknown key 'metrcs' (did you mean 'metrics'?)") != std::string::npos);
  err = error_of(kData + "max_tokns = 4\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("test.toml:3") != std::string::npos);
  CHECK(err.find("'data.max_tokns' (did you mean 'max_tokens'?)") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nfromat = \"int4-asym-g32\"\n");
  CHECK(err.find("test.toml:5") != std::string::npos);
  CHECK(err.find("did you mean 'format'") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"unifrom\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("did you mean 'uniform'") != std::string::npos);
}

TEST_CASE("bad values are errors with their location") {
  std::string err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int9-asym-g32\"\n");
  CHECK(err.find("bits must be 1..8") != std::string::npos);
  CHECK(err.find("uniform(format=int9-asym-g32)") != std::string::npos);
  err = error_of(kData + "[metrics]\ntopk = \"eight\"\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("test.toml:4: metrics.topk: expected an integer, got a string") != std::string::npos);
  err = error_of(kData + "[metrics]\npareto = [\"attn_kl\"]\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("unknown metric 'attn_kl'") != std::string::npos);
  CHECK(err.find("test.toml:4") != std::string::npos);
  err = error_of(kData);
  CHECK(err.find("the sweep is empty") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = []\n");
  CHECK(err.find("empty array") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-asym-g32\"\n");
  CHECK(err.find("'{bits}' is not declared") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n[strategy.vars]\nx = [2]\n");
  CHECK(err.find("never used") != std::string::npos);
  // {b} is the allocator's width: no variable may take its name.
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int{b}-asym-g32\"\n[strategy.vars]\nb = [2]\n");
  CHECK(err.find("{b} is reserved for the allocator's width") != std::string::npos);
  CHECK(err.find("test.toml:") != std::string::npos);
  err = error_of("[data]\npath = \"no/such/file.safetensors\"\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("not found") != std::string::npos);
  err = error_of("[data\npath = 3\n");
  CHECK(err.find("test.toml:1") != std::string::npos);
  CHECK(err.find("TOML syntax error") != std::string::npos);
  err = error_of(kData + "[budgets]\nqueries = [\"attn_kl_mean <= x\"]\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("should look like") != std::string::npos);
}

TEST_CASE("output.x: the memory axis, one of the memory columns, checked with its location") {
  const std::string text = kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(parse(text).output.x == "bpe");
  CHECK(parse(text + "[output]\nx = \"bytes_target\"\n").output.x == "bytes_target");
  CHECK(parse(text, {"output.x=bpe_target"}).output.x == "bpe_target");
  CHECK(parse(text, {"output.x=bpe_read"}).output.x == "bpe_read");
  CHECK(error_of(text + "[output]\nx = \"bpe_traget\"\n") ==
        "test.toml:7: output.x: 'bpe_traget' is not a memory column (did you mean 'bpe_target'?); one of bpe, "
        "bpe_target, bytes, bytes_target, bpe_read");
  CHECK(error_of(text, {"output.x=attn_kl_mean"}).find("--set output.x: 'attn_kl_mean' is not a memory column") == 0);
  CHECK(error_of(text + "[output]\nx = 4\n").find("test.toml:7: output.x: expected a string") == 0);
}

TEST_CASE("--set overrides any key, including inside [[strategy]] arrays") {
  const std::string text = kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  ExperimentSpec e = parse(text, {"seed=7", "data.max_tokens=64", "strategy.0.format=[\"q\", \"r\"]",
                                  "output.target_context=4096", "name=renamed"});
  CHECK(e.seed == 7);
  CHECK(e.data.max_tokens == 64);
  CHECK(e.output.target_context == 4096);
  CHECK(e.name == "renamed");
  REQUIRE(e.strategies.size() == 1);
  e = parse(text, {"strategy[0].format=int2-asym-g64"});  // bare word: a string
  CHECK(expand_sweep(e)[0].key == "uniform(format=int2-asym-g64)");
  CHECK(e.resolved_toml.find("int2-asym-g64") != std::string::npos);
  std::string err = error_of(text, {"data.max_tokns=3"});
  CHECK(err.find("--set data.max_tokns: unknown key") != std::string::npos);
  err = error_of(text, {"strategy.3.format=x"});
  CHECK(err.find("not an index") != std::string::npos);
  err = error_of(text, {"seed"});
  CHECK(err.find("expected key=value") != std::string::npos);
  err = error_of(text, {"seed=\"x\""});
  CHECK(err.find("--set seed: expected an integer") != std::string::npos);
  err = error_of(text, {"seed=99999999999999999999"});
  CHECK(err.find("--set seed: 99999999999999999999 is outside the 64-bit integer range") != std::string::npos);
  CHECK(parse(text, {"name=0123"}).name == "0123");  // not a TOML integer: a string
  // An element of an array.
  const std::string with_queries = text + "[budgets]\nqueries = [\"bpe <= 4\", \"bytes <= 1e6\"]\n";
  e = parse(with_queries, {"budgets.queries.1=bpe <= 3"});
  REQUIRE(e.budgets.size() == 2);
  CHECK(e.budgets[0].text == "bpe <= 4");
  CHECK(e.budgets[1].text == "bpe <= 3");
  CHECK(error_of(with_queries, {"budgets.queries.2=bpe <= 3"}).find("not an index of an array with 2 entries") !=
        std::string::npos);
}

TEST_CASE("an error about a table names the --set values inside it, not only the file's line") {
  const std::string text = kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-asym-g32\"\n"
                                   "[strategy.vars]\nbits = [2, 4]\n";
  // The format made from the overridden axis is refused for the whole point.
  const std::string err = error_of(text, {"strategy.0.vars.bits=[2, \"x\"]", "seed=3"});
  CHECK(err.find("test.toml:3: [strategy[0]] (with --set strategy[0].vars.bits): ") != std::string::npos);
  CHECK(err.find("unknown format 'intx-asym-g32'") != std::string::npos);
  // Without an override inside the table, the table's line alone.
  const std::string plain = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"intx-asym-g32\"\n", {"seed=3"});
  CHECK(plain.find("test.toml:3: [strategy[0]]: ") != std::string::npos);
  CHECK(plain.find("--set") == std::string::npos);
}

TEST_CASE("precision: fp32 by default; tf32 with a backend that may be cuda, at the config's line") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(parse(kData + strat).precision == MatmulPrecision::Fp32);
  CHECK(parse("backend = \"auto\"\nprecision = \"tf32\"\n" + kData + strat).precision == MatmulPrecision::Tf32);
  const std::string on_cpu = error_of("precision = \"tf32\"\n" + kData + strat);
  CHECK(on_cpu.find("test.toml:1") != std::string::npos);
  CHECK(on_cpu.find("backend = \"cpu\"") != std::string::npos);
  CHECK(error_of("backend = \"auto\"\nprecision = \"fp16\"\n" + kData + strat).find("got \"fp16\"") !=
        std::string::npos);
  // The run's options reach the saved config, so a resumed run or a shard keeps them.
  ExperimentSpec e = parse("backend = \"auto\"\n" + kData + strat);
  RunOptionsInConfig o;
  o.precision = "tf32";
  record_run_options(e, o);
  CHECK(parse(e.resolved_toml).precision == MatmulPrecision::Tf32);
}

TEST_CASE("backend: cpu by default; cpu, cuda or auto; cuda needs a CUDA build") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(parse(kData + strat).backend == BackendRequest::Cpu);
  CHECK(parse("backend = \"auto\"\n" + kData + strat).backend == BackendRequest::Auto);
  CHECK(parse(kData + strat, {"backend=cpu"}).backend == BackendRequest::Cpu);
  const std::string bad = error_of("backend = \"gpu\"\n" + kData + strat);
  CHECK(bad.find("test.toml:1") != std::string::npos);
  CHECK(bad.find("backend must be \"cpu\", \"cuda\" or \"auto\", got \"gpu\"") != std::string::npos);
  CHECK_THROWS_WITH_AS(parse_backend_request("tpu", "--backend"), doctest::Contains("--backend: backend must be"),
                       ConfigError);
  if (cuda_backend_built()) {
    CHECK(parse("backend = \"cuda\"\n" + kData + strat).backend == BackendRequest::Cuda);
  } else {
    CHECK(error_of("backend = \"cuda\"\n" + kData + strat).find("built without CUDA") != std::string::npos);
  }
}

TEST_CASE("calibration and evaluated positions are disjoint by default and recorded") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  ExperimentSpec e = parse(kData + strat);
  QueryPositions q = resolve_positions(e, 64);
  CHECK(q.calibration == std::vector<int64_t>{7, 15, 23, 31, 39, 47, 55, 63});  // every 8th from 7
  CHECK(q.evaluation.size() == 64 - 8);
  for (int64_t p : q.evaluation) CHECK(!std::binary_search(q.calibration.begin(), q.calibration.end(), p));
  CHECK(q.evaluation_text == "all not used for calibration");
  // The research variant: positions 32/64/96/127; positions past the recording are dropped.
  e = parse(kData + "[calibration]\npositions = [32, 64, 96, 127]\n" + strat);
  q = resolve_positions(e, 100);
  CHECK(q.calibration == std::vector<int64_t>{32, 64, 96});
  CHECK(q.evaluation.size() == 97);
  e = parse(kData + "[calibration]\npositions = \"10..20:5\"\n" + strat);
  CHECK(resolve_positions(e, 64).calibration == std::vector<int64_t>{10, 15, 20});
  e = parse(kData + "[calibration]\nstride = 16\noffset = 0\n" + strat);
  CHECK(resolve_positions(e, 64).calibration == std::vector<int64_t>{0, 16, 32, 48});
  // Explicit evaluated positions may not include calibration ones ...
  e = parse(kData + "[metrics]\npositions = \"0..20\"\n" + strat);
  CHECK_THROWS_WITH_AS(resolve_positions(e, 64),
                       doctest::Contains(":4: metrics.positions: overlaps the calibration positions (stride 8 from 7) at 7, 15"),
                       ConfigError);
  // ... unless the config says so (as the research did).
  e = parse(kData + "[calibration]\noverlap = true\n[metrics]\npositions = \"0..20\"\n" + strat);
  CHECK(resolve_positions(e, 64).evaluation.size() == 21);
  e = parse(kData + "[calibration]\noverlap = true\n" + strat);
  CHECK(resolve_positions(e, 64).evaluation.size() == 64);
  CHECK(error_of(kData + "[calibration]\npositions = [1]\nstride = 4\n" + strat).find("not both") != std::string::npos);
  CHECK(error_of(kData + "[calibration]\nstride = 0\n" + strat).find("calibration.stride: must be >= 1") !=
        std::string::npos);
}

TEST_CASE("a block's name labels its points with their axes' values; a block without one, its key") {
  const std::vector<SweepPoint> pts = expand_sweep(parse(
      kData + "[[strategy]]\nname = \"flat\"\ntype = \"uniform\"\nformat = \"int{bits}-asym-g{group}\"\n"
              "[strategy.vars]\nbits = [3, 4]\ngroup = [32, 64]\n"
              "[[strategy]]\nname = \"w4\"\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n"
              "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n"
              "[[strategy]]\npreset = \"kivi-2\"\n"));
  REQUIRE(pts.size() == 7);
  CHECK(pts[0].display_label == "flat(bits=3, group=32)");
  CHECK(pts[3].display_label == "flat(bits=4, group=64)");
  CHECK(pts[3].label == "flat");
  CHECK(pts[4].display_label == "w4");  // named, no axes: the name alone
  CHECK(pts[5].display_label == pts[5].key);
  CHECK(pts[5].key == "uniform(format=int4-asym-g32)");
  CHECK(pts[6].display_label == "kivi-2()");
}

TEST_CASE("presets, integer lists, per-kind parameters and {b} in strategy blocks") {
  ExperimentSpec e = parse(kData + "[[strategy]]\npreset = \"kivi-2\"\nwindow = [64, 128]\n");
  std::vector<SweepPoint> pts = expand_sweep(e);
  REQUIRE(pts.size() == 2);
  CHECK(pts[0].key == "kivi-2(window=64)");
  CHECK(pts[1].key == "kivi-2()");
  // A default-valued key that overrides the preset's key_/value_ variant is in the key;
  // a block's key overrides the preset's alternative to it (prompt over prompt_fraction).
  CHECK(expand_sweep(parse(kData + "[[strategy]]\npreset = \"kivi-2\"\nwindow_mode = \"sliding\"\n"))[0].key ==
        "kivi-2(window_mode=sliding)");
  const SweepPoint quanto = expand_sweep(parse(kData + "[[strategy]]\npreset = \"hf-quanto-int4\"\nprompt = 32\n"))[0];
  CHECK(quanto.params.integer("prompt") == 32);
  CHECK(quanto.params.real("prompt_fraction") == 0);  // the default, not the preset's 0.25
  CHECK(pts[0].label == "kivi-2");
  CHECK(pts[0].params.str("key_format") == "int2-asym-ch32");
  CHECK(pts[0].params.str("window_mode", Kind::Key) == "chunked");
  CHECK(pts[0].params.str("window_mode", Kind::Value) == "sliding");
  CHECK(error_of(kData + "[[strategy]]\npreset = \"kivi-3\"\n").find("unknown preset 'kivi-3'") != std::string::npos);
  CHECK(error_of(kData + "[[strategy]]\npreset = \"kivi-2\"\ntype = \"entropy\"\n").find("is a 'uniform' strategy") !=
        std::string::npos);
  CHECK(error_of(kData + "[[strategy]]\npreset = [\"kivi-2\", \"kivi-4\"]\n").find("one [[strategy]] block each") !=
        std::string::npos);
  // widths: one list, a range, or an axis of lists; {b} stays for the allocator.
  e = parse(kData +
            "[[strategy]]\ntype = \"entropy\"\nbudget_bpe = [3.5, 4]\nfamily = \"int{b}-{mode}-g32\"\n"
            "widths = [[2, 4, 8], [3, 4]]\nkey_alpha = 0.25\n[strategy.vars]\nmode = \"asym\"\n");
  pts = expand_sweep(e);
  REQUIRE(pts.size() == 4);
  CHECK(pts[0].params.str("family") == "int{b}-asym-g32");
  CHECK(pts[0].params.int_list("widths") == IntList{2, 4, 8});
  CHECK(pts[0].params.real("alpha", Kind::Key) == 0.25);
  CHECK(pts[0].params.real("alpha", Kind::Value) == 0.5);
  CHECK(pts[0].key == "entropy(key_alpha=0.25,budget_bpe=3.5,family=int{b}-asym-g32,widths=[2,4,8])");
  e = parse(kData + "[[strategy]]\ntype = \"uniform\"\nbudget_bpe = 4\nfamily = \"int{b}-asym-g32\"\nwidths = \"2..5\"\n");
  CHECK(expand_sweep(e)[0].params.int_list("widths") == IntList{2, 3, 4, 5});
  CHECK(error_of(kData + "[[strategy]]\ntype = \"uniform\"\nbudget_bpe = 4\nfamily = \"int{b}-asym-g32\"\nwidths = [2.5]\n")
            .find("expected integers") != std::string::npos);
  CHECK(error_of(kData + "[[strategy]]\ntype = \"uniform\"\nbudget_bpe = 4\nfamily = \"int4-asym-g32\"\n")
            .find("has no {b} placeholder") != std::string::npos);
  CHECK(error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\nkey_windw = 3\n")
            .find("unknown parameter 'key_windw' for strategy type 'uniform' (did you mean 'key_window'?)") !=
        std::string::npos);
}

TEST_CASE("[attribution] selects points") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(parse(kData + strat).attribution.selects(5));
  const ExperimentSpec none = parse(kData + "[attribution]\npoints = \"none\"\n" + strat);
  CHECK(!none.attribution.selects(0));
  const ExperimentSpec ids = parse(kData + "[attribution]\npoints = [1, 3]\nregions = false\n" + strat);
  CHECK(ids.attribution.selects(3));
  CHECK(!ids.attribution.selects(2));
  CHECK(!ids.attribution.regions);
  CHECK(error_of(kData + "[attribution]\npoints = \"some\"\n" + strat).find("expected \"all\", \"none\"") !=
        std::string::npos);
  // Ids are checked against the expanded sweep (here one point, id 0).
  CHECK_NOTHROW(expand_sweep(parse(kData + "[attribution]\npoints = [0]\n" + strat)));
  for (const char* bad : {"[-1]", "[1]"})
    CHECK_THROWS_WITH_AS(expand_sweep(parse(kData + "[attribution]\npoints = " + bad + "\n" + strat)),
                         doctest::Contains(":4: attribution.points: point id"), ConfigError);
}

TEST_CASE("attribution.metrics chooses the attributed errors among the additive metrics") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  // Left out: the default pair, attn_kl_mean's kl and attn_out_rel_fro's out_err2.
  CHECK(parse(kData + strat).attribution.errors.empty());
  CHECK(parse(kData + strat).attribution.attributed_errors() == default_attributed_errors());
  const ExperimentSpec chosen = parse(kData + "[attribution]\nmetrics = [\"logit_rmse\", \"attn_kl_mean\"]\n" + strat);
  REQUIRE(chosen.attribution.attributed_errors().size() == 2);
  CHECK(std::string(chosen.attribution.attributed_errors()[0]->name) == "logit_err2");  // in the order given
  CHECK(std::string(chosen.attribution.attributed_errors()[1]->name) == "kl");
  // An unknown metric gets the closest additive one; a metric that is no sum over rows
  // lists those that are; an empty list or a repeat is refused; each at its line.
  CHECK_THROWS_WITH_AS(parse(kData + "[attribution]\nmetrics = [\"attn_kl_maen\"]\n" + strat),
                       doctest::Contains(":4: attribution.metrics: 'attn_kl_maen' is not an additive attention metric "
                                         "(did you mean 'attn_kl_mean'?); additive metrics: "),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse(kData + "[attribution]\nmetrics = [\"attn_kl_p99\"]\n" + strat),
                       doctest::Contains("'attn_kl_p99' is not an additive attention metric; additive metrics: "),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse(kData + "[attribution]\nmetrics = []\n" + strat),
                       doctest::Contains(":4: attribution.metrics: an empty list attributes nothing"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(kData + "[attribution]\nmetrics = [\"attn_kl_mean\", \"attn_kl_mean\"]\n" + strat),
                       doctest::Contains("'attn_kl_mean' is listed twice"), ConfigError);
}

TEST_CASE("budget queries: their metric is validated up front and reported") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  // A metric left out of metrics.report is added to it, so every point measures it.
  ExperimentSpec e = parse(kData + "[metrics]\nreport = [\"attn_kl_mean\"]\npareto = [\"attn_kl_mean\"]\n"
                                   "[budgets]\nqueries = [\"topk_overlap >= 0.9\"]\n" + strat);
  CHECK(e.metrics.report == std::vector<std::string>{"attn_kl_mean", "topk_overlap"});
  // --budget goes through the same check.
  add_budget_query(e, "attn_out_rel_err <= 0.1", "--budget");
  CHECK(e.metrics.report.size() == 3);
  CHECK(std::count(e.metrics.report.begin(), e.metrics.report.end(), "attn_out_rel_err") == 1);
  CHECK(e.budgets.size() == 2);
  add_budget_query(e, "bpe <= 4", "--budget");  // memory budgets add no metric
  CHECK(e.metrics.report.size() == 3);
  // A model-level metric on a recording fails before any work.
  CHECK(error_of(kData + "[budgets]\nqueries = [\"ppl_ratio <= 1.1\"]\n" + strat).find("needs [data] source = \"model\"") !=
        std::string::npos);
  CHECK_THROWS_WITH_AS(add_budget_query(e, "ppl_ratio <= 1.1", "--budget"),
                       doctest::Contains("--budget: budget query 'ppl_ratio <= 1.1': 'ppl_ratio' is a model-level metric"),
                       ConfigError);
}

TEST_CASE("budget queries: strict < and > are rejected") {
  CHECK_THROWS_WITH_AS(parse_budget_query("attn_kl_mean < 1e-3", "cfg:3"), doctest::Contains("strict '<' is not supported"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_budget_query("topk_overlap > 0.9", "cfg:3"), doctest::Contains("write '>='"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_budget_query("bpe < 4", "cfg:3"), doctest::Contains("strict"), ConfigError);
  CHECK(parse_budget_query("attn_kl_mean <= 1e-3", "cfg:3").upper);
  CHECK_THROWS_WITH_AS(parse_budget_query("bytes <= 0", "cfg:3"), doctest::Contains("'bytes <= 0' must be > 0"),
                       ConfigError);
}

TEST_CASE("an empty metrics.report is an error") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(error_of(kData + "[metrics]\nreport = []\npareto = []\n" + strat).find("metrics.report: empty") !=
        std::string::npos);
  // A Pareto metric or a budget query fills it.
  CHECK(parse(kData + "[metrics]\nreport = []\npareto = [\"attn_kl_mean\"]\n" + strat).metrics.report.size() == 1);
  CHECK(parse(kData + "[metrics]\nreport = []\npareto = []\n[budgets]\nqueries = [\"attn_kl_mean <= 1\"]\n" + strat)
            .metrics.report.size() == 1);
}

TEST_CASE("a memory budget query needs a metric to minimise") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(error_of(kData + "[metrics]\nreport = [\"attn_kl_mean\"]\npareto = []\n[budgets]\nqueries = [\"bpe <= 4.5\"]\n" +
                 strat)
            .find("metrics.pareto is empty") != std::string::npos);
  CHECK(parse(kData + "[metrics]\npareto = [\"attn_kl_mean\"]\n[budgets]\nqueries = [\"bpe <= 4.5\"]\n" + strat)
            .budgets.size() == 1);
}

TEST_CASE("a block's base key overrides a preset's per-kind values") {
  // kivi-2 sets key_format and value_format; the block's `format` must win for both.
  ExperimentSpec e = parse(kData + "[[strategy]]\npreset = \"kivi-2\"\nformat = \"int4-asym-g32\"\n");
  std::vector<SweepPoint> pts = expand_sweep(e);
  REQUIRE(pts.size() == 1);
  CHECK(pts[0].params.str("format", Kind::Key) == "int4-asym-g32");
  CHECK(pts[0].params.str("format", Kind::Value) == "int4-asym-g32");
  CHECK(!pts[0].params.has("key_format"));
  // window_mode likewise; the preset's other values stay.
  e = parse(kData + "[[strategy]]\npreset = \"kivi-2\"\nwindow_mode = \"sliding\"\n");
  pts = expand_sweep(e);
  CHECK(pts[0].params.str("window_mode", Kind::Key) == "sliding");
  CHECK(pts[0].params.str("format", Kind::Key) == "int2-asym-ch32");
  // A block's per-kind key still overrides only its kind.
  e = parse(kData + "[[strategy]]\npreset = \"kivi-2\"\nvalue_format = \"int8-asym-g32\"\n");
  pts = expand_sweep(e);
  CHECK(pts[0].params.str("format", Kind::Key) == "int2-asym-ch32");
  CHECK(pts[0].params.str("format", Kind::Value) == "int8-asym-g32");
}

TEST_CASE("run_sweep: points without tasks are finished; a throwing callback is reported, not fatal") {
  const std::string text =
      "[data.synthetic]\nlayers = 1\nq_heads = 2\nkv_heads = 2\nhead_dim = 32\ntokens = 48\n"
      "[[strategy]]\ntype = \"uniform\"\nformat = [\"int4-asym-g32\", \"int8-asym-g32\"]\n";
  ExperimentSpec e = parse(text);
  const std::vector<SweepPoint> points = expand_sweep(e);
  const Recording rec = build_recording(e.data);
  // No metric and no attribution: nothing to measure, but every point is finished.
  ExperimentSpec empty = e;
  empty.metrics.report.clear();
  empty.attribution.select = AttributionSpec::Select::None;
  size_t called = 0;
  std::vector<PointResult> r =
      run_sweep(empty, rec, points, [&](const SweepPoint&, const PointResult&, size_t, size_t) { ++called; }, nullptr);
  CHECK(r.size() == 2);
  CHECK(called == 2);
  for (const PointResult& p : r) CHECK(p.ok);
  // A callback that throws (an I/O error writing points.csv, say): every point is
  // still measured and returned, and the failures are handed back.
  std::vector<std::string> errors;
  r = run_sweep(
      e, rec, points,
      [](const SweepPoint&, const PointResult&, size_t, size_t) { throw Error("points.csv: disk full"); }, nullptr,
      nullptr, nullptr, &errors);
  CHECK(r.size() == 2);
  for (const PointResult& p : r) CHECK(p.ok);
  REQUIRE(errors.size() == 2);
  CHECK(errors[0].find("points.csv: disk full") != std::string::npos);
  // Without somewhere to put them, the first failure is thrown after the sweep.
  CHECK_THROWS_WITH_AS(run_sweep(e, rec, points,
                                 [](const SweepPoint&, const PointResult&, size_t, size_t) { throw Error("disk full"); },
                                 nullptr),
                       doctest::Contains("disk full"), Error);
}

namespace {

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Every number two results of one point report, compared bit for bit.
void check_same_point(const PointResult& a, const PointResult& b) {
  INFO("point " << a.id << ": " << a.error << b.error);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  CHECK(a.id == b.id);
  CHECK(same_bits(a.metrics, b.metrics));
  CHECK(same_bits(a.standard_errors, b.standard_errors));
  REQUIRE(a.intervals.size() == b.intervals.size());
  for (size_t k = 0; k < a.intervals.size(); ++k) {
    CHECK(std::memcmp(&a.intervals[k].lo, &b.intervals[k].lo, sizeof(double)) == 0);
    CHECK(std::memcmp(&a.intervals[k].hi, &b.intervals[k].hi, sizeof(double)) == 0);
  }
  REQUIRE(a.block_sums.size() == b.block_sums.size());
  for (size_t k = 0; k < a.block_sums.size(); ++k) {
    CHECK(same_bits(a.block_sums[k].num, b.block_sums[k].num));
    CHECK(same_bits(a.block_sums[k].den, b.block_sums[k].den));
  }
  REQUIRE(a.attribution.has_value() == b.attribution.has_value());
  if (a.attribution) {
    CHECK(same_bits(a.attribution->total, b.attribution->total));
    REQUIRE(a.attribution->head.size() == b.attribution->head.size());
    for (size_t h = 0; h < a.attribution->head.size(); ++h) CHECK(same_bits(a.attribution->head[h], b.attribution->head[h]));
    REQUIRE(a.attribution->regions.size() == b.attribution->regions.size());
    for (size_t r = 0; r < a.attribution->regions.size(); ++r)
      CHECK(same_bits(a.attribution->regions[r].error, b.attribution->regions[r].error));
  }
}

}  // namespace

TEST_CASE("run_sweep: the same numbers on any thread count, with or without the exact pass's cache") {
  // One thread measures layer tasks, several measure a task per (layer, KV head),
  // merged per layer first; the cache of the exact pass is built when a layer is
  // measured more than once (two points; kivi-2's attribution regions), not for the
  // uniform point alone. None of it may change a number.
  const std::string text =
      "[data.synthetic]\nlayers = 2\nq_heads = 4\nkv_heads = 2\nhead_dim = 32\ntokens = 96\n"
      "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n"
      "[[strategy]]\npreset = \"kivi-2\"\n";
  ExperimentSpec spec = parse(text);
  const std::vector<SweepPoint> points = expand_sweep(spec);
  REQUIRE(points.size() == 2);
  const Recording rec = build_recording(spec.data);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<PointResult>> both, uniform_alone;
  for (int threads : {1, 3}) {
    spec.threads = threads;
    both.push_back(run_sweep(spec, rec, points, nullptr, nullptr));
    uniform_alone.push_back(run_sweep(spec, rec, {points[0]}, nullptr, nullptr));
  }
  omp_set_num_threads(saved);
  REQUIRE(both[0].size() == 2);
  REQUIRE(both[0][1].attribution.has_value());
  CHECK_FALSE(both[0][1].attribution->regions.empty());  // kivi-2's window: a region measured again
  for (size_t r = 0; r < 2; ++r) {
    REQUIRE(both[r].size() == 2);
    REQUIRE(uniform_alone[r].size() == 1);
    check_same_point(both[0][0], both[r][0]);
    check_same_point(both[0][1], both[r][1]);
    check_same_point(both[0][0], uniform_alone[r][0]);
  }
}

TEST_CASE("ranges: overflow and huge ranges are errors at their key, never hangs") {
  CHECK(parse_range("9223372036854775800..9223372036854775807:5")->size() == 2);  // no wrap-around
  CHECK_THROWS_WITH_AS(parse_range("99999999999999999999..1"), doctest::Contains("outside the 64-bit integer range"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse_range("1e400..2"), doctest::Contains("outside the double range"), ConfigError);
  CHECK_THROWS_WITH_AS(parse_range("2..8:1e-9"), doctest::Contains("more than 1000000"), ConfigError);
  CHECK(parse_range("5..2")->empty());
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  const std::string err = error_of(kData + "[metrics]\npositions = \"0..100000000000\"\n" + strat);
  CHECK(err.find("test.toml:") != std::string::npos);
  CHECK(err.find("metrics.positions: range '0..100000000000' has") != std::string::npos);
  // A malformed range is an error at its key, not a literal string for {bits}.
  const std::string sweep = "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-asym-g32\"\n[strategy.vars]\n";
  CHECK(error_of(kData + sweep + "bits = \"2..x\"\n").find("strategy[0].vars.bits: '2..x' is not a range") !=
        std::string::npos);
  CHECK(error_of(kData + sweep + "bits = \"8..2:-2\"\n").find("'8..2:-2' is not a range") != std::string::npos);
  // A bad axis order is an error at its key, before any data is read.
  CHECK(error_of(kData + "layout = \"heads,tokens\"\n" + sweep + "bits = [4]\n")
            .find("test.toml:3: data.layout: layout 'heads,tokens': needs the axes") != std::string::npos);
}

TEST_CASE("metrics.positions: empty ranges and lists are errors, not 'all'") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(error_of(kData + "[metrics]\npositions = \"10..5\"\n" + strat).find("is empty") != std::string::npos);
  CHECK(error_of(kData + "[metrics]\npositions = []\n" + strat).find("empty list of positions") != std::string::npos);
}

TEST_CASE("metrics.positions = \"all\" evaluates every position, the calibration ones included") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  QueryPositions q = resolve_positions(parse(kData + "[metrics]\npositions = \"all\"\n" + strat), 64);
  CHECK(q.calibration == std::vector<int64_t>{7, 15, 23, 31, 39, 47, 55, 63});
  REQUIRE(q.evaluation.size() == 64);
  CHECK(q.evaluation.front() == 0);
  CHECK(q.evaluation.back() == 63);
  CHECK(q.evaluation_text == "all, calibration positions included");
  // Without calibration positions below T, nothing is overlapped, and the rule says "all".
  q = resolve_positions(parse(kData + "[calibration]\npositions = [100]\n[metrics]\npositions = \"all\"\n" + strat), 64);
  CHECK(q.evaluation.size() == 64);
  CHECK(q.evaluation_text == "all");
  // Left out, the positions stay apart from the calibration ones.
  q = resolve_positions(parse(kData + strat), 64);
  CHECK(q.evaluation.size() == 56);
  CHECK(q.evaluation_text == "all not used for calibration");
}

TEST_CASE("attention distribution metrics that could only say 'exact' are errors: position 0 alone, topk >= every row's keys") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  auto topk_error = [](const ExperimentSpec& e, int64_t T) -> std::string {
    try {
      check_attention_rows(e, resolve_positions(e, T), T);
    } catch (const ConfigError& err) {
      return err.what();
    }
    return "";
  };
  ExperimentSpec e = parse(kData + "[metrics]\ntopk = 601\n" + strat);
  CHECK(topk_error(e, 601).find("test.toml:4: metrics.topk = 601, but the context has 601 tokens: the top 601 keys of "
                                "every evaluated query are all its keys, so topk_overlap would be 1") == 0);
  CHECK(topk_error(e, 602).empty());  // the last query has 602 keys: its top 601 are a choice
  // The default topk (8) against a short context, named without a line.
  CHECK(topk_error(parse(kData + strat), 7).find("metrics.topk = 8, but the context has 7 tokens") == 0);
  // Evaluated positions that stop early bound the keys too.
  e = parse(kData + "[calibration]\noverlap = true\n[metrics]\npositions = \"0..5\"\n" + strat);
  CHECK(topk_error(e, 64).find("the last evaluated position 5 of the 64-token context sees 6 keys") != std::string::npos);
  // Without topk_overlap in the report, topk measures nothing and is not checked.
  CHECK(topk_error(parse(kData + "[metrics]\ntopk = 600\nreport = [\"attn_kl_mean\"]\n" + strat), 512).empty());
  // Position 0 alone (a stride from 0 on a 2-token context, or calibration taking
  // position 1): its query sees one key, KL is 0 and the overlap 1.
  e = parse(kData + "[metrics]\npositions = \"0..3969:16\"\n" + strat);
  CHECK(topk_error(e, 2).find("test.toml:4: metrics.positions: the evaluated positions (0..3969:16) of the 2-token "
                              "context are position 0 alone, whose query sees one key: attn_kl_mean would be 0") == 0);
  CHECK(topk_error(e, 17).empty());  // position 16 too
  e = parse(kData + "[calibration]\npositions = [1]\n" + strat);
  CHECK(topk_error(e, 2).find("metrics.positions: the evaluated positions (all not used for calibration) of the "
                              "2-token context are position 0 alone") == 0);
  // Logit, output and tensor metrics measure position 0 (the value and the key it reads).
  e = parse(kData + "[metrics]\npositions = [0]\nreport = [\"attn_out_rel_err\", \"logit_rmse\", \"k_rel_mse\"]\n"
                    "pareto = [\"attn_out_rel_err\"]\n" + strat);
  CHECK(topk_error(e, 64).empty());
  // One token is refused where it is asked for.
  CHECK(error_of(kData + "max_tokens = 1\n" + strat).find("test.toml:3: data.max_tokens: 1 keeps a single token") == 0);
  CHECK(error_of(kData + "max_tokens = 2\n" + strat).empty());
}

TEST_CASE("a config that is a FIFO or a device is a config error, not a hang") {
  const std::filesystem::path dir = test::scratch_dir("config_fifo");
  REQUIRE(::mkfifo((dir / "c.toml").c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(ConfigDoc::load(dir / "c.toml"),
                       doctest::Contains("c.toml: is a FIFO (named pipe), not a regular file; a config must be a regular file"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(ConfigDoc::load("/dev/null"), doctest::Contains("/dev/null: is a character device"), ConfigError);
}

TEST_CASE("sweeps larger than kMaxSweepPoints are refused before expanding") {
  const std::string err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n"
                                           "window = \"0..9999\"\nsink_tokens = \"0..999\"\n");
  CHECK(err.find("the sweep has 1e+07 points, more than 200000") != std::string::npos);
  CHECK(err.find("(sink_tokens 1000 x window 10000)") != std::string::npos);
}

TEST_CASE("non-finite reals, malformed budget numbers and unsafe names are refused") {
  const std::string strat = "[[strategy]]\ntype = \"entropy\"\nfamily = \"int{b}-asym-g32\"\nmean_bits = 4\n";
  CHECK(error_of(kData + strat + "alpha = nan\n").find("strategy[0].alpha: expected a finite number") !=
        std::string::npos);
  CHECK(error_of(kData + strat + "alpha = inf\n").find("expected a finite number") != std::string::npos);
  CHECK_THROWS_WITH_AS(parse_budget_query("attn_kl_mean <= 1..2", "cli"), doctest::Contains("is not a finite number"),
                       ConfigError);
  CHECK(error_of("name = \"..\"\n" + kData + strat).find("not '.' or '..'") != std::string::npos);
  // A strategy block's empty name would leave its points' labels blank.
  CHECK(error_of(kData + strat + "name = \" \"\n").find("strategy[0].name: an empty name") != std::string::npos);
}

TEST_CASE("synthetic specs are validated at parse time, located at their key") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  const std::string gqa = error_of("[data.synthetic]\nlayers = 1\nq_heads = 3\nkv_heads = 2\nhead_dim = 8\ntokens = 48\n" + strat);
  CHECK(gqa.find("test.toml:3") != std::string::npos);
  CHECK(gqa.find("data.synthetic.q_heads: 3 is not a multiple of kv_heads = 2") != std::string::npos);
  const std::string huge =
      error_of("[data.synthetic]\nlayers = 1000\nq_heads = 64\nkv_heads = 8\nhead_dim = 128\ntokens = 10000000\n" + strat);
  CHECK(huge.find("data.synthetic.tokens") != std::string::npos);
  CHECK(huge.find("do not fit in this machine's") != std::string::npos);
}

TEST_CASE("run's options are recorded in the resolved config, which parses back to the same experiment") {
  ExperimentSpec e = parse(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n"
                                   "[budgets]\nqueries = \"bpe <= 4\"\n");
  CHECK(e.name == "test");  // the file's stem
  record_run_options(e, RunOptionsInConfig{3, "/tmp/elsewhere", "auto", true, {"attn_kl_mean <= 1e-3"}, ""});
  const ExperimentSpec again = parse(e.resolved_toml);
  CHECK(again.name == "test");  // kept, though the saved copy is named config.toml
  CHECK(again.threads == 3);
  CHECK(again.backend == BackendRequest::Auto);
  CHECK(again.output.dir == "/tmp/elsewhere");
  CHECK(!again.output.plots);
  REQUIRE(again.budgets.size() == 2);  // the config's single query kept, then --budget's
  CHECK(again.budgets[0].text == "bpe <= 4");
  CHECK(again.budgets[1].text == "attn_kl_mean <= 1e-3");
  CHECK(again.strategies.size() == 1);
}

TEST_CASE("synthetic data: kv_heads defaults to q_heads") {
  const std::string strat = "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n";
  CHECK(parse("[data.synthetic]\nq_heads = 4\n" + strat).data.synthetic.kv_heads == 4);
  CHECK(parse("[data.synthetic]\nq_heads = 4\nkv_heads = 2\n" + strat).data.synthetic.kv_heads == 2);
  CHECK(parse("[data.synthetic]\nlayers = 1\n" + strat).data.synthetic.kv_heads == 8);  // q_heads' default
}
