// `kvbudget generate MODEL_DIR --prompt TEXT [--format F | --strategy S]`: the
// continuation of a prompt with the exact KV cache and with a plan's quantized cache,
// greedy or by seeded sampling (the same random stream for both, so that a difference
// comes from the cache alone), printed side by side with their token match, and
// written as JSON with the token ids and texts (issue 21 item 4).
//
// The plan is built from the exact run of the prompt (its recording, as `eval` builds
// a plan from the evaluated text's), sized for the prompt's T tokens; the generated
// tokens beyond T take the plan's stretching segment's format (Plan::unit_at).
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <algorithm>
#include <cmath>
#include <span>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "experiments/cli/commands.h"
#include "experiments/model_backend.h"
#include "experiments/cli/model_input.h"
#include "experiments/cli/plan_options.h"
#include "experiments/query_positions.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/io/atomic_file.h"
#include "sim/io/input_file.h"
#include "sim/metrics/model_metrics.h"
#include "sim/model/model_eval.h"
#include "sim/model/sampling.h"

namespace po = boost::program_options;

namespace kvb::cli {

namespace {

// One continuation and what it reads as.
struct Continuation {
  std::vector<int64_t> ids;        // the new tokens, EOS included when it stopped there
  std::vector<std::string> texts;  // each token's text alone
  std::string text;                // the tokens' text together (EOS and other text-less ids left out)
  bool stopped_at_eos = false;
};

// The text of `ids`; an id the tokenizer has no text for (a model's vocabulary may be
// padded beyond its tokenizer's) reads "<id N>" instead of failing the command.
std::string decode_safely(const Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::string s;
  std::vector<int64_t> run;  // known ids since the last unknown one, decoded together
  for (int64_t id : ids) {
    if (tokenizer.knows(id)) {
      run.push_back(id);
      continue;
    }
    s += tokenizer.decode(run) + "<id " + std::to_string(id) + ">";
    run.clear();
  }
  return s + tokenizer.decode(run);
}

// The text of `ids` decoded together (a character may span tokens), where a token with no
// text of its own (a byte model's special tokens, such as a reasoning model's <think>
// ids above 255) reads "<id N>", so that it shows where it was generated.
std::string readable_text(const Tokenizer& tokenizer, std::span<const int64_t> ids) {
  std::string text;
  std::vector<int64_t> run;
  for (int64_t id : ids) {
    if (!decode_safely(tokenizer, {id}).empty()) {
      run.push_back(id);
      continue;
    }
    text += decode_safely(tokenizer, run) + "<id " + std::to_string(id) + ">";
    run.clear();
  }
  return text + decode_safely(tokenizer, run);
}

// "256" or "128001, 128008, 128009".
std::string join_ids(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s;
}

// `eos`: the ids that end a continuation (none with --ignore-eos).
Continuation describe_continuation(std::vector<int64_t> ids, const Tokenizer& tokenizer, const std::vector<int64_t>& eos) {
  Continuation c;
  c.stopped_at_eos = !ids.empty() && std::find(eos.begin(), eos.end(), ids.back()) != eos.end();
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool the_eos = c.stopped_at_eos && i + 1 == ids.size();
    c.texts.push_back(the_eos ? decode_safely(tokenizer, {ids[i]}) : readable_text(tokenizer, {&ids[i], 1}));
  }
  c.text = readable_text(tokenizer, {ids.data(), ids.size() - (c.stopped_at_eos ? 1 : 0)});
  c.ids = std::move(ids);
  return c;
}

// The first new-token index where the continuations differ (one ending before the
// other counts), nullopt when they are identical.
std::optional<int64_t> first_divergence(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  if (a.size() != b.size()) return static_cast<int64_t>(n);
  return std::nullopt;
}

// Text as terminal cells: one string per cell (a UTF-8 character, assumed one column
// wide), "\n" for a line break. Control characters other than newline and tab, and
// bytes that are not UTF-8, read \xNN; a tab reads as one space.
std::vector<std::string> display_cells(const std::string& text) {
  std::vector<std::string> cells;
  const auto escaped = [&](unsigned char b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", b);
    for (const char* p = buf; *p; ++p) cells.emplace_back(1, *p);
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    if (b == '\n') {
      cells.emplace_back("\n");
      ++i;
    } else if (b == '\t') {
      cells.emplace_back(" ");
      ++i;
    } else if (b < 0x20 || b == 0x7f) {
      escaped(b);
      ++i;
    } else if (b < 0x80) {
      cells.emplace_back(1, static_cast<char>(b));
      ++i;
    } else {
      // A well-formed UTF-8 sequence of 2..4 bytes (no overlong or surrogate check: the
      // terminal shows what it is given).
      const size_t len = b >= 0xf0 && b < 0xf5 ? 4 : b >= 0xe0 ? 3 : b >= 0xc2 && b < 0xe0 ? 2 : 0;
      bool ok = len > 0 && i + len <= text.size() && b < 0xf5;
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
      if (ok) {
        cells.push_back(text.substr(i, len));
        i += len;
      } else {
        escaped(b);
        ++i;
      }
    }
  }
  return cells;
}

// A continuation's text for display, with `marker` before its first diverging token
// (when `divergence` is set) and " [EOS]" when it stopped there.
std::vector<std::string> continuation_cells(const Continuation& c, const Tokenizer& tokenizer,
                                            std::optional<int64_t> divergence) {
  const size_t end = c.ids.size() - (c.stopped_at_eos ? 1 : 0);
  const size_t cut = divergence ? std::min(static_cast<size_t>(*divergence), end) : end;
  std::vector<std::string> cells = display_cells(readable_text(tokenizer, {c.ids.data(), cut}));
  if (divergence) cells.emplace_back("▸");
  const std::vector<std::string> rest = display_cells(readable_text(tokenizer, {c.ids.data() + cut, end - cut}));
  cells.insert(cells.end(), rest.begin(), rest.end());
  if (c.stopped_at_eos)
    for (const char* s : {" ", "[", "E", "O", "S", "]"}) cells.emplace_back(s);
  return cells;
}

// Cells wrapped into lines of at most `width` cells (at the width, not at words).
std::vector<std::string> wrap(const std::vector<std::string>& cells, size_t width, std::vector<size_t>& lengths) {
  std::vector<std::string> lines(1);
  lengths.assign(1, 0);
  for (const std::string& cell : cells) {
    if (cell == "\n" || lengths.back() == width) {
      lines.emplace_back();
      lengths.push_back(0);
      if (cell == "\n") continue;
    }
    lines.back() += cell;
    ++lengths.back();
  }
  return lines;
}

std::string joined(const std::vector<std::string>& cells) {
  std::string s;
  for (const std::string& c : cells) s += c;
  return s;
}

// The first `width` cells of a heading.
std::string clipped(const std::string& text, size_t width, size_t& length) {
  std::vector<std::string> cells = display_cells(text);
  if (cells.size() > width) {
    cells.resize(width - 1);
    cells.emplace_back("…");
  }
  length = cells.size();
  return joined(cells);
}

// Columns of the terminal on stdout (0 when stdout is not a terminal): the terminal's
// own size, else $COLUMNS.
int terminal_columns() {
  if (!isatty(STDOUT_FILENO)) return 0;
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    const int n = std::atoi(columns);
    if (n > 0) return n;
  }
  return 80;
}

