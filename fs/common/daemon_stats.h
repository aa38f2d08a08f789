// One snapshot of what the daemon is doing: what accelfs-stat shows and /metrics exports. The
// daemon builds it on request (fs/daemon/daemon_serve.cc wires the sources); nothing here is on the
// read path.
//
// kStatsFields below is the stats schema: one row per number, with its key in the stats JSON
// (docs/CONTROL.md), its Prometheus metric (docs/METRICS.md) and its help. DaemonStatsToJson
// (fs/common/control_protocol.cc), DaemonStatsFromJson (accelfs-stat's reading of it) and the
// metrics (fs/control/metrics.cc) all walk it; tests/fs/common/daemon_stats_test.cc checks that
// they and the docs agree. A new number: a field here and a row in kStatsFields.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include <nlohmann/json_fwd.hpp>

#include "cache/cache_stats.h"
#include "cache/latency_histogram.h"

namespace accelfs {

struct DaemonStats {
  std::string source;      // SOURCE, as resolved at start
  std::string mountpoint;  // MOUNTPOINT, as resolved at start
  // Where cached blocks live: "private tmpfs", "cache dir DIR" or "anonymous memory".
  std::string store;
  bool passthrough = false;  // whether fully cached files are passed through to the store
  // Why passthrough is on or off: the kernel's release, --no-passthrough, not root, ...
  std::string passthrough_why;
  double uptime_s = 0;

  CacheStats cache;          // budget, used, hits/misses (count and bytes), fetched, in flight...
  uint32_t depth = 0;        // store reads the adaptive depth allows now
  uint32_t depth_limit = 0;  // --store-depth
  uint64_t stuck_requests = 0;      // store reads in flight past --store-timeout (lost slots)
  uint64_t timed_out_requests = 0;  // store reads given up on since start
  uint64_t waiting_requests = 0;    // store reads held back: their file has its share in flight
  uint64_t open_files = 0;          // file handles open (cached or passthrough)
  uint64_t passthrough_files = 0;   // of them, open in passthrough mode
  uint64_t filling_opens = 0;       // opens waiting for their file to be cached (fill on open)
  uint64_t trusted_opens = 0;       // opens answered within the validity window (--revalidate)
  uint64_t pushed_bytes = 0;  // bytes written into the kernel page cache (--push, warmed files)
  // Calls into SOURCE's filesystem (lookups, opens, listings, stats) in progress now, and how long
  // the oldest has waited: a store that stopped answering shows here.
  uint64_t store_calls = 0;
  double oldest_store_call_s = 0;
  // The fleet (--swarm-listen): 0 everywhere when the swarm is off.
  uint64_t swarm_on = 0;                  // 1 when the daemon is in a swarm
  uint64_t swarm_store_bytes = 0;         // read from SOURCE, through the swarm's reader
  uint64_t swarm_peer_bytes = 0;          // got from peers, hash checked
  uint64_t swarm_sent_bytes = 0;          // sent to peers
  uint64_t swarm_peers = 0;               // peer connections now
  uint64_t swarm_fallbacks = 0;           // reads that waited on peers in vain, then read SOURCE
  uint64_t swarm_hash_failures = 0;       // pieces from peers that failed their hash check
  uint64_t swarm_hedges = 0;              // reads sent to SOURCE: it answers sooner than peers
  uint64_t swarm_chunks_claimed = 0;      // chunks this node read from SOURCE for the fleet
  uint64_t swarm_chunks_joined = 0;       // chunks this node took from the swarm
  uint64_t swarm_manifests_rejected = 0;  // torrents in the dir not signed by the fleet

