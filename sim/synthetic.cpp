// Synthetic recording generator. See sim/synthetic.h for the controls and the idea.
//
// Frames: "pre" is the key before RoPE (what key_pre_rope stores), "post" after it (what
// attention reads). Without RoPE they coincide. Queries are built in the post frame.
//
// Layers are generated one after another, each in parallel inside (over KV heads, token
// blocks and query heads) with a working set bounded by about one layer's keys and values
// (at least 1 GiB of calibration scratch) whatever the thread count (generate_layer). Every random stream is keyed by (seed,
// purpose, layer, head), and every reduction runs in a fixed order, so the result does
// not depend on the number of threads; generate_layer_reference, the plain version that
// holds every KV head's [T, d] parts, gives the same tensors bit for bit.
#include "sim/synthetic.h"

#include <unistd.h>

#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <numbers>
#include <numeric>
#include <optional>
#include <sstream>

#include "sim/core/error.h"
#include "sim/core/parallel.h"
#include "sim/core/rope.h"
#include "sim/core/strings.h"
#include "sim/metrics/attention.h"
#include "sim/metrics/redundancy.h"
#include "sim/core/rng.h"

namespace kvb {
namespace {

using synth::derive_seed;
using synth::Rng;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstRowMap = Eigen::Map<const RowMatrix>;

// What each random stream is for; a stream is (seed, purpose, layer, head[, phase]).
enum StreamPurpose : uint64_t {
  kSinkLayerChoice = 1,
  kHeadRoles = 2,
  kSharedDirection = 3,
  kKeyOwn = 4,
  kOutlierChoice = 5,
  kPositionalPhase = 6,
  kQueryTarget = 7,
  kQueryNoise = 8,
  kValues = 9,
  kTokenIds = 10,
};

// Query content direction = unit(own part of the target key (unit) + ν · noise (norm ≈ 1)).
constexpr double kQueryNoiseWeight = 0.5;
// Sink keys' component on the sink channel, in units of key_scale·√d (about a whole key).
constexpr double kSinkKeyNorm = 1.0;
// Recency targets: positional frequencies spread geometrically over
// [kRecencyLowFreq, kRecencyHighFreq] / recency_scale radians per token.
constexpr double kRecencyHighFreq = 2.0;
constexpr double kRecencyLowFreq = 0.25;
// Calibration tolerances and limits.
constexpr double kEntropyTolBits = 1e-4;
constexpr double kSinkMassTol = 1e-5;
constexpr double kRhoTol = 1e-6;
constexpr double kMaxContentGain = 1e5;  // largest β · key_scale tried
constexpr double kMaxSinkBonusNats = 60.0;
constexpr int kMaxSolverSteps = 200;

// ---------------------------------------------------------------------------
// Spec checks and the channel layout
// ---------------------------------------------------------------------------

[[noreturn]] void bad_field(const std::string& field, const std::string& why) { throw SyntheticSpecError(field, why); }

std::string num(double v) { return format_double(v); }
std::string num(int64_t v) { return std::to_string(v); }
// A measured value in a warning: 4 significant digits.
std::string approx(double v) {
  std::ostringstream os;
  os.precision(4);
  os << v;
  return os.str();
}

int64_t positional_pair_count(const SyntheticSpec& s) {
  if (!(s.recency > 0)) return 0;
  return std::clamp<int64_t>(s.head_dim / 16, 1, 4);
}

int64_t phase_boundary_of(const SyntheticSpec& s) {
  if (s.phase_fraction >= 1.0) return s.tokens;
  return static_cast<int64_t>(std::llround(s.phase_fraction * static_cast<double>(s.tokens)));
}

// Channel layout shared by every head. Pair p = channels (p, p + d/2); with odd d the
// last channel is an unpaired content channel.
SyntheticChannels plan_channels(const SyntheticSpec& s) {
  const int64_t d = s.head_dim, half = d / 2;
  SyntheticChannels ch;
  std::vector<char> used(static_cast<size_t>(half), 0);
  if (s.sink_heads > 0) {
    // The slowest RoPE pair: sink keys at positions 0..sink_tokens-1 barely rotate.
    used[static_cast<size_t>(half - 1)] = 1;
    ch.sink = {half - 1, d - 1 - (d % 2)};
  }
  const int64_t P = positional_pair_count(s);
  for (int64_t k = 0; k < P; ++k) {
    const double frac = P == 1 ? 0.5 : static_cast<double>(k) / static_cast<double>(P - 1);
    const double target = std::exp(std::log(kRecencyHighFreq) +
                                   frac * (std::log(kRecencyLowFreq) - std::log(kRecencyHighFreq))) /
                          s.recency_scale;
    int64_t pair = -1;
    double freq = target;
    if (s.rope) {  // the free RoPE pair whose frequency is nearest in log scale
      double best = INFINITY;
      for (int64_t p = 0; p < half; ++p) {
        if (used[static_cast<size_t>(p)]) continue;
        const double f = rope_inv_freq(p, d, s.rope_theta);
        const double gap = std::abs(std::log(f) - std::log(target));
        if (gap < best) best = gap, pair = p, freq = f;
      }
    } else {
      for (int64_t p = 0; p < half && pair < 0; ++p)
        if (!used[static_cast<size_t>(p)]) pair = p;
    }
    used[static_cast<size_t>(pair)] = 1;
    ch.positional.push_back(pair);
    ch.positional.push_back(pair + half);
    ch.positional_freq.push_back(freq);
  }
  std::vector<int64_t> content_pairs;
  for (int64_t p = 0; p < half; ++p)
    if (!used[static_cast<size_t>(p)]) content_pairs.push_back(p);
  for (int64_t p : content_pairs) ch.content.push_back(p);
  for (int64_t p : content_pairs) ch.content.push_back(p + half);
  if (d % 2) ch.content.push_back(d - 1);
  if (!s.rope) {
    ch.shared = ch.content;
  } else {
    // Higher pair index = slower rotation; keep the slowest quarter (at least one pair).
    const size_t n = std::max<size_t>(1, content_pairs.size() / 4);
    for (size_t i = content_pairs.size() - n; i < content_pairs.size(); ++i) {
      ch.shared.push_back(content_pairs[i]);
      ch.shared.push_back(content_pairs[i] + half);
    }
  }
  std::sort(ch.content.begin(), ch.content.end());
  std::sort(ch.shared.begin(), ch.shared.end());
  return ch;
}

// Throws SyntheticSpecError at `tokens` when `layers` x (query_rows x q_heads + K
// kv_heads x tokens) x head_dim fp32 values do not fit in this machine's memory: the
// layers a run holds at once (all of them, or one when they stream). K = 3 (keys,
// pre-RoPE keys, values) when `pre_rope_keys`, else 2.
void check_fits_memory(const SyntheticSpec& s, int64_t query_rows, int64_t layers, bool pre_rope_keys) {
  const double per_token = pre_rope_keys ? 3.0 : 2.0;
  const double kv_rows = per_token * static_cast<double>(s.kv_heads) * static_cast<double>(s.tokens);
  const double floats = static_cast<double>(layers) * static_cast<double>(s.head_dim) *
                        (static_cast<double>(s.q_heads) * static_cast<double>(query_rows) + kv_rows);
  const double bytes = 4 * floats;
  const double ram = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (!(ram > 0 && bytes > ram)) return;
  char sizes[160];
  std::snprintf(sizes, sizeof sizes, "%.3g fp32 values (%.1f GiB) do not fit in this machine's %.1f GiB", floats,
                bytes / (1 << 30), ram / (1 << 30));
  const std::string kv = pre_rope_keys ? "3 kv_heads x tokens" : "2 kv_heads x tokens";
  const std::string held = pre_rope_keys ? "keys, pre-RoPE keys, values" : "keys, values";
  const std::string per_layer = query_rows == 0 ? kv + " x head_dim (" + held + ")"
                                                : "(q_heads x " + std::to_string(query_rows) + " query positions + " +
                                                      kv + ") x head_dim (queries, " + held + ")";
  if (layers == 1)
    bad_field("tokens", "one layer's " + per_layer + " = " + std::string(sizes) +
                            " of memory; make the recording smaller");
  bad_field("tokens", "layers x " + per_layer + " = " + std::string(sizes) +
                          " of memory; make the recording smaller, or let its layers stream (data.stream_layers: "
                          "one layer held at a time, configs/README.md)");
}

}  // namespace

void validate_synthetic_spec(const SyntheticSpec& s) {
  auto require = [](bool ok, const std::string& field, const std::string& why) {
    if (!ok) bad_field(field, why);
  };
  require(s.layers >= 1, "layers", "must be >= 1, got " + num(s.layers));
  require(s.q_heads >= 1, "q_heads", "must be >= 1, got " + num(s.q_heads));
  require(s.kv_heads >= 1, "kv_heads", "must be >= 1, got " + num(s.kv_heads));
  require(s.q_heads % s.kv_heads == 0, "q_heads",
          num(s.q_heads) + " is not a multiple of kv_heads = " + num(s.kv_heads) +
              " (GQA needs the same number of query heads per KV head)");
  require(s.head_dim >= 1, "head_dim", "must be >= 1, got " + num(s.head_dim));
  require(!s.rope || s.head_dim % 2 == 0, "head_dim",
          num(s.head_dim) + " is odd, but rope = true rotates channel pairs (i, i + head_dim/2)");
  require(s.tokens >= 2, "tokens", "must be >= 2, got " + num(s.tokens));
  // One layer's fp32 keys, pre-RoPE keys and values must fit in memory (a streamed run
  // holds one layer at a time; generate_synthetic, which holds every layer, checks them
  // all with the kept queries).
  check_fits_memory(s, 0, 1, s.rope);
  require(std::isfinite(s.entropy_mean) && s.entropy_mean >= 0, "entropy_mean",
          "must be a finite number of bits >= 0, got " + num(s.entropy_mean));
  require(std::isfinite(s.entropy_spread) && s.entropy_spread >= 0, "entropy_spread",
          "must be finite and >= 0, got " + num(s.entropy_spread));
  require(s.entropy_mean - s.entropy_spread / 2 >= 0, "entropy_spread",
          "entropy_mean - entropy_spread/2 = " + num(s.entropy_mean - s.entropy_spread / 2) +
              " bits is negative; entropies are >= 0");
  require(s.sink_heads >= 0 && s.sink_heads <= s.q_heads, "sink_heads",
          num(s.sink_heads) + " outside [0, q_heads = " + num(s.q_heads) + "]");
  require(s.sink_layers >= 0 && s.sink_layers <= s.layers, "sink_layers",
          num(s.sink_layers) + " outside [0, layers = " + num(s.layers) + "] (0 = every layer)");
  if (s.sink_heads > 0) {
    require(s.sink_tokens >= 1 && s.sink_tokens < s.tokens, "sink_tokens",
            num(s.sink_tokens) + " outside [1, tokens - 1 = " + num(s.tokens - 1) + "]");
    require(s.sink_mass > 0 && s.sink_mass < 1, "sink_mass",
            num(s.sink_mass) + " is not in (0, 1) (mean attention mass on the sink tokens)");
  }
  require(std::isfinite(s.recency) && s.recency >= 0, "recency",
          "must be finite and >= 0 (nats of score bonus at distance 0), got " + num(s.recency));
  require(std::isfinite(s.recency_scale) && s.recency_scale >= 1, "recency_scale",
          "must be >= 1 token, got " + num(s.recency_scale));
  require(std::isfinite(s.outlier_scale) && s.outlier_scale > 0, "outlier_scale",
          "must be finite and > 0, got " + num(s.outlier_scale));
  require(!s.rope || (std::isfinite(s.rope_theta) && s.rope_theta > 1), "rope_theta",
          "must be > 1, got " + num(s.rope_theta));
  require(std::isfinite(s.key_scale) && s.key_scale > 0, "key_scale", "must be finite and > 0, got " + num(s.key_scale));
  require(std::isfinite(s.value_scale) && s.value_scale > 0, "value_scale",
          "must be finite and > 0 (0 makes every value zero and relative value errors undefined), got " +
              num(s.value_scale));
  require(s.calibration_queries >= 1, "calibration_queries", "must be >= 1, got " + num(s.calibration_queries));
  require(s.phase_marker >= 0, "phase_marker", "must be a token id >= 0, got " + num(s.phase_marker));

  // Subspaces: positional pairs + the sink pair + at least one content pair.
  const int64_t pairs = s.head_dim / 2, P = positional_pair_count(s), sink = s.sink_heads > 0 ? 1 : 0;
  const int64_t content_channels = 2 * (pairs - P - sink) + s.head_dim % 2;
  require(content_channels >= 1, "head_dim",
          num(s.head_dim) + " leaves no content channel after " + num(P) + " positional pair(s) (recency > 0) and " +
              num(sink) + " sink pair (sink_heads > 0); use a larger head_dim");
  require(s.outlier_channels >= 0 && s.outlier_channels <= content_channels, "outlier_channels",
          num(s.outlier_channels) + " outside [0, " + num(content_channels) +
              "] (the content channels of head_dim = " + num(s.head_dim) + ")");

  // Phases and their target ρ.
  require(std::isfinite(s.phase_fraction) && s.phase_fraction > 0 && s.phase_fraction <= 1, "phase_fraction",
          num(s.phase_fraction) + " is not in (0, 1]");
  const int64_t boundary = phase_boundary_of(s);
  const int64_t n_first = boundary, n_second = s.tokens - boundary;
  if (s.phase_fraction < 1)
    require(n_first >= 2 && n_second >= 2, "phase_fraction",
            num(s.phase_fraction) + " of " + num(s.tokens) + " tokens gives phases of " + num(n_first) + " and " +
                num(n_second) + " tokens; each needs at least 2 for a pairwise cosine");
  auto check_rho = [&](double rho, int64_t n, const char* field) {
    const double lo = -1.0 / static_cast<double>(n - 1);
    require(std::isfinite(rho) && rho > lo && rho < 1, field,
            num(rho) + " is not in (" + num(lo) + ", 1), the range of a mean pairwise cosine of " + num(n) +
                " keys");
  };
  check_rho(s.rho_first, n_first, "rho_first");
  if (s.phase_fraction < 1) check_rho(s.rho_second, n_second, "rho_second");
}

namespace {

// ---------------------------------------------------------------------------
// Root finding
// ---------------------------------------------------------------------------

// Solves f(x) = target for x in [a, b], where fa = f(a) and fb = f(b) lie on opposite
// sides of target and f is continuous (Illinois variant of regula falsi: superlinear,
// never leaves the bracket). Returns the best x found within max_steps.
double solve_bracketed(const std::function<double(double)>& f, double a, double fa, double b, double fb,
                       double target, double tol) {
  fa -= target;
  fb -= target;
  double best_x = std::abs(fa) < std::abs(fb) ? a : b;
  double best_err = std::min(std::abs(fa), std::abs(fb));
  int kept = 0;  // +1: a was kept last step, −1: b was kept
  for (int step = 0; step < kMaxSolverSteps && best_err > tol; ++step) {
    double x = (a * fb - b * fa) / (fb - fa);
    if (!(x > std::min(a, b) && x < std::max(a, b))) x = 0.5 * (a + b);
    const double fx = f(x) - target;
    if (std::abs(fx) < best_err) best_err = std::abs(fx), best_x = x;
    if ((fx < 0) == (fa < 0)) {  // replaces a; b kept
      a = x, fa = fx;
      if (kept == -1) fb *= 0.5;
      kept = -1;
    } else {
      b = x, fb = fx;
      if (kept == +1) fa *= 0.5;
      kept = +1;
    }
    if (std::abs(b - a) <= 1e-14 * (std::abs(a) + std::abs(b))) break;
  }
  return best_x;
}

// ---------------------------------------------------------------------------
// Shared plan
// ---------------------------------------------------------------------------

struct Plan {
  SyntheticSpec spec;
  int64_t L = 0, Hq = 0, G = 0, group = 0, d = 0, T = 0;
  int64_t boundary = 0;  // first token of the second phase (T for one phase)
  SyntheticChannels ch;
  std::optional<RopeTable> rope;
  std::vector<int64_t> calib_positions;  // query positions the calibration measures
  std::vector<char> sink_layer;          // [L]: does layer l have sink heads
  double shared_amplitude = 0;           // A: norm of the shared direction, key_scale·√(content channels)
  double positional_key_amp = 0;         // a: amplitude of a key's positional pair
  double positional_query_amp = 0;       // b: query amplitude, a·b·P/√d = recency
  double sink_key_value = 0;             // σ: sink keys' component on the sink channel

