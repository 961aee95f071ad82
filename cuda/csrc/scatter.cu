// The staging scatter on CUDA. stage_rows: a thread per candidate row flags a non-zero gradient, then a thread per
// active row copies its row id and gradient rows (exact copies). scatter_in_order: a thread per union row adds the
// tasks' rows in task order (binary search per task).
//
// No float atomics: each output row has one owner, so its sum runs 0 + g_0 + g_1 + ... in task order, as on the
// CPU and in sum_in_order. The union is torch's sort + unique_consecutive.
#include <ATen/ops/cat.h>
#include <ATen/ops/clone.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/unique_consecutive.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "cuda_common.cuh"

namespace odin {
namespace {

__global__ void nonzero_rows_kernel(RowTensors grads, int64_t m, bool* nonzero) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m) return;
  bool any = false;
  for (int k = 0; k < grads.count && !any; ++k) {
    const int64_t w = grads.width[k];
    for (int64_t d = 0; d < w; ++d) any |= grads.data[k][i * w + d] != 0.0f;  // NaN counts, -0.0 does not
  }
  nonzero[i] = any;
}

__global__ void stage_kernel(RowTensors src, RowTensors dst, const int64_t* candidate, const int64_t* positions,
                             int64_t a, int64_t* rows) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= a) return;
  const int64_t at = positions[i];
  rows[i] = candidate[at];
  for (int k = 0; k < src.count; ++k) {
    const int64_t w = src.width[k];
    for (int64_t d = 0; d < w; ++d) dst.data[k][i * w + d] = src.data[k][at * w + d];
  }
}

__global__ void scatter_kernel(RowTensors src, RowTensors dst, const int64_t* rows, const int64_t* offsets,
                               int64_t tasks, const int64_t* union_rows, int64_t u) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= u) return;
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t hit = find_sorted(rows + offsets[t], offsets[t + 1] - offsets[t], union_rows[i]);
    if (hit < 0) continue;
    const int64_t at = offsets[t] + hit;
    for (int k = 0; k < src.count; ++k) {
      const int64_t w = src.width[k];
      for (int64_t d = 0; d < w; ++d) dst.data[k][i * w + d] = __fadd_rn(dst.data[k][i * w + d], src.data[k][at * w + d]);
    }
  }
}

}  // namespace

StageResult stage_rows_cuda(const at::Tensor& candidate, at::TensorList grads,
                            const std::optional<at::Tensor>& positions) {
  const std::vector<at::Tensor> tensors = grads.vec();
  check_rows_tensors(tensors, candidate, "stage_rows");
  const c10::cuda::CUDAGuard guard(candidate.device());
  const int64_t m = candidate.numel();
  for (const at::Tensor& g : tensors) {
    TORCH_CHECK(g.size(0) == m, "stage_rows: every gradient needs one row per candidate row");
  }
  at::Tensor active;
  if (positions.has_value() && positions->scalar_type() == at::kBool) {
    TORCH_CHECK(positions->dim() == 1 && positions->numel() == m && positions->device() == candidate.device(),
                "stage_rows: the active mask must be bool [", m, "] on the candidate's device");
    // A host synchronization, needed, as in the reference: the staged tensors' size is the count of active rows.
    active = at::nonzero(*positions).flatten();
  } else if (positions.has_value()) {
    active = positions->contiguous();
    check_positions(active, candidate, "stage_rows");
  } else {
    at::Tensor nonzero = at::empty({m}, candidate.options().dtype(at::kBool));
    if (m > 0) {
      nonzero_rows_kernel<<<blocks_for(m), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          row_tensors(tensors), m, nonzero.data_ptr<bool>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    // A host synchronization, needed: the staged tensors' size is the count of active rows (as the reference's
    // nonzero). A renderer that reports A(t) (gsplat's radii) passes positions and skips it.
    active = at::nonzero(nonzero).flatten();
  }
  const int64_t a = active.numel();
  at::Tensor rows = at::empty({a}, candidate.options());
  std::vector<at::Tensor> staged;
  for (const at::Tensor& g : tensors) {
    std::vector<int64_t> shape = g.sizes().vec();
    shape[0] = a;
    staged.push_back(at::empty(shape, g.options()));
  }
  if (a > 0) {
    stage_kernel<<<blocks_for(a), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        row_tensors(tensors), row_tensors(staged), candidate.data_ptr<int64_t>(), active.data_ptr<int64_t>(), a,
        rows.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {rows, staged};
}

ScatterResult scatter_in_order_cuda(at::TensorList task_rows, at::TensorList task_grads) {
  const int64_t tasks = static_cast<int64_t>(task_rows.size());
  const int64_t params = check_scatter_inputs(task_rows, task_grads);
  const c10::cuda::CUDAGuard guard(task_rows[0].device());
  if (tasks == 1) {
    std::vector<at::Tensor> copies;
    for (const at::Tensor& g : task_grads) copies.push_back(g.clone());
    return {task_rows[0].clone(), copies};
  }
  // The kernel reads the tasks' rows and gradients concatenated (device copies, no host synchronization).
  std::vector<int64_t> sizes(tasks + 1, 0);
  for (int64_t t = 0; t < tasks; ++t) sizes[t + 1] = sizes[t] + task_rows[t].numel();
  at::Tensor offsets = at::empty({tasks + 1}, at::TensorOptions().dtype(at::kLong));
  std::copy(sizes.begin(), sizes.end(), offsets.data_ptr<int64_t>());
  const at::Tensor rows = at::cat(task_rows);
  std::vector<at::Tensor> tensors;
  for (int64_t p = 0; p < params; ++p) {
    std::vector<at::Tensor> parts;
    for (int64_t t = 0; t < tasks; ++t) parts.push_back(task_grads[t * params + p]);
    tensors.push_back(at::cat(parts));
  }
  const at::Tensor union_rows = std::get<0>(at::unique_consecutive(std::get<0>(at::sort(rows))));
  const int64_t u = union_rows.numel();
  std::vector<at::Tensor> sums;
  for (const at::Tensor& g : tensors) {
    std::vector<int64_t> shape = g.sizes().vec();
    shape[0] = u;
    sums.push_back(at::zeros(shape, g.options()));
  }
  if (u > 0) {
    const at::Tensor device_offsets = offsets.to(rows.device());
    scatter_kernel<<<blocks_for(u), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        row_tensors(tensors), row_tensors(sums), rows.data_ptr<int64_t>(), device_offsets.data_ptr<int64_t>(), tasks,
        union_rows.data_ptr<int64_t>(), u);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {union_rows, sums};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CUDA, m) {
  m.impl("stage_rows", &odin::stage_rows_cuda);
  m.impl("scatter_in_order", &odin::scatter_in_order_cuda);
}
