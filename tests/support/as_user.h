// Runs a test's step as another user: a forked child drops to `uid` (and gid, no supplementary
// groups) and runs `body`, whose return value is its exit status. Tests of what a local user can do
// to the daemon (trust, shared dirs) make their attacks so. Returns the child's exit status, 125
// where it could not drop to the user, 128 + the signal that ended it, or -1 where it could not be
// forked or waited for.
#pragma once

#include <grp.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>

namespace accelfs::testing {

inline constexpr uid_t kNobody = 65534;

inline int RunAsUser(uid_t uid, const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      _exit(125);
    }
    _exit(body());
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace accelfs::testing
