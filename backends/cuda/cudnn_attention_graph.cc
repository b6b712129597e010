#include "backends/cuda/cudnn_attention_graph.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mptrain::cuda {
namespace {

namespace fe = cudnn_frontend;

fe::DataType_t FrontendType(DType dtype) {
  return dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// Head h of row (b, t) of a [B·T, width] buffer, as the [B, H, T, hs] tensor cuDNN reads:
// strides (T·width, hs, width, 1).
std::vector<int64_t> Strides(int64_t seq_len, int64_t head_size, int64_t width) {
  return {seq_len * width, head_size, width, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> Input(fe::graph::Graph& graph, const char* name,
                                                    AttentionUid uid, const AttentionShape& s,
                                                    int64_t width) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({s.batch, s.heads, s.seq_len, s.head_size})
                          .set_stride(Strides(s.seq_len, s.head_size, width)));
}

}  // namespace

std::string AttentionShape::Name() const {
  return absl::StrCat(deterministic ? "deterministic " : "", backward ? "backward" : "forward",
                      " B=", batch, " T=", seq_len, " H=", heads, " hs=", head_size,
                      dtype == DType::kF16 ? " fp16" : " bf16");
}

absl::Status FrontendStatus(fe::error_object error, const std::string& what) {
  if (error.is_good()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN attention: ", what, ": ", error.get_message()));
}

absl::StatusOr<std::shared_ptr<fe::graph::Graph>> DescribeAttention(const AttentionShape& s,
                                                                     cudnnHandle_t handle) {
  const int64_t C = s.heads * s.head_size;
  const std::vector<int64_t> dim{s.batch, s.heads, s.seq_len, s.head_size};
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(FrontendType(s.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = Input(*graph, "Q", kQ, s, 3 * C);
  auto k = Input(*graph, "K", kK, s, 3 * C);
  auto v = Input(*graph, "V", kV, s, 3 * C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_size));
  const std::vector<int64_t> stats_dim{s.batch, s.heads, s.seq_len, 1};
  const std::vector<int64_t> stats_stride{s.heads * s.seq_len, s.seq_len, 1, 1};
  if (!s.backward) {
    auto options = fe::graph::SDPA_attributes()
                       .set_name("causal_attention")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
    auto [o, stats] = graph->sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(dim).set_stride(Strides(s.seq_len, s.head_size, C));
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
  } else {
    auto o = Input(*graph, "O", kO, s, C);
    auto d_o = Input(*graph, "dO", kdO, s, C);
    auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(kStats)
                                   .set_dim(stats_dim)
                                   .set_stride(stats_stride)
                                   .set_data_type(fe::DataType_t::FLOAT));
    // Deterministic: the same gradients on every run (dQ without atomics); otherwise the
    // fused flash backward (cudnn_attention.h).
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("causal_attention_backward")
                       .set_causal_mask(true)
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(s.deterministic);
    auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, d_o, stats, options);
    const auto packed = Strides(s.seq_len, s.head_size, 3 * C);
    dq->set_output(true).set_uid(kdQ).set_dim(dim).set_stride(packed);
    dk->set_output(true).set_uid(kdK).set_dim(dim).set_stride(packed);
    dv->set_output(true).set_uid(kdV).set_dim(dim).set_stride(packed);
  }
  const std::string name = s.Name();
  if (absl::Status st = FrontendStatus(graph->validate(), name); !st.ok()) return st;
  if (absl::Status st = FrontendStatus(graph->build_operation_graph(handle), name); !st.ok()) {
    return st;
  }
  return graph;
}

double AttentionFlops(const AttentionShape& s) {
  const double products = s.backward ? 5.0 : 2.0;
  return products * 2.0 * s.batch * s.heads * double(s.seq_len) * s.seq_len * s.head_size / 2.0;
}

}  // namespace mptrain::cuda