  int64_t phase_of(int64_t t) const { return t < boundary ? 0 : 1; }
  int64_t num_phases() const { return boundary < T ? 2 : 1; }
  int64_t sink_channel() const { return ch.sink.empty() ? -1 : ch.sink[0]; }
};

Plan make_plan(const SyntheticSpec& s) {
  Plan P;
  P.spec = s;
  P.L = s.layers, P.Hq = s.q_heads, P.G = s.kv_heads, P.group = s.q_heads / s.kv_heads;
  P.d = s.head_dim, P.T = s.tokens;
  P.boundary = phase_boundary_of(s);
  P.ch = plan_channels(s);
  if (s.rope) P.rope = make_rope_table(P.T, P.d, nullptr, s.rope_theta);
  P.calib_positions = spread_positions(P.T, s.calibration_queries);
  P.sink_layer.assign(static_cast<size_t>(P.L), s.sink_heads > 0 ? 1 : 0);
  if (s.sink_heads > 0 && s.sink_layers > 0) {
    std::vector<int64_t> order(static_cast<size_t>(P.L));
    for (int64_t l = 0; l < P.L; ++l) order[static_cast<size_t>(l)] = l;
    Rng rng(derive_seed({s.seed, kSinkLayerChoice}));
    synth::shuffle(order.data(), P.L, rng);
    for (int64_t i = s.sink_layers; i < P.L; ++i) P.sink_layer[static_cast<size_t>(order[static_cast<size_t>(i)])] = 0;
  }
  P.shared_amplitude = s.key_scale * std::sqrt(static_cast<double>(P.ch.content.size()));
  P.positional_key_amp = s.key_scale * std::sqrt(2.0);  // each channel's RMS = key_scale
  const double n_pos = static_cast<double>(P.ch.positional_freq.size());
  P.positional_query_amp = n_pos > 0 ? s.recency * std::sqrt(static_cast<double>(P.d)) / (n_pos * P.positional_key_amp) : 0;
  P.sink_key_value = kSinkKeyNorm * s.key_scale * std::sqrt(static_cast<double>(P.d));
  return P;
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

// One KV head's keys as separate parts in the pre frame, each [T, d]; the key is
// √w_phase · shared + √(1 − w_phase) · own + fixed.
struct KeyParts {
  std::vector<float> shared;  // D · A · u_phase(t): the phase's common direction
  std::vector<float> own;     // D · key_scale · z_t: the token's own Gaussian part
  // key_scale · z_t without the outlier scaling: what queries that look for token t align
  // with, so that outlier channels do not dominate which keys a query finds.
  std::vector<float> own_unscaled;
  std::vector<float> fixed;   // positional pairs + sink component
  std::vector<int64_t> outliers;  // channels scaled by outlier_scale, sorted
};

std::vector<int64_t> choose_outlier_channels(const Plan& P, int64_t l, int64_t g) {
  const SyntheticSpec& s = P.spec;
  if (s.outlier_channels == 0) return {};
  // With RoPE prefer the content channels outside the shared (slow) pairs, so outliers
  // sit where the other channels have equal RMS; then the shared ones if more are asked.
  std::vector<int64_t> first, second;
  for (int64_t c : P.ch.content) {
    const bool shared = std::binary_search(P.ch.shared.begin(), P.ch.shared.end(), c);
    (s.rope && shared ? second : first).push_back(c);
  }
  Rng rng(derive_seed({s.seed, kOutlierChoice, static_cast<uint64_t>(l), static_cast<uint64_t>(g)}));
  synth::shuffle(first.data(), static_cast<int64_t>(first.size()), rng);
  synth::shuffle(second.data(), static_cast<int64_t>(second.size()), rng);
  first.insert(first.end(), second.begin(), second.end());
  std::vector<int64_t> out(first.begin(), first.begin() + s.outlier_channels);
  std::sort(out.begin(), out.end());
  return out;
}

KeyParts make_key_parts(const Plan& P, int64_t l, int64_t g) {
  const SyntheticSpec& s = P.spec;
  const int64_t T = P.T, d = P.d, half = d / 2;
  const uint64_t ul = static_cast<uint64_t>(l), ug = static_cast<uint64_t>(g);
  KeyParts parts;
  parts.shared.assign(static_cast<size_t>(T * d), 0.0f);
  parts.own.assign(static_cast<size_t>(T * d), 0.0f);
  parts.own_unscaled.assign(static_cast<size_t>(T * d), 0.0f);
  parts.fixed.assign(static_cast<size_t>(T * d), 0.0f);
  parts.outliers = choose_outlier_channels(P, l, g);
  std::vector<double> scale(static_cast<size_t>(d), 1.0);  // D
  for (int64_t c : parts.outliers) scale[static_cast<size_t>(c)] = s.outlier_scale;

  // Shared direction per phase: random signs on the shared channels, norm A.
  const double per_channel = P.shared_amplitude / std::sqrt(static_cast<double>(P.ch.shared.size()));
  std::vector<std::vector<double>> u(static_cast<size_t>(P.num_phases()));
  for (int64_t ph = 0; ph < P.num_phases(); ++ph) {
    Rng rng(derive_seed({s.seed, kSharedDirection, ul, ug, static_cast<uint64_t>(ph)}));
    u[static_cast<size_t>(ph)].assign(static_cast<size_t>(d), 0.0);
    for (int64_t c : P.ch.shared) u[static_cast<size_t>(ph)][static_cast<size_t>(c)] = rng.sign() * per_channel;
  }
  Rng own_rng(derive_seed({s.seed, kKeyOwn, ul, ug}));
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double>& ut = u[static_cast<size_t>(P.phase_of(t))];
    float* sh = parts.shared.data() + t * d;
    float* own = parts.own.data() + t * d;
    float* own_unscaled = parts.own_unscaled.data() + t * d;
    for (int64_t c : P.ch.content) {
      const double D = scale[static_cast<size_t>(c)];
      const double z = s.key_scale * own_rng.normal();
      sh[c] = static_cast<float>(D * ut[static_cast<size_t>(c)]);
      own[c] = static_cast<float>(D * z);
      own_unscaled[c] = static_cast<float>(z);
    }
  }

  // Positional pairs: post frame a·(cos(ω t + φ), sin(ω t + φ)). With RoPE the pre frame
  // holds the constant a·(cos φ, sin φ) and RoPE supplies the rotation.
  Rng phase_rng(derive_seed({s.seed, kPositionalPhase, ul, ug}));
  for (size_t k = 0; k < P.ch.positional_freq.size(); ++k) {
    const int64_t lo = P.ch.positional[2 * k], hi = lo + half;
    const double phi = 2.0 * std::numbers::pi * phase_rng.uniform();
    const double omega = s.rope ? 0.0 : P.ch.positional_freq[k];
    for (int64_t t = 0; t < T; ++t) {
      const double angle = omega * static_cast<double>(t) + phi;
      parts.fixed[static_cast<size_t>(t * d + lo)] = static_cast<float>(P.positional_key_amp * std::cos(angle));
      parts.fixed[static_cast<size_t>(t * d + hi)] = static_cast<float>(P.positional_key_amp * std::sin(angle));
    }
  }
  if (const int64_t sc = P.sink_channel(); sc >= 0)
    for (int64_t t = 0; t < s.sink_tokens; ++t) parts.fixed[static_cast<size_t>(t * d + sc)] = static_cast<float>(P.sink_key_value);
  return parts;
}

// The post frame of a pre-frame [T, d] buffer (a rotated copy with RoPE, else a copy).
std::vector<float> to_post(const Plan& P, const std::vector<float>& pre) {
  std::vector<float> post = pre;
  if (P.rope) apply_rope(post.data(), *P.rope);
  return post;
}

// Tokens per parallel task in the generator's passes over [T, d] buffers: 32 tasks at
// 2048 tokens (at 256, 8 tasks left half of 16 threads idle in mean_parts).
constexpr int64_t kTokenBlock = 64;

// Solves the shared weight w of one phase so that the research ρ of the layer (keys
// averaged over KV heads, post frame) hits `target`. mean_* are the head-averaged post
// frame parts, [T, d] double.
double solve_shared_weight(const Plan& P, const double* mean_shared, const double* mean_own, const double* mean_fixed,
                           int64_t t0, int64_t t1, double target, const std::string& where,
                           std::vector<std::string>& warnings) {
  const int64_t d = P.d, n = t1 - t0;
  // [n, d]: the rows ρ is measured on; written (first touched) by the parallel blocks.
  const std::unique_ptr<double[]> rows = std::make_unique_for_overwrite<double[]>(static_cast<size_t>(n * d));
  auto rho_at = [&](double w) {
    const double a = std::sqrt(w), b = std::sqrt(1.0 - w);
    parallel_for_rethrow((n + kTokenBlock - 1) / kTokenBlock, [&](int64_t block) {
      for (int64_t i = block * kTokenBlock * d; i < std::min(n, (block + 1) * kTokenBlock) * d; ++i) {
        const int64_t k = t0 * d + i;
        rows[static_cast<size_t>(i)] = a * mean_shared[k] + b * mean_own[k] + mean_fixed[k];
      }
    });
    return mean_pairwise_cosine(rows.get(), n, d);
  };
  // ρ(w) normally rises from ρ(0) (own parts only) to ρ(1) (shared direction only); with
  // tiny head_dim or theta RoPE can turn the shared direction faster than the positional
  // pairs, so the solver accepts either orientation.
  const double rho0 = rho_at(0.0), rho1 = rho_at(1.0);
  const double lowest = std::min(rho0, rho1), highest = std::max(rho0, rho1);
  if (target <= lowest || target >= highest) {
    const bool nearer_w0 = std::abs(target - rho0) <= std::abs(target - rho1);
    const double reached = nearer_w0 ? rho0 : rho1;
    if (std::abs(reached - target) > 1e-3)
      warnings.push_back(where + ": target rho " + approx(target) + " is outside the reachable [" + approx(lowest) + ", " +
                         approx(highest) + "]; clamped to " + approx(reached));
    return nearer_w0 ? 0.0 : 1.0;
  }
  return solve_bracketed(rho_at, 0.0, rho0, 1.0, rho1, target, kRhoTol);
}

// ---------------------------------------------------------------------------
// Queries
// ---------------------------------------------------------------------------

// Scores at the calibration positions, by source, so that the query gains β and γ can
// be varied without new dot products: row r is query position t = calib_positions[r],
// column j a key (only j <= t is causal). All scores are already divided by √d.
// The parts of a KV head, shared by its query heads:
struct KvHeadScores {
  RowMatrix positional;     // [R, T] q_pos,t · k_j / √d (unused when recency = 0)
  std::vector<float> sink;  // [T] e_sink · k_j / √d, per unit sink gain (empty without sinks)
};
// One query head's, with its scratch:
struct CalibrationScores {
  const KvHeadScores* kv = nullptr;  // its KV head's
  RowMatrix content;        // [R, T] q̂_t · k_j / √d of the current query head
  RowMatrix query_rows;     // [R, d] scratch: the query rows being scored
  std::vector<float> logits;   // [T] scratch: shifted logits of one row
  std::vector<float> weights;  // [T] scratch: their exponentials
};

// out = query_rows [R, d] · keysᵀ / √d, [R, T].
void score_query_rows(const Plan& P, const RowMatrix& query_rows, const float* keys, RowMatrix& out) {
  const ConstRowMap K(keys, P.T, P.d);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(P.d));
  out.resize(query_rows.rows(), P.T);
  out.noalias() = (query_rows * K.transpose()) * inv_sqrt_d;
}

// out = (rows calib_positions of queries [T, d]) · keysᵀ / √d, [R, T].
void score_rows(const Plan& P, const std::vector<float>& queries, const float* keys, RowMatrix& query_rows,
                RowMatrix& out) {
  const Eigen::Index R = static_cast<Eigen::Index>(P.calib_positions.size());
  query_rows.resize(R, P.d);
  for (Eigen::Index r = 0; r < R; ++r)
    query_rows.row(r) = ConstRowMap(queries.data() + P.calib_positions[static_cast<size_t>(r)] * P.d, 1, P.d);
  score_query_rows(P, query_rows, keys, out);
}

// The sink scores of a KV head's keys [T, d] (left empty without sink heads).
void sink_scores(const Plan& P, const float* keys, std::vector<float>& sink) {
  sink.clear();
  if (const int64_t ch = P.sink_channel(); ch >= 0) {
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(P.d));
    for (int64_t j = 0; j < P.T; ++j) sink.push_back(keys[j * P.d + ch] * inv_sqrt_d);
  }
}

