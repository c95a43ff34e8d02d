// Budgets and widths: what every budgeted strategy shares (methods.md §1 and §3).
//
// A budgeted strategy takes `budget_bpe`, the bits per element of the whole cache at
// a context (everything counted: protections, windows, metadata), and a format family
// with the reserved placeholder {b} for the allocator's width ("int{b}-asym-g32",
// widths [2, 3, 4, 5, 6, 8]). Its allocator picks a width per allocation unit (the
// open cells of one (layer, KV head, K or V[, phase])) and a greedy repair by the
// strategy's priority makes the result exact:
//   achieved bits <= budget bits, and no single one-width upgrade of any unit fits
//   in what is left,
// so the achieved bpe is within one allocation step of the budget. A budget below the
// cheapest allocation (protections + the smallest width everywhere) or above the
// dearest one is an error naming both numbers.
//
// key_budget_bpe / value_budget_bpe give keys and values separate budgets (each in
// bits per K, resp. V, element); a kind without a budget of its own then takes a
// fixed `format` (key_budget_bpe = 3.5 with value_format = "keep-fp16" allocates
// keys only). key_family / value_family, key_widths ... differ per kind.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sim/plan.h"
#include "sim/strategies/strategy.h"

namespace kvb {

// budget_bpe, family, widths, min_bits, max_bits, budget_context, format.
const std::vector<ParamDef>& budget_params();

// points.csv columns a budgeted plan adds: budget_bpe, budget_slack_bpe and
// budget_step_bpe (prefixed key_ / value_ for separate budgets), budget_context.
const std::vector<std::string>& budget_columns();

// The reserved placeholder for the allocator's width in a family.
inline constexpr const char* kWidthPlaceholder = "{b}";

// The candidate formats of one kind: a family at each allowed width, ascending.
struct WidthFamily {
  std::string pattern;          // "int{b}-asym-g32"
  std::vector<int64_t> widths;  // ascending, distinct, within [min_bits, max_bits]
  std::vector<FormatPtr> formats;

  // Reads family / widths / min_bits / max_bits for `kind`; throws kvb::ConfigError
  // (bad pattern, no width left after clamping, a width the family rejects).
  static WidthFamily from_params(const Params& p, Kind kind);
  // The family at any width (e.g. TAQG's predicted one); throws kvb::ConfigError.
  FormatPtr at(int64_t width) const;
  // Index of the allowed width nearest to `bits` (ties: the lower width).
  size_t nearest(double bits) const;
};

// The family pattern with {b} replaced.
std::string family_format_name(const std::string& pattern, int64_t width);

struct BudgetSpec {
  bool separate = false;            // keys and values have their own budgets
  bool budgeted[2] = {true, true};  // separate: whether [Key] / [Value] has a budget
  double bpe[2] = {0, 0};           // [Key], [Value] when separate; [0] = joint otherwise
  int64_t context = 0;              // context the budget is met at; 0 = the recording's

