// refresh_bounds on the CPU: the culling index's refresh after a publication, in one pass over the rows written.
//
// Equals culling/candidates.py BoundingSpheres.update with its block index bit for bit: each row's centre and
// 3-sigma radius (3 * max(scale), NaN if a scale is NaN, as torch's max) are copied into the column-major bounds
// and the row's lanes of its block's spheres, and the block's box and largest radius grow as scatter_reduce's
// amin / amax grow them (a NaN source wins, else std::min / std::max keep the old value on a tie), in row order.
// Returns the largest finite |coordinate| of the new centres (0 if none), which the caller folds into the index's
// magnitude. CPU only: on CUDA the reference's torch ops run.
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "odin_ops.h"

namespace odin {
namespace {

inline double grown_min(double bound, double value) { return std::isnan(value) ? value : std::min(bound, value); }
inline double grown_max(double bound, double value) { return std::isnan(value) ? value : std::max(bound, value); }

// 3 * max(s0, s1, s2) in float32, NaN if any scale is NaN (torch's max propagates NaN).
inline float three_sigma(const float* s) {
  bool nan = std::isnan(s[0]);
  float largest = s[0];
  for (int k = 1; k < 3; ++k) {
    nan |= std::isnan(s[k]);
    largest = std::max(largest, s[k]);
  }
  return 3.0f * (nan ? std::nanf("") : largest);
}

}  // namespace

double refresh_bounds_cpu(const at::Tensor& centres, const at::Tensor& radii, const at::Tensor& spheres,
                          const at::Tensor& bounds,
                          const at::Tensor& slot_of, const at::Tensor& rows, const at::Tensor& means,
                          const at::Tensor& world_scales) {
  const int64_t n = radii.numel();
  const int64_t r = rows.numel();
  const int64_t blocks = spheres.size(0);
  TORCH_CHECK(centres.dim() == 2 && centres.size(0) == 3 && centres.size(1) == n && centres.scalar_type() == at::kFloat,
              "refresh_bounds: centres must be float32 [3, N]");
  TORCH_CHECK(radii.dim() == 1 && radii.scalar_type() == at::kFloat, "refresh_bounds: radii must be float32 [N]");
  TORCH_CHECK(spheres.dim() == 3 && spheres.size(1) == 4 && spheres.size(2) == kBlockRows &&
                  spheres.scalar_type() == at::kFloat,
              "refresh_bounds: spheres must be float32 [B, 4, 64]");
  TORCH_CHECK(bounds.dim() == 2 && bounds.size(0) == kBoundRows && bounds.size(1) == blocks &&
                  bounds.scalar_type() == at::kDouble,
              "refresh_bounds: bounds must be float64 [8, B]");
  TORCH_CHECK(slot_of.numel() == n && slot_of.scalar_type() == at::kLong, "refresh_bounds: slot_of must be int64 [N]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "refresh_bounds: rows must be int64 [R]");
  for (const at::Tensor* t : {&means, &world_scales}) {
    TORCH_CHECK(t->dim() == 2 && t->size(0) == r && t->size(1) == 3 && t->scalar_type() == at::kFloat,
                "refresh_bounds: means and world_scales must be float32 [R, 3]");
  }
  for (const at::Tensor* t : {&centres, &radii, &spheres, &bounds, &slot_of, &rows, &means, &world_scales}) {
    TORCH_CHECK(t->is_cpu() && t->is_contiguous(), "refresh_bounds: every input must be a contiguous CPU tensor");
  }
  float* c = centres.data_ptr<float>();
  float* rad = radii.data_ptr<float>();
  float* s = spheres.data_ptr<float>();
  double* b = bounds.data_ptr<double>();
  const int64_t* slots = slot_of.data_ptr<int64_t>();
  const int64_t* which = rows.data_ptr<int64_t>();
  const float* mean = means.data_ptr<float>();
  const float* scale = world_scales.data_ptr<float>();
  float magnitude = 0.0f;
  // One thread, in row order: bounds of one block are grown by several rows (as torch's scatter_reduce, whose ties
  // and NaNs the order decides), and a publication writes a few thousand rows (microseconds).
  for (int64_t i = 0; i < r; ++i) {
    const int64_t row = which[i];
    TORCH_CHECK(row >= 0 && row < n, "refresh_bounds: row ", row, " out of range [0, ", n, ")");
    const float radius = three_sigma(scale + 3 * i);
    const int64_t slot = slots[row];
    const int64_t block = slot / kBlockRows, lane = slot % kBlockRows;
    float* sphere = s + block * 4 * kBlockRows + lane;
    double* column = b + block;
    for (int k = 0; k < 3; ++k) {
      const float x = mean[3 * i + k];
      c[k * n + row] = x;
      sphere[k * kBlockRows] = x;
      column[k * blocks] = grown_min(column[k * blocks], x);
      column[(3 + k) * blocks] = grown_max(column[(3 + k) * blocks], x);
      const float size = std::fabs(x);
      if (std::isfinite(size)) magnitude = std::max(magnitude, size);
    }
    rad[row] = radius;
    sphere[3 * kBlockRows] = radius;
    column[6 * blocks] = grown_max(column[6 * blocks], radius);
  }
  return magnitude;
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("refresh_bounds", &odin::refresh_bounds_cpu); }
