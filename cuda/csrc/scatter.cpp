// The staging scatter on the CPU: stage_rows takes a task's active rows and their gradients out of its leaves (into
// its ring slot); scatter_in_order sums T tasks' sparse gradient rows on the sorted union of their rows, in task order.
//
// stage_rows equals the runtime's active mask or positions + index_select (a copy: exact). scatter_in_order equals
// core/sparse.py sum_in_order bit for bit: each union row starts from +0.0 and receives the tasks'
// contributions in task order (one thread owns a union row, so no float atomics and no order that varies with
// the schedule); a single task's update is returned as a copy (sum_in_order returns it as is, without 0 + g).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "odin_ops.h"

namespace odin {

StageResult stage_rows_cpu(const at::Tensor& candidate, at::TensorList grads,
                           const std::optional<at::Tensor>& positions) {
  const std::vector<at::Tensor> tensors = grads.vec();
  check_rows_tensors(tensors, candidate, "stage_rows");
  const int64_t m = candidate.numel();
  std::vector<const float*> src;
  std::vector<int64_t> width;
  int64_t total_width = 0;
  for (const at::Tensor& g : tensors) {
    TORCH_CHECK(g.size(0) == m, "stage_rows: every gradient needs one row per candidate row");
    src.push_back(g.data_ptr<float>());
    width.push_back(row_width(g));
    total_width += width.back();
  }
  at::Tensor active;
  if (positions.has_value() && positions->scalar_type() != at::kBool) {
    // Positions given: torch's index_select per tensor, whose row copies beat a loop over rows of a few floats.
    active = positions->contiguous();
    check_positions(active, candidate, "stage_rows");
    std::vector<at::Tensor> staged;
    for (const at::Tensor& g : tensors) staged.push_back(g.index_select(0, active));
    return {candidate.index_select(0, active), staged};
  } else {
    // Active: the mask's rows (the renderer's radii > 0), else a row with a non-zero gradient element in any tensor
    // (NaN counts, -0.0 does not: `!= 0`).
    std::vector<uint8_t> nonzero(m, 0);
    if (positions.has_value()) {
      const at::Tensor mask = positions->contiguous();
      TORCH_CHECK(mask.dim() == 1 && mask.numel() == m && mask.is_cpu(), "stage_rows: the active mask must be bool [",
                  m, "] on the CPU, got ", mask.sizes(), " on ", mask.device());
      const bool* in = mask.data_ptr<bool>();
      for (int64_t i = 0; i < m; ++i) nonzero[i] = in[i];
    } else {
      at::parallel_for(0, m, row_grain(total_width), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          bool any = false;
          for (size_t p = 0; p < src.size() && !any; ++p) {
            const float* in = src[p] + i * width[p];
            for (int64_t d = 0; d < width[p]; ++d) any |= in[d] != 0.0f;
          }
          nonzero[i] = any;
        }
      });
    }
    int64_t count = 0;
    for (uint8_t v : nonzero) count += v;
    active = at::empty({count}, candidate.options());
    int64_t* out = active.data_ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i) {
      if (nonzero[i]) *out++ = i;
    }
  }
  const int64_t a = active.numel();
  const int64_t* position = active.data_ptr<int64_t>();
  const int64_t* row = candidate.data_ptr<int64_t>();
  at::Tensor rows = at::empty({a}, candidate.options());
  int64_t* rows_out = rows.data_ptr<int64_t>();
  std::vector<at::Tensor> staged;
  std::vector<float*> dst;
  for (const at::Tensor& g : tensors) {
    std::vector<int64_t> shape = g.sizes().vec();
    shape[0] = a;
    staged.push_back(at::empty(shape, g.options()));
    dst.push_back(staged.back().data_ptr<float>());
  }
  at::parallel_for(0, a, row_grain(total_width), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      rows_out[i] = row[position[i]];
      for (size_t p = 0; p < src.size(); ++p) copy_row(dst[p] + i * width[p], src[p] + position[i] * width[p], width[p]);
    }
  });
  return {rows, staged};
}

ScatterResult scatter_in_order_cpu(at::TensorList rows, at::TensorList grads) {
  const int64_t tasks = static_cast<int64_t>(rows.size());
  const int64_t params = check_scatter_inputs(rows, grads);
  if (tasks == 1) {
    std::vector<at::Tensor> copies;
    for (const at::Tensor& g : grads) copies.push_back(g.clone());
    return {rows[0].clone(), copies};
  }
  // The union: each task's rows are sorted, so they are merged one task at a time (O(R T), no sort).
  const std::vector<int64_t> merged = sorted_union(rows);
  std::vector<const int64_t*> first(tasks), last(tasks);
  for (int64_t t = 0; t < tasks; ++t) {
    first[t] = rows[t].data_ptr<int64_t>();
    last[t] = first[t] + rows[t].numel();
  }
  const int64_t u = static_cast<int64_t>(merged.size());
  at::Tensor union_rows = at::empty({u}, rows[0].options());
  std::copy(merged.begin(), merged.end(), union_rows.data_ptr<int64_t>());

  // grads is task-major: task t's gradient of parameter p is grads[t * params + p].
  std::vector<at::Tensor> sums;
  std::vector<float*> dst;
  std::vector<int64_t> width;
  int64_t total_width = 0;
  for (int64_t p = 0; p < params; ++p) {
    std::vector<int64_t> shape = grads[p].sizes().vec();
    shape[0] = u;
    sums.push_back(at::zeros(shape, grads[p].options()));
    dst.push_back(sums.back().data_ptr<float>());
    width.push_back(row_width(grads[p]));
    total_width += width.back();
  }
  std::vector<const float*> src(tasks * params);
  for (int64_t i = 0; i < tasks * params; ++i) src[i] = grads[i].data_ptr<float>();
  at::parallel_for(0, u, row_grain(tasks * total_width), [&](int64_t begin, int64_t end) {
    // Per task a cursor into its sorted rows, placed once per chunk and moved forward with the union rows.
    std::vector<const int64_t*> cursor(tasks);
    for (int64_t t = 0; t < tasks; ++t) cursor[t] = std::lower_bound(first[t], last[t], merged[begin]);
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t t = 0; t < tasks; ++t) {
        if (cursor[t] == last[t] || *cursor[t] != merged[i]) continue;
        const int64_t at = cursor[t]++ - first[t];
        for (int64_t p = 0; p < params; ++p) {
          float* out = dst[p] + i * width[p];
          const float* in = src[t * params + p] + at * width[p];
          for (int64_t d = 0; d < width[p]; ++d) out[d] += in[d];
        }
      }
    }
  });
  return {union_rows, sums};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("stage_rows", &odin::stage_rows_cpu);
  m.impl("scatter_in_order", &odin::scatter_in_order_cpu);
}
