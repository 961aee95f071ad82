// publish_adam on CUDA: a thread per row takes the row's lock, runs selective Adam on its parameters and moments,
// and releases the lock one version later (see publish.cpp for the protocol). Priority rows go in a first launch.
//
// Lock: atomicCAS on the sequence word from even to odd (a failed try counts as contention and spins), then
// __threadfence() before the row's stores; __threadfence() after them, then atomicExch to the word + 2. The
// contention count stays on the device (an int64 [1] tensor): reading it would synchronize the stream.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "adam_row.h"
#include "cuda_common.cuh"

namespace odin {
namespace {

struct AdamPack {
  AdamConstants constants[kMaxParams];
};

__global__ void publish_kernel(RowTensors params, RowTensors first, RowTensors second, RowTensors grads,
                               AdamPack adam, const int64_t* rows, int64_t m, const int64_t* priority,
                               int64_t priorities, bool wanted, long long* seq, bool use_locks,
                               unsigned long long* contention) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m) return;
  const int64_t r = rows[i];
  if ((find_sorted(priority, priorities, r) >= 0) != wanted) return;
  volatile long long* word = seq + r;
  long long before = *word;
  if (use_locks) {
    while ((before & 1) || atomicCAS(reinterpret_cast<unsigned long long*>(seq + r),
                                     static_cast<unsigned long long>(before),
                                     static_cast<unsigned long long>(before + 1)) !=
                               static_cast<unsigned long long>(before)) {
      atomicAdd(contention, 1ull);
      before = *word;
    }
    __threadfence();  // the odd word is visible before any store to the row
  }
  for (int k = 0; k < params.count; ++k) {
    const int64_t w = params.width[k];
    const AdamConstants& c = adam.constants[k];
    for (int64_t d = 0; d < w; ++d) {
      const float g = grads.data[k][i * w + d];
      const float mm = adam_first_moment(first.data[k][r * w + d], g, c);
      const float vv = adam_second_moment(second.data[k][r * w + d], g, c);
      params.data[k][r * w + d] = adam_param(params.data[k][r * w + d], mm, sqrtf(vv), c);
      first.data[k][r * w + d] = mm;
      second.data[k][r * w + d] = vv;
    }
  }
  __threadfence();  // the row's stores are visible before the even word
  atomicExch(reinterpret_cast<unsigned long long*>(seq + r), static_cast<unsigned long long>(before + 2));
}

}  // namespace

at::Tensor publish_adam_cuda(at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                             at::TensorList grads, const at::Tensor& rows, const at::Tensor& seq,
                             const at::Tensor& hyper, const at::Tensor& priority, bool use_locks) {
  const int64_t count = static_cast<int64_t>(params.size());
  TORCH_CHECK(static_cast<int64_t>(exp_avgs.size()) == count && static_cast<int64_t>(exp_avg_sqs.size()) == count &&
                  static_cast<int64_t>(grads.size()) == count && count <= kMaxParams,
              "publish_adam: one exp_avg, exp_avg_sq and gradient per parameter (at most 8 parameters)");
  for (at::TensorList list : {params, exp_avgs, exp_avg_sqs, grads}) check_rows_tensors(list.vec(), rows, "publish_adam");
  TORCH_CHECK(seq.dim() == 1 && seq.scalar_type() == at::kLong && seq.is_contiguous() && seq.device() == rows.device(),
              "publish_adam: seq int64 [N] on the rows' device");
  TORCH_CHECK(hyper.dim() == 2 && hyper.size(0) == count && hyper.size(1) == kHyperSize &&
                  hyper.scalar_type() == at::kDouble && hyper.is_cpu() && hyper.is_contiguous(),
              "publish_adam: hyper must be CPU float64 [P, 6]");
  TORCH_CHECK(priority.dim() == 1 && priority.scalar_type() == at::kLong && priority.is_contiguous() &&
                  priority.device() == rows.device(),
              "publish_adam: priority must be sorted int64 [Q] on the rows' device");
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t m = rows.numel();
  AdamPack adam{};
  for (int64_t k = 0; k < count; ++k) {
    TORCH_CHECK(params[k].size(0) == seq.numel() && exp_avgs[k].sizes() == params[k].sizes() &&
                    exp_avg_sqs[k].sizes() == params[k].sizes() && grads[k].size(0) == m &&
                    row_width(grads[k]) == row_width(params[k]),
                "publish_adam: parameter ", k, ": moments [N, ...] like it, gradient [M, ...]");
    adam.constants[k] = adam_constants(hyper.data_ptr<double>() + k * kHyperSize);
  }
  at::Tensor contention = at::zeros({1}, rows.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  for (const bool wanted : {true, false}) {
    if (m == 0 || (wanted && priority.numel() == 0)) continue;
    publish_kernel<<<blocks_for(m), kThreads, 0, stream>>>(
        row_tensors(params.vec()), row_tensors(exp_avgs.vec()), row_tensors(exp_avg_sqs.vec()),
        row_tensors(grads.vec()), adam, rows.data_ptr<int64_t>(), m, priority.data_ptr<int64_t>(), priority.numel(),
        wanted, reinterpret_cast<long long*>(seq.data_ptr<int64_t>()), use_locks,
        reinterpret_cast<unsigned long long*>(contention.data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return contention;
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CUDA, m) { m.impl("publish_adam", &odin::publish_adam_cuda); }
