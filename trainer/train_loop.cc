#include "trainer/train_loop.h"

#include <chrono>

#include <cmath>
#include <deque>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc_limits.h"
#include "common/status_macros.h"
#include "io/safetensors.h"
#include "trainer/checkpoint.h"
#include "trainer/data/micro_batches.h"
#include "trainer/evaluator.h"
#include "trainer/gradient_communicator.h"
#include "trainer/hf_config.h"
#include "trainer/loss/loss.h"
#include "trainer/model/gpt_sampler.h"
#include "trainer/model/make_model.h"
#include "trainer/model/model.h"
#include "trainer/optim/optimizer.h"
#include "trainer/optim/schedule.h"
#include "trainer/parameter_layout.h"
#include "trainer/rank_data.h"
#include "trainer/resume.h"

namespace mptrain {
namespace {

// The parameters a run starts from: the model's initialisation from the seed, drawn where the
// parameters live, or the init_checkpoint's.
absl::Status InitializeParameters(const TrainingConfig& config, Backend* backend, Model* model) {
  if (config.init_checkpoint.empty()) return model->InitializeParameters(config.seed);
  ASSIGN_OR_RETURN(std::vector<float> initial,
                   ReadInitialParameters(config.init_checkpoint, model->table()));
  return backend->Upload(initial.data(), model->params());
}

TokenBatchOptions TokenOptions(const TrainingConfig& config, int rank, int world_size,
                               bool eval) {
  TokenBatchOptions options;
  options.batch = config.micro_batch_size;
  options.context = config.model.gpt.context_length;
  options.rank = rank;
  options.world_size = world_size;
  options.vocab_size = config.model.gpt.vocab_size;
  options.shuffle = !eval && config.data.shuffle;
  options.shuffle_seed = config.data.shuffle_seed;
  return options;
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeBatchSource(const TrainingConfig& config,
                                                             Backend* backend, int rank,
                                                             int world_size) {
  if (config.model.gpt.enabled()) {
    if (config.data.source != DataConfig::Source::kTokens) {
      return absl::InvalidArgumentError("model.gpt trains on data.tokens");
    }
    ASSIGN_OR_RETURN(TokenBatches tokens,
                     TokenBatches::Open("data.tokens.files", config.data.token_files,
                                        TokenOptions(config, rank, world_size, /*eval=*/false)));
    ASSIGN_OR_RETURN(TokenMicroBatches batches,
                     TokenMicroBatches::Create(backend, std::move(tokens)));
    return std::unique_ptr<BatchSource>(new TokenMicroBatches(std::move(batches)));
  }
  if (config.data.source == DataConfig::Source::kTokens) {
    return absl::InvalidArgumentError("data.tokens needs model.gpt");
  }
  ASSIGN_OR_RETURN(RankData data, LoadRankData(config, rank, world_size));
  Shuffling shuffling;
  shuffling.enabled = config.data.shuffle;
  shuffling.seed = config.data.shuffle_seed;
  shuffling.rank = rank;
  shuffling.world_size = world_size;
  ASSIGN_OR_RETURN(MicroBatches micro_batches,
                   MicroBatches::Create(backend, data, config.micro_batch_size, shuffling));
  return std::unique_ptr<BatchSource>(new MicroBatches(std::move(micro_batches)));
}

// FAILED_PRECONDITION naming the first parameter that is NaN or infinite after `step`.
absl::Status CheckFiniteParameters(const std::vector<float>& parameters, int64_t step) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (!std::isfinite(parameters[i])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training diverged: after step ", step, " parameter ", i,
          " is not finite (NaN or infinity); lower optimizer.lr or set max_grad_norm"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StepConfig MakeStepConfig(const TrainingConfig& config) {
  StepConfig step;
  step.max_grad_norm = static_cast<float>(config.max_grad_norm);
  step.scaler_enabled = config.loss_scaler.enabled;
  step.growth_factor = static_cast<float>(config.loss_scaler.growth_factor);
  step.backoff_factor = static_cast<float>(config.loss_scaler.backoff_factor);
  step.growth_interval = static_cast<int32_t>(config.loss_scaler.growth_interval);
  return step;
}

absl::StatusOr<TrainingResult> RunTraining(const TrainingConfig& config, int rank,
                                           Backend* backend, TrainingObserver* observer,
                                           const std::string& resume_checkpoint,
                                           const CheckpointStamp& stamp) {
  Collective* collective = backend->collective();
  const int world_size = collective->world_size();
  if (config.world_size != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size is ", config.world_size,
                                                   " but the collective has ", world_size,
                                                   " ranks"));
  }
  const int64_t batch = config.micro_batch_size;
  const int64_t accumulation = config.accumulation_steps;
  const DType dtype = config.compute_dtype;

  backend->SetDeterministic(config.deterministic);
  const auto set_up_began = std::chrono::steady_clock::now();
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
        .count();
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, MakeModel(config, backend));
  const ParameterTable& table = model->table();
  const double model_built_ms = ms_since(set_up_began);
  // Every rank starts from the same parameters: the same seed, or the same checkpoint.
  RETURN_IF_ERROR(InitializeParameters(config, backend, model.get()));
  observer->OnSetUp(model_built_ms, ms_since(set_up_began));
  const GptConfig& gpt = config.model.gpt;
  ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> micro_batches,
                   MakeBatchSource(config, backend, rank, world_size));
  // A language model's loss is over the B·T positions of a micro-batch, V classes each.
  const int64_t rows_per_micro_batch = gpt.enabled() ? batch * gpt.context_length : batch;
  ModelConfig loss_model = config.model;
  if (gpt.enabled()) loss_model.widths = {1, gpt.vocab_size};
  ASSIGN_OR_RETURN(std::unique_ptr<Loss> loss,
                   MakeLoss(config.loss, loss_model, backend, dtype, rows_per_micro_batch,
                            accumulation));
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                   MakeOptimizer(config.optimizer, backend, table.total(), DecaySpansOf(table)));
  LrSchedule lr_schedule(config.lr_schedule, config.optimizer.lr, config.steps);
  std::unique_ptr<Evaluator> evaluator;
  if (config.eval.enabled() && gpt.enabled()) {
    ASSIGN_OR_RETURN(TokenBatches eval_tokens,
                     TokenBatches::Open("eval_tokens.files", config.eval.token_files,
                                        TokenOptions(config, rank, world_size, /*eval=*/true)));
    ASSIGN_OR_RETURN(TokenMicroBatches eval_batches,
                     TokenMicroBatches::Create(backend, std::move(eval_tokens)));
    ASSIGN_OR_RETURN(evaluator,
                     Evaluator::CreateForTokens(backend, std::move(eval_batches),
                                                config.eval.batches, rows_per_micro_batch));
  } else if (config.eval.enabled()) {
    ASSIGN_OR_RETURN(RankData eval_shard, LoadEvalShard(config, rank, world_size));
    ASSIGN_OR_RETURN(evaluator,
                     Evaluator::Create(backend, eval_shard, eval_shard.total_rows, batch));
  }
  // A sample after each evaluation and after the last step, shown by rank 0. Every rank
  // generates it (the same parameters, seed and step: the same tokens), so that no rank waits
  // in the next collective while rank 0 alone samples: thousands of tokens take longer than
  // collective_timeout_s, and the waiting ranks failed the job naming rank 0.
  std::optional<GptSampler> sampler;
  if (gpt.enabled() && config.sample.enabled) {
    ASSIGN_OR_RETURN(sampler, GptSampler::Create(backend, gpt, config.sample));
  }
  // Between an evaluation's batches and a sample's tokens: progress for the coordinator (a
  // long evaluation or sample is not a stall), and a stop honoured without waiting for the end.
  bool stopped_between_work_units = false;
  auto work_unit_done = [&] {
    observer->OnWorkUnit();
    stopped_between_work_units = observer->ShouldStop();
    return stopped_between_work_units;
  };
  // That stop's ABORTED gains its reason; any other error (an aborted collective says its own)
  // stays as it is.
  auto with_stop_reason = [&](const absl::Status& status) {
    if (!stopped_between_work_units || !absl::IsAborted(status)) return status;
    return absl::AbortedError(absl::StrCat(status.message(), ": ", observer->StopReason()));
  };
  auto write_sample = [&](int64_t step) -> absl::Status {
    if (!sampler.has_value()) return absl::OkStatus();
    absl::StatusOr<std::vector<int64_t>> tokens =
        sampler->Generate(model.get(), step, work_unit_done);
    if (!tokens.ok()) return with_stop_reason(tokens.status());
    if (rank == 0) observer->OnSample(step, sampler->Describe(*tokens, kMaxNoteBytes));
    return absl::OkStatus();
  };
  auto evaluation_step = [&](int64_t step) {
    return evaluator != nullptr &&
           ((config.eval.every > 0 && step % config.eval.every == 0) || step == config.steps);
  };
  std::map<int64_t, EvalResult> evaluations;  // By step, until their telemetry is out.
  // DDP's buckets: each is allreduced (mean over ranks; the loss and the correct count ride in
  // the first) as soon as the backward pass of the stepping micro-batch completes it,
  // overlapping the rest; in fp32 or compressed (DDP's compress hooks), as the job says.
  ASSIGN_OR_RETURN(std::unique_ptr<GradientCommunicator> communicator,
                   GradientCommunicator::Create(backend, collective, config.grad_comm_dtype,
                                                model->grads(), table.total()));
  ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> reducer,
                   GradientReducer::Create(
                       table, model->accumulator(),
                       [&](Tensor span) { return communicator->Start(span); },
                       GradientReducer::kBucketBytes, GradientReducer::kChunkBytes,
                       model->ComputesFirstWeightInRowChunks()));

  const StepConfig step_config = MakeStepConfig(config);
  StepState initial_state;
  initial_state.scale =
      step_config.scaler_enabled ? static_cast<float>(config.loss_scaler.init_scale) : 1.0f;
  int64_t first_step = 1;
  if (!resume_checkpoint.empty()) {
    // Rank 0 reads the checkpoint; every other rank receives its state through the collective
    // (trainer/resume.h), so the file need only be on rank 0's host.
    std::vector<ResumeSlot> slots;
    for (const OptimizerSlot& slot : optimizer->slots()) slots.push_back({slot.name, slot.values});
    // Rank 0 falls back to the job's older checkpoints when the recorded one cannot be read.
    const std::vector<std::string> candidates =
        rank == 0 ? FindResumeCandidates(resume_checkpoint, stamp.job)
                  : std::vector<std::string>{resume_checkpoint};
    ASSIGN_OR_RETURN(ResumeState resumed,
                     LoadResumeState(candidates, rank, table, backend, model->params(),
                                     slots, model->buffers(), stamp.job));
    if (!resumed.unreadable.empty()) {
      observer->OnWarning(absl::StrCat(
          "resumed from ", resumed.path, " (step ", resumed.step, "): the newer checkpoints of "
          "the job could not be read: ", absl::StrJoin(resumed.unreadable, "; ")));
    }
    // A checkpoint past the job's end (a hostile or foreign file: its step is metadata) would
    // overflow the data position and the batch count below.
    if (resumed.step < 0 || resumed.step > config.steps) {
      return absl::InvalidArgumentError(absl::StrCat(resume_checkpoint, ": step ", resumed.step,
                                                     " is outside this job's 0..", config.steps));
    }
    model->RestoreProgress(resumed.step, accumulation);
    initial_state = resumed.step_state;
    first_step = resumed.step + 1;
    RETURN_IF_ERROR(micro_batches->SeekTo(resumed.step, accumulation));
  }
  ASSIGN_OR_RETURN(StepStateBuffer step_state, backend->AllocateStepState(initial_state));
  RETURN_IF_ERROR(model->RefreshLowPrecisionWeights());

  // Rank 0 saves what a restarted run needs (a host synchronisation, every checkpoint_every
  // steps only).
  std::optional<CheckpointRetention> retention;  // Made at the first checkpoint.
  auto write_checkpoint = [&](int64_t step) -> absl::Status {
    TrainingCheckpoint checkpoint;
    checkpoint.step = step;
    checkpoint.data_cursor = micro_batches->cursor();
    checkpoint.parameters.resize(table.total());
    RETURN_IF_ERROR(backend->Download(model->params(), checkpoint.parameters.data()));
    // Never a checkpoint a restart could not load: the step's update may have overflowed the
    // parameters before any loss saw it (the next step's would have failed the job).
    RETURN_IF_ERROR(CheckFiniteParameters(checkpoint.parameters, step));
    for (const OptimizerSlot& slot : optimizer->slots()) {
      std::vector<float>& values = checkpoint.optimizer_state[slot.name];
      values.resize(table.total());
      RETURN_IF_ERROR(backend->Download(slot.values, values.data()));
    }
    if (!model->buffers().empty()) {
      checkpoint.buffers.resize(table.buffers_total());
      RETURN_IF_ERROR(backend->Download(model->buffers(), checkpoint.buffers.data()));
      checkpoint.num_batches_tracked = model->buffer_counter();
    }
    ASSIGN_OR_RETURN(checkpoint.step_state, backend->ReadStepState(step_state));
    checkpoint.job_id = stamp.job;
    checkpoint.owner = stamp.owner;
    const std::string path = CheckpointPath(config.checkpoint_dir, step);
    // A later attempt may write again a step file an earlier attempt of this job wrote (it
    // resumed from an older checkpoint, or from the beginning when the coordinator never heard
    // of that file); with overwrite_output a job replaces its owner's other files; another
    // owner's file, or one stamped by nobody, never: this checkpoint is then left out (the
    // run goes on, and says so), rather than failing a run over a file put in its way.
    const FileOwnership ownership = CheckpointOwnership(path, stamp);
    if (!MayReplace(ownership, config.overwrite_output, /*resuming=*/!resume_checkpoint.empty())) {
      observer->OnWarning(absl::StrCat(
          "checkpoint of step ", step, " not written: ", path,
          ownership == FileOwnership::kSameOwner
              ? " holds another job's checkpoint (set overwrite_output: true to replace it)"
              : " holds a file no job of this owner wrote, which is never replaced"));
      return absl::OkStatus();
    }
    SafetensorsWriteOptions write;
    write.replace_existing = ownership != FileOwnership::kAbsent;
    write.no_symlinks = config.output_paths_resolved;
    RETURN_IF_ERROR(WriteTrainingCheckpoint(path, table, checkpoint, write));
    observer->OnCheckpoint(step, path);
    // A long job would fill the disk: its older checkpoints go once this one is written.
    if (!retention) {
      retention.emplace(config.checkpoint_dir, stamp.job, config.keep_checkpoints,
                        write.no_symlinks);
    }
    absl::StatusOr<int> pruned = retention->Written(step, observer->AcknowledgedCheckpointStep());
    if (!pruned.ok()) {
      observer->OnWarning(
          absl::StrCat("older checkpoints not removed: ", pruned.status().ToString()));
    }
    return absl::OkStatus();
  };

  // Statistics come back through a ring of host slots, read a few steps late so that the host
  // never waits for the step it just issued.
  struct Pending {
    int64_t step;
    int slot;
    double lr;
  };
  std::deque<Pending> pending;
  ASSIGN_OR_RETURN(double previous_ms, backend->NowMs());
  // Samples: sequences' positions for a language model (tokens/s), rows for the MLP.
  const double samples_per_step =
      static_cast<double>(world_size) * rows_per_micro_batch * accumulation;
  auto emit_oldest = [&]() -> absl::Status {
    Pending oldest = pending.front();
    pending.pop_front();
    ASSIGN_OR_RETURN(StepStats stats, backend->ReadStats(oldest.slot));
    // A step that was not skipped applied gradients of a NaN or infinite loss (the loss is the
    // mean over ranks: every rank fails at the same step). Without this the run "succeeded"
    // with loss nan.
    if (stats.state.skipped == 0 && !std::isfinite(stats.state.last_loss)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the training diverged: the loss of step ", oldest.step,
          " is not finite (NaN or infinity) and the step was not skipped; lower optimizer.lr, "
          "enable the loss scaler or check the data"));
    }
    const double step_ms = stats.completed_ms - previous_ms;
    previous_ms = stats.completed_ms;
    auto evaluation = evaluations.find(oldest.step);
    const bool telemetry_step = oldest.step % config.telemetry_every == 0 ||
                                oldest.step == config.steps || evaluation != evaluations.end();
    StepTelemetry record;
    record.step = oldest.step;
    record.loss = stats.state.last_loss;
    record.grad_norm = stats.state.last_grad_norm;
    record.loss_scale = stats.state.last_scale;
    record.skipped = stats.state.skipped != 0;
    record.skipped_total = stats.state.skipped_total;
    record.step_time_ms = step_ms;
    record.samples_per_second = step_ms > 0 ? samples_per_step * 1000.0 / step_ms : 0;
    record.lr = oldest.lr;
    if (loss->classifies()) {
      // The correct count averaged over ranks, times the ranks: the step's whole count, a whole
      // number (the mean of 3 ranks' counts is not exact in fp32: 2/3 came out 0.66666669),
      // over every rank's samples, as PyTorch sums the counts and divides once.
      record.has_accuracy = true;
      const double correct = std::nearbyint(static_cast<double>(stats.state.last_correct) *
                                            world_size);
      record.accuracy =
          correct / (static_cast<double>(rows_per_micro_batch * accumulation) * world_size);
    }
    if (evaluation != evaluations.end()) {
      record.has_eval = true;
      record.eval_loss = evaluation->second.loss;
      record.eval_accuracy = evaluation->second.accuracy;
      evaluations.erase(evaluation);
    }
    observer->OnStep(oldest.step, telemetry_step ? &record : nullptr);
    return absl::OkStatus();
  };

  // DDP broadcasts rank 0's buffers at the start of each step when they may differ per rank
  // (a local batch norm's running statistics: each rank sees its own data).
  const bool broadcast_buffers = model->BroadcastsBuffers();
  // The work of one optimizer step, issued op by op.
  auto issue_step = [&](double lr) -> absl::Status {
    // Micro-batches 1..A-1 only accumulate local gradients: no collective (DDP's no_sync).
    // The last one is the stepping micro-batch: the gradient allreduce, then the optimizer step.
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const bool stepping = micro + 1 == accumulation;
      if (micro == 0 && broadcast_buffers) {
        // DDP's broadcast_buffers (its default): before a forward that follows a synchronising
        // one, rank 0's buffers overwrite every rank's — the first micro-batch of each step.
        RETURN_IF_ERROR(collective->Broadcast(model->buffers(), 0));
      }
      Tensor x, y;
      RETURN_IF_ERROR(micro_batches->Next(&x, &y));
      RETURN_IF_ERROR(model->Forward(x, micro_batches->in_place(), /*training=*/true));
      // loss / A, times the current scale (read on the device), seeds the backward pass.
      RETURN_IF_ERROR(
          loss->Backward(model->output(), y, step_state, model->metrics(), model->output_grad()));
      // The stepping micro-batch tells the reducer as each layer's gradients are done.
      RETURN_IF_ERROR(model->Backward(micro, stepping ? reducer.get() : nullptr));
    }
    RETURN_IF_ERROR(communicator->Finish());
    // GradScaler: unscale and check for inf/NaN (with the global norm for clipping), then skip
    // or step and update the scale; the optimizer's step (with the low-precision weight copies
    // for the next step's micro-batches) unless skipped. The metric slots start the next step
    // at 0.
    RETURN_IF_ERROR(backend->GradientStatistics(model->param_grads(), step_state));
    RETURN_IF_ERROR(backend->FinalizeStep(step_config, model->metrics(), step_state));
    RETURN_IF_ERROR(optimizer->Update(lr, model->params(), model->param_grads(),
                                      step_state, model->low_precision_params()));
    return backend->Zero(model->metrics());
  };
  // Recorded once and replayed (a CUDA graph: one launch instead of one per op) where a step's
  // work is the same every time but for the learning rate, which the replay sets on the
  // device, and the micro-batches' contents: the data is one batch used in place, or each
  // step's micro-batches are copied (gathered, when shuffling) into buffers of their own before
  // the step (MicroBatches::Stage, op by op: a recorded copy would keep its first offsets) —
  // within kStagingBudgetBytes; and the host keeps no count per forward (batch norm's
  // num_batches_tracked). The first step runs op by op: it sizes every lazily grown buffer, and
  // a buffer grown later (an evaluation's) makes the backend ask for a new recording.
  constexpr int64_t kStagingBudgetBytes = int64_t{256} << 20;
  const bool record_steps =
      config.record_steps && backend->CanRecordSteps() && model->StepIsReplayable() &&
      micro_batches->StagingBytes(accumulation) <= kStagingBudgetBytes;
  bool recorded = false;
  int64_t replayed_steps = 0;
  auto record_and_replay = [&](double lr) -> absl::Status {
    ++replayed_steps;
    RETURN_IF_ERROR(micro_batches->Stage(accumulation));
    if (recorded) {
      absl::Status replayed = backend->ReplayStep(lr);
      // The replay read the staged micro-batches: none is left for a later Next().
      if (replayed.ok()) micro_batches->DropStaged();
      if (replayed.code() != absl::StatusCode::kFailedPrecondition) return replayed;
    }
    RETURN_IF_ERROR(backend->BeginStepRecording());
    absl::Status issued = issue_step(lr);
    absl::Status ended = backend->EndStepRecording();
    RETURN_IF_ERROR(issued);
    RETURN_IF_ERROR(ended);
    recorded = true;
    return backend->ReplayStep(lr);
  };

  for (int64_t step = first_step; step <= config.steps; ++step) {
    // Known on the host: the schedule advances on every attempted step, skipped or not.
    const double lr = lr_schedule.At(step);
    RETURN_IF_ERROR(record_steps && step > first_step ? record_and_replay(lr) : issue_step(lr));

    if (evaluation_step(step)) {
      // An evaluation forward through DDP broadcasts rank 0's buffers first, like any forward
      // after a synchronising one: every rank evaluates rank 0's model (the one it writes).
      if (broadcast_buffers) RETURN_IF_ERROR(collective->Broadcast(model->buffers(), 0));
      absl::StatusOr<EvalResult> evaluation =
          evaluator->Run(model.get(), loss.get(), work_unit_done);
      if (!evaluation.ok()) return with_stop_reason(evaluation.status());
      evaluations[step] = *evaluation;
      RETURN_IF_ERROR(write_sample(step));
      // The evaluation went through the model's host-side caches (its low-precision input
      // copy now holds evaluation data, which a training forward casts again): the next step
      // is recorded afresh, as it would be issued op by op.
      recorded = false;
    }

    const int slot = static_cast<int>(step % Backend::kStatsSlots);
    RETURN_IF_ERROR(backend->SnapshotStats(step_state, slot));
    pending.push_back({step, slot, lr});
    while (pending.size() >= Backend::kStatsSlots / 2) RETURN_IF_ERROR(emit_oldest());
    if (rank == 0 && config.checkpoint_every > 0 && step % config.checkpoint_every == 0) {
      while (!pending.empty()) RETURN_IF_ERROR(emit_oldest());
      RETURN_IF_ERROR(write_checkpoint(step));
    }
    if (observer->ShouldStop()) {
      return absl::AbortedError(absl::StrCat("stopped at step ", step, ": ",
                                             observer->StopReason()));
    }
  }
  while (!pending.empty()) RETURN_IF_ERROR(emit_oldest());
  // After the last step (its evaluation wrote one when there is one).
  if (!evaluation_step(config.steps)) RETURN_IF_ERROR(write_sample(config.steps));

  TrainingResult result;
  result.parameters.resize(table.total());
  RETURN_IF_ERROR(backend->Download(model->params(), result.parameters.data()));
  // The last step's update is seen by no later loss: checked here, before anything is written.
  RETURN_IF_ERROR(CheckFiniteParameters(result.parameters, config.steps));
  result.checksum = ParameterChecksum(result.parameters);
  if (!model->buffers().empty()) {
    result.buffers.resize(table.buffers_total());
    RETURN_IF_ERROR(backend->Download(model->buffers(), result.buffers.data()));
  }
  ASSIGN_OR_RETURN(StepStats last,
                   backend->ReadStats(static_cast<int>(config.steps % Backend::kStatsSlots)));
  result.skipped_steps = last.state.skipped_total;
  result.replayed_steps = replayed_steps;
  result.final_loss_scale = last.state.scale;
  if (rank == 0 && !config.output_checkpoint.empty()) {
    SafetensorsWriteOptions write;
    // Checked before training (worker/rank_process.cc), and again now that hours may have
    // passed: only this job's own file, or its owner's with overwrite_output, is replaced.
    write.replace_existing = MayReplace(CheckpointOwnership(config.output_checkpoint, stamp),
                                        config.overwrite_output, /*resuming=*/false);
    write.no_symlinks = config.output_paths_resolved;
    std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                    {"steps", std::to_string(config.steps)}};
    if (!stamp.job.empty()) metadata["mptrain_job"] = stamp.job;
    if (!stamp.owner.empty()) metadata["mptrain_owner"] = stamp.owner;
    TensorMap tensors = table.ToTensors(result.parameters);
    for (auto& [name, tensor] : table.BuffersToTensors(result.buffers, model->buffer_counter())) {
      tensors[name] = std::move(tensor);
    }
    RETURN_IF_ERROR(WriteSafetensors(config.output_checkpoint, tensors, metadata, write));
    if (config.model.gpt.enabled()) {
      // transformers' GPT2LMHeadModel.from_pretrained(dir) needs it beside the weights. The
      // checkpoint is what the job produced: a config.json that cannot be written (another
      // tenant's file is in the way) is said, not a failure of hours of training.
      absl::Status hf = WriteGptHfConfig(config.output_checkpoint, config.model.gpt, stamp,
                                         config.overwrite_output, write.no_symlinks);
      if (!hf.ok()) observer->OnWarning(absl::StrCat("config.json not written: ", hf.message()));
    }
  }
  return result;
}

}  // namespace mptrain
