// The sphere-versus-region test of cull_conflicts, shared by the CPU (.cpp) and CUDA (.cu) implementations.
//
// Bit-exact twin of culling/candidates.py _meets: every Python-float constant is rounded to float32 once (as torch
// rounds a Python scalar operand of a float32 op), then the same float32 operations run in the same order. The
// CUDA build uses __fmul_rn / __fadd_rn (never contracted into an FMA) and the correctly rounded __fdiv_rn /
// __fsqrt_rn; the CPU build is compiled with -ffp-contract=off (IEEE division and sqrtf). The clamp returns a NaN
// operand as torch.clamp does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "odin_ops.h"

#ifdef __CUDACC__
#define ODIN_INLINE __device__ __forceinline__
#define ODIN_MUL(a, b) __fmul_rn((a), (b))
#define ODIN_ADD(a, b) __fadd_rn((a), (b))
#define ODIN_SUB(a, b) __fsub_rn((a), (b))
#define ODIN_DIV(a, b) __fdiv_rn((a), (b))
#define ODIN_SQRT(a) __fsqrt_rn(a)
#else
#define ODIN_INLINE inline
#define ODIN_MUL(a, b) ((a) * (b))
#define ODIN_ADD(a, b) ((a) + (b))
#define ODIN_SUB(a, b) ((a) - (b))
#define ODIN_DIV(a, b) ((a) / (b))
#define ODIN_SQRT(a) std::sqrt(a)
#endif

