// Plan: who gets which precision. For every cache unit (layer, KV head, K or V) a
// list of token-range segments, each stored with one Format, and optionally a
// recency window whose tokens are seen at another precision relative to each query
// (methods.md §3). A Plan's memory is computed from its formats
// (Format::storage_bits), never assumed.
//
// Time semantics: the query at position t sees key/value j <= t as
//   - the exact value, if t < prefill (prompt attention runs before the cache is
//     written, as in Hugging Face's QuantizedCache prefill);
//   - at the residual precision, if j is in the residual at time t: held by the
//     unit's window, or in a group along tokens that is still open (its last token is
//     not yet written: a causal cache cannot quantize it, as KIVI keeps it in its
//     full-precision residual). The residual precision is the window's format, or the
//     exact value (counted as fp16) for a unit without a window;
//   - the stored (segment) version otherwise.
// So no query reads anything that depends on a later token (methods.md §3).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "sim/formats/format.h"

namespace kvb {

// Why a segment has its format: what a strategy's protections decided, or the
// allocator. Error attribution (token regions) and descriptions read it.
enum class SegmentRole : uint8_t {
  Allocated,  // chosen by the strategy's allocator (or a fixed format)
  SinkHead,   // the whole unit belongs to a protected sink head
  SinkToken,  // a protected sink token
};

struct Segment {
  int64_t begin = 0;  // first token, inclusive
  int64_t end = 0;    // last token, exclusive
  FormatPtr format;
  SegmentRole role = SegmentRole::Allocated;
};

// Recent tokens at higher precision, relative to the query (never a static "last W
// tokens of the recording", which would flatter windows).
struct RecentWindow {
  enum class Mode {
    Sliding,  // the last W tokens: t - W < j <= t (quant.cpp --k-window)
    Chunked,  // a residual flushed every W tokens (KIVI, HF QuantizedCache):
              // j >= first + W * floor((t - first) / W), first = the plan's prefill;
              // the query at t attends before the flush, holding (t - first) mod W + 1
              // tokens (1..W)
  };
  int64_t size = 0;   // W tokens; 0 = no window
  FormatPtr format;   // precision of window tokens, e.g. keep-fp16
  Mode mode = Mode::Sliding;
  // false: window tokens replace their quantized copy (KIVI, HF); true: the window
  // is an extra copy beside the complete quantized cache (quant.cpp) and costs W·p.
  bool extra_copy = false;

  bool active() const { return size > 0 && format != nullptr; }
  // Whether the query at t sees token j <= t in window precision; `first` is the
  // first token the window may hold (the plan's prefill).
  bool holds(int64_t t, int64_t j, int64_t first) const;
  // Tokens held in window precision while the last query of a context of `context`
  // tokens (t = context - 1) attends: what memory counts, so that a measured error and
  // its memory describe the same cache. Sliding: min(W, context - first); chunked:
  // (context - 1 - first) mod W + 1, never the empty residual right after a flush
  // (which would make a chunked window free at every multiple of W, 512 or 32K tokens).
  int64_t held_at(int64_t context, int64_t first) const;
};

struct UnitPlan {
  std::vector<Segment> segments;  // sorted, disjoint, covering [0, T)
  RecentWindow window;            // optional
};

// The first token of the group along tokens that is still open when the query at t
// attends, for a run of tokens stored from `origin` on in a format whose groups span
// `tokens_per_group` tokens (Format::tokens_per_group; 0 = one group over the whole
// run): origin + G·floor((t - origin) / G). A group is open until a token after it is
// written: the query whose own token completes the group still reads it open, as a
// chunked window is flushed after its query (window_rule.h). t + 1 (nothing open)
// when each token is quantized on its own (tokens_per_group == 1).
int64_t open_group_begin(int64_t tokens_per_group, int64_t origin, int64_t t);
// The same for a unit: the group open at t in the segment that holds token t (t + 1
// when none does or its format quantizes tokens one by one).
int64_t open_group_begin(const UnitPlan& unit, int64_t t);

// Which version of token j <= t the query at t reads (the time semantics above): the
// exact value, the window's, or the stored (segment) one.
enum class Seen { Exact, Stored, Window };

// What the query at t reads of one unit: tokens [0, residual_begin) in their stored
// version and [residual_begin, t] at the residual precision, or everything exact
// before the prefill. The recording simulator (both paths), the model's KV cache and
// the CUDA backend all select through this.
struct RowVersions {
  bool all_exact = false;        // t < prefill
  int64_t residual_begin = 0;    // the window's first held token or the open group's, whichever is first
  bool residual_window = false;  // the residual is read in the window's version (else exact)
  Seen of(int64_t j) const {
    if (all_exact) return Seen::Exact;
    if (j < residual_begin) return Seen::Stored;
    return residual_window ? Seen::Window : Seen::Exact;
  }
};
RowVersions row_versions(const UnitPlan& unit, int64_t prefill, int64_t t);
// row_versions(unit, prefill, positions[i]).residual_begin for every i, into out[i]
// (n values): one walk over the unit's segments for positions in ascending order (any
// order is accepted). The CUDA simulator's per-layer table of every KV head and
// evaluated position, where one call per position cost 0.3-0.5 ms a layer on the host.
void residual_begins(const UnitPlan& unit, int64_t prefill, const int32_t* positions, size_t n, int32_t* out);
// Whether some query may read another version of the unit than the stored one.
bool reads_residual(const UnitPlan& unit, int64_t prefill);

// Bits per element of the residual of a unit without a window: the model's own fp16
// cache (methods.md §1's baseline).
inline constexpr int64_t kResidualBitsWithoutWindow = 16;

enum class Kind : int { Key = 0, Value = 1 };
inline const char* kind_name(Kind k) { return k == Kind::Key ? "K" : "V"; }

// A per-point result a strategy attaches to its plan (ρ per phase, the budget, the
// additivity check ...), written as an extra column of points.csv.
struct Annotation {
  std::string name;
  std::variant<double, std::string> value;
};

class Plan {
 public:
  Plan() = default;
  Plan(int64_t layers, int64_t kv_heads, int64_t tokens, int64_t head_dim);

  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t tokens() const { return tokens_; }
  int64_t head_dim() const { return head_dim_; }

