#pragma once

// Declarations of the three smart-pointer templates that Debian 12's gloo headers
// (gloo/transport/tcp/pair.h, unbound_buffer.h, context.h) use but whose header,
// gloo/common/memory.h, libgloo-dev does not install. Written for this project, not copied:
// only enough for those class definitions to compile. This project never creates, copies or
// reads these objects (the gloo library does, with its own definitions); it only needs the
// complete tcp::Pair type to call one of its member functions (backends/cpu/gloo_collective.cc).
// Each holds one standard smart pointer, as the library's own do, so the sizes agree.

#include <memory>

namespace gloo {

template <typename T>
class ShareableNonOwningPtr;

// A weak reference to an object whose owner waits for all users before destruction.
template <typename T>
class WeakNonOwningPtr {
 public:
  WeakNonOwningPtr() = default;
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>& owner) : ptr_(owner.ptr_) {}

 private:
  std::weak_ptr<T> ptr_;
};

// A strong, short-lived reference obtained from a WeakNonOwningPtr.
template <typename T>
class NonOwningPtr {
 public:
  NonOwningPtr() = default;

 private:
  std::shared_ptr<T> ptr_;
};

// Held by the object itself; hands out WeakNonOwningPtr references to it.
template <typename T>
class ShareableNonOwningPtr {
 public:
  ShareableNonOwningPtr() = default;

 private:
  friend class WeakNonOwningPtr<T>;
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo
