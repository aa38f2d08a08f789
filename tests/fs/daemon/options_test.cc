// The option table (fs/daemon/config.h, Options()) is the one definition of every option: these
// tests keep README's option tables and --help equal to it, and check that every option works as
// a flag and as an -o key.
#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fs/daemon/config.h"

namespace accelfs {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

struct ReadmeRow {
  std::string names;         // the first cell: "`--cache-size SIZE`" or "`-f`, `--foreground`"
  std::string default_text;  // the last cell
};

// The rows of README.md's option tables under "## Options", one per --help group: every table
// whose header is "| option | meaning | default |", from that header to the first line that is
// not a table row.
std::vector<ReadmeRow> ReadmeOptionRows() {
  std::ifstream in(std::string(ACCELFS_SOURCE_DIR) + "/README.md");
  std::vector<ReadmeRow> rows;
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (!in_table) {
      in_table = line == "| option | meaning | default |";
      continue;
    }
    if (line.rfind("|---", 0) == 0) continue;
    if (line.empty() || line[0] != '|') {
      in_table = false;
      continue;
    }
    std::vector<std::string> cells;
    std::stringstream cells_in(line.substr(1));
    std::string cell;
    while (std::getline(cells_in, cell, '|')) cells.push_back(cell);
    if (cells.size() < 3) continue;
    rows.push_back({cells.front(), cells.back()});
  }
  return rows;
}

// "--name" -> the README row naming it.
std::map<std::string, ReadmeRow> ReadmeRowsByOption() {
  std::map<std::string, ReadmeRow> by_name;
  // Every "--name" in a row's first cell (no std::regex: GCC 12 warns falsely inside it under
  // -fsanitize=address, and warnings are errors in CI).
  for (const ReadmeRow& row : ReadmeOptionRows()) {
    for (size_t at = row.names.find("--"); at != std::string::npos;
         at = row.names.find("--", at + 2)) {
      size_t end = at + 2;
      while (end < row.names.size() &&
             (std::islower(static_cast<unsigned char>(row.names[end])) || row.names[end] == '-')) {
        ++end;
      }
      if (end > at + 2) by_name[row.names.substr(at + 2, end - at - 2)] = row;
    }
  }
  return by_name;
}

TEST(OptionTableTest, ReadmeListsEveryOptionAndNothingElse) {
  const std::map<std::string, ReadmeRow> readme = ReadmeRowsByOption();
  ASSERT_FALSE(readme.empty()) << "no option table under README.md's \"## Options\"";
  std::set<std::string> table = {"version", "help"};
  for (const OptionSpec& o : Options()) table.insert(std::string(o.name));
  std::set<std::string> documented;
  for (const auto& [name, row] : readme) documented.insert(name);
  EXPECT_EQ(documented, table);
}

TEST(OptionTableTest, ReadmeShowsEachOptionsValueNameAndDefault) {
  const std::map<std::string, ReadmeRow> readme = ReadmeRowsByOption();
  const Config defaults;
  for (const OptionSpec& o : Options()) {
    SCOPED_TRACE("--" + std::string(o.name));
    const auto row = readme.find(std::string(o.name));
    ASSERT_NE(row, readme.end());
    const std::string spelled =
        "`--" + std::string(o.name) + (o.flag() ? "" : " " + std::string(o.value_name)) + "`";
    EXPECT_NE(row->second.names.find(spelled), std::string::npos) << row->second.names;
    if (!o.short_name.empty()) {
      EXPECT_NE(row->second.names.find("`" + std::string(o.short_name) + "`"), std::string::npos);
    }
    EXPECT_NE(row->second.default_text.find(o.shown_default(defaults)), std::string::npos)
        << "README's default is '" << row->second.default_text << "', the table's '"
        << o.shown_default(defaults) << "'";
  }
}

TEST(OptionTableTest, HelpShowsEveryOptionWithItsDefault) {
  const char* argv[] = {"accelfs", "--help"};
  const ParseOutcome out = ParseCommandLine(2, argv, 8 * kGiB, 16 * kGiB);
  ASSERT_EQ(out.exit_code, 0);
  const Config defaults;
  for (const OptionSpec& o : Options()) {
    EXPECT_NE(out.output.find("--" + std::string(o.name)), std::string::npos) << o.name;
    EXPECT_NE(out.output.find("(default: " + o.shown_default(defaults) + ")"), std::string::npos)
        << o.name << " in\n"
        << out.output;
  }
}

