// Odin's primitive-level bookkeeping kernels: shared declarations of the CPU and CUDA implementations.
//
// Four kernels, five ops, registered under the `odin` namespace (registration.cpp holds their schemas):
// cull_conflicts, gather_rows, the staging scatter (stage_rows, scatter_in_order), publish_adam. Each has a
// pure-torch reference in odin_nerfstudio/kernels/_torch_impl.py that it equals bit for bit; the shapes and
// contracts are documented there and in odin_nerfstudio/kernels/ops.py. Every float tensor is float32 and
// contiguous, every index tensor int64.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace odin {

// Rows per block of the culling index (culling/candidates.py BLOCK_ROWS).
constexpr int64_t kBlockRows = 64;
// Entries of the region vector: rotation (9, row-major), translation (3), radius scale, near plane, the widened
// image's left/right/top/bottom slopes, and their plane norms sqrt(1 + slope^2) (4).
constexpr int64_t kRegionSize = 22;
// Planes of a cull region and entries per plane of the block coefficients (min(m, 0) x3, max(m, 0) x3, radius, 1).
constexpr int64_t kPlanes = 5;
constexpr int64_t kBoundRows = 8;
// Entries per parameter of publish_adam's hyper table: 1 - beta1, beta2, 1 - beta2, sqrt(bias correction 2), eps,
// -step_size (lr / bias correction 1).
constexpr int64_t kHyperSize = 6;
// How often a gather re-reads a row whose sequence word changed during its copy before reporting it locked.
constexpr int kReadRetries = 3;
constexpr int64_t kNoStep = -1;

using CullResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using GatherResult = std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor>;
using StageResult = std::tuple<at::Tensor, std::vector<at::Tensor>>;
using ScatterResult = std::tuple<at::Tensor, std::vector<at::Tensor>>;

// Rows per at::parallel_for chunk for rows of `width` floats: at least at::internal::GRAIN_SIZE elements, as torch's
// own kernels chunk, so small calls run inline instead of waking the thread pool (costly on a busy machine).
inline int64_t row_grain(int64_t width) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, width)); }

// Column count of a contiguous per-row tensor [N, ...]: the product of its trailing sizes (valid for N == 0).
inline int64_t row_width(const at::Tensor& t) {
  int64_t width = 1;
  for (int64_t d = 1; d < t.dim(); ++d) width *= t.size(d);
  return width;
}

void check_cull_inputs(const at::Tensor& block_rows, const at::Tensor& block_spheres, const at::Tensor& block_bounds,
                       const at::Tensor& block_coefficients, const at::Tensor& region, const at::Tensor& write_rows,
                       const at::Tensor& write_offsets, const at::Tensor& write_steps);
void check_rows_tensors(const std::vector<at::Tensor>& params, const at::Tensor& rows, const char* what);
// Positions into the M rows of ``rows``: int64 [A] on the rows' device (range-checked where they live on the CPU).
void check_positions(const at::Tensor& positions, const at::Tensor& rows, const char* what);

CullResult cull_conflicts_cpu(const at::Tensor& block_rows, const at::Tensor& block_spheres,
                              const at::Tensor& block_bounds, const at::Tensor& block_coefficients,
                              const at::Tensor& region, const at::Tensor& write_rows, const at::Tensor& write_offsets,
                              const at::Tensor& write_steps, int64_t reader_step);
GatherResult gather_rows_cpu(at::TensorList params, const at::Tensor& rows, const at::Tensor& seq, bool check_locks);
StageResult stage_rows_cpu(const at::Tensor& candidate, at::TensorList grads,
                           const std::optional<at::Tensor>& positions);
ScatterResult scatter_in_order_cpu(const at::Tensor& rows, const at::Tensor& offsets, at::TensorList grads);
at::Tensor publish_adam_cpu(at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                            at::TensorList grads, const at::Tensor& rows, const at::Tensor& seq,
                            const at::Tensor& hyper, const at::Tensor& priority, bool use_locks);

}  // namespace odin
