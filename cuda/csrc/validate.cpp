// validate_read on the CPU: a read without admitted stale rows checked against the rows published since it read.
//
// Equals runtime/validation.py Validator.validate's stale and candidate checks for such a read: "stale" when a
// written row is in C(t) (binary search in the sorted candidate set), "candidate" when a written row outside C(t)
// now meets the task's culling region (cull_region.h's row test, _meets' float32 operations in _meets' order).
// Both answers go to the host anyway (validation decides on the host whether to re-run), hence CPU only.
#include <torch/library.h>

#include <algorithm>
#include <tuple>

#include "cull_region.h"
#include "odin_ops.h"

namespace odin {

std::tuple<bool, bool> validate_read_cpu(const at::Tensor& candidate, at::TensorList written,
                                         const at::Tensor& centres, const at::Tensor& radii,
                                         at::ArrayRef<double> region) {
  const int64_t n = radii.numel();
  TORCH_CHECK(candidate.dim() == 1 && candidate.scalar_type() == at::kLong, "validate_read: candidate int64 [M]");
  TORCH_CHECK(centres.dim() == 2 && centres.size(0) == 3 && centres.size(1) == n && centres.scalar_type() == at::kFloat,
              "validate_read: centres must be float32 [3, N]");
  TORCH_CHECK(radii.dim() == 1 && radii.scalar_type() == at::kFloat, "validate_read: radii must be float32 [N]");
  TORCH_CHECK(static_cast<int64_t>(region.size()) == kRegionSize, "validate_read: the region has ", kRegionSize,
              " entries");
  for (const at::Tensor* t : {&candidate, &centres, &radii}) {
    TORCH_CHECK(t->is_cpu() && t->is_contiguous(), "validate_read: every input must be a contiguous CPU tensor");
  }
  for (const at::Tensor& w : written) {
    TORCH_CHECK(w.dim() == 1 && w.scalar_type() == at::kLong && w.is_cpu() && w.is_contiguous(),
                "validate_read: every written set must be contiguous CPU int64 [W]");
  }
  const CullConstants g = cull_constants(region.data());
  const int64_t* begin = candidate.data_ptr<int64_t>();
  const int64_t* end = begin + candidate.numel();
  const float* c = centres.data_ptr<float>();
  const float* r = radii.data_ptr<float>();
  bool stale = false, moved = false;
  for (const at::Tensor& w : written) {
    const int64_t* rows = w.data_ptr<int64_t>();
    for (int64_t i = 0; i < w.numel() && !(stale && moved); ++i) {
      const int64_t row = rows[i];
      TORCH_CHECK(row >= 0 && row < n, "validate_read: row ", row, " out of range [0, ", n, ")");
      if (std::binary_search(begin, end, row)) {
        stale = true;
      } else if (!moved) {
        moved = sphere_meets(c[row], c[n + row], c[2 * n + row], r[row], g);
      }
    }
  }
  return {stale, moved};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("validate_read", &odin::validate_read_cpu); }
