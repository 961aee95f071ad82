// publish_adam on the CPU: selective Adam on a step's union rows fused with their version bump, row by row locked.
//
// Two passes. First the moments of every row (exp_avg, exp_avg_sq: only the publisher reads them, so no lock)
// and their square roots, taken with torch's own sqrt in one call (torch's CPU sqrt is MKL's, which is not always
// correctly rounded; calling it keeps the op equal to the reference bit for bit). Then each row's parameters,
// the only state readers copy, under its lock: try-acquire the sequence word (compare-exchange even -> odd; a
// failed try counts as contention and spins), a release fence so the odd word is visible before any data
// store, the row of every parameter, then a release store of the word + 2 (even again, one version later). A
// concurrent gather_rows therefore sees the old row, the new row, or reports the row locked; never a mix. Rows in
// `priority` (rows a waiting reader needs) are published before the others. use_locks = false skips the acquire
// and writes the word after the row: a debug switch with which the stress test shows torn reads. Publications
// of one model run one at a time (step order); the locks order them against readers.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/sqrt.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "adam_row.h"
#include "odin_ops.h"

namespace odin {

at::Tensor publish_adam_cpu(at::TensorList params, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                            at::TensorList grads, const at::Tensor& rows, const at::Tensor& seq,
                            const at::Tensor& hyper, const at::Tensor& priority, bool use_locks) {
  const int64_t count = static_cast<int64_t>(params.size());
  TORCH_CHECK(static_cast<int64_t>(exp_avgs.size()) == count && static_cast<int64_t>(exp_avg_sqs.size()) == count &&
                  static_cast<int64_t>(grads.size()) == count,
              "publish_adam: one exp_avg, exp_avg_sq and gradient per parameter");
  for (at::TensorList list : {params, exp_avgs, exp_avg_sqs, grads}) check_rows_tensors(list.vec(), rows, "publish_adam");
  TORCH_CHECK(seq.dim() == 1 && seq.scalar_type() == at::kLong && seq.is_contiguous(), "publish_adam: seq int64 [N]");
  TORCH_CHECK(hyper.dim() == 2 && hyper.size(0) == count && hyper.size(1) == kHyperSize &&
                  hyper.scalar_type() == at::kDouble && hyper.is_cpu() && hyper.is_contiguous(),
              "publish_adam: hyper must be CPU float64 [P, 6]");
  TORCH_CHECK(priority.dim() == 1 && priority.scalar_type() == at::kLong && priority.is_contiguous(),
              "publish_adam: priority must be sorted int64 [Q]");
  const int64_t m = rows.numel();
  const int64_t n = seq.numel();
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    TORCH_CHECK(row[i] >= 0 && row[i] < n && (i == 0 || row[i - 1] < row[i]),
                "publish_adam: rows must be sorted, unique and in [0, N)");
  }
  std::vector<float*> p;
  std::vector<const float*> mean, roots_of;
  std::vector<int64_t> width;
  std::vector<AdamConstants> constants;
  std::vector<at::Tensor> roots;
  for (int64_t k = 0; k < count; ++k) {
    TORCH_CHECK(params[k].size(0) == n && exp_avgs[k].sizes() == params[k].sizes() &&
                    exp_avg_sqs[k].sizes() == params[k].sizes() && grads[k].size(0) == m &&
                    row_width(grads[k]) == row_width(params[k]),
                "publish_adam: parameter ", k, ": moments [N, ...] like it, gradient [M, ...]");
    const int64_t w = row_width(params[k]);
    const AdamConstants c = adam_constants(hyper.data_ptr<double>() + k * kHyperSize);
    float* first = exp_avgs[k].data_ptr<float>();
    float* second = exp_avg_sqs[k].data_ptr<float>();
    const float* g = grads[k].data_ptr<float>();
    // Pass 1: the moments in place, and a copy of the new second moments [M, w] to take the roots of.
    at::Tensor root = at::empty({m, w}, params[k].options());
    float* out = root.data_ptr<float>();
    at::parallel_for(0, m, row_grain(w), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        float* mm = first + row[i] * w;
        float* vv = second + row[i] * w;
        for (int64_t d = 0; d < w; ++d) {
          mm[d] = adam_first_moment(mm[d], g[i * w + d], c);
          vv[d] = adam_second_moment(vv[d], g[i * w + d], c);
          out[i * w + d] = vv[d];
        }
      }
    });
    root.sqrt_();
    p.push_back(params[k].data_ptr<float>());
    mean.push_back(first);
    roots_of.push_back(out);
    roots.push_back(root);
    width.push_back(w);
    constants.push_back(c);
  }
  int64_t total_width = 0;
  for (int64_t w : width) total_width += w;
  const int64_t* first_priority = priority.data_ptr<int64_t>();
  const int64_t* last_priority = first_priority + priority.numel();
  int64_t* words = seq.data_ptr<int64_t>();
  std::atomic<int64_t> contention{0};

  auto publish_row = [&](int64_t i) {
    const int64_t r = row[i];
    std::atomic_ref<int64_t> word(words[r]);
    int64_t before = word.load(std::memory_order_relaxed);
    if (use_locks) {
      // try-acquire: an even word becomes odd (acquire: the row's stores stay after it); odd means another
      // publisher holds the row, so spin on it.
      while ((before & 1) || !word.compare_exchange_weak(before, before + 1, std::memory_order_acquire,
                                                         std::memory_order_relaxed)) {
        contention.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::yield();
        before = word.load(std::memory_order_relaxed);
      }
      // release fence: the odd word is ordered before every data store below (a reader whose copy overlaps
      // them then re-reads a changed word).
      std::atomic_thread_fence(std::memory_order_release);
    }
    for (int64_t k = 0; k < count; ++k) {
      const int64_t w = width[k];
      float* values = p[k] + r * w;
      const float* mm = mean[k] + r * w;
      const float* root = roots_of[k] + i * w;
      for (int64_t d = 0; d < w; ++d) values[d] = adam_param(values[d], mm[d], root[d], constants[k]);
    }
    // release: the row's stores are visible before the even word that says the row is stable again.
    word.store(before + 2, std::memory_order_release);
  };
  // Pass 2: priority rows first, then the others, each pass parallel over the rows.
  for (const bool wanted : {true, false}) {
    if (wanted && priority.numel() == 0) continue;
    at::parallel_for(0, m, row_grain(total_width), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (std::binary_search(first_priority, last_priority, row[i]) == wanted) publish_row(i);
      }
    });
  }
  return at::full({1}, contention.load(), rows.options());
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("publish_adam", &odin::publish_adam_cpu); }
