#include "experiments/experiment.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fnmatch.h>
#include <numeric>
#include <regex>
#include <sstream>
#include <tuple>

#include "experiments/model_backend.h"
#include "kvb/build_config.h"
#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"
#include "sim/model/layer_selection.h"
#include "sim/strategies/budget.h"
#include "sim/strategies/presets.h"

namespace kvb {

namespace {

// parse_range() with its errors (overflow, too many values) located at `key` of `t`.
std::optional<std::vector<ParamValue>> parse_range_at(const ConfigTable& t, std::string_view key,
                                                      const std::string& text) {
  try {
    return parse_range(text);
  } catch (const ConfigError& e) {
    t.fail(key, e.what());
  }
}

// A string that starts with a number and holds "..": meant as a range (no format,
// preset or keyword starts with a digit).
bool looks_like_range(const std::string& s) {
  static const std::regex re(R"(^\s*[-+]?[0-9.][^{}]*\.\.)");
  return std::regex_search(s, re);
}

// Relative data paths are looked up from the working directory, then from the
// config file's directory, then from the source tree.
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

DataSpec parse_data(const ConfigTable& t, const std::filesystem::path& config, uint64_t seed) {
  DataSpec d;
  d.where = t.where();
  const auto synth = t.opt_table("synthetic");
  const std::string source = t.string("source", synth ? "synthetic" : "file");
  d.max_tokens = t.integer("max_tokens", 0);
  if (d.max_tokens < 0) t.fail("max_tokens", "must be >= 0 (0 keeps every token)");
  if (d.max_tokens == 1) t.fail("max_tokens", kOneTokenContext);
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

// A config value -> candidate parameter values (an array is an axis; a numeric range
// string is an axis; anything else is one value).
std::vector<ParamValue> values_of(const ConfigTable& t, const std::string& key, bool allow_range) {
  const toml::node* n = t.node(key);
  auto scalar = [&](const toml::node& v) -> ParamValue {
    if (v.is_boolean()) return *v.value<bool>();
    if (v.is_integer()) return *v.value<int64_t>();
    if (v.is_floating_point()) return *v.value<double>();
    if (v.is_string()) return *v.value<std::string>();
    t.fail(key, "expected a string, number or boolean (or an array of them), got " + toml_type_with_article(v));
  };
  if (const toml::array* a = n->as_array()) {
    std::vector<ParamValue> out;
    for (const toml::node& e : *a) out.push_back(scalar(e));
    if (out.empty()) t.fail(key, "empty array: a sweep axis needs at least one value");
    return out;
  }
  ParamValue v = scalar(*n);
  const std::string* s = std::get_if<std::string>(&v);
  if (!allow_range || !s) return {v};
  if (auto r = parse_range_at(t, key, *s)) {
    if (r->empty()) t.fail(key, "range '" + *s + "' is empty (LO..HI:STEP needs LO <= HI and STEP > 0)");
    return *r;
  }
  if (looks_like_range(*s))
    t.fail(key, "'" + *s + "' is not a range: write LO..HI or LO..HI:STEP with numbers and a positive STEP "
                "(\"2..8\", \"0.25..1:0.25\")");
  return {v};
}

// A config value of an integer-list parameter -> candidate values: an array of
// integers or a range string ("2..8") is one list; an array of arrays is an axis.
std::vector<ParamValue> list_values_of(const ConfigTable& t, const std::string& key) {
  const toml::node* n = t.node(key);
  auto ints = [&](const toml::array& a) {
    IntList out;
    for (const toml::node& e : a) {
      if (!e.is_integer()) t.fail(key, "expected integers, got " + toml_type_with_article(e));
      out.push_back(*e.value<int64_t>());
    }
    return out;
  };
  if (const toml::array* a = n->as_array()) {
    if (!a->empty() && a->front().is_array()) {
      std::vector<ParamValue> axis;
      for (const toml::node& e : *a) {
        if (!e.is_array()) t.fail(key, "an axis of lists must hold only arrays");
        axis.emplace_back(ints(*e.as_array()));
      }
      return axis;
    }
    return {ParamValue(ints(*a))};
  }
  if (n->is_string()) {
    const std::string text = *n->value<std::string>();
    auto r = parse_range_at(t, key, text);
    if (!r || r->empty()) t.fail(key, "expected an array of integers or a range \"2..8\", got \"" + text + "\"");
    IntList out;
    for (const ParamValue& v : *r) {
      if (!std::holds_alternative<int64_t>(v)) t.fail(key, "range '" + text + "' must hold integers");
      out.push_back(std::get<int64_t>(v));
    }
    return {ParamValue(out)};
  }
  t.fail(key, "expected an array of integers (or an array of such arrays for a sweep), got " + toml_type_with_article(*n));
}

// Coerces a value to a parameter's type, or fails naming the key.
ParamValue coerce(const ParamValue& v, const ParamDef& def, const ConfigTable& t, const std::string& key) {
  switch (def.type) {
    case ParamType::Bool:
      if (std::holds_alternative<bool>(v)) return v;
      break;
    case ParamType::Int:
      if (std::holds_alternative<int64_t>(v)) return v;
      break;
    case ParamType::Real:
      if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
      if (const double* d = std::get_if<double>(&v)) {
        if (!std::isfinite(*d)) t.fail(key, "expected a finite number, got " + param_to_string(v));
        return v;
      }
      break;
    case ParamType::String:
      if (std::holds_alternative<std::string>(v)) return v;
      break;
    case ParamType::IntList:
      if (std::holds_alternative<IntList>(v)) return v;
      break;
  }
  t.fail(key, "expected a " + std::string(param_type_name(def.type)) + ", got '" + param_to_string(v) + "'");
}

StrategyBlock parse_strategy(const ConfigTable& t, size_t index) {
  StrategyBlock b;
  b.index = index;
  b.where = t.where();
  // A preset names the type and sets parameters that the block's own override.
  const StrategyPreset* preset = nullptr;
  if (const toml::node* n = t.node("preset")) {
    if (!n->is_string())
      t.fail("preset", "expected one preset name (a string); to compare presets use one [[strategy]] block each");
    preset = &require_strategy_preset(*n->value<std::string>(), t.where("preset"));
    b.preset = preset->name;
  }
  b.type = preset && !t.has("type") ? preset->type : t.required_string("type");
  const StrategyType& type = require_strategy_type(b.type, t.where("type"));
  if (preset && b.type != preset->type)
    t.fail("type", "preset '" + preset->name + "' is a '" + preset->type + "' strategy, not '" + b.type + "'");
  b.label = t.string("name", preset ? preset->name : b.type);
  b.named = t.has("name");
  const std::vector<ParamDef> defs = type.all_params();

  std::vector<std::string> var_names;
  if (auto vars = t.opt_table("vars")) {
    for (const std::string& k : vars->keys()) {
      if (k == "b")
        vars->fail(k, "{b} is reserved for the allocator's width in a format family (family = \"int{b}-asym-g32\"); "
                      "name the variable otherwise");
      Axis a;
      a.name = k;
      a.is_var = true;
      a.where = vars->where(k);
      a.values = values_of(*vars, k, true);
      b.axes.push_back(a);
      var_names.push_back(k);
    }
  }
  std::vector<std::string> param_names;
  for (const ParamDef& def : defs) {
    param_names.push_back(def.name);
    if (!t.has(def.name)) continue;
    Axis a;
    a.name = def.name;
    a.where = t.where(def.name);
    const bool numeric = def.type == ParamType::Int || def.type == ParamType::Real;
    const std::vector<ParamValue> raw =
        def.type == ParamType::IntList ? list_values_of(t, def.name) : values_of(t, def.name, numeric);
    for (const ParamValue& v : raw) a.values.push_back(coerce(v, def, t, def.name));
    // A format parameter naming a preset (format = "kivi-2"): say what it is.
    if (def.name.ends_with("format"))
      for (const ParamValue& v : a.values)
        if (const std::string* s = std::get_if<std::string>(&v))
          if (const std::string hint = preset_not_format_hint(
                  *s, "select it with preset = \"" + *s + "\" (in a [[strategy]] block of its own)");
              !hint.empty())
            t.fail(def.name, "unknown format '" + *s + "'" + hint);
    b.axes.push_back(a);
  }
  if (preset) {
    for (const auto& [name, value] : preset->params) {
      b.preset_values[name] = value;
      // The block's own keys (X also for the preset's key_X / value_X) override it.
      if (preset_value_overridden(type, name, [&](const std::string& k) { return t.has(k); })) continue;
      Axis a;
      a.name = name;
      a.from_preset = true;
      a.where = t.where("preset");
      a.values = {value};
      b.axes.push_back(a);
    }
  }
  // Unknown keys in a strategy are reported with this strategy's parameter list.
  for (const std::string& k : t.keys()) {
    if (k == "type" || k == "name" || k == "vars" || k == "preset") continue;
    if (std::find(param_names.begin(), param_names.end(), k) != param_names.end()) continue;
    std::string msg = "unknown parameter '" + k + "' for strategy type '" + b.type + "'";
    msg += did_you_mean(k, param_names);
    msg += "; `kvbudget strategies` lists the parameters (template variables go under [" + t.path() + ".vars])";
    t.fail(k, msg);
  }
  // Every {var} used in a string parameter must be declared, and every var used;
  // {b} is the allocator's width, filled in by the strategy.
  std::set<std::string> used;
  static const std::regex placeholder(R"(\{([A-Za-z_][A-Za-z0-9_]*)\})");
  for (const Axis& a : b.axes) {
    if (a.is_var) continue;
    for (const ParamValue& v : a.values) {
      const std::string* s = std::get_if<std::string>(&v);
      if (!s) continue;
      for (std::sregex_iterator it(s->begin(), s->end(), placeholder), end; it != end; ++it) {
        const std::string name = (*it)[1];
        if (name == "b") continue;
        if (std::find(var_names.begin(), var_names.end(), name) == var_names.end())
          throw ConfigError(a.where + ": '{" + name + "}' is not declared under [" + t.path() + ".vars]");
        used.insert(name);
      }
    }
  }
  for (const Axis& a : b.axes)
    if (a.is_var && !used.count(a.name))
      throw ConfigError(a.where + ": variable '" + a.name + "' is never used as {" + a.name + "} in a parameter");
  std::sort(b.axes.begin(), b.axes.end(), [](const Axis& x, const Axis& y) { return x.name < y.name; });
  return b;
}

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
  return a;
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

namespace {

// Decimal places of a number as written: "0.25" 2, "1e-3" 3, "2.5e1" 0, "7" 0.
int decimals_written(const std::string& number) {
  const size_t e = number.find_first_of("eE");
  const std::string mantissa = number.substr(0, e);
  const size_t dot = mantissa.find('.');
  const int fraction = dot == std::string::npos ? 0 : static_cast<int>(mantissa.size() - dot - 1);
  const int exponent = e == std::string::npos ? 0 : std::atoi(number.c_str() + e + 1);
  return std::max(0, fraction - exponent);
}

}  // namespace

std::optional<std::vector<ParamValue>> parse_range(const std::string& text) {
  static const std::regex re(R"(^\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*\.\.\s*(-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(?::\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?))?\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return std::nullopt;
  auto is_int = [](const std::string& s) { return s.find_first_of(".eE") == std::string::npos; };
  const std::string a = m[1], b = m[2], st = m[3].matched ? std::string(m[3]) : "1";
  auto too_many = [&](const std::string& count) {
    return ConfigError("range '" + text + "' has " + count + " values, more than " + std::to_string(kMaxRangeValues));
  };
  std::vector<ParamValue> out;
  if (is_int(a) && is_int(b) && is_int(st)) {
    int64_t lo = 0, hi = 0, step = 0;
    try {
      lo = std::stoll(a), hi = std::stoll(b), step = std::stoll(st);
    } catch (const std::out_of_range&) {
      throw ConfigError("range '" + text + "': a number is outside the 64-bit integer range");
    }
    if (step <= 0 || hi < lo) return std::vector<ParamValue>{};
    const __int128 count = (static_cast<__int128>(hi) - lo) / step + 1;  // no overflow
    if (count > kMaxRangeValues) throw too_many(format_double(static_cast<double>(count)));
    for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.emplace_back(lo + i * step);
    return out;
  }
  const double lo = std::strtod(a.c_str(), nullptr), hi = std::strtod(b.c_str(), nullptr),
               step = std::strtod(st.c_str(), nullptr);
  if (!std::isfinite(lo) || !std::isfinite(hi) || !std::isfinite(step))
    throw ConfigError("range '" + text + "': a number is outside the double range");
  if (!(step > 0) || hi < lo) return std::vector<ParamValue>{};
  const double count = std::floor((hi - lo) / step + 1e-9) + 1;
  if (!(count <= static_cast<double>(kMaxRangeValues))) throw too_many(format_double(count));
  // lo + i·step rounded to the decimals LO and STEP are written with drops binary
  // noise (0.1 + 2·0.1 is 0.30000000000000004; -0.3 + 3·0.1 is 5.6e-17), so values
  // and point keys read as the range was written.
  const int decimals = std::max(decimals_written(a), decimals_written(st));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
    const double v = lo + static_cast<double>(i) * step;
    if (decimals > 340) {
      out.emplace_back(v);
      continue;
    }
    std::vector<char> text(static_cast<size_t>(decimals) + 330);
    std::snprintf(text.data(), text.size(), "%.*f", decimals, v);
    out.emplace_back(std::strtod(text.data(), nullptr) + 0.0);  // + 0.0: no -0
  }
  return out;
}

const std::vector<std::string>& memory_columns() {
  static const std::vector<std::string> columns = {"bpe", "bpe_target", "bytes", "bytes_target"};
  return columns;
}

BudgetQuery parse_budget_query(const std::string& text, const std::string& where) {
  static const std::regex re(R"(^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw ConfigError(where + ": budget query '" + text +
                      "' should look like 'attn_kl_mean <= 1e-3' (least memory meeting an error budget) or "
                      "'bpe <= 4' / 'bytes <= 1e6' (least error within a memory budget)");
  const std::string op = m[2];
  if (op == "<" || op == ">")
    throw ConfigError(where + ": budget query '" + text + "': strict '" + op +
                      "' is not supported; budgets are inclusive, write '" + op + "='");
  BudgetQuery q;
  q.text = text;
  q.lhs = m[1];
  q.upper = op[0] == '<';
  const std::string number = m[3];
  char* end = nullptr;
  q.bound = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(q.bound)) {
    throw ConfigError(where + ": budget query '" + text + "': '" + number + "' is not a finite number");
  }
  q.memory = std::find(memory_columns().begin(), memory_columns().end(), q.lhs) != memory_columns().end();
  if (q.memory) {
    if (!q.upper) throw ConfigError(where + ": memory budget '" + text + "' must be an upper bound (<=)");
    if (!(q.bound > 0)) throw ConfigError(where + ": memory budget '" + text + "' must be > 0: no cache fits in it");
  } else {
    const MetricDef& def = require_metric(q.lhs, where + ": budget query '" + text + "'");
    if ((def.better == Better::Lower) != q.upper)
      throw ConfigError(where + ": budget query '" + text + "': " + q.lhs + " is better when " +
                        (def.better == Better::Lower ? "lower; use <=" : "higher; use >="));
  }
  return q;
}

void add_budget_query(ExperimentSpec& spec, const std::string& text, const std::string& where) {
  BudgetQuery q = parse_budget_query(text, where);
  if (q.memory && spec.metrics.pareto.empty())
    throw ConfigError(where + ": budget query '" + text +
                      "' asks for the least error within a memory budget, for each metrics.pareto metric, but "
                      "metrics.pareto is empty: name the error metric(s) to minimise there");
  if (!q.memory) {
    // An error budget reads its metric from every point: it must be measurable on this
    // data and reported, which is checked now, before any work.
    const std::string at = where + ": budget query '" + text + "'";
    check_metric_source(require_metric(q.lhs, at), spec.data, at);
    std::vector<std::string>& report = spec.metrics.report;
    if (std::find(report.begin(), report.end(), q.lhs) == report.end()) {
      report.push_back(q.lhs);
      std::vector<std::string> ordered;  // table order, as parse_metrics leaves it
      for (const MetricDef& d : metric_table())
        if (std::find(report.begin(), report.end(), d.name) != report.end()) ordered.push_back(d.name);
      report = ordered;
    }
  }
  spec.budgets.push_back(std::move(q));
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

ExperimentSpec parse_experiment(std::shared_ptr<ConfigDoc> doc) {
  ExperimentSpec e;
  ConfigTable root = doc->root();
  e.config_path = doc->file();
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

  auto data = root.opt_table("data");
  if (!data) throw ConfigError(doc->file().string() + ": missing [data] table (a recording path or [data.synthetic])");
  e.data = parse_data(*data, doc->file(), e.seed);
  if (auto task = root.opt_table("task")) parse_task(*task, doc->file(), e.data);

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

std::shared_ptr<const ModelEvaluator> build_model_evaluator(const DataSpec& data, BackendRequest backend) {
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
    } catch (const ConfigError& e) {
      throw ConfigError(m.task_where + ": " + e.what());
    }
  }
  ModelEvalOptions options;
  options.windows = m.windows;
  const ModelBackend forward = make_model_backend(model, backend, "backend");
  if (forward.choice.used == Backend::Cuda)
    std::fprintf(stderr, "kvbudget: model forward pass on cuda (%s)%s\n", forward.choice.device.c_str(),
                 task ? "; the task's problems on the CPU" : "");
  options.backend = forward.forward;
  return std::make_shared<const ModelEvaluator>(std::move(model), std::move(tokens), m.continuations, source,
                                                std::move(task), std::move(options));
}

void check_model_metric_positions(const ExperimentSpec& spec, const QueryPositions& positions, int64_t T) {
  if (std::any_of(positions.evaluation.begin(), positions.evaluation.end(), [&](int64_t t) { return t + 1 < T; }))
    return;
  for (const std::string& name : spec.metrics.report) {
    const MetricDef& m = require_metric(name, "metrics.report");
    if (m.level == MetricLevel::Model && !m.needs_continuations)
      throw ConfigError(spec.metrics.positions_where + ": '" + name + "' predicts token t + 1 at each evaluated " +
                        "position t, but no evaluated position lies below " + std::to_string(T - 1) +
                        " (the last token has nothing to predict)");
  }
}

void check_attention_rows(const ExperimentSpec& spec, const QueryPositions& positions, int64_t T) {
  const auto& report = spec.metrics.report;
  auto reported = [&](const std::string& name) { return std::find(report.begin(), report.end(), name) != report.end(); };
  const int64_t keys = positions.evaluation.back() + 1;  // of the longest evaluated row
  if (keys == 1) {  // position 0 alone: softmax over one key is 1 with any cache
    for (const char* name : {"attn_kl_mean", "attn_kl_p99", "attn_kl_max", "topk_overlap"}) {
      if (!reported(name)) continue;
      throw ConfigError(spec.metrics.positions_where + ": the evaluated positions (" + positions.evaluation_text +
                        ") of the " + std::to_string(T) + "-token context are position 0 alone, whose query sees one "
                        "key: " + name + " would be " + (std::string(name) == "topk_overlap" ? "1" : "0") +
                        " whatever the cache holds; evaluate a later position (more tokens with data.max_tokens, "
                        "other metrics.positions or calibration positions)");
    }
    return;
  }
  if (!reported("topk_overlap") || spec.metrics.topk < keys) return;
  const std::string longest = keys == T ? "the context has " + std::to_string(T) + " tokens"
                                        : "the last evaluated position " + std::to_string(keys - 1) + " of the " +
                                              std::to_string(T) + "-token context sees " + std::to_string(keys) + " keys";
  throw ConfigError(spec.metrics.topk_where + " = " + std::to_string(spec.metrics.topk) + ", but " + longest +
                    ": the top " + std::to_string(spec.metrics.topk) +
                    " keys of every evaluated query are all its keys, so topk_overlap would be 1 whatever the cache "
                    "holds; set metrics.topk below " + std::to_string(keys) + " (or leave topk_overlap out of "
                    "metrics.report)");
}

bool AttributionSpec::selects(size_t id) const {
  if (select == Select::All) return true;
  if (select == Select::None) return false;
  return std::find(ids.begin(), ids.end(), static_cast<int64_t>(id)) != ids.end();
}

QueryPositions resolve_positions(const ExperimentSpec& spec, int64_t T) {
  QueryPositions q;
  const CalibrationSpec& c = spec.calibration;
  if (c.explicit_positions) {
    // Positions past the recording are dropped; none left fails only the points that
    // need statistics (RecordingStats::require_calibration), as an offset past T does.
    for (int64_t p : c.positions)
      if (p < T) q.calibration.push_back(p);
  } else {
    for (int64_t p = c.offset; p < T; p += c.stride) q.calibration.push_back(p);
  }
  auto is_calibration = [&](int64_t p) { return std::binary_search(q.calibration.begin(), q.calibration.end(), p); };
  if (!spec.metrics.positions.empty()) {
    std::vector<int64_t> overlap;
    for (int64_t p : spec.metrics.positions) {
      if (p >= T) continue;
      q.evaluation.push_back(p);
      if (is_calibration(p)) overlap.push_back(p);
    }
    if (q.evaluation.empty())
      throw ConfigError(spec.metrics.positions_where + ": no position is below the recording's " + std::to_string(T) +
                        " tokens");
    if (!overlap.empty() && !c.overlap) {
      std::vector<std::string> shown;
      for (size_t i = 0; i < std::min<size_t>(5, overlap.size()); ++i) shown.push_back(std::to_string(overlap[i]));
      throw ConfigError(spec.metrics.positions_where + ": overlaps the calibration positions (" + c.text + ") at " +
                        join(shown, ", ") +
                        (overlap.size() > 5 ? ", ..." : "") +
                        ": calibration queries must not be evaluated; set calibration.overlap = true to allow it "
                        "(as the research did)");
    }
    q.evaluation_text = spec.metrics.positions_text;
    return q;
  }
  if (spec.metrics.every_position) {  // "all" says every position: the calibration ones too
    q.evaluation.resize(static_cast<size_t>(T));
    std::iota(q.evaluation.begin(), q.evaluation.end(), int64_t{0});
    q.evaluation_text = q.calibration.empty() ? "all" : "all, calibration positions included";
    return q;
  }
  for (int64_t p = 0; p < T; ++p)
    if (c.overlap || !is_calibration(p)) q.evaluation.push_back(p);
  if (q.evaluation.empty())
    throw ConfigError("calibration: every position of the recording's " + std::to_string(T) +
                      " tokens is a calibration position, none is left to evaluate");
  q.evaluation_text = c.overlap ? "all" : "all not used for calibration";
  return q;
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

Recording build_recording(const DataSpec& data) {
  Recording rec;
  if (data.source == DataSpec::Source::Model) {
    rec = build_model_evaluator(data)->recording();
  } else if (data.source == DataSpec::Source::Synthetic) {
    rec = generate_synthetic(data.synthetic);
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

}  // namespace kvb
