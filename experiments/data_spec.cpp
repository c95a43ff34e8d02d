#include "experiments/data_spec.h"

#include <algorithm>
#include <fnmatch.h>
#include <regex>
#include <tuple>

#include "kvb/build_config.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/model/layer_selection.h"

namespace kvb {

std::filesystem::path resolve_data_path(const std::string& raw, const std::filesystem::path& config,
                                        const std::string& where) {
  const std::filesystem::path p(raw);
  if (p.is_absolute()) return p;
  const std::vector<std::filesystem::path> tries = {
      std::filesystem::current_path() / p, config.parent_path() / p, std::filesystem::path(KVB_SOURCE_DIR) / p};
  for (const auto& t : tries)
    if (std::filesystem::exists(t)) return std::filesystem::weakly_canonical(t);
  std::vector<std::string> looked;  // each place once (the working directory may be the source tree)
  for (const auto& t : tries) {
    const std::string s = std::filesystem::absolute(t).lexically_normal().string();
    if (std::find(looked.begin(), looked.end(), s) == looked.end()) looked.push_back(s);
  }
  throw ConfigError(where + ": data path '" + raw + "' not found (looked in " + join(looked, ", ") + ")");
}

namespace {

// A list of data paths (data.recordings, data.texts, data.token_files): an array of
// strings, each resolved as resolve_data_path does; an entry whose file name holds a
// glob ('*', '?', '[') stands for the files of its folder that match it, sorted. Errors
// name the entry's index: "file:line: data.recordings[1]: ...".
std::vector<std::filesystem::path> data_path_list(const ConfigTable& t, std::string_view key,
                                                  const std::filesystem::path& config) {
  const toml::node* n = t.node(key);
  const toml::array* a = n ? n->as_array() : nullptr;
  if (!a) t.fail(key, "expected an array of paths, got " + toml_type_with_article(*n));
  if (a->empty()) t.fail(key, "an empty list names no sequence; give at least one path");
  std::vector<std::filesystem::path> out;
  std::vector<size_t> index_of;  // the entry each path came from
  for (size_t i = 0; i < a->size(); ++i) {
    const std::string where = t.where(key) + "[" + std::to_string(i) + "]";
    const std::optional<std::string> raw = (*a)[i].value<std::string>();
    if (!raw || raw->empty())
      throw ConfigError(where + ": expected a path (a non-empty string), got " + toml_type_with_article((*a)[i]));
    const std::filesystem::path p(*raw);
    const std::string name = p.filename().string();
    if (name.find_first_of("*?[") == std::string::npos) {
      out.push_back(resolve_data_path(*raw, config, where));
      if (!std::filesystem::exists(out.back()))  // an absolute path is not looked up: checked here
        throw ConfigError(where + ": data path '" + *raw + "' not found");
      index_of.push_back(i);
      continue;
    }
    const std::string dir_raw = p.has_parent_path() ? p.parent_path().string() : ".";
    if (dir_raw.find_first_of("*?[") != std::string::npos)
      throw ConfigError(where + ": '" + *raw + "': only the file name may hold a glob, not its folders");
    const std::filesystem::path dir = resolve_data_path(dir_raw, config, where);
    std::vector<std::filesystem::path> matches;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
      if (fnmatch(name.c_str(), entry.path().filename().c_str(), 0) == 0 && !entry.is_directory())
        matches.push_back(std::filesystem::weakly_canonical(entry.path()));
    if (ec) throw ConfigError(where + ": cannot list " + dir.string() + " for '" + *raw + "': " + ec.message());
    if (matches.empty()) throw ConfigError(where + ": '" + *raw + "' matches no file in " + dir.string());
    std::sort(matches.begin(), matches.end());
    for (auto& m : matches) {
      out.push_back(std::move(m));
      index_of.push_back(i);
    }
  }
  // The same file twice would count one sequence as two independent ones.
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (std::filesystem::equivalent(out[i], out[j]))
        throw ConfigError(t.where(key) + "[" + std::to_string(index_of[i]) + "]: " + out[i].string() +
                          " is listed already (entry " + std::to_string(index_of[j]) +
                          "): each sequence once, or the interval would count it as two");
  return out;
}

SyntheticSpec parse_synthetic(const ConfigTable& t, uint64_t seed) {
  SyntheticSpec s;
  const int64_t own_seed = t.integer("seed", static_cast<int64_t>(seed));
  if (own_seed < 0) t.fail("seed", "must be >= 0");
  s.seed = static_cast<uint64_t>(own_seed);
  s.layers = t.integer("layers", s.layers);
  s.q_heads = t.integer("q_heads", s.q_heads);
  s.kv_heads = t.integer("kv_heads", s.q_heads);  // default: one KV head per query head
  s.head_dim = t.integer("head_dim", s.head_dim);
  s.tokens = t.integer("tokens", s.tokens);
  s.entropy_mean = t.real("entropy_mean", s.entropy_mean);
  s.entropy_spread = t.real("entropy_spread", s.entropy_spread);
  s.sink_tokens = t.integer("sink_tokens", s.sink_tokens);
  s.sink_heads = t.integer("sink_heads", s.sink_heads);
  s.sink_mass = t.real("sink_mass", s.sink_mass);
  s.recency = t.real("recency", s.recency);
  s.recency_scale = t.real("recency_scale", s.recency_scale);
  s.outlier_channels = t.integer("outlier_channels", s.outlier_channels);
  s.outlier_scale = t.real("outlier_scale", s.outlier_scale);
  s.rope = t.boolean("rope", s.rope);
  s.rope_theta = t.real("rope_theta", s.rope_theta);
  s.phase_fraction = t.real("phase_fraction", s.phase_fraction);
  s.rho_first = t.real("rho_first", s.rho_first);
  s.rho_second = t.real("rho_second", s.rho_second);
  s.phase_marker = t.integer("phase_marker", s.phase_marker);
  s.sink_layers = t.integer("sink_layers", s.sink_layers);
  s.calibration_queries = t.integer("calibration_queries", s.calibration_queries);
  s.key_scale = t.real("key_scale", s.key_scale);
  s.value_scale = t.real("value_scale", s.value_scale);
  try {
    validate_synthetic_spec(s);  // now, with the config location
  } catch (const SyntheticSpecError& e) {
    if (t.has(e.field)) t.fail(e.field, e.why);
    t.fail("", e.field + ": " + e.why);
  }
  return s;
}

// Why a context needs 2 tokens (as synthetic data and `kvbudget eval` do). With 2, the
// query at position 1 sees 2 keys and its attention can change; evaluated positions
// that leave it out (position 0 alone) and a top-k that covers every key are refused
// after the data is loaded, by check_attention_rows.
constexpr const char* kOneTokenContext =
    "1 keeps a single token, whose query attends to itself alone: attention KL would be 0 and top-k overlap 1 "
    "whatever the cache holds, and no next token is left to predict; keep at least 2 tokens (0 keeps every token)";


}  // namespace

DataSpec parse_data(const ConfigTable& t, const std::filesystem::path& config, uint64_t seed) {
  DataSpec d;
  d.where = t.where();
  const auto synth = t.opt_table("synthetic");
  const std::string source = t.string("source", synth ? "synthetic" : "file");
  d.max_tokens = t.integer("max_tokens", 0);
  if (d.max_tokens < 0) t.fail("max_tokens", "must be >= 0 (0 keeps every token)");
  if (d.max_tokens == 1) t.fail("max_tokens", kOneTokenContext);
  if (t.has("stream_layers")) {
    d.stream_layers = t.boolean("stream_layers", false);
    d.stream_layers_where = t.where("stream_layers");
  }
  if (source == "synthetic") {
    if (!synth) t.fail("source", "source = \"synthetic\" needs a [data.synthetic] table");
    d.source = DataSpec::Source::Synthetic;
    d.synthetic = parse_synthetic(*synth, seed);
    if (synth->has("seeds")) {  // several synthetic sequences, one per seed
      if (synth->has("seed")) synth->fail("seeds", "give `seed` (one sequence) or `seeds` (several), not both");
      std::vector<int64_t> seeds;
      const toml::node* n = synth->node("seeds");
      if (!n->is_array() || n->as_array()->empty())
        synth->fail("seeds", "expected a non-empty array of seeds (integers >= 0)");
      seeds = synth->int_list("seeds");
      for (size_t i = 0; i < seeds.size(); ++i) {
        if (seeds[i] < 0) synth->fail("seeds", "seeds[" + std::to_string(i) + "] must be >= 0");
        for (size_t j = 0; j < i; ++j)
          if (seeds[j] == seeds[i])
            synth->fail("seeds", "seeds[" + std::to_string(i) + "] = " + std::to_string(seeds[i]) +
                                     " is listed already: each sequence once");
        d.sequence_seeds.push_back(static_cast<uint64_t>(seeds[i]));
      }
      d.synthetic.seed = d.sequence_seeds.front();
      d.sequences_where = synth->where("seeds");
    }
    for (const char* k : {"path", "recordings", "query", "key", "value"})
      if (t.has(k)) t.fail(k, "not used with synthetic data; remove it or drop [data.synthetic]");
    return d;
  }
  if (source == "model") {
    if (synth) t.fail("synthetic", "[data.synthetic] given but source = \"model\"");
    for (const char* k : {"path", "recordings", "query", "key", "value", "key_pre_rope", "attn_output", "token_ids", "layout",
                          "attn_output_layout", "layers", "rope_theta"})
      if (t.has(k)) t.fail(k, "not used with source = \"model\" (the recording comes from the model's own run)");
    d.source = DataSpec::Source::Model;
    ModelDataSpec& m = d.model;
    m.checkpoint = resolve_data_path(t.required_string("model"), config, t.where("model"));
    // One text (text, token_file) or several (texts, token_files): exactly one key.
    const char* given = nullptr;
    for (const char* k : {"text", "token_file", "texts", "token_files"}) {
      if (!t.has(k)) continue;
      if (given) t.fail(k, std::string("give exactly one of `text`, `token_file`, `texts` and `token_files` (`") +
                               given + "` is given too)");
      given = k;
    }
    if (!given) t.fail("text", "give exactly one of `text`, `token_file`, `texts` and `token_files`");
    const std::string which = given;
    const bool has_ids = which == "token_file" || which == "token_files";
    if (which == "texts" || which == "token_files") {
      d.sequence_paths = data_path_list(t, which, config);
      d.sequences_where = t.where(which);
      (has_ids ? m.tokens.token_file : m.tokens.text) = d.sequence_paths.front();
    } else if (!has_ids) {
      m.tokens.text = resolve_data_path(t.required_string("text"), config, t.where("text"));
    } else {
      m.tokens.token_file = resolve_data_path(t.required_string("token_file"), config, t.where("token_file"));
    }
    for (const char* k : {"tokenizer", "add_bos"})
      if (has_ids && t.has(k)) t.fail(k, "only used with `text` (a token_file's ids are used as written)");
    const std::string tokenizer = t.string("tokenizer", "bytes");
    if (tokenizer != "bytes") m.tokens.tokenizer = resolve_data_path(tokenizer, config, t.where("tokenizer")).string();
    if (t.has("add_bos")) m.tokens.add_bos = t.boolean("add_bos", true);
    d.max_tokens = t.integer("max_tokens", 512);
    if (d.max_tokens < 0) t.fail("max_tokens", "must be >= 0 (0 keeps every token)");
    if (d.max_tokens == 1) t.fail("max_tokens", kOneTokenContext);
    m.tokens.max_tokens = d.max_tokens;
    m.continuations.count = t.integer("continuations", 4);
    m.continuations.prompt = t.integer("continuation_prompt", m.continuations.prompt);
    m.continuations.tokens = t.integer("continuation_tokens", m.continuations.tokens);
    if (m.continuations.count < 0) t.fail("continuations", "must be >= 0");
    if (m.continuations.prompt < 1) t.fail("continuation_prompt", "must be >= 1 token");
    if (m.continuations.tokens < 1) t.fail("continuation_tokens", "must be >= 1 token");
    if (d.max_tokens > 0 && m.continuations.count > 0 && m.continuations.prompt + m.continuations.tokens > d.max_tokens)
      t.fail("continuation_prompt", "continuation_prompt + continuation_tokens (" +
                                        std::to_string(m.continuations.prompt + m.continuations.tokens) +
                                        ") exceeds max_tokens " + std::to_string(d.max_tokens));
    // quantize_layers: "all", "full", "sliding", "0,2,5-7", or a list of indices;
    // resolved now against config.json (its layer types), before anything runs.
    if (t.has("quantize_layers")) {
      const toml::node* n = t.node("quantize_layers");
      std::string text;
      if (n->is_string()) {
        text = t.required_string("quantize_layers");
      } else if (n->is_array() || n->is_integer()) {
        for (int64_t l : t.int_list("quantize_layers")) text += (text.empty() ? "" : ",") + std::to_string(l);
      } else {
        t.fail("quantize_layers", "expected \"all\", \"full\", \"sliding\", \"0,2,5-7\" or a list of layer indices");
      }
      m.quantize_layers_where = t.where("quantize_layers");
      try {
        m.quantize_layers = parse_layer_selection(text, load_model_config(m.checkpoint), "quantize_layers");
        m.other_layers_format = make_format(t.string("other_layers_format", kDefaultKeptLayerFormat));
      } catch (const Error& e) {  // a bad selection, config.json or format
        throw ConfigError(m.quantize_layers_where + ": " + e.what());
      }
    } else if (t.has("other_layers_format")) {
      t.fail("other_layers_format", "only used with quantize_layers");
    }
    m.windows.n_ctx = t.integer("n_ctx", 0);
    if (m.windows.n_ctx < 0 || m.windows.n_ctx == 1)
      t.fail("n_ctx", "must be 0 (one window of every token) or >= 2 tokens per window");
    m.windows.score = parse_score_rule(t.string("score", "all"), t.where("score"));
    if (m.windows.score == ScoreRule::SecondHalf && m.windows.n_ctx == 0)
      t.fail("score", "\"second_half\" needs windows: set n_ctx");
    if (m.windows.n_ctx > 0 && m.continuations.count > 0 &&
        m.continuations.prompt + m.continuations.tokens > m.windows.n_ctx)
      t.fail("continuation_prompt", "continuation_prompt + continuation_tokens (" +
                                        std::to_string(m.continuations.prompt + m.continuations.tokens) +
                                        ") exceeds n_ctx " + std::to_string(m.windows.n_ctx) +
                                        " (continuations are prefixes of the first window)");
    return d;
  }
  if (source != "file")
    t.fail("source", "must be \"file\", \"synthetic\" or \"model\", got \"" + source + "\"");
  if (synth) t.fail("synthetic", "[data.synthetic] given but source = \"file\"");
  d.source = DataSpec::Source::File;
  RecordingSpec& r = d.file;
  if (t.has("path") && t.has("recordings"))
    t.fail("recordings", "give `path` (one recording) or `recordings` (several), not both");
  if (t.has("recordings")) {
    d.sequence_paths = data_path_list(t, "recordings", config);
    d.sequences_where = t.where("recordings");
    r.path = d.sequence_paths.front();
  } else {
    r.path = resolve_data_path(t.required_string("path"), config, t.where("path"));
  }
  r.query = t.string("query", r.query);
  r.key = t.string("key", r.key);
  r.value = t.string("value", r.value);
  r.key_pre_rope = t.string("key_pre_rope", r.key_pre_rope);
  r.attn_output = t.string("attn_output", r.attn_output);
  r.token_ids = t.string("token_ids", r.token_ids);
  r.key_pre_rope_required = t.has("key_pre_rope");
  r.attn_output_required = t.has("attn_output");
  r.token_ids_required = t.has("token_ids");
  r.layout = t.string("layout", r.layout);
  r.attn_output_layout = t.string("attn_output_layout", r.attn_output_layout);
  for (const auto& [key, text, for_attn_output] : {std::tuple{"layout", &r.layout, false},
                                                    std::tuple{"attn_output_layout", &r.attn_output_layout, true}}) {
    try {
      check_layout(*text, key, for_attn_output);
    } catch (const ConfigError& e) {  // located at its key
      t.fail(key, e.what());
    }
  }
  if (t.has("layers") && t.int_list("layers").empty())
    t.fail("layers", "an empty list selects no layer; leave `layers` out to load every layer");
  for (int64_t l : t.int_list("layers")) {
    if (l < 0 || l > INT32_MAX) t.fail("layers", "layer index " + std::to_string(l) + " is not in [0, 2^31)");
    r.layers.push_back(static_cast<int>(l));
  }
  r.max_tokens = d.max_tokens;
  if (auto theta = t.opt_real("rope_theta")) {
    if (!(*theta > 0)) t.fail("rope_theta", "must be > 0");
    r.rope_theta = *theta;
  }
  for (const auto& [key, pattern] : {std::pair{"query", &r.query}, std::pair{"key", &r.key}, std::pair{"value", &r.value},
                                     std::pair{"key_pre_rope", &r.key_pre_rope},
                                     std::pair{"attn_output", &r.attn_output}})
    if (pattern->find("{layer}") == std::string::npos)
      t.fail(key, "tensor name pattern '" + *pattern + "' has no {layer} placeholder");
  return d;
}

// [task]: an answer task for the model of [data] (configs/README.md).
void parse_task(const ConfigTable& t, const std::filesystem::path& config, DataSpec& data) {
  if (data.source != DataSpec::Source::Model)
    throw ConfigError(t.where() + ": an answer task runs a model; it needs [data] source = \"model\"");
  ModelDataSpec& m = data.model;
  AnswerTaskSpec task;
  task.file = resolve_data_path(t.required_string("file"), config, t.where("file"));
  if (!std::filesystem::exists(task.file)) t.fail("file", task.file.string() + ": no such task file");
  task.answer_regex = t.required_string("answer_regex");
  if (task.answer_regex.empty()) t.fail("answer_regex", "is empty: give the pattern that finds the answer");
  try {
    const std::regex check(task.answer_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    t.fail("answer_regex", "/" + task.answer_regex + "/ does not compile: " + e.what());
  }
  if (t.has("answer_after")) task.answer_after = t.integer("answer_after", 0);
  if (task.answer_after && *task.answer_after < 0) t.fail("answer_after", "must be a token id >= 0");
  task.max_new_tokens = t.integer("max_new_tokens", task.max_new_tokens);
  if (task.max_new_tokens < 1) t.fail("max_new_tokens", "must be >= 1");
  task.max_problems = t.integer("max_problems", 0);
  if (task.max_problems < 0) t.fail("max_problems", "must be >= 0 (0 = all)");
  task.problem_prefix = t.string("problem_prefix", "");
  task.tokenizer = m.tokens.tokenizer;
  task.add_bos = m.tokens.add_bos;
  m.task = task;
  m.task_where = t.where("file");
}

// Model-level metrics need a model data source, those of greedy continuations need
// continuations, and those of an answer task a [task].
void check_metric_source(const MetricDef& def, const DataSpec& data, const std::string& where) {
  if (def.level != MetricLevel::Model) return;
  if (data.source != DataSpec::Source::Model)
    throw ConfigError(where + ": '" + def.name + "' is a model-level metric; it needs [data] source = \"model\"");
  if (def.needs_task && !data.model.task)
    throw ConfigError(where + ": '" + def.name + "' scores an answer task's answers; name one in [task] (file, answer_regex)");
  if (def.needs_continuations && data.model.continuations.count == 0)
    throw ConfigError(where + ": '" + def.name + "' compares greedy continuations, but [data] continuations = 0");
  if (!def.defined_for(data.model.continuations.count, data.model.continuations.tokens))
    throw ConfigError(where + ": '" + def.name + "' needs continuations of at least " +
                      std::to_string(def.min_continuation_tokens) + " tokens, but [data] continuation_tokens = " +
                      std::to_string(data.model.continuations.tokens));
}

std::vector<DataSpec> expand_sequences(const DataSpec& data) {
  if (data.sequence_paths.empty() && data.sequence_seeds.empty()) return {data};
  std::vector<DataSpec> out;
  for (size_t s = 0; s < data.sequence_count(); ++s) {
    DataSpec one = data;
    one.sequence_paths.clear();
    one.sequence_seeds.clear();
    if (!data.sequence_seeds.empty()) {
      one.synthetic.seed = data.sequence_seeds[s];
    } else if (data.source == DataSpec::Source::Model) {
      (data.model.tokens.text.empty() ? one.model.tokens.token_file : one.model.tokens.text) = data.sequence_paths[s];
    } else {
      one.file.path = data.sequence_paths[s];
    }
    out.push_back(std::move(one));
  }
  return out;
}

std::string sequence_source(const DataSpec& one) {
  switch (one.source) {
    case DataSpec::Source::Synthetic: return "synthetic seed " + std::to_string(one.synthetic.seed);
    case DataSpec::Source::Model:
      return (one.model.tokens.text.empty() ? one.model.tokens.token_file : one.model.tokens.text).string();
    case DataSpec::Source::File: break;
  }
  return one.file.path.string();
}

}  // namespace kvb