void kv_head_scores(const Plan& P, const std::vector<float>& pos_queries, const float* keys, KvHeadScores& kv,
                    RowMatrix& query_rows) {
  if (!P.ch.positional.empty()) score_rows(P, pos_queries, keys, query_rows, kv.positional);
  sink_scores(P, keys, kv.sink);
}

struct AttentionSummary {
  double entropy_bits = 0;     // mean Shannon entropy over the calibration positions
  double entropy_slope = 0;    // its derivative with respect to β, bits per unit β
  double sink_mass = 0;        // mean mass on the first sink_tokens keys
};

// Four fp64 lanes (GCC's vector extension) and four floats widened into them.
using F64x4 = double __attribute__((vector_size(32)));
using F32x4 = float __attribute__((vector_size(16)));
inline F64x4 widen4(const float* x) {
  F32x4 v;
  std::memcpy(&v, x, sizeof v);
  return __builtin_convertvector(v, F64x4);
}

// The largest of x[0..n) (-Inf for n = 0; x holds no NaN), eight lanes at a time (GCC
// leaves a loop of std::max scalar: the order of a NaN or of two zeros would matter to
// it). A maximum is exact, so any order finds the same value; only the sign of a zero
// maximum could differ, and x - (±0) then gives the same exp and sums.
inline float max_of(const float* x, int64_t n) {
  using F32x8 = float __attribute__((vector_size(32)));
  F32x8 lanes;
  for (int k = 0; k < 8; ++k) lanes[k] = -INFINITY;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    F32x8 v;
    std::memcpy(&v, x + j, sizeof v);
    lanes = lanes > v ? lanes : v;
  }
  float m = -INFINITY;
  for (int k = 0; k < 8; ++k) m = std::max(m, lanes[k]);
  for (; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

// Mean entropy (and its β-derivative) and sink mass of softmax(β·content + positional +
// γ·sink) over the calibration rows. Logits and exponentials in fp32, sums in double.
// dH/dβ = −Cov_p(content, logit) per row (H in nats).
AttentionSummary summarize(const Plan& P, CalibrationScores& sc, double beta, double gamma) {
  AttentionSummary sum;
  const size_t R = P.calib_positions.size();
  const size_t T = static_cast<size_t>(P.T);
  sc.logits.resize(T);
  sc.weights.resize(T);
  float* logits = sc.logits.data();
  float* weights = sc.weights.data();
  const KvHeadScores& kv = *sc.kv;
  const bool has_pos = !P.ch.positional.empty(), has_sink = !kv.sink.empty() && gamma != 0;
  const float b = static_cast<float>(beta), g = static_cast<float>(gamma);
  for (size_t r = 0; r < R; ++r) {
    const int64_t n = P.calib_positions[r] + 1;
    const float* content = sc.content.data() + r * T;
    for (int64_t j = 0; j < n; ++j) logits[j] = b * content[j];
    if (has_pos) {
      const float* positional = kv.positional.data() + r * T;
      for (int64_t j = 0; j < n; ++j) logits[j] += positional[j];
    }
    if (has_sink)
      for (int64_t j = 0; j < n; ++j) logits[j] += g * kv.sink[static_cast<size_t>(j)];
    const float mx = max_of(logits, n);
    for (int64_t j = 0; j < n; ++j) {
      logits[j] -= mx;
      weights[j] = std::exp(logits[j]);
    }
    // Σ e, Σ e·ℓ, Σ e·c, Σ e·c·ℓ in kLanes independent partial sums, key j into lane
    // j % kLanes, in key order: the order is fixed, so results are reproducible on any
    // machine. The whole groups of kLanes keys as two fp64 vectors of four lanes (GCC
    // left the plain loop scalar: a tenth of a 1-thread run of the 8B shape), the same
    // operations per lane.
    constexpr int64_t kLanes = 8;
    double acc_z[kLanes] = {}, acc_l[kLanes] = {}, acc_c[kLanes] = {}, acc_cl[kLanes] = {};
    int64_t j = 0;
    {
      F64x4 vz[2] = {}, vl[2] = {}, vc[2] = {}, vcl[2] = {};
      for (; j + kLanes <= n; j += kLanes)
        for (int half = 0; half < 2; ++half) {
          const int64_t at = j + 4 * half;
          const F64x4 e = widen4(weights + at), l = widen4(logits + at), c = widen4(content + at);
          vz[half] += e;
          vl[half] += e * l;
          vc[half] += e * c;
          vcl[half] += e * c * l;
        }
      for (int64_t k = 0; k < kLanes; ++k) {
        acc_z[k] = vz[k / 4][k % 4];
        acc_l[k] = vl[k / 4][k % 4];
        acc_c[k] = vc[k / 4][k % 4];
        acc_cl[k] = vcl[k / 4][k % 4];
      }
    }
    for (int64_t k = 0; j < n; ++j, ++k) {
      const double e = weights[j], l = logits[j], c = content[j];
      acc_z[k] += e;
      acc_l[k] += e * l;
      acc_c[k] += e * c;
      acc_cl[k] += e * c * l;
    }
    double z = 0, e_logit = 0, e_content = 0, e_content_logit = 0, sink = 0;
    for (int64_t k = 0; k < kLanes; ++k) {
      z += acc_z[k];
      e_logit += acc_l[k];
      e_content += acc_c[k];
      e_content_logit += acc_cl[k];
    }
    for (int64_t k = 0; k < std::min(n, P.spec.sink_tokens); ++k) sink += weights[k];
    const double inv_z = 1.0 / z;
    // H = log Z − E_p[shifted logit], in nats.
    sum.entropy_bits += std::log(z) - e_logit * inv_z;
    sum.entropy_slope -= e_content_logit * inv_z - (e_content * inv_z) * (e_logit * inv_z);
    sum.sink_mass += sink * inv_z;
  }
  const double per_row_bits = 1.0 / (static_cast<double>(R) * std::numbers::ln2);
  sum.entropy_bits *= per_row_bits;
  sum.entropy_slope *= per_row_bits;
  sum.sink_mass /= static_cast<double>(R);
  return sum;
}

// β > 0 with mean entropy H(β) = target, given H(0) > target: safeguarded Newton in
// x = ln β, where H is a smooth decreasing, sigmoid-like curve. Returns the last β
// evaluated and whether the target was reached within kMaxContentGain.
struct GainSolution {
  double beta = 0;
  double entropy_bits = 0;
  bool reached = false;
};

GainSolution solve_content_gain(const Plan& P, CalibrationScores& sc, double target) {
  // Content scores scale with key_scale; so does the useful range of β.
  const double x_start = -std::log(P.spec.key_scale), x_max = x_start + std::log(kMaxContentGain);
  double x_lo = -INFINITY, x_hi = INFINITY;  // H(x_lo) > target > H(x_hi)
  double x = x_start;
  GainSolution sol;
  for (int step = 0; step < kMaxSolverSteps; ++step) {
    const double beta = std::exp(x);
    const AttentionSummary a = summarize(P, sc, beta, 0.0);
    sol.beta = beta;
    sol.entropy_bits = a.entropy_bits;
    const double err = a.entropy_bits - target;
    if (std::abs(err) <= kEntropyTolBits) {
      sol.reached = true;
      return sol;
    }
    if (err > 0) {
      x_lo = x;
      if (x >= x_max) return sol;  // even the largest gain leaves the entropy too high
    } else {
      x_hi = x;
    }
    const double slope = beta * a.entropy_slope;  // dH/dx
    double next = slope < 0 ? x - err / slope : NAN;
    if (std::isfinite(next)) next = std::clamp(next, x - 3.0, x + 3.0);
    if (!(next > x_lo && next < x_hi)) {
      if (std::isfinite(x_lo) && std::isfinite(x_hi)) next = 0.5 * (x_lo + x_hi);
      else next = std::isfinite(x_lo) ? x_lo + 3.0 : x_hi - 3.0;
    }
    if (std::isfinite(x_lo) && std::isfinite(x_hi) && x_hi - x_lo < 1e-12) break;
    x = std::min(next, x_max);
  }
  sol.reached = std::abs(sol.entropy_bits - target) <= 10 * kEntropyTolBits;
  return sol;
}

struct HeadRole {
  bool sink = false;
  double entropy_target = 0;  // bits (sink heads: the lowest slot, for their content part)
};

// Roles of a layer's query heads: a seeded order; the first sink_heads are sink heads,
// the others get entropy targets spread evenly over entropy_mean ± entropy_spread/2.
std::vector<HeadRole> assign_roles(const Plan& P, int64_t l) {
  const SyntheticSpec& s = P.spec;
  std::vector<int64_t> order(static_cast<size_t>(P.Hq));
  for (int64_t h = 0; h < P.Hq; ++h) order[static_cast<size_t>(h)] = h;
  Rng rng(derive_seed({s.seed, kHeadRoles, static_cast<uint64_t>(l)}));
  synth::shuffle(order.data(), P.Hq, rng);
  const int64_t n_sink = P.sink_layer[static_cast<size_t>(l)] ? s.sink_heads : 0;
  const int64_t n_plain = P.Hq - n_sink;
  const double lowest = s.entropy_mean - s.entropy_spread / 2;
  std::vector<HeadRole> roles(static_cast<size_t>(P.Hq));
  for (int64_t i = 0; i < P.Hq; ++i) {
    HeadRole& role = roles[static_cast<size_t>(order[static_cast<size_t>(i)])];
    if (i < n_sink) {
      role.sink = true;
      role.entropy_target = lowest;
    } else {
      const int64_t slot = i - n_sink;
      role.entropy_target = n_plain == 1 ? s.entropy_mean
                                         : lowest + s.entropy_spread * static_cast<double>(slot) /
                                                        static_cast<double>(n_plain - 1);
    }
  }
  return roles;
}

// The random streams of query head h of layer l: which earlier token each query
// targets, and the noise added to its direction (ν per content channel).
struct QueryStreams {
  QueryStreams(const Plan& P, int64_t l, int64_t h)
      : target(derive_seed({P.spec.seed, kQueryTarget, static_cast<uint64_t>(l), static_cast<uint64_t>(h)})),
        noise(derive_seed({P.spec.seed, kQueryNoise, static_cast<uint64_t>(l), static_cast<uint64_t>(h)})),
        noise_sd(kQueryNoiseWeight / std::sqrt(static_cast<double>(P.ch.content.size()))) {}
  Rng target, noise;
  double noise_sd;
};

// One query's content direction: unit(k̂ + ν·noise) over the content channels, k̂ the
// target key's own part normalized, written into q (the other channels untouched); draws
// one noise value per content channel. v: scratch of head_dim doubles. Shared by the
// plain generator (unit_queries) and the bounded-memory one (unit_query_rows).
void unit_query_row(const Plan& P, const float* k, Rng& noise_rng, double noise_sd, std::vector<double>& v,
                    float* q) {
  double knorm2 = 0;
  for (int64_t c : P.ch.content) knorm2 += static_cast<double>(k[c]) * k[c];
  const double kinv = knorm2 > 0 ? 1.0 / std::sqrt(knorm2) : 0.0;
  double vnorm2 = 0;
  for (int64_t c : P.ch.content) {
    const double x = k[c] * kinv + noise_sd * noise_rng.normal();
    v[static_cast<size_t>(c)] = x;
    vnorm2 += x * x;
  }
  const double vinv = 1.0 / std::sqrt(vnorm2);
  for (int64_t c : P.ch.content) q[c] = static_cast<float>(v[static_cast<size_t>(c)] * vinv);
}

// Query content directions q̂_t of one query head into out [T, d] (zero outside the
// content channels; its storage is reused from head to head, so a long context's
// buffer is not faulted in again per head): unit(ẑ_target + ν·noise) with ẑ the target
// key's own part before outlier scaling (post frame, unit norm), target seeded uniformly
// in [0, t].
void unit_queries(const Plan& P, int64_t l, int64_t h, const std::vector<float>& targets_post,
                  std::vector<float>& out) {
  const int64_t T = P.T, d = P.d;
  QueryStreams q(P, l, h);
  out.assign(static_cast<size_t>(T * d), 0.0f);
  std::vector<double> v(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t target = static_cast<int64_t>(q.target.below(static_cast<uint64_t>(t + 1)));
    unit_query_row(P, targets_post.data() + target * d, q.noise, q.noise_sd, v, out.data() + t * d);
  }
}

// Positional query part of one KV head's query heads in the post frame, [T, d]:
// b·(cos(ω t + φ), sin(ω t + φ)) with the KV head's phases φ, so q_pos,t · k_pos,j / √d =
// recency · mean_p cos(ω_p (t − j)).
std::vector<float> positional_queries(const Plan& P, const KeyParts& parts) {
  const int64_t T = P.T, d = P.d, half = d / 2;
  std::vector<float> pre(static_cast<size_t>(T * d), 0.0f);
  const double ratio = P.positional_query_amp / P.positional_key_amp;
  for (size_t k = 0; k < P.ch.positional_freq.size(); ++k) {
    const int64_t lo = P.ch.positional[2 * k], hi = lo + half;
    for (int64_t t = 0; t < T; ++t)  // same angle as the key part; the amplitude is b
      for (int64_t c : {lo, hi})
        pre[static_cast<size_t>(t * d + c)] = static_cast<float>(ratio * parts.fixed[static_cast<size_t>(t * d + c)]);
  }
  return to_post(P, pre);
}

// summarize's mean entropy and sink mass at (β, γ), without the entropy's slope.
struct EntropyAndSinkMass {
  double entropy_bits = 0;
  double sink_mass = 0;
};
EntropyAndSinkMass entropy_and_sink_mass(const Plan& P, CalibrationScores& scores, double beta, double gamma) {
  const AttentionSummary a = summarize(P, scores, beta, gamma);
  return {a.entropy_bits, a.sink_mass};
}

// The attention with no content gain and no sink bonus, entropy_and_sink_mass(P, scores,
// 0, 0), reads the head's content scores c only through 0·c = ±0 (c is finite), which
// leaves every logit's value, the exps and the sums as they are: the same bits for every
// query head of a KV head.
EntropyAndSinkMass zero_gain_summary(const Plan& P, CalibrationScores& scores) {
  return entropy_and_sink_mass(P, scores, 0.0, 0.0);
}

// Calibrates one query head: β so that the mean entropy hits its target (sink heads: the
// content slot without the sink bonus), then, for sink heads, γ so that the mean sink
// mass hits sink_mass. at_zero: zero_gain_summary of these scores (or of another query
// head of the same KV head: the same).
SyntheticHeadReport calibrate_head(const Plan& P, const HeadRole& role, CalibrationScores& scores,
                                   const EntropyAndSinkMass& at_zero, const std::string& where,
                                   std::vector<std::string>& warnings) {
  const SyntheticSpec& s = P.spec;
  SyntheticHeadReport rep;
  rep.sink = role.sink;

  double target = role.entropy_target;
  const double h_max = at_zero.entropy_bits;
  double beta = 0;
  if (target >= h_max - kEntropyTolBits) {
    if (target > h_max + 0.01)
      warnings.push_back(where + ": entropy target " + approx(target) + " bits exceeds the " + approx(h_max) +
                         " bits the causal prefix (and recency) allow; clamped (entropy_mean/entropy_spread)");
    target = std::min(target, h_max);
  } else {
    const GainSolution sol = solve_content_gain(P, scores, target);
    beta = sol.beta;
    if (!sol.reached) {
      warnings.push_back(where + ": entropy target " + approx(target) + " bits not reached; got " +
                         approx(sol.entropy_bits) + " bits (entropy_mean/entropy_spread)");
      target = sol.entropy_bits;
    }
  }
  rep.entropy_target = target;
  rep.content_gain = beta;

  double gamma = 0;
  if (role.sink) {
    // γ·σ/√d is the score bonus of a sink key, in nats.
    const double gmax = kMaxSinkBonusNats * std::sqrt(static_cast<double>(P.d)) / P.sink_key_value;
    auto mass_at = [&](double g) { return summarize(P, scores, beta, g).sink_mass; };
    const double m_lo = mass_at(-gmax), m_hi = mass_at(gmax);
    if (s.sink_mass <= m_lo || s.sink_mass >= m_hi) {
      const bool low = s.sink_mass <= m_lo;
      gamma = low ? -gmax : gmax;
      warnings.push_back(where + ": sink_mass " + approx(s.sink_mass) + " outside the reachable [" + approx(m_lo) + ", " +
                         approx(m_hi) + "]; clamped");
    } else {
      gamma = solve_bracketed(mass_at, -gmax, m_lo, gmax, m_hi, s.sink_mass, kSinkMassTol);
    }
  }
  rep.sink_gain = gamma;
  // A head whose target the causal prefix caps keeps β = γ = 0 (no sink role): its
  // summary is at_zero, and it computes none.
  const EntropyAndSinkMass calibrated =
      beta == 0 && gamma == 0 ? at_zero : entropy_and_sink_mass(P, scores, beta, gamma);
  rep.entropy_calibrated = calibrated.entropy_bits;
  rep.sink_mass_calibrated = calibrated.sink_mass;
  return rep;
}

// ---------------------------------------------------------------------------
// One layer
// ---------------------------------------------------------------------------

struct LayerResult {
  LayerTensors tensors;
  SyntheticLayerReport report;
  std::vector<std::string> warnings;
};

// The reference: every KV head's key parts [T, d] and query targets held at once, every
// query built at every position; generate_synthetic_reference runs it on every layer in
// parallel.
LayerResult generate_layer_reference(const Plan& P, int64_t l, const SyntheticKeep& keep) {
  const SyntheticSpec& s = P.spec;
  const int64_t G = P.G, T = P.T, d = P.d, Hq = P.Hq;
  const std::string layer_where = "layer " + std::to_string(l);
  LayerResult out;
  out.report.outlier_channels.resize(static_cast<size_t>(G));

  // Keys: parts per KV head, head-averaged post frame parts for the ρ calibration.
  std::vector<KeyParts> parts(static_cast<size_t>(G));
  std::vector<std::vector<float>> query_targets(static_cast<size_t>(G));  // post frame own_unscaled
  std::vector<double> mean_shared(static_cast<size_t>(T * d), 0.0), mean_own(mean_shared.size(), 0.0),
      mean_fixed(mean_shared.size(), 0.0);
  for (int64_t g = 0; g < G; ++g) {
    KeyParts& kp = parts[static_cast<size_t>(g)];
    kp = make_key_parts(P, l, g);
    out.report.outlier_channels[static_cast<size_t>(g)] = kp.outliers;
    query_targets[static_cast<size_t>(g)] = to_post(P, kp.own_unscaled);
    kp.own_unscaled = std::vector<float>();  // freed: a long context holds one [T, d] buffer less per KV head
    // One post-frame part at a time (each mean is its own sum): one [T, d] buffer, not three.
    for (auto [part, mean] : {std::pair{&kp.shared, &mean_shared}, std::pair{&kp.own, &mean_own},
                              std::pair{&kp.fixed, &mean_fixed}}) {
      const std::vector<float> post = to_post(P, *part);
      for (size_t i = 0; i < mean->size(); ++i) (*mean)[i] += post[i];
    }
  }
  double w[2] = {0, 0};
  w[0] = solve_shared_weight(P, mean_shared.data(), mean_own.data(), mean_fixed.data(), 0, P.boundary, s.rho_first,
                             layer_where + " phase 1 (rho_first)", out.warnings);
  if (P.num_phases() == 2)
    w[1] = solve_shared_weight(P, mean_shared.data(), mean_own.data(), mean_fixed.data(), P.boundary, T, s.rho_second,
                               layer_where + " phase 2 (rho_second)", out.warnings);
  out.report.shared_weight_first = w[0];
  out.report.shared_weight_second = P.num_phases() == 2 ? w[1] : w[0];

  for (std::vector<double>* mean : {&mean_shared, &mean_own, &mean_fixed}) *mean = std::vector<double>();  // freed

  LayerTensors& L = out.tensors;
  L.key = Tensor({G, T, d});
  const bool keep_pre = s.rope && keep.key_pre_rope;
  if (keep_pre) L.key_pre_rope = Tensor({G, T, d});
  std::vector<float> pre_scratch(s.rope && !keep_pre ? static_cast<size_t>(T * d) : 0);  // pre frame, not kept
  for (int64_t g = 0; g < G; ++g) {
    KeyParts& kp = parts[static_cast<size_t>(g)];
    float* pre = keep_pre ? L.key_pre_rope.slice(g) : s.rope ? pre_scratch.data() : L.key.slice(g);
    for (int64_t t = 0; t < T; ++t) {
      const double ph_w = w[P.phase_of(t)];
      const float a = static_cast<float>(std::sqrt(ph_w)), b = static_cast<float>(std::sqrt(1.0 - ph_w));
      for (int64_t c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(t * d + c);
        pre[t * d + c] = a * kp.shared[i] + b * kp.own[i] + kp.fixed[i];
      }
    }
    if (s.rope) {
      std::copy(pre, pre + T * d, L.key.slice(g));
      apply_rope(L.key.slice(g), *P.rope);
    }
    kp.shared = std::vector<float>();  // freed: only `fixed` is read below
    kp.own = std::vector<float>();
  }
  pre_scratch = std::vector<float>();

  // Values.
  L.value = Tensor({G, T, d});
  for (int64_t g = 0; g < G; ++g) {
    Rng rng(derive_seed({s.seed, kValues, static_cast<uint64_t>(l), static_cast<uint64_t>(g)}));
    float* v = L.value.slice(g);
    for (int64_t i = 0; i < T * d; ++i) v[i] = static_cast<float>(s.value_scale * rng.normal());
  }

  // Queries, calibrated head by head against the final keys.
  const std::vector<HeadRole> roles = assign_roles(P, l);
  out.report.heads.resize(static_cast<size_t>(Hq));
  // Kept rows: row r of each head is position kept[r] (every position when none are named).
  const bool sparse = !keep.query_positions.empty();
  const int64_t rows = sparse ? static_cast<int64_t>(keep.query_positions.size()) : T;
  auto position_of = [&](int64_t r) { return sparse ? keep.query_positions[static_cast<size_t>(r)] : r; };
  L.query = Tensor({Hq, rows, d});
  if (sparse) L.query_positions = keep.query_positions;
  const int64_t sc = P.sink_channel();
  KvHeadScores kv_scores;
  CalibrationScores scores;
  scores.kv = &kv_scores;
  std::vector<float> unit_q;  // [T, d], one query head's at a time
  for (int64_t g = 0; g < G; ++g) {
    const float* keys = L.key.slice(g);
    const std::vector<float> pos_q = positional_queries(P, parts[static_cast<size_t>(g)]);
    kv_head_scores(P, pos_q, keys, kv_scores, scores.query_rows);
    for (int64_t h = g * P.group; h < (g + 1) * P.group; ++h) {
      unit_queries(P, l, h, query_targets[static_cast<size_t>(g)], unit_q);
      score_rows(P, unit_q, keys, scores.query_rows, scores.content);
      const std::string where = layer_where + " q head " + std::to_string(h);
      const SyntheticHeadReport rep = calibrate_head(P, roles[static_cast<size_t>(h)], scores,
                                                     zero_gain_summary(P, scores), where, out.warnings);
      out.report.heads[static_cast<size_t>(h)] = rep;
      const float beta = static_cast<float>(rep.content_gain), gamma = static_cast<float>(rep.sink_gain);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = position_of(r);
        float* q = L.query.slice(h) + r * d;
        for (int64_t c = 0; c < d; ++c) {
          const size_t i = static_cast<size_t>(t * d + c);
          q[c] = beta * unit_q[i] + pos_q[i];
        }
        if (sc >= 0 && gamma != 0.0f) q[sc] += gamma;
      }
    }
    query_targets[static_cast<size_t>(g)] = std::vector<float>();  // freed: this KV head's queries are done
    parts[static_cast<size_t>(g)].fixed = std::vector<float>();
  }
  return out;
}

