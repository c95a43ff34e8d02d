#include "sim/layer_stream.h"

#include <algorithm>
#include <string>
#include <utility>

#include "sim/core/error.h"

namespace kvb {

StreamedRecording::StreamedRecording(Recording skeleton, LayerLoader load)
    : rec_(std::move(skeleton)), load_(std::move(load)), is_held_(rec_.layers.size(), 0) {}

void StreamedRecording::hold(int64_t layer) {
  if (layer < 0 || layer >= rec_.num_layers())
    throw Error("internal: StreamedRecording::hold: layer " + std::to_string(layer) + " of " +
                std::to_string(rec_.num_layers()));
  char& held = is_held_[static_cast<size_t>(layer)];
  if (held) throw Error("internal: StreamedRecording::hold: layer " + std::to_string(layer) + " is held already");
  load_(rec_, layer);
  held = 1;
  ++loads_;
  max_held_ = std::max(max_held_, ++held_);
}

void StreamedRecording::release(int64_t layer) {
  if (layer < 0 || layer >= rec_.num_layers() || !is_held_[static_cast<size_t>(layer)]) return;
  LayerTensors& L = rec_.layers[static_cast<size_t>(layer)];
  LayerTensors empty;
  empty.query_positions = std::move(L.query_positions);
  L = std::move(empty);
  is_held_[static_cast<size_t>(layer)] = 0;
  --held_;
}

}  // namespace kvb