TEST(OptionTableTest, NamesAndKeysAreUnique) {
  std::set<std::string> names;
  std::set<std::string> keys;
  for (const OptionSpec& o : Options()) {
    EXPECT_TRUE(names.insert(std::string(o.name)).second) << o.name;
    EXPECT_TRUE(keys.insert(o.Key()).second) << o.Key();
    EXPECT_EQ(o.Key().find('-'), std::string::npos) << o.Key();
  }
}

// Each option as --NAME VALUE and as -o KEY=VALUE gives the same Config; a flag as --NAME and -o
// KEY. The values are ones every option accepts or a per-option sample.
TEST(OptionTableTest, EveryOptionWorksAsAFlagAndAsAnOKey) {
  const std::map<std::string, std::string> samples = {{"cache-size", "1G"},
                                                      {"cache-dir", "/var/tmp/x"},
                                                      {"block-size", "8M"},
                                                      {"store-depth", "16"},
                                                      {"store-timeout", "5m"},
                                                      {"readahead", "4M"},
                                                      {"stream-threshold", "1M"},
                                                      {"revalidate", "5s"},
                                                      {"attr-timeout", "7"},
                                                      {"entry-timeout", "9"},
                                                      {"log-level", "debug"},
                                                      {"metrics", "9100"},
                                                      {"fill-on-open", "off"},
                                                      {"push", "never"},
                                                      {"control-group", "disk"},
                                                      {"store-io", "buffered"},
                                                      {"swarm-listen", "10.0.0.1:6881"},
                                                      {"swarm-peers", "10.0.0.2:6881,node3:6881"},
                                                      {"swarm-dir", "/srv/fleet"},
                                                      {"swarm-allow", "10.0.0.0/24"},
                                                      {"swarm-memory", "2G"},
                                                      {"swarm-ca", "/etc/accelfs/ca.pem"},
                                                      {"swarm-cert", "/etc/accelfs/node.pem"},
                                                      {"swarm-key", "/etc/accelfs/node.key"}};
  // What an option needs beside it: the swarm's options need --swarm-listen, which needs
  // --swarm-dir. Given the same way as the option itself, so that each way is tested alone.
  const auto needs = [](const std::string& name, bool as_key) -> std::vector<std::string> {
    if (!name.starts_with("swarm-")) return {};
    std::vector<std::string> args;
    if (name != "swarm-listen") {
      args.push_back(as_key ? "-oswarm_listen=10.0.0.9:7000" : "--swarm-listen=10.0.0.9:7000");
    }
    if (name != "swarm-dir") args.push_back(as_key ? "-oswarm_dir=/srv/x" : "--swarm-dir=/srv/x");
    // --swarm-ca, --swarm-cert and --swarm-key come together.
    if (name == "swarm-ca" || name == "swarm-cert" || name == "swarm-key") {
      for (const std::string other : {"ca", "cert", "key"}) {
        if (name == "swarm-" + other) continue;
        args.push_back(as_key ? "-oswarm_" + other + "=/x/" + other
                              : "--swarm-" + other + "=/x/" + other);
      }
    }
    return args;
  };
  for (const OptionSpec& o : Options()) {
    SCOPED_TRACE(std::string(o.name));
    std::string value;
    if (!o.flag()) {
      const auto sample = samples.find(std::string(o.name));
      ASSERT_NE(sample, samples.end()) << "add a sample value for this option";
      value = sample->second;
    }
    const std::string flag = "--" + std::string(o.name);
    // In an -o list a comma inside a value is escaped (--swarm-peers, --swarm-allow).
    std::string escaped;
    for (const char ch : value) escaped += ch == ',' ? std::string("\\,") : std::string(1, ch);
    const std::string key = "-o" + o.Key() + (o.flag() ? "" : "=" + escaped);
    std::vector<const char*> as_flag = {"accelfs", "/src", "/mnt", flag.c_str()};
    if (!o.flag()) as_flag.push_back(value.c_str());
    std::vector<const char*> as_key = {"accelfs", "/src", "/mnt", key.c_str()};
    const std::vector<std::string> flag_needs = needs(std::string(o.name), false);
    const std::vector<std::string> key_needs = needs(std::string(o.name), true);
    for (const std::string& arg : flag_needs) as_flag.push_back(arg.c_str());
    for (const std::string& arg : key_needs) as_key.push_back(arg.c_str());
    const ParseOutcome a =
        ParseCommandLine(static_cast<int>(as_flag.size()), as_flag.data(), 8 * kGiB, 16 * kGiB);
    const ParseOutcome b =
        ParseCommandLine(static_cast<int>(as_key.size()), as_key.data(), 8 * kGiB, 16 * kGiB);
    ASSERT_TRUE(a.config.has_value()) << a.output;
    ASSERT_TRUE(b.config.has_value()) << b.output;
    const Config defaults;
    EXPECT_EQ(a.config->cache_size, b.config->cache_size);
    EXPECT_EQ(a.config->cache_dir, b.config->cache_dir);
    EXPECT_EQ(a.config->block_size, b.config->block_size);
    EXPECT_EQ(a.config->store_depth, b.config->store_depth);
    EXPECT_EQ(a.config->store_timeout, b.config->store_timeout);
    EXPECT_EQ(a.config->readahead_kb, b.config->readahead_kb);
    EXPECT_EQ(a.config->stream_threshold, b.config->stream_threshold);
    EXPECT_EQ(a.config->revalidate, b.config->revalidate);
    EXPECT_EQ(a.config->attr_timeout, b.config->attr_timeout);
    EXPECT_EQ(a.config->entry_timeout, b.config->entry_timeout);
    EXPECT_EQ(a.config->log_level, b.config->log_level);
    EXPECT_EQ(a.config->metrics_address, b.config->metrics_address);
    EXPECT_EQ(a.config->fill_on_open, b.config->fill_on_open);
    EXPECT_EQ(a.config->control_group, b.config->control_group);
    EXPECT_EQ(a.config->foreground, b.config->foreground);
    EXPECT_EQ(a.config->passthrough, b.config->passthrough);
    EXPECT_EQ(a.config->push, b.config->push);
    EXPECT_EQ(a.config->store_io, b.config->store_io);
    EXPECT_EQ(a.config->swarm_listen, b.config->swarm_listen);
    EXPECT_EQ(a.config->swarm_peers, b.config->swarm_peers);
    EXPECT_EQ(a.config->swarm_dir, b.config->swarm_dir);
    EXPECT_EQ(a.config->swarm_allow, b.config->swarm_allow);
    EXPECT_EQ(a.config->swarm_memory, b.config->swarm_memory);
    EXPECT_EQ(a.config->fuse_options, b.config->fuse_options);
    // And it changed something: every option has an effect.
    const Config& c = *a.config;
    const bool changed =
        c.cache_size_origin != "half of MemAvailable" || c.cache_dir != defaults.cache_dir ||
        c.block_size != defaults.block_size || c.store_depth != defaults.store_depth ||
        c.store_timeout != defaults.store_timeout || c.readahead_kb != defaults.readahead_kb ||
        c.stream_threshold != defaults.stream_threshold || c.revalidate != defaults.revalidate ||
        c.attr_timeout != defaults.attr_timeout || c.entry_timeout != defaults.entry_timeout ||
        c.log_level != defaults.log_level || c.metrics_address != defaults.metrics_address ||
        c.fill_on_open != defaults.fill_on_open || c.control_group != defaults.control_group ||
        c.foreground != defaults.foreground || c.passthrough != defaults.passthrough ||
        c.push != defaults.push || c.store_io != defaults.store_io ||
        c.swarm_listen != defaults.swarm_listen || c.swarm_peers != defaults.swarm_peers ||
        c.swarm_dir != defaults.swarm_dir || c.swarm_allow != defaults.swarm_allow ||
        c.swarm_memory != defaults.swarm_memory || c.fuse_options != defaults.fuse_options;
    EXPECT_TRUE(changed);
  }
}

}  // namespace
}  // namespace accelfs