// ---------------------------------------------------------------------------
// One layer, bounded memory (what generate_synthetic runs)
// ---------------------------------------------------------------------------
//
// The same numbers as generate_layer_reference, bit for bit, from a working set that
// does not hold every KV head's [T, d] parts: of a key's parts only the own Gaussian part
// needs its random stream and is kept, in the layer's own key buffer until the key is
// final; the shared and fixed parts are cheap functions of (layer, KV head, token) and
// are recomputed row by row. Queries are only ever read at the calibration rows and the
// kept rows, so only those rows are built (their random streams still run over every
// token, for the same draws), and of the target keys' own parts only the rows those
// queries look for are kept. Work is parallel inside the layer (over KV heads, rows and
// query heads), so one layer is in flight whatever the thread count; every reduction
// keeps the reference's order.

// The small constants of one KV head's key parts (what make_key_parts draws besides
// the own Gaussian parts), from which any row of `shared` and `fixed` is computed.
struct KeyHeadConstants {
  std::vector<int64_t> outliers;        // channels scaled by outlier_scale, sorted
  std::vector<double> scale;            // [d] D: outlier_scale on the outliers, else 1
  std::vector<std::vector<double>> u;   // [phases][d] the shared direction per phase
  std::vector<double> phi;              // [positional pairs] phase of each positional pair
};

