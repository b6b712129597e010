#pragma once

// The config.json that Hugging Face's loader reads beside a GPT's output checkpoint, so that
// GPT2LMHeadModel.from_pretrained(<its directory>) loads what the service wrote (issue 28). The
// checkpoint itself is already in GPT-2's layout (trainer/model/parameter_table.h: HF names,
// Conv1D matrices [in, out], wte cut to V rows, the tied head not stored, "format": "pt"); this
// file gives transformers the GPT2Config that matches it, field for field as
// parity/gpt_reference.py's hf_config() writes it. from_pretrained looks for
// <dir>/model.safetensors: name the output_checkpoint so (README "Language models").
//
// The file is the job's output as much as the checkpoint is, under the same tenancy rule
// (trainer/checkpoint.h MayReplace): it carries the job's stamp ("mptrain_job",
// "mptrain_owner": transformers keeps unknown keys as attributes and ignores them), and an
// existing config.json is replaced only when this job or, with overwrite_output, another job of
// its owner wrote it — never a user's own file (an HF model directory a run writes into) nor
// another owner's.

#include <string>

#include "absl/status/status.h"
#include "trainer/checkpoint.h"
#include "trainer/training_config.h"

namespace mptrain {

// A config.json larger than this is not one of ours (a GPT2Config is under 2 KiB): it is not
// read (kUnreadable), so a hostile file costs no more than this to look at.
inline constexpr size_t kMaxHfConfigBytes = 64 * 1024;

// <the checkpoint's directory>/config.json.
std::string HfConfigPath(const std::string& checkpoint_path);

// The JSON text: model_type "gpt2", architectures ["GPT2LMHeadModel"], vocab_size V (the
// checkpoint's wte rows; "mptrain_padded_vocab_size" says Vp), n_positions = n_ctx = T, n_embd,
// n_layer, n_head, n_inner null (4C), activation_function "gelu_new" (GELU's tanh form),
// layer_norm_epsilon 1e-5, initializer_range 0.02, no dropout, tie_word_embeddings true,
// torch_dtype "float32"; the stamp's fields when not empty.
std::string GptHfConfigJson(const GptConfig& gpt, const CheckpointStamp& stamp);

// Whose config.json is at `path`, as CheckpointOwnership says it for a checkpoint: from its
// top-level "mptrain_job" / "mptrain_owner" strings. lstat first (a link or anything but a
// regular file is kSomeoneElse); a file over kMaxHfConfigBytes or that is not a JSON object
// is kUnreadable; an unstamped file is kSomeoneElse (kThisJob for a `stamp` without a job).
FileOwnership HfConfigOwnership(const std::string& path, const CheckpointStamp& stamp);

// Writes HfConfigPath(checkpoint_path) atomically (io/regular_file.h WriteFileAtomically; with
// `no_symlinks` the directory is reached without following links) when MayReplace allows it.
// ALREADY_EXISTS when a config.json of another job of the same owner is there and
// overwrite_output is false; PERMISSION_DENIED when it is anyone else's, unstamped, a link or
// not a regular file; FAILED_PRECONDITION when it cannot be read as JSON (left alone), or when
// the checkpoint is itself named config.json; otherwise WriteFileAtomically's errors. No error
// quotes the existing file's contents.
absl::Status WriteGptHfConfig(const std::string& checkpoint_path, const GptConfig& gpt,
                              const CheckpointStamp& stamp, bool overwrite_output,
                              bool no_symlinks);

}  // namespace mptrain
