// Odin's primitive-level bookkeeping kernels: shared declarations of the CPU and CUDA implementations.
//
// Four kernels, five ops, registered under the `odin` namespace (registration.cpp holds their schemas):
// cull_conflicts, gather_rows, the staging scatter (stage_rows, scatter_in_order), publish_adam; and five CPU-only
// ops for the rest of the hot path's bookkeeping: refresh_bounds (the culling index after a publication),
// validate_read (a read against the recent publications), union_rows (the sorted union of row sets), and
// declare_rows / settle_rows (the tables' pending-write marks). Each equals bit for bit the torch code it
// stands for: the pure-torch reference in odin_nerfstudio/kernels/_torch_impl.py, or for union_rows, declare_rows
// and settle_rows the core's own (core/conflicts.py's union_sorted, core/tables.py's PrimitiveTables); the shapes
// and contracts are documented there and in odin_nerfstudio/kernels/ops.py. Parameters, moments and gradients are
// float32, the culling bounds and Adam's constants float64; every tensor contiguous, every index tensor int64.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

namespace odin {

// Rows per block of the culling index (culling/candidates.py BLOCK_ROWS).
constexpr int64_t kBlockRows = 64;
// Entries of the region vector: rotation (9, row-major), translation (3), near plane, near factor, the widened
// image's left/right/top/bottom slopes (4), their side factors (4), the limits of |x / z| and |y / z| (2), and the
// depth from which a row's own slopes set its factor.
constexpr int64_t kRegionSize = 25;
// Planes of a cull region and entries per plane of the block coefficients (min(m, 0) x3, max(m, 0) x3, radius,
// offset), which cull_conflicts computes from the region vector (cull_region.h block_coefficients).
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

// Copy one row of `width` floats. The model's rows are mostly 1, 3 or 4 floats wide (opacity, means, scales,
// quats), where a memcpy call per row and parameter costs more than the copy itself.
inline void copy_row(float* out, const float* in, int64_t width) {
  switch (width) {
    case 1:
      out[0] = in[0];
      return;
    case 3:
      out[0] = in[0], out[1] = in[1], out[2] = in[2];
      return;
    case 4:
      out[0] = in[0], out[1] = in[1], out[2] = in[2], out[3] = in[3];
      return;
    default:
      std::memcpy(out, in, width * sizeof(float));
  }
}

// Column count of a contiguous per-row tensor [N, ...]: the product of its trailing sizes (valid for N == 0).
inline int64_t row_width(const at::Tensor& t) {
  int64_t width = 1;
  for (int64_t d = 1; d < t.dim(); ++d) width *= t.size(d);
  return width;
}

void check_cull_inputs(const at::Tensor& block_rows, const at::Tensor& block_spheres, const at::Tensor& block_bounds,
                       at::ArrayRef<double> region, at::TensorList writes, at::IntArrayRef write_steps);
void check_rows_tensors(const std::vector<at::Tensor>& params, const at::Tensor& rows, const char* what);
// scatter_in_order's T row tensors (sorted unique int64, one device) and T x P gradients (task-major, float32
// [A_t, ...] each); returns P.
int64_t check_scatter_inputs(at::TensorList rows, at::TensorList grads);
// The sorted union of sorted row sets on the CPU (each merged in turn, duplicates dropped): rows.cpp.
std::vector<int64_t> sorted_union(at::TensorList parts);
// Positions into the M rows of ``rows``: int64 [A] on the rows' device (range-checked where they live on the CPU).
void check_positions(const at::Tensor& positions, const at::Tensor& rows, const char* what);

CullResult cull_conflicts_cpu(const at::Tensor& block_rows, const at::Tensor& block_spheres,
                              const at::Tensor& block_bounds, at::ArrayRef<double> region, at::TensorList writes,
                              at::IntArrayRef write_steps, int64_t reader_step, double magnitude);
GatherResult gather_rows_cpu(at::TensorList params, const at::Tensor& rows, const at::Tensor& seq, bool check_locks);
StageResult stage_rows_cpu(const at::Tensor& candidate, at::TensorList grads,
                           const std::optional<at::Tensor>& positions);
ScatterResult scatter_in_order_cpu(at::TensorList rows, at::TensorList grads);
at::Tensor publish_adam_cpu(at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                            at::TensorList grads, const at::Tensor& rows, const at::Tensor& seq,
                            const at::Tensor& hyper, const at::Tensor& priority, bool use_locks);
double refresh_bounds_cpu(const at::Tensor& centres, const at::Tensor& radii, const at::Tensor& spheres,
                          const at::Tensor& bounds, const at::Tensor& slot_of, const at::Tensor& rows,
                          const at::Tensor& means, const at::Tensor& world_scales);
std::tuple<bool, bool> validate_read_cpu(const at::Tensor& candidate, at::TensorList written,
                                         const at::Tensor& centres, const at::Tensor& radii,
                                         at::ArrayRef<double> region);
at::Tensor union_rows_cpu(at::TensorList parts);
void declare_rows_cpu(const at::Tensor& pending_step, const at::Tensor& rows, int64_t step);
void settle_rows_cpu(const at::Tensor& published_step, const at::Tensor& pending_step, const at::Tensor& rows,
                     at::TensorList declared, int64_t step);

}  // namespace odin