KeyHeadConstants key_head_constants(const Plan& P, int64_t l, int64_t g) {
  const SyntheticSpec& s = P.spec;
  const uint64_t ul = static_cast<uint64_t>(l), ug = static_cast<uint64_t>(g);
  KeyHeadConstants kc;
  kc.outliers = choose_outlier_channels(P, l, g);
  kc.scale.assign(static_cast<size_t>(P.d), 1.0);
  for (int64_t c : kc.outliers) kc.scale[static_cast<size_t>(c)] = s.outlier_scale;
  const double per_channel = P.shared_amplitude / std::sqrt(static_cast<double>(P.ch.shared.size()));
  kc.u.resize(static_cast<size_t>(P.num_phases()));
  for (int64_t ph = 0; ph < P.num_phases(); ++ph) {
    Rng rng(derive_seed({s.seed, kSharedDirection, ul, ug, static_cast<uint64_t>(ph)}));
    kc.u[static_cast<size_t>(ph)].assign(static_cast<size_t>(P.d), 0.0);
    for (int64_t c : P.ch.shared) kc.u[static_cast<size_t>(ph)][static_cast<size_t>(c)] = rng.sign() * per_channel;
  }
  Rng phase_rng(derive_seed({s.seed, kPositionalPhase, ul, ug}));
  for (size_t k = 0; k < P.ch.positional_freq.size(); ++k) kc.phi.push_back(2.0 * std::numbers::pi * phase_rng.uniform());
  return kc;
}

// Row t of a KV head's shared part, pre frame, into row [d] (make_key_parts' `shared`).
void shared_row(const Plan& P, const KeyHeadConstants& kc, int64_t t, float* row) {
  std::fill(row, row + P.d, 0.0f);
  const std::vector<double>& ut = kc.u[static_cast<size_t>(P.phase_of(t))];
  for (int64_t c : P.ch.content) row[c] = static_cast<float>(kc.scale[static_cast<size_t>(c)] * ut[static_cast<size_t>(c)]);
}