void print_side_by_side(const std::string& left_title, const std::vector<std::string>& left,
                        const std::string& right_title, const std::vector<std::string>& right, int width) {
  const size_t column = static_cast<size_t>(std::max(20, (width - 3) / 2));
  const auto pad = [](const std::string& s, size_t length, size_t column_width) {
    return s + std::string(column_width > length ? column_width - length : 0, ' ');
  };
  size_t ll = 0, rl = 0;
  const std::string lt = clipped(left_title, column, ll), rt = clipped(right_title, column, rl);
  std::printf("%s │ %s\n", pad(lt, ll, column).c_str(), rt.c_str());
  std::string rule;
  for (size_t i = 0; i < column; ++i) rule += "─";
  std::printf("%s─┼─%s\n", rule.c_str(), rule.c_str());
  std::vector<size_t> left_lengths, right_lengths;
  const std::vector<std::string> a = wrap(left, column, left_lengths), b = wrap(right, column, right_lengths);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string l = i < a.size() ? pad(a[i], left_lengths[i], column) : std::string(column, ' ');
    std::printf("%s │ %s\n", l.c_str(), i < b.size() ? b[i].c_str() : "");
  }
}

// A continuation's heading: "exact cache: 32 new tokens, stopped at EOS".
std::string heading(const std::string& cache, const Continuation& c) {
  return cache + ": " + std::to_string(c.ids.size()) + " new tokens" + (c.stopped_at_eos ? ", stopped at EOS" : "");
}

