// Row sets on the CPU: union_rows, the sorted union of sorted row sets (a step's pending writes, the predicted ones;
// also scatter_in_order's union), and the per-primitive tables' pending-write marks (declare_rows, settle_rows).
//
// union_rows equals core/conflicts.py union_sorted (a set: exact), merging the sorted parts one at a time instead of
// sorting their concatenation; declare_rows and settle_rows equal core/tables.py's declare and settle (integer
// marks, exact).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <iterator>
#include <vector>

#include "odin_ops.h"

namespace odin {

std::vector<int64_t> sorted_union(at::TensorList parts) {
  int64_t total = 0;
  for (const at::Tensor& part : parts) total += part.numel();
  std::vector<int64_t> merged, buffer;
  merged.reserve(total);
  buffer.reserve(total);
  for (const at::Tensor& part : parts) {
    const int64_t* begin = part.data_ptr<int64_t>();
    buffer.clear();
    std::merge(merged.begin(), merged.end(), begin, begin + part.numel(), std::back_inserter(buffer));
    buffer.erase(std::unique(buffer.begin(), buffer.end()), buffer.end());
    merged.swap(buffer);
  }
  return merged;
}

at::Tensor union_rows_cpu(at::TensorList parts) {
  TORCH_CHECK(!parts.empty(), "union_rows: at least one part");
  for (const at::Tensor& part : parts) {
    TORCH_CHECK(part.dim() == 1 && part.scalar_type() == at::kLong && part.is_cpu() && part.is_contiguous(),
                "union_rows: every part must be contiguous sorted unique CPU int64 [R]");
  }
  const std::vector<int64_t> merged = sorted_union(parts);
  at::Tensor rows = at::empty({static_cast<int64_t>(merged.size())}, parts[0].options());
  std::copy(merged.begin(), merged.end(), rows.data_ptr<int64_t>());
  return rows;
}

namespace {

void check_marks(const at::Tensor& table, const at::Tensor& rows, const char* what) {
  TORCH_CHECK(table.dim() == 1 && table.scalar_type() == at::kLong && table.is_cpu() && table.is_contiguous(), what,
              ": the table must be contiguous CPU int64 [N]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_cpu() && rows.is_contiguous(), what,
              ": rows must be contiguous CPU int64 [M]");
  const int64_t n = table.numel();
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i) {
    TORCH_CHECK(row[i] >= 0 && row[i] < n, what, ": row ", row[i], " out of range [0, ", n, ")");
  }
}

}  // namespace

void declare_rows_cpu(const at::Tensor& pending_step, const at::Tensor& rows, int64_t step) {
  check_marks(pending_step, rows, "declare_rows");
  int64_t* pending = pending_step.data_ptr<int64_t>();
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i) pending[row[i]] = std::max(pending[row[i]], step);
}

void settle_rows_cpu(const at::Tensor& published_step, const at::Tensor& pending_step, const at::Tensor& rows,
                     at::TensorList declared, int64_t step) {
  check_marks(published_step, rows, "settle_rows");
  TORCH_CHECK(pending_step.numel() == published_step.numel(), "settle_rows: both tables have N rows");
  int64_t* published = published_step.data_ptr<int64_t>();
  int64_t* pending = pending_step.data_ptr<int64_t>();
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i) published[row[i]] = step;
  for (const at::Tensor& part : declared) {
    check_marks(pending_step, part, "settle_rows");
    const int64_t* cleared = part.data_ptr<int64_t>();
    for (int64_t i = 0; i < part.numel(); ++i) {
      if (pending[cleared[i]] <= step) pending[cleared[i]] = kNoStep;
    }
  }
}

}  // namespace odin

TORCH_LIBRARY_IMPL(odin, CPU, m) {
  m.impl("union_rows", &odin::union_rows_cpu);
  m.impl("declare_rows", &odin::declare_rows_cpu);
  m.impl("settle_rows", &odin::settle_rows_cpu);
}
