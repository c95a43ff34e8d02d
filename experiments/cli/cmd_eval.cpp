// `kvbudget eval MODEL_DIR --text FILE [--format F]`: perplexity of a checkpoint on a
// token sequence with an exact KV cache and, when a format or strategy is given, with
// the quantized cache beside it (every model-level metric of the metric table).
// Per-position logits and NLL can be written to .safetensors or .npy, to check the
// forward pass against another implementation. With --task, the task's problems are
// answered by greedy generation (exact cache, and the quantized one beside it):
// answer_accuracy and the flips against the exact cache.
#include <boost/program_options.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "experiments/cli/commands.h"
#include "experiments/cli/interrupt.h"
#include "experiments/cli/model_input.h"
#include "experiments/cli/plan_options.h"
#include "experiments/experiment.h"
#include "experiments/model_backend.h"
#include "experiments/progress.h"
#include "experiments/query_positions.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/io/tensor_writer.h"
#include "sim/metrics/metric_table.h"
#include "sim/model/layer_selection.h"
#include "sim/strategies/statistics.h"
#include "sim/strategies/presets.h"
#include "sim/strategies/strategy.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

std::vector<float> as_floats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// printf to stdout unless `quiet` (--json keeps stdout for the JSON document).
void say(bool quiet, const char* format, ...) {
  if (quiet) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
}

// The statistics of llama.cpp's perplexity/KL-divergence report, in its order: a
// label, the metric (metric table) behind it, and whether it is printed in percent.
struct ReportLine {
  const char* label;
  const char* metric;
  bool percent;
};
const ReportLine kPerplexityLines[] = {
    {"Mean PPL(Q)                   ", "ppl", false},
    {"Mean PPL(base)                ", "ppl_base", false},
    {"Cor(ln(PPL(Q)), ln(PPL(base)))", "ln_ppl_correlation", true},
    {"Mean ln(PPL(Q)/PPL(base))     ", "ln_ppl_ratio", false},
    {"Mean PPL(Q)/PPL(base)         ", "ppl_ratio", false},
    {"Mean PPL(Q)-PPL(base)         ", "ppl_diff", false},
};
const ReportLine kKlLines[] = {
    {"Mean    KLD", "next_token_kl_mean", false}, {"Maximum KLD", "next_token_kl_max", false},
    {"99.9%   KLD", "next_token_kl_p99_9", false}, {"99.0%   KLD", "next_token_kl_p99", false},
    {"95.0%   KLD", "next_token_kl_p95", false},  {"90.0%   KLD", "next_token_kl_p90", false},
    {"Median  KLD", "next_token_kl_median", false}, {"10.0%   KLD", "next_token_kl_p10", false},
    {" 5.0%   KLD", "next_token_kl_p5", false},   {" 1.0%   KLD", "next_token_kl_p1", false},
    {" 0.1%   KLD", "next_token_kl_p0_1", false}, {"Minimum KLD", "next_token_kl_min", false},
};
const ReportLine kDeltaPLines[] = {
    {"Mean    Δp", "delta_p_mean", true},  {"Maximum Δp", "delta_p_max", true}, {"99.9%   Δp", "delta_p_p99_9", true},
    {"99.0%   Δp", "delta_p_p99", true},   {"95.0%   Δp", "delta_p_p95", true}, {"90.0%   Δp", "delta_p_p90", true},
    {"75.0%   Δp", "delta_p_p75", true},   {"Median  Δp", "delta_p_median", true}, {"25.0%   Δp", "delta_p_p25", true},
    {"10.0%   Δp", "delta_p_p10", true},   {" 5.0%   Δp", "delta_p_p5", true}, {" 1.0%   Δp", "delta_p_p1", true},
    {" 0.1%   Δp", "delta_p_p0_1", true},  {"Minimum Δp", "delta_p_min", true}, {"RMS Δp    ", "delta_p_rms", true},
    {"Same top p", "same_top_rate", true},
};

