// The directory every node of a fleet shares (--swarm-dir): who reads a chunk from the store, and
// the chunk's torrent once it was read (cache/backend/swarm_reader.h says how they are used).
//   DIR/FILEID/INDEX.claim    created O_EXCL by the node that reads the chunk from the store; its
//                             mtime, refreshed, says that a node holds the chunk (a lease)
//   DIR/FILEID/INDEX.torrent  the chunk's piece hashes, renamed in whole
// Every call is a system call or two on the shared file system (on NFS, a round trip each).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/file_key.h"

namespace accelfs {

class SwarmDir {
 public:
  using Clock = std::chrono::steady_clock;

  // `who`, written into each claim this node takes, names it for a person reading the dir.
  SwarmDir(std::string dir, std::chrono::milliseconds stale_claim, std::string who)
      : dir_(std::move(dir)), stale_(stale_claim), who_(std::move(who)) {}

  // A stable name for the bytes of `key` cut into pieces and chunks of these sizes: the same on
  // every node and in every build.
  static std::string FileId(const FileKey& key, uint32_t piece_bytes, uint32_t chunk_pieces);
  // The paths of chunk `index` of FILEID; makes DIR/FILEID when it is not there.
  std::string Claim(const std::string& file_id, uint64_t index) const;
  std::string Torrent(const std::string& file_id, uint64_t index) const;
  void MakeFileDir(const std::string& file_id) const;

  // How long ago the claim was last said to be held (its mtime); nothing when there is none.
  static std::optional<Clock::duration> ClaimAge(const std::string& claim);
  bool Live(const std::optional<Clock::duration>& age) const { return age && *age < stale_; }
  // Moves a stale claim out of the way; false when it is gone or live again.
  bool RetireStaleClaim(const std::string& claim) const;
  // Creates the claim (O_EXCL: one node only); false and errno when it cannot (EEXIST: another
  // node's).
  bool TakeClaim(const std::string& claim) const;
  // Says this node holds the claim, every quarter of stale_claim; `refreshed` is when it last did.
  void RefreshClaim(const std::string& claim, Clock::time_point now,
                    Clock::time_point& refreshed) const;

  static bool Exists(const std::string& path);
  // The whole torrent; false and errno when it cannot be read.
  static bool Read(const std::string& torrent, std::vector<char>& bytes);
  // Writes the torrent whole (a file of this node's, renamed in); false and errno on failure.
  static bool Write(const std::string& torrent, const std::vector<char>& bytes);

 private:
  const std::string dir_;
  const std::chrono::milliseconds stale_;
  const std::string who_;
};

}  // namespace accelfs
