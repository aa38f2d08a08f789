// accelfs-warm and accelfs-stat against real mounts: warming brings files into the cache so that
// later reads need no backend read, stat and files report it, --evict drops it, and every error
// (no fit, outside the mount, "..", permission, dead daemon) is one clear line and exit 1.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fs/common/control_protocol.h"
#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

CommandResult Warm(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {TestBinary(ACCELFS_WARM)};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

CommandResult Stat(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {TestBinary(ACCELFS_STAT)};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

// Runs a tool as nobody (uid 65534) with the given primary and supplementary groups.
CommandResult AsNobody(const std::string& tool, const std::vector<std::string>& args,
                       const std::string& gid, const std::string& groups) {
  std::vector<std::string> argv = {"setpriv", "--reuid=65534", "--regid=" + gid};
  if (groups.empty()) {
    argv.push_back("--clear-groups");
  } else {
    argv.push_back("--groups=" + groups);
  }
  argv.push_back(tool);
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

// Pages of files the kernel has let go of since boot: reclaimed under memory pressure
// (/proc/vmstat pgsteal_file) and dropped by drop_caches (each write counts once in
// drop_pagecache, so that one counts as a page). Any page of the page cache may go so; 0 where
// the counters cannot be read.
uint64_t FilePagesLetGo() {
  std::ifstream vmstat("/proc/vmstat");
  std::string name;
  uint64_t value = 0;
  uint64_t total = 0;
  while (vmstat >> name >> value) {
    if (name == "pgsteal_file" || name == "drop_pagecache") total += value;
  }
  return total;
}

nlohmann::json ParseJson(const std::string& text) {
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string Describe(const CommandResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

class ToolsTest : public MountTest {
 protected:
  void SetUp() override {
    MountTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (geteuid() != 0) GTEST_SKIP() << "the tools tests run as root (CI does): they need setpriv";
  }

  // A model directory: two shards of odd sizes and a config.
  void MakeModel() {
    ASSERT_EQ(mkdir(Src("m").c_str(), 0755), 0);
    WriteTestFile(Src("m/model-00001-of-00002.safetensors"), 9 * kMiB + 4321, 1);
    WriteTestFile(Src("m/model-00002-of-00002.safetensors"), 5 * kMiB + 17, 2);
    WriteTestFile(Src("m/config.json"), 700, 3);
  }

  // Every file of MakeModel's model, read whole through the mount, equals its backing file.
  void ExpectModelReadsAsBacking() {
    for (const char* name : {"m/model-00001-of-00002.safetensors",
                             "m/model-00002-of-00002.safetensors", "m/config.json"}) {
      int err = 0;
      const std::vector<uint8_t> via_mount = ReadWholeFile(Mnt(name), &err);
      ASSERT_EQ(err, 0) << name;
      const std::vector<uint8_t> backing = ReadWholeFile(Src(name), &err);
      EXPECT_TRUE(via_mount == backing) << name;
    }
  }

  // Pages of `path` the kernel's page cache holds, and its pages in all: mincore of a mapping,
  // which reads nothing.
  static std::pair<size_t, size_t> KernelResident(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {0, 1};
    struct stat st {};
    fstat(fd, &st);
    const size_t size = static_cast<size_t>(st.st_size);
    const size_t pages = (size + 4095) / 4096;
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return {0, pages};
    std::vector<unsigned char> in(pages);
    size_t resident = 0;
    if (mincore(map, size, in.data()) == 0) {
      for (unsigned char page : in) resident += page & 1;
    }
    munmap(map, size);
    return {resident, pages};
  }

  nlohmann::json StatsJson(const std::string& mount) {
    const CommandResult r = Stat({mount, "--json"});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    const nlohmann::json j = ParseJson(r.out);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    if (j.is_discarded() || j["mounts"].size() != 1) return nlohmann::json::object();
    return j["mounts"][0];
  }

  // (resident, size) summed over `path` per accelfs-stat files --json.
  std::pair<uint64_t, uint64_t> Residency(const std::string& path) {
    const CommandResult r = Stat({"files", path, "--json"});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    const nlohmann::json j = ParseJson(r.out);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    if (j.is_discarded()) return {0, 0};
    return {j.value("resident", uint64_t{0}), j.value("size", uint64_t{0})};
  }
};

TEST_F(ToolsTest, WarmMakesLaterReadsNeedNoBackend) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  EXPECT_EQ(Residency(Mnt("m")), std::make_pair(uint64_t{0}, 14 * kMiB + 4321 + 17 + 700));

  const CommandResult warm = Warm({Mnt("m")});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  EXPECT_NE(warm.out.find("warmed 3 files"), std::string::npos) << warm.out;
  EXPECT_NE(warm.out.find("100% resident"), std::string::npos) << warm.out;

  const auto [resident, size] = Residency(Mnt("m"));
  EXPECT_EQ(resident, size);
  const CommandResult files = Stat({"files", Mnt("m")});
  EXPECT_EQ(files.exit_code, 0) << Describe(files);
  EXPECT_NE(files.out.find("3 files, 14.0 MiB, 100.0% resident"), std::string::npos) << files.out;

  const nlohmann::json before = StatsJson(mountpoint_);
  const uint64_t fetched = before["cache"].value("fetched_bytes", uint64_t{0});
  EXPECT_EQ(fetched, size);
  ASSERT_NO_FATAL_FAILURE(ExpectModelReadsAsBacking());
  const nlohmann::json after = StatsJson(mountpoint_);
  EXPECT_EQ(after["cache"].value("fetched_bytes", uint64_t{0}), fetched)
      << "reads after the warm went to the backend";
  EXPECT_EQ(after.value("mountpoint", ""), mountpoint_);
  EXPECT_EQ(after.value("source", ""), CanonicalPath(source_));

  // A file held open is listed with its mode: passed through when the kernel offers passthrough
  // (the file is fully cached), else served by the daemon.
  const int fd = open(Mnt("m/model-00002-of-00002.safetensors").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const nlohmann::json held = StatsJson(mountpoint_);
  close(fd);
  ASSERT_EQ(held["open"].size(), 1u) << held.dump();
  EXPECT_EQ(held["open"][0].value("name", ""), "model-00002-of-00002.safetensors");
  EXPECT_EQ(held["open"][0].value("mode", ""),
            held.value("passthrough", false) ? "passthrough" : "cached");
  EXPECT_EQ(held.value("open_files", 0), 1);

  const CommandResult summary = Stat({mountpoint_});
  EXPECT_EQ(summary.exit_code, 0) << Describe(summary);
  EXPECT_NE(summary.out.find(mountpoint_ + " <- "), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("open files"), std::string::npos) << summary.out;
}

// Without passthrough (a mount by a user who is not root, or --no-passthrough) every read of a
// warmed file would go through the daemon: the warm also writes the files into the kernel's page
// cache, and the reads after it equal the backing bytes without one READ reaching the daemon.
TEST_F(ToolsTest, WarmWithoutPassthroughFillsThePageCache) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount({"--no-passthrough"}));
  const uint64_t let_go = FilePagesLetGo();
  const CommandResult warm = Warm({Mnt("m")});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  const uint64_t size = Residency(Mnt("m")).second;
  const nlohmann::json before = StatsJson(mountpoint_);
  EXPECT_EQ(before.value("pushed_bytes", uint64_t{0}), size) << before.dump();
  // Every page is in the kernel's page cache before anything reads it, unless the kernel let
  // pages of files go meanwhile (memory pressure in a loaded run, another test's drop_caches):
  // then the reads below still come from the daemon's cache, never the store. (The cache's hit
  // count is no measure of READs: the daemon's own look-ups, a shard's header for its tensor
  // order or the next shard's start, count as hits too, at times of their own.)
  for (const char* name : {"m/model-00001-of-00002.safetensors",
                           "m/model-00002-of-00002.safetensors", "m/config.json"}) {
    const auto [resident, pages] = KernelResident(Mnt(name));
    const uint64_t let_go_since = FilePagesLetGo() - let_go;
    if (resident != pages && let_go_since > 0) {
      std::printf("%s: %zu of %zu pages resident; the kernel let %ju file pages go meanwhile\n",
                  name, resident, pages, static_cast<uintmax_t>(let_go_since));
      continue;
    }
    EXPECT_EQ(resident, pages) << name << " (no page of a file was let go meanwhile)";
  }
  const uint64_t misses = before["cache"].value("misses", uint64_t{0});
  ASSERT_NO_FATAL_FAILURE(ExpectModelReadsAsBacking());
  // And mapped, as a loader does.
  const std::string shard = Mnt("m/model-00002-of-00002.safetensors");
  const int fd = open(shard.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const size_t shard_size = 5 * kMiB + 17;
  void* map = mmap(nullptr, shard_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  EXPECT_TRUE(std::memcmp(map, Bytes(2, 0, shard_size).data(), shard_size) == 0);
  munmap(map, shard_size);
  const nlohmann::json after = StatsJson(mountpoint_);
  EXPECT_EQ(after["cache"].value("misses", uint64_t{0}), misses) << "a block was fetched again";
  EXPECT_EQ(after["cache"].value("fetched_bytes", uint64_t{0}),
            before["cache"].value("fetched_bytes", uint64_t{1}))
      << "the store was read again";
  EXPECT_FALSE(after.value("passthrough", true));
  // Which read path, and why: in the stats and on accelfs-stat's cache line.
  EXPECT_EQ(after.value("passthrough_why", ""), "--no-passthrough") << after.dump();
  const CommandResult stat = Stat({mountpoint_});
  EXPECT_NE(stat.out.find("passthrough off (--no-passthrough)"), std::string::npos)
      << Describe(stat);

  // Rewritten in the store (same size, new bytes): the next open drops the loaded pages.
  WriteTestFile(Src("m/model-00002-of-00002.safetensors"), shard_size, 9);
  int err = 0;
  EXPECT_TRUE(ReadWholeFile(shard, &err) == Bytes(9, 0, shard_size)) << "old pages were served";
  EXPECT_EQ(err, 0);
}

TEST_F(ToolsTest, EvictDropsWhatWasWarmed) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  // A quoted glob: the tool expands it.
  const CommandResult warm = Warm({Mnt("m/*.safetensors")});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  EXPECT_EQ(Residency(Mnt("m/model-00001-of-00002.safetensors")).first, 9 * kMiB + 4321);
  EXPECT_EQ(Residency(Mnt("m/config.json")).first, 0u);
  const CommandResult evict = Warm({"--evict", Mnt("m")});
  ASSERT_EQ(evict.exit_code, 0) << Describe(evict);
  EXPECT_NE(evict.out.find("evicted 3 files"), std::string::npos) << evict.out;
  EXPECT_EQ(Residency(Mnt("m")).first, 0u);
}

// A warmed file is opened in passthrough mode, where the kernel maps the cache's own file into the
// reader, and the mapping outlives the descriptor. --evict keeps such a file (as fadvise(DONTNEED)
// keeps mapped pages) rather than turning the mapping's bytes into zeros, and drops it once the
// mapping is gone. Without passthrough the mapping holds the mount's own page cache, and the
// cache's copy may go at once: the bytes are what counts.
TEST_F(ToolsTest, EvictKeepsAFileMappedByAReaderUntilItIsUnmapped) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const std::string shard = Mnt("m/model-00001-of-00002.safetensors");
  const uint64_t size = 9 * kMiB + 4321;
  const CommandResult warm = Warm({shard});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  const int fd = open(shard.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
  close(fd);
  const std::vector<uint8_t> want = Bytes(1, 0, size);

  const CommandResult kept = Warm({"--evict", shard});
  ASSERT_EQ(kept.exit_code, 0) << Describe(kept);
  EXPECT_EQ(std::memcmp(map, want.data(), size), 0) << "an evict changed a mapped file's bytes";
  if (StatsJson(mountpoint_).value("passthrough", false)) {
    EXPECT_EQ(Residency(shard).first, size) << "a file mapped by a reader stays cached";
  }
  munmap(map, size);

  const CommandResult evict = Warm({"--evict", shard});
  ASSERT_EQ(evict.exit_code, 0) << Describe(evict);
  EXPECT_EQ(Residency(shard).first, 0u) << "unmapped, it goes";
  int error = 0;
  EXPECT_TRUE(ReadWholeFile(shard, &error) == want) << std::strerror(error);
}

TEST_F(ToolsTest, JsonOutputsParse) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const CommandResult warm = Warm({"--json", Mnt("m")});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  std::istringstream lines(warm.out);
  std::string line;
  nlohmann::json last;
  int count = 0;
  while (std::getline(lines, line)) {
    last = ParseJson(line);
    ASSERT_FALSE(last.is_discarded()) << line;
    ++count;
  }
  EXPECT_GE(count, 2);
  EXPECT_TRUE(last.value("done", false)) << warm.out;
  EXPECT_TRUE(last.value("ok", false)) << warm.out;
  EXPECT_EQ(last["progress"].value("files_total", 0), 3);
  EXPECT_EQ(last["progress"].value("bytes_done", uint64_t{0}),
            last["progress"].value("bytes_total", uint64_t{1}));

  // Every mount on the machine: other tests' mounts (without a control socket, or going away)
  // may make it exit 1; ours must be there.
  const CommandResult stat = Stat({"--json"});
  const nlohmann::json all = ParseJson(stat.out);
  ASSERT_FALSE(all.is_discarded()) << stat.out;
  bool found = false;
  for (const auto& m : all["mounts"]) found = found || m.value("mountpoint", "") == mountpoint_;
  EXPECT_TRUE(found) << stat.out;
  const CommandResult evict = Warm({"--json", "--evict", Mnt("m/config.json")});
  ASSERT_EQ(evict.exit_code, 0) << Describe(evict);
  EXPECT_EQ(ParseJson(evict.out).value("files", 0), 1) << evict.out;
}

TEST_F(ToolsTest, NoWaitThenWaitAttachesOrFindsItDone) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const CommandResult start = Warm({"--no-wait", Mnt("m")});
  ASSERT_EQ(start.exit_code, 0) << Describe(start);
  EXPECT_NE(start.out.find("in the background"), std::string::npos) << start.out;
  const CommandResult wait = Warm({"--wait", Mnt("m")});
  ASSERT_EQ(wait.exit_code, 0) << Describe(wait);
  const auto [resident, size] = Residency(Mnt("m"));
  EXPECT_EQ(resident, size);
}

TEST_F(ToolsTest, ASetLargerThanTheCacheIsRefused) {
  WriteTestFile(Src("big"), 2 * kMiB, 1);
  ASSERT_NO_FATAL_FAILURE(StartMount({"--block-size", "64K", "--cache-size", "1M"}));
  const CommandResult warm = Warm({Mnt("big")});
  EXPECT_EQ(warm.exit_code, 1) << Describe(warm);
  EXPECT_NE(warm.err.find("does not fit in the cache: the set needs 2.0 MiB but the cache budget "
                          "is 1.0 MiB (1.0 MiB missing"),
            std::string::npos)
      << warm.err;
  EXPECT_EQ(std::count(warm.err.begin(), warm.err.end(), '\n'), 1) << warm.err;
  EXPECT_EQ(StatsJson(mountpoint_)["cache"].value("fetched_bytes", uint64_t{1}), 0u);
}

TEST_F(ToolsTest, PathsOutsideTheMountAreRefused) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_EQ(symlink("/etc", Src("escape").c_str()), 0);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const struct {
    std::string path;
    std::string error;
  } kCases[] = {
      {"/etc/passwd", "'/etc/passwd' is not inside an accelfs mount"},
      {Mnt("../src/m"), "'../src/m': leaves the mount"},
      {Mnt("m/../../src"), "'m/../../src': leaves the mount"},
      {Mnt("escape/passwd"), "'escape/passwd': leaves the mount"},
      {Mnt("missing"), "'missing': no such file or directory"},
  };
  for (const auto& c : kCases) {
    for (const char* flag : {"--wait", "--evict"}) {
      const CommandResult r = Warm({flag, c.path});
      EXPECT_EQ(r.exit_code, 1) << c.path << " " << Describe(r);
      EXPECT_NE(r.err.find(c.error), std::string::npos) << c.path << " " << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
  }
  EXPECT_EQ(StatsJson(mountpoint_)["cache"].value("fetched_bytes", uint64_t{1}), 0u);
}

TEST_F(ToolsTest, AnotherUserIsDeniedTheSocket) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  for (const auto& r : {AsNobody(TestBinary(ACCELFS_STAT), {mountpoint_}, "65534", ""),
                        AsNobody(TestBinary(ACCELFS_WARM), {Mnt("m")}, "65534", "")}) {
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    EXPECT_NE(r.err.find("permission denied on the control socket"), std::string::npos) << r.err;
  }
  EXPECT_EQ(Residency(Mnt("m")).first, 0u);
}

TEST_F(ToolsTest, TheControlGroupReadsStatsAndOnlyMembersWarm) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  // nogroup (65534) is nobody's group in /etc/group.
  ASSERT_NO_FATAL_FAILURE(StartMount({"--control-group", "nogroup"}));
  const CommandResult stat = AsNobody(TestBinary(ACCELFS_STAT), {mountpoint_}, "65534", "");
  EXPECT_EQ(stat.exit_code, 0) << Describe(stat);
  EXPECT_NE(stat.out.find(mountpoint_ + " <- "), std::string::npos) << stat.out;
  const CommandResult warm = AsNobody(TestBinary(ACCELFS_WARM), {Mnt("m")}, "65534", "");
  EXPECT_EQ(warm.exit_code, 0) << Describe(warm);
  EXPECT_EQ(Residency(Mnt("m")).first, Residency(Mnt("m")).second);
}

