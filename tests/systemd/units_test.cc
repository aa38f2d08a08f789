// systemd-analyze verify on the units as installed (ExecStart in the install's bin directory),
// with that directory replaced by one holding the built binaries, since verify checks that
// every ExecStart is executable. Skips, saying so, where systemd-analyze is missing.
//
// verify searches only our directory and a mirror of the system's unit directories that leaves
// out every accelfs unit (and drop-in) installed there, so that an installed copy (from
// `tools/setup.sh mount`, say) neither stands in for the unit under test nor for one a test
// removes on purpose.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/mount/mount_fixture.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size())
    text.replace(at, from.size(), to);
  return text;
}

class UnitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunCommand({"systemd-analyze", "--version"}).exit_code != 0)
      GTEST_SKIP() << "systemd-analyze is not installed here: units not verified";
    bin_ = dir_ / "bin";
    units_ = dir_ / "units";
    std::filesystem::create_directories(bin_);
    std::filesystem::create_directories(units_);
    MirrorSystemUnits();
    std::filesystem::create_symlink(ACCELFS_BINARY, bin_ + "/accelfs");
    std::filesystem::create_symlink(ACCELFS_WARM_BINARY, bin_ + "/accelfs-warm");
    for (const char* unit : {"accelfs@.service", "accelfs-warm@.service"}) {
      const std::string text = ReadText(std::string(ACCELFS_UNITS_DIR) + "/" + unit);
      ASSERT_NE(text.find(std::string("ExecStart=") + ACCELFS_INSTALL_BINDIR + "/accelfs"),
                std::string::npos)
          << unit << " does not run the installed binary:\n"
          << text;
      WriteText(units_ + "/" + unit, Replaced(text, ACCELFS_INSTALL_BINDIR, bin_));
    }
  }

  // Links, in system_, every entry of the system's unit directories (the first of a name wins,
  // as in systemd's own search) but those named accelfs*.
  void MirrorSystemUnits() {
    system_ = dir_ / "system";
    std::filesystem::create_directories(system_);
    const CommandResult paths = RunCommand({"systemd-analyze", "unit-paths"});
    ASSERT_EQ(paths.exit_code, 0) << paths.err;
    std::istringstream lines(paths.out);
    for (std::string path; std::getline(lines, path);) {
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
        const std::string name = entry.path().filename();
        if (name.starts_with("accelfs")) continue;
        std::filesystem::create_symlink(entry.path(), system_ + "/" + name, ec);
      }
    }
  }

  // systemd-analyze verify UNIT... over our units and the mirror.
  CommandResult Verify(const std::vector<std::string>& units,
                       const std::vector<std::string>& opts) {
    std::vector<std::string> argv = {"env", "SYSTEMD_UNIT_PATH=" + units_ + ":" + system_,
                                     "systemd-analyze", "verify"};
    argv.insert(argv.end(), opts.begin(), opts.end());
    argv.insert(argv.end(), units.begin(), units.end());
    return RunCommand(argv, std::chrono::seconds(60));
  }

  // Fails on any complaint about our units (verify exits 0 on mere warnings such as an unknown
  // key).
  void ExpectClean(const std::vector<std::string>& units) {
    const CommandResult r = Verify(units, {"--man=no"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    std::istringstream lines(r.out + r.err);
    for (std::string line; std::getline(lines, line);) {
      EXPECT_EQ(line.find("accelfs"), std::string::npos) << line;
      EXPECT_EQ(line.find("llm"), std::string::npos) << line;
    }
  }

  TempDir dir_{"accelfs-units"};
  std::string bin_;
  std::string units_;
  std::string system_;
};

TEST_F(UnitsTest, TemplatesAndInstancesVerify) {
  ExpectClean({units_ + "/accelfs@.service", units_ + "/accelfs-warm@.service"});
  // An instance, as `systemctl start accelfs-warm@models` loads it (and accelfs@models with it).
  std::filesystem::copy_file(units_ + "/accelfs-warm@.service",
                             units_ + "/accelfs-warm@models.service");
  ExpectClean({units_ + "/accelfs-warm@models.service"});
}

TEST_F(UnitsTest, ServerDropInPullsInTheMountAndTheWarmUp) {
  // A stand-in model server with the example drop-in.
  WriteText(units_ + "/llm.service", "[Service]\nExecStart=/bin/true\n");
  std::filesystem::create_directories(units_ + "/llm.service.d");
  std::filesystem::copy_file(std::string(ACCELFS_SOURCE_DIR) + "/systemd/llm-server.conf.example",
                             units_ + "/llm.service.d/accelfs.conf");
  ExpectClean({"llm.service"});
  // Without the warm unit the drop-in's dependency cannot load: verify does check it.
  std::filesystem::remove(units_ + "/accelfs-warm@.service");
  const CommandResult r = Verify({"llm.service"}, {});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("accelfs-warm@models.service"), std::string::npos) << r.err;
}

TEST_F(UnitsTest, ExampleConfigNamesEveryVariableTheUnitsUse) {
  const std::string conf =
      ReadText(std::string(ACCELFS_SOURCE_DIR) + "/systemd/accelfs.conf.example");
  for (const char* var : {"ACCELFS_SOURCE=", "ACCELFS_MOUNTPOINT=", "ACCELFS_OPTIONS=",
                          "ACCELFS_WARM=", "ACCELFS_WARM_OPTIONS="}) {
    EXPECT_NE(conf.find(std::string("\n") + var), std::string::npos) << var;
  }
}

}  // namespace
}  // namespace accelfs::testing
