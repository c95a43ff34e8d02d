#include "sim/formats/format.h"

#include "sim/core/error.h"

namespace kvb {

void Format::encode(ConstMatView, const SpanInfo&, BitWriter&) const {
  throw Error("format '" + name() + "' has no code layout (only formats in the format table can be encoded)");
}

}  // namespace kvb