TEST_F(ToolsTest, ConnectingIsNotEnoughToWarm) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  // The socket is daemon's (gid 1); nobody gets that group for its process only, not by
  // /etc/group: it may connect and read stats, but SO_PEERCRED says it may not warm.
  ASSERT_NO_FATAL_FAILURE(StartMount({"--control-group", "daemon"}));
  const CommandResult stat = AsNobody(TestBinary(ACCELFS_STAT), {mountpoint_}, "65534", "1");
  EXPECT_EQ(stat.exit_code, 0) << Describe(stat);
  for (const char* flag : {"--wait", "--evict"}) {
    const CommandResult warm = AsNobody(TestBinary(ACCELFS_WARM), {flag, Mnt("m")}, "65534", "1");
    EXPECT_EQ(warm.exit_code, 1) << Describe(warm);
    EXPECT_NE(warm.err.find("permission denied: '"), std::string::npos) << warm.err;
  }
  EXPECT_EQ(Residency(Mnt("m")).first, 0u);
}

TEST_F(ToolsTest, TwoMountsEachTheirOwnSocket) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  const std::string source2 = dir_ / "src2";
  const std::string mount2 = dir_ / "mnt2";
  ASSERT_EQ(mkdir(source2.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(mount2.c_str(), 0755), 0);
  WriteTestFile(source2 + "/other", 3 * kMiB, 9);
  ASSERT_NO_FATAL_FAILURE(StartMount());
  AccelfsProcess second;
  ASSERT_TRUE(second.Start(source2, mount2, dir_ / "accelfs2.log"));
  const std::string canonical2 = CanonicalPath(mount2);
  struct stat st {};
  EXPECT_EQ(stat(("/run/accelfs/" + ControlSocketName(mountpoint_)).c_str(), &st), 0);
  EXPECT_EQ(stat(("/run/accelfs/" + ControlSocketName(canonical2)).c_str(), &st), 0);

  const CommandResult warm = Warm({canonical2 + "/other"});
  ASSERT_EQ(warm.exit_code, 0) << Describe(warm);
  EXPECT_EQ(Residency(canonical2).first, 3 * kMiB);
  EXPECT_EQ(Residency(mountpoint_).first, 0u);
  EXPECT_EQ(StatsJson(mountpoint_)["cache"].value("fetched_bytes", uint64_t{1}), 0u);
  EXPECT_EQ(StatsJson(canonical2).value("source", ""), CanonicalPath(source2));

  const CommandResult all = Stat({});  // exit 1 when another test's mount has no daemon
  EXPECT_NE(all.out.find(mountpoint_ + " <- "), std::string::npos) << all.out;
  EXPECT_NE(all.out.find(canonical2 + " <- "), std::string::npos) << all.out;
  EXPECT_EQ(second.Stop(), 0) << second.Log();
}