  // Histograms, exported as metrics only (not in the stats JSON): how long opens waited for their
  // file to be cached (fill on open), and streamed files' cold loads, from the stream's start to
  // the whole file in the cache.
  LatencyHistogram::Counts open_waits;
  LatencyHistogram::Counts cold_loads;
};

using StatsSource = std::function<DaemonStats()>;

// The stats JSON's keys that are not numbers, and the object the CacheStats rows live in.
inline constexpr std::string_view kStatsSourceKey = "source";
inline constexpr std::string_view kStatsMountpointKey = "mountpoint";
inline constexpr std::string_view kStatsStoreKey = "store";
inline constexpr std::string_view kStatsPassthroughKey = "passthrough";
inline constexpr std::string_view kStatsPassthroughWhyKey = "passthrough_why";
inline constexpr std::string_view kStatsCacheKey = "cache";

// Where a row's key is in the stats JSON: at the top, or in the "cache" object (the CacheStats
// fields; a row's section follows from its field, so it cannot be put in the wrong one).
enum class StatSection : uint8_t { kTop, kCache };
// A counter only grows while the daemon runs (its metric name ends in _total); a gauge is a level.
enum class StatKind : uint8_t { kGauge, kCounter };
// What the number counts. kCount: reads, fetches, files, opens.
enum class StatUnit : uint8_t { kBytes, kBlocks, kSeconds, kCount };

// A field's value: integer fields as uint64_t, uptime_s as double (the JSON keeps the distinction).
using StatValue = std::variant<uint64_t, double>;

struct StatField {
  StatSection section;
  std::string_view key;  // in the stats JSON, within `section`
  StatKind kind;
  StatUnit unit;
  std::string_view metric;  // the Prometheus metric; empty: the JSON only
  std::string_view help;    // the metric's HELP text (for a JSON-only row, what it means)
  StatValue (*get)(const DaemonStats&);
  void (*set)(DaemonStats&, StatValue);  // converts to the field's type
};

namespace stats_internal {

template <typename>
struct MemberOf;
template <typename C, typename T>
struct MemberOf<T C::*> {
  using Class = C;
  using Type = T;
};

template <auto M, typename S>  // S: DaemonStats or const DaemonStats
constexpr auto& FieldIn(S& s) {
  if constexpr (std::is_same_v<typename MemberOf<decltype(M)>::Class, CacheStats>) {
    return s.cache.*M;
  } else {
    return s.*M;
  }
}

template <auto M>
StatValue Get(const DaemonStats& s) {
  using T = typename MemberOf<decltype(M)>::Type;
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(FieldIn<M>(s));
  } else {
    return static_cast<uint64_t>(FieldIn<M>(s));
  }
}

template <auto M>
void Set(DaemonStats& s, StatValue v) {
  using T = typename MemberOf<decltype(M)>::Type;
  FieldIn<M>(s) = std::visit([](auto x) { return static_cast<T>(x); }, v);
}

// One row for the field M (&DaemonStats::depth, &CacheStats::hits).
template <auto M>
constexpr StatField Row(std::string_view key, StatKind kind, StatUnit unit, std::string_view metric,
                        std::string_view help) {
  using Member = MemberOf<decltype(M)>;
  static_assert(std::is_same_v<typename Member::Class, DaemonStats> ||
                std::is_same_v<typename Member::Class, CacheStats>);
  static_assert(std::is_arithmetic_v<typename Member::Type> &&
                !std::is_same_v<typename Member::Type, bool>);
  const StatSection section =
      std::is_same_v<typename Member::Class, CacheStats> ? StatSection::kCache : StatSection::kTop;
  return {section, key, kind, unit, metric, help, &Get<M>, &Set<M>};
}

}  // namespace stats_internal

