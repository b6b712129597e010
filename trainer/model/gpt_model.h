#pragma once

// The GPT-2 language model (model.gpt; proto GptSpec) over the Backend's primitives, with the
// dtype flow of parity/gpt_reference.py under autocast (its module docstring): embeddings,
// LayerNorms, the residual stream and their gradients in fp32; every Linear, the attention's
// GEMMs and GELU in the compute dtype; the softmax in fp32. Forward reads like llm.c's
// gpt2_forward:
//   x = wte[idx] + wpe[pos]
//   per block: x += c_proj(attn(c_attn(ln_1(x)))); x += mlp.c_proj(gelu(c_fc(ln_2(x))))
//   logits = ln_f(x) · wte[:V]ᵀ          [B·T, V] (the LM head tied to wte, no bias)
// The padded vocabulary rows wte[V:Vp] exist (initialised like the rest) but their logits
// carry no loss: the reference excludes them from the softmax, so they get a gradient of
// exactly 0 and nothing observable depends on them. Where the loss is fused (CUDA) the head
// forms all Vp logits anyway, for GEMM shapes that are multiples of 64 (llm.c's reason to
// pad), the loss reads the first V of each row, and the padded columns of the logits'
// gradient are zeroed before the head's backward: the same gradients, bit for bit.
//
// Parameters (ParameterTable, Hugging Face GPT-2 names): wte [Vp, C] (a checkpoint holds its V
// rows), wpe [T, C], per block ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (the
// buffer holds nn.Linear's [out, in]; a checkpoint Conv1D's [in, out]), ln_f. Weight decay on
// the 2-D tensors only (nanoGPT's groups). The flat buffer starts with wte, then wpe, the
// blocks in order and ln_f, and each of those is a gradient group, so that backward finishes
// them last first (ln_f, blocks L-1..0, wpe, wte: tied, so final only after the embedding's
// backward), as the gradient reducer requires.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/gradient_accumulator.h"
#include "trainer/gradient_reducer.h"
#include "trainer/model/gpt_memory_plan.h"
#include "trainer/model/model.h"
#include "trainer/model/parameter_table.h"
#include "trainer/training_config.h"

namespace mptrain {

// The table of a GPT (names, shapes, groups, decay), without allocating anything.
ParameterTable GptParameterTable(const GptConfig& config);

// What `backend` reports for the activation plan (gpt_memory_plan.h), its compute-dtype tensors
// `low_element_bytes` wide (Tensor::element_bytes); TraitsForDevice must give the same for its
// device (the backends' tests check it).
GptBackendTraits BackendGptTraits(const Backend& backend, int64_t low_element_bytes,
                                  DType compute_dtype, int64_t micro_batch_size,
                                  const GptConfig& config);

class GptModel final : public Model {
 public:
  static constexpr float kLayerNormEps = 1e-5f;

  // Allocates the parameters, gradients and the activations of one micro-batch of
  // `micro_batch_size` sequences of config.context_length tokens. INVALID_ARGUMENT naming the
  // field for a configuration that does not describe a GPT.
  static absl::StatusOr<std::unique_ptr<GptModel>> Create(Backend* backend, const GptConfig& config,
                                                          DType compute_dtype,
                                                          int64_t micro_batch_size,
                                                          int64_t accumulation_steps);

  // ---- Model ----
  const ParameterTable& table() const override { return table_; }
  Tensor params() const override { return params_; }
  Tensor low_precision_params() const override {
    return compute_dtype_ == DType::kF32 ? Tensor{} : params_low_;
  }
  absl::Status RefreshLowPrecisionWeights() override;
  GradientAccumulator* accumulator() override { return &accumulator_; }
  Tensor buffers() const override { return Tensor{}; }
  int64_t buffer_counter() const override { return 0; }
  void RestoreProgress(int64_t, int64_t) override {}
  // GPT-2's initialisation from `seed`, drawn on the backend (Backend::FillNormal: each value
  // a function of the seed and its index, the same on every backend and rank): normal(0, 0.02)
  // embeddings and weights, the residual projections 0.02 / sqrt(2 · layers), biases 0,
  // LayerNorms 1 / 0.
  absl::Status InitializeParameters(uint64_t seed) override;
  bool BroadcastsBuffers() const override { return false; }
  bool StepIsReplayable() const override {
    return backend_->CanRecordAttention(compute_dtype_);
  }
  bool ComputesFirstWeightInRowChunks() const override { return false; }
  // x: token ids [rows, 1] f32, rows a multiple of context_length up to micro_batch_size
  // sequences (fewer only for evaluation). INVALID_ARGUMENT for an id outside [0, V).
  absl::Status Forward(Tensor x, bool x_unchanged, bool training) override;
  // [rows, V] and [B·T, V]: column views of the padded logits where the head is padded.
  Tensor output() const override { return VocabularyColumns(logits_.RowSlice(0, rows_)); }
  Tensor output_grad() const override { return VocabularyColumns(d_logits_); }
  absl::Status Backward(int64_t micro_batch, LayerGradientObserver* observer) override;

