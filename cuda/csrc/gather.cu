// gather_rows on CUDA: a thread per row runs the seqlock read of gather.cpp (see there for the protocol).
//
// The sequence word is read with volatile loads around __threadfence(); the row is copied with __ldcg (L2, not the
// non-coherent L1), so a publication on another stream is seen as the CPU op sees one on another thread.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cuda_common.cuh"

namespace odin {
namespace {

__global__ void gather_kernel(RowTensors src, RowTensors dst, const int64_t* rows, int64_t m, const int64_t* seq,
                              bool check_locks, int64_t* versions, bool* locked) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= m) return;
  const int64_t r = rows[i];
  const volatile long long* word = reinterpret_cast<const volatile long long*>(seq + r);
  bool consistent = false;
  long long before = 0;
  for (int attempt = 0; attempt < (check_locks ? kReadRetries : 1) && !consistent; ++attempt) {
    before = *word;
    if (check_locks && (before & 1)) continue;  // a publication holds the row now
    __threadfence();  // the copy's loads stay after the first read of the word
    for (int k = 0; k < src.count; ++k) {
      const int64_t w = src.width[k];
      for (int64_t d = 0; d < w; ++d) dst.data[k][i * w + d] = __ldcg(src.data[k] + r * w + d);
    }
    __threadfence();  // ... and before the second read: a writer that started meanwhile changed the word
    consistent = !check_locks || *word == before;
  }
  versions[i] = before >> 1;
  locked[i] = !consistent;
  if (!consistent) {
    for (int k = 0; k < dst.count; ++k) {
      for (int64_t d = 0; d < dst.width[k]; ++d) dst.data[k][i * dst.width[k] + d] = 0.0f;
    }
  }
}

}  // namespace

GatherResult gather_rows_cuda(at::TensorList params, const at::Tensor& rows, const at::Tensor& seq, bool check_locks) {
  const std::vector<at::Tensor> tensors = params.vec();
  check_rows_tensors(tensors, rows, "gather_rows");
  TORCH_CHECK(seq.dim() == 1 && seq.scalar_type() == at::kLong && seq.is_contiguous() && seq.device() == rows.device(),
              "gather_rows: seq int64 [N] on the rows' device");
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t m = rows.numel();
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& p : tensors) {
    TORCH_CHECK(p.size(0) == seq.numel(), "gather_rows: every tensor must have seq's N rows");
    std::vector<int64_t> shape = p.sizes().vec();
    shape[0] = m;
    leaves.push_back(at::empty(shape, p.options()));
  }
  at::Tensor versions = at::empty({m}, rows.options());
  at::Tensor locked = at::zeros({m}, rows.options().dtype(at::kBool));
  if (m > 0) {
    gather_kernel<<<blocks_for(m), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        row_tensors(tensors), row_tensors(leaves), rows.data_ptr<int64_t>(), m, seq.data_ptr<int64_t>(), check_locks,
        versions.data_ptr<int64_t>(), locked.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {leaves, versions, locked};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CUDA, m) { m.impl("gather_rows", &odin::gather_rows_cuda); }
