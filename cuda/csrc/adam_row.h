// Selective Adam per element, shared by publish_adam's CPU (.cpp) and CUDA (.cu) implementations.
//
// core/selective_adam.py step_rows runs torch's single-tensor Adam ops on gathered rows; the arithmetic below is
// what those ops compute per element on each backend (measured on the CPU against torch's kernels), every Python
// float rounded to float32 once (torch's opmath for float32):
//   exp_avg.lerp_(g, 1 - beta1)                 fma(w, g - m, m)  (w >= 0.5: fma(w - 1, g - m, g))
//   exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)   fma(w2 g, g, v b2)
//   exp_avg_sq.sqrt()                           CPU: torch's own sqrt (MKL's, not always correctly rounded: the
//                                               CPU op calls at::sqrt_ on the new moments); CUDA: sqrtf
//   .div_(sqrt(bc2)).add_(eps)                  CPU: r / c + eps; CUDA: r (1 / c) + eps (torch's CUDA divides
//                                               by a CPU scalar through its reciprocal)
//   param.addcdiv_(exp_avg, denom, -step_size)  CPU: p + (s m) / denom; CUDA: fma(s, m / denom, p)
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define ODIN_ADAM_INLINE __device__ __forceinline__
#else
#define ODIN_ADAM_INLINE inline
#endif

namespace odin {

struct AdamConstants {
  float one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
};

inline AdamConstants adam_constants(const double* hyper) {
  return {static_cast<float>(hyper[0]), static_cast<float>(hyper[1]), static_cast<float>(hyper[2]),
          static_cast<float>(hyper[3]), static_cast<float>(hyper[4]), static_cast<float>(hyper[5])};
}

// The first moment after torch's lerp_ (its vectorized form: one fused multiply-add).
ODIN_ADAM_INLINE float adam_first_moment(float m, float g, const AdamConstants& c) {
  const bool small = fabsf(c.one_minus_beta1) < 0.5f;
#ifdef __CUDACC__
  // torch's CUDA lerp: self + w (end - self), or end - (end - self)(1 - w), contracted into one FMA by nvcc.
  return small ? __fmaf_rn(c.one_minus_beta1, __fsub_rn(g, m), m)
               : __fmaf_rn(-__fsub_rn(g, m), __fsub_rn(1.0f, c.one_minus_beta1), g);
#else
  return std::fma(small ? c.one_minus_beta1 : c.one_minus_beta1 - 1.0f, g - m, small ? m : g);
#endif
}

// The second moment after mul_(beta2).addcmul_(g, g, value=1 - beta2).
ODIN_ADAM_INLINE float adam_second_moment(float v, float g, const AdamConstants& c) {
#ifdef __CUDACC__
  return __fmaf_rn(__fmul_rn(c.one_minus_beta2, g), g, __fmul_rn(v, c.beta2));
#else
  return std::fma(c.one_minus_beta2 * g, g, v * c.beta2);
#endif
}

// The parameter after addcdiv_ with denominator root / sqrt(bc2) + eps, root = sqrt of the new second moment.
ODIN_ADAM_INLINE float adam_param(float p, float m, float root, const AdamConstants& c) {
#ifdef __CUDACC__
  const float denom = __fadd_rn(__fmul_rn(root, __frcp_rn(c.bias_correction2_sqrt)), c.eps);
  return __fmaf_rn(c.neg_step_size, __fdiv_rn(m, denom), p);
#else
  const float denom = root / c.bias_correction2_sqrt + c.eps;
  return p + c.neg_step_size * m / denom;
#endif
}

}  // namespace odin
