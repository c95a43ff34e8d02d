#include "experiments/data_building.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <variant>

#include "experiments/model_backend.h"
#include "experiments/query_positions.h"
#include "sim/core/error.h"

namespace kvb {

namespace {

// A run compares every point with the exact logits [T, vocab]: it holds them in memory
// up to 1/16 of the machine's memory (at least kDefaultHeldBaseLogitsBytes, the bound
// `eval` and Python keep), instead of reading them back from a file for every point (a
// 4096-token window of Llama 3's vocabulary, 2 GiB, is held on a host of 32 GiB or more).
int64_t run_held_base_logits_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const int64_t memory = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  return std::max(kDefaultHeldBaseLogitsBytes, memory / 16);
}

}  // namespace

std::shared_ptr<const ModelEvaluator> build_model_evaluator(const DataSpec& data, BackendRequest backend,
                                                            MatmulPrecision precision) {
  if (data.source != DataSpec::Source::Model) throw Error("internal: build_model_evaluator without a model source");
  const ModelDataSpec& m = data.model;
  std::shared_ptr<const Transformer> model = Transformer::load(m.checkpoint);
  for (const std::string& w : model->load_warnings()) std::fprintf(stderr, "kvbudget: warning: %s\n", w.c_str());
  std::vector<int64_t> tokens = load_tokens(m.tokens, model->config());
  // A learned position table (GPT-2) ends at n_positions: say so before the model runs,
  // naming the key that sets the length.
  const ModelConfig& mc = model->config();
  // The positions a forward pass reaches: a window's length.
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t window = m.windows.n_ctx > 0 ? std::min(T, m.windows.n_ctx) : T;
  if (mc.family == ModelFamily::Gpt2 && window > mc.max_positions)
    throw ConfigError((m.windows.n_ctx > 0 ? "data.n_ctx = " + std::to_string(m.windows.n_ctx)
                                           : "data.max_tokens = " + std::to_string(data.max_tokens)) +
                      " runs " + std::to_string(window) + " tokens at once, more than the " +
                      std::to_string(mc.max_positions) + " positions of " + mc.dir.string() +
                      " (n_positions); set data.max_tokens <= " + std::to_string(mc.max_positions) +
                      ", or evaluate in windows: data.n_ctx <= " + std::to_string(mc.max_positions));
  const std::string warning = model->config().context_warning(window);
  if (!warning.empty()) std::fprintf(stderr, "kvbudget: warning: %s\n", warning.c_str());
  const std::filesystem::path& from = m.tokens.text.empty() ? m.tokens.token_file : m.tokens.text;
  const std::string source = "model " + m.checkpoint.string() + " on " + std::to_string(tokens.size()) +
                             " tokens of " + from.string();
  std::shared_ptr<const AnswerTask> task;
  if (m.task) {
    try {
      task = std::make_shared<const AnswerTask>(*m.task, model->config());
    } catch (ConfigError& e) {
      e.add_context(m.task_where);
      throw;
    }
  }
  ModelEvalOptions options;
  options.windows = m.windows;
  options.max_held_base_bytes = run_held_base_logits_bytes();
  const ModelBackend forward = make_model_backend(model, backend, "backend", precision);
  if (forward.choice.used == Backend::Cuda)
    std::fprintf(stderr, "kvbudget: model forward pass on cuda (%s)%s%s\n", forward.choice.device.c_str(),
                 forward.precision_note().c_str(), task ? "; the task's problems on the CPU" : "");
  options.backend = forward.forward;
  return std::make_shared<const ModelEvaluator>(std::move(model), std::move(tokens), m.continuations, source,
                                                std::move(task), std::move(options));
}

Recording build_recording(const DataSpec& data, const SyntheticKeep& keep) {
  Recording rec;
  if (data.source == DataSpec::Source::Model) {
    rec = build_model_evaluator(data)->recording();
  } else if (data.source == DataSpec::Source::Synthetic) {
    rec = generate_synthetic(data.synthetic, nullptr, keep);
    if (data.max_tokens > 0) rec.truncate_tokens(data.max_tokens);
  } else {
    rec = load_recording(data.file);
    if (rec.tokens < 2)  // a synthetic spec and a model's token count are checked before
      throw Error(data.file.path.string() + ": the recording has " + std::to_string(rec.tokens) +
                  " token: its one query attends to itself alone, so attention KL would be 0 and top-k overlap 1 "
                  "whatever the cache holds; a recording needs at least 2 tokens");
  }
  return rec;
}

namespace {
// Whether a parameter value names a prerope: format (a string, or one in a list).
bool names_prerope(const ParamValue& v) {
  const std::string* text = std::get_if<std::string>(&v);
  return text && text->find("prerope") != std::string::npos;
}
}  // namespace

SyntheticKeep synthetic_keep(const ExperimentSpec& spec, const std::vector<SweepPoint>& points, const DataSpec& data) {
  SyntheticKeep keep;
  if (data.source != DataSpec::Source::Synthetic) return keep;
  const int64_t tokens = data.max_tokens > 0 ? std::min(data.max_tokens, data.synthetic.tokens) : data.synthetic.tokens;
  // Conservative: any parameter mentioning prerope (a format, a family, a width list
  // written as text) keeps the pre-RoPE keys.
  keep.key_pre_rope = false;
  for (const SweepPoint& p : points)
    for (const auto& [name, value] : p.params.values()) keep.key_pre_rope |= names_prerope(value);
  QueryPositions positions;
  try {
    positions = resolve_positions(spec, tokens);
  } catch (const std::exception&) {
    return keep;  // reported where the run resolves them, after loading
  }
  std::vector<int64_t> read = positions.calibration;
  read.insert(read.end(), positions.evaluation.begin(), positions.evaluation.end());
  std::sort(read.begin(), read.end());
  read.erase(std::unique(read.begin(), read.end()), read.end());
  if (static_cast<int64_t>(read.size()) < tokens) keep.query_positions = std::move(read);
  return keep;
}

}  // namespace kvb
