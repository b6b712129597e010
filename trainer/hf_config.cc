#include "trainer/hf_config.h"

#include <sys/stat.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/regular_file.h"
#include "nlohmann/json.hpp"

namespace mptrain {
namespace {

constexpr char kConfigName[] = "config.json";

// GPT-2's fixed hyperparameters, the ones our model hard-codes (trainer/model/gpt_model.h):
// LayerNorm eps and the init's std (transformers reads the latter only to initialise weights
// that a checkpoint lacks: none here).
constexpr double kLayerNormEps = 1e-5;
constexpr double kInitializerRange = 0.02;

}  // namespace

std::string HfConfigPath(const std::string& checkpoint_path) {
  const std::string directory = DirectoryOf(checkpoint_path);
  return directory == "/" ? absl::StrCat("/", kConfigName)
                          : absl::StrCat(directory, "/", kConfigName);
}

std::string GptHfConfigJson(const GptConfig& gpt, const CheckpointStamp& stamp) {
  // ordered_json: the fields in GPT2Config's order, for a person reading the file.
  nlohmann::ordered_json config;
  config["architectures"] = {"GPT2LMHeadModel"};
  config["model_type"] = "gpt2";
  // V, not Vp: the checkpoint's wte has V rows (the padded ones are never written).
  config["vocab_size"] = gpt.vocab_size;
  config["n_positions"] = gpt.context_length;
  config["n_ctx"] = gpt.context_length;
  config["n_embd"] = gpt.width;
  config["n_layer"] = gpt.layers;
  config["n_head"] = gpt.heads;
  config["n_inner"] = nullptr;  // 4 * n_embd, as ours.
  config["activation_function"] = "gelu_new";  // GELU with the tanh approximation.
  config["resid_pdrop"] = 0.0;                  // No dropout in our model.
  config["embd_pdrop"] = 0.0;
  config["attn_pdrop"] = 0.0;
  config["layer_norm_epsilon"] = kLayerNormEps;
  config["initializer_range"] = kInitializerRange;
  config["scale_attn_weights"] = true;  // q·kᵀ/√(C/H).
  config["scale_attn_by_inverse_layer_idx"] = false;
  config["reorder_and_upcast_attn"] = false;
  config["tie_word_embeddings"] = true;  // The head is wte: no lm_head.weight in the file.
  config["use_cache"] = true;
  config["bos_token_id"] = nullptr;  // Our vocabularies have no special tokens.
  config["eos_token_id"] = nullptr;
  config["torch_dtype"] = "float32";  // The checkpoint's tensors are F32.
  config["mptrain_padded_vocab_size"] =
      gpt.padded_vocab_size > 0 ? gpt.padded_vocab_size : gpt.vocab_size;
  if (!stamp.job.empty()) config["mptrain_job"] = stamp.job;
  if (!stamp.owner.empty()) config["mptrain_owner"] = stamp.owner;
  return config.dump(2) + "\n";
}

FileOwnership HfConfigOwnership(const std::string& path, const CheckpointStamp& stamp) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? FileOwnership::kAbsent : FileOwnership::kSomeoneElse;
  }
  if (!S_ISREG(st.st_mode)) return FileOwnership::kSomeoneElse;
  // Opened without following a link (one swapped in since the lstat is refused).
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (!file.ok()) {
    return file.status().code() == absl::StatusCode::kNotFound ? FileOwnership::kAbsent
                                                               : FileOwnership::kSomeoneElse;
  }
  if (file->size > kMaxHfConfigBytes) return FileOwnership::kUnreadable;
  std::string text(file->size, '\0');
  if (!ReadAt(*file, path, 0, text.data(), text.size()).ok()) return FileOwnership::kUnreadable;
  // No exceptions: a malformed file is a value, not a throw (and its bytes are never quoted).
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) return FileOwnership::kUnreadable;
  auto string_field = [&](const char* key) -> const std::string* {
    auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
  };
  const std::string* job = string_field("mptrain_job");
  if (!stamp.job.empty() && job != nullptr && *job == stamp.job) return FileOwnership::kThisJob;
  // As CheckpointOwnership: a run without a stamp (a library caller) owns the unstamped files.
  if (stamp.job.empty() && config.find("mptrain_job") == config.end()) {
    return FileOwnership::kThisJob;
  }
  const std::string* owner = string_field("mptrain_owner");
  if (!stamp.owner.empty() && owner != nullptr && *owner == stamp.owner) {
    return FileOwnership::kSameOwner;
  }
  return FileOwnership::kSomeoneElse;
}

absl::Status WriteGptHfConfig(const std::string& checkpoint_path, const GptConfig& gpt,
                              const CheckpointStamp& stamp, bool overwrite_output,
                              bool no_symlinks) {
  const std::string path = HfConfigPath(checkpoint_path);
  if (path == checkpoint_path) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is the output_checkpoint itself: name the checkpoint model.safetensors"));
  }
  const FileOwnership ownership = HfConfigOwnership(path, stamp);
  if (!MayReplace(ownership, overwrite_output, /*resuming=*/false)) {
    switch (ownership) {
      case FileOwnership::kSameOwner:
        return absl::AlreadyExistsError(absl::StrCat(
            path, " holds another job's config.json (set overwrite_output: true to replace it)"));
      case FileOwnership::kUnreadable:
        return absl::FailedPreconditionError(absl::StrCat(
            path, " exists and is not a JSON object of at most ", kMaxHfConfigBytes,
            " bytes; it is left alone"));
      default:
        return absl::PermissionDeniedError(absl::StrCat(
            path, " exists and was not written by a job of ",
            stamp.owner.empty() ? std::string("this owner") : stamp.owner,
            ", so it is never replaced"));
    }
  }
  const std::string text = GptHfConfigJson(gpt, stamp);
  // Absent: a file that appears meanwhile is not replaced (RENAME_NOREPLACE decides).
  return WriteFileAtomically(path, /*replace_existing=*/ownership != FileOwnership::kAbsent,
                             no_symlinks, [&](const WriteBytes& write) {
                               return write(text.data(), text.size());
                             });
}

}  // namespace mptrain
