#include "trainer/model/gpt_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "trainer/model/gpt_memory_plan.h"

namespace mptrain {
namespace {

constexpr double kInitStd = 0.02;

std::string BlockName(int64_t layer, const char* rest) {
  return absl::StrCat("transformer.h.", layer, ".", rest);
}

// A weight matrix: nn.Linear's [out, in] in the buffer, Conv1D's [in, out] in a checkpoint.
void AddLinear(ParameterTable* table, const std::string& name, int64_t in, int64_t out) {
  ParameterSpec weight;
  weight.name = name + ".weight";
  weight.shape = {out, in};
  weight.transposed_in_checkpoint = true;
  table->Add(std::move(weight));
  table->Add(name + ".bias", {out}, /*weight_decay=*/false);
}

void AddLayerNorm(ParameterTable* table, const std::string& name, int64_t width) {
  table->Add(name + ".weight", {width}, /*weight_decay=*/false);
  table->Add(name + ".bias", {width}, /*weight_decay=*/false);
}

absl::Status CheckConfig(const GptConfig& config) {
  auto positive = [](int64_t v) { return v > 0; };
  if (!positive(config.vocab_size))
    return absl::InvalidArgumentError("model.gpt.vocab_size must be positive");
  if (config.padded_vocab_size < config.vocab_size) {
    return absl::InvalidArgumentError("model.gpt.padded_vocab_size is below vocab_size");
  }
  if (!positive(config.context_length) || !positive(config.layers) || !positive(config.heads) ||
      !positive(config.width)) {
    return absl::InvalidArgumentError(
        "model.gpt: context_length, layers, heads and width must be positive");
  }
  if (config.width % config.heads != 0) {
    return absl::InvalidArgumentError("model.gpt.width must be a multiple of model.gpt.heads");
  }
  return absl::OkStatus();
}

// A plan's tensors allocated, handed out by name; AllTaken() says whether one was left over
// (the plan lists a tensor the model does not use: the estimate would count it for nothing).
class PlannedTensors {
 public:
  static absl::StatusOr<PlannedTensors> Allocate(Backend* backend,
                                                  const std::vector<PlannedTensor>& plan) {
    PlannedTensors tensors;
    for (const PlannedTensor& p : plan) {
      ASSIGN_OR_RETURN(Tensor t, backend->Allocate(p.dtype, p.rows, p.cols));
      tensors.tensors_.emplace(p.name, t);
    }
    return tensors;
  }
  // An empty tensor for a name the plan does not have (AllTaken() then fails).
  Tensor Take(const std::string& name) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      missing_.push_back(name);
      return Tensor{};
    }
    Tensor t = it->second;
    tensors_.erase(it);
    return t;
  }
  absl::Status AllTaken() const {
    if (missing_.empty() && tensors_.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(
        "GptModel: the activation plan and the model disagree (missing: ",
        absl::StrJoin(missing_, ", "), "; unused: ", tensors_.size(), ")"));
  }

 private:
  std::map<std::string, Tensor> tensors_;
  std::vector<std::string> missing_;
};

}  // namespace

ParameterTable GptParameterTable(const GptConfig& config) {
  const int64_t C = config.width;
  ParameterTable table;
  ParameterSpec wte;
  wte.name = "transformer.wte.weight";
  wte.shape = {std::max(config.padded_vocab_size, config.vocab_size), C};
  wte.checkpoint_rows = config.vocab_size;
  table.Add(std::move(wte));
  table.EndGroup();
  table.Add("transformer.wpe.weight", {config.context_length, C});
  table.EndGroup();
  for (int64_t l = 0; l < config.layers; ++l) {
    AddLayerNorm(&table, BlockName(l, "ln_1"), C);
    AddLinear(&table, BlockName(l, "attn.c_attn"), C, 3 * C);
    AddLinear(&table, BlockName(l, "attn.c_proj"), C, C);
    AddLayerNorm(&table, BlockName(l, "ln_2"), C);
    AddLinear(&table, BlockName(l, "mlp.c_fc"), C, 4 * C);
    AddLinear(&table, BlockName(l, "mlp.c_proj"), 4 * C, C);
    table.EndGroup();
  }
  AddLayerNorm(&table, "transformer.ln_f", C);
  table.EndGroup();
  return table;
}

