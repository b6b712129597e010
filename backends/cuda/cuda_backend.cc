#include "backends/cuda/cuda_backend.h"

#include <initializer_list>
#include <utility>

#include <chrono>
#include <cstring>
#include <thread>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "backends/cuda/bias_gradient_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/init_kernels.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/nccl_collective.h"
#include "backends/cuda/tuning_settings.h"

namespace mptrain::cuda {
namespace {

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    int device,
    const std::function<absl::StatusOr<std::unique_ptr<Collective>>(cudaStream_t)>&
        make_collective,
    int64_t wait_timeout_ms) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(device, wait_timeout_ms));
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking));
  CUBLAS_RETURN_IF_ERROR(cublasCreate(&backend->cublas_));
  CUBLAS_RETURN_IF_ERROR(cublasSetStream(backend->cublas_, backend->stream_));
  // PyTorch's default for fp32 matmuls is full fp32 (no TF32).
  CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(backend->cublas_, CUBLAS_DEFAULT_MATH));
  CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&backend->cublas_lt_));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&backend->lt_workspace_, kLtWorkspaceBytes));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&backend->partials_, kReductionBlocks * sizeof(double)));
  CUDA_RETURN_IF_ERROR(cudaMalloc(&backend->inf_flags_, kReductionBlocks * sizeof(int)));
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&backend->stats_ring_, kStatsSlots * sizeof(StepState)));
  CUDA_RETURN_IF_ERROR(cudaMallocHost(&backend->readback_, sizeof(StepState)));
  for (cudaEvent_t& event : backend->stats_events_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
  }
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&backend->base_event_));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&backend->now_event_));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&backend->sync_event_, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(backend->base_event_, backend->stream_));
  auto collective = make_collective(backend->stream_);
  if (!collective.ok()) return collective.status();
  backend->collective_ = std::move(*collective);
  if (auto* nccl = dynamic_cast<NcclCollective*>(backend->collective_.get())) {
    CudaBackend* self = backend.get();  // Owns the collective: outlives the hook.
    nccl->SetAbortHooks([self] { self->EndRecordingInProgress(); },
                        [self] { self->DropRecordedStep(); });
  }
  return backend;
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  // The collective first: its abort ends kernels still waiting on a peer, and drops the
  // recorded step meanwhile (NcclCollective::SetAbortHooks); then the stream can drain.
  collective_.reset();
  DropRecordedStep();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (lr_device_ != nullptr) cudaFree(lr_device_);
  if (lr_ring_ != nullptr) cudaFreeHost(lr_ring_);
  for (cudaEvent_t event : lr_copied_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  if (replay_done_ != nullptr) cudaEventDestroy(replay_done_);
  for (UploadSlot& slot : upload_slots_) {
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
  }
  for (void* pointer : allocations_) cudaFree(pointer);
  // Its compiled graphs serve the next backend on this device (cudnn_attention.h).
  CudnnAttention::Park(std::move(attention_), device_);
  for (void* buffer :
       {embedding_keys_, embedding_sort_.sort_temp, row_losses_, layer_norm_partials_,
        bias_partials_}) {
    if (buffer != nullptr) cudaFree(buffer);
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (partials_ != nullptr) cudaFree(partials_);
  if (inf_flags_ != nullptr) cudaFree(inf_flags_);
  if (stats_ring_ != nullptr) cudaFreeHost(stats_ring_);
  if (readback_ != nullptr) cudaFreeHost(readback_);
  for (cudaEvent_t event : stats_events_) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  for (cudaEvent_t event : {base_event_, now_event_, sync_event_}) {
    if (event != nullptr) cudaEventDestroy(event);
  }
  for (auto& [key, plan] : lt_plans_) {
    cublasLtMatmulDescDestroy(plan.operation);
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
  }
  if (lt_workspace_ != nullptr) cudaFree(lt_workspace_);
  if (ones_ != nullptr) cudaFree(ones_);
  if (bias_scratch_ != nullptr) cudaFree(bias_scratch_);
  if (cublas_lt_ != nullptr) cublasLtDestroy(cublas_lt_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::WaitFor(cudaEvent_t event, const char* what) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_timeout_ms_);
  auto* nccl = dynamic_cast<NcclCollective*>(collective_.get());
  int spins = 0;
  while (true) {
    cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return absl::OkStatus();
    if (state != cudaErrorNotReady) return CudaStatus(state, what, __FILE__, __LINE__);
    if (nccl != nullptr) {
      // Abort() (the rank's stop token) or the communicator's own error: abort it here, on the
      // thread that uses it, so that its kernels return, and say what we were waiting for.
      absl::Status async = nccl->AsyncError();
      if (!async.ok()) {
        nccl->AbortCommunicator();
        return absl::Status(async.code(), absl::StrCat("while waiting for ", what, ": ",
                                                       async.message()));
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      if (nccl != nullptr) {
        // A replayed step runs its collectives inside the graph, on the compute stream.
        const bool collective_pending = nccl->HasPendingWork() || ReplayPending();
        nccl->AbortCommunicator();
        if (collective_pending) return absl::DeadlineExceededError(nccl->TimeoutMessage(what));
      }
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete within ",
                                                      wait_timeout_ms_, " ms (a peer hung?)"));
    }
    // Spin briefly for short waits, then back off to keep a core free.
    if (++spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

absl::Status CudaBackend::WaitForStream(const char* what) {
  CUDA_RETURN_IF_ERROR(cudaEventRecord(sync_event_, stream_));
  return WaitFor(sync_event_, what);
}

absl::StatusOr<void*> CudaBackend::Scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    // The stream may still use the old buffer: let it drain first.
    if (absl::Status status = WaitForStream("scratch resize"); !status.ok()) return status;
    if (scratch_ != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
    scratch_ = nullptr;
    ++buffer_generation_;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_;
}

absl::Status CudaBackend::Reserve(void** buffer, int64_t* capacity, int64_t bytes,
                                  const char* what) {
  if (bytes <= *capacity) return absl::OkStatus();
  if (recording_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " must grow while a step is being recorded"));
  }
  if (absl::Status status = WaitForStream(what); !status.ok()) return status;
  if (*buffer != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(*buffer));
  *buffer = nullptr;
  *capacity = 0;
  ++buffer_generation_;
  CUDA_RETURN_IF_ERROR(cudaMalloc(buffer, bytes));
  *capacity = bytes;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaBackend::Allocate(DType dtype, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("negative tensor shape");
  const size_t bytes = std::max<size_t>(1, rows * cols * DTypeBytes(dtype));
  void* pointer = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&pointer, bytes));
  allocations_.push_back(pointer);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(pointer, 0, bytes, stream_));
  return Tensor{pointer, dtype, rows, cols, DTypeBytes(dtype)};
}

