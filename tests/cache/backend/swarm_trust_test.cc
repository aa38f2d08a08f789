// SwarmTrust: the fleet's files checked at start (each wrong one named), and manifests that open
// only where a node of the fleet signed them for that chunk. Certificates are made by `openssl`
// as docs/FLEET.md says.
#include "cache/backend/swarm_trust.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/support/fleet_certs.h"
#include "tests/support/test_data.h"

namespace accelfs::testing {
namespace {

class SwarmTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(mkdir(fleet_dir_.c_str(), 0700), 0);
    ASSERT_EQ(mkdir(other_dir_.c_str(), 0700), 0);
    ASSERT_EQ(MakeCa(fleet_dir_, ca_), "");
    ASSERT_EQ(MakeNode(fleet_dir_, ca_, "a", "accelfs", a_), "");
    ASSERT_EQ(MakeNode(fleet_dir_, ca_, "b", "accelfs", b_), "");
    FleetCerts other_ca;
    ASSERT_EQ(MakeCa(other_dir_, other_ca), "");
    ASSERT_EQ(MakeNode(other_dir_, other_ca, "x", "accelfs", outsider_), "");
  }

  static std::shared_ptr<const SwarmTrust> Load(const FleetCerts& c) {
    Result<std::shared_ptr<const SwarmTrust>> t = SwarmTrust::Load(c.ca, c.cert, c.key);
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().Message());
    return t.ok() ? t.value() : nullptr;
  }
  static std::string LoadError(const std::string& ca, const std::string& cert,
                               const std::string& key) {
    Result<std::shared_ptr<const SwarmTrust>> t = SwarmTrust::Load(ca, cert, key);
    return t.ok() ? "loaded" : t.error().Message();
  }

  TempDir dir_{"accelfs-trust"};
  const std::string fleet_dir_ = dir_ / "fleet";
  const std::string other_dir_ = dir_ / "other";
  FleetCerts ca_, a_, b_, outsider_;
};

TEST_F(SwarmTrustTest, LoadsTheFleetsFilesAndNamesTheOneThatIsWrong) {
  ASSERT_TRUE(Load(a_));
  const std::string error = LoadError(a_.ca, outsider_.cert, outsider_.key);
  EXPECT_NE(error.find("--swarm-cert " + outsider_.cert + ": not signed by --swarm-ca"),
            std::string::npos)
      << error;
  EXPECT_NE(LoadError(a_.ca, a_.cert, b_.key).find("--swarm-key " + b_.key + ": not the key of"),
            std::string::npos);
  EXPECT_NE(LoadError(dir_ / "none.pem", a_.cert, a_.key).find("No such file"), std::string::npos);
  EXPECT_NE(LoadError(a_.ca, a_.cert, fleet_dir_).find("not a regular file"), std::string::npos);
  EXPECT_NE(LoadError(a_.ca, a_.key, a_.key).find("--swarm-cert " + a_.key + ": not a PEM"),
            std::string::npos);
  EXPECT_NE(LoadError(a_.ca, a_.cert, a_.cert).find("--swarm-key " + a_.cert + ": not a PEM"),
            std::string::npos);
  // A key with a pass phrase: refused at once, never a prompt on a terminal.
  ASSERT_EQ(OpenSsl(fleet_dir_, "pkey -in a.key -aes256 -passout pass:secret -out locked.key"), "");
  EXPECT_NE(LoadError(a_.ca, a_.cert, fleet_dir_ + "/locked.key").find("pass phrase"),
            std::string::npos);
  // Signed by the fleet's CA but named otherwise: its peers' libtorrent would refuse it.
  FleetCerts misnamed;
  ASSERT_EQ(MakeNode(fleet_dir_, ca_, "n", "node7.example", misnamed), "");
  EXPECT_NE(LoadError(misnamed.ca, misnamed.cert, misnamed.key)
                .find("its names do not include \"accelfs\""),
            std::string::npos);
  FleetCerts star;
  ASSERT_EQ(MakeNode(fleet_dir_, ca_, "s", "*", star), "");
  EXPECT_TRUE(Load(star));
}

TEST_F(SwarmTrustTest, AManifestOpensOnlyWhereTheFleetSignedItForThatChunk) {
  const auto a = Load(a_);
  const auto b = Load(b_);
  const auto x = Load(outsider_);
  ASSERT_TRUE(a && b && x);
  const std::vector<char> torrent = {'d', '4', ':', 'i', 'n', 'f', 'o', 'd', 'e', 'e'};
  const Result<std::vector<char>> sealed = a->Seal("FILEID/3", torrent);
  ASSERT_TRUE(sealed.ok()) << sealed.error().Message();

  // Another node of the fleet opens it.
  const Result<std::vector<char>> opened = b->Open("FILEID/3", *sealed);
  ASSERT_TRUE(opened.ok()) << opened.error().Message();
  EXPECT_EQ(*opened, torrent);
  // Not as another chunk's.
  EXPECT_FALSE(b->Open("FILEID/4", *sealed).ok());
  // A node of another fleet does not take it, nor the fleet one of the other's.
  EXPECT_FALSE(x->Open("FILEID/3", *sealed).ok());
  const Result<std::vector<char>> foreign = x->Seal("FILEID/3", torrent);
  ASSERT_TRUE(foreign.ok());
  const Result<std::vector<char>> refused = b->Open("FILEID/3", *foreign);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().Message().find("not the fleet's"), std::string::npos)
      << refused.error().Message();
  // A plain torrent, as a node without --swarm-cert (or anyone) writes it.
  EXPECT_NE(b->Open("FILEID/3", torrent).error().Message().find("not a signed manifest"),
            std::string::npos);

  // Any byte changed, any length cut: never opened, never a crash.
  const uint64_t seed = std::random_device{}();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 random(seed);
  for (size_t i = 0; i < sealed->size(); ++i) {
    std::vector<char> changed = *sealed;
    changed[i] = static_cast<char>(changed[i] ^ (1 + random() % 255));
    EXPECT_FALSE(b->Open("FILEID/3", changed).ok()) << "byte " << i << " changed";
    const std::vector<char> cut(sealed->begin(), sealed->begin() + static_cast<std::ptrdiff_t>(i));
    EXPECT_FALSE(b->Open("FILEID/3", cut).ok()) << "cut at " << i;
  }
}

}  // namespace
}  // namespace accelfs::testing
