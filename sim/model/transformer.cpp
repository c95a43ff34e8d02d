#include "sim/model/transformer.h"

#include <algorithm>

#include "sim/core/error.h"
#include "sim/core/rope.h"
#include "sim/model/attention.h"
#include "sim/model/layers.h"
#include "sim/model/rope_scaling.h"

namespace kvb {

namespace {

// Copies [n, d] column block `col` of a row-major [n, stride] matrix into dst [n, d].
void copy_columns(const float* src, int64_t stride, int64_t col, int64_t n, int64_t d, float* dst) {
  for (int64_t r = 0; r < n; ++r) std::copy(src + r * stride + col, src + r * stride + col + d, dst + r * d);
}

// Per-head slices of a [n, stride] matrix into a [heads, n, d] tensor.
Tensor heads_tensor(const float* src, int64_t stride, int64_t first_col, int64_t heads, int64_t n, int64_t d) {
  Tensor t({heads, n, d});
  for (int64_t h = 0; h < heads; ++h) copy_columns(src, stride, first_col + h * d, n, d, t.slice(h));
  return t;
}

// Activations of one extend() call, kept per thread between calls; each buffer only
// grows (ScratchMatrix), so alternating shapes reuse the same memory.
struct Workspace {
  ScratchMatrix x;     // residual stream [n, hidden]
  ScratchMatrix h;     // normalized rows [n, hidden]
  ScratchMatrix qkv;   // [n, (q_heads + 2 kv_heads) head_dim]: q | k | v
  ScratchMatrix attn;  // attention output [n, q_heads head_dim]
  ScratchMatrix proj;  // projection output [n, hidden]
  ScratchMatrix mlp;   // MLP hidden [n, intermediate] (gated: [n, 2 intermediate])
  ScratchMatrix act;   // gated MLP activation [n, intermediate]
  std::vector<float> cache_scratch;  // reconstructed KV versions of one layer
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

}  // namespace

std::shared_ptr<const Transformer> Transformer::load(const std::filesystem::path& dir) {
  ModelConfig config = load_model_config(dir);
  std::string warning;
  const std::unique_ptr<TensorStore> store = open_checkpoint(dir, &warning);
  ModelWeights weights = load_model_weights(config, *store);
  auto model = std::make_shared<Transformer>(std::move(config), std::move(weights));
  if (!warning.empty()) model->load_warnings_.push_back(warning);
  return model;
}

Transformer::Transformer(ModelConfig config, ModelWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  if (config_.rope.enabled) inv_freq_ = rope_inverse_frequencies(config_.rope, config_.head_dim);
}

CacheRope Transformer::cache_rope() const {
  CacheRope rope;
  rope.applied = config_.rope.enabled;
  rope.theta = config_.rope.theta;
  if (config_.rope.type != "default") rope.inv_freq = &inv_freq_;
  rope.model = config_.dir.filename().string();
  return rope;
}

Transformer::State Transformer::new_state() const {
  State s;
  s.cache = KvCache(config_.layers, config_.kv_heads, config_.head_dim, cache_rope());
  return s;
}

void Transformer::check_tokens(std::span<const int64_t> tokens, int64_t first_position) const {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      throw Error("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(first_position + static_cast<int64_t>(i)) +
                  " is outside the vocabulary of " + config_.dir.string() + " (vocab_size " +
                  std::to_string(config_.vocab_size) + " in config.json)");
  const int64_t end = first_position + static_cast<int64_t>(tokens.size());
  if (config_.family == ModelFamily::Gpt2 && end > config_.max_positions)
    throw Error(config_.dir.string() + ": " + std::to_string(end) + " tokens exceed the learned position table (n_positions " +
                std::to_string(config_.max_positions) + " in config.json)");
}

RowMatrix Transformer::extend(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt) const {
  RowMatrix logits(opt.all_logits ? static_cast<int64_t>(tokens.size()) : 1, config_.vocab_size);
  extend_into(state, tokens, opt, logits.data());
  return logits;
}

void Transformer::extend_into(State& state, std::span<const int64_t> tokens, const ExtendOptions& opt,
                              float* logits_out) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t first = state.length, context = first + n;
  const int64_t d = c.head_dim, qkv_width = c.qkv_width();
  const int64_t k_col = c.q_heads * d, v_col = k_col + c.kv_heads * d;
  if (n == 0) throw Error("internal: extend() with no tokens");
  check_tokens(tokens, first);
  if (opt.cache.plan) check_plan_fits(*opt.cache.plan, c.layers, c.kv_heads, d);
  state.tokens.insert(state.tokens.end(), tokens.begin(), tokens.end());
  const CacheQuantization cache = opt.cache.for_tokens(state.tokens);
  if (opt.capture) opt.capture->assign(static_cast<size_t>(c.layers), LayerTensors{});

