// The sphere-versus-region test of cull_conflicts, shared by the CPU (.cpp) and CUDA (.cu) implementations.
//
// Bit-exact twin of culling/candidates.py _meets: every Python-float constant is rounded to float32 once (as torch
// rounds a Python scalar operand of a float32 op), then the same float32 operations run in the same order. The
// CUDA build uses __fmul_rn / __fadd_rn (never contracted into an FMA); the CPU build is compiled with
// -ffp-contract=off.
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
#else
#define ODIN_INLINE inline
#define ODIN_MUL(a, b) ((a) * (b))
#define ODIN_ADD(a, b) ((a) + (b))
#define ODIN_SUB(a, b) ((a) - (b))
#endif

namespace odin {

// The region vector (see kRegionSize in odin_ops.h), each entry rounded to float32.
struct CullConstants {
  float r[9];
  float t[3];
  float radius_scale, near_plane, left, right, top, bottom, norm_left, norm_right, norm_top, norm_bottom;
};

inline CullConstants cull_constants(const double* v) {
  CullConstants g;
  for (int i = 0; i < 9; ++i) g.r[i] = static_cast<float>(v[i]);
  for (int i = 0; i < 3; ++i) g.t[i] = static_cast<float>(v[9 + i]);
  float* rest = &g.radius_scale;
  for (int i = 0; i < 10; ++i) rest[i] = static_cast<float>(v[12 + i]);
  return g;
}

// Whether a sphere (centre, 3-sigma radius before radius_scale) meets the region; false for NaN (padding lanes).
ODIN_INLINE bool sphere_meets(float cx, float cy, float cz, float r, const CullConstants& g) {
  const float x = ODIN_ADD(ODIN_ADD(ODIN_ADD(ODIN_MUL(cx, g.r[0]), ODIN_MUL(cy, g.r[1])), ODIN_MUL(cz, g.r[2])), g.t[0]);
  const float y = ODIN_ADD(ODIN_ADD(ODIN_ADD(ODIN_MUL(cx, g.r[3]), ODIN_MUL(cy, g.r[4])), ODIN_MUL(cz, g.r[5])), g.t[1]);
  const float z = ODIN_ADD(ODIN_ADD(ODIN_ADD(ODIN_MUL(cx, g.r[6]), ODIN_MUL(cy, g.r[7])), ODIN_MUL(cz, g.r[8])), g.t[2]);
  const float radius = ODIN_MUL(r, g.radius_scale);
  bool inside = z >= ODIN_SUB(g.near_plane, radius);
  inside &= ODIN_SUB(x, ODIN_MUL(g.left, z)) >= ODIN_MUL(-radius, g.norm_left);
  inside &= ODIN_SUB(ODIN_MUL(g.right, z), x) >= ODIN_MUL(-radius, g.norm_right);
  inside &= ODIN_SUB(y, ODIN_MUL(g.top, z)) >= ODIN_MUL(-radius, g.norm_top);
  inside &= ODIN_SUB(ODIN_MUL(g.bottom, z), y) >= ODIN_MUL(-radius, g.norm_bottom);
  return inside;
}

// Relative slack of the block test (culling/candidates.py _BLOCK_SLACK).
constexpr double kBlockSlack = 1e-5;

// The block test's [5, 8] coefficients for a region vector (culling/candidates.py block_coefficients, the same
// double operations in the same order): per plane n.p + rho |n| >= b of the camera-space frustum, the box corners'
// min and max weights of m = R^T n [6], the radius factor and the offset with its slack. On the host.
inline void block_coefficients(const double* v, double magnitude, double* out) {
  const double* r = v;          // rotation, row-major
  const double* t = v + 9;      // translation
  const double radius_scale = v[12], near_plane = v[13];
  const double left = v[14], right = v[15], top = v[16], bottom = v[17];
  const double normal[kPlanes][3] = {{0.0, 0.0, 1.0}, {1.0, 0.0, -left}, {-1.0, 0.0, right}, {0.0, 1.0, -top},
                                     {0.0, -1.0, bottom}};
  const double norm[kPlanes] = {1.0, v[18], v[19], v[20], v[21]};
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
    c[6] = radius_scale * (1.0 + kBlockSlack) * norm[p];
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