namespace odin {

// The region vector (see kRegionSize in odin_ops.h), each entry rounded to float32.
struct CullConstants {
  float r[9];
  float t[3];
  float near_plane, near_scale, left, right, top, bottom, scale_left, scale_right, scale_top, scale_bottom, lim_x,
      lim_y, slope_depth;
};

inline CullConstants cull_constants(const double* v) {
  CullConstants g;
  for (int i = 0; i < 9; ++i) g.r[i] = static_cast<float>(v[i]);
  for (int i = 0; i < 3; ++i) g.t[i] = static_cast<float>(v[9 + i]);
  float* rest = &g.near_plane;
  for (int i = 0; i < kRegionSize - 12; ++i) rest[i] = static_cast<float>(v[12 + i]);
  return g;
}

// min(|a| / z, limit) for a row at depth z >= depth (torch.clamp(max=limit) of the ratio), else the limit.
ODIN_INLINE float clamped_slope(float a, float z, float limit, float depth) {
  if (!(z >= depth)) return limit;
  const float slope = ODIN_DIV(fabsf(a), z);
  return slope > limit ? limit : slope;
}

// Whether a sphere (centre, 3-sigma radius) meets the region; false for NaN (padding lanes).
ODIN_INLINE bool sphere_meets(float cx, float cy, float cz, float r, const CullConstants& g) {
  const float x = ODIN_ADD(ODIN_ADD(ODIN_ADD(ODIN_MUL(cx, g.r[0]), ODIN_MUL(cy, g.r[1])), ODIN_MUL(cz, g.r[2])), g.t[0]);
  const float y = ODIN_ADD(ODIN_ADD(ODIN_ADD(ODIN_MUL(cx, g.r[3]), ODIN_MUL(cy, g.r[4])), ODIN_MUL(cz, g.r[5])), g.t[1]);
  const float z = ODIN_ADD(ODIN_ADD(ODIN_ADD(ODIN_MUL(cx, g.r[6]), ODIN_MUL(cy, g.r[7])), ODIN_MUL(cz, g.r[8])), g.t[2]);
  const float ax = clamped_slope(x, z, g.lim_x, g.slope_depth);
  const float ay = clamped_slope(y, z, g.lim_y, g.slope_depth);
  const float spread = ODIN_MUL(r, ODIN_SQRT(ODIN_ADD(ODIN_ADD(1.0f, ODIN_MUL(ax, ax)), ODIN_MUL(ay, ay))));
  bool inside = z >= ODIN_SUB(g.near_plane, ODIN_MUL(r, g.near_scale));
  inside &= ODIN_SUB(x, ODIN_MUL(g.left, z)) >= ODIN_MUL(-spread, g.scale_left);
  inside &= ODIN_SUB(ODIN_MUL(g.right, z), x) >= ODIN_MUL(-spread, g.scale_right);
  inside &= ODIN_SUB(y, ODIN_MUL(g.top, z)) >= ODIN_MUL(-spread, g.scale_top);
  inside &= ODIN_SUB(ODIN_MUL(g.bottom, z), y) >= ODIN_MUL(-spread, g.scale_bottom);
  return inside;
}

// Relative slack of the block test (culling/candidates.py _BLOCK_SLACK).
constexpr double kBlockSlack = 1e-5;

// The block test's [5, 8] coefficients for a region vector (culling/candidates.py block_coefficients, the same
// double operations in the same order): per plane n.p + k r >= b of the camera-space region (k: the plane's largest
// factor of any row), the box corners' min and max weights of m = R^T n [6], the radius factor and the offset with
// its slack. On the host.
inline void block_coefficients(const double* v, double magnitude, double* out) {
  const double* r = v;          // rotation, row-major
  const double* t = v + 9;      // translation
  const double near_plane = v[12], near_scale = v[13];
  const double left = v[14], right = v[15], top = v[16], bottom = v[17];
  const double lim_x = v[22], lim_y = v[23];
  const double largest = std::sqrt(1.0 + lim_x * lim_x + lim_y * lim_y);
  const double normal[kPlanes][3] = {{0.0, 0.0, 1.0}, {1.0, 0.0, -left}, {-1.0, 0.0, right}, {0.0, 1.0, -top},
                                     {0.0, -1.0, bottom}};
  const double scale[kPlanes] = {near_scale, v[18] * largest, v[19] * largest, v[20] * largest, v[21] * largest};
  const double bound[kPlanes] = {near_plane, 0.0, 0.0, 0.0, 0.0};
  double row_abs[3];
  for (int i = 0; i < 3; ++i) row_abs[i] = (std::fabs(r[3 * i]) + std::fabs(r[3 * i + 1])) + std::fabs(r[3 * i + 2]);
  for (int p = 0; p < kPlanes; ++p) {
    const double n0 = normal[p][0], n1 = normal[p][1], n2 = normal[p][2];
    double* c = out + p * kBoundRows;
    for (int j = 0; j < 3; ++j) {
      const double w = n0 * r[j] + n1 * r[3 + j] + n2 * r[6 + j];
      c[j] = std::min(w, 0.0);
      c[3 + j] = std::max(w, 0.0);
    }
    const double spread = std::fabs(n0) * row_abs[0] + std::fabs(n1) * row_abs[1] + std::fabs(n2) * row_abs[2];
    const double offset = n0 * t[0] + n1 * t[1] + n2 * t[2];
    const double reach = std::fabs(n0 * t[0]) + std::fabs(n1 * t[1]) + std::fabs(n2 * t[2]) + std::fabs(bound[p]);
    c[6] = scale[p] * (1.0 + kBlockSlack);
    c[7] = offset - bound[p] + kBlockSlack * (reach + spread * magnitude);
  }
}

// Whether block b's bounds (float64 [8, blocks], column b) may meet the region: the [5, 8] coefficients times the
// column, skipped only when no plane value is NaN and one is negative (as `~(amin(C @ bounds) < 0)`).
ODIN_INLINE bool block_may_meet(const double* coefficients, const double* bounds, int64_t blocks, int64_t b) {
  bool skip = false;
  for (int i = 0; i < 5; ++i) {
    double value = 0.0;
    for (int j = 0; j < 8; ++j) value += coefficients[i * 8 + j] * bounds[j * blocks + b];
    if (value != value) return true;
    skip |= value < 0.0;
  }
  return !skip;
}

}  // namespace odin
