// Placeholder until the loaders land (replaced by sim/io/recording_loader.cpp).
#include "sim/core/error.h"
#include "sim/recording.h"
namespace kvb {
Recording load_recording(const RecordingSpec&) { throw Error("recording loader not implemented yet"); }
}  // namespace kvb
