// Schemas of Odin's bookkeeping ops (four kernels, five ops; namespace `odin`) and the input checks both backends
// share.
//
// Each op has one name; its CPU implementation is registered in <kernel>.cpp and its CUDA one in <kernel>.cu with
// TORCH_LIBRARY_IMPL, so the dispatcher (and torch.compile) sees one op per kernel. Shapes: see odin_ops.h and
// odin_nerfstudio/kernels/ops.py.
#include <torch/library.h>

#include "odin_ops.h"

namespace odin {

void check_cull_inputs(const at::Tensor& block_rows, const at::Tensor& block_spheres, const at::Tensor& block_bounds,
                       const at::Tensor& block_coefficients, const at::Tensor& region, const at::Tensor& write_rows,
                       const at::Tensor& write_offsets, const at::Tensor& write_steps) {
  const int64_t blocks = block_rows.size(0);
  TORCH_CHECK(block_rows.dim() == 2 && block_rows.size(1) == kBlockRows && block_rows.scalar_type() == at::kLong,
              "cull_conflicts: block_rows must be int64 [B, 64]");
  TORCH_CHECK(block_spheres.dim() == 3 && block_spheres.size(0) == blocks && block_spheres.size(1) == 4 &&
                  block_spheres.size(2) == kBlockRows && block_spheres.scalar_type() == at::kFloat,
              "cull_conflicts: block_spheres must be float32 [B, 4, 64]");
  TORCH_CHECK(block_bounds.dim() == 2 && block_bounds.size(0) == kBoundRows && block_bounds.size(1) == blocks &&
                  block_bounds.scalar_type() == at::kDouble,
              "cull_conflicts: block_bounds must be float64 [8, B]");
  TORCH_CHECK(block_coefficients.dim() == 2 && block_coefficients.size(0) == kPlanes &&
                  block_coefficients.size(1) == kBoundRows && block_coefficients.scalar_type() == at::kDouble,
              "cull_conflicts: block_coefficients must be float64 [5, 8]");
  TORCH_CHECK(region.numel() == kRegionSize && region.scalar_type() == at::kDouble,
              "cull_conflicts: region must be float64 [22]");
  TORCH_CHECK(write_rows.dim() == 1 && write_rows.scalar_type() == at::kLong, "cull_conflicts: write_rows int64 [W]");
  TORCH_CHECK(write_steps.dim() == 1 && write_steps.scalar_type() == at::kLong, "cull_conflicts: write_steps int64 [S]");
  TORCH_CHECK(write_offsets.dim() == 1 && write_offsets.numel() == write_steps.numel() + 1 &&
                  write_offsets.scalar_type() == at::kLong,
              "cull_conflicts: write_offsets must be int64 [S + 1]");
  for (const at::Tensor* t : {&block_rows, &block_spheres, &block_bounds, &block_coefficients, &region, &write_rows,
                              &write_offsets, &write_steps}) {
    TORCH_CHECK(t->is_contiguous(), "cull_conflicts: every input must be contiguous");
  }
  TORCH_CHECK(block_coefficients.is_cpu() && region.is_cpu() && write_offsets.is_cpu() && write_steps.is_cpu(),
              "cull_conflicts: block_coefficients, region, write_offsets and write_steps live on the CPU");
}

void check_rows_tensors(const std::vector<at::Tensor>& params, const at::Tensor& rows, const char* what) {
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(), what,
              ": rows must be contiguous int64 [M]");
  for (const at::Tensor& p : params) {
    TORCH_CHECK(p.dim() >= 1 && p.scalar_type() == at::kFloat && p.is_contiguous() && p.device() == rows.device(),
                what, ": every per-row tensor must be contiguous float32 [N, ...] on the rows' device");
  }
}

void check_positions(const at::Tensor& positions, const at::Tensor& rows, const char* what) {
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong, what, ": positions must be int64 [A]");
  TORCH_CHECK(positions.device() == rows.device(), what, ": positions are on ", positions.device(),
              ", the rows on ", rows.device(), "; move them to the rows' device");
  const int64_t m = rows.numel();
  if (positions.is_cpu()) {
    const int64_t* p = positions.data_ptr<int64_t>();
    for (int64_t i = 0; i < positions.numel(); ++i) {
      TORCH_CHECK(p[i] >= 0 && p[i] < m, what, ": position ", p[i], " out of range [0, ", m, ")");
    }
  }
}

}  // namespace odin

TORCH_LIBRARY(odin, m) {
  // Cull a region over the block index, then check the candidate rows against unpublished write sets (RAW).
  m.def(
      "cull_conflicts(Tensor block_rows, Tensor block_spheres, Tensor block_bounds, Tensor block_coefficients, "
      "Tensor region, Tensor write_rows, Tensor write_offsets, Tensor write_steps, int reader_step) "
      "-> (Tensor candidate, Tensor conflict_rows, Tensor last_step, Tensor first_step)");
  // Copy rows into fresh tensors under per-row seqlocks; report rows a publication held (never a torn copy).
  m.def(
      "gather_rows(Tensor[] params, Tensor rows, Tensor seq, bool check_locks) "
      "-> (Tensor[] leaves, Tensor versions, Tensor locked)");
  // A task's active rows (given positions, else the rows with a non-zero gradient) and their gradient rows.
  m.def(
      "stage_rows(Tensor candidate, Tensor[] grads, Tensor? positions) -> (Tensor rows, Tensor[] staged)");
  // Sum per-task sparse gradient rows on their union, in task order (no order-dependent float atomics).
  m.def("scatter_in_order(Tensor rows, Tensor offsets, Tensor[] grads) -> (Tensor union_rows, Tensor[] sums)");
  // Selective Adam on rows fused with the version bump, each row locked while written; priority rows first.
  m.def(
      "publish_adam(Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor[] grads, "
      "Tensor rows, Tensor(d!) seq, Tensor hyper, Tensor priority, bool use_locks) -> Tensor contention");
}