// Row t of a KV head's fixed part (positional pairs + sink component), pre frame, into
// row [d] (make_key_parts' `fixed`).
void fixed_row(const Plan& P, const KeyHeadConstants& kc, int64_t t, float* row) {
  const SyntheticSpec& s = P.spec;
  const int64_t half = P.d / 2;
  std::fill(row, row + P.d, 0.0f);
  for (size_t k = 0; k < P.ch.positional_freq.size(); ++k) {
    const int64_t lo = P.ch.positional[2 * k], hi = lo + half;
    const double omega = s.rope ? 0.0 : P.ch.positional_freq[k];
    const double angle = omega * static_cast<double>(t) + kc.phi[k];
    row[lo] = static_cast<float>(P.positional_key_amp * std::cos(angle));
    row[hi] = static_cast<float>(P.positional_key_amp * std::sin(angle));
  }
  if (const int64_t sc = P.sink_channel(); sc >= 0 && t < s.sink_tokens) row[sc] = static_cast<float>(P.sink_key_value);
}

// A pre-frame row at position t into the post frame, in place (RoPE's own row rotation:
// the same floats as rotating the whole [T, d] buffer).
void row_to_post(const Plan& P, float* row, int64_t t) {
  if (P.rope) apply_rope_row(row, *P.rope, t);
}

// The query rows a layer builds: the calibration positions and the kept positions.
struct QueryRowPlan {
  std::vector<int64_t> positions;  // sorted, distinct: calib_positions ∪ kept positions
  std::vector<int64_t> row_of;     // [T] index into positions, −1 for a position not built
  std::vector<int64_t> calib_rows; // [R] row of calib_positions[r]
};

QueryRowPlan plan_query_rows(const Plan& P, const SyntheticKeep& keep) {
  QueryRowPlan qr;
  if (keep.query_positions.empty()) {  // every position is kept
    qr.positions.resize(static_cast<size_t>(P.T));
    for (int64_t t = 0; t < P.T; ++t) qr.positions[static_cast<size_t>(t)] = t;
  } else {
    std::set_union(P.calib_positions.begin(), P.calib_positions.end(), keep.query_positions.begin(),
                   keep.query_positions.end(), std::back_inserter(qr.positions));
  }
  qr.row_of.assign(static_cast<size_t>(P.T), -1);
  for (size_t i = 0; i < qr.positions.size(); ++i) qr.row_of[static_cast<size_t>(qr.positions[i])] = static_cast<int64_t>(i);
  for (int64_t t : P.calib_positions) qr.calib_rows.push_back(qr.row_of[static_cast<size_t>(t)]);
  return qr;
}

// The key each built query row of query head h looks for (QueryStreams::target: one
// draw per token), [positions.size()].
std::vector<int64_t> query_targets_at(const Plan& P, int64_t l, int64_t h, const QueryRowPlan& qr) {
  Rng target_rng = QueryStreams(P, l, h).target;
  std::vector<int64_t> targets(qr.positions.size());
  for (int64_t t = 0; t < P.T; ++t) {
    const int64_t target = static_cast<int64_t>(target_rng.below(static_cast<uint64_t>(t + 1)));
    if (const int64_t row = qr.row_of[static_cast<size_t>(t)]; row >= 0) targets[static_cast<size_t>(row)] = target;
  }
  return targets;
}

// Rows of a KV head's own parts before outlier scaling, post frame, at the tokens its
// query heads' built rows look for (the reference's query_targets, only where read).
struct TargetRows {
  int64_t d = 0;
  std::vector<int64_t> tokens;  // sorted, distinct
  std::vector<float> rows;      // [tokens.size(), d]
  const float* at(int64_t t) const {  // t must be one of `tokens`
    return rows.data() + (std::lower_bound(tokens.begin(), tokens.end(), t) - tokens.begin()) * d;
  }
};

// A KV head's own parts: the D-scaled ones, pre frame, into own [T, d] (make_key_parts'
// `own`; the content channels only are written, the others must be zero), and the
// unscaled ones at target.tokens into target.rows, post frame.
void generate_own_parts(const Plan& P, int64_t l, int64_t g, const KeyHeadConstants& kc, float* own,
                        TargetRows& target) {
  const SyntheticSpec& s = P.spec;
  const int64_t d = P.d;
  target.d = d;
  target.rows.assign(target.tokens.size() * static_cast<size_t>(d), 0.0f);
  Rng own_rng(derive_seed({s.seed, kKeyOwn, static_cast<uint64_t>(l), static_cast<uint64_t>(g)}));
  size_t next = 0;  // next target token
  for (int64_t t = 0; t < P.T; ++t) {
    const bool is_target = next < target.tokens.size() && target.tokens[next] == t;
    float* unscaled = is_target ? target.rows.data() + next * static_cast<size_t>(d) : nullptr;
    for (int64_t c : P.ch.content) {
      const double D = kc.scale[static_cast<size_t>(c)];
      const double z = s.key_scale * own_rng.normal();
      own[t * d + c] = static_cast<float>(D * z);
      if (unscaled) unscaled[c] = static_cast<float>(z);
    }
    if (unscaled) {
      row_to_post(P, unscaled, t);
      ++next;
    }
  }
}

// The values of KV head g, [T, d].
void generate_values(const Plan& P, int64_t l, int64_t g, float* v) {
  Rng rng(derive_seed({P.spec.seed, kValues, static_cast<uint64_t>(l), static_cast<uint64_t>(g)}));
  for (int64_t i = 0; i < P.T * P.d; ++i) v[i] = static_cast<float>(P.spec.value_scale * rng.normal());
}

// Head-averaged post-frame parts (sums over KV heads 0..G−1 in that order, as the
// reference adds them), [T, d] double each: what the ρ calibration reads.
struct MeanParts {
  std::unique_ptr<double[]> shared, own, fixed;  // written (first touched) by the parallel blocks
};

// own_pre: the layer's key tensor [G, T, d] holding every KV head's own parts (pre frame).
MeanParts mean_parts(const Plan& P, const std::vector<KeyHeadConstants>& kc, const Tensor& own_pre) {
  const int64_t T = P.T, d = P.d, G = P.G;
  MeanParts m;
  for (std::unique_ptr<double[]>* v : {&m.shared, &m.own, &m.fixed})
    *v = std::make_unique_for_overwrite<double[]>(static_cast<size_t>(T * d));
  parallel_for_rethrow((T + kTokenBlock - 1) / kTokenBlock, [&](int64_t b) {
    std::vector<float> row(static_cast<size_t>(d));
    for (int64_t t = b * kTokenBlock; t < std::min(T, (b + 1) * kTokenBlock); ++t) {
      const size_t at = static_cast<size_t>(t * d);
      for (std::unique_ptr<double[]>* v : {&m.shared, &m.own, &m.fixed}) std::fill_n(v->get() + at, d, 0.0);
      for (int64_t g = 0; g < G; ++g) {
        const KeyHeadConstants& k = kc[static_cast<size_t>(g)];
        shared_row(P, k, t, row.data());
        row_to_post(P, row.data(), t);
        for (int64_t c = 0; c < d; ++c) m.shared[at + static_cast<size_t>(c)] += row[static_cast<size_t>(c)];
        std::copy(own_pre.slice(g) + t * d, own_pre.slice(g) + (t + 1) * d, row.begin());
        row_to_post(P, row.data(), t);
        for (int64_t c = 0; c < d; ++c) m.own[at + static_cast<size_t>(c)] += row[static_cast<size_t>(c)];
        fixed_row(P, k, t, row.data());
        row_to_post(P, row.data(), t);
        for (int64_t c = 0; c < d; ++c) m.fixed[at + static_cast<size_t>(c)] += row[static_cast<size_t>(c)];
      }
    }
  });
  return m;
}

// KV head g's final keys from its own parts: key = √w·shared + √(1−w)·own + fixed per
// token (w of the token's phase), pre frame into pre [T, d] (may be `own` itself), then
// rotated into post [T, d] with RoPE (post == pre without RoPE).
void finish_keys(const Plan& P, const KeyHeadConstants& kc, const double w[2], const float* own, float* pre,
                 float* post) {
  const int64_t T = P.T, d = P.d;
  std::vector<float> sh(static_cast<size_t>(d)), fx(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    const double ph_w = w[P.phase_of(t)];
    const float a = static_cast<float>(std::sqrt(ph_w)), b = static_cast<float>(std::sqrt(1.0 - ph_w));
    shared_row(P, kc, t, sh.data());
    fixed_row(P, kc, t, fx.data());
    for (int64_t c = 0; c < d; ++c)
      pre[t * d + c] = a * sh[static_cast<size_t>(c)] + b * own[t * d + c] + fx[static_cast<size_t>(c)];
  }
  if (P.rope) {
    if (post != pre) std::copy(pre, pre + T * d, post);
    apply_rope(post, *P.rope);
  }
}

// Positional query rows of a KV head's query heads at the built positions, post frame,
// [positions.size(), d] (the reference's positional_queries, only where read).
std::vector<float> positional_query_rows(const Plan& P, const KeyHeadConstants& kc, const QueryRowPlan& qr) {
  const int64_t d = P.d, half = d / 2;
  const double ratio = P.positional_query_amp / P.positional_key_amp;
  std::vector<float> out(qr.positions.size() * static_cast<size_t>(d), 0.0f), fx(static_cast<size_t>(d));
  for (size_t i = 0; i < qr.positions.size(); ++i) {
    const int64_t t = qr.positions[i];
    float* row = out.data() + i * static_cast<size_t>(d);
    fixed_row(P, kc, t, fx.data());
    for (size_t k = 0; k < P.ch.positional_freq.size(); ++k) {
      const int64_t lo = P.ch.positional[2 * k], hi = lo + half;
      for (int64_t c : {lo, hi}) row[c] = static_cast<float>(ratio * fx[static_cast<size_t>(c)]);
    }
    row_to_post(P, row, t);
  }
  return out;
}

// Query content directions of query head h at the built positions into out
// [positions.size(), d] (unit_queries' rows there; its noise stream still draws for
// every token).
void unit_query_rows(const Plan& P, int64_t l, int64_t h, const QueryRowPlan& qr, const TargetRows& targets,
                     std::vector<float>& out) {
  const int64_t T = P.T, d = P.d;
  QueryStreams q(P, l, h);
  out.assign(qr.positions.size() * static_cast<size_t>(d), 0.0f);
  std::vector<double> v(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t target = static_cast<int64_t>(q.target.below(static_cast<uint64_t>(t + 1)));
    const int64_t row = qr.row_of[static_cast<size_t>(t)];
    if (row < 0) {  // not built: the same draws, no arithmetic
      for (size_t c = 0; c < P.ch.content.size(); ++c) (void)q.noise.normal();
      continue;
    }
    unit_query_row(P, targets.at(target), q.noise, q.noise_sd, v, out.data() + row * d);
  }
}

// rows [positions.size(), d] at the calibration rows, [R, d].
void gather_calibration_rows(const Plan& P, const QueryRowPlan& qr, const std::vector<float>& rows, RowMatrix& out) {
  const Eigen::Index R = static_cast<Eigen::Index>(qr.calib_rows.size());
  out.resize(R, P.d);
  for (Eigen::Index r = 0; r < R; ++r)
    out.row(r) = ConstRowMap(rows.data() + qr.calib_rows[static_cast<size_t>(r)] * P.d, 1, P.d);
}

