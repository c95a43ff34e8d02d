#include "sim/layer_stream.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>

#include "sim/core/error.h"

namespace kvb {

namespace {
// Drops a layer's tensors; its kept query positions stay.
void drop_tensors(LayerTensors& layer) {
  LayerTensors empty;
  empty.query_positions = std::move(layer.query_positions);
  layer = std::move(empty);
}
}  // namespace

// A load of `layer` into stage_.layers[layer] on a thread of its own.
struct StreamedRecording::Prefetch {
  int64_t layer = 0;
  std::exception_ptr error;  // what the loader threw
  std::thread worker;
};

StreamedRecording::StreamedRecording(Recording skeleton, LayerLoader load, LoadedHook loaded)
    : rec_(std::move(skeleton)), load_(std::move(load)), loaded_(std::move(loaded)), is_held_(rec_.layers.size(), 0) {}

StreamedRecording::~StreamedRecording() { finish_prefetch(); }

void StreamedRecording::count_held(int64_t delta) {
  held_ += delta;
  max_held_ = std::max(max_held_, held_);
}

std::unique_ptr<StreamedRecording::Prefetch> StreamedRecording::finish_prefetch() {
  if (!prefetch_) return nullptr;
  if (prefetch_->worker.joinable()) prefetch_->worker.join();
  return std::move(prefetch_);
}

void StreamedRecording::start_prefetch(int64_t layer) {
  prefetch_ = std::make_unique<Prefetch>();
  prefetch_->layer = layer;
  ++loads_;
  count_held(1);
  // The caller's OpenMP thread count (a new thread does not inherit it), less the one
  // that goes on driving the device meanwhile.
  const int threads = std::max(1, omp_get_max_threads() - 1);
  prefetch_->worker = std::thread([this, p = prefetch_.get(), threads] {
    omp_set_num_threads(threads);
    try {
      load_(stage_, p->layer);
    } catch (...) {
      p->error = std::current_exception();
    }
  });
}

void StreamedRecording::hold(int64_t layer) {
  if (layer < 0 || layer >= rec_.num_layers())
    throw Error("internal: StreamedRecording::hold: layer " + std::to_string(layer) + " of " +
                std::to_string(rec_.num_layers()));
  char& held = is_held_[static_cast<size_t>(layer)];
  if (held) throw Error("internal: StreamedRecording::hold: layer " + std::to_string(layer) + " is held already");
  if (std::unique_ptr<Prefetch> p = finish_prefetch(); p && p->layer == layer) {
    LayerTensors& staged = stage_.layers[static_cast<size_t>(layer)];
    if (p->error) {
      drop_tensors(staged);
      count_held(-1);
      std::rethrow_exception(p->error);
    }
    std::swap(rec_.layers[static_cast<size_t>(layer)], staged);
    drop_tensors(staged);
  } else {
    if (p) {  // a prefetch of another layer: dropped
      drop_tensors(stage_.layers[static_cast<size_t>(p->layer)]);
      count_held(-1);
    }
    load_(rec_, layer);
    ++loads_;
    count_held(1);
  }
  if (loaded_) {
    try {
      loaded_(rec_, layer);
    } catch (...) {
      drop_tensors(rec_.layers[static_cast<size_t>(layer)]);
      count_held(-1);
      throw;
    }
  }
  held = 1;
  const int64_t next = layer + 1;
  if (prefetch_on_ && next < rec_.num_layers() && !is_held_[static_cast<size_t>(next)]) start_prefetch(next);
}

void StreamedRecording::release(int64_t layer) {
  if (layer < 0 || layer >= rec_.num_layers() || !is_held_[static_cast<size_t>(layer)]) return;
  drop_tensors(rec_.layers[static_cast<size_t>(layer)]);
  is_held_[static_cast<size_t>(layer)] = 0;
  count_held(-1);
}

void StreamedRecording::set_prefetch(bool on) {
  if (on == prefetch_on_) return;
  prefetch_on_ = on;
  if (on) {
    // The loads' target: a copy of the skeleton (every field, no layer's tensors).
    std::vector<LayerTensors> held_tensors(rec_.layers.size());
    for (size_t l = 0; l < rec_.layers.size(); ++l)
      if (is_held_[l]) {
        std::swap(held_tensors[l], rec_.layers[l]);
        rec_.layers[l].query_positions = held_tensors[l].query_positions;
      }
    stage_ = rec_;
    for (size_t l = 0; l < rec_.layers.size(); ++l)
      if (is_held_[l]) std::swap(held_tensors[l], rec_.layers[l]);
    return;
  }
  if (std::unique_ptr<Prefetch> p = finish_prefetch()) {
    drop_tensors(stage_.layers[static_cast<size_t>(p->layer)]);
    count_held(-1);
  }
  stage_ = Recording{};
}

}  // namespace kvb