// Every number of DaemonStats, in the order /metrics lists them (the JSON's keys are sorted).
inline constexpr std::array kStatsFields = [] {
  using enum StatKind;
  using enum StatUnit;
  using stats_internal::Row;
  using C = CacheStats;
  using D = DaemonStats;
  return std::array{
      Row<&C::budget_bytes>("budget_bytes", kGauge, kBytes, "accelfs_cache_budget_bytes",
                            "Cache budget (--cache-size)."),
      Row<&C::used_bytes>("used_bytes", kGauge, kBytes, "accelfs_cache_used_bytes",
                          "Bytes of cache blocks held: ready, in flight and pinned."),
      Row<&C::pinned_bytes>("pinned_bytes", kGauge, kBytes, "",
                            "Of them, bytes of blocks held by a reply or a passthrough file."),
      Row<&C::ready_blocks>("ready_blocks", kGauge, kBlocks, "accelfs_cache_ready_blocks",
                            "Cache blocks holding data."),
      Row<&C::fetching_blocks>("fetching_blocks", kGauge, kBlocks, "",
                               "Cache blocks whose store read is in flight."),
      Row<&C::queued_blocks>("queued_blocks", kGauge, kBlocks, "",
                             "Cache blocks waiting for room in the budget."),
      Row<&C::hits>("hits", kCounter, kCount, "accelfs_cache_hits_total",
                    "Block reads answered from the cache."),
      Row<&C::misses>("misses", kCounter, kCount, "accelfs_cache_misses_total",
                      "Block reads that started or joined a store fetch."),
      Row<&C::hit_bytes>("hit_bytes", kCounter, kBytes, "accelfs_cache_hit_bytes_total",
                         "Bytes of the blocks cache hits returned."),
      Row<&C::miss_bytes>("miss_bytes", kCounter, kBytes, "accelfs_cache_miss_bytes_total",
                          "Bytes of the blocks cache misses waited for."),
      Row<&C::fetched_bytes>("fetched_bytes", kCounter, kBytes, "accelfs_store_read_bytes_total",
                             "Bytes read from SOURCE into the cache."),
      Row<&C::prefetches>("prefetches", kCounter, kCount, "accelfs_prefetches_total",
                          "Store reads started by prefetch."),
      Row<&C::fetching_bytes>("fetching_bytes", kGauge, kBytes, "accelfs_prefetch_inflight_bytes",
                              "Bytes of store reads in flight."),
      Row<&D::depth>("depth", kGauge, kCount, "accelfs_store_depth",
                     "Store reads the adaptive depth allows in flight now."),
      Row<&D::depth_limit>("depth_limit", kGauge, kCount, "accelfs_store_depth_limit",
                           "Most store reads in flight (--store-depth)."),
      Row<&D::open_files>("open_files", kGauge, kCount, "accelfs_open_files",
                          "File handles open on the mount."),
      Row<&D::passthrough_files>("passthrough_files", kGauge, kCount,
                                 "accelfs_passthrough_open_files",
                                 "Of them, open in FUSE passthrough mode."),
      Row<&D::filling_opens>("filling_opens", kGauge, kCount, "accelfs_filling_opens",
                             "Opens waiting for their file to be cached (fill on open)."),
      Row<&D::trusted_opens>("trusted_opens", kCounter, kCount, "accelfs_trusted_opens_total",
                             "Opens answered within the validity window (--revalidate), from the "
                             "cache, without a check against SOURCE."),
      Row<&C::evicted_blocks>("evicted_blocks", kCounter, kBlocks, "accelfs_evicted_blocks_total",
                              "Cache blocks evicted to stay within the budget."),
      Row<&C::failed_fetches>("failed_fetches", kCounter, kCount, "accelfs_failed_fetches_total",
                              "Store reads that failed."),
      Row<&C::stalled_fetches>("stalled_fetches", kCounter, kCount, "",
                               "Store fetches whose read outlived --store-timeout."),
      Row<&C::verified_bytes>("verified_bytes", kCounter, kBytes,
                              "accelfs_cache_dir_verified_bytes_total",
                              "Bytes of blocks kept in a disk --cache-dir that matched their "
                              "checksums when first read after a restart."),
      Row<&C::verify_failed_blocks>(
          "verify_failed_blocks", kCounter, kBlocks, "accelfs_cache_dir_verify_failed_blocks_total",
          "Blocks kept in a disk --cache-dir that did not match their "
          "checksums or could not be read back: fetched again from SOURCE."),
      Row<&C::fallback_blocks>("fallback_blocks", kCounter, kBlocks,
                               "accelfs_cache_dir_fallback_blocks_total",
                               "Blocks a full or failing --cache-dir could not take, kept in "
                               "memory instead."),
      Row<&D::stuck_requests>(
          "stuck_requests", kGauge, kCount, "accelfs_store_stuck_requests",
          "Store reads in flight past --store-timeout: slots lost to a hung store."),
      Row<&D::timed_out_requests>(
          "timed_out_requests", kCounter, kCount, "accelfs_store_timed_out_requests_total",
          "Store reads given up on after --store-timeout; their readers got ETIMEDOUT."),
      Row<&D::waiting_requests>(
          "waiting_requests", kGauge, kCount, "accelfs_store_waiting_requests",
          "Store reads held back because their file has its share of the depth in flight."),
      Row<&D::pushed_bytes>("pushed_bytes", kCounter, kBytes, "accelfs_pushed_bytes_total",
                            "Bytes pushed into the kernel's page cache (--push, and warmed "
                            "files on a mount without passthrough)."),
      Row<&D::store_calls>("store_calls", kGauge, kCount, "accelfs_store_calls_in_progress",
                           "Calls into SOURCE's filesystem (lookups, opens, listings, stats) in "
                           "progress: each holds a thread serving the mount while it waits."),
      Row<&D::oldest_store_call_s>("oldest_store_call_s", kGauge, kSeconds,
                                   "accelfs_store_call_oldest_seconds",
                                   "Seconds the oldest call into SOURCE's filesystem has waited."),
      Row<&D::swarm_on>("swarm_on", kGauge, kCount, "accelfs_swarm_on",
                        "1 when the daemon shares blocks with a fleet (--swarm-listen)."),
      Row<&D::swarm_store_bytes>("swarm_store_bytes", kCounter, kBytes,
                                 "accelfs_swarm_store_read_bytes_total",
                                 "Bytes the swarm's reader read from SOURCE."),
      Row<&D::swarm_peer_bytes>("swarm_peer_bytes", kCounter, kBytes,
                                "accelfs_swarm_peer_read_bytes_total",
                                "Bytes got from peers, each piece hash checked."),
      Row<&D::swarm_sent_bytes>("swarm_sent_bytes", kCounter, kBytes,
                                "accelfs_swarm_sent_bytes_total", "Bytes sent to peers."),
      Row<&D::swarm_peers>("swarm_peers", kGauge, kCount, "accelfs_swarm_peers",
                           "Peer connections of the swarm now."),
      Row<&D::swarm_fallbacks>("swarm_fallbacks", kCounter, kCount, "accelfs_swarm_fallbacks_total",
                               "Reads that waited on peers in vain and were read from SOURCE."),
      Row<&D::swarm_hash_failures>("swarm_hash_failures", kCounter, kCount,
                                   "accelfs_swarm_hash_failures_total",
                                   "Pieces from peers that failed their hash check (fetched "
                                   "again, never served)."),
      Row<&D::swarm_hedges>("swarm_hedges", kCounter, kCount, "accelfs_swarm_hedges_total",
                            "Reads of chunks whose peers fell behind SOURCE, read from SOURCE."),
      Row<&D::swarm_chunks_claimed>("swarm_chunks_claimed", kCounter, kCount,
                                    "accelfs_swarm_chunks_claimed_total",
                                    "Chunks this node read from SOURCE for the fleet."),
      Row<&D::swarm_chunks_joined>("swarm_chunks_joined", kCounter, kCount,
                                   "accelfs_swarm_chunks_joined_total",
                                   "Chunks this node took from the swarm."),
      Row<&D::swarm_manifests_rejected>(
          "swarm_manifests_rejected", kCounter, kCount, "accelfs_swarm_manifests_rejected_total",
          "Torrents in --swarm-dir not signed by a node of the fleet (--swarm-ca): not used, "
          "their chunks read from SOURCE."),
      Row<&D::uptime_s>("uptime_s", kGauge, kSeconds, "accelfs_uptime_seconds",
                        "Seconds since the daemon started."),
  };
}();

// The inverse of DaemonStatsToJson (fs/common/control_protocol.h), by the same rows: what
// accelfs-stat reads a daemon's stats with. A key that is absent or not of its type reads as 0
// ("" for a name, false), so that a daemon older or newer than the tool still shows.
DaemonStats DaemonStatsFromJson(const nlohmann::json& stats);

}  // namespace accelfs
