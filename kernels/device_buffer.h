// DeviceBuffer<T>: an owning, resizable array in device memory (cudaMalloc), with
// explicit host transfers; PinnedBuffer<T>: page-locked host memory (cudaMallocHost),
// which the copy engines read and write at full speed and asynchronously. Host-only header.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_check.h"

namespace kvb::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { resize(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  // Exactly `count` elements; contents are not kept.
  void resize(size_t count) {
    if (count == size_) return;
    release();
    if (count == 0) return;
    const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T));
    if (err != cudaSuccess) {
      data_ = nullptr;
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      throw Error("CUDA: cannot allocate " + std::to_string(count * sizeof(T) >> 20) + " MiB of device memory (" +
                  std::to_string(free_b >> 20) + " MiB free of " + std::to_string(total_b >> 20) +
                  "): " + cudaGetErrorString(err));
    }
    size_ = count;
  }
  // At least `count` elements (grows, never shrinks); contents are not kept.
  void reserve(size_t count) {
    if (count > size_) resize(count);
  }

  void upload(const T* host, size_t count, size_t offset = 0) {
    KVB_CUDA_CHECK(cudaMemcpy(data_ + offset, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) {
    resize(host.size());
    upload(host.data(), host.size());
  }
  std::vector<T> download(size_t count, size_t offset = 0) const {
    std::vector<T> out(count);
    if (count) KVB_CUDA_CHECK(cudaMemcpy(out.data(), data_ + offset, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<T> download() const { return download(size_); }

 private:
  void release() {
    // Work queued on any stream may still use the memory: wait for it before freeing.
    if (data_) {
      cudaDeviceSynchronize();
      cudaFree(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  T* data() { return data_; }
  size_t size() const { return size_; }
  // At least `count` elements (grows, never shrinks); contents are not kept.
  void reserve(size_t count) {
    if (count <= size_) return;
    release();
    const cudaError_t err = cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T));
    if (err != cudaSuccess) {
      data_ = nullptr;
      cudaGetLastError();
      throw Error("CUDA: cannot allocate " + std::to_string(count * sizeof(T) >> 20) +
                  " MiB of page-locked host memory: " + cudaGetErrorString(err));
    }
    size_ = count;
  }

 private:
  void release() {
    // An asynchronous copy may still write the memory: wait for it before freeing.
    if (data_) {
      cudaDeviceSynchronize();
      cudaFreeHost(data_);
    }
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvb::cuda