GptBackendTraits BackendGptTraits(const Backend& backend, int64_t low_element_bytes,
                                  DType compute_dtype, int64_t micro_batch_size,
                                  const GptConfig& config) {
  GptBackendTraits traits;
  traits.low_element_bytes = low_element_bytes;
  std::tie(traits.attention_saved_rows, traits.attention_saved_cols) = backend.AttentionSavedShape(
      compute_dtype, micro_batch_size, config.heads, config.context_length);
  traits.fused_loss = backend.HasFusedSoftmaxCrossEntropy();
  return traits;
}

absl::StatusOr<std::unique_ptr<GptModel>> GptModel::Create(Backend* backend,
                                                           const GptConfig& config,
                                                           DType compute_dtype,
                                                           int64_t micro_batch_size,
                                                           int64_t accumulation_steps) {
  RETURN_IF_ERROR(CheckConfig(config));
  if (micro_batch_size < 1) return absl::InvalidArgumentError("micro_batch_size must be positive");
  GptConfig padded = config;
  if (padded.padded_vocab_size == 0) padded.padded_vocab_size = padded.vocab_size;
  std::unique_ptr<GptModel> model(new GptModel(backend, padded, compute_dtype));
  const ParameterTable& table = model->table_;
  auto offset = [&](const std::string& name) { return table.Find(name)->offset; };
  model->batch_ = micro_batch_size;
  model->wte_ = offset("transformer.wte.weight");
  model->wpe_ = offset("transformer.wpe.weight");
  model->lnf_w_ = offset("transformer.ln_f.weight");
  model->lnf_b_ = offset("transformer.ln_f.bias");
  for (int64_t l = 0; l < config.layers; ++l) {
    auto at = [&](const char* rest) { return offset(BlockName(l, rest)); };
    model->offsets_.push_back({at("ln_1.weight"), at("ln_1.bias"), at("attn.c_attn.weight"),
                               at("attn.c_attn.bias"), at("attn.c_proj.weight"),
                               at("attn.c_proj.bias"), at("ln_2.weight"), at("ln_2.bias"),
                               at("mlp.c_fc.weight"), at("mlp.c_fc.bias"), at("mlp.c_proj.weight"),
                               at("mlp.c_proj.bias")});
  }
  const int64_t n = table.total();
  ASSIGN_OR_RETURN(model->params_, backend->Allocate(DType::kF32, 1, n));
  ASSIGN_OR_RETURN(model->params_low_, backend->Allocate(compute_dtype, 1, n));
  // LayerNorms' and the embeddings' gradients are fp32: every micro-batch adds into the fp32
  // gradients (no deferred low-precision rows).
  ASSIGN_OR_RETURN(
      model->accumulator_,
      GradientAccumulator::Create(backend, n, compute_dtype, model->params_low_.element_bytes,
                                  accumulation_steps, /*deferred_budget_bytes=*/0));
  // Every activation from the one plan the coordinator's estimate also reads.
  const GptBackendTraits traits = BackendGptTraits(
      *backend, model->params_low_.element_bytes, compute_dtype, micro_batch_size, config);
  const GptActivationPlan plan =
      PlanGptActivations(padded, compute_dtype, micro_batch_size, traits);
  ASSIGN_OR_RETURN(PlannedTensors shared, PlannedTensors::Allocate(backend, plan.shared));
  for (int64_t l = 0; l < config.layers; ++l) {
    ASSIGN_OR_RETURN(PlannedTensors t, PlannedTensors::Allocate(backend, plan.per_block));
    Block b;
    b.ln1_stats = t.Take("ln1_stats");
    b.ln1 = t.Take("ln1");
    b.qkv = t.Take("qkv");
    b.attention = t.Take("attention");
    b.att = t.Take("att");
    b.mid = t.Take("mid");
    b.ln2_stats = t.Take("ln2_stats");
    b.ln2 = t.Take("ln2");
    b.fc_pre = t.Take("fc_pre");
    b.fc_gelu = t.Take("fc_gelu");
    b.out = t.Take("out");
    RETURN_IF_ERROR(t.AllTaken());
    model->blocks_.push_back(b);
  }
  model->encoded_ = shared.Take("encoded");
  model->lnf_stats_ = shared.Take("lnf_stats");
  model->lnf_ = shared.Take("lnf");
  model->logits_ = shared.Take("logits");
  model->d_logits_ = traits.fused_loss ? model->logits_ : shared.Take("d_logits");
  model->branch_out_ = shared.Take("branch_out");
  model->d_resid_ = shared.Take("d_resid");
  model->d_branch_ = shared.Take("d_branch");
  model->d_ln_low_ = shared.Take("d_ln_low");
  model->d_ln_in_ = shared.Take("d_ln_in");
  model->d_att_ = shared.Take("d_att");
  model->d_qkv_ = shared.Take("d_qkv");
  model->d_fc_pre_ = shared.Take("d_fc_pre");
  RETURN_IF_ERROR(shared.AllTaken());
  return model;
}