void print_report_lines(const char* title, const ReportLine* begin, const ReportLine* end, const ErrorStats& stats) {
  std::printf("====== %s ======\n", title);
  for (const ReportLine* l = begin; l != end; ++l) {
    const MetricDef& m = require_metric(l->metric, "eval report");
    const double scale = l->percent ? 100.0 : 1.0;
    std::printf("%s: %10.6f", l->label, scale * m.compute(stats));
    if (m.standard_error) std::printf(" ± %10.6f", scale * m.standard_error(stats));
    std::printf("%s\n", l->percent ? " %" : "");
  }
}

// On stderr, when some compared positions had non-finite logits with the quantized cache
// (NaN nll: a NaN or +inf logit): the statistics they enter are NaN (null in --json).
void warn_nonfinite_positions(const ModelStats& m) {
  const auto bad = std::count_if(m.nll.begin(), m.nll.end(), [](double v) { return std::isnan(v); });
  if (bad == 0) return;
  std::fprintf(stderr,
               "kvbudget eval: warning: %lld of %zu compared positions have non-finite logits (NaN or +inf) with the "
               "quantized cache: PPL, KL and Δp over them are NaN (null in --json), and they count as a different "
               "top token\n",
               static_cast<long long>(bad), m.nll.size());
}

// A JSON number, null when not finite.
nlohmann::json json_number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// Throws kvb::ConfigError when two of the output files (option name, path; empty paths
// skipped) are one file: the one written last would replace the other (--out over a
// --kl-base it was read from, say). Paths are compared resolved (symbolic links, "..").
void refuse_shared_output_files(const std::vector<std::pair<const char*, std::string>>& outputs) {
  namespace fs = std::filesystem;
  // The path with symbolic links and ".." resolved as far as it exists; lexically past that.
  const auto resolved = [](const std::string& path) {
    std::error_code error;
    const fs::path p = fs::weakly_canonical(path, error);
    return error ? fs::absolute(path).lexically_normal() : p;
  };
  for (size_t i = 0; i < outputs.size(); ++i)
    for (size_t j = i + 1; j < outputs.size(); ++j) {
      const std::string &a = outputs[i].second, &b = outputs[j].second;
      if (a.empty() || b.empty()) continue;
      std::error_code error;  // equivalent(): false when either is absent (hard links of one file: true)
      if (resolved(a) == resolved(b) || fs::equivalent(a, b, error))
        throw ConfigError(std::string(outputs[i].first) + " " + a + " and " + outputs[j].first + " " + b +
                          " are the same file: the one written last would replace the other; give another path");
    }
}

// Throws kvb::ConfigError when a window is longer than a GPT-2 model's learned position
// table (the forward pass could not run it), with the --ctx that fits.
void check_windows_fit_positions(const ModelConfig& cfg, const std::vector<TokenWindow>& windows) {
  if (cfg.family != ModelFamily::Gpt2) return;
  int64_t longest = 0;
  for (const TokenWindow& w : windows) longest = std::max(longest, w.length);
  if (longest <= cfg.max_positions) return;
  throw ConfigError(cfg.dir.string() + ": a window of " + std::to_string(longest) +
                    " tokens exceeds the learned position table (n_positions " + std::to_string(cfg.max_positions) +
                    " in config.json); evaluate in windows of at most " + std::to_string(cfg.max_positions) +
                    " tokens: --ctx " + std::to_string(cfg.max_positions));
}

// [positions] values of an I32 tensor: 1 at the sequence positions in `compared` (ascending), 0 elsewhere.
std::vector<int64_t> position_mask(int64_t positions, const std::vector<int64_t>& compared) {
  std::vector<int64_t> mask(static_cast<size_t>(positions), 0);
  for (int64_t t : compared) mask[static_cast<size_t>(t)] = 1;
  return mask;
}

}  // namespace