  Workspace& ws = workspace();
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  auto x = ws.x.view(n, H);
  auto h = ws.h.view(n, H);
  auto qkv = ws.qkv.view(n, qkv_width);
  auto attn = ws.attn.view(n, c.q_heads * d);
  auto proj = ws.proj.view(n, H);
  auto mlp = ws.mlp.view(n, c.gated_mlp ? 2 * I : I);
  for (int64_t i = 0; i < n; ++i) {
    weights_.token_embedding.rows_to_f32(tokens[static_cast<size_t>(i)], 1, x.row(i).data());
    if (!weights_.position_embedding.empty()) {
      weights_.position_embedding.rows_to_f32(first + i, 1, h.row(i).data());  // h: scratch until the first norm
      x.row(i) += h.row(i);
    }
  }
  RopeTable rope;  // cos/sin of the new tokens' positions
  if (c.rope.enabled) {
    std::vector<int64_t> positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = first + i;
    rope = make_rope_table(n, positions.data(), inv_freq_);
  }

  for (int64_t l = 0; l < c.layers; ++l) {
    const BlockWeights& blk = weights_.blocks[static_cast<size_t>(l)];
    LayerTensors* cap = opt.capture ? &(*opt.capture)[static_cast<size_t>(l)] : nullptr;

    normalize_rows(x, blk.attn_norm, c.norm_eps, h);
    dense(h, blk.qkv, qkv);
    if (c.rope.enabled) {
      if (cap) cap->key_pre_rope = heads_tensor(qkv.data(), qkv_width, k_col, c.kv_heads, n, d);
      state.cache.append_pre_rope_keys(l, qkv.data() + k_col, qkv_width, n);
    }
    if (c.rope.enabled)  // query and key heads: the first (q_heads + kv_heads) * d columns
      for (int64_t r = 0; r < n; ++r)
        for (int64_t hh = 0; hh < c.q_heads + c.kv_heads; ++hh) apply_rope_row(qkv.row(r).data() + hh * d, rope, r);
    if (cap) {
      cap->query = heads_tensor(qkv.data(), qkv_width, 0, c.q_heads, n, d);
      cap->key = heads_tensor(qkv.data(), qkv_width, k_col, c.kv_heads, n, d);
      cap->value = heads_tensor(qkv.data(), qkv_width, v_col, c.kv_heads, n, d);
    }
    state.cache.append(l, qkv.data() + k_col, qkv.data() + v_col, qkv_width, n);
    const KvLayerView kv = state.cache.view_after_append(l, cache, n, ws.cache_scratch);
    const AttentionGeometry geo{c.q_heads, c.kv_heads, d, c.score_scale(l), c.sliding_window[static_cast<size_t>(l)]};
    causal_attention(qkv.data(), qkv_width, n, context, kv, geo, attn.data());
    if (cap) {
      cap->attn_output = Tensor({n, c.q_heads * d});
      std::copy(attn.data(), attn.data() + attn.size(), cap->attn_output.ptr());
    }
    dense(attn, blk.attn_out, proj);
    x += proj;

    normalize_rows(x, blk.mlp_norm, c.norm_eps, h);
    dense(h, blk.mlp_in, mlp);
    if (c.gated_mlp) {
      auto act = ws.act.view(n, I);
      gated_activation(mlp, c.activation, act);
      dense(act, blk.mlp_out, proj);
    } else {
      activate(mlp.data(), mlp.size(), c.activation);
      dense(mlp, blk.mlp_out, proj);
    }
    x += proj;
  }
  state.length = context;