  const GptConfig& config() const { return config_; }

 private:
  // The activations one block keeps for its backward (rows N = B·T). What the backward can
  // recompute or does not read is not kept: the branches' outputs (att_proj, fc_proj) live
  // only until they are added to the residual stream, and GELU's output is recomputed from
  // fc_pre (bit for bit: the same function of the same values).
  struct Block {
    Tensor ln1_stats, ln1;  // ln_1's row statistics; ln_1(x) in the compute dtype (autocast's
                            // cast of the fp32 LayerNorm, rounded once)
    Tensor qkv;             // [N, 3C]
    Tensor attention;       // what CausalAttentionForward keeps (Backend::AttentionSavedShape)
    Tensor att;             // [N, C] attention output (heads side by side)
    Tensor mid;             // [N, C] f32: x + att_proj
    Tensor ln2_stats, ln2;
    Tensor fc_pre;   // [N, 4C] c_fc's output
    Tensor fc_gelu;  // [N, 4C] GELU(fc_pre): mlp.c_proj's input, kept for its weight gradient
    Tensor out;      // [N, C] f32: mid + fc_proj (the next block's x)
  };
  // Offsets of one block's parameters in the flat buffer.
  struct BlockOffsets {
    int64_t ln1_w, ln1_b, attn_w, attn_b, attn_proj_w, attn_proj_b, ln2_w, ln2_b, fc_w, fc_b,
        fc_proj_w, fc_proj_b;
  };

  GptModel(Backend* backend, const GptConfig& config, DType compute_dtype)
      : backend_(backend),
        config_(config),
        compute_dtype_(compute_dtype),
        table_(GptParameterTable(config)) {}
  Tensor View(Tensor flat, int64_t offset, int64_t rows, int64_t cols) const {
    return flat.FlatView(offset, rows, cols);
  }
  // The compute-dtype weights (the masters under fp32).
  Tensor Weights() const { return compute_dtype_ == DType::kF32 ? params_ : params_low_; }

  Backend* backend_;
  GptConfig config_;
  DType compute_dtype_;
  ParameterTable table_;
  int64_t batch_ = 0;  // Sequences per micro-batch.
  int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<BlockOffsets> offsets_;
  Tensor params_, params_low_;
  GradientAccumulator accumulator_;
  Tensor ids_;      // The token ids of the last Forward().
  Tensor encoded_;  // [N, C] f32 embeddings
  std::vector<Block> blocks_;
  Tensor lnf_stats_, lnf_;  // ln_f's statistics and output (compute dtype)
  // [N, LogitsColumns] compute dtype. d_logits_ is logits_ itself where the loss is fused in
  // place (Backend::HasFusedSoftmaxCrossEntropy): the logits are read once, by the loss.
  Tensor logits_, d_logits_;
  // The first V columns of a logits buffer (a strided view where the head is padded).
  Tensor VocabularyColumns(Tensor logits) const {
    return logits.cols == config_.vocab_size ? logits
                                             : logits.ColumnSlice(0, config_.vocab_size);
  }
  // Scratch shared by the blocks.
  Tensor branch_out_;            // [N, C]: attn.c_proj's or mlp.c_proj's output
  Tensor d_resid_;               // [N, C] f32: the residual stream's gradient
  Tensor d_branch_;              // [N, C]: it rounded where it enters a branch's output
  Tensor d_ln_low_;              // [N, C]: the gradient of a LayerNorm's cast output
  Tensor d_ln_in_;               // [N, C] f32: a LayerNorm's input gradient
  Tensor d_att_;                 // [N, C]
  Tensor d_qkv_;                 // [N, 3C]
  Tensor d_fc_pre_;              // [N, 4C]
  int64_t rows_ = 0;
};

}  // namespace mptrain
