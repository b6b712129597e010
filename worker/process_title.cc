#include "worker/process_title.h"

#include <cstring>

namespace mptrain {

bool SetProcessTitle(int argc, char** argv, const std::vector<std::string>& args) {
  if (argc < 1 || argv == nullptr || argv[0] == nullptr) return false;
  // The kernel reports [arg_start, arg_end): argv's strings, laid out one after another. Only
  // that contiguous run is ours to overwrite (what follows is the environment).
  // Measured at the first call, while the strings are still the originals; a later title
  // reuses that space.
  static char* measured_begin = nullptr;
  static size_t measured_room = 0;
  char* const begin = argv[0];
  if (begin != measured_begin) {
    char* end = argv[0] + std::strlen(argv[0]) + 1;
    for (int i = 1; i < argc && argv[i] == end; ++i) end += std::strlen(argv[i]) + 1;
    measured_begin = begin;
    measured_room = static_cast<size_t>(end - begin);
  }
  const size_t room = measured_room;
  std::string title;
  for (const std::string& arg : args) {
    title.append(arg);
    title.push_back('\0');
  }
  const bool fits = title.size() <= room;
  if (!fits) {
    title.resize(room);
    title.back() = '\0';
  }
  std::memset(begin, 0, room);
  std::memcpy(begin, title.data(), title.size());
  return fits;
}

}  // namespace mptrain