  // nullopt when no budget parameter is given. With separate budgets a kind without
  // one is not budgeted (it needs a fixed format).
  static std::optional<BudgetSpec> from_params(const Params& p);
};

// One allocation unit: open segments of one (layer, KV head, kind[, phase]) that get
// one width.
struct AllocUnit {
  int64_t layer = 0, kv_head = 0;
  Kind kind = Kind::Key;
  int phase = 0;                 // 0: first (or only) phase, 1: second
  std::vector<size_t> segments;  // indices into the unit plan's segments, all open
};

// The open segments of a plan grouped into units, in (layer, KV head, kind, phase)
// order; with a boundary, segments before it are phase 0 and after it phase 1
// (split_open_segments() first so none straddles it).
std::vector<AllocUnit> make_alloc_units(const Plan& plan, std::optional<int64_t> boundary);

// A knapsack over candidate widths: cost[u][i] bits of unit u at candidate i
// (non-decreasing in i), and the bits the units may spend together.
struct BudgetProblem {
  std::vector<std::vector<uint64_t>> cost;
  uint64_t budget = 0;
  uint64_t total(const std::vector<size_t>& choice) const;
};

// Priority of upgrading unit u from candidate `from` to from + 1: higher goes first.
using UpgradePriority = std::function<double(size_t unit, size_t from)>;

// Greedy repair: while over budget, downgrade the unit whose (from - 1 -> from)
// upgrade has the lowest priority; then, while some upgrade fits, take the fitting
// one with the highest priority (ties: the lower `tie_rank`, then the lower unit).
// Afterwards total <= budget and no single upgrade fits. Throws kvb::Error when even
// the cheapest choice is over budget.
void repair_budget(const BudgetProblem& prob, std::vector<size_t>& choice, const UpgradePriority& priority,
                   const std::vector<size_t>& tie_rank);

// Ranks that spread ties evenly over units (a golden-ratio sequence over the index),
// so equal-priority upgrades land on every layer, head, kind and phase in turn rather
// than on the first ones.
std::vector<size_t> spread_ranks(size_t n);

// Target-bits allocation (uniform, entropy, phase): unit u wants b̄ + offset[u]
// bits. Finds the largest b̄ whose rounding (nearest allowed width, clamped) fits,
// then repairs by deficit (target − width). Returns the choice; *mean receives b̄.
std::vector<size_t> solve_target_bits(const BudgetProblem& prob, const std::vector<double>& offset,
                                      const std::vector<const WidthFamily*>& family, double* mean);

// A budgeted allocation of a protected plan: prices every unit at every candidate,
// checks the budget, and writes the chosen formats back.
class BudgetedAllocation {
 public:
  // families[k] is the candidate list of kind k (nullptr: a kind without a budget,
  // whose cells must already have their fixed format). Throws kvb::Error when the
  // budget is below the cheapest or above the dearest allocation, naming both numbers.
  BudgetedAllocation(const Plan& plan, std::vector<AllocUnit> units, const WidthFamily* key_family,
                     const WidthFamily* value_family, const BudgetSpec& budget);

  const std::vector<AllocUnit>& units() const { return units_; }
  const WidthFamily& family(size_t unit) const { return *families_[static_cast<int>(units_[unit].kind)]; }
  // Groups that each meet their own budget: one (joint) or two (keys, values).
  size_t groups() const { return groups_.size(); }
  const std::vector<size_t>& group_units(size_t g) const { return groups_[g].units; }
  // The group's problem; its unit indices are positions in group_units(g).
  const BudgetProblem& problem(size_t g) const { return groups_[g].problem; }
  // The group's column prefix: "" for a joint budget, "key_" / "value_" for separate ones
  // (its budget is the parameter prefix + "budget_bpe").
  std::string column_prefix(size_t g) const { return groups_[g].kind_name.empty() ? "" : groups_[g].kind_name + "_"; }
  double budget_bpe(size_t g) const { return groups_[g].budget_bpe; }
  // Bits per element the group reaches with `spent` bits over its units (the fixed cells added).
  double reached_bpe(size_t g, uint64_t spent) const {
    return static_cast<double>(groups_[g].fixed_bits + spent) / groups_[g].elements;
  }
  // Bits per element of `bits` over the group's elements.
  double group_bpe(size_t g, uint64_t bits) const { return static_cast<double>(bits) / groups_[g].elements; }
  int64_t context() const { return context_; }

  // Sets every unit's open segments to its chosen candidate (choice over all units)
  // and annotates budget_bpe, budget_slack_bpe (budget − achieved, >= 0) and
  // budget_step_bpe (the smallest upgrade that no longer fits).
  void apply(Plan& plan, const std::vector<size_t>& choice) const;

 private:
  struct Group {
    std::vector<size_t> units;
    BudgetProblem problem;
    double elements = 0;  // K and V elements the budget is spread over
    double budget_bpe = 0;
    uint64_t fixed_bits = 0;
    std::string kind_name;  // "key" / "value" for separate budgets, "" for a joint one
  };
  std::vector<AllocUnit> units_;
  const WidthFamily* families_[2];
  std::vector<Group> groups_;
  BudgetSpec budget_;
  int64_t context_ = 0;
};

// Unit cost of an allocation unit at a format (bits at `context`).
uint64_t alloc_unit_bits(const Plan& plan, const AllocUnit& u, const Format& f, int64_t context);

}  // namespace kvb
