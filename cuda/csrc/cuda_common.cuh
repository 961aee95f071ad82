// Helpers shared by the CUDA implementations: launch sizes, per-parameter pointer packs, a device binary search.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <vector>

#include "odin_ops.h"

namespace odin {

constexpr int kThreads = 256;
// Parameters one launch handles (gsplat's layout has six: means, scales, quats, opacities, features_dc, _rest).
constexpr int kMaxParams = 8;

inline unsigned int blocks_for(int64_t n) { return static_cast<unsigned int>((n + kThreads - 1) / kThreads); }

// Up to kMaxParams per-row tensors passed by value to a kernel: data pointers and row widths.
struct RowTensors {
  float* data[kMaxParams];
  int64_t width[kMaxParams];
  int count;
};

inline RowTensors row_tensors(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(tensors.size() <= static_cast<size_t>(kMaxParams), "odin CUDA ops take at most ", kMaxParams,
              " per-row tensors per call");
  RowTensors out{};
  out.count = static_cast<int>(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    out.data[k] = tensors[k].data_ptr<float>();
    out.width[k] = row_width(tensors[k]);
  }
  return out;
}

// Position of `value` in the sorted range [first, last), or -1.
__device__ __forceinline__ int64_t find_sorted(const int64_t* first, int64_t count, int64_t value) {
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (first[mid] < value) lo = mid + 1; else hi = mid;
  }
  return lo < count && first[lo] == value ? lo : -1;
}

}  // namespace odin