absl::Status CudaBackend::Upload(const float* host, Tensor dst) {
  const size_t bytes = dst.numel() * sizeof(float);
  if (recording_) return absl::FailedPreconditionError("Upload while a step is being recorded");
  if (dst.dtype == DType::kF32 && bytes <= kMaxAsyncUploadBytes) {
    UploadSlot& slot = upload_slots_[next_upload_slot_];
    next_upload_slot_ = (next_upload_slot_ + 1) % kUploadSlots;
    if (slot.copied == nullptr) {
      CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    } else if (absl::Status done = WaitFor(slot.copied, "an earlier upload"); !done.ok()) {
      return done;
    }
    if (slot.bytes < bytes) {
      if (slot.host != nullptr) CUDA_RETURN_IF_ERROR(cudaFreeHost(slot.host));
      slot.host = nullptr;
      slot.bytes = 0;
      CUDA_RETURN_IF_ERROR(cudaMallocHost(&slot.host, bytes));
      slot.bytes = bytes;
    }
    std::memcpy(slot.host, host, bytes);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.data, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, stream_));
    return absl::OkStatus();  // The host buffer is free: its bytes are in the slot.
  }
  if (dst.dtype == DType::kF32) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data, host, bytes, cudaMemcpyHostToDevice, stream_));
  } else {
    auto staging = Scratch(bytes);
    if (!staging.ok()) return staging.status();
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(*staging, host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(CastFromF32(static_cast<float*>(*staging), dst.data, dst.dtype,
                                     dst.numel(), stream_));
  }
  // The host buffer may be freed when this returns.
  return WaitForStream("upload");
}