  // Logits of every new token, or of the last one.
  const int64_t rows = opt.all_logits ? n : 1;
  normalize_rows(x.bottomRows(rows), weights_.final_norm, c.norm_eps, h.topRows(rows));
  Eigen::Map<RowMatrix> logits(logits_out, rows, c.vocab_size);
  dense(h.topRows(rows), weights_.output_embedding(), nullptr, logits);
}

RowMatrix Transformer::forward(std::span<const int64_t> tokens, const ExtendOptions& opt) const {
  RowMatrix logits(opt.all_logits ? static_cast<int64_t>(tokens.size()) : 1, config_.vocab_size);
  forward_into(tokens, opt, logits.data());
  return logits;
}

void Transformer::forward_into(std::span<const int64_t> tokens, const ExtendOptions& opt, float* logits) const {
  // The cache of a teacher-forced pass is dropped afterwards; its storage is kept per
  // thread for the next pass of the same model shape (see Workspace).
  thread_local State state;
  if (state.cache.layers() != config_.layers || state.cache.kv_heads() != config_.kv_heads ||
      state.cache.head_dim() != config_.head_dim)
    state = new_state();
  state.cache.reset(cache_rope());
  state.length = 0;
  state.tokens.clear();
  extend_into(state, tokens, opt, logits);
}

double Transformer::flops_per_token(int64_t context) const {
  const ModelConfig& c = config_;
  const double H = static_cast<double>(c.hidden_size), d = static_cast<double>(c.head_dim);
  const double per_layer = H * static_cast<double>(c.qkv_width()) + static_cast<double>(c.q_heads) * d * H +
                           static_cast<double>(c.gated_mlp ? 3 : 2) * H * static_cast<double>(c.intermediate_size) +
                           2.0 * static_cast<double>(c.q_heads) * d * static_cast<double>(context);
  return 2.0 * (static_cast<double>(c.layers) * per_layer + H * static_cast<double>(c.vocab_size));
}

std::vector<int64_t> greedy_continuation(const Transformer& model, std::span<const int64_t> prompt,
                                         int64_t new_tokens, const CacheQuantization& cache) {
  return greedy_generate(model, prompt, new_tokens, cache, nullptr);
}

int64_t greedy_token(std::span<const float> logits, int64_t) {
  return argmax(logits.data(), static_cast<int64_t>(logits.size()));
}

std::vector<int64_t> generate_with(const ExtendStep& extend, std::span<const int64_t> prompt, int64_t max_new_tokens,
                                   const CacheQuantization& cache, const TokenChooser& choose,
                                   const std::function<bool(const std::vector<int64_t>&)>& stop) {
  std::vector<int64_t> out;
  if (max_new_tokens <= 0) return out;
  ExtendOptions opt;
  opt.cache = cache.for_prompt(static_cast<int64_t>(prompt.size()));
  opt.all_logits = false;
  RowMatrix logits = extend(prompt, opt);
  while (true) {
    const int64_t next = choose(std::span<const float>(logits.data(), static_cast<size_t>(logits.cols())),
                                static_cast<int64_t>(out.size()));
    out.push_back(next);
    if (static_cast<int64_t>(out.size()) == max_new_tokens || (stop && stop(out))) break;
    logits = extend(std::span<const int64_t>(&out.back(), 1), opt);
  }
  return out;
}

int64_t argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (values[i] > values[best]) best = i;
  return best;
}

}  // namespace kvb
