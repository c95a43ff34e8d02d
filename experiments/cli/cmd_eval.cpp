// `kvbudget eval MODEL_DIR --text FILE [--format F]`: perplexity of a checkpoint on a
// token sequence with an exact KV cache and, when a format or strategy is given, with
// the quantized cache beside it (every model-level metric of the metric table).
// Per-position logits and NLL can be written to .safetensors or .npy, to check the
// forward pass against another implementation. With --task, the task's problems are
// answered by greedy generation (exact cache, and the quantized one beside it):
// answer_accuracy and the flips against the exact cache.
#include <boost/program_options.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>

#include "experiments/cli/commands.h"
#include "experiments/cli/model_input.h"
#include "experiments/experiment.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/tensor_writer.h"
#include "sim/metrics/metric_table.h"
#include "sim/strategies/statistics.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/strategy.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// The parameter name of "name=value".
std::string assigned_name(const std::string& assignment) {
  return trim(assignment.substr(0, assignment.find('=')));
}

// "--param name=value" against a strategy's parameter table (per-kind variants
// included), defaults filled in, then a preset's values (when --strategy names a
// preset), then the assignments. As in a config block, an assigned base parameter X
// also overrides the preset's key_X / value_X. Lists of integers are written "2,3,4".
Params strategy_params(const StrategyType& type, const StrategyPreset* preset,
                       const std::vector<std::string>& assignments) {
  const std::vector<ParamDef> defs = type.all_params();
  std::map<std::string, ParamValue> values;
  for (const ParamDef& d : defs)
    if (d.default_value) values[d.name] = *d.default_value;
  std::set<std::string> assigned;
  for (const std::string& a : assignments)
    if (!assigned.insert(assigned_name(a)).second)
      throw ConfigError("--param " + assigned_name(a) + " is given twice");
  if (preset)
    for (const auto& [name, value] : preset->params)
      if (!preset_value_overridden(type, name, [&](const std::string& k) { return assigned.count(k) > 0; }))
        values[name] = value;
  std::vector<std::string> names;
  for (const ParamDef& d : defs) names.push_back(d.name);
  for (const std::string& a : assignments) {
    const size_t eq = a.find('=');
    if (eq == std::string::npos) throw ConfigError("--param '" + a + "': expected name=value");
    const std::string name = trim(a.substr(0, eq)), text = trim(a.substr(eq + 1));
    const auto def = std::find_if(defs.begin(), defs.end(), [&](const ParamDef& d) { return d.name == name; });
    if (def == defs.end()) {
      std::string msg = "--param '" + a + "': strategy '" + type.name + "' has no parameter '" + name + "'";
      msg += did_you_mean(name, names);
      throw ConfigError(msg + "; parameters: " + join(names, ", "));
    }
    auto whole_int = [](const std::string& t) {
      size_t used = 0;
      const int64_t v = std::stoll(t, &used);
      if (used != t.size()) throw std::invalid_argument(t);
      return v;
    };
    try {
      switch (def->type) {
        case ParamType::Bool:
          if (text != "true" && text != "false") throw std::invalid_argument(text);
          values[name] = text == "true";
          break;
        case ParamType::Int: values[name] = whole_int(text); break;
        case ParamType::Real: {
          size_t used = 0;
          const double v = std::stod(text, &used);
          if (used != text.size() || !std::isfinite(v)) throw std::invalid_argument(text);
          values[name] = v;
          break;
        }
        case ParamType::String: values[name] = text; break;
        case ParamType::IntList: {
          IntList list;
          for (const std::string& part : split(text, ',')) list.push_back(whole_int(trim(part)));
          values[name] = list;
          break;
        }
      }
    } catch (const std::exception&) {
      throw ConfigError("--param '" + a + "': expected a " + std::string(def->type == ParamType::Real ? "finite " : "") +
                        param_type_name(def->type) +
                        (def->type == ParamType::IntList ? " (e.g. 2,3,4)" : ""));
    }
  }
  for (const ParamDef& d : defs)
    if (!values.count(d.name) && !d.optional)
      throw ConfigError("strategy '" + type.name + "' needs --param " + d.name + "=...");
  return Params(values);
}