// Bytes of calibration scratch a layer may hold at once however small its keys and
// values are (calibration_workers).
constexpr double kCalibrationScratchFloor = 1024.0 * 1024.0 * 1024.0;

// How many query heads calibrate at once: as many as the larger of one layer's keys and
// values' worth of scratch and kCalibrationScratchFloor holds (at least one, at most
// q_heads), whatever the thread count. Each head's scratch is [R, T] content scores
// (R = calibration positions) and its query rows: 5.5 MB a head at 2048 tokens, so the
// floor lets every head of the 8B shape (32) calibrate at once up to about 25,000
// tokens; one layer's keys and values alone (16.8 MB at 2048 tokens) held 3, which
// left 13 of 16 threads idle for the calibration, a quarter of a 1-thread run. Which
// worker calibrates a head does not change its numbers.
int calibration_workers(const Plan& P, const QueryRowPlan& qr) {
  const double R = static_cast<double>(P.calib_positions.size()), T = static_cast<double>(P.T);
  const double per_head = 4.0 * (R * T + 2.0 * T + R * static_cast<double>(P.d) +
                                 static_cast<double>(qr.positions.size()) * static_cast<double>(P.d));
  const double layer_kv = 4.0 * 2.0 * static_cast<double>(P.G) * T * static_cast<double>(P.d);
  const double fit = std::floor(std::max(layer_kv, kCalibrationScratchFloor) / per_head);
  return static_cast<int>(std::clamp<double>(fit, 1.0, static_cast<double>(P.Hq)));
}

// parallel_for_rethrow on at most max_workers threads; body(i, worker) with worker in
// [0, max_workers) names the calling thread's scratch.
template <class Body>
void parallel_for_workers(int64_t n, int max_workers, Body&& body) {
  const int workers = std::max(1, std::min(max_workers, omp_get_max_threads()));
  std::vector<std::exception_ptr> failures(static_cast<size_t>(n > 0 ? n : 0));
#pragma omp parallel for schedule(dynamic, 1) num_threads(workers)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i, omp_get_thread_num());
    } catch (...) {
      failures[static_cast<size_t>(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& f : failures)
    if (f) std::rethrow_exception(f);
}

// Query rows a layer keeps: the kept positions', or every position's.
int64_t query_rows_kept(const Plan& P, const SyntheticKeep& keep) {
  return keep.query_positions.empty() ? P.T : static_cast<int64_t>(keep.query_positions.size());
}

// A layer's zeroed key and value tensors [G, T, d] (and pre-RoPE keys when kept) and
// query tensor [Hq, kept rows (T when every position is kept), d]: the storage
// generate_layer fills. Zeroing them is the first touch of about one layer's tensors,
// page faults included: generate_synthetic has it done on a helper thread while the
// previous layer is generated. (The queries were zeroed in generate_layer itself, on one
// thread between its parallel steps: with every position kept, 4 % of the CPU samples
// of a 2-thread run of 4 layers of the 8B shape at 2048 tokens, serial at any thread
// count.)
LayerTensors allocate_layer(const Plan& P, const SyntheticKeep& keep) {
  LayerTensors L;
  L.key = Tensor({P.G, P.T, P.d});
  L.value = Tensor({P.G, P.T, P.d});
  if (P.spec.rope && keep.key_pre_rope) L.key_pre_rope = Tensor({P.G, P.T, P.d});
  L.query = Tensor({P.Hq, query_rows_kept(P, keep), P.d});
  return L;
}

// storage: allocate_layer's.
LayerResult generate_layer(const Plan& P, int64_t l, const SyntheticKeep& keep, LayerTensors storage) {
  const SyntheticSpec& s = P.spec;
  const int64_t G = P.G, T = P.T, d = P.d, Hq = P.Hq;
  const std::string layer_where = "layer " + std::to_string(l);
  LayerResult out;
  out.tensors = std::move(storage);
  LayerTensors& L = out.tensors;

  // Which query rows are built, and which target keys they look for, per KV head.
  const QueryRowPlan qr = plan_query_rows(P, keep);
  std::vector<KeyHeadConstants> kc(static_cast<size_t>(G));
  std::vector<TargetRows> targets(static_cast<size_t>(G));
  parallel_for_rethrow(G, [&](int64_t g) {
    kc[static_cast<size_t>(g)] = key_head_constants(P, l, g);
    std::vector<int64_t>& tokens = targets[static_cast<size_t>(g)].tokens;
    for (int64_t h = g * P.group; h < (g + 1) * P.group; ++h) {
      const std::vector<int64_t> t_h = query_targets_at(P, l, h, qr);
      tokens.insert(tokens.end(), t_h.begin(), t_h.end());
    }
    std::sort(tokens.begin(), tokens.end());
    tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  });
  out.report.outlier_channels.resize(static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) out.report.outlier_channels[static_cast<size_t>(g)] = kc[static_cast<size_t>(g)].outliers;

  // Own key parts (pre frame) into the key tensor, where the keys are finished in place;
  // the values beside them: 2G independent streams.
  parallel_for_rethrow(2 * G, [&](int64_t task) {
    const int64_t g = task % G;
    if (task < G) generate_own_parts(P, l, g, kc[static_cast<size_t>(g)], L.key.slice(g), targets[static_cast<size_t>(g)]);
    else generate_values(P, l, g, L.value.slice(g));
  });

  // The shared weight per phase, from the head-averaged parts (freed after).
  double w[2] = {0, 0};
  {
    const MeanParts m = mean_parts(P, kc, L.key);
    w[0] = solve_shared_weight(P, m.shared.get(), m.own.get(), m.fixed.get(), 0, P.boundary, s.rho_first,
                               layer_where + " phase 1 (rho_first)", out.warnings);
    if (P.num_phases() == 2)
      w[1] = solve_shared_weight(P, m.shared.get(), m.own.get(), m.fixed.get(), P.boundary, T, s.rho_second,
                                 layer_where + " phase 2 (rho_second)", out.warnings);
  }
  out.report.shared_weight_first = w[0];
  out.report.shared_weight_second = P.num_phases() == 2 ? w[1] : w[0];

  // Final keys; per KV head its positional query rows and the scores its query heads share.
  const bool keep_pre = s.rope && keep.key_pre_rope;
  std::vector<std::vector<float>> pos_rows(static_cast<size_t>(G));  // [G][positions.size() * d]
  std::vector<KvHeadScores> kv_scores(static_cast<size_t>(G));
  parallel_for_rethrow(G, [&](int64_t g) {
    const KeyHeadConstants& k = kc[static_cast<size_t>(g)];
    float* key = L.key.slice(g);
    finish_keys(P, k, w, key, keep_pre ? L.key_pre_rope.slice(g) : key, key);
    pos_rows[static_cast<size_t>(g)] = positional_query_rows(P, k, qr);
    KvHeadScores& kv = kv_scores[static_cast<size_t>(g)];
    if (!P.ch.positional.empty()) {
      RowMatrix query_rows;
      gather_calibration_rows(P, qr, pos_rows[static_cast<size_t>(g)], query_rows);
      score_query_rows(P, query_rows, key, kv.positional);
    }
    sink_scores(P, key, kv.sink);
  });

  // Queries, calibrated head by head against the final keys, a bounded number at once.
  const std::vector<HeadRole> roles = assign_roles(P, l);
  out.report.heads.resize(static_cast<size_t>(Hq));
  const bool sparse = !keep.query_positions.empty();
  const int64_t rows = query_rows_kept(P, keep);
  if (L.query.shape != std::vector<int64_t>{Hq, rows, d})
    throw Error("internal: generate_layer's storage has no query tensor of the kept rows (allocate_layer)");
  if (sparse) L.query_positions = keep.query_positions;
  const int64_t sc = P.sink_channel();
  const int workers = calibration_workers(P, qr);
  struct Scratch {
    CalibrationScores scores;
    std::vector<float> unit_q;  // [positions.size(), d]
  };
  std::vector<Scratch> scratch(static_cast<size_t>(workers));
  std::vector<std::vector<std::string>> head_warnings(static_cast<size_t>(Hq));
  // The order heads start in: sink heads (they solve for γ too), then by entropy target,
  // lowest first. A target below what the causal prefix allows is solved for (about
  // twice the work of a head clamped at β = 0), so the costly heads start first and
  // each thread's last heads are cheap: a shorter tail at 16 threads, 2 heads a thread.
  // Which thread calibrates a head, and when, does not change its numbers.
  std::vector<int64_t> head_order(static_cast<size_t>(Hq));
  std::iota(head_order.begin(), head_order.end(), 0);
  std::stable_sort(head_order.begin(), head_order.end(), [&](int64_t a, int64_t b) {
    const HeadRole &ra = roles[static_cast<size_t>(a)], &rb = roles[static_cast<size_t>(b)];
    if (ra.sink != rb.sink) return ra.sink;
    return ra.entropy_target < rb.entropy_target;
  });
  // Per KV head, its zero-gain summary: computed by the first of its query heads to
  // calibrate (which one does not change it: zero_gain_summary).
  std::vector<EntropyAndSinkMass> zero_gain(static_cast<size_t>(G));
  const std::unique_ptr<std::once_flag[]> zero_gain_once(new std::once_flag[static_cast<size_t>(G)]);
  parallel_for_workers(Hq, workers, [&](int64_t i, int worker) {
    const int64_t h = head_order[static_cast<size_t>(i)];
    Scratch& x = scratch[static_cast<size_t>(worker)];
    const int64_t g = h / P.group;
    unit_query_rows(P, l, h, qr, targets[static_cast<size_t>(g)], x.unit_q);
    gather_calibration_rows(P, qr, x.unit_q, x.scores.query_rows);
    score_query_rows(P, x.scores.query_rows, L.key.slice(g), x.scores.content);
    x.scores.kv = &kv_scores[static_cast<size_t>(g)];
    std::call_once(zero_gain_once[static_cast<size_t>(g)],
                   [&] { zero_gain[static_cast<size_t>(g)] = zero_gain_summary(P, x.scores); });
    const std::string where = layer_where + " q head " + std::to_string(h);
    const SyntheticHeadReport rep = calibrate_head(P, roles[static_cast<size_t>(h)], x.scores,
                                                   zero_gain[static_cast<size_t>(g)], where,
                                                   head_warnings[static_cast<size_t>(h)]);
    out.report.heads[static_cast<size_t>(h)] = rep;
    const float beta = static_cast<float>(rep.content_gain), gamma = static_cast<float>(rep.sink_gain);
    const std::vector<float>& pos_q = pos_rows[static_cast<size_t>(g)];
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = qr.row_of[static_cast<size_t>(sparse ? keep.query_positions[static_cast<size_t>(r)] : r)];
      float* q = L.query.slice(h) + r * d;
      for (int64_t c = 0; c < d; ++c) q[c] = beta * x.unit_q[static_cast<size_t>(i * d + c)] + pos_q[static_cast<size_t>(i * d + c)];
      if (sc >= 0 && gamma != 0.0f) q[sc] += gamma;
    }
  });
  for (const std::vector<std::string>& hw : head_warnings) out.warnings.insert(out.warnings.end(), hw.begin(), hw.end());
  return out;
}