TEST_F(ToolsTest, ADeadDaemonIsSaidToBeNotRunningAndARemountWorks) {
  ASSERT_NO_FATAL_FAILURE(MakeModel());
  ASSERT_NO_FATAL_FAILURE(StartMount());
  ASSERT_EQ(kill(daemon_.pid(), SIGKILL), 0);
  int status = 0;
  ASSERT_TRUE(daemon_.Wait(kExitWait, &status));
  for (const auto& r :
       {Stat({mountpoint_}), Stat({}), Warm({Mnt("m")}), Stat({"files", Mnt("m")})}) {
    EXPECT_EQ(r.exit_code, 1) << Describe(r);
    EXPECT_NE(r.err.find("daemon of " + mountpoint_ + " is not running"), std::string::npos)
        << r.err;
  }
  // The stale socket does not stop the next daemon.
  ASSERT_TRUE(UnmountAll(mountpoint_));
  ASSERT_NO_FATAL_FAILURE(StartMount());
  const CommandResult stat = Stat({mountpoint_});
  EXPECT_EQ(stat.exit_code, 0) << Describe(stat);
}

TEST_F(ToolsTest, StaleSocketsOfKilledDaemonsAreSweptAtStart) {
  // A socket nobody listens on, as a daemon killed with SIGKILL leaves behind.
  ASSERT_EQ(mkdir("/run/accelfs", 0755) == 0 || errno == EEXIST, true);
  const std::string stale = "/run/accelfs/accelfs-tools-test-" + std::to_string(getpid()) + ".sock";
  MakeSocketFile(stale);
  struct stat st {};
  ASSERT_EQ(stat(stale.c_str(), &st), 0);
  ASSERT_NO_FATAL_FAILURE(StartMount());  // the daemon sweeps before it mounts
  EXPECT_NE(stat(stale.c_str(), &st), 0) << stale << " was not swept";
  unlink(stale.c_str());
  // The live daemon's own socket stays.
  EXPECT_EQ(stat(("/run/accelfs/" + ControlSocketName(mountpoint_)).c_str(), &st), 0);
}