int cmd_eval(const Args& args) {
  po::options_description opts("kvbudget eval MODEL_DIR (--text FILE | --tokens FILE) [options]");
  ModelInput in;
  PlanOptions plan_options;
  // Quantize only these layers (hybrids: full or sliding ones); the others at other_layers_format.
  std::string layers_text, other_layers_format = kDefaultKeptLayerFormat;
  std::string out, nll_out;
  int64_t seed_arg = 0;
  ContinuationSpec cont;
  AnswerTaskSpec task_spec;
  std::string task_file, answer_regex;
  int64_t answer_after = -1;
  // Chunked evaluation, the exact run's logits kept, and a JSON report (issue 21 item 3).
  int64_t n_ctx = 512;
  std::string score_text = "all", kl_base;
  // The exact logits held in memory up to this many MiB, else in a file (issue 21).
  double base_memory_mib = static_cast<double>(kDefaultHeldBaseLogitsBytes) / (1024.0 * 1024.0);
  bool json = false;
  std::string backend_text = "cpu", precision_text = "fp32";
  opts.add_options()("help,h", "show this help");
  plan_options.add_options(opts);
  opts.add_options()(
      "layers", po::value(&layers_text),
      "quantize only these layers with the plan: all, full (full-attention layers), sliding (sliding-window "
      "layers) or indices such as 0,2,5-7; the others are stored at --other-layers-format")(
      "other-layers-format", po::value(&other_layers_format)->default_value(kDefaultKeptLayerFormat),
      "with --layers: the format of the layers left out (keep-fp16: the model's half-precision cache; keep-fp32: "
      "exact, counted at 32 bits)")(
      "seed", po::value(&seed_arg)->default_value(0), "seed for seeded formats and strategies")(
      "continuations", po::value(&cont.count)->default_value(0), "greedy continuations to compare (token match, BLEU)")(
      "continuation-prompt", po::value(&cont.prompt)->default_value(64), "shortest continuation prompt, tokens")(
      "continuation-tokens", po::value(&cont.tokens)->default_value(20), "tokens generated per continuation")(
      "out,o", po::value(&out),
      ".safetensors: logits [T, vocab], nll [T-1], input_ids [T], scored [T-1] (1 at the positions the PPL "
      "averages), and logits_exact, nll_exact when quantized; metadata n_ctx and score. .npy: the logits")(
      "nll", po::value(&nll_out), "write the per-position NLL [T-1] (nats) to this .npy (every position: see below)")(
      "task", po::value(&task_file), "an answer task (.npz or .jsonl, configs/README.md [task]): answer_accuracy")(
      "answer-regex", po::value(&answer_regex), "with --task: the regex that finds the answer (group 1, else the match)")(
      "answer-after", po::value(&answer_after)->default_value(-1),
      "with --task: search the answer after this generated token id (e.g. </think>); -1 = in all generated text")(
      "max-new-tokens", po::value(&task_spec.max_new_tokens)->default_value(256), "with --task: tokens generated at most")(
      "max-problems", po::value(&task_spec.max_problems)->default_value(0), "with --task: the first N problems (0 = all)")(
      "problem-prefix", po::value(&task_spec.problem_prefix), "with --task: only problems whose name starts with this")(
      "ctx", po::value(&n_ctx)->default_value(512),
      "tokens per window: the text is evaluated in consecutive windows of this many tokens, each from an empty "
      "cache (llama.cpp's -c); 0 = one window of every token")(
      "score", po::value(&score_text)->default_value("all"),
      "positions scored in each window: all (every token after the window's first) or second_half (llama.cpp's "
      "rule: positions ctx/2 and later)")(
      "kl-base", po::value(&kl_base),
      "a .safetensors of the exact run's logits: written when absent, read instead of recomputing when present "
      "(checked against the model, tokens and --ctx)")(
      "base-memory", po::value(&base_memory_mib)->default_value(base_memory_mib),
      "MiB of the exact run's logits (tokens x vocab x 4 bytes) held in memory; above it they are kept in the "
      "--kl-base file, else in a temporary file in $TMPDIR (or /tmp), and read back one window at a time")(
      "json", po::bool_switch(&json), "print the report as one JSON object on stdout (keys: README.md, eval)")(
      "backend", po::value(&backend_text)->default_value("cpu"),
      "the forward pass: cpu, cuda (the device's; a format without a CUDA twin is an error) or auto (cuda when a "
      "device is present)")(
      "precision", po::value(&precision_text)->default_value("fp32"),
      "the device pass's GEMMs: fp32, or tf32 (TF32 tensor cores, the declared fast mode; not with --backend cpu)");
  in.add_options(opts);
  po::variables_map vm;
  check_assignments(args, "--param", "format=int4-asym-g32");
  if (!in.parse(args, opts, "eval", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nnll[t] is -log p(token t+1 | the tokens of t's window up to t) in nats, t = 0..T-2: each window\n"
                 "(--ctx tokens, from an empty cache, its first token replaced by BOS when the text starts with it)\n"
                 "conditions on its own tokens only. nll[t] is NaN where t ends a window (token t+1 starts the next).\n"
                 "PPL = exp(mean nll[t] over the scored t): --out's `scored` tensor marks them. With --score all\n"
                 "they are the finite values (one window: every t); with --score second_half, the t with\n"
                 "t mod ctx >= ctx/2, whose first halves are still written, finite. With a strategy that\n"
                 "calibrates, its calibration positions (window-local t = 7, 15, ...) are left out as well.\n"
                 "With --format, --key-format/--value-format or --strategy, the exact run is recorded first\n"
                 "(what strategies build their plan from) and the quantized run is compared with it.\n";
    return kExitOk;
  }
  // The strategy is built before any work so that a bad name fails fast.
  const std::unique_ptr<Strategy> strat = plan_options.make_strategy();
  std::string plan_source = strat ? plan_options.source() : std::string();
  if (!layers_text.empty() && !strat)
    throw ConfigError("--layers needs a plan: give --format, --key-format/--value-format or --strategy");
  if (vm.count("other-layers-format") && !vm["other-layers-format"].defaulted() && layers_text.empty())
    throw ConfigError("--other-layers-format needs --layers");
  // A budget is met over every layer: leaving layers out afterwards would break it.
  if (!layers_text.empty() && !plan_options.budget_param.empty())
    throw ConfigError("--layers with " + plan_options.budget_param +
                      ": the strategy meets its budget over every layer, which --layers "
                      "would break by storing the others at " + other_layers_format +
                      "; give a fixed format (--format, or the strategy's format parameters) with --layers");
  FormatPtr other_layers;
  if (!layers_text.empty()) {
    try {
      other_layers = make_format(other_layers_format);
    } catch (ConfigError& e) {
      e.add_context("--other-layers-format");
      throw;
    }
  }
  const uint64_t seed = checked_seed(seed_arg, "--seed");
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
  if (n_ctx < 0 || n_ctx == 1) throw ConfigError("--ctx must be 0 (one window of every token) or >= 2, got " + std::to_string(n_ctx));
  const ScoreRule score = parse_score_rule(score_text, "--score");
  if (score == ScoreRule::SecondHalf && n_ctx == 0) throw ConfigError("--score second_half needs windows (--ctx N)");
  if (!(base_memory_mib >= 0) || base_memory_mib > 1e12)
    throw ConfigError("--base-memory must be a number of MiB >= 0, got " + format_double(base_memory_mib));
  if (!kl_base.empty() && std::filesystem::path(kl_base).extension() != ".safetensors")
    throw ConfigError("--kl-base " + kl_base + ": expected a .safetensors file");
  if (!kl_base.empty() && !std::filesystem::exists(kl_base)) require_writable_output(kl_base, "--kl-base");
  if (!out.empty()) require_writable_output(out, "--out");
  if (!nll_out.empty()) require_writable_output(nll_out, "--nll");
  refuse_shared_output_files({{"--out", out}, {"--kl-base", kl_base}, {"--nll", nll_out}});
  // From here on an interrupt removes the unfinished files (--kl-base, --out, --nll) and exits 128 + signal.
  const ExitOnInterrupt exit_on_interrupt("eval");
  // The layer selection is checked against config.json before the weights load.
  std::vector<int64_t> quantized_layers;
  if (!layers_text.empty())
    quantized_layers = parse_layer_selection(layers_text, load_model_config(in.checkpoint), "--layers");
  const BackendRequest backend_request = parse_backend_request(backend_text, "--backend");
  const MatmulPrecision precision = parse_matmul_precision(precision_text, "--precision");
  check_precision_backend(precision, backend_request, "--precision");
  if (backend_request == BackendRequest::Cuda && !task_file.empty())
    throw ConfigError("--task with --backend cuda: a task's problems run on the CPU forward pass only; use "
                      "--backend cpu or auto");
  const std::shared_ptr<const Transformer> model = in.load_model();
  const ModelConfig& cfg = model->config();
  const std::vector<int64_t> tokens = in.load_tokens(cfg, n_ctx);
  if (tokens.size() >= 2) check_windows_fit_positions(cfg, token_windows(static_cast<int64_t>(tokens.size()), n_ctx));
  const ModelBackend backend = make_model_backend(model, backend_request, "--backend", precision);
  say(json, "model: %s (%.1f MiB of weights in memory, 16-bit weights kept 16-bit)\n  %s\ntokens: %zu from %s\n", cfg.dir.string().c_str(),
              static_cast<double>(model->weights().bytes()) / (1024.0 * 1024.0), cfg.summary().c_str(), tokens.size(),
              in.token_origin().c_str());
  say(json, "backend: %s (%s%s%s)%s\n", backend_name(backend.choice.used), backend.choice.reason.c_str(),
      backend.choice.device.empty() ? "" : ": ", backend.choice.device.c_str(), backend.precision_note().c_str());
  if (!task_file.empty() && backend.choice.used == Backend::Cuda)
    say(json, "backend: the task's problems run on the CPU forward pass\n");
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
    } catch (ConfigError& e) {
      e.add_context("--task");
      throw;
    }
    say(json, "task: %s\n", task->describe().c_str());
  }
  // A progress bar on stderr while a pass runs over more than one window.
  std::unique_ptr<Progress> progress;
  std::string pass = "exact";
  auto window_clock = std::chrono::steady_clock::now();
  ModelEvalOptions eval_options;
  eval_options.windows = WindowSpec{n_ctx, score};
  eval_options.kl_base = kl_base;
  eval_options.max_held_base_bytes = static_cast<int64_t>(base_memory_mib * 1024.0 * 1024.0);
  eval_options.backend = backend.forward;
  eval_options.precision =
      backend.choice.used == Backend::Cuda ? matmul_precision_name(backend.precision) : std::string("fp32");
  eval_options.progress = [&](int64_t done, int64_t total) {
    if (total < 2) return;
    if (!progress) progress = std::make_unique<Progress>(static_cast<size_t>(total), false, "windows");
    const auto now = std::chrono::steady_clock::now();
    progress->update(static_cast<size_t>(done), pass + " cache", true,
                     std::chrono::duration<double>(now - window_clock).count());
    window_clock = now;
    if (done == total) {
      progress->finish();
      progress.reset();
    }
  };
  const bool kl_base_existed = !kl_base.empty() && std::filesystem::exists(kl_base);
  const ModelEvaluator evaluator(model, tokens, cont, source, task, eval_options);
  const std::vector<double> exact_nll = evaluator.base_scored_nll();
  const double exact_ppl = perplexity(exact_nll);
  const double exact_ppl_se = exact_ppl * standard_error_of_mean(exact_nll);
  const size_t n_windows = evaluator.windows().size();
  say(json, "exact cache: PPL %.6g ± %.3g (mean NLL %.6g nats over %zu positions", exact_ppl, exact_ppl_se,
      std::log(exact_ppl), exact_nll.size());
  if (n_windows > 1 || score != ScoreRule::All)
    say(json, " in %zu windows of %lld tokens, scoring %s", n_windows, static_cast<long long>(n_ctx),
        score_rule_name(score));
  say(json, ")\n");
  const int64_t T = static_cast<int64_t>(tokens.size()), V = cfg.vocab_size;
  const double base_mib = static_cast<double>(T) * static_cast<double>(V) * 4.0 / (1024.0 * 1024.0);
  if (!kl_base.empty())
    say(json, "exact logits: %s %s\n", kl_base_existed ? "read from" : "written to", kl_base.c_str());
  if (!evaluator.base_logits_held())
    say(json, "exact logits: %.1f MiB, above --base-memory %.6g MiB: kept in %s, read one window at a time\n",
        base_mib, base_memory_mib, kl_base.empty() ? "a temporary file" : kl_base.c_str());
  if (task) {
    int64_t right = 0;
    for (const AnswerTask::Run& r : evaluator.base_answers()) right += r.correct ? 1 : 0;
    const int64_t n = static_cast<int64_t>(evaluator.base_answers().size());
    const Interval ci = wilson_interval(right, n);
    say(json, "exact cache: answer accuracy %.4g (%lld of %lld problems; 95 %% Wilson interval %.3g..%.3g)\n",
                static_cast<double>(right) / static_cast<double>(n), static_cast<long long>(right),
                static_cast<long long>(n), ci.lo, ci.hi);
  }

  // --out: the evaluated run's logits (quantized when a plan is given), its NLL and the
  // tokens, and with a plan the exact run's beside them; written a window at a time
  // (never [T, vocab] in memory), the quantized logits as the run computes them.
  const bool out_npy = !out.empty() && std::filesystem::path(out).extension() == ".npy";
  std::unique_ptr<TensorFileStream> out_file;
  const auto open_out_file = [&](const std::string& plan_name) {
    std::vector<TensorLayout> layout = {{"logits", {T, V}, DType::F32},
                                        {"nll", {T - 1}, DType::F32},
                                        {"input_ids", {T}, DType::I32},
                                        {"scored", {T - 1}, DType::I32}};
    if (strat) {
      layout.push_back({"logits_exact", {T, V}, DType::F32});
      layout.push_back({"nll_exact", {T - 1}, DType::F32});
    }
    if (out_npy) layout.resize(1);
    out_file = std::make_unique<TensorFileStream>(out, std::move(layout),
                                                  std::map<std::string, std::string>{{"model", cfg.dir.string()},
                                                                                     {"plan", plan_name},
                                                                                     {"n_ctx", std::to_string(n_ctx)},
                                                                                     {"score", score_rule_name(score)}});
  };
  // The exact logits into out_file, a window of rows at a time; rows no window holds are zeros.
  const auto append_exact_logits = [&] {
    std::vector<float> rows(static_cast<size_t>(evaluator.windows().front().length * V));
    int64_t done = 0;
    for (const TokenWindow& w : evaluator.windows()) {
      evaluator.read_base_rows(w.start, w.length, rows.data());
      out_file->append_floats(rows.data(), w.length * V);
      done = w.start + w.length;
    }
    out_file->append_zeros((T - done) * V);
  };
  std::vector<double> quant_nll;  // [T - 1], with a plan and a file asked for
  // The sequence positions the report's PPL and comparisons average over (--out's `scored`).
  std::vector<int64_t> compared = evaluator.scored_positions();
  ErrorStats stats;
  double plan_bpe = std::nan("");
  std::string plan_text = "exact";
  if (strat) {
    // A strategy that reads statistics (entropies, received attention) measures them
    // on the default calibration positions of `kvbudget run` ([calibration]: every 8th
    // from 7); the model metrics then leave those positions out.
    // With windows, the recording is the first window's, and the positions are window-local.
    CalibratedPlan built = build_calibrated_plan(*strat, evaluator.recording(), seed, plan_source);
    Plan& plan = built.plan;
    if (!layers_text.empty()) {
      quantize_only_layers(plan, quantized_layers, other_layers);
      plan_source += " on layers " + format_layer_list(quantized_layers) + " (others " + other_layers->name() + ")";
      const std::string bad = plan.check();
      if (!bad.empty()) throw Error(plan_source + ": invalid plan: " + bad);
    }
    const QueryPositions& positions = built.positions;
    say(json, "plan: %s = %s, %.4f bits per element (%.4g bytes at %lld tokens)\n", plan_source.c_str(),
        plan.describe().c_str(), plan.bpe(), plan.bytes_at(plan.tokens()), static_cast<long long>(plan.tokens()));
    plan_bpe = plan.bpe();
    plan_text = plan.describe();
    const bool calibrated = built.calibrated;
    compared = evaluator.compared_positions(calibrated ? &positions.evaluation : nullptr);
    pass = "quantized";
    QuantizedRunOutput run_output;
    if (!out.empty() || !nll_out.empty()) run_output.nll = &quant_nll;
    int64_t quant_rows_written = 0;
    if (!out.empty()) {
      open_out_file(plan_source);
      run_output.window_logits = [&](const TokenWindow& w, const float* logits) {
        out_file->append_floats(logits, w.length * V);
        quant_rows_written = w.start + w.length;
      };
    }
    stats.model = evaluator.evaluate(plan, seed, nullptr, calibrated ? &positions.evaluation : nullptr, &run_output);
    if (out_file) out_file->append_zeros((T - quant_rows_written) * V);
    say(json, "quantized cache%s:\n",
        calibrated ? " (positions not used for the strategy's calibration, every 8th from 7)" : "");
    if (calibrated && built.calibration_beyond_window > 0)
      say(json, "  (the strategy calibrated on the %zu calibration positions below the sliding window W = %lld, where "
                "the recording's full causal attention is the model's; %lld beyond it were left out)\n",
          positions.calibration.size() - static_cast<size_t>(built.calibration_beyond_window),
          static_cast<long long>(evaluator.recording().full_causal_queries()),
          static_cast<long long>(built.calibration_beyond_window));
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
      if (!m.in_default_report) continue;  // in the llama.cpp-style report below
      say(json, "  %-22s %-12.6g %-12s %s\n", m.name.c_str(), m.compute(stats), se, m.description.c_str());
    }
    warn_nonfinite_positions(stats.model);
    if (!json) {
      // llama.cpp scores the second half of each window: say so whenever kvbudget does not.
      std::printf("\nAs llama.cpp's perplexity tool reports it (--kl-divergence), over %zu positions%s:\n",
                  stats.model.nll.size(),
                  score == ScoreRule::All ? " (every position of each window; llama.cpp scores only the second half "
                                            "of each, as --score second_half does)"
                                          : "");
      print_report_lines("Perplexity statistics", std::begin(kPerplexityLines), std::end(kPerplexityLines), stats);
      print_report_lines("KL divergence statistics", std::begin(kKlLines), std::end(kKlLines), stats);
      print_report_lines("Token probability statistics", std::begin(kDeltaPLines), std::end(kDeltaPLines), stats);
    }
  } else if (cont.count > 0) {
    say(json, "(continuations are compared only with a quantized cache: give --format or --strategy)\n");
  }
  if (json) {
    // Short keys as llama.cpp names the statistics, then every model metric of the
    // table (and its _se) under "metrics". Comparisons are null without a plan.
    nlohmann::json j;
    j["model"] = cfg.dir.string();
    j["tokens"] = tokens.size();
    j["n_ctx"] = n_ctx;
    j["backend"] = backend_name(backend.choice.used);
    if (backend.choice.used == Backend::Cuda) j["precision"] = matmul_precision_name(backend.precision);
    j["windows"] = n_windows;
    j["score"] = score_rule_name(score);
    j["positions"] = strat ? stats.model.nll.size() : exact_nll.size();
    j["plan"] = strat ? plan_source + " = " + plan_text : "exact";
    j["bpe"] = json_number(plan_bpe);
    j["kl_base"] = kl_base.empty() ? nlohmann::json(nullptr) : nlohmann::json(kl_base);
    j["kl_base_reused"] = evaluator.kl_base_reused();
    const std::pair<const char*, const char*> keys[] = {
        {"ppl", "ppl"}, {"ppl_base", "ppl_base"}, {"ppl_ratio", "ppl_ratio"}, {"ln_ppl_ratio", "ln_ppl_ratio"},
        {"ppl_diff", "ppl_diff"}, {"ln_ppl_cor", "ln_ppl_correlation"},
        {"kl_mean", "next_token_kl_mean"}, {"kl_max", "next_token_kl_max"}, {"kl_p99_9", "next_token_kl_p99_9"},
        {"kl_p99", "next_token_kl_p99"}, {"kl_p95", "next_token_kl_p95"}, {"kl_p90", "next_token_kl_p90"},
        {"kl_median", "next_token_kl_median"}, {"kl_p10", "next_token_kl_p10"}, {"kl_p5", "next_token_kl_p5"},
        {"kl_p1", "next_token_kl_p1"}, {"kl_p0_1", "next_token_kl_p0_1"}, {"kl_min", "next_token_kl_min"},
        {"same_top", "same_top_rate"}, {"delta_p_mean", "delta_p_mean"}, {"delta_p_rms", "delta_p_rms"},
        {"delta_p_max", "delta_p_max"}, {"delta_p_p99_9", "delta_p_p99_9"}, {"delta_p_p99", "delta_p_p99"},
        {"delta_p_p95", "delta_p_p95"}, {"delta_p_p90", "delta_p_p90"}, {"delta_p_p75", "delta_p_p75"},
        {"delta_p_median", "delta_p_median"}, {"delta_p_p25", "delta_p_p25"}, {"delta_p_p10", "delta_p_p10"},
        {"delta_p_p5", "delta_p_p5"}, {"delta_p_p1", "delta_p_p1"}, {"delta_p_p0_1", "delta_p_p0_1"},
        {"delta_p_min", "delta_p_min"}};
    for (const auto& [key, metric] : keys) {
      const MetricDef& m = require_metric(metric, "eval --json");
      j[key] = strat ? json_number(m.compute(stats)) : nlohmann::json(nullptr);
      if (m.standard_error)
        j[std::string(key) + "_se"] = strat ? json_number(m.standard_error(stats)) : nlohmann::json(nullptr);
    }
    if (!strat) {  // the exact run alone: its PPL (with a plan, ppl_base is on the positions compared)
      j["ppl"] = j["ppl_base"] = json_number(exact_ppl);
      j["ppl_se"] = j["ppl_base_se"] = json_number(exact_ppl_se);
    }
    nlohmann::json metrics = nlohmann::json::object();
    if (strat)
      for (const MetricDef& m : metric_table()) {
        if (m.level != MetricLevel::Model || !m.defined_for(cont.count, cont.tokens) || (m.needs_task && !task))
          continue;
        metrics[m.name] = json_number(m.compute(stats));
        if (m.standard_error) metrics[m.name + "_se"] = json_number(m.standard_error(stats));
        if (m.interval) {
          const Interval ci = m.interval(stats);
          metrics[m.name + "_lo"] = json_number(ci.lo);
          metrics[m.name + "_hi"] = json_number(ci.hi);
        }
      }
    j["metrics"] = metrics;
    std::printf("%s\n", j.dump(2).c_str());
  }

  // Files: the evaluated run (quantized when a plan is given), and the exact one.
  const std::vector<float> nll = as_floats(strat ? quant_nll : evaluator.base_nll());
  const std::vector<float> nll_exact = as_floats(evaluator.base_nll());
  if (!out.empty()) {
    if (!strat) {
      open_out_file("exact");
      append_exact_logits();
    }
    if (!out_npy) {
      out_file->append_floats(nll.data(), T - 1);
      out_file->append_ints(tokens.data(), T);
      out_file->append_ints(position_mask(T - 1, compared).data(), T - 1);
      if (strat) {
        append_exact_logits();
        out_file->append_floats(nll_exact.data(), T - 1);
      }
    }
    out_file->commit();
    say(json, "wrote %s\n", out.c_str());
  }
  if (!nll_out.empty()) {
    write_npy(nll_out, TensorToWrite::of_floats("nll", {T - 1}, nll.data()));
    say(json, "wrote %s\n", nll_out.c_str());
  }
  return kExitOk;
}

}  // namespace kvb::cli