  // Tokens [0, prefill) form a prompt processed before the cache is written: queries
  // t < prefill attend exact keys/values, and windows only hold tokens >= prefill.
  int64_t prefill() const { return prefill_; }
  void set_prefill(int64_t tokens) { prefill_ = tokens; }

  UnitPlan& unit(int64_t layer, int64_t kv_head, Kind kind) { return units_[index(layer, kv_head, kind)]; }
  const UnitPlan& unit(int64_t layer, int64_t kv_head, Kind kind) const {
    return units_[index(layer, kv_head, kind)];
  }
  // Every unit of one kind, e.g. to give all keys one format.
  void assign_all(Kind kind, const FormatPtr& format);

  // Bits that segment [begin, end) of `unit` costs when stored with `format`, at a
  // context of `context` tokens, exactly as storage_bits_at() counts them (the
  // stretching rule below), a replacing window taking its held tokens out of the
  // stored range. The residual of the last query (t = context - 1) is not stored: the
  // group of `format` open at t (open_group_begin) is counted at the residual
  // precision (the window's format, else kResidualBitsWithoutWindow) for its tokens
  // the window does not already hold.
  uint64_t segment_bits(const UnitPlan& unit, int64_t begin, int64_t end, const Format& format,
                        int64_t context) const;
  // Bits of a unit's window at `context` (0 without one).
  uint64_t window_bits(const UnitPlan& unit, int64_t context) const;

  // The model's sliding-window attention, per layer (0 = full causal): a layer whose
  // queries attend to the last W tokens only (t - W < j <= t) keeps only those in its
  // cache, so storage_bits_at(context) counts, for its units, the tokens
  // [context - W, context) alone (a group along tokens cut there counted for its tokens
  // inside, as the format counts a run of that length; a recency window or open group
  // holds at most those tokens), and bpe_at divides by the elements held, min(context,
  // W) tokens in that layer. segment_bits and window_bits (what budgets are met with)
  // count every token. Empty (the default): every layer full causal. Strategies copy
  // it from Recording::attention_windows.
  void set_attention_windows(std::vector<int64_t> windows);
  const std::vector<int64_t>& attention_windows() const { return attention_windows_; }
  // Tokens layer `layer` holds at `context`: min(context, W), or context.
  int64_t held_tokens(int64_t layer, int64_t context) const;

  // Exact storage in bits of the whole cache at the recorded context: segments, plus
  // the window's tokens at window precision (replacing their stored copy unless the
  // window is an extra copy).
  uint64_t storage_bits() const { return storage_bits_at(tokens_); }
  // The same plan at another context length, the "memory at a declared target
  // context" of methods.md §1. Beyond T, only the unit's stretching segment grows:
  // the last segment that is not a sink token (the allocator's bulk, a second phase,
  // a whole sink head) gains the tokens [T, context); sink tokens (wherever they are,
  // e.g. attention-selected ones near T) and earlier segments keep their token
  // counts. Below T, the plan is cut at `context` (tokens from `context` on do not
  // exist yet).
  // A sliding layer counts its last W tokens only (set_attention_windows).
  uint64_t storage_bits_at(int64_t context) const;
  double bpe() const { return bpe_at(tokens_); }
  double bpe_at(int64_t context) const;
  // The memory the error of queries `positions` is measured on (methods.md §1, "Memory
  // and error at one context"): the mean over them of the bits per element of the cache
  // each reads, bpe_at(t + 1) for query t, or the model's own fp16 cache
  // (kResidualBitsWithoutWindow) for a query of the prefill (t < prefill), which attends
  // exact keys and values. It differs from bpe() where the make-up changes with the
  // length (a recency window, sink tokens, phases, a prefill, groups along tokens) and
  // the queries read caches shorter than T. NaN for no positions.
  double mean_bpe_read(const std::vector<int64_t>& positions) const;
  // Bytes of the cache at a context: bpe * elements / 8.
  double bytes_at(int64_t context) const { return static_cast<double>(storage_bits_at(context)) / 8.0; }