TEST_F(ToolsTest, AnUnknownControlGroupIsRefusedAtStart) {
  const CommandResult r =
      RunAccelfs({source_, mountpoint_, "-f", "--control-group", "no-such-group-accelfs"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_EQ(r.err, "accelfs: --control-group 'no-such-group-accelfs': no such group\n");
  EXPECT_FALSE(IsMounted(mountpoint_));
}

TEST_F(ToolsTest, HelpAndUsageErrors) {
  for (const char* tool : {TestBinary(ACCELFS_WARM), TestBinary(ACCELFS_STAT)}) {
    const CommandResult help = RunCommand({tool, "--help"});
    EXPECT_EQ(help.exit_code, 0) << Describe(help);
    EXPECT_NE(help.out.find("Usage"), std::string::npos) << help.out;
    const CommandResult bad = RunCommand({tool, "--bogus"});
    EXPECT_EQ(bad.exit_code, 2) << Describe(bad);
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  }
  const CommandResult none = Warm({});
  EXPECT_EQ(none.exit_code, 2) << Describe(none);
  const CommandResult both = Warm({"--wait", "--no-wait", "x"});
  EXPECT_EQ(both.exit_code, 2) << Describe(both);
  const CommandResult watch = Stat({"--watch", "0"});
  EXPECT_EQ(watch.exit_code, 2) << Describe(watch);
  const CommandResult glob = Warm({"/nonexistent-accelfs-dir/*.safetensors"});
  EXPECT_EQ(glob.exit_code, 1) << Describe(glob);
  EXPECT_NE(glob.err.find("no match"), std::string::npos) << glob.err;
}

}  // namespace
}  // namespace accelfs::testing
