// Placeholder until the synthetic generator lands (replaced by sim/synthetic.cpp).
#include "sim/core/error.h"
#include "sim/synthetic.h"
namespace kvb {
Recording generate_synthetic(const SyntheticSpec&) { throw Error("synthetic generator not implemented yet"); }
}  // namespace kvb
