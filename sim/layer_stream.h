// StreamedRecording: a recording whose layers' tensors are produced one at a time, when
// a pass over the layers reaches them, and dropped after (issue 20, "Long contexts": a
// run's memory bounded by what one layer needs, not by the whole recording's keys and
// values). Everything else of the Recording (shapes, token ids, positions, RoPE,
// metadata, each layer's kept query positions) is held throughout, so code that reads
// only those works on it as on a held recording; code that reads layer l's tensors must
// run while layer l is held (hold .. release).
//
// Not thread-safe: hold and release run between the parallel regions that read a layer.
// With prefetching on (set_prefetch), the next layer is loaded on a thread of this
// object's own while the caller works on the held one; loads stay one at a time.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>

#include "sim/recording.h"

namespace kvb {

class StreamedRecording {
 public:
  // Fills rec.layers[layer]'s tensors: the same values every time it is called for a
  // layer. `rec` is the skeleton given to the constructor or a copy of it, and the
  // loader writes only rec.layers[layer]. Never called twice at once.
  using LayerLoader = std::function<void(Recording& rec, int64_t layer)>;
  // Called by hold(layer) on the caller's thread once the layer's tensors are in
  // recording() (after every load, prefetched or not): where what must see the layers
  // in order on the caller's thread goes (validation, hashing, completing metadata).
  using LoadedHook = std::function<void(Recording& rec, int64_t layer)>;

  // `skeleton`: the recording with every layer's tensors empty (query_positions set).
  StreamedRecording(Recording skeleton, LayerLoader load, LoadedHook loaded = {});
  ~StreamedRecording();  // waits for a prefetch under way (its result unused)
  StreamedRecording(const StreamedRecording&) = delete;
  StreamedRecording& operator=(const StreamedRecording&) = delete;

  // The recording; layers[l] has its tensors only while layer l is held.
  const Recording& recording() const { return rec_; }
  // For what is measured on the layers and added after a pass (the synthetic
  // generator's metadata); never for the layers' tensors.
  Recording& recording_to_complete() { return rec_; }

  // Loads layer l (index into recording().layers), then calls the loaded hook. Throws
  // kvb::Error when it is held already, and what the loader threw (also when it threw
  // while prefetching l) or the hook threw (the layer is not held then).
  void hold(int64_t layer);
  // Drops layer l's tensors (its kept query positions stay).
  void release(int64_t layer);

  // Prefetching: when on, hold(l) starts loading layer l + 1 (when there is one and it is
  // not held) on a thread of its own, with one OpenMP thread fewer than the caller's
  // omp_get_max_threads() (at least one), and the next hold(l + 1) takes that load over (waiting for it
  // to finish) instead of loading again; a hold of another layer first waits for the
  // prefetch and drops it. For a pass over the layers in order whose work on a layer
  // leaves the host's cores idle (a device measuring it): the device no longer waits
  // for the host to produce each layer. The same tensors either way; the price is a
  // second layer held while the next one loads. Turning it off waits for a prefetch
  // under way and drops it.
  void set_prefetch(bool on);

  // How many layers are held now and the most ever held at once (a layer being or
  // having been prefetched counts), and how many loads there were (prefetches included).
  int64_t layers_held() const { return held_; }
  int64_t max_layers_held() const { return max_held_; }
  int64_t loads() const { return loads_; }

 private:
  struct Prefetch;
  // Waits for the prefetch under way, if any; returns it (nullptr when none).
  std::unique_ptr<Prefetch> finish_prefetch();
  void start_prefetch(int64_t layer);
  void count_held(int64_t delta);

  Recording rec_;
  LayerLoader load_;
  LoadedHook loaded_;
  std::vector<char> is_held_;
  int64_t held_ = 0, max_held_ = 0, loads_ = 0;
  bool prefetch_on_ = false;
  Recording stage_;  // while prefetching: the skeleton the next layer is loaded into
  std::unique_ptr<Prefetch> prefetch_;
};

// Turns a StreamedRecording's prefetching on for a scope (off again at its end).
class PrefetchingLayers {
 public:
  PrefetchingLayers(StreamedRecording& s, bool on) : s_(s), on_(on) {
    if (on_) s_.set_prefetch(true);
  }
  ~PrefetchingLayers() {
    if (on_) s_.set_prefetch(false);
  }
  PrefetchingLayers(const PrefetchingLayers&) = delete;
  PrefetchingLayers& operator=(const PrefetchingLayers&) = delete;

 private:
  StreamedRecording& s_;
  bool on_;
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
