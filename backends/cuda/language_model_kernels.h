#pragma once

// Host launchers of the language model's kernels (language_model_kernels.cu): the residual add,
// the embeddings and the fp32 causal attention (fp16/bf16 attention is cuDNN's:
// cudnn_attention.h; the fused softmax cross-entropy: cross_entropy_kernels.h). Conventions as
// kernels.h: raw device pointers, element counts as int64_t, the stream last, the launch's
// cudaError_t returned.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "trainer/backend_types.h"
#include "trainer/step_math.h"

namespace mptrain::cuda {

// out = round_out(f32(a) + f32(b)), n elements; out may alias a or b.
cudaError_t AddMixed(const void* a, DType a_dtype, const void* b, DType b_dtype, void* out,
                     DType out_dtype, int64_t n, cudaStream_t stream);

// out[r, c] = wte[ids[r], c] + wpe[r mod seq_len, c], f32 [rows, cols]. An id outside
// [0, vocab_rows) (the token loader refuses those before they reach the device) makes its row
// NaN rather than read outside wte: the step's overflow check then skips it, visibly.
cudaError_t EmbeddingForward(const float* ids, const float* wte, int64_t vocab_rows,
                             const float* wpe, int64_t seq_len, int64_t rows, int64_t cols,
                             float* out, cudaStream_t stream);

// The scratch of the deterministic token-embedding backward: the ids sorted with their rows
// (cub's stable radix sort), so that each wte row adds its gradients in row order, as the CPU
// reference does, with no atomics.
struct EmbeddingSortScratch {
  int* keys_in = nullptr;
  int* keys_out = nullptr;
  int* rows_in = nullptr;
  int* rows_out = nullptr;
  void* sort_temp = nullptr;
  size_t sort_temp_bytes = 0;
};
// Bytes of cub temporary storage SortPairs needs for `rows` pairs.
cudaError_t EmbeddingSortTempBytes(int64_t rows, size_t* bytes);
// dwte[ids[r]] += dout[r] in row order (dwte zeroed first with overwrite_wte; out-of-range ids
// are dropped); dwpe[t] (+)= Σ_b dout[b·T + t] in b order. All f32.
cudaError_t EmbeddingBackward(const float* ids, const float* dout, int64_t seq_len, int64_t rows,
                              int64_t cols, float* dwte, int64_t vocab_rows, float* dwpe,
                              bool overwrite_wte, bool overwrite_wpe,
                              const EmbeddingSortScratch& scratch, cudaStream_t stream);

// The fp32 causal attention with the softmax probabilities kept: probs [B·H·T, T] f32 (0 above
// the diagonal). qkv [B·T, 3C], y [B·T, C], all f32; hs = C / heads. One block per query row;
// T <= kMaxFp32AttentionSeq (its scores live in shared memory).
inline constexpr int64_t kMaxFp32AttentionSeq = 8192;
cudaError_t CausalAttentionForwardF32(const float* qkv, int64_t batch, int64_t seq_len,
                                      int64_t heads, int64_t head_size, float* probs, float* y,
                                      cudaStream_t stream);
// Its backward into dqkv [B·T, 3C] f32; probs is overwritten with the scores' gradient.
cudaError_t CausalAttentionBackwardF32(const float* qkv, float* probs, const float* dy,
                                       int64_t batch, int64_t seq_len, int64_t heads,
                                       int64_t head_size, float* dqkv, cudaStream_t stream);

}  // namespace mptrain::cuda
