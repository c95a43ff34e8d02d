#include "sim/recording.h"
#include "sim/core/error.h"
namespace kvb { Recording load_recording(const RecordingSpec&) { throw Error("not yet"); } }
#include "sim/synthetic.h"
namespace kvb { Recording generate_synthetic(const SyntheticSpec&) { throw Error("not yet"); } }
