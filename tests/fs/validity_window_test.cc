// The validity window's table (fs/validity_window.h): a check is trusted by place while the window
// lasts and the attributes agree, and forgotten once they do not.
#include "fs/validity_window.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace accelfs {
namespace {

using namespace std::chrono_literals;
using Clock = ValidityWindow::Clock;

struct stat Attrs(off_t size, time_t mtime, time_t ctime, nlink_t links = 1) {
  struct stat st {};
  st.st_size = size;
  st.st_mtim.tv_sec = mtime;
  st.st_ctim.tv_sec = ctime;
  st.st_nlink = links;
  return st;
}

FileKey KeyOf(const struct stat& st, const char* path, uint64_t fingerprint = 7) {
  return FileKeyFromStat(st, fingerprint, PlaceOfPath(path));
}

TEST(ValidityWindowTest, ACheckIsTrustedByPlaceUntilTheWindowEnds) {
  ValidityWindow window(10s);
  const struct stat st = Attrs(100, 5, 6);
  const FileKey key = KeyOf(st, "m/a");
  const Clock::time_point t0 = Clock::now();
  window.Note(key, t0);
  EXPECT_TRUE(window.Holds(PlaceOfPath("m/a"), t0 + 9s));
  EXPECT_FALSE(window.Holds(PlaceOfPath("m/a"), t0 + 10s));
  EXPECT_FALSE(window.Holds(PlaceOfPath("m/b"), t0 + 1s));
  EXPECT_EQ(window.Find(PlaceOfPath("m/a"), st, t0 + 9s), key);
  EXPECT_FALSE(window.Find(PlaceOfPath("m/b"), st, t0 + 1s)) << "another place";
  EXPECT_FALSE(window.Find(PlaceOfPath("m/a"), st, t0 + 10s)) << "the window has passed";
  EXPECT_FALSE(window.Find(PlaceOfPath("m/a"), st, t0 + 1s)) << "and the check is gone";
  window.Note(key, t0 + 20s);  // a new check
  EXPECT_EQ(window.Find(PlaceOfPath("m/a"), st, t0 + 21s), key);
}

TEST(ValidityWindowTest, OtherAttributesOrNoLinkEndTheWindowAtOnce) {
  ValidityWindow window(1h);
  const struct stat st = Attrs(100, 5, 6);
  const Place place = PlaceOfPath("a");
  for (const struct stat& other :
       {Attrs(101, 5, 6), Attrs(100, 8, 6), Attrs(100, 5, 9), Attrs(100, 5, 6, 0)}) {
    window.Note(KeyOf(st, "a"), Clock::now());
    EXPECT_FALSE(window.Find(place, other));
    EXPECT_FALSE(window.Find(place, st)) << "forgotten";
  }
  window.Note(KeyOf(st, "a"), Clock::now());
  window.ForgetUnless(place, st);  // what the check saw: kept
  EXPECT_TRUE(window.Find(place, st));
  window.ForgetUnless(place, Attrs(100, 5, 7));  // a LOOKUP that shows a change
  EXPECT_FALSE(window.Find(place, st));
}

TEST(ValidityWindowTest, NoWindowTrustsNothingAndKeepsNothing) {
  ValidityWindow window(0s);
  const struct stat st = Attrs(1, 1, 1);
  window.Note(KeyOf(st, "a"), Clock::now());
  EXPECT_FALSE(window.enabled());
  EXPECT_FALSE(window.Find(PlaceOfPath("a"), st));
  EXPECT_EQ(window.size(), 0u);
}

TEST(ValidityWindowTest, ChecksTheWindowHasPassedAreSwept) {
  ValidityWindow window(1ms);
  const Clock::time_point long_ago = Clock::now() - 1h;
  for (int i = 0; i < 5000; ++i) {
    const struct stat st = Attrs(i, 1, 1);
    window.Note(KeyOf(st, ("f" + std::to_string(i)).c_str()), long_ago);
  }
  EXPECT_LT(window.size(), 2048u) << "the table keeps only what a window could trust";
}

TEST(ValidityWindowTest, TheTableIsBoundedWhateverIsOpened) {
  ValidityWindow window(1h);
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < ValidityWindow::kMaxChecks + 10; ++i) {
    const struct stat st = Attrs(static_cast<off_t>(i), 1, 1);
    window.Note(KeyOf(st, ("f" + std::to_string(i)).c_str()), now);
  }
  EXPECT_LE(window.size(), ValidityWindow::kMaxChecks);
}

}  // namespace
}  // namespace accelfs
