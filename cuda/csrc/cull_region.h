// The sphere-versus-region test of cull_conflicts, shared by the CPU (.cpp) and CUDA (.cu) implementations.
//
// Bit-exact twin of culling/candidates.py _meets: every Python-float constant is rounded to float32 once (as torch
// rounds a Python scalar operand of a float32 op), then the same float32 operations run in the same order. The
// CUDA build uses __fmul_rn / __fadd_rn (never contracted into an FMA); the CPU build is compiled with
// -ffp-contract=off.
#pragma once

#include <cmath>
#include <cstdint>

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
