// A thread-safe free list of fp32 buffers of one size: a caller that runs many times
// (a sweep's points, each with [window, vocab] logits: 2 GiB at 4096 tokens of a
// 128256-token vocabulary) reuses its scratch instead of allocating, zeroing and
// faulting in fresh pages every time. Buffers are handed out uninitialised.
// tests/core/test_buffer_pool.cpp checks reuse, the idle bound and concurrent leases.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace kvb {

class FloatBufferPool {
 public:
  // Buffers of `floats` floats; at most `keep` idle ones are kept (the rest freed).
  explicit FloatBufferPool(size_t floats, size_t keep = 4) : floats_(floats), keep_(keep) {}

  // A buffer for as long as the lease lives; back to the pool when it ends.
  class Lease {
   public:
    Lease(FloatBufferPool* pool, std::unique_ptr<float[]> data) : pool_(pool), data_(std::move(data)) {}
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (data_) pool_->give_back(std::move(data_));
    }
    float* data() const { return data_.get(); }

   private:
    FloatBufferPool* pool_;
    std::unique_ptr<float[]> data_;
  };

  Lease take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!idle_.empty()) {
        std::unique_ptr<float[]> b = std::move(idle_.back());
        idle_.pop_back();
        return Lease(this, std::move(b));
      }
    }
    return Lease(this, std::unique_ptr<float[]>(new float[floats_]));
  }

  size_t floats() const { return floats_; }

 private:
  void give_back(std::unique_ptr<float[]> b) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < keep_) idle_.push_back(std::move(b));
  }

  size_t floats_, keep_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<float[]>> idle_;
};

// A thread-safe free list of scratch objects (vectors, structs of vectors): take() hands
// out one an earlier user grew (its memory's pages already faulted in), or a new one;
// give_back() keeps at most `keep` of them. For scratch of one size used many times: a
// sweep point's merged attention rows (75 MB at the Llama-3-8B shape, 2048 positions)
// and its bootstrap's buffers. Whatever a taker finds in the object is stale: it
// clears or overwrites it.
template <class T>
class ScratchPool {
 public:
  explicit ScratchPool(size_t keep = 2) : keep_(keep) {}

  T take() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.empty()) return T{};
    T t = std::move(idle_.back());
    idle_.pop_back();
    return t;
  }
  void give_back(T t) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < keep_) idle_.push_back(std::move(t));
  }
  size_t idle() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return idle_.size();
  }

  // An object taken for a scope and given back when the lease ends, a throw included.
  class Lease {
   public:
    explicit Lease(ScratchPool& pool) : pool_(pool), object_(pool.take()) {}
    ~Lease() { pool_.give_back(std::move(object_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    T& operator*() { return object_; }
    T* operator->() { return &object_; }

   private:
    ScratchPool& pool_;
    T object_;
  };

 private:
  size_t keep_;
  mutable std::mutex mutex_;
  std::vector<T> idle_;
};

}  // namespace kvb
