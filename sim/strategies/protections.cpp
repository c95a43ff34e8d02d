#include "sim/strategies/protections.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/core/error.h"
#include "sim/core/strings.h"
#include "sim/formats/registry.h"

namespace kvb {

const std::vector<std::string>& protection_columns() {
  static const std::vector<std::string> columns = {"sink_heads_selected", "sink_tokens_selected"};
  return columns;
}

const std::vector<ParamDef>& protection_params() {
  static const std::vector<ParamDef> params = {
      {"sink_heads", ParamType::Int, "keep the N lowest-entropy KV heads (over all layers) at sink_head_format",
       int64_t{0}, true},
      {"sink_head_threshold", ParamType::Real,
       "instead of a count: keep the KV heads whose entropy (bits) is below this threshold", std::nullopt, true, true},
      {"sink_head_format", ParamType::String, "format of sink heads", std::string("keep-fp16"), true},
      {"sink_tokens", ParamType::Int, "keep N sink tokens at sink_token_format", int64_t{0}, true},
      {"sink_token_select", ParamType::String,
       "\"first\" (the first N positions) or \"attention\" (the N tokens receiving most attention on the calibration "
       "queries)",
       std::string("first")},
      {"sink_token_scope", ParamType::String,
       "with select = \"attention\": \"global\" (one token set, attention summed over all heads) or \"head\" (a set "
       "per "
       "KV head)",
       std::string("global")},
      {"sink_token_format", ParamType::String, "format of sink tokens", std::string("keep-fp16"), true},
      {"window", ParamType::Int, "recency window of the last W tokens, relative to each query; 0 = none", int64_t{0},
       true},
      {"window_format", ParamType::String, "format of window tokens", std::string("keep-fp16"), true},
      {"window_mode", ParamType::String,
       "\"sliding\" (the last W tokens, quant.cpp) or \"chunked\" (a residual flushed every W tokens, KIVI keys, HF)",
       std::string("sliding"), true},
      {"window_extra_copy", ParamType::Bool,
       "true: the window is an extra copy beside the complete quantized cache (quant.cpp --k-window); false: it "
       "replaces its tokens' quantized copy",
       false, true},
      {"prompt", ParamType::Int,
       "prompt tokens: their queries attend exactly (prefill), they are stored quantized, windows start after them",
       int64_t{0}},
      {"prompt_fraction", ParamType::Real, "the prompt as a fraction of the recording (instead of `prompt`)", 0.0},
      {"entropy", ParamType::String,
       "attention entropy ranking heads (sink heads, entropy allocation): \"renyi2\" (H2 = -log2 sum p^2) or "
       "\"shannon\"",
       std::string("renyi2")},
      {"entropy_average", ParamType::String,
       "how per-query entropies H(t) average over the calibration queries: \"mean\" (the research) or "
       "\"effective\" (-log2 mean 2^-H(t), the first-order value-error weight)",
       std::string("mean")},
      {"gqa", ParamType::String, "a KV head's entropy from its query heads' (GQA): \"mean\", \"min\" or \"max\"",
       std::string("mean")},
  };
  return params;
}

namespace {

FormatPtr format_param(const Params& p, const std::string& name, Kind kind) {
  const std::string key = p.kind_name(name, kind);
  try {
    return make_format(p.str(key));
  } catch (ConfigError& e) {
    e.add_context(key);
    throw;
  }
}

RecentWindow::Mode parse_window_mode(const std::string& s, const std::string& key) {
  if (s == "sliding") return RecentWindow::Mode::Sliding;
  if (s == "chunked") return RecentWindow::Mode::Chunked;
  throw ConfigError(key + ": must be \"sliding\" or \"chunked\", got \"" + s + "\"");
}

std::string head_name(int64_t l, int64_t g) { return "L" + std::to_string(l) + "H" + std::to_string(g); }

}  // namespace

Protections Protections::from_params(const Params& p) {
  Protections pr;
  for (Kind kind : {Kind::Key, Kind::Value}) {
    KindProtections& k = pr.kinds_[static_cast<int>(kind)];
    k.sink_heads = p.integer("sink_heads", kind);
    if (k.sink_heads < 0) throw ConfigError(p.kind_name("sink_heads", kind) + ": must be >= 0");
    if (p.has("sink_head_threshold", kind)) k.sink_head_threshold = p.real("sink_head_threshold", kind);
    if (k.sink_heads > 0 && k.sink_head_threshold) {
      // A kind's own form (value_sink_heads) wins over the generic alternative
      // (sink_head_threshold), as it wins over the generic form of itself.
      const bool count_own = p.kind_name("sink_heads", kind) != "sink_heads";
      const bool threshold_own = p.kind_name("sink_head_threshold", kind) != "sink_head_threshold";
      if (count_own && !threshold_own) k.sink_head_threshold.reset();
      else if (threshold_own && !count_own) k.sink_heads = 0;
      else
        throw ConfigError(p.kind_name("sink_heads", kind) + " and " + p.kind_name("sink_head_threshold", kind) +
                          ": give a count or a threshold, not both");
    }
    k.sink_head_format = format_param(p, "sink_head_format", kind);
    k.sink_tokens = p.integer("sink_tokens", kind);
    if (k.sink_tokens < 0) throw ConfigError(p.kind_name("sink_tokens", kind) + ": must be >= 0");
    k.sink_token_format = format_param(p, "sink_token_format", kind);
    k.window = p.integer("window", kind);
    if (k.window < 0) throw ConfigError(p.kind_name("window", kind) + ": must be >= 0 tokens");
    k.window_format = format_param(p, "window_format", kind);
    k.window_mode = parse_window_mode(p.str("window_mode", kind), p.kind_name("window_mode", kind));
    k.window_extra_copy = p.boolean("window_extra_copy", kind);
  }
  const std::string& sel = p.str("sink_token_select");
  if (sel == "first")
    pr.token_select_ = TokenSelect::First;
  else if (sel == "attention")
    pr.token_select_ = TokenSelect::Attention;
  else
    throw ConfigError("sink_token_select: must be \"first\" or \"attention\", got \"" + sel + "\"");
  const std::string& scope = p.str("sink_token_scope");
  if (scope == "global")
    pr.token_scope_ = TokenScope::Global;
  else if (scope == "head")
    pr.token_scope_ = TokenScope::Head;
  else
    throw ConfigError("sink_token_scope: must be \"global\" or \"head\", got \"" + scope + "\"");
  pr.entropy_ = parse_entropy_kind(p.str("entropy"), "entropy");
  pr.gqa_ = parse_gqa_aggregate(p.str("gqa"), "gqa");
  pr.entropy_average_ = parse_entropy_average(p.str("entropy_average"), "entropy_average");
  pr.prompt_ = p.integer("prompt");
  pr.prompt_fraction_ = p.real("prompt_fraction");
  if (pr.prompt_ < 0) throw ConfigError("prompt: must be >= 0 tokens");
  if (!(pr.prompt_fraction_ >= 0 && pr.prompt_fraction_ < 1))
    throw ConfigError("prompt_fraction: must be in [0, 1), got " + format_double(pr.prompt_fraction_));
  if (pr.prompt_ > 0 && pr.prompt_fraction_ > 0)
    throw ConfigError("prompt and prompt_fraction: give one of them, not both");
  return pr;
}

bool Protections::needs_statistics() const {
  for (const KindProtections& k : kinds_) {
    if (k.selects_sink_heads()) return true;
    if (k.sink_tokens > 0 && token_select_ == TokenSelect::Attention) return true;
  }
  return false;
}

bool Protections::any() const {
  for (const KindProtections& k : kinds_)
    if (k.selects_sink_heads() || k.sink_tokens > 0 || k.window > 0) return true;
  return prompt_ > 0 || prompt_fraction_ > 0;
}

int64_t Protections::prompt_tokens(int64_t T) const {
  if (prompt_ > 0 && prompt_ >= T)
    throw Error("prompt: " + std::to_string(prompt_) + " tokens is not shorter than the recording's " + std::to_string(T) +
                " tokens (every query would attend exactly); use prompt_fraction or a shorter prompt");
  if (prompt_ > 0) return prompt_;
  const int64_t from_fraction = static_cast<int64_t>(std::llround(prompt_fraction_ * static_cast<double>(T)));
  if (from_fraction >= T)
    throw Error("prompt_fraction: " + format_double(prompt_fraction_) + " of the recording's " + std::to_string(T) +
                " tokens rounds to all of them (every query would attend exactly); use a smaller fraction");
  return from_fraction;
}

RecordingStats& require_stats(const StrategyInput& in, const std::string& who) {
  if (!in.stats) throw Error("internal: " + who + " needs recording statistics (StrategyInput::stats)");
  return *in.stats;
}

Plan Protections::apply(const StrategyInput& in) const {
  const Recording& r = in.rec;
  const int64_t L = r.num_layers(), Hkv = r.kv_heads, T = r.tokens;
  Plan plan(L, Hkv, T, r.head_dim);
  plan.set_attention_windows(r.attention_windows);  // a sliding layer's cache holds its last W tokens
  plan.set_prefill(prompt_tokens(T));

  // 1. Sink heads: KV heads ranked by entropy, lowest first (ties: lower layer, head).
  std::vector<std::vector<char>> sink_head(2, std::vector<char>(static_cast<size_t>(L * Hkv), 0));
  std::string sink_heads_note;
  for (Kind kind : {Kind::Key, Kind::Value}) {
    const KindProtections& k = this->kind(kind);
    if (!k.selects_sink_heads()) continue;
    if (k.sink_heads > L * Hkv)
      throw Error("sink_heads " + std::to_string(k.sink_heads) + " exceeds the recording's " + std::to_string(L * Hkv) +
                  " KV heads");
    RecordingStats& stats = require_stats(in, "sink_heads");
    std::vector<double> h(static_cast<size_t>(L * Hkv));
    for (int64_t l = 0; l < L; ++l)
      for (int64_t g = 0; g < Hkv; ++g)
        h[static_cast<size_t>(l * Hkv + g)] = stats.kv_head_entropy(l, g, entropy_, gqa_, entropy_average_);
    std::vector<int64_t> order(static_cast<size_t>(L * Hkv));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return h[a] < h[b]; });
    std::vector<std::string> names;
    for (size_t i = 0; i < order.size(); ++i) {
      const int64_t u = order[i];
      const bool take = k.sink_head_threshold ? h[static_cast<size_t>(u)] < *k.sink_head_threshold
                                              : static_cast<int64_t>(i) < k.sink_heads;
      if (!take) continue;
      sink_head[static_cast<int>(kind)][static_cast<size_t>(u)] = 1;
      names.push_back(head_name(u / Hkv, u % Hkv));
    }
    sink_heads_note += std::string(sink_heads_note.empty() ? "" : " ") + kind_name(kind) + ":" + join(names, ",");
  }
  if (!sink_heads_note.empty()) plan.annotate("sink_heads_selected", sink_heads_note);

  // 2. Sink tokens: a ranking of positions, globally or per KV head.
  int64_t max_tokens = 0;
  for (const KindProtections& k : kinds_) max_tokens = std::max(max_tokens, k.sink_tokens);
  if (max_tokens > T)
    throw Error("sink_tokens " + std::to_string(max_tokens) + " exceeds the recording's " + std::to_string(T) +
                " tokens");
  auto rank_tokens = [&](const std::vector<double>& received) {
    std::vector<int64_t> order(static_cast<size_t>(T));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return received[a] > received[b]; });
    order.resize(static_cast<size_t>(max_tokens));
    return order;
  };
  std::vector<int64_t> global_rank;
  std::vector<std::vector<int64_t>> head_rank;  // [l * Hkv + g]
  if (max_tokens > 0) {
    if (token_select_ == TokenSelect::First) {
      global_rank.resize(static_cast<size_t>(max_tokens));
      std::iota(global_rank.begin(), global_rank.end(), 0);
      plan.annotate("sink_tokens_selected", "0.." + std::to_string(max_tokens - 1));
    } else {
      const auto& recv = require_stats(in, "sink_tokens").received_attention();
      if (token_scope_ == TokenScope::Global) {
        std::vector<double> total(static_cast<size_t>(T), 0.0);
        for (const auto& layer : recv)
          for (const auto& head : layer)
            for (int64_t j = 0; j < T; ++j) total[static_cast<size_t>(j)] += head[static_cast<size_t>(j)];
        global_rank = rank_tokens(total);
        std::vector<std::string> ids;
        for (int64_t j : global_rank) ids.push_back(std::to_string(j));
        plan.annotate("sink_tokens_selected", join(ids, ","));
      } else {
        for (int64_t l = 0; l < L; ++l)
          for (int64_t g = 0; g < Hkv; ++g)
            head_rank.push_back(rank_tokens(recv[static_cast<size_t>(l)][static_cast<size_t>(g)]));
      }
    }
  }

  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < Hkv; ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        const KindProtections& k = this->kind(kind);
        UnitPlan& u = plan.unit(l, g, kind);
        if (sink_head[static_cast<int>(kind)][static_cast<size_t>(l * Hkv + g)]) {
          u.segments = {Segment{0, T, k.sink_head_format, SegmentRole::SinkHead}};
          continue;
        }
        std::vector<int64_t> sinks;
        if (k.sink_tokens > 0) {
          const std::vector<int64_t>& rank =
              head_rank.empty() ? global_rank : head_rank[static_cast<size_t>(l * Hkv + g)];
          sinks.assign(rank.begin(), rank.begin() + k.sink_tokens);
          std::sort(sinks.begin(), sinks.end());
        }
        int64_t next = 0;
        for (size_t i = 0; i < sinks.size();) {
          // A run of consecutive sink tokens is one segment.
          size_t e = i + 1;
          while (e < sinks.size() && sinks[e] == sinks[e - 1] + 1) ++e;
          if (sinks[i] > next) u.segments.push_back(Segment{next, sinks[i], nullptr, SegmentRole::Allocated});
          u.segments.push_back(Segment{sinks[i], sinks[e - 1] + 1, k.sink_token_format, SegmentRole::SinkToken});
          next = sinks[e - 1] + 1;
          i = e;
        }
        if (next < T) u.segments.push_back(Segment{next, T, nullptr, SegmentRole::Allocated});
        if (k.window > 0) u.window = k.window_of(k.window);
      }
  return plan;
}

void split_open_segments(Plan& plan, int64_t boundary) {
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Kind kind : {Kind::Key, Kind::Value}) {
        std::vector<Segment>& segs = plan.unit(l, g, kind).segments;
        std::vector<Segment> out;
        for (const Segment& s : segs) {
          if (is_open(s) && s.begin < boundary && boundary < s.end) {
            out.push_back(Segment{s.begin, boundary, nullptr, s.role});
            out.push_back(Segment{boundary, s.end, nullptr, s.role});
          } else {
            out.push_back(s);
          }
        }
        segs = std::move(out);
      }
}

void fill_open_segments(Plan& plan, Kind kind, const FormatPtr& format) {
  for (int64_t l = 0; l < plan.layers(); ++l)
    for (int64_t g = 0; g < plan.kv_heads(); ++g)
      for (Segment& s : plan.unit(l, g, kind).segments)
        if (is_open(s)) s.format = format;
}

}  // namespace kvb
