// Experiment configs (experiments/config.*, experiment.*): exact error locations,
// overrides, sweep expansion. Configs are parsed from strings; the data path points
// at the bundled recording (not loaded here).
#include "experiments/experiment.h"
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
  CHECK(err.find("test.toml:4: metrics.topk: expected an integer, got string") != std::string::npos);
  err = error_of(kData + "[metrics]\npareto = [\"attn_kl\"]\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("unknown metric 'attn_kl'") != std::string::npos);
  CHECK(err.find("test.toml:4") != std::string::npos);
  err = error_of(kData);
  CHECK(err.find("the sweep is empty") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = []\n");
  CHECK(err.find("empty array") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int{bits}-asym-g32\"\n");
  CHECK(err.find("'{bits}' is not declared") != std::string::npos);
  err = error_of(kData + "[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n[strategy.vars]\nb = [2]\n");
  CHECK(err.find("never used") != std::string::npos);
  err = error_of("[data]\npath = \"no/such/file.safetensors\"\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("not found") != std::string::npos);
  err = error_of("[data\npath = 3\n");
  CHECK(err.find("test.toml:1") != std::string::npos);
  CHECK(err.find("TOML syntax error") != std::string::npos);
  err = error_of(kData + "[budgets]\nqueries = [\"attn_kl_mean <= x\"]\n[[strategy]]\ntype = \"uniform\"\nformat = \"int4-asym-g32\"\n");
  CHECK(err.find("should look like") != std::string::npos);
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