absl::Status CudaBackend::Download(Tensor src, float* host) {
  const size_t bytes = src.numel() * sizeof(float);
  const void* from = src.data;
  if (src.ld() != src.cols) {
    // A column view (the padded logits' first V columns): packed into the scratch's upper half,
    // then cast or copied from there like a contiguous tensor.
    const size_t packed_bytes = src.numel() * src.element_bytes;
    auto staging = Scratch(bytes + packed_bytes);
    if (!staging.ok()) return staging.status();
    void* packed = static_cast<char*>(*staging) + bytes;
    CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(packed, src.cols * src.element_bytes, src.data,
                                           src.ld() * src.element_bytes,
                                           src.cols * src.element_bytes, src.rows,
                                           cudaMemcpyDeviceToDevice, stream_));
    src.data = packed;
    src.row_stride = 0;
    from = packed;
  }
  if (src.dtype != DType::kF32) {
    auto staging = Scratch(bytes);
    if (!staging.ok()) return staging.status();
    CUDA_RETURN_IF_ERROR(
        CastToF32(src.data, src.dtype, static_cast<float*>(*staging), src.numel(), stream_));
    from = *staging;
  }
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host, from, bytes, cudaMemcpyDeviceToHost, stream_));
  return WaitForStream("download");
}

absl::Status CudaBackend::Zero(Tensor tensor) {
  if (tensor.ld() != tensor.cols) {  // A column view: each row's span.
    CUDA_RETURN_IF_ERROR(cudaMemset2DAsync(tensor.data, tensor.ld() * tensor.element_bytes, 0,
                                           tensor.cols * tensor.element_bytes, tensor.rows,
                                           stream_));
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(tensor.data, 0, tensor.numel() * tensor.element_bytes, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::FillNormal(Tensor out, uint64_t seed, int64_t first_index,
                                     double std) {
  if (absl::Status valid = CheckFillNormal(out, first_index, std); !valid.ok()) return valid;
  CUDA_RETURN_IF_ERROR(cuda::FillNormal(static_cast<float*>(out.data), out.numel(), seed,
                                        first_index, std, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Cast(Tensor src, Tensor dst) {
  if (src.numel() == dst.numel() && src.dtype != DType::kF32 && dst.dtype == DType::kF32) {
    CUDA_RETURN_IF_ERROR(
        CastToF32(src.data, src.dtype, static_cast<float*>(dst.data), src.numel(), stream_));
    return absl::OkStatus();
  }
  if (src.numel() != dst.numel() || src.dtype != DType::kF32) {
    return absl::InvalidArgumentError("Cast: needs an f32 source or destination of the same size");
  }
  if (dst.dtype == DType::kF32) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.data, src.data, src.numel() * 4,
                                         cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(
      CastFromF32(static_cast<const float*>(src.data), dst.data, dst.dtype, dst.numel(), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CompressGradients(Tensor src, float divisor, Tensor dst) {
  if (src.numel() != dst.numel() || src.dtype != DType::kF32 || dst.dtype == DType::kF32) {
    return absl::InvalidArgumentError(
        "CompressGradients: needs an f32 source and an f16 or bf16 destination of the same size");
  }
  CUDA_RETURN_IF_ERROR(CompressF32(static_cast<const float*>(src.data), divisor, dst.data,
                                   dst.dtype, dst.numel(), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyRowsWrapping(Tensor src, int64_t first, Tensor dst) {
  if (src.cols != dst.cols || src.rows == 0 || src.dtype != DType::kF32) {
    return absl::InvalidArgumentError("CopyRowsWrapping: f32 tensors with equal columns needed");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::CopyRowsWrapping(static_cast<const float*>(src.data),
                                                       src.rows, src.cols, first,
                                                       static_cast<float*>(dst.data), dst.rows,
                                                       stream_));
  return absl::OkStatus();
}

// Column-major GEMM C[m, n] = op(A) · op(B) + beta · C with fp32 accumulation.
absl::Status CudaBackend::Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n,
                               int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
                               float beta, void* c, int64_t ldc, DType dtype) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t bytes = DTypeBytes(dtype);
  if (beta == 0.0f && n > 1 && aligned(a) && aligned(b) && aligned(c) && (lda * bytes) % 16 == 0 &&
      (ldb * bytes) % 16 == 0 && (ldc * bytes) % 16 == 0) {
    absl::Status lt = LtMatmul({transpose_a, transpose_b, m, n, k, lda, ldb, ldc, dtype,
                                CUBLASLT_EPILOGUE_DEFAULT},
                               a, b, c, nullptr);
    if (lt.code() != absl::StatusCode::kUnimplemented) return lt;
  }
  const float alpha = 1.0f;
  const cudaDataType_t type = CudaType(dtype);
  CUBLAS_RETURN_IF_ERROR(cublasGemmEx(cublas_, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, a,
                                      type, lda, b, type, ldb, &beta, c, type, ldc,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

namespace {

// GEMM algorithms tuned in this process, per device and shape: a rank process reused for the
// next job (worker --reuse_ranks) does not time them again. Never destroyed (plain values).
struct TunedKey {
  int device;
  std::vector<int64_t> shape;
  bool operator<(const TunedKey& other) const {
    return std::tie(device, shape) < std::tie(other.device, other.shape);
  }
};
std::mutex& TunedMutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::map<TunedKey, cublasLtMatmulAlgo_t>& Tuned() {
  static auto* tuned = new std::map<TunedKey, cublasLtMatmulAlgo_t>;
  return *tuned;
}

}  // namespace

std::vector<int64_t> CudaBackend::LtShape::Values() const {
  return {transpose_a, transpose_b, m, n, k, lda, ldb, ldd, static_cast<int64_t>(dtype),
          static_cast<int64_t>(epilogue)};
}

std::optional<cublasLtMatmulAlgo_t> CudaBackend::FindTunedAlgorithm(int device,
                                                                    const LtShape& shape) {
  std::lock_guard<std::mutex> lock(TunedMutex());
  auto it = Tuned().find({device, shape.Values()});
  if (it == Tuned().end()) return std::nullopt;
  return it->second;
}

void CudaBackend::KeepTunedAlgorithm(int device, const LtShape& shape,
                                     const cublasLtMatmulAlgo_t& algo) {
  std::lock_guard<std::mutex> lock(TunedMutex());
  Tuned()[{device, shape.Values()}] = algo;
}

absl::StatusOr<CudaBackend::LtPlan*> CudaBackend::Plan(const LtShape& shape) {
  auto it = lt_plans_.find(shape);
  if (it != lt_plans_.end()) return &it->second;
  LtPlan& plan = lt_plans_[shape];
  const cudaDataType_t type = CudaType(shape.dtype);
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan.operation, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = shape.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = shape.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.operation, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &shape.epilogue, sizeof(shape.epilogue)));
  if (shape.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
  }
  if (shape.epilogue == CUBLASLT_EPILOGUE_DGELU || shape.epilogue == CUBLASLT_EPILOGUE_GELU_AUX ||
      shape.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
    // The auxiliary input or output (the pre-activation) has D's shape and type.
    const int64_t aux_ld = shape.m;
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &type, sizeof(type)));
  }
  // Stored shapes: op(A) is m x k, op(B) is k x n, D is m x n (column-major).
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan.a, type, shape.transpose_a ? shape.k : shape.m, shape.transpose_a ? shape.m : shape.k,
      shape.lda));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(
      &plan.b, type, shape.transpose_b ? shape.n : shape.k, shape.transpose_b ? shape.k : shape.n,
      shape.ldb));
  CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan.d, type, shape.m, shape.n, shape.ldd));
  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace = kLtWorkspaceBytes;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  const uint32_t alignment = 16;  // What the callers guarantee before using cuBLASLt.
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment,
                                                                sizeof(alignment)));
  }
  cublasLtMatmulHeuristicResult_t heuristics[kMaxLtCandidates];
  int found = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      cublas_lt_, plan.operation, plan.a, plan.b, plan.d, plan.d, preference, LtCandidates(),
      heuristics, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
    for (int i = 0; i < found; ++i) {
      if (heuristics[i].state == CUBLAS_STATUS_SUCCESS) plan.candidates.push_back(heuristics[i].algo);
    }
  }
  if (!plan.candidates.empty()) {
    plan.algo = plan.candidates.front();
    plan.available = true;
    // A shape tuned earlier in this process (a reused rank's previous job) keeps its choice.
    if (std::optional<cublasLtMatmulAlgo_t> tuned = FindTunedAlgorithm(device_, shape)) {
      plan.algo = *tuned;
      plan.tuned = true;
    }
  }
  return &plan;
}