absl::Status GptModel::InitializeParameters(uint64_t seed) {
  // Biases 0 and LayerNorms' bias 0 from the zeroed buffer; LayerNorms' weight 1 uploaded (a
  // few KB each); every 2-D tensor drawn where it lives, each value from its index in the flat
  // buffer (normal_draws.h), so no two tensors share draws.
  RETURN_IF_ERROR(backend_->Zero(params_));
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.layers));
  for (const ParameterSpec& spec : table_.parameters()) {
    const std::string& name = spec.name;
    const Tensor values = View(params_, spec.offset, 1, spec.numel);
    if (name.find(".ln_") != std::string::npos) {
      if (absl::EndsWith(name, ".weight")) {
        const std::vector<float> ones(static_cast<size_t>(spec.numel), 1.0f);
        RETURN_IF_ERROR(backend_->Upload(ones.data(), values));
      }
    } else if (spec.shape.size() == 2) {
      const bool residual = absl::StrContains(name, "c_proj.weight");
      RETURN_IF_ERROR(
          backend_->FillNormal(values, seed, spec.offset, residual ? residual_std : kInitStd));
    }
  }
  return absl::OkStatus();
}

absl::Status GptModel::RefreshLowPrecisionWeights() {
  if (compute_dtype_ == DType::kF32) return absl::OkStatus();
  return backend_->Cast(params_, params_low_);
}

