#pragma once

// Element types and host-side rounding to fp16/bf16 with round-to-nearest-even, as the GPU's
// conversion instructions do: values beyond the fp16 range become inf, NaN stays NaN. The CPU
// backend stores low-precision tensors as fp32 values that are exactly representable in the
// low-precision type, so BLAS can multiply them with fp32 accumulation, as tensor cores do.

#include <cstdint>
#include <cstring>

#include "trainer/backend_types.h"

namespace mptrain {

inline float RoundToF16(float value) {
  return static_cast<float>(static_cast<_Float16>(value));
}

inline float RoundToBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    bits |= 0x00400000u;  // Quiet NaN, payload kept.
  } else {
    uint32_t lsb = (bits >> 16) & 1u;
    bits += 0x7fffu + lsb;  // Round to nearest, ties to even; overflow carries into inf.
  }
  bits &= 0xffff0000u;
  float rounded;
  std::memcpy(&rounded, &bits, sizeof(rounded));
  return rounded;
}

inline float RoundTo(DType dtype, float value) {
  switch (dtype) {
    case DType::kF16: return RoundToF16(value);
    case DType::kBF16: return RoundToBF16(value);
    case DType::kF32: return value;
  }
  return value;
}

}  // namespace mptrain
