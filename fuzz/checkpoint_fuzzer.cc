// Fuzzes the checkpoint readers a restarted or initialised run trusts: the input becomes a file
// that ReadTrainingCheckpoint and ReadInitialParameters read against a fixed small layout
// (Linear 3 -> 2 -> 1, and the same with a batch norm). They must answer with a value or an error naming the file, never
// crash, and what they accept must match the layout and the documented ranges. No error may
// quote the file or spell its header length (fuzz/error_leak_check.h; the safetensors harness
// plants the other values).

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/error_leak_check.h"
#include "io/safetensors.h"
#include "trainer/checkpoint.h"
#include "trainer/norm_math.h"
#include "trainer/parameter_layout.h"

namespace {

// One file per process (parallel fuzzing jobs must not share it), overwritten each iteration.
const std::string& InputPath() {
  static const std::string* path = [] {
    const char* dir = getenv("TMPDIR");
    return new std::string(std::string(dir != nullptr && dir[0] != '\0' ? dir : "/tmp") +
                           "/mptrain_checkpoint_fuzzer." + std::to_string(getpid()) +
                           ".safetensors");
  }();
  return *path;
}

void RemoveTempFile() { unlink(InputPath().c_str()); }

const mptrain::ParameterLayout& Layout() {
  static const mptrain::ParameterLayout* layout = [] {
    return new mptrain::ParameterLayout(mptrain::MakeParameterLayout({3, 2, 1}));
  }();
  return *layout;
}

// The same model with a batch norm after the hidden Linear: norm parameters and running
// statistics (buffers) too.
const mptrain::ParameterLayout& NormLayout() {
  static const mptrain::ParameterLayout* layout = [] {
    return new mptrain::ParameterLayout(
        mptrain::MakeParameterLayout({3, 2, 1}, mptrain::NormKind::kBatchNorm));
  }();
  return *layout;
}

void WriteFileOrDie(const std::string& path, const uint8_t* data, size_t size) {
  FILE* file = fopen(path.c_str(), "wb");
  if (file == nullptr) abort();
  if (size > 0 && fwrite(data, 1, size, file) != size) abort();
  if (fclose(file) != 0) abort();
}

bool NamesFile(const absl::Status& status) {
  return std::string(status.message()).find(InputPath()) != std::string::npos;
}

void CheckParameters(const std::vector<float>& values) {
  if (values.size() != static_cast<size_t>(Layout().total)) abort();
  for (float value : values) {
    if (!std::isfinite(value)) abort();
  }
}

// The words a message may name and a valid file holds: the format's, the metadata keys, the
// layouts' tensor names (with and without an optimizer's prefix).
const std::vector<std::string>& Vocabulary() {
  static const auto* words = [] {
    auto* words = new std::vector<std::string>{
        "__metadata__", "data_offsets", mptrain::kDataDigestKey, "mptrain-checkpoint-v1",
        "growth_tracker", "skipped_total", "steps_done", "data_cursor", "momentum"};
    for (const mptrain::ParameterLayout* layout : {&Layout(), &NormLayout()}) {
      const std::vector<float> zeros(layout->total);
      for (const auto& [name, tensor] : mptrain::ParametersToTensors(*layout, zeros)) {
        words->push_back(name);
      }
      const std::vector<float> buffers(layout->buffers_total);
      for (const auto& [name, tensor] : mptrain::BuffersToTensors(*layout, buffers, 0)) {
        words->push_back(name);
      }
    }
    // Longest first: "norms.0.running_mean" before a shorter word inside it.
    std::sort(words->begin(), words->end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    return words;
  }();
  return *words;
}

void CheckQuotesNothing(const absl::Status& status, std::string_view input) {
  if (status.ok()) return;
  mptrain::fuzz::AbortIfQuotesInput(status, InputPath(), mptrain::fuzz::InputRuns(input),
                                    Vocabulary());
  if (input.size() >= 8) {
    uint64_t header_len = 0;
    std::memcpy(&header_len, input.data(), 8);
    if (header_len >= 10'000'000'000u) {
      mptrain::fuzz::AbortIfSpellsNumberIn(status, InputPath(), header_len, header_len,
                                           "the header length");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  atexit(RemoveTempFile);
  if (Layout().total != 3 * 2 + 2 + 2 * 1 + 1) abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteFileOrDie(InputPath(), data, size);
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<mptrain::TrainingCheckpoint> checkpoint =
      mptrain::ReadTrainingCheckpoint(InputPath(), Layout());
  if (checkpoint.ok()) {
    CheckParameters(checkpoint->parameters);
    CheckParameters(checkpoint->optimizer_state.at("momentum"));
    const mptrain::StepState& state = checkpoint->step_state;
    if (checkpoint->step < 0 || checkpoint->data_cursor < 0 || state.growth_tracker < 0 ||
        state.skipped_total < 0 || state.steps_done < 0) {
      abort();
    }
    if (!std::isfinite(state.scale) || !(state.scale > 0)) abort();
  } else if (!NamesFile(checkpoint.status())) {
    abort();
  }
  CheckQuotesNothing(checkpoint.status(), input);

  absl::StatusOr<std::vector<float>> initial =
      mptrain::ReadInitialParameters(InputPath(), Layout());
  if (initial.ok()) {
    CheckParameters(*initial);
    // A training checkpoint is also a valid initialisation, with the same parameters.
  } else if (!NamesFile(initial.status())) {
    abort();
  } else if (checkpoint.ok()) {
    abort();
  }
  CheckQuotesNothing(initial.status(), input);
  if (checkpoint.ok() && initial.ok() && *initial != checkpoint->parameters) abort();

  absl::StatusOr<mptrain::TrainingCheckpoint> with_norm =
      mptrain::ReadTrainingCheckpoint(InputPath(), NormLayout());
  if (with_norm.ok()) {
    if (with_norm->parameters.size() != static_cast<size_t>(NormLayout().total)) abort();
    if (with_norm->buffers.size() != static_cast<size_t>(NormLayout().buffers_total)) abort();
    for (float value : with_norm->buffers) {
      if (!std::isfinite(value)) abort();
    }
    for (const mptrain::LayerLayout& layer : NormLayout().layers) {
      if (!layer.has_running_stats()) continue;
      for (int64_t i = 0; i < layer.out; ++i) {
        // Evaluation takes sqrt(running_var + eps): what is accepted must keep that positive.
        if (!(with_norm->buffers[layer.running_offset + layer.out + i] + mptrain::kNormEps > 0)) {
          abort();
        }
      }
    }
  } else if (!NamesFile(with_norm.status())) {
    abort();
  }
  CheckQuotesNothing(with_norm.status(), input);
  return 0;
}
