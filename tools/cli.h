// Command-line handling shared by the tools (CLI11): --version, --help and usage errors the same
// way everywhere.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "accelfs_version.h"

namespace accelfs {

// Parses argv into `app`. Returns the exit code when the tool is done: 0 after printing the
// version or the help (of the subcommand asked about) on stdout, 2 after one usage-error line on
// stderr. nullopt when the tool should go on.
inline std::optional<int> ParseToolArgs(CLI::App& app, int argc, char** argv) {
  const std::string name = app.get_name();
  app.add_flag("-V,--version")->description("Print the version and exit");
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--version" || std::string_view(argv[i]) == "-V") {
      std::printf("%s " ACCELFS_VERSION "\n", name.c_str());
      return 0;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      const CLI::App* asked = &app;
      for (const CLI::App* sub : app.get_subcommands({})) {
        if (sub->parsed()) asked = sub;
      }
      std::printf("%s", asked->help().c_str());
      return 0;
    }
    std::string what = e.what();  // one line, whatever CLI11 wrapped
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::fprintf(stderr, "%s: %s (see %s --help)\n", name.c_str(), what.c_str(), name.c_str());
    return 2;
  }
  return std::nullopt;
}

}  // namespace accelfs
