// cull_conflicts on the CPU: C(t) over the block index fused with the read-after-write check of its rows.
//
// Equals culling/candidates.py (BoundingSpheres.rows_in) followed by core/conflicts.py (raw) bit for bit: the
// per-row test repeats _meets' float32 operations in the same order (built with -ffp-contract=off, so no FMA
// changes a rounding), and the block test only skips blocks whose rows the per-row test rejects anyway.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cull_region.h"
#include "odin_ops.h"

namespace odin {

CullResult cull_conflicts_cpu(const at::Tensor& block_rows, const at::Tensor& block_spheres,
                              const at::Tensor& block_bounds, at::ArrayRef<double> region, at::TensorList writes,
                              at::IntArrayRef write_steps, int64_t reader_step, double magnitude) {
  check_cull_inputs(block_rows, block_spheres, block_bounds, region, writes, write_steps);
  const int64_t blocks = block_rows.size(0);
  const CullConstants g = cull_constants(region.data());
  double coefficients[kPlanes * kBoundRows];
  block_coefficients(region.data(), magnitude, coefficients);
  const double* bounds = block_bounds.data_ptr<double>();
  const float* spheres = block_spheres.data_ptr<float>();
  const int64_t* rows_of = block_rows.data_ptr<int64_t>();

  // Blocks that may meet the region, then per kept block a 64-lane mask of the rows that do.
  std::vector<uint8_t> may_meet(blocks);
  at::parallel_for(0, blocks, row_grain(kPlanes * kBoundRows), [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) may_meet[b] = block_may_meet(coefficients, bounds, blocks, b);
  });
  std::vector<int64_t> kept;
  for (int64_t b = 0; b < blocks; ++b) {
    if (may_meet[b]) kept.push_back(b);
  }
  const int64_t num_kept = static_cast<int64_t>(kept.size());
  std::vector<uint64_t> lanes(num_kept);
  std::vector<int64_t> counts(num_kept + 1, 0);
  at::parallel_for(0, num_kept, row_grain(4 * kBlockRows), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const float* s = spheres + kept[k] * 4 * kBlockRows;
      uint64_t mask = 0;
      for (int64_t lane = 0; lane < kBlockRows; ++lane) {
        const bool in = sphere_meets(s[lane], s[kBlockRows + lane], s[2 * kBlockRows + lane], s[3 * kBlockRows + lane], g);
        mask |= static_cast<uint64_t>(in) << lane;
      }
      lanes[k] = mask;
      counts[k + 1] = __builtin_popcountll(mask);
    }
  });
  for (int64_t k = 0; k < num_kept; ++k) counts[k + 1] += counts[k];
  at::Tensor candidate = at::empty({counts[num_kept]}, block_rows.options());
  int64_t* out = candidate.data_ptr<int64_t>();
  at::parallel_for(0, num_kept, row_grain(kBlockRows), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      int64_t at = counts[k];
      for (int64_t lane = 0; lane < kBlockRows; ++lane) {
        if ((lanes[k] >> lane) & 1) out[at++] = rows_of[kept[k] * kBlockRows + lane];
      }
    }
  });
  // The blocks hold rows in Morton order of their centres; with the rows in spatial order (the runtime's default)
  // that is mostly row order already, so check before sorting.
  if (!std::is_sorted(out, out + candidate.numel())) std::sort(out, out + candidate.numel());

  // RAW: per candidate row, the latest and earliest earlier step whose write set holds it (a merge of sorted sets).
  const int64_t m = candidate.numel();
  const int64_t sets = static_cast<int64_t>(write_steps.size());
  const int64_t* steps = write_steps.data();
  std::vector<const int64_t*> set_begin(sets), set_end(sets);
  for (int64_t s = 0; s < sets; ++s) {
    set_begin[s] = writes[s].data_ptr<int64_t>();
    set_end[s] = set_begin[s] + writes[s].numel();
  }
  std::vector<int64_t> last(m, kNoStep), first(m, kNoStep);
  at::parallel_for(0, m, row_grain(std::max<int64_t>(1, sets) * 16), [&](int64_t begin, int64_t end) {
    // Both sides are sorted: per set, a cursor placed once per chunk walks forward with the candidate rows.
    for (int64_t s = 0; s < sets; ++s) {
      if (steps[s] >= reader_step) continue;
      const int64_t* cursor = std::lower_bound(set_begin[s], set_end[s], out[begin]);
      for (int64_t i = begin; i < end && cursor != set_end[s]; ++i) {
        while (cursor != set_end[s] && *cursor < out[i]) ++cursor;
        if (cursor == set_end[s] || *cursor != out[i]) continue;
        last[i] = std::max(last[i], steps[s]);
        first[i] = first[i] == kNoStep ? steps[s] : std::min(first[i], steps[s]);
      }
    }
  });
  int64_t hits = 0;
  for (int64_t i = 0; i < m; ++i) hits += last[i] != kNoStep;
  at::Tensor conflict_rows = at::empty({hits}, candidate.options());
  at::Tensor last_step = at::empty({hits}, candidate.options());
  at::Tensor first_step = at::empty({hits}, candidate.options());
  for (int64_t i = 0, h = 0; i < m; ++i) {
    if (last[i] == kNoStep) continue;
    conflict_rows.data_ptr<int64_t>()[h] = out[i];
    last_step.data_ptr<int64_t>()[h] = last[i];
    first_step.data_ptr<int64_t>()[h] = first[i];
    ++h;
  }
  return {candidate, conflict_rows, last_step, first_step};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("cull_conflicts", &odin::cull_conflicts_cpu); }