absl::Status CudaBackend::LtMatmul(const LtShape& shape, const void* a, const void* b, void* d,
                                   const void* bias, const void* aux) {
  auto plan = Plan(shape);
  if (!plan.ok()) return plan.status();
  if (!(*plan)->available) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for a ", shape.m,
                                                 "x", shape.n, "x", shape.k, " GEMM"));
  }
  if (bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        (*plan)->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        (*plan)->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  if (!deterministic_ && !(*plan)->tuned && !recording_) {
    if (absl::Status tuned = TuneAlgorithm(*plan, a, b, d); !tuned.ok()) return tuned;
    KeepTunedAlgorithm(device_, shape, (*plan)->algo);
  }
  // Deterministic: the heuristic's choice, the same on every run (a timed choice may differ).
  const cublasLtMatmulAlgo_t& algo = deterministic_ ? (*plan)->candidates.front() : (*plan)->algo;
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(cublas_lt_, (*plan)->operation, &alpha, a, (*plan)->a, b,
                                        (*plan)->b, &beta, d, (*plan)->d, d, (*plan)->d, &algo,
                                        lt_workspace_, kLtWorkspaceBytes, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::TuneAlgorithm(LtPlan* plan, const void* a, const void* b, void* d) {
  plan->tuned = true;
  if (plan->candidates.size() < 2) return absl::OkStatus();
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  if (cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
    cudaEventDestroy(start);
    return CudaStatus(e, "cudaEventCreate", __FILE__, __LINE__);
  }
  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(cublas_lt_, plan->operation, &alpha, a, plan->a, b, plan->b, &beta, d,
                          plan->d, d, plan->d, &algo, lt_workspace_, kLtWorkspaceBytes, stream_);
  };
  // Each candidate once to warm up, then the median of kRuns timed one by one. A candidate
  // cuBLASLt refuses at run time is skipped; the heuristic's first stays the default.
  constexpr int kRuns = 5;
  float best_ms = 0;
  size_t best = 0;
  absl::Status status;
  for (size_t i = 0; i < plan->candidates.size() && status.ok(); ++i) {
    if (run(plan->candidates[i]) != CUBLAS_STATUS_SUCCESS) continue;
    std::vector<float> times;
    for (int r = 0; r < kRuns && status.ok(); ++r) {
      if (cudaError_t e = cudaEventRecord(start, stream_); e != cudaSuccess) {
        status = CudaStatus(e, "cudaEventRecord", __FILE__, __LINE__);
        break;
      }
      if (run(plan->candidates[i]) != CUBLAS_STATUS_SUCCESS) break;
      if (cudaError_t e = cudaEventRecord(stop, stream_); e != cudaSuccess) {
        status = CudaStatus(e, "cudaEventRecord", __FILE__, __LINE__);
        break;
      }
      status = WaitFor(stop, "timing a GEMM's candidate algorithms");
      float ms = 0;
      if (status.ok() && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess) times.push_back(ms);
    }
    if (static_cast<int>(times.size()) < kRuns) continue;
    std::sort(times.begin(), times.end());
    const float median = times[kRuns / 2];
    if (best_ms == 0 || median < best_ms) best_ms = median, best = i;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!status.ok()) return status;
  plan->algo = plan->candidates[best];
  return absl::OkStatus();
}

absl::StatusOr<const void*> CudaBackend::Ones(DType dtype, int64_t rows) {
  if (rows > ones_rows_) {
    if (absl::Status status = WaitForStream("ones resize"); !status.ok()) return status;
    if (ones_ != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(ones_));
    ones_ = nullptr;
    ++buffer_generation_;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ones_, rows * 8));  // f32 | f16 | bf16 copies
    std::vector<float> host(rows, 1.0f);
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(ones_, host.data(), rows * 4, cudaMemcpyHostToDevice, stream_));
    char* base = static_cast<char*>(ones_);
    CUDA_RETURN_IF_ERROR(CastFromF32(static_cast<float*>(ones_), base + rows * 4, DType::kF16,
                                     rows, stream_));
    CUDA_RETURN_IF_ERROR(CastFromF32(static_cast<float*>(ones_), base + rows * 6, DType::kBF16,
                                     rows, stream_));
    if (absl::Status status = WaitForStream("ones upload"); !status.ok()) return status;
    ones_rows_ = rows;
  }
  char* base = static_cast<char*>(ones_);
  switch (dtype) {
    case DType::kF32: return static_cast<const void*>(base);
    case DType::kF16: return static_cast<const void*>(base + ones_rows_ * 4);
    case DType::kBF16: return static_cast<const void*>(base + ones_rows_ * 6);
  }
  return absl::InvalidArgumentError("unknown dtype");
}