nlohmann::ordered_json continuation_json(const Continuation& c) {
  return {{"ids", c.ids},
          {"texts", c.texts},
          {"text", c.text},
          {"new_tokens", c.ids.size()},
          {"stopped_at_eos", c.stopped_at_eos}};
}

// A JSON number, null when not finite.
nlohmann::ordered_json json_number(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

}  // namespace

int cmd_generate(const Args& args) {
  po::options_description opts("kvbudget generate MODEL_DIR (--prompt TEXT | --prompt-file FILE) [options]");
  ModelInput in;
  PlanOptions plan_options;
  std::string prompt, prompt_file, out, layout = "auto";
  std::string plan_text_file, plan_token_file;  // what the plan is built from, instead of the prompt
  int64_t max_new_tokens = 64, seed_arg = 0, width_arg = 0;
  SamplingSpec sampling;
  bool ignore_eos = false, json = false;
  std::string backend_text = "cpu", precision_text = "fp32";
  opts.add_options()("help,h", "show this help")("prompt", po::value(&prompt), "the prompt text")(
      "prompt-file", po::value(&prompt_file), "read the prompt text from this file");
  plan_options.add_options(opts);
  opts.add_options()(
      "plan-text", po::value(&plan_text_file),
      "build the plan from the exact run of this text file instead of the prompt's (a calibrated strategy calibrates "
      "on it; a phase strategy finds its phase_marker in it)")(
      "plan-tokens", po::value(&plan_token_file),
      "the same from token ids (.npy or whitespace-separated text), e.g. a reasoning trace with its </think> id");
  opts.add_options()("max-new-tokens,n", po::value(&max_new_tokens)->default_value(64),
                     "tokens generated at most per continuation")(
      "temperature", po::value(&sampling.temperature)->default_value(0.0),
      "sampling temperature; 0 = greedy (the default)")(
      "top-k", po::value(&sampling.top_k)->default_value(0), "sample among the k most likely tokens (0 = all; 1 = greedy)")(
      "top-p", po::value(&sampling.top_p)->default_value(1.0),
      "sample among the fewest most likely tokens whose probability reaches p (1 = all)")(
      "seed", po::value(&seed_arg)->default_value(0),
      "seed of the sampler (both continuations draw the same stream) and of seeded formats and strategies")(
      "ignore-eos", po::bool_switch(&ignore_eos), "do not stop at the model's eos_token_id")(
      "out,o", po::value(&out), "write the prompt, plan, sampling settings and both continuations (ids, texts, "
                                "per-token agreement) to this .json file")(
      "json", po::bool_switch(&json), "print that JSON on stdout instead of the text")(
      "layout", po::value(&layout)->default_value("auto"),
      "side (the continuations side by side), stacked (one after the other) or auto (side by side on a terminal "
      "at least 80 columns wide)")(
      "width", po::value(&width_arg)->default_value(0), "columns of the side-by-side layout (0: the terminal's, else 100)")(
      "backend", po::value(&backend_text)->default_value("cpu"),
      "the forward pass: cpu, cuda (the device's; a format without a CUDA twin is an error) or auto (cuda when a "
      "device is present)")(
      "precision", po::value(&precision_text)->default_value("fp32"),
      "the device pass's GEMMs: fp32, or tf32 (TF32 tensor cores, the declared fast mode; not with --backend cpu)");
  in.add_model_options(opts);
  po::variables_map vm;
  check_assignments(args, "--param", "format=int4-asym-g32");
  if (!in.parse(args, opts, "generate", vm)) return kExitUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nThe prompt is continued twice: with the exact KV cache and with the cache of --format,\n"
                 "--key-format/--value-format or --strategy (built from the prompt's exact run; without\n"
                 "one, both continuations use the exact cache). Token match is the fraction of the exact\n"
                 "continuation's tokens that the quantized one has at the same position; ▸ marks where they\n"
                 "first differ.\n";
    return kExitOk;
  }
  if (prompt_file.empty() == !vm.count("prompt")) throw ConfigError("give exactly one of --prompt and --prompt-file");
  if (max_new_tokens < 1) throw ConfigError("--max-new-tokens must be >= 1, got " + std::to_string(max_new_tokens));
  sampling.seed = checked_seed(seed_arg, "--seed");
  sampling.check();
  if (layout != "auto" && layout != "side" && layout != "stacked")
    throw ConfigError("--layout " + layout + ": expected auto, side or stacked");
  if (width_arg != 0 && width_arg < 43)
    throw ConfigError("--width must be 0 (the terminal's) or >= 43 (two columns of 20), got " + std::to_string(width_arg));
  if (!out.empty() && std::filesystem::path(out).extension() != ".json")
    throw ConfigError("--out " + out + ": expected a .json file");
  if (!out.empty()) require_writable_output(out, "--out");
  // The strategy is built before any work so that a bad name fails fast.
  const std::unique_ptr<Strategy> strat = plan_options.make_strategy();
  const std::string plan_source = strat ? plan_options.source() : std::string();

  const BackendRequest backend_request = parse_backend_request(backend_text, "--backend");
  const MatmulPrecision precision = parse_matmul_precision(precision_text, "--precision");
  check_precision_backend(precision, backend_request, "--precision");
  const std::shared_ptr<const Transformer> model = in.load_checkpoint();
  const ModelConfig& cfg = model->config();
  const ModelBackend backend = make_model_backend(model, backend_request, "--backend", precision);
  const std::string where = prompt_file.empty() ? "--prompt" : prompt_file;
  if (!prompt_file.empty()) prompt = read_file_prefix(prompt_file, "a prompt file", SIZE_MAX);
  const std::unique_ptr<Tokenizer> tokenizer = in.make_tokenizer();
  const std::vector<int64_t> prompt_ids = in.encode_text(prompt, cfg, where);
  const int64_t P = static_cast<int64_t>(prompt_ids.size());
  if (P == 0) throw ConfigError(where + ": the prompt has no tokens");
  if (cfg.max_positions > 0 && P > cfg.max_positions)
    throw ConfigError(where + ": the prompt's " + std::to_string(P) + " tokens exceed the " +
                      std::to_string(cfg.max_positions) + " positions of " + cfg.dir.string() + " (" +
                      (cfg.family == ModelFamily::Gpt2 ? "n_positions" : "max_position_embeddings") + " in " +
                      cfg.config_file.string() + ")");
  // The last new token is never fed back: positions 0 .. P + max_new_tokens − 2 are computed.
  if (cfg.family == ModelFamily::Gpt2 && P + max_new_tokens - 1 > cfg.max_positions)
    throw ConfigError(where + ": the prompt's " + std::to_string(P) + " tokens + --max-new-tokens " +
                      std::to_string(max_new_tokens) + " exceed the learned position table of " + cfg.dir.string() +
                      " (n_positions " + std::to_string(cfg.max_positions) + ")");
  const std::string warning = cfg.context_warning(P + max_new_tokens);
  if (!warning.empty()) std::fprintf(stderr, "kvbudget: warning: %s\n", warning.c_str());

  // The plan, from the exact run of the prompt (or of --plan-text / --plan-tokens).
  if (!plan_text_file.empty() && !plan_token_file.empty())
    throw ConfigError("give at most one of --plan-text and --plan-tokens");
  if ((!plan_text_file.empty() || !plan_token_file.empty()) && !strat)
    throw ConfigError("--plan-text / --plan-tokens build a plan: give --format, --key-format/--value-format or --strategy");
  std::vector<int64_t> plan_ids = prompt_ids;
  std::string plan_origin = "the prompt";
  if (!plan_text_file.empty() || !plan_token_file.empty()) {
    TokenSource src;
    src.text = plan_text_file;
    src.token_file = plan_token_file;
    src.tokenizer = in.tokenizer;
    if (in.bos) src.add_bos = true;
    if (in.no_bos) src.add_bos = false;
    plan_ids = load_tokens(src, cfg);
    plan_origin = plan_text_file.empty() ? plan_token_file : plan_text_file;
    const std::string where_plan = plan_text_file.empty() ? "--plan-tokens" : "--plan-text";
    if (plan_ids.size() < 2) throw ConfigError(where_plan + " " + plan_origin + ": fewer than 2 tokens");
    if (cfg.max_positions > 0 && static_cast<int64_t>(plan_ids.size()) > cfg.max_positions)
      throw ConfigError(where_plan + " " + plan_origin + ": its " + std::to_string(plan_ids.size()) +
                        " tokens exceed the model's " + std::to_string(cfg.max_positions) + " positions");
  }
  std::optional<CalibratedPlan> built;
  if (strat) {
    std::vector<LayerTensors> capture;
    ExtendOptions capture_options;
    capture_options.capture = &capture;
    if (backend.forward) backend.forward.forward(plan_ids, capture_options);
    else model->forward(plan_ids, capture_options);
    const Recording recording =
        recording_from_capture(cfg, std::move(capture), plan_ids, "model " + in.checkpoint + " on " + plan_origin);
    try {
      built = build_calibrated_plan(*strat, recording, sampling.seed, plan_source);
    } catch (const ConfigError&) {
      throw;  // the plan itself (a group size the model's head_dim cannot hold): no text fixes it
    } catch (const Error& e) {
      // What the strategy reads (calibration queries, a phase marker) comes from the text
      // the plan is built on: that text is the user's to change, not a config's.
      throw ConfigError(std::string(e.what()) + " [generate builds the plan on " + plan_origin + ", " +
                        std::to_string(plan_ids.size()) +
                        " tokens: give a longer --prompt, or the text to build it on with --plan-text / "
                        "--plan-tokens]");
    }
  }
  const int64_t plan_tokens = static_cast<int64_t>(plan_ids.size());
  // The plan as generation runs it (CacheQuantization::for_prompt, what generate_with
  // applies): a plan with a prefill gets the prompt as its prefill, so its memory and
  // description are those of prefill P.
  std::optional<Plan> as_run;
  if (built) {
    as_run = built->plan;
    as_run->set_prefill(CacheQuantization{&built->plan}.for_prompt(P).effective_prefill());
  }
  const std::string plan_text = built ? plan_source + " = " + as_run->describe() : "exact";

  const std::vector<int64_t> eos = ignore_eos ? std::vector<int64_t>{} : cfg.eos_token_ids;
  const auto stop = [&](const std::vector<int64_t>& generated) {
    return std::find(eos.begin(), eos.end(), generated.back()) != eos.end();
  };
  CacheQuantization quantized;
  if (built) {
    quantized.plan = &built->plan;
    quantized.seed = sampling.seed;
  }
  const TokenChooser choose = [&sampling](std::span<const float> logits, int64_t step) {
    return sample_token(logits, sampling, step);
  };
  const auto continue_prompt = [&](const CacheQuantization& cache) {
    return backend.forward ? backend.forward.generate(prompt_ids, max_new_tokens, cache, choose, stop)
                           : sample_continuation(*model, prompt_ids, max_new_tokens, cache, sampling, stop);
  };
  const Continuation exact = describe_continuation(continue_prompt(CacheQuantization{}), *tokenizer, eos);
  const Continuation quant = describe_continuation(continue_prompt(quantized), *tokenizer, eos);

  // Agreement: position i agrees when both continuations have a token there and it is
  // the same. Token match (gen_token_match's definition): the fraction of the exact
  // continuation's positions that agree.
  const size_t positions = std::max(exact.ids.size(), quant.ids.size());
  std::vector<bool> agree(positions);
  int64_t matching = 0;
  for (size_t i = 0; i < positions; ++i) {
    agree[i] = i < exact.ids.size() && i < quant.ids.size() && exact.ids[i] == quant.ids[i];
    if (agree[i]) ++matching;
  }
  const double match = token_match_rate({quant.ids}, {exact.ids});
  // BLEU-4 needs a 4-gram in both: undefined (not 0) for shorter continuations.
  const bool bleu_defined = std::min(exact.ids.size(), quant.ids.size()) >= 4;
  const double bleu = bleu_defined ? corpus_bleu4({quant.ids}, {exact.ids}) : std::nan("");
  // The quantized cache's bits per element after the prompt and at its longest (the
  // prompt and every new token of the quantized continuation but the last, which is never
  // fed back), for the plan as it ran (its prefill the prompt).
  const int64_t longest = P + static_cast<int64_t>(quant.ids.size()) - 1;
  const double bpe_prompt = built ? as_run->bpe_at(P) : std::nan("");
  const double bpe_longest = built ? as_run->bpe_at(std::max<int64_t>(longest, P)) : std::nan("");
  const bool prefill_replaced = built && built->plan.prefill() > 0 && built->plan.prefill() != P;
  // A phase plan switches where its marker is in the sequence (the prompt, else where it is
  // generated): the new-token index of that switch per continuation, if any.
  const std::optional<int64_t> marker = built ? built->plan.phase_marker() : std::nullopt;
  const auto switch_at = [&](const Continuation& c) -> std::optional<int64_t> {
    if (!marker) return std::nullopt;
    const auto it = std::find(c.ids.begin(), c.ids.end(), *marker);
    return it == c.ids.end() ? std::nullopt : std::optional<int64_t>(it - c.ids.begin());
  };
  const bool marker_in_prompt = marker && std::find(prompt_ids.begin(), prompt_ids.end(), *marker) != prompt_ids.end();
  const std::optional<int64_t> diverged = first_divergence(exact.ids, quant.ids);

  nlohmann::ordered_json j;
  j["command"] = "generate";
  j["model"] = cfg.dir.string();
  j["model_summary"] = cfg.summary();
  j["tokenizer"] = tokenizer->name();
  j["backend"] = backend_name(backend.choice.used);
  if (backend.choice.used == Backend::Cuda) j["precision"] = matmul_precision_name(backend.precision);
  j["prompt"] = prompt;
  j["prompt_ids"] = prompt_ids;
  j["plan"] = plan_text;
  j["plan_source"] = built ? nlohmann::ordered_json(plan_source) : nlohmann::ordered_json(nullptr);
  j["bpe"] = built ? json_number(bpe_longest) : nlohmann::ordered_json(nullptr);
  j["bpe_prompt"] = built ? json_number(bpe_prompt) : nlohmann::ordered_json(nullptr);
  j["cache_tokens"] = std::max<int64_t>(longest, P);
  j["plan_built_on"] = built ? nlohmann::ordered_json("the exact run of " + plan_origin + " (" +
                                                     std::to_string(plan_tokens) + " tokens)")
                             : nlohmann::ordered_json(nullptr);
  j["prefill"] = built && built->plan.prefill() > 0 ? nlohmann::ordered_json(P) : nlohmann::ordered_json(nullptr);
  if (marker) {
    const auto index_json = [](std::optional<int64_t> i) { return i ? nlohmann::ordered_json(*i) : nlohmann::ordered_json(nullptr); };
    j["phase_marker"] = *marker;
    j["phase_switch"] = {{"in_prompt", marker_in_prompt},
                         {"exact", index_json(switch_at(exact))},
                         {"quantized", index_json(switch_at(quant))}};
  }
  j["sampling"] = {{"mode", sampling.greedy() ? "greedy" : "sampled"},
                   {"temperature", sampling.temperature},
                   {"top_k", sampling.top_k},
                   {"top_p", sampling.top_p},
                   {"seed", sampling.seed}};
  j["max_new_tokens"] = max_new_tokens;
  j["stop_at_eos"] = !eos.empty();
  j["eos_token_id"] = eos.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(eos.front());
  j["eos_token_ids"] = eos;
  j["exact"] = continuation_json(exact);
  j["quantized"] = continuation_json(quant);
  j["agreement"] = agree;
  j["matching_tokens"] = matching;
  j["token_match"] = json_number(match);
  j["first_divergence"] = diverged ? nlohmann::ordered_json(*diverged) : nlohmann::ordered_json(nullptr);
  j["bleu4"] = json_number(bleu);
  // Generated text need not be UTF-8 (a byte model's bytes, a BPE token cut inside a
  // character): such bytes are written as U+FFFD; the ids are exact.
  const std::string document = j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  if (!out.empty()) write_file_atomic(out, document);
  if (json) {
    std::fputs(document.c_str(), stdout);
    return kExitOk;
  }

  std::printf("model: %s\n  %s\n", cfg.dir.string().c_str(), cfg.summary().c_str());
  std::printf("backend: %s (%s%s%s)%s\n", backend_name(backend.choice.used), backend.choice.reason.c_str(),
              backend.choice.device.empty() ? "" : ": ", backend.choice.device.c_str(),
              backend.precision_note().c_str());
  std::printf("prompt: %lld tokens (tokenizer %s)\n", static_cast<long long>(P), tokenizer->name().c_str());
  std::printf("%s\n", joined(display_cells(prompt)).c_str());
  if (built) {
    std::printf("plan: %s\n  built from the exact run of %s (%lld tokens); %.4f bits per element after the prompt, "
                "%.4f at the cache's longest (%lld tokens)\n",
                plan_text.c_str(), plan_origin.c_str(), static_cast<long long>(plan_tokens), bpe_prompt, bpe_longest,
                static_cast<long long>(std::max<int64_t>(longest, P)));
    if (marker) {
      const std::optional<int64_t> at = switch_at(quant);
      std::printf("  phases switch where the marker (id %lld) is: %s; the bits per element place the switch where "
                  "the plan's text had it (token %lld)\n",
                  static_cast<long long>(*marker),
                  marker_in_prompt ? "in the prompt"
                  : at ? ("at new token " + std::to_string(*at) + " of the quantized continuation").c_str()
                       : "not generated by the quantized continuation (all of it in the first phase)",
                  static_cast<long long>(built->plan.phase_boundary().value_or(-1)));
    }
    if (prefill_replaced)
      std::printf("  the prompt is the prefill: its %lld tokens run exact before the cache is written (the plan's "
                  "prefill of %lld tokens is not used)\n",
                  static_cast<long long>(P), static_cast<long long>(built->plan.prefill()));
  } else
    std::printf("plan: exact (no --format or --strategy: both continuations use the exact cache)\n");
  std::printf("sampling: %s; at most %lld new tokens, %s\n\n", sampling.describe().c_str(),
              static_cast<long long>(max_new_tokens),
              eos.empty() ? "not stopping at EOS" : ("stopping at EOS (id " + join_ids(eos) + ")").c_str());
  const std::string exact_title = heading("exact cache", exact);
  const std::string quant_title = heading(built ? "quantized cache" : "exact cache again", quant);
  const std::vector<std::string> exact_cells = continuation_cells(exact, *tokenizer, diverged);
  const std::vector<std::string> quant_cells = continuation_cells(quant, *tokenizer, diverged);
  const int columns = width_arg > 0 ? static_cast<int>(width_arg) : terminal_columns();
  if (layout == "side" || (layout == "auto" && columns >= 80)) {
    print_side_by_side(exact_title, exact_cells, quant_title, quant_cells, columns > 0 ? columns : 100);
  } else {
    std::printf("--- %s ---\n%s\n--- %s ---\n%s\n", exact_title.c_str(), joined(exact_cells).c_str(),
                quant_title.c_str(), joined(quant_cells).c_str());
  }
  std::printf("\ntoken match: %.4f (%lld of the exact continuation's %zu tokens at the same position)", match,
              static_cast<long long>(matching), exact.ids.size());
  if (diverged)
    std::printf("; first divergence at new token %lld (▸)\n", static_cast<long long>(*diverged));
  else
    std::printf("; identical continuations\n");
  if (bleu_defined)
    std::printf("BLEU-4 of the quantized continuation against the exact one: %.4f\n", bleu);
  else
    std::printf("BLEU-4: undefined (a continuation of fewer than 4 tokens has no 4-gram)\n");
  if (!out.empty()) std::printf("wrote %s\n", out.c_str());
  return kExitOk;
}

}  // namespace kvb::cli
