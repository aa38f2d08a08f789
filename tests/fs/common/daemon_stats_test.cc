// kStatsFields is the one stats schema: every DaemonStats number has exactly one row; the stats
// JSON (DaemonStatsToJson), accelfs-stat's reading of it (DaemonStatsFromJson), the /metrics
// exposition (MetricsText) and the docs (docs/CONTROL.md, docs/METRICS.md's table) all follow it.
#include "fs/common/daemon_stats.h"
#include "accelfs_version.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fs/common/control_protocol.h"
#include "fs/common/names.h"
#include "fs/control/metrics.h"

namespace accelfs {
namespace {

std::string Section(StatSection section) {
  return section == StatSection::kCache ? std::string(kStatsCacheKey) : "top";
}

std::string Where(const StatField& f) { return Section(f.section) + "." + std::string(f.key); }

// A snapshot whose every number differs from every other. The structured bindings name every
// field: a field added to DaemonStats or CacheStats fails to compile here until it has a value
// (and then TableCoversEveryFieldOnce wants its row in kStatsFields).
DaemonStats Distinct() {
  DaemonStats s;
  auto& [source, mountpoint, store, passthrough, passthrough_why, uptime_s, cache, depth,
         depth_limit, stuck, timed_out, waiting, open_files, passthrough_files, filling_opens,
         trusted_opens, pushed_bytes, store_calls, oldest_store_call_s, swarm_on, swarm_store,
         swarm_peer, swarm_sent, swarm_peers, swarm_fallbacks, swarm_hash_failures, swarm_hedges,
         swarm_claimed, swarm_joined, swarm_rejected, open_waits, cold_loads] = s;
  source = "/src";
  mountpoint = "/mnt";
  store = "private tmpfs";
  passthrough = true;
  passthrough_why = "kernel 6.18.0";
  uptime_s = 12.5;
  oldest_store_call_s = 3.25;
  // Not in the table: histograms, exported by the metrics only (their test is below).
  open_waits.buckets[0] = 3;
  open_waits.buckets[4] = 2;
  open_waits.count = 5;
  open_waits.sum = 9.5;
  cold_loads.buckets.back() = 1;
  cold_loads.count = 1;
  cold_loads.sum = 700;
  uint64_t next = 1001;
  for (uint64_t* field : {&stuck,
                          &timed_out,
                          &waiting,
                          &open_files,
                          &passthrough_files,
                          &filling_opens,
                          &trusted_opens,
                          &pushed_bytes,
                          &store_calls,
                          &swarm_on,
                          &swarm_store,
                          &swarm_peer,
                          &swarm_sent,
                          &swarm_peers,
                          &swarm_fallbacks,
                          &swarm_hash_failures,
                          &swarm_hedges,
                          &swarm_claimed,
                          &swarm_joined,
                          &swarm_rejected}) {
    *field = next++;
  }
  depth = static_cast<uint32_t>(next++);
  depth_limit = static_cast<uint32_t>(next++);
  auto& [budget, used, pinned, ready, fetching_blocks, queued, hits, misses, hit_bytes, miss_bytes,
         fetching_bytes, fetched_bytes, evicted, failed, prefetches, stalled, verified,
         verify_failed_blocks, fallback_blocks] = cache;
  for (uint64_t* field :
       {&budget, &used, &pinned, &ready, &fetching_blocks, &queued, &hits, &misses, &hit_bytes,
        &miss_bytes, &fetching_bytes, &fetched_bytes, &evicted, &failed, &prefetches, &stalled,
        &verified, &verify_failed_blocks, &fallback_blocks}) {
    *field = next++;
  }
  return s;
}
constexpr size_t kNumericFields = 24 + 19;  // DaemonStats' own numbers, CacheStats'

double AsDouble(StatValue v) {
  return std::visit([](auto x) { return static_cast<double>(x); }, v);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(DaemonStatsTest, TableCoversEveryFieldOnce) {
  const DaemonStats s = Distinct();
  EXPECT_EQ(kStatsFields.size(), kNumericFields);
  std::map<double, std::string> seen;  // value -> the row that read it
  for (const StatField& f : kStatsFields) {
    const auto [it, fresh] = seen.emplace(AsDouble(f.get(s)), Where(f));
    EXPECT_TRUE(fresh) << Where(f) << " reads the same field as " << it->second;
    EXPECT_NE(it->first, 0) << Where(f) << " reads a field Distinct() leaves 0";
  }
  // The seconds are doubles; the JSON keeps them floats and every other number an integer.
  for (const StatField& f : kStatsFields) {
    EXPECT_EQ(std::holds_alternative<double>(f.get(s)),
              f.key == "uptime_s" || f.key == "oldest_store_call_s")
        << Where(f);
  }
}

TEST(DaemonStatsTest, KeysAndMetricNamesAreUniqueAndFollowTheConventions) {
  std::set<std::string> keys = {
      std::string(kStatsSourceKey),         std::string(kStatsMountpointKey),
      std::string(kStatsStoreKey),          std::string(kStatsPassthroughKey),
      std::string(kStatsPassthroughWhyKey), std::string(kStatsCacheKey)};
  std::set<std::string> cache_keys;
  std::set<std::string> metrics;
  for (const StatField& f : kStatsFields) {
    const std::string key(f.key);
    const std::string metric(f.metric);
    EXPECT_TRUE((f.section == StatSection::kCache ? cache_keys : keys).insert(key).second)
        << Where(f) << " twice";
    EXPECT_FALSE(f.help.empty()) << Where(f);
    EXPECT_EQ(f.help.back(), '.') << Where(f);
    EXPECT_FALSE(key.empty());
    EXPECT_EQ(key.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << key;
    // Units show in the names (Prometheus' conventions, and the JSON's).
    const auto ends = [](const std::string& text, std::string_view tail) {
      return text.size() >= tail.size() &&
             text.compare(text.size() - tail.size(), tail.size(), tail.data(), tail.size()) == 0;
    };
    EXPECT_EQ(f.unit == StatUnit::kBytes, ends(key, "_bytes")) << Where(f);
    EXPECT_EQ(f.unit == StatUnit::kBlocks, ends(key, "_blocks")) << Where(f);
    EXPECT_EQ(f.unit == StatUnit::kSeconds, ends(key, "_s")) << Where(f);
    if (metric.empty()) continue;
    EXPECT_TRUE(metrics.insert(metric).second) << metric << " twice";
    EXPECT_EQ(metric.rfind("accelfs_", 0), 0u) << metric;
    EXPECT_EQ(metric.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << metric;
    EXPECT_EQ(f.kind == StatKind::kCounter, ends(metric, "_total")) << metric;
    EXPECT_EQ(f.unit == StatUnit::kBytes, metric.find("_bytes") != std::string::npos) << metric;
    EXPECT_EQ(f.unit == StatUnit::kBlocks, metric.find("_blocks") != std::string::npos) << metric;
    EXPECT_EQ(f.unit == StatUnit::kSeconds, ends(metric, "_seconds")) << metric;
  }
}

TEST(DaemonStatsTest, JsonHasEveryRowAtItsKeyAndNothingElse) {
  const DaemonStats s = Distinct();
  const nlohmann::json j = DaemonStatsToJson(s);
  ASSERT_TRUE(j.is_object());
  ASSERT_TRUE(j[kStatsCacheKey].is_object());
  std::set<std::string> top = {
      std::string(kStatsSourceKey),         std::string(kStatsMountpointKey),
      std::string(kStatsStoreKey),          std::string(kStatsPassthroughKey),
      std::string(kStatsPassthroughWhyKey), std::string(kStatsCacheKey)};
  std::set<std::string> cache;
  for (const StatField& f : kStatsFields) {
    const nlohmann::json& in = f.section == StatSection::kCache ? j[kStatsCacheKey] : j;
    (f.section == StatSection::kCache ? cache : top).insert(std::string(f.key));
    const auto it = in.find(f.key);
    ASSERT_NE(it, in.end()) << Where(f) << " missing from " << j.dump();
    if (std::holds_alternative<double>(f.get(s))) {
      EXPECT_TRUE(it->is_number_float()) << Where(f);
      EXPECT_EQ(it->get<double>(), std::get<double>(f.get(s))) << Where(f);
    } else {
      EXPECT_TRUE(it->is_number_unsigned()) << Where(f);
      EXPECT_EQ(it->get<uint64_t>(), std::get<uint64_t>(f.get(s))) << Where(f);
    }
  }
  std::set<std::string> json_top;
  for (const auto& [key, value] : j.items()) json_top.insert(key);
  std::set<std::string> json_cache;
  for (const auto& [key, value] : j[kStatsCacheKey].items()) json_cache.insert(key);
  EXPECT_EQ(json_top, top);
  EXPECT_EQ(json_cache, cache);
  EXPECT_EQ(j[kStatsSourceKey], "/src");
  EXPECT_EQ(j[kStatsMountpointKey], "/mnt");
  EXPECT_EQ(j[kStatsStoreKey], "private tmpfs");
  EXPECT_EQ(j[kStatsPassthroughKey], true);
  EXPECT_EQ(j[kStatsPassthroughWhyKey], "kernel 6.18.0");
}

// accelfs-stat reads the daemon's JSON with DaemonStatsFromJson: every row (and name) it may show
// comes back as the daemon filled it.
TEST(DaemonStatsTest, AccelfsStatReadsBackWhatTheDaemonSends) {
  DaemonStats sent = Distinct();
  sent.source = "/models/bad\377dir";  // not UTF-8: goes as {"bytes_hex": ...}
  sent.mountpoint = "/mnt/mod\xc3\xa8le";
  const nlohmann::json j = nlohmann::json::parse(DaemonStatsToJson(sent).dump());
  const DaemonStats read = DaemonStatsFromJson(j);
  EXPECT_EQ(read.source, sent.source);
  EXPECT_EQ(read.mountpoint, sent.mountpoint);
  EXPECT_EQ(read.store, sent.store);
  EXPECT_EQ(read.passthrough, sent.passthrough);
  EXPECT_EQ(read.passthrough_why, sent.passthrough_why);
  for (const StatField& f : kStatsFields) EXPECT_EQ(f.get(read), f.get(sent)) << Where(f);
}

TEST(DaemonStatsTest, FromJsonReadsWhatIsMissingOrMalformedAsZero) {
  for (const char* text : {R"(null)", R"([1,2])", R"({})", R"({"cache":5,"depth":"x"})",
                           R"({"source":7,"store":false,"passthrough":"yes","cache":[]})"}) {
    const DaemonStats s = DaemonStatsFromJson(nlohmann::json::parse(text));
    EXPECT_EQ(s.source, "") << text;
    EXPECT_EQ(s.store, "") << text;
    EXPECT_FALSE(s.passthrough) << text;
    for (const StatField& f : kStatsFields) EXPECT_EQ(AsDouble(f.get(s)), 0) << Where(f) << text;
  }
  // A daemon that sends one number less (older) or more (newer) still shows the others.
  const DaemonStats s = DaemonStatsFromJson(
      nlohmann::json::parse(R"({"depth":3,"new_thing":1,"cache":{"hits":4,"new_too":2}})"));
  EXPECT_EQ(s.depth, 3u);
  EXPECT_EQ(s.cache.hits, 4u);
}

TEST(DaemonStatsTest, MetricsExportEveryMetricRowWithItsTypeAndHelp) {
  DaemonStats s = Distinct();
  s.mountpoint = "/mnt/bad\xffname";
  const std::string text = MetricsText(s);
  const std::string label = "{mountpoint=\"/mnt/bad\\\\377name\"} ";  // EscapeName, then escaped
  size_t rows = 0;
  size_t last = 0;
  for (const StatField& f : kStatsFields) {
    if (f.metric.empty()) {
      EXPECT_EQ(text.find("_" + std::string(f.key) + "{"), std::string::npos) << Where(f);
      continue;
    }
    ++rows;
    const std::string name(f.metric);
    const std::string block = "# HELP " + name + " " + std::string(f.help) + "\n# TYPE " + name +
                              (f.kind == StatKind::kCounter ? " counter\n" : " gauge\n") + name +
                              label;
    const size_t at = text.find(block);
    ASSERT_NE(at, std::string::npos) << block << "\nnot in:\n" << text;
    EXPECT_GE(at, last) << name << " out of the table's order";
    last = at;
    EXPECT_EQ(std::strtod(text.c_str() + at + block.size(), nullptr), AsDouble(f.get(s))) << name;
  }
  size_t families = 0;
  for (size_t at = 0; (at = text.find("# TYPE ", at)) != std::string::npos; ++at) ++families;
  EXPECT_EQ(families, rows + 3) << "the rows, the build and two histograms:\n" << text;
  EXPECT_GE(rows, 20u);
}

// The build's info and the histograms: cumulative buckets, +Inf equal to the count, and the sum.
TEST(DaemonStatsTest, MetricsExportTheBuildAndTheHistograms) {
  const std::string text = MetricsText(Distinct());
  EXPECT_NE(text.find("accelfs_build_info{mountpoint=\"/mnt\",version=\"" ACCELFS_VERSION "\"} 1"),
            std::string::npos)
      << text;
  const std::string waits = "accelfs_open_wait_seconds_bucket{mountpoint=\"/mnt\",le=\"";
  for (const auto& [le, count] : std::vector<std::pair<std::string, int>>{
           {"0.01", 3}, {"0.1", 3}, {"1", 3}, {"5", 5}, {"600", 5}, {"+Inf", 5}}) {
    EXPECT_NE(text.find(waits + le + "\"} " + std::to_string(count) + "\n"), std::string::npos)
        << le << " in\n"
        << text;
  }
  EXPECT_NE(text.find("accelfs_open_wait_seconds_count{mountpoint=\"/mnt\"} 5\n"),
            std::string::npos);
  EXPECT_NE(text.find("accelfs_open_wait_seconds_sum{mountpoint=\"/mnt\"} 9.5\n"),
            std::string::npos);
  EXPECT_NE(text.find("accelfs_file_cold_load_seconds_bucket{mountpoint=\"/mnt\",le=\"600\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("accelfs_file_cold_load_seconds_bucket{mountpoint=\"/mnt\",le=\"+Inf\"} 1\n"),
            std::string::npos);
  // Each observation lands in the first bucket whose bound holds it.
  LatencyHistogram h;
  for (const double seconds : {0.0, 0.01, 0.011, 4.9, 700.0}) h.Record(seconds);
  const LatencyHistogram::Counts c = h.Read();
  EXPECT_EQ(c.count, 5u);
  EXPECT_EQ(c.buckets[0], 2u);  // 0 and 0.01 (le is <=)
  EXPECT_EQ(c.buckets[1], 1u);  // 0.011
  EXPECT_EQ(c.buckets[4], 1u);  // 4.9
  EXPECT_EQ(c.buckets.back(), 1u);
  EXPECT_NEAR(c.sum, 704.921, 1e-3);
}

// docs/METRICS.md's table: one line per metric or group of metrics, `| `name`, `name` | type |`.
TEST(DaemonStatsTest, MetricsDocListsEveryMetricWithItsType) {
  const std::string readme = ReadText(std::string(ACCELFS_SOURCE_DIR) + "/docs/METRICS.md");
  ASSERT_FALSE(readme.empty());
  std::map<std::string, std::string> documented;
  std::istringstream lines(readme);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `accelfs_", 0) != 0) continue;
    const size_t first = line.find('|', 1);
    const size_t second = line.find('|', first + 1);
    ASSERT_NE(second, std::string::npos) << line;
    std::string type = line.substr(first + 1, second - first - 1);
    type.erase(0, type.find_first_not_of(' '));
    type.erase(type.find_last_not_of(' ') + 1);
    const std::string names = line.substr(0, first);
    for (size_t at = 0; (at = names.find('`', at)) != std::string::npos;) {
      const size_t end = names.find('`', at + 1);
      ASSERT_NE(end, std::string::npos) << line;
      documented[names.substr(at + 1, end - at - 1)] = type;
      at = end + 1;
    }
  }
  std::map<std::string, std::string> table;
  for (const StatField& f : kStatsFields) {
    if (!f.metric.empty()) {
      table[std::string(f.metric)] = f.kind == StatKind::kCounter ? "counter" : "gauge";
    }
  }
  EXPECT_EQ(documented, table);
  // Its example scrape shows what MetricsText writes, help included.
  const std::string scrape = MetricsText(Distinct());
  size_t examples = 0;
  std::istringstream again(readme);
  for (std::string line; std::getline(again, line);) {
    const size_t at = line.find("# HELP accelfs_");
    if (at == std::string::npos) continue;
    ++examples;
    EXPECT_NE(scrape.find(line.substr(at) + "\n"), std::string::npos) << line;
  }
  EXPECT_GE(examples, 1u);
}

// docs/CONTROL.md's stats reply: `{"ok":true,"stats":{source, ..., cache:{hits, ...}, ...}}`.
TEST(DaemonStatsTest, ControlDocListsEveryKey) {
  const std::string doc = ReadText(std::string(ACCELFS_SOURCE_DIR) + "/docs/CONTROL.md");
  const std::string opening = "\"stats\":{";
  const size_t start = doc.find(opening);
  ASSERT_NE(start, std::string::npos);
  const size_t end = doc.find("}}`", start);
  ASSERT_NE(end, std::string::npos);
  std::set<std::string> documented;
  std::string section = "top";
  std::istringstream keys(doc.substr(start + opening.size(), end - start - opening.size()));
  for (std::string key; std::getline(keys, key, ',');) {
    key.erase(0, key.find_first_not_of(' '));
    if (const size_t open = key.find(":{"); open != std::string::npos) {
      section = key.substr(0, open);
      key.erase(0, open + 2);
    }
    const bool closes = !key.empty() && key.back() == '}';
    if (closes) key.pop_back();
    documented.insert(section + "." + key);
    if (closes) section = "top";
  }
  std::set<std::string> table = {
      "top." + std::string(kStatsSourceKey), "top." + std::string(kStatsMountpointKey),
      "top." + std::string(kStatsStoreKey), "top." + std::string(kStatsPassthroughKey),
      "top." + std::string(kStatsPassthroughWhyKey)};
  for (const StatField& f : kStatsFields) table.insert(Where(f));
  EXPECT_EQ(documented, table);
}

}  // namespace
}  // namespace accelfs
