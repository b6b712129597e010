#pragma once

// Small types shared by host code and CUDA kernels (no absl, no protobuf).

namespace mptrain {

enum class ActivationKind { kNone, kRelu, kGelu };

}  // namespace mptrain
