#pragma once

// Small types shared by host code and CUDA kernels (no absl, no protobuf).

namespace mptrain {

// kGelu: torch.nn.GELU() (erf); kGeluTanh: GELU(approximate='tanh'), GPT-2's gelu_new.
enum class ActivationKind { kNone, kRelu, kGelu, kGeluTanh };

// Element types. Host rounding to them lives in precision.h.
enum class DType { kF32, kF16, kBF16 };

// Bytes per element.
constexpr int DTypeBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

}  // namespace mptrain