absl::Status CudaBackend::GatherRows(Tensor src, Tensor indices, Tensor dst) {
  if (src.cols != dst.cols || indices.numel() != dst.rows || src.rows == 0) {
    return absl::InvalidArgumentError("GatherRows: column or index count mismatch");
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::GatherRows(
      static_cast<const float*>(src.data), src.rows, src.cols,
      static_cast<const float*>(indices.data), static_cast<float*>(dst.data), dst.rows, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act,
                                        Tensor pre, Tensor y) {
  const int64_t m = x.rows, k = x.cols, n = w.rows;
  const bool has_bias = !b.empty();
  if (w.cols != k || (has_bias && b.numel() != n) || y.rows != m || y.cols != n) {
    return absl::InvalidArgumentError("LinearForward: shapes do not match");
  }
  // Bias, and ReLU when pre is the output, in the GEMM's epilogue; cuBLASLt wants 16-byte
  // aligned operands and leading dimensions (other shapes take the unfused path below).
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool fusable = aligned(x.data) && aligned(w.data) && (!has_bias || aligned(b.data)) &&
                       aligned(y.data) && k % 8 == 0 && n % 8 == 0;
  if (fusable &&
      (act == ActivationKind::kNone || (act == ActivationKind::kRelu && pre.data == y.data))) {
    // Row-major y[m, n] = x[m, k] · w[n, k]ᵀ is column-major yᵀ[n, m] = w · xᵀ.
    const bool relu = act == ActivationKind::kRelu;
    const LtShape shape{true, false, n, m, k, k, k, n, x.dtype,
                        has_bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                 : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT)};
    absl::Status fused = LtMatmul(shape, w.data, x.data, y.data, b.data);
    if (fused.code() != absl::StatusCode::kUnimplemented) {
      if (!fused.ok() || pre.data == y.data) return fused;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pre.data, y.data, y.numel() * y.element_bytes,
                                           cudaMemcpyDeviceToDevice, stream_));
      return absl::OkStatus();
    }
  } else if (fusable && pre.data != y.data && pre.dtype == y.dtype) {
    if (act == ActivationKind::kGeluTanh && x.dtype != DType::kF32 && aligned(pre.data) &&
        FusedActivationForward()) {
      // GELU in the epilogue: pre = round(x · wᵀ + b) as its auxiliary output and
      // y = round(gelu(x · wᵀ + b)) from the f32 value (PyTorch applies GELU to the rounded pre:
      // one rounding of the compute dtype apart, in y's last bit; fp32 keeps the pass below,
      // bit for bit the CPU backend's).
      const LtShape shape{true, false, n, m, k, k, k, n, x.dtype,
                          has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX};
      absl::Status fused = LtMatmul(shape, w.data, x.data, y.data, b.data, pre.data);
      if (fused.code() != absl::StatusCode::kUnimplemented) return fused;
    }
    // Another activation (GELU): the bias in the epilogue writes pre = round(x · wᵀ + b), then
    // y = round(act(pre)) in a pass of its own, the roundings of addmm and the activation.
    const LtShape shape{true, false, n, m, k, k, k, n, x.dtype,
                        has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT};
    absl::Status fused = LtMatmul(shape, w.data, x.data, pre.data, b.data);
    if (fused.code() != absl::StatusCode::kUnimplemented) {
      if (!fused.ok()) return fused;
      CUDA_RETURN_IF_ERROR(mptrain::cuda::ActivationForward(act, pre.data, y.data, y.dtype,
                                                            y.numel(), stream_));
      return absl::OkStatus();
    }
  }
  // Without an activation the GEMM writes y directly.
  Tensor out = act == ActivationKind::kNone ? y : pre;
  // out = bias (broadcast), then out = x · wᵀ + out in one GEMM: one rounding, as addmm.
  if (has_bias) CUDA_RETURN_IF_ERROR(BroadcastBias(b.data, out.data, out.dtype, m, n, stream_));
  // Row-major out[m, n] = x[m, k] · w[n, k]ᵀ is column-major outᵀ = w · xᵀ.
  absl::Status gemm = Gemm(true, false, n, m, k, w.data, k, x.data, k, has_bias ? 1.0f : 0.0f,
                           out.data, n, x.dtype);
  if (!gemm.ok()) return gemm;
  if (act != ActivationKind::kNone) {
    CUDA_RETURN_IF_ERROR(mptrain::cuda::ActivationForward(act, pre.data, y.data, y.dtype,
                                                          y.numel(), stream_));
  } else if (pre.data != y.data) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pre.data, y.data, y.numel() * y.element_bytes,
                                         cudaMemcpyDeviceToDevice, stream_));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationBackward(ActivationKind act, Tensor pre, Tensor dy,
                                             Tensor d_pre) {
  if (pre.dtype != d_pre.dtype || dy.dtype != d_pre.dtype) {
    // After a layer norm: pre and d_pre f32, dy in the compute dtype.
    CUDA_RETURN_IF_ERROR(mptrain::cuda::ActivationBackwardMixed(
        act, pre.data, pre.dtype, dy.data, dy.dtype, d_pre.data, d_pre.dtype, d_pre.numel(),
        stream_));
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::ActivationBackward(act, pre.data, dy.data, d_pre.data,
                                                         d_pre.dtype, d_pre.numel(), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationForward(ActivationKind act, Tensor x, Tensor y) {
  if (x.numel() != y.numel()) return absl::InvalidArgumentError("ActivationForward: sizes");
  if (x.dtype == y.dtype) {  // The GPT's GELU recomputed in backward: 8 elements per thread.
    CUDA_RETURN_IF_ERROR(
        mptrain::cuda::ActivationForward(act, x.data, y.data, y.dtype, y.numel(), stream_));
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(mptrain::cuda::ActivationForwardMixed(act, x.data, x.dtype, y.data,
                                                             y.dtype, y.numel(), stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LinearBackward(Tensor x, Tensor w, Tensor dy, Tensor dx, Tensor dw_acc,
                                         Tensor db_acc, bool overwrite_grads) {
  const int64_t m = x.rows, k = x.cols, n = w.rows, ld = dy.ld();
  if (!dx.empty() && ld != n) {
    return absl::InvalidArgumentError("LinearBackward: a strided dy needs an empty dx");
  }
  if (!dx.empty()) {
    // Row-major dx[m, k] = dy[m, n] · w[n, k]: column-major dxᵀ = wᵀ · dyᵀ.
    absl::Status gemm = Gemm(false, false, k, m, n, w.data, k, dy.data, n, 0.0f, dx.data, k,
                             dy.dtype);
    if (!gemm.ok()) return gemm;
  }
  // Row-major dw[n, k] = dy[m, n]ᵀ · x[m, k]: column-major dwᵀ = xᵀ · dy. Computed in the
  // compute dtype (as autocast's GEMM), then accumulated into the fp32 gradient; a
  // low-precision target takes the GEMM's output directly.
  const bool store = dw_acc.dtype != DType::kF32;
  if (store && (!overwrite_grads || dw_acc.dtype != dy.dtype)) {
    return absl::InvalidArgumentError(
        "LinearBackward: a low-precision target needs overwrite and the compute dtype");
  }
  void* dw = dw_acc.data;
  if (!store) {
    auto scratch = Scratch(n * k * DTypeBytes(dy.dtype));
    if (!scratch.ok()) return scratch.status();
    dw = *scratch;
  }
  absl::Status gemm = Gemm(false, true, k, n, m, x.data, k, dy.data, ld, 0.0f, dw, k, dy.dtype);
  if (!gemm.ok()) return gemm;
  if (!store) {
    CUDA_RETURN_IF_ERROR(AccumulateF32(dw, dy.dtype, static_cast<float*>(dw_acc.data), n * k,
                                       overwrite_grads, stream_));
  }
  if (db_acc.empty()) return absl::OkStatus();  // The GPT's LM head.
  return BiasGradient(dy, db_acc, overwrite_grads);
}

absl::Status CudaBackend::ReserveBiasScratch(int64_t elements) {
  if (elements <= bias_scratch_elements_) return absl::OkStatus();
  if (absl::Status status = WaitForStream("bias scratch resize"); !status.ok()) return status;
  if (bias_scratch_ != nullptr) CUDA_RETURN_IF_ERROR(cudaFree(bias_scratch_));
  bias_scratch_ = nullptr;
  bias_scratch_elements_ = 0;
  ++buffer_generation_;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&bias_scratch_, elements * 4));
  bias_scratch_elements_ = elements;
  return absl::OkStatus();
}

absl::Status CudaBackend::BiasGradient(Tensor dy, Tensor db_acc, bool overwrite_grads) {
  const int64_t m = dy.rows, n = dy.cols, ld = dy.ld();
  const bool store = db_acc.dtype != DType::kF32;
  if (db_acc.numel() != n) return absl::InvalidArgumentError("BiasGradient: shapes do not match");
  if (store && (!overwrite_grads || db_acc.dtype != dy.dtype)) {
    return absl::InvalidArgumentError(
        "BiasGradient: a low-precision target needs overwrite and the compute dtype");
  }
  if (BiasGradientSupports(dy.data, dy.dtype, n, ld)) {
    // db = round(Σ_rows dy) with fp32 sums, added into the fp32 gradient: one pass over dy
    // (bias_gradient_kernels.h).
    if (absl::Status s = Reserve(&bias_partials_, &bias_partials_bytes_,
                                 BiasGradientPartialsBytes(m, n), "the bias gradients' sums");
        !s.ok()) {
      return s;
    }
    CUDA_RETURN_IF_ERROR(mptrain::cuda::BiasGradient(dy.data, dy.dtype, m, n, ld,
                                      static_cast<float*>(bias_partials_),
                                      store ? nullptr : static_cast<float*>(db_acc.data),
                                      store ? db_acc.data : nullptr, overwrite_grads, stream_));
    return absl::OkStatus();
  }
  // Otherwise db = round(dyᵀ · 1) as a GEMM with fp32 accumulation (column-major: dyᵀ[n, m] · 1[m]),
  // then accumulated into the fp32 gradient. (cuBLASLt's BGRADB epilogue on the weight
  // gradient's GEMM ran its own reduction kernel, slower: 4.6 against 3.2 ms per GPT-2 step.)
  if (absl::Status s = ReserveBiasScratch(n); !s.ok()) return s;
  void* db = store ? db_acc.data : bias_scratch_;
  auto ones = Ones(dy.dtype, m);
  if (!ones.ok()) return ones.status();
  absl::Status gemm = Gemm(false, false, n, 1, m, dy.data, ld, *ones, m, 0.0f, db, n, dy.dtype);
  if (!gemm.ok()) return gemm;
  if (store) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(AccumulateF32(bias_scratch_, dy.dtype, static_cast<float*>(db_acc.data), n,
                                     overwrite_grads, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::LinearBackwardThroughActivation(Tensor x, Tensor w, Tensor dy,
                                                          ActivationKind act, Tensor pre,
                                                          Tensor d_act, Tensor d_pre,
                                                          Tensor dw_acc, Tensor db_acc,
                                                          bool overwrite_grads) {
  const int64_t m = x.rows, k = x.cols, n = w.rows;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool fusable = act == ActivationKind::kGeluTanh && dy.dtype != DType::kF32 &&
                       pre.dtype == dy.dtype && d_pre.dtype == dy.dtype && w.dtype == dy.dtype &&
                       dy.ld() == n && w.cols == k && dy.rows == m && pre.rows == m &&
                       pre.cols == k && d_pre.rows == m && d_pre.cols == k && k % 8 == 0 &&
                       n % 8 == 0 && aligned(w.data) && aligned(dy.data) &&
                       aligned(pre.data) && aligned(d_pre.data) && FusedActivationGradients();
  if (fusable) {
    // Row-major d_pre[m, k] = act'(pre) ⊙ (dy[m, n] · w[n, k]): column-major d_preᵀ = wᵀ · dyᵀ
    // with the DGELU epilogue reading preᵀ (same layout as d_preᵀ).
    // (cuBLASLt's DGELU_BGRAD, which would also sum the bias gradient of pre's Linear in the
    // epilogue, made the GPT-2 step 11 ms slower on an H100: the separate pass stays.)
    const LtShape shape{false, false, k, m, n, k, n, k, dy.dtype, CUBLASLT_EPILOGUE_DGELU};
    absl::Status fused = LtMatmul(shape, w.data, dy.data, d_pre.data, nullptr, pre.data);
    if (fused.code() != absl::StatusCode::kUnimplemented) {
      if (!fused.ok()) return fused;
      return LinearBackward(x, w, dy, Tensor{}, dw_acc, db_acc, overwrite_grads);
    }
  }
  return Backend::LinearBackwardThroughActivation(x, w, dy, act, pre, d_act, d_pre, dw_acc,
                                                  db_acc, overwrite_grads);
}

bool CudaBackend::FusedActivationGradients() {
  static const bool fused = SwitchedOn("MPTRAIN_FUSED_DGELU");
  return fused;
}

int CudaBackend::LtCandidates() {
  static const int candidates =
      CountSetting("MPTRAIN_LT_CANDIDATES", kDefaultLtCandidates, kMaxLtCandidates);
  return candidates;
}

bool CudaBackend::FusedLayerNormBiasGradients() {
  static const bool fused = SwitchedOn("MPTRAIN_FUSED_LN_BIAS");
  return fused;
}

bool CudaBackend::FusedActivationForward() {
  static const bool fused = SwitchedOn("MPTRAIN_FUSED_GELU");
  return fused;
}

}  // namespace mptrain::cuda