absl::Status GptModel::Forward(Tensor x, bool /*x_unchanged*/, bool /*training*/) {
  const int64_t T = config_.context_length, C = config_.width, H = config_.heads;
  const int64_t V = config_.vocab_size;
  const int64_t rows = x.rows;
  if (x.cols != 1 || rows < T || rows % T != 0 || rows > batch_ * T) {
    return absl::InvalidArgumentError(absl::StrCat("GptModel::Forward: the token ids must be [k * ",
                                                   T, ", 1] for k in 1..", batch_));
  }
  rows_ = rows;
  ids_ = x;
  const int64_t sequences = rows / T;
  const Tensor w = Weights();
  auto slice = [rows](Tensor t) { return t.RowSlice(0, rows); };
  // wte's first V rows only: an id in [V, Vp) is refused as any other outside the vocabulary.
  RETURN_IF_ERROR(backend_->EmbeddingForward(x, View(params_, wte_, V, C),
                                             View(params_, wpe_, T, C), T, slice(encoded_)));
  Tensor residual = slice(encoded_);
  // A LayerNorm in fp32 written straight in the compute dtype: autocast's cast of its fp32
  // output before the next Linear, one rounding of the same value. Each residual add is fused
  // with the LayerNorm after it (Backend::AddLayerNormForward): block l's ln_1 is computed by
  // block l - 1's last add, ln_f by the last block's.
  RETURN_IF_ERROR(backend_->LayerNormForward(
      residual, View(params_, offsets_[0].ln1_w, 1, C), View(params_, offsets_[0].ln1_b, 1, C),
      kLayerNormEps, slice(blocks_[0].ln1_stats), slice(blocks_[0].ln1)));
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    const BlockOffsets& o = offsets_[l];
    RETURN_IF_ERROR(backend_->LinearForward(slice(b.ln1), View(w, o.attn_w, 3 * C, C),
                                            View(w, o.attn_b, 1, 3 * C), ActivationKind::kNone,
                                            slice(b.qkv), slice(b.qkv)));
    const auto [saved_rows, saved_cols] =
        backend_->AttentionSavedShape(compute_dtype_, sequences, H, T);
    RETURN_IF_ERROR(backend_->CausalAttentionForward(
        slice(b.qkv), sequences, H, b.attention.FlatView(0, saved_rows, saved_cols),
        slice(b.att)));
    RETURN_IF_ERROR(backend_->LinearForward(slice(b.att), View(w, o.attn_proj_w, C, C),
                                            View(w, o.attn_proj_b, 1, C), ActivationKind::kNone,
                                            slice(branch_out_), slice(branch_out_)));
    // mid = residual + branch, and ln_2(mid), in one pass where the backend fuses them.
    RETURN_IF_ERROR(backend_->AddLayerNormForward(
        residual, slice(branch_out_), slice(b.mid), View(params_, o.ln2_w, 1, C),
        View(params_, o.ln2_b, 1, C), kLayerNormEps, slice(b.ln2_stats), slice(b.ln2)));
    RETURN_IF_ERROR(backend_->LinearForward(slice(b.ln2), View(w, o.fc_w, 4 * C, C),
                                            View(w, o.fc_b, 1, 4 * C), ActivationKind::kGeluTanh,
                                            slice(b.fc_pre), slice(b.fc_gelu)));
    RETURN_IF_ERROR(backend_->LinearForward(slice(b.fc_gelu), View(w, o.fc_proj_w, C, 4 * C),
                                            View(w, o.fc_proj_b, 1, C), ActivationKind::kNone,
                                            slice(branch_out_), slice(branch_out_)));
    // out = mid + branch, and the next LayerNorm: the next block's ln_1, or ln_f.
    const bool last = l + 1 == blocks_.size();
    const Tensor next_w = last ? View(params_, lnf_w_, 1, C)
                               : View(params_, offsets_[l + 1].ln1_w, 1, C);
    const Tensor next_b = last ? View(params_, lnf_b_, 1, C)
                               : View(params_, offsets_[l + 1].ln1_b, 1, C);
    RETURN_IF_ERROR(backend_->AddLayerNormForward(
        slice(b.mid), slice(branch_out_), slice(b.out), next_w, next_b, kLayerNormEps,
        slice(last ? lnf_stats_ : blocks_[l + 1].ln1_stats),
        slice(last ? lnf_ : blocks_[l + 1].ln1)));
    residual = slice(b.out);
  }
  // The LM head over the first V rows of wte, or all Vp of them where the buffer is padded
  // (module comment).
  const int64_t head_rows = logits_.cols;
  return backend_->LinearForward(slice(lnf_), View(w, wte_, head_rows, C), Tensor{},
                                 ActivationKind::kNone, slice(logits_), slice(logits_));
}

