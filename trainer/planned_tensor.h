#pragma once

// A tensor that a model or loss will allocate, named, with its dtype and shape: what memory
// plans list (trainer/model/gpt_memory_plan.h, CrossEntropyLoss::Scratch) so that the rank's
// allocations and the coordinator's admission estimate come from the same list.

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/backend_types.h"

namespace mptrain {

struct PlannedTensor {
  std::string name;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
};

// Device bytes of `tensors`, f16/bf16 elements at `low_element_bytes` (2 on CUDA; the CPU
// backend keeps them in 4-byte floats).
inline double PlannedBytes(const std::vector<PlannedTensor>& tensors, int64_t low_element_bytes) {
  double sum = 0;
  for (const PlannedTensor& t : tensors) {
    const double element = t.dtype == DType::kF32 ? 4.0 : static_cast<double>(low_element_bytes);
    sum += static_cast<double>(t.rows) * static_cast<double>(t.cols) * element;
  }
  return sum;
}

}  // namespace mptrain
