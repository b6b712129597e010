#pragma once

// What the harnesses of file readers assert about every error: it tells nothing of the file
// (the file may be anyone's: /etc/shadow under a data root of "/"). A message may name the path
// it was given, the rule broken, its limit, a field the format defines and a position; it may
// not quote bytes of the file or spell a number read or derived from them.
//
// Two checks, each able to fail:
// - Quotes: with the path and the format's own words (`vocabulary`: field names such as
//   "data_offsets" that a message names and a valid file holds) taken out, no kQuotedRun bytes
//   of the message may appear in the input. The messages' fixed text is English the fuzzer has
//   no reason to write; a false alarm would be a reproducer to read, never a leak let through.
// - Numbers: the harness plants values (a header length of "root:*:2", a file size) and checks
//   that no digit run of the message falls in the range they could spell (SpellsNumberIn).

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace mptrain::fuzz {

inline constexpr size_t kQuotedRun = 12;

// Every search below is a plain loop of byte comparisons, never memcmp, memmem or
// std::string::find: the fuzzer intercepts those and would learn the messages' text from the
// check itself (then write it into inputs: a false alarm within seconds).
inline size_t Find(std::string_view text, std::string_view word, size_t from = 0) {
  for (size_t at = from; word.size() <= text.size() && at <= text.size() - word.size(); ++at) {
    bool same = true;
    for (size_t i = 0; i < word.size() && same; ++i) same = text[at + i] == word[i];
    if (same) return at;
  }
  return std::string_view::npos;
}

// `text` with every occurrence of each of `words` replaced by '\n' (which no message holds),
// so that no run spans a removed word.
inline std::string WithoutWords(std::string text, const std::vector<std::string>& words) {
  for (const std::string& word : words) {
    if (word.empty()) continue;
    for (size_t at; (at = Find(text, word)) != std::string_view::npos;) {
      text.replace(at, word.size(), "\n");
    }
  }
  return text;
}

[[noreturn]] inline void Leak(const absl::Status& status, const char* what) {
  fprintf(stderr, "error leaks the file (%s): %s\n", what, std::string(status.message()).c_str());
  abort();
}

// The kQuotedRun-byte windows of an input, looked up by hash (see Find: a hash teaches the
// fuzzer nothing).
class InputRuns {
 public:
  explicit InputRuns(std::string_view input) : input_(input) {
    for (size_t i = 0; i + kQuotedRun <= input.size(); ++i) {
      starts_.emplace(Hash(input.substr(i, kQuotedRun)), i);
    }
  }

  bool Contains(std::string_view run) const {
    const auto [first, last] = starts_.equal_range(Hash(run));
    for (auto it = first; it != last; ++it) {
      bool same = true;
      for (size_t i = 0; i < kQuotedRun; ++i) same &= input_[it->second + i] == run[i];
      if (same) return true;
    }
    return false;
  }

 private:
  static uint64_t Hash(std::string_view run) {
    uint64_t hash = 14695981039346656037u;  // FNV-1a.
    for (char c : run) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211u;
    return hash;
  }

  std::string_view input_;
  std::unordered_multimap<uint64_t, size_t> starts_;
};

// Aborts when the message of `status`, without `path` and `vocabulary`, quotes kQuotedRun bytes
// of the input.
inline void AbortIfQuotesInput(const absl::Status& status, const std::string& path,
                               const InputRuns& input, const std::vector<std::string>& vocabulary) {
  std::vector<std::string> removed = vocabulary;
  removed.insert(removed.begin(), path);  // First: the path may contain a vocabulary word.
  const std::string message = WithoutWords(std::string(status.message()), removed);
  for (size_t i = 0; i + kQuotedRun <= message.size(); ++i) {
    const std::string_view run(message.data() + i, kQuotedRun);
    if (Find(run, "\n") != std::string_view::npos) continue;
    if (input.Contains(run)) Leak(status, "a run of its bytes");
  }
}

// True when a run of decimal digits in `message` (the path taken out) has a value in
// [low, high].
inline bool SpellsNumberIn(const absl::Status& status, const std::string& path, uint64_t low,
                           uint64_t high) {
  const std::string message = WithoutWords(std::string(status.message()), {path});
  for (size_t i = 0; i < message.size();) {
    if (message[i] < '0' || message[i] > '9') {
      ++i;
      continue;
    }
    uint64_t value = 0;
    bool overflow = false;
    for (; i < message.size() && message[i] >= '0' && message[i] <= '9'; ++i) {
      overflow = overflow || __builtin_mul_overflow(value, uint64_t{10}, &value) ||
                 __builtin_add_overflow(value, uint64_t(message[i] - '0'), &value);
    }
    if (!overflow && value >= low && value <= high) return true;
  }
  return false;
}

inline void AbortIfSpellsNumberIn(const absl::Status& status, const std::string& path,
                                  uint64_t low, uint64_t high, const char* what) {
  if (SpellsNumberIn(status, path, low, high)) Leak(status, what);
}

// Aborts when the message (path taken out) holds `spelling`, e.g. a planted value in hex.
inline void AbortIfSpells(const absl::Status& status, const std::string& path,
                          const std::string& spelling, const char* what) {
  const std::string message = WithoutWords(std::string(status.message()), {path});
  if (Find(message, spelling) != std::string_view::npos) Leak(status, what);
}

// Writes `data` to `path`, then extends the file (sparsely, with zeros) to `size` bytes: a
// file whose size is a planted number.
inline void WriteExtendedFileOrDie(const std::string& path, std::string_view data,
                                   uint64_t size) {
  FILE* file = fopen(path.c_str(), "wb");
  if (file == nullptr) abort();
  if (!data.empty() && fwrite(data.data(), 1, data.size(), file) != data.size()) abort();
  if (fflush(file) != 0 || ftruncate(fileno(file), static_cast<off_t>(size)) != 0) abort();
  if (fclose(file) != 0) abort();
}

}  // namespace mptrain::fuzz