std::vector<float> as_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

}  // namespace

int cmd_eval(const Args& args) {
  po::options_description opts("kvbudget eval MODEL_DIR (--text FILE | --tokens FILE) [options]");
  ModelInput in;
  std::string format, key_format, value_format, strategy, out, nll_out;
  std::vector<std::string> params;
  int64_t seed_arg = 0;
  ContinuationSpec cont;
  AnswerTaskSpec task_spec;
  std::string task_file, answer_regex;
  int64_t answer_after = -1;
  opts.add_options()("help,h", "show this help")(
      "format", po::value(&format), "quantize keys and values with this format (e.g. int4-asym-g32)")(
      "key-format", po::value(&key_format), "format of keys (with --value-format)")(
      "value-format", po::value(&value_format), "format of values (with --key-format)")(
      "strategy", po::value(&strategy), "an allocation strategy or a preset (`kvbudget strategies`), with --param")(
      "param", po::value(&params)->composing(), "a strategy parameter: --param format=int4-asym-g32 (repeatable)")(
      "seed", po::value(&seed_arg)->default_value(0), "seed for seeded formats and strategies")(
      "continuations", po::value(&cont.count)->default_value(0), "greedy continuations to compare (token match, BLEU)")(
      "continuation-prompt", po::value(&cont.prompt)->default_value(64), "shortest continuation prompt, tokens")(
      "continuation-tokens", po::value(&cont.tokens)->default_value(20), "tokens generated per continuation")(
      "out,o", po::value(&out),
      ".safetensors: logits [T, vocab], nll [T-1], input_ids (and logits_exact, nll_exact when quantized); "
      ".npy: the logits")("nll", po::value(&nll_out), "write the per-position NLL [T-1] (nats) to this .npy")(
      "task", po::value(&task_file), "an answer task (.npz or .jsonl, configs/README.md [task]): answer_accuracy")(
      "answer-regex", po::value(&answer_regex), "with --task: the regex that finds the answer (group 1, else the match)")(
      "answer-after", po::value(&answer_after)->default_value(-1),
      "with --task: search the answer after this generated token id (e.g. </think>); -1 = in all generated text")(
      "max-new-tokens", po::value(&task_spec.max_new_tokens)->default_value(256), "with --task: tokens generated at most")(
      "max-problems", po::value(&task_spec.max_problems)->default_value(0), "with --task: the first N problems (0 = all)")(
      "problem-prefix", po::value(&task_spec.problem_prefix), "with --task: only problems whose name starts with this");
  in.add_options(opts);
  po::variables_map vm;
  check_assignments(args, "--param", "format=int4-asym-g32");
  if (!in.parse(args, opts, "eval", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nnll[t] is -log p(token t+1 | tokens 0..t) in nats for t = 0..T-2; PPL = exp(mean nll).\n"
                 "With --format, --key-format/--value-format or --strategy, the exact run is recorded first\n"
                 "(what strategies build their plan from) and the quantized run is compared with it.\n";
    return kExitOk;
  }
  const int quant_choices = (format.empty() ? 0 : 1) + (key_format.empty() && value_format.empty() ? 0 : 1) +
                            (strategy.empty() ? 0 : 1);
  if (quant_choices > 1) throw ConfigError("give one of --format, --key-format/--value-format and --strategy");
  const uint64_t seed = checked_seed(seed_arg, "--seed");
  if (key_format.empty() != value_format.empty()) throw ConfigError("--key-format and --value-format go together");
  if (!params.empty() && strategy.empty()) throw ConfigError("--param needs --strategy");
  if (cont.count < 0 || cont.prompt < 1 || cont.tokens < 1)
    throw ConfigError("--continuations must be >= 0, --continuation-prompt and --continuation-tokens >= 1");
  if (!out.empty() && std::filesystem::path(out).extension() != ".safetensors" &&
      std::filesystem::path(out).extension() != ".npy")
    throw ConfigError("--out " + out + ": expected a .safetensors or .npy file");
  if (!nll_out.empty() && std::filesystem::path(nll_out).extension() != ".npy")
    throw ConfigError("--nll " + nll_out + ": expected a .npy file");
  if (task_file.empty()) {
    for (const char* o : {"answer-regex", "answer-after", "max-new-tokens", "max-problems", "problem-prefix"})
      if (vm.count(o) && !vm[o].defaulted()) throw ConfigError(std::string("--") + o + " needs --task");
  } else if (answer_regex.empty()) {
    throw ConfigError("--task needs --answer-regex (the pattern that finds the answer in the generated text)");
  }
  if (!out.empty()) require_writable_output(out, "--out");
  if (!nll_out.empty()) require_writable_output(nll_out, "--nll");
  // The strategy is built before any work so that a bad name fails fast.
  std::unique_ptr<Strategy> strat;
  std::string plan_source;
  if (!format.empty()) {
    strategy = "uniform";
    params = {"format=" + format};
  } else if (!key_format.empty()) {
    strategy = "uniform";
    params = {"key_format=" + key_format, "value_format=" + value_format};
  }
  if (!strategy.empty()) {
    // --strategy names a type (`kvbudget strategies`) or a preset of one.
    const NamedStrategy named = resolve_strategy_name(strategy, "--strategy", "--format");
    const StrategyType& type = *named.type;
    const StrategyPreset* preset = named.preset;
    try {
      strat = type.make(strategy_params(type, preset, params));
    } catch (const ConfigError& e) {
      // A format option naming a preset: --format kivi-2 means --strategy kivi-2.
      std::string hint;
      for (const auto& [option, value] : {std::pair{"--format", format}, std::pair{"--key-format", key_format},
                                          std::pair{"--value-format", value_format}})
        if (hint.empty() && !value.empty()) hint = preset_not_format_hint(value, "give --strategy " + value);
      if (hint.empty()) throw;
      throw ConfigError(e.what() + hint);
    }
    plan_source = strategy + "(" + join(params, ",") + ")";
  }

  const std::shared_ptr<const Transformer> model = in.load_model();
  const ModelConfig& cfg = model->config();
  const std::vector<int64_t> tokens = in.load_tokens(cfg);
  std::printf("model: %s (%.1f MiB of weights in memory, 16-bit weights kept 16-bit)\n  %s\ntokens: %zu from %s\n", cfg.dir.string().c_str(),
              static_cast<double>(model->weights().bytes()) / (1024.0 * 1024.0), cfg.summary().c_str(), tokens.size(),
              in.token_origin().c_str());
  const std::string source = "model " + in.checkpoint + " on " + std::to_string(tokens.size()) + " tokens";
  std::shared_ptr<const AnswerTask> task;
  if (!task_file.empty()) {
    task_spec.file = task_file;
    task_spec.answer_regex = answer_regex;
    if (answer_after >= 0) task_spec.answer_after = answer_after;
    task_spec.tokenizer = in.tokenizer;
    if (in.bos) task_spec.add_bos = true;
    if (in.no_bos) task_spec.add_bos = false;
    try {
      task = std::make_shared<const AnswerTask>(task_spec, cfg);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--task: ") + e.what());
    }
    std::printf("task: %s\n", task->describe().c_str());
  }
  const ModelEvaluator evaluator(model, tokens, cont, source, task);
  const double exact_ppl = perplexity(evaluator.base_nll());
  std::printf("exact cache: PPL %.6g ± %.3g (mean NLL %.6g nats over %zu positions)\n", exact_ppl,
              exact_ppl * standard_error_of_mean(evaluator.base_nll()), std::log(exact_ppl),
              evaluator.base_nll().size());
  if (task) {
    int64_t right = 0;
    for (const AnswerTask::Run& r : evaluator.base_answers()) right += r.correct ? 1 : 0;
    const int64_t n = static_cast<int64_t>(evaluator.base_answers().size());
    const Interval ci = wilson_interval(right, n);
    std::printf("exact cache: answer accuracy %.4g (%lld of %lld problems; 95 %% Wilson interval %.3g..%.3g)\n",
                static_cast<double>(right) / static_cast<double>(n), static_cast<long long>(right),
                static_cast<long long>(n), ci.lo, ci.hi);
  }

  RowMatrix quant_logits;
  ErrorStats stats;
  if (strat) {
    // A strategy that reads statistics (entropies, received attention) measures them
    // on the default calibration positions of `kvbudget run` ([calibration]: every 8th
    // from 7); the model metrics then leave those positions out.
    const QueryPositions positions = resolve_positions(ExperimentSpec{}, static_cast<int64_t>(tokens.size()));
    RecordingStats calibration(evaluator.recording(), positions.calibration);
    const Plan plan = strat->build(StrategyInput{evaluator.recording(), seed, &calibration});
    const std::string bad = plan.check();
    if (!bad.empty()) throw Error(plan_source + ": invalid plan: " + bad);
    std::printf("plan: %s = %s, %.4f bits per element (%.4g bytes at %zu tokens)\n", plan_source.c_str(),
                plan.describe().c_str(), plan.bpe(), plan.bytes_at(plan.tokens()), tokens.size());
    const bool calibrated = strat->needs_statistics();
    stats.model = evaluator.evaluate(plan, seed, &quant_logits, calibrated ? &positions.evaluation : nullptr);
    std::printf("quantized cache%s:\n",
                calibrated ? " (positions not used for the strategy's calibration, every 8th from 7)" : "");
    for (const MetricDef& m : metric_table()) {
      if (m.level != MetricLevel::Model || !m.defined_for(cont.count, cont.tokens)) continue;
      if (m.needs_task && !task) continue;
      // ± the standard error where the metric has one (llama.cpp's perplexity tool), or
      // its interval.
      char se[48] = "";
      if (m.standard_error) std::snprintf(se, sizeof se, "± %.3g", m.standard_error(stats));
      if (m.interval) {
        const Interval ci = m.interval(stats);
        std::snprintf(se, sizeof se, "[%.3g, %.3g]", ci.lo, ci.hi);
      }
      std::printf("  %-22s %-12.6g %-12s %s\n", m.name.c_str(), m.compute(stats), se, m.description.c_str());
    }
  } else if (cont.count > 0) {
    std::printf("(continuations are compared only with a quantized cache: give --format or --strategy)\n");
  }

  // Files: the evaluated run (quantized when a plan is given), and the exact one.
  const RowMatrix& logits = strat ? quant_logits : evaluator.base_logits();
  const std::vector<float> nll = as_floats(strat ? next_token_nll(quant_logits, tokens) : evaluator.base_nll());
  const std::vector<float> nll_exact = as_floats(evaluator.base_nll());
  const int64_t T = static_cast<int64_t>(tokens.size()), V = cfg.vocab_size;
  if (!out.empty()) {
    std::vector<TensorToWrite> t = {TensorToWrite::of_floats("logits", {T, V}, logits.data()),
                                    TensorToWrite::of_floats("nll", {T - 1}, nll.data()),
                                    TensorToWrite::of_ints("input_ids", {T}, tokens.data(), DType::I32)};
    if (strat) {
      t.push_back(TensorToWrite::of_floats("logits_exact", {T, V}, evaluator.base_logits().data()));
      t.push_back(TensorToWrite::of_floats("nll_exact", {T - 1}, nll_exact.data()));
    }
    if (std::filesystem::path(out).extension() == ".npy") t.resize(1);
    write_tensors(out, t, {{"model", cfg.dir.string()}, {"plan", strat ? plan_source : "exact"}});
    std::printf("wrote %s\n", out.c_str());
  }
  if (!nll_out.empty()) {
    write_npy(nll_out, TensorToWrite::of_floats("nll", {T - 1}, nll.data()));
    std::printf("wrote %s\n", nll_out.c_str());
  }
  return kExitOk;
}

}  // namespace kvb::cli
