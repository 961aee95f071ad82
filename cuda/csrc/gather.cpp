// gather_rows on the CPU: copy rows into fresh tensors under per-row seqlocks, reporting rows a publication holds.
//
// The sequence word of row r (seq[r], int64) is even while the row is stable and odd while publish_adam writes it;
// each publication adds 2, so seq[r] / 2 is the row's version. A read is the classic seqlock read: load the word
// (acquire), copy the row, fence (acquire), load the word again; equal and even means the copy is one version. A
// row still odd, or changed, after kReadRetries tries is reported in `locked` and its leaf rows are zeros, never
// half of two versions. The data copies are plain loads racing with the writer's stores (as in Linux's seqlock);
// the fences order them against the sequence word on every target (x86-64, AArch64).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

#include "odin_ops.h"

namespace odin {

GatherResult gather_rows_cpu(at::TensorList params, const at::Tensor& rows, const at::Tensor& seq, bool check_locks) {
  const std::vector<at::Tensor> tensors = params.vec();
  check_rows_tensors(tensors, rows, "gather_rows");
  TORCH_CHECK(seq.dim() == 1 && seq.scalar_type() == at::kLong && seq.is_contiguous(), "gather_rows: seq int64 [N]");
  const int64_t m = rows.numel();
  const int64_t n = seq.numel();
  std::vector<at::Tensor> leaves;
  std::vector<const float*> src;
  std::vector<float*> dst;
  std::vector<int64_t> width;
  for (const at::Tensor& p : tensors) {
    TORCH_CHECK(p.size(0) == n, "gather_rows: every tensor must have seq's N rows");
    std::vector<int64_t> shape = p.sizes().vec();
    shape[0] = m;
    leaves.push_back(at::empty(shape, p.options()));
    src.push_back(p.data_ptr<float>());
    dst.push_back(leaves.back().data_ptr<float>());
    width.push_back(row_width(p));
  }
  at::Tensor versions = at::empty({m}, rows.options());
  at::Tensor locked = at::zeros({m}, rows.options().dtype(at::kBool));
  const int64_t* row = rows.data_ptr<int64_t>();
  int64_t* version = versions.data_ptr<int64_t>();
  bool* is_locked = locked.data_ptr<bool>();
  int64_t* words = seq.data_ptr<int64_t>();

  int64_t total_width = 0;
  for (int64_t w : width) total_width += w;
  at::parallel_for(0, m, row_grain(total_width), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = row[i];
      TORCH_CHECK(r >= 0 && r < n, "gather_rows: row ", r, " out of range [0, ", n, ")");
      std::atomic_ref<int64_t> word(words[r]);
      auto copy = [&] {
        for (size_t p = 0; p < src.size(); ++p) {
          copy_row(dst[p] + i * width[p], src[p] + r * width[p], width[p]);
        }
      };
      if (!check_locks) {
        version[i] = word.load(std::memory_order_relaxed) >> 1;
        copy();
        continue;
      }
      bool consistent = false;
      int64_t before = 0;
      for (int attempt = 0; attempt < kReadRetries && !consistent; ++attempt) {
        // acquire: the copy below cannot be hoisted above this load, so it sees at least this version's stores.
        before = word.load(std::memory_order_acquire);
        if (before & 1) continue;  // a publication holds the row now
        copy();
        // acquire fence: the copy's loads complete before the re-load of the word; a writer that started meanwhile
        // made the word odd before its first data store (its release fence), so the re-load sees it changed.
        std::atomic_thread_fence(std::memory_order_acquire);
        consistent = word.load(std::memory_order_relaxed) == before;
      }
      version[i] = before >> 1;
      if (!consistent) {
        is_locked[i] = true;
        for (size_t p = 0; p < src.size(); ++p) std::memset(dst[p] + i * width[p], 0, width[p] * sizeof(float));
      }
    }
  });
  return {leaves, versions, locked};
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) { m.impl("gather_rows", &odin::gather_rows_cpu); }
