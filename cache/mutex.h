// A mutex that clang's thread-safety analysis knows, and the attributes that say what it guards.
//
// `ACCELFS_GUARDED_BY(mu_)` on a member, `ACCELFS_REQUIRES(mu_)` on a function that runs with the
// lock held: clang's -Wthread-safety (tools/check_thread_safety.sh, in the test command) rejects a
// read or write of the member, or a call of the function, where `mu_` is not held. GCC, which
// builds the daemon, sees empty macros. The analysis follows `Mutex` and `MutexLock` only: a plain
// std::mutex is no capability to it, and an attribute naming one is an error.
//
// Condition variables stay std::condition_variable (std::condition_variable_any waits slower):
// they wait on `MutexLock::native()`. A predicate that reads guarded members says so, since the
// analysis cannot follow the call inside the standard library:
//   wake_.wait(lock.native(), [this]() ACCELFS_REQUIRES(mu_) { return stop_ || !queue_.empty(); });
#pragma once

#include <mutex>

#if defined(__clang__)
#define ACCELFS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define ACCELFS_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (`Mutex`); `x` names its kind in the analysis's messages.
#define ACCELFS_CAPABILITY(x) ACCELFS_THREAD_ANNOTATION(capability(x))
// An object that holds a lock for its lifetime (`MutexLock`).
#define ACCELFS_SCOPED_CAPABILITY ACCELFS_THREAD_ANNOTATION(scoped_lockable)
// A member read and written only with `x` held.
#define ACCELFS_GUARDED_BY(x) ACCELFS_THREAD_ANNOTATION(guarded_by(x))
// A pointer member whose pointee is read and written only with `x` held.
#define ACCELFS_PT_GUARDED_BY(x) ACCELFS_THREAD_ANNOTATION(pt_guarded_by(x))
// The function is called with these held, and returns with them still held.
#define ACCELFS_REQUIRES(...) ACCELFS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// The function is called without these held (it takes them itself).
#define ACCELFS_EXCLUDES(...) ACCELFS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function takes these and returns with them held.
#define ACCELFS_ACQUIRE(...) ACCELFS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
// The function is called with these held and gives them up.
#define ACCELFS_RELEASE(...) ACCELFS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// The function takes these when it returns `ok` (its first argument).
#define ACCELFS_TRY_ACQUIRE(...) ACCELFS_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The function returns a reference to `x` (an accessor of a lock).
#define ACCELFS_RETURN_CAPABILITY(x) ACCELFS_THREAD_ANNOTATION(lock_returned(x))
// The analysis skips the function's body; its attributes still bind its callers.
#define ACCELFS_NO_THREAD_SAFETY_ANALYSIS ACCELFS_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace accelfs {

// std::mutex as a capability. lock/unlock/try_lock are the standard's names, so that it is a
// Lockable; prefer MutexLock to calling them.
class ACCELFS_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACCELFS_ACQUIRE() { mu_.lock(); }
  void unlock() ACCELFS_RELEASE() { mu_.unlock(); }
  bool try_lock() ACCELFS_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // The std::mutex itself, for MutexLock (and what else must hand it to the standard library).
  std::mutex& native() ACCELFS_RETURN_CAPABILITY(this) { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction, as std::unique_lock does (it is one inside, so
// that a std::condition_variable waits on `native()`). Unlock() and Lock() let go of it and take
// it again in between; the destructor releases it only if held.
class ACCELFS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACCELFS_ACQUIRE(mu) : lock_(mu.native()) {}
  ~MutexLock() ACCELFS_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Lock() ACCELFS_ACQUIRE() { lock_.lock(); }
  void Unlock() ACCELFS_RELEASE() { lock_.unlock(); }

  // For std::condition_variable's waits, which release the lock and take it again before they
  // return: to the analysis it is held throughout.
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace accelfs
