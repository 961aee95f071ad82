// Schemas of Odin's bookkeeping ops (four kernels, five ops, and the CPU-only refresh_bounds, validate_read,
// union_rows, declare_rows and settle_rows; namespace `odin`) and the input checks both backends share.
//
// Each op has one name; its CPU implementation is registered in <kernel>.cpp and, for the four kernels' five ops,
// its CUDA one in <kernel>.cu with TORCH_LIBRARY_IMPL, so the dispatcher (and torch.compile) sees one op per
// kernel. Shapes: see odin_ops.h and odin_nerfstudio/kernels/ops.py.
#include <torch/library.h>

#include "odin_ops.h"

namespace odin {

void check_cull_inputs(const at::Tensor& block_rows, const at::Tensor& block_spheres, const at::Tensor& block_bounds,
                       at::ArrayRef<double> region, at::TensorList writes, at::IntArrayRef write_steps) {
  const int64_t blocks = block_rows.size(0);
  TORCH_CHECK(block_rows.dim() == 2 && block_rows.size(1) == kBlockRows && block_rows.scalar_type() == at::kLong,
              "cull_conflicts: block_rows must be int64 [B, 64]");
  TORCH_CHECK(block_spheres.dim() == 3 && block_spheres.size(0) == blocks && block_spheres.size(1) == 4 &&
                  block_spheres.size(2) == kBlockRows && block_spheres.scalar_type() == at::kFloat,
              "cull_conflicts: block_spheres must be float32 [B, 4, 64]");
  TORCH_CHECK(block_bounds.dim() == 2 && block_bounds.size(0) == kBoundRows && block_bounds.size(1) == blocks &&
                  block_bounds.scalar_type() == at::kDouble,
              "cull_conflicts: block_bounds must be float64 [8, B]");
  TORCH_CHECK(static_cast<int64_t>(region.size()) == kRegionSize, "cull_conflicts: the region has ", kRegionSize,
              " entries, got ", region.size());
  TORCH_CHECK(writes.size() == write_steps.size(), "cull_conflicts: one step per write set, got ", writes.size(),
              " sets and ", write_steps.size(), " steps");
  for (const at::Tensor* t : {&block_rows, &block_spheres, &block_bounds}) {
    TORCH_CHECK(t->is_contiguous(), "cull_conflicts: the block index must be contiguous");
  }
  for (const at::Tensor& w : writes) {
    TORCH_CHECK(w.dim() == 1 && w.scalar_type() == at::kLong && w.is_contiguous() && w.device() == block_rows.device(),
                "cull_conflicts: every write set must be contiguous sorted int64 [W] on the index's device");
  }
}

void check_rows_tensors(const std::vector<at::Tensor>& params, const at::Tensor& rows, const char* what) {
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous(), what,
              ": rows must be contiguous int64 [M]");
  for (const at::Tensor& p : params) {
    TORCH_CHECK(p.dim() >= 1 && p.scalar_type() == at::kFloat && p.is_contiguous() && p.device() == rows.device(),
                what, ": every per-row tensor must be contiguous float32 [N, ...] on the rows' device");
  }
}

int64_t check_scatter_inputs(at::TensorList rows, at::TensorList grads) {
  const int64_t tasks = static_cast<int64_t>(rows.size());
  TORCH_CHECK(tasks >= 1 && grads.size() % tasks == 0, "scatter_in_order: ", grads.size(), " gradients for ", tasks,
              " tasks (one per task and parameter, task-major)");
  const int64_t params = static_cast<int64_t>(grads.size()) / tasks;
  for (int64_t t = 0; t < tasks; ++t) {
    const std::vector<at::Tensor> own(grads.begin() + t * params, grads.begin() + (t + 1) * params);
    check_rows_tensors(own, rows[t], "scatter_in_order");
    TORCH_CHECK(rows[t].device() == rows[0].device(), "scatter_in_order: every task's rows on one device");
    for (int64_t p = 0; p < params; ++p) {
      TORCH_CHECK(own[p].size(0) == rows[t].numel(), "scatter_in_order: task ", t, "'s gradients need one row per row");
      TORCH_CHECK(row_width(own[p]) == row_width(grads[p]), "scatter_in_order: parameter ", p,
                  "'s gradients differ in shape between tasks");
    }
  }
  return params;
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
      "cull_conflicts(Tensor block_rows, Tensor block_spheres, Tensor block_bounds, float[] region, Tensor[] writes, "
      "int[] write_steps, int reader_step, float magnitude) "
      "-> (Tensor candidate, Tensor conflict_rows, Tensor last_step, Tensor first_step)");
  // Copy rows into fresh tensors under per-row seqlocks; report rows a publication held (never a torn copy).
  m.def(
      "gather_rows(Tensor[] params, Tensor rows, Tensor seq, bool check_locks) "
      "-> (Tensor[] leaves, Tensor versions, Tensor locked)");
  // A task's active rows (given positions or a mask, else the rows with a non-zero gradient) and their gradient rows.
  m.def(
      "stage_rows(Tensor candidate, Tensor[] grads, Tensor? positions) -> (Tensor rows, Tensor[] staged)");
  // Sum per-task sparse gradient rows on their union, in task order (no order-dependent float atomics).
  // (T tasks' rows, their T x P gradients task-major: no concatenation of the tasks' rows before the call.)
  m.def("scatter_in_order(Tensor[] rows, Tensor[] grads) -> (Tensor union_rows, Tensor[] sums)");
  // Selective Adam on rows fused with the version bump, each row locked while written; priority rows first.
  m.def(
      "publish_adam(Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, Tensor[] grads, "
      "Tensor rows, Tensor(d!) seq, Tensor hyper, Tensor priority, bool use_locks) -> Tensor contention");
  // The culling index's bounds of the rows a publication wrote; returns their largest finite |coordinate|.
  m.def(
      "refresh_bounds(Tensor(a!) centres, Tensor(b!) radii, Tensor(c!) spheres, Tensor(d!) bounds, Tensor slot_of, "
      "Tensor rows, Tensor means, Tensor world_scales) -> float magnitude");
  // A read without admitted stale rows against the rows written since: whether one is in C(t) (stale), whether one
  // outside it now meets the culling region (candidate).
  m.def(
      "validate_read(Tensor candidate, Tensor[] written, Tensor centres, Tensor radii, float[] region) "
      "-> (bool stale, bool moved)");
  // The sorted union of sorted unique row sets.
  m.def("union_rows(Tensor[] parts) -> Tensor rows");
  // The tables' pending-write marks: a read declares its rows for its step; a publication settles them.
  m.def("declare_rows(Tensor(a!) pending_step, Tensor rows, int step) -> ()");
  m.def(
      "settle_rows(Tensor(a!) published_step, Tensor(b!) pending_step, Tensor rows, Tensor[] declared, int step) "
      "-> ()");
}
