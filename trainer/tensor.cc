#include "trainer/backend.h"

namespace mptrain {

Tensor Tensor::RowSlice(int64_t first, int64_t count) const {
  Tensor view = *this;
  view.data = static_cast<char*>(data) + first * ld() * element_bytes;
  view.rows = count;
  return view;
}

Tensor Tensor::FlatView(int64_t offset, int64_t view_rows, int64_t view_cols) const {
  Tensor view = *this;
  view.data = static_cast<char*>(data) + offset * element_bytes;
  view.rows = view_rows;
  view.cols = view_cols;
  view.row_stride = 0;
  return view;
}

Tensor Tensor::ColumnSlice(int64_t first, int64_t count) const {
  Tensor view = *this;
  view.data = static_cast<char*>(data) + first * element_bytes;
  view.row_stride = ld();
  view.cols = count;
  return view;
}

}  // namespace mptrain
