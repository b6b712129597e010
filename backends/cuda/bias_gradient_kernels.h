#pragma once

// A Linear's bias gradient on the GPU: the column sums of its output gradient dy [rows, cols]
// (fp16/bf16, rows ld apart), in fp32, rounded to dy's dtype as autocast's GEMM would leave
// them, then added to (or written over) the fp32 gradient, or stored in dy's dtype. One pass
// over dy, where a GEMM against a ones vector ran cuBLAS's split-K and a reduction kernel.
// Deterministic: each block sums a fixed chunk of rows, the chunks are then added in order.

#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/backend_types.h"

namespace mptrain::cuda {

// The fp32 scratch BiasGradient needs for dy of `rows` x `cols`.
int64_t BiasGradientPartialsBytes(int64_t rows, int64_t cols);

// Whether BiasGradient takes dy as given (16-byte aligned rows, cols % 8 == 0, fp16/bf16).
bool BiasGradientSupports(const void* dy, DType dtype, int64_t cols, int64_t ld);

// out_f32 (when not null): out_f32[c] = (overwrite ? 0 : out_f32[c]) + f32(round(Σ_r dy[r, c]));
// else out_low[c] = round(Σ_r dy[r, c]) in dy's dtype. `partials` holds
// BiasGradientPartialsBytes(rows, cols) bytes.
cudaError_t BiasGradient(const void* dy, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                         float* partials, float* out_f32, void* out_low, bool overwrite,
                         cudaStream_t stream);

}  // namespace mptrain::cuda