  // Whether the cache has the same make-up at every context: each unit stores all its
  // tokens in one format that quantizes each token on its own, without a recency window
  // (no sink tokens, phases, windows or groups along tokens, whose token counts do not
  // grow with the context: an open group of up to G tokens stays at the residual
  // precision, as a chunked window does). Such a plan's bits per element are the same at
  // any context, so its memory at another context describes the cache its error was
  // measured on (methods.md §1, "extrapolated").
  bool stores_tokens_alike() const;

  // The context (tokens) a strategy sized the plan for when not the plan's own T
  // (budget_context: the budget is met there); nullopt = sized at T.
  std::optional<int64_t> sized_for_context() const { return sized_for_context_; }
  void set_sized_for_context(int64_t tokens) { sized_for_context_ = tokens; }

  // The unit for a sequence of `context` tokens (a cache that has grown to, or
  // beyond, a different length than the plan's T), by storage_bits_at's rule:
  // segments are cut at `context` (those starting at or beyond it are dropped), and
  // beyond T the tokens [T, context) take the stretching segment's format (its end
  // is extended when it is the last segment, else they form a segment of their own).
  // The segments cover [0, context); the window is the unit's (it is relative to the
  // query, not to T). The model's KV cache reconstructs through it.
  UnitPlan unit_at(int64_t layer, int64_t kv_head, Kind kind, int64_t context) const;
  // The unit for a sequence of `context` tokens whose second phase starts at
  // `second_phase` (the position of the sequence's first phase marker), or has not
  // started yet (nullopt: the marker has not been generated): the phases switch where
  // this sequence's marker is, as a serving engine switches when it sees the marker,
  // not at the plan's phase_boundary(). The first phase's segments cover [0, start)
  // (start = second_phase, or context), cut there or stretched by their stretching
  // segment; the second phase's segments, shifted from the plan's boundary to
  // `second_phase`, cover [second_phase, context), cut or stretched likewise. Equals
  // unit_at(context) when second_phase is the plan's boundary, or when the plan has no
  // phase boundary.
  UnitPlan unit_at(int64_t layer, int64_t kv_head, Kind kind, int64_t context,
                   std::optional<int64_t> second_phase) const;

  // Empty when every unit's segments cover [0, T) in order with formats that accept
  // the shapes; otherwise the first problem, naming the unit.
  std::string check() const;

  // Distinct format names used, "K:int4-asym-g32 V:int2-asym-g32" style summary; with
  // sliding layers, " sliding:W16(layers 0,2)": their caches hold the last 16 tokens.
  std::string describe() const;

  // First token of a second phase when the strategy split the sequence in two (phase
  // bits, TAQG); error attribution splits token regions there.
  std::optional<int64_t> phase_boundary() const { return phase_boundary_; }
  void set_phase_boundary(int64_t token) { phase_boundary_ = token; }
  // The token id that started the second phase (phase_marker, e.g. </think>), when the
  // boundary came from one. A model's KV cache then switches phases where each
  // sequence holds (or generates) that token (unit_at with second_phase).
  std::optional<int64_t> phase_marker() const { return phase_marker_; }
  void set_phase_marker(int64_t token) { phase_marker_ = token; }

  // Extra per-point results, in the order the strategy added them; a name added twice
  // keeps the last value.
  void annotate(const std::string& name, double value) { set_annotation(name, value); }
  void annotate(const std::string& name, const std::string& value) { set_annotation(name, value); }
  const std::vector<Annotation>& annotations() const { return annotations_; }

 private:
  void set_annotation(const std::string& name, std::variant<double, std::string> value);
  size_t index(int64_t layer, int64_t kv_head, Kind kind) const {
    return static_cast<size_t>((layer * kv_heads_ + kv_head) * 2 + static_cast<int>(kind));
  }
  int64_t layers_ = 0, kv_heads_ = 0, tokens_ = 0, head_dim_ = 0;
  // segment_bits over the tokens [from, context) only (from > 0: a sliding layer).
  uint64_t segment_bits_from(const UnitPlan& unit, int64_t begin, int64_t end, const Format& format,
                             int64_t context, int64_t from) const;
  int64_t prefill_ = 0;
  std::vector<UnitPlan> units_;
  std::vector<int64_t> attention_windows_;  // [layers] or empty
  std::optional<int64_t> phase_boundary_;
  std::optional<int64_t> phase_marker_;
  std::optional<int64_t> sized_for_context_;
  std::vector<Annotation> annotations_;
};

}  // namespace kvb
