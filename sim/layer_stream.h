// StreamedRecording: a recording whose layers' tensors are produced one at a time, when
// a pass over the layers reaches them, and dropped after (issue 20, "Long contexts": a
// run's memory bounded by what one layer needs, not by the whole recording's keys and
// values). Everything else of the Recording (shapes, token ids, positions, RoPE,
// metadata, each layer's kept query positions) is held throughout, so code that reads
// only those works on it as on a held recording; code that reads layer l's tensors must
// run while layer l is held (hold .. release).
//
// Not thread-safe: hold and release run between the parallel regions that read a layer.
#pragma once
#include <cstdint>
#include <functional>

#include "sim/recording.h"

namespace kvb {

class StreamedRecording {
 public:
  // Fills rec.layers[layer]'s tensors: the same values every time it is called for a layer.
  using LayerLoader = std::function<void(Recording& rec, int64_t layer)>;

  // `skeleton`: the recording with every layer's tensors empty (query_positions set).
  StreamedRecording(Recording skeleton, LayerLoader load);

  // The recording; layers[l] has its tensors only while layer l is held.
  const Recording& recording() const { return rec_; }
  // For what is measured on the layers and added after a pass (the synthetic
  // generator's metadata); never for the layers' tensors.
  Recording& recording_to_complete() { return rec_; }

  // Loads layer l (index into recording().layers). Throws kvb::Error when it is held already.
  void hold(int64_t layer);
  // Drops layer l's tensors (its kept query positions stay).
  void release(int64_t layer);

  // How many layers are held now, the most ever held at once, and how many loads there were.
  int64_t layers_held() const { return held_; }
  int64_t max_layers_held() const { return max_held_; }
  int64_t loads() const { return loads_; }

 private:
  Recording rec_;
  LayerLoader load_;
  std::vector<char> is_held_;
  int64_t held_ = 0, max_held_ = 0, loads_ = 0;
};

// Holds one layer of a StreamedRecording for a scope.
class HeldLayer {
 public:
  HeldLayer(StreamedRecording& s, int64_t layer) : s_(s), layer_(layer) { s_.hold(layer_); }
  ~HeldLayer() { s_.release(layer_); }
  HeldLayer(const HeldLayer&) = delete;
  HeldLayer& operator=(const HeldLayer&) = delete;

 private:
  StreamedRecording& s_;
  int64_t layer_;
};

}  // namespace kvb