absl::Status GptModel::Backward(int64_t micro_batch, LayerGradientObserver* observer) {
  const int64_t T = config_.context_length, C = config_.width, H = config_.heads;
  const int64_t V = config_.vocab_size, Vp = config_.padded_vocab_size;
  if (rows_ != batch_ * T) {
    return absl::FailedPreconditionError(
        "GptModel::Backward needs a forward pass of a whole batch");
  }
  const bool last = micro_batch + 1 == accumulator_.accumulation_steps();
  if (!last) observer = nullptr;
  const GradientAccumulator::Target target = accumulator_.For(micro_batch);
  const Tensor g = target.flat;
  const bool ow = target.overwrite;
  const Tensor w = Weights();
  const size_t groups = table_.groups().size();  // wte, wpe, blocks, ln_f
  auto ready = [&](size_t group) {
    return observer == nullptr ? absl::OkStatus() : observer->LayerReady(group);
  };
  // The LM head: d x_f = round(d_logits · wte), d wte[:V] += round(d_logitsᵀ · ln_f(x)). A
  // padded head's extra columns get a gradient of 0 (the loss never saw them): their rows of
  // wte get exactly 0 from the GEMM, as the unpadded head's explicit zero gives them.
  const int64_t head_rows = d_logits_.cols;
  if (head_rows > V) {
    RETURN_IF_ERROR(backend_->Zero(d_logits_.ColumnSlice(V, head_rows - V)));
  } else if (ow && Vp > V) {
    RETURN_IF_ERROR(backend_->Zero(View(g, wte_ + V * C, Vp - V, C)));
  }
  RETURN_IF_ERROR(backend_->LinearBackward(lnf_, View(w, wte_, head_rows, C), d_logits_,
                                           d_ln_low_, View(g, wte_, head_rows, C), Tensor{}, ow));
  const Tensor last_out = blocks_.back().out;
  RETURN_IF_ERROR(backend_->LayerNormBackward(d_ln_low_, last_out, lnf_stats_,
                                              View(params_, lnf_w_, 1, C), d_resid_,
                                              View(g, lnf_w_, 1, C), View(g, lnf_b_, 1, C), ow));
  RETURN_IF_ERROR(ready(groups - 1));
  for (size_t l = blocks_.size(); l-- > 0;) {
    const Block& b = blocks_[l];
    const BlockOffsets& o = offsets_[l];
    const Tensor block_in = l == 0 ? encoded_ : blocks_[l - 1].out;
    // The MLP branch: its output's gradient is the residual's, rounded to the compute dtype
    // (below the last block, by the block above's ln_1 backward, which also summed it into
    // this c_proj's bias gradient).
    const bool top = l + 1 == blocks_.size();
    if (top) RETURN_IF_ERROR(backend_->Cast(d_resid_, d_branch_));
    // GELU's output gradient, where the backend composes the two calls, goes through d_fc_pre
    // in place.
    RETURN_IF_ERROR(backend_->LinearBackwardThroughActivation(
        b.fc_gelu, View(w, o.fc_proj_w, C, 4 * C), d_branch_, ActivationKind::kGeluTanh, b.fc_pre,
        d_fc_pre_, d_fc_pre_, View(g, o.fc_proj_w, C, 4 * C),
        top ? View(g, o.fc_proj_b, 1, C) : Tensor{}, ow));
    RETURN_IF_ERROR(backend_->LinearBackward(b.ln2, View(w, o.fc_w, 4 * C, C), d_fc_pre_,
                                             d_ln_low_, View(g, o.fc_w, 4 * C, C),
                                             View(g, o.fc_b, 1, 4 * C), ow));
    // ln_2's input gradient added into the residual's, which the attention branch then takes
    // rounded to the compute dtype, and that copy's column sums, attn.c_proj's bias gradient
    // (Backend::LayerNormBackwardIntoResidual: one pass).
    RETURN_IF_ERROR(backend_->LayerNormBackwardIntoResidual(
        d_ln_low_, b.mid, b.ln2_stats, View(params_, o.ln2_w, 1, C), d_ln_in_, d_resid_,
        d_branch_, View(g, o.ln2_w, 1, C), View(g, o.ln2_b, 1, C), View(g, o.attn_proj_b, 1, C),
        ow));
    // The attention branch.
    RETURN_IF_ERROR(backend_->LinearBackward(b.att, View(w, o.attn_proj_w, C, C), d_branch_, d_att_,
                                             View(g, o.attn_proj_w, C, C), Tensor{}, ow));
    RETURN_IF_ERROR(
        backend_->CausalAttentionBackward(b.qkv, b.attention, b.att, d_att_, batch_, H, d_qkv_));
    RETURN_IF_ERROR(backend_->LinearBackward(b.ln1, View(w, o.attn_w, 3 * C, C), d_qkv_,
                                             d_ln_low_, View(g, o.attn_w, 3 * C, C),
                                             View(g, o.attn_b, 1, 3 * C), ow));
    // ln_1's likewise; the copy in the compute dtype is the MLP branch's of the block below, and
    // its column sums that block's mlp.c_proj bias gradient.
    RETURN_IF_ERROR(backend_->LayerNormBackwardIntoResidual(
        d_ln_low_, block_in, b.ln1_stats, View(params_, o.ln1_w, 1, C), d_ln_in_, d_resid_,
        l > 0 ? d_branch_ : Tensor{}, View(g, o.ln1_w, 1, C), View(g, o.ln1_b, 1, C),
        l > 0 ? View(g, offsets_[l - 1].fc_proj_b, 1, C) : Tensor{}, ow));
    RETURN_IF_ERROR(ready(2 + l));
  }
  // The embeddings: wte adds to the LM head's gradient (tied); wpe is written on the first
  // micro-batch.
  RETURN_IF_ERROR(backend_->EmbeddingBackward(ids_, d_resid_, T, View(g, wte_, V, C),
                                              View(g, wpe_, T, C), /*overwrite_wte=*/false, ow));
  RETURN_IF_ERROR(ready(1));
  RETURN_IF_ERROR(ready(0));
  if (last && observer == nullptr) {
    return accumulator_.Finalize(0, table_.total() + GradientAccumulator::kMetricSlots);
  }
  return absl::OkStatus();
}

}  // namespace mptrain
