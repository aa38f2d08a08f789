// The daemon as a process: what it may use (CPUs, descriptors), detaching and telling the parent
// (and systemd) it is ready, its group, and where it logs. main.cc wires the rest.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>

#include "fs/daemon/config.h"

namespace accelfs {

// The CPUs this daemon may run on (its affinity mask: a cgroup's cpuset or taskset).
unsigned UsableCpus();
// Raises the soft limit of open files to the hard one; returns the limit now.
rlim_t RaiseOpenFileLimit();
// Detaches before any thread exists; returns the write end of the ready pipe in the child, or -1.
int Detach();
// Tells the waiting parent the mount is ready and lets go of the terminal (after Detach).
void ReportReady(int ready_fd);
// --control-group NAME or GID.
std::optional<gid_t> ResolveGroup(const std::string& name);
// sd_notify; does nothing when not run by a Type=notify unit.
void NotifySystemd(const std::string& state);
// Whether stderr is the journal (JOURNAL_STREAM names it).
bool StderrIsJournal();
// Logs to stderr, and also to syslog once detached; under systemd to the journal only.
void SetUpLogging(const Config& config);

}  // namespace accelfs
