// cull_conflicts on CUDA: the block test (a thread per block), the row test (a thread per lane of a kept block),
// then the RAW check (a thread per candidate row, binary search in each earlier step's sorted write set).
//
// Same contract and bits as the CPU op (cull_region.h holds the shared, FMA-free row test); the compactions
// (nonzero, masked_select, sort) are torch's and synchronize with the host for their sizes.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda_common.cuh"
#include "cull_region.h"

namespace odin {
namespace {

struct BlockCoefficients {
  double value[kPlanes * kBoundRows];
};

__global__ void block_test_kernel(BlockCoefficients coefficients, const double* bounds, int64_t blocks,
                                  bool* may_meet) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b < blocks) may_meet[b] = block_may_meet(coefficients.value, bounds, blocks, b);
}

__global__ void row_test_kernel(CullConstants g, const float* spheres, const int64_t* kept, int64_t lanes,
                                bool* inside) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= lanes) return;
  const float* s = spheres + kept[i / kBlockRows] * 4 * kBlockRows + i % kBlockRows;
  inside[i] = sphere_meets(s[0], s[kBlockRows], s[2 * kBlockRows], s[3 * kBlockRows], g);
}

__global__ void raw_kernel(const int64_t* candidate, int64_t m, const int64_t* written, const int64_t* offsets,
                           const int64_t* steps, int64_t sets, int64_t reader_step, int64_t* last, int64_t* first) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m) return;
  int64_t latest = kNoStep, earliest = kNoStep;
  for (int64_t s = 0; s < sets; ++s) {
    if (steps[s] >= reader_step || find_sorted(written + offsets[s], offsets[s + 1] - offsets[s], candidate[i]) < 0) {
      continue;
    }
    latest = latest > steps[s] ? latest : steps[s];
    earliest = earliest == kNoStep || steps[s] < earliest ? steps[s] : earliest;
  }
  last[i] = latest;
  first[i] = earliest;
}

}  // namespace

CullResult cull_conflicts_cuda(const at::Tensor& block_rows, const at::Tensor& block_spheres,
                               const at::Tensor& block_bounds, at::ArrayRef<double> region, at::TensorList writes,
                               at::IntArrayRef write_steps, int64_t reader_step, double magnitude) {
  check_cull_inputs(block_rows, block_spheres, block_bounds, region, writes, write_steps);
  const c10::cuda::CUDAGuard guard(block_rows.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = block_rows.size(0);
  BlockCoefficients coefficients;
  block_coefficients(region.data(), magnitude, coefficients.value);
  at::Tensor may_meet = at::empty({blocks}, block_rows.options().dtype(at::kBool));
  if (blocks > 0) {
    block_test_kernel<<<blocks_for(blocks), kThreads, 0, stream>>>(coefficients, block_bounds.data_ptr<double>(),
                                                                   blocks, may_meet.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const at::Tensor kept = at::nonzero(may_meet).flatten();
  const int64_t lanes = kept.numel() * kBlockRows;
  at::Tensor inside = at::empty({lanes}, may_meet.options());
  if (lanes > 0) {
    row_test_kernel<<<blocks_for(lanes), kThreads, 0, stream>>>(cull_constants(region.data()),
                                                                block_spheres.data_ptr<float>(),
                                                                kept.data_ptr<int64_t>(), lanes,
                                                                inside.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const at::Tensor rows = at::masked_select(block_rows.index_select(0, kept).flatten(), inside);
  const at::Tensor candidate = std::get<0>(at::sort(rows));
  const int64_t m = candidate.numel();
  at::Tensor last = at::empty({m}, candidate.options());
  at::Tensor first = at::empty({m}, candidate.options());
  if (m > 0) {
    // The write sets concatenated, with their offsets and steps copied to the device.
    const int64_t sets = static_cast<int64_t>(write_steps.size());
    at::Tensor host = at::empty({2 * sets + 1}, at::TensorOptions().dtype(at::kLong));
    int64_t* offset = host.data_ptr<int64_t>();
    offset[0] = 0;
    for (int64_t s = 0; s < sets; ++s) {
      offset[s + 1] = offset[s] + writes[s].numel();
      offset[sets + 1 + s] = write_steps[s];
    }
    const at::Tensor on_device = host.to(candidate.device());
    const at::Tensor offsets = on_device.slice(0, 0, sets + 1);
    const at::Tensor steps = on_device.slice(0, sets + 1);
    const at::Tensor write_rows = sets ? at::cat(writes) : at::empty({0}, candidate.options());
    raw_kernel<<<blocks_for(m), kThreads, 0, stream>>>(candidate.data_ptr<int64_t>(), m,
                                                       write_rows.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(),
                                                       steps.data_ptr<int64_t>(), steps.numel(), reader_step,
                                                       last.data_ptr<int64_t>(), first.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const at::Tensor hit = last.ne(kNoStep);
  return {candidate, at::masked_select(candidate, hit), at::masked_select(last, hit), at::masked_select(first, hit)};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CUDA, m) { m.impl("cull_conflicts", &odin::cull_conflicts_cuda); }