// ---------------------------------------------------------------------------
// Recording-level pieces
// ---------------------------------------------------------------------------

std::vector<int64_t> make_token_ids(const Plan& P) {
  const SyntheticSpec& s = P.spec;
  Rng rng(derive_seed({s.seed, kTokenIds}));
  std::vector<int64_t> ids(static_cast<size_t>(P.T));
  for (int64_t& id : ids) {
    do id = static_cast<int64_t>(rng.below(256));
    while (id == s.phase_marker);  // the marker appears only at the boundary
  }
  if (P.boundary < P.T) ids[static_cast<size_t>(P.boundary)] = s.phase_marker;
  return ids;
}

std::map<std::string, std::string> spec_metadata(const SyntheticSpec& s) {
  std::map<std::string, std::string> m;
  auto put = [&](const char* key, const std::string& v) { m[std::string("synthetic.") + key] = v; };
  put("seed", std::to_string(s.seed));
  put("layers", num(s.layers));
  put("q_heads", num(s.q_heads));
  put("kv_heads", num(s.kv_heads));
  put("head_dim", num(s.head_dim));
  put("tokens", num(s.tokens));
  put("entropy_mean", num(s.entropy_mean));
  put("entropy_spread", num(s.entropy_spread));
  put("sink_tokens", num(s.sink_tokens));
  put("sink_heads", num(s.sink_heads));
  put("sink_mass", num(s.sink_mass));
  put("sink_layers", num(s.sink_layers));
  put("recency", num(s.recency));
  put("recency_scale", num(s.recency_scale));
  put("outlier_channels", num(s.outlier_channels));
  put("outlier_scale", num(s.outlier_scale));
  put("rope", s.rope ? "true" : "false");
  put("rope_theta", num(s.rope_theta));
  put("phase_fraction", num(s.phase_fraction));
  put("rho_first", num(s.rho_first));
  put("rho_second", num(s.rho_second));
  put("phase_marker", num(s.phase_marker));
  put("key_scale", num(s.key_scale));
  put("value_scale", num(s.value_scale));
  put("calibration_queries", num(s.calibration_queries));
  return m;
}

}  // namespace

namespace {

// The spec checked and the kept positions normalized (every position = none), as
// generate_synthetic and SyntheticLayers take them. Throws SyntheticSpecError / kvb::Error.
SyntheticKeep checked_keep(const SyntheticSpec& spec, const SyntheticKeep& keep_asked) {
  validate_synthetic_spec(spec);
  const std::vector<int64_t>& kept = keep_asked.query_positions;
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i] < 0 || kept[i] >= spec.tokens || (i > 0 && kept[i] <= kept[i - 1]))
      throw Error("synthetic recording: kept query position " + std::to_string(kept[i]) +
                  " is not sorted, distinct and within [0, tokens = " + std::to_string(spec.tokens) + ")");
  SyntheticKeep keep = keep_asked;
  if (static_cast<int64_t>(kept.size()) >= spec.tokens) keep.query_positions.clear();  // every position
  return keep;
}

// The recording's every field but its layers' tensors and what is measured on them:
// `layers` holds P.L entries with their kept query positions only.
Recording skeleton_of(const Plan& P, const SyntheticKeep& keep) {
  const SyntheticSpec& spec = P.spec;
  Recording rec;
  rec.name = "synthetic";
  rec.q_heads = P.Hq;
  rec.kv_heads = P.G;
  rec.head_dim = P.d;
  rec.tokens = P.T;
  std::ostringstream src;
  src << "synthetic(seed=" << spec.seed << ", " << P.L << " layers, " << P.Hq << "/" << P.G << " heads, d=" << P.d
      << ", T=" << P.T << ")";
  rec.source = src.str();
  rec.token_ids = make_token_ids(P);
  rec.positions.resize(static_cast<size_t>(P.T));
  for (int64_t t = 0; t < P.T; ++t) rec.positions[static_cast<size_t>(t)] = t;
  if (P.boundary < P.T) rec.phase_boundary = P.boundary;
  rec.rope.applied = spec.rope;
  rec.rope.theta = spec.rope_theta;
  rec.metadata = spec_metadata(spec);
  for (int64_t l = 0; l < P.L; ++l) {
    rec.layer_ids.push_back(static_cast<int>(l));
    rec.layers.emplace_back().query_positions = keep.query_positions;
  }
  return rec;
}

// What was reached in layer l (held in rec.layers[l]), measured on the generated keys
// with the research definition.
void measure_layer_rho(const Plan& P, const Recording& rec, int64_t l, SyntheticLayerReport& lr) {
  lr.rho_first = key_rho_layer(rec, l, 0, P.boundary);
  lr.rho_second = P.boundary < P.T ? key_rho_layer(rec, l, P.boundary, P.T) : lr.rho_first;
}

// The metadata measured on the layers (their reports in rep.layers, in order): ρ per
// phase averaged over layers, and the warnings.
void finish_metadata(const Plan& P, const SyntheticReport& rep, Recording& rec) {
  double rho_first = 0, rho_second = 0;
  for (const SyntheticLayerReport& lr : rep.layers) {
    rho_first += lr.rho_first / static_cast<double>(P.L);
    rho_second += lr.rho_second / static_cast<double>(P.L);
  }
  rec.metadata["synthetic.phase_boundary"] = num(P.boundary);
  rec.metadata["synthetic.rho_first_measured"] = num(rho_first);
  if (P.boundary < P.T) rec.metadata["synthetic.rho_second_measured"] = num(rho_second);
  rec.metadata["synthetic.warnings"] = join(rep.warnings, "\n");  // one warning per line
}

// generate_synthetic (layers one after another, each generated in parallel in bounded
// memory) or, with `reference`, generate_synthetic_reference (layers in parallel).
Recording generate(const SyntheticSpec& spec, SyntheticReport* report, const SyntheticKeep& keep_asked,
                   bool reference) {
  const SyntheticKeep keep = checked_keep(spec, keep_asked);
  check_fits_memory(spec, keep.query_positions.empty() ? spec.tokens : static_cast<int64_t>(keep.query_positions.size()),
                    spec.layers, spec.rope && keep.key_pre_rope);
  const Plan P = make_plan(spec);

  std::vector<LayerResult> layers(static_cast<size_t>(P.L));
  if (reference)
    parallel_for_rethrow(P.L, [&](int64_t l) { layers[static_cast<size_t>(l)] = generate_layer_reference(P, l, keep); });
  else {
    // Layer l + 1's storage is zeroed (first touched) on a helper thread while layer l is
    // generated, so that no thread waits for those page faults but layer 0's.
    auto allocate = [&] { return std::async(std::launch::async, [&] { return allocate_layer(P, keep); }); };
    std::future<LayerTensors> next = allocate();
    for (int64_t l = 0; l < P.L; ++l) {
      LayerTensors storage = next.get();
      if (l + 1 < P.L) next = allocate();
      layers[static_cast<size_t>(l)] = generate_layer(P, l, keep, std::move(storage));
    }
  }

  Recording rec = skeleton_of(P, keep);
  SyntheticReport rep;
  rep.channels = P.ch;
  rep.phase_boundary = P.boundary;
  for (int64_t l = 0; l < P.L; ++l) {
    LayerResult& lr = layers[static_cast<size_t>(l)];
    rec.layers[static_cast<size_t>(l)] = std::move(lr.tensors);
    rep.warnings.insert(rep.warnings.end(), lr.warnings.begin(), lr.warnings.end());
    rep.layers.push_back(std::move(lr.report));
  }
  // Each layer's ρ reads its own keys only: the layers in parallel (a serial loop over
  // layers before).
  parallel_for_rethrow(P.L, [&](int64_t l) { measure_layer_rho(P, rec, l, rep.layers[static_cast<size_t>(l)]); });
  finish_metadata(P, rep, rec);
  rec.validate();
  if (report) *report = std::move(rep);
  return rec;
}

}  // namespace

Recording generate_synthetic(const SyntheticSpec& spec, SyntheticReport* report, const SyntheticKeep& keep) {
  return generate(spec, report, keep, false);
}

Recording generate_synthetic_reference(const SyntheticSpec& spec, SyntheticReport* report, const SyntheticKeep& keep) {
  return generate(spec, report, keep, true);
}

struct SyntheticLayers::State {
  Plan plan;
  SyntheticKeep keep;
  SyntheticReport report;           // layers[l] and warnings_of[l] filled as layer l is first generated
  std::vector<char> generated;      // [L]
  std::vector<std::vector<std::string>> warnings_of;  // [L]
};

SyntheticLayers::SyntheticLayers(const SyntheticSpec& spec, const SyntheticKeep& keep) : state_(std::make_unique<State>()) {
  state_->keep = checked_keep(spec, keep);
  const std::vector<int64_t>& kept = state_->keep.query_positions;
  check_fits_memory(spec, kept.empty() ? spec.tokens : static_cast<int64_t>(kept.size()), 1,  // one layer held
                    spec.rope && state_->keep.key_pre_rope);
  state_->plan = make_plan(spec);
  const Plan& P = state_->plan;
  state_->report.channels = P.ch;
  state_->report.phase_boundary = P.boundary;
  state_->report.layers.resize(static_cast<size_t>(P.L));
  state_->generated.assign(static_cast<size_t>(P.L), 0);
  state_->warnings_of.resize(static_cast<size_t>(P.L));
}

SyntheticLayers::~SyntheticLayers() = default;

int64_t SyntheticLayers::layers() const { return state_->plan.L; }

Recording SyntheticLayers::skeleton() const {
  Recording rec = skeleton_of(state_->plan, state_->keep);
  rec.streamed_extras = Recording::HeldExtras{state_->plan.spec.rope && state_->keep.key_pre_rope, false};
  return rec;
}

void SyntheticLayers::generate_into(Recording& rec, int64_t l) {
  const Plan& P = state_->plan;
  if (l < 0 || l >= P.L || rec.num_layers() != P.L)
    throw Error("internal: SyntheticLayers::generate_into: layer " + std::to_string(l) + " of a recording of " +
                std::to_string(rec.num_layers()) + " layers (the generator's: " + std::to_string(P.L) + ")");
  LayerResult lr = generate_layer(P, l, state_->keep, allocate_layer(P, state_->keep));
  rec.layers[static_cast<size_t>(l)] = std::move(lr.tensors);
  const size_t i = static_cast<size_t>(l);
  if (state_->generated[i]) return;  // the same tensors as the first time
  measure_layer_rho(P, rec, l, lr.report);
  state_->report.layers[i] = std::move(lr.report);
  state_->warnings_of[i] = std::move(lr.warnings);
  state_->generated[i] = 1;
}

void SyntheticLayers::finish(Recording& rec, SyntheticReport* report) const {
  const Plan& P = state_->plan;
  for (int64_t l = 0; l < P.L; ++l)
    if (!state_->generated[static_cast<size_t>(l)])
      throw Error("internal: SyntheticLayers::finish before layer " + std::to_string(l) + " was generated");
  SyntheticReport rep = state_->report;
  for (const std::vector<std::string>& w : state_->warnings_of) rep.warnings.insert(rep.warnings.end(), w.begin(), w.end());
  finish_metadata(P, rep, rec);
  if (report) *report = std::move(rep);
}

}  // namespace kvb
