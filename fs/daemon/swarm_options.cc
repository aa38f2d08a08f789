#include "fs/daemon/swarm_options.h"

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "fs/daemon/option_values.h"
#include "fs/daemon/options.h"

namespace accelfs {
namespace {

Status ApplySwarmListen(const std::string& text, Config& config, const ParseContext&) {
  const std::optional<std::string> address = ParseListenAddress(text);
  if (!address || text.find(':') == std::string::npos || text.starts_with(":")) {
    return Bad("--swarm-listen " + Quoted(text) +
               ": expected ADDR:PORT, the address of this node that the others reach (an IP "
               "address, [::1] for IPv6; port 1-65535)");
  }
  config.swarm_listen = *address;
  return Status::Ok();
}

Status ApplySwarmPeers(const std::string& text, Config& config, const ParseContext&) {
  Result<std::vector<std::string>> peers = CommaList(text, "--swarm-peers");
  if (!peers.ok()) return Bad(peers.error().Message());
  for (const std::string& peer : peers.value()) {
    const size_t colon = peer.rfind(':');
    const std::optional<uint64_t> port =
        colon == std::string::npos ? std::nullopt : ParseCount(peer.substr(colon + 1));
    if (colon == 0 || !port || *port < 1 || *port > 65535) {
      return Bad("--swarm-peers " + Quoted(peer) + ": expected HOST:PORT (port 1-65535)");
    }
  }
  config.swarm_peers = std::move(peers.value());
  return Status::Ok();
}

// Each network is parsed by the swarm, which says which is wrong.
Status ApplySwarmAllow(const std::string& text, Config& config, const ParseContext&) {
  Result<std::vector<std::string>> networks = CommaList(text, "--swarm-allow");
  if (networks.ok()) config.swarm_allow = std::move(networks.value());
  return networks.ok() ? Status::Ok() : Bad(networks.error().Message());
}

Status ApplySwarmMemory(const std::string& text, Config& config, const ParseContext&) {
  Result<uint64_t> v = ParseSize(text, 0);
  if (!v.ok()) return Bad("--swarm-memory " + v.error().Message());
  config.swarm_memory = v.value();
  return v.value() > 0 ? Status::Ok() : Bad("--swarm-memory must be more than 0");
}

// A file the daemon reads once detached (its working directory then /): made absolute.
Status ApplyAbsolute(const std::string& option, const std::string& text, std::string& into) {
  if (text.empty()) return Bad("--" + option + " needs a file");
  std::error_code ec;
  into = std::filesystem::absolute(text, ec).lexically_normal().string();
  if (ec) return Bad("--" + option + " " + Quoted(text) + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

std::vector<OptionSpec> SwarmOptionSpecs() {
  using C = const Config&;
  return {
      {kFleetGroup, "swarm-listen", "", "ADDR:PORT",
       "Share blocks with the other nodes of a fleet (peer to peer, libtorrent), listening here "
       "for them; needs --swarm-dir",
       [](C) { return std::string("off"); }, ApplySwarmListen},
      {kFleetGroup, "swarm-peers", "", "HOST:PORT,...",
       "The fleet's nodes (this one may be in the list); in -o, separate them with \\,",
       [](C) { return std::string("none: only peers that connect"); }, ApplySwarmPeers},
      {kFleetGroup, "swarm-dir", "", "DIR",
       "A directory every node shares (NFS...): which node reads which chunk from the store, and "
       "the chunks' piece hashes",
       [](C) { return std::string("none"); },
       [](const std::string& v, Config& c, const ParseContext&) {
         if (v.empty()) return Bad("--swarm-dir needs a directory");
         return ApplyAbsolute("swarm-dir", v, c.swarm_dir);
       }},
      {kFleetGroup, "swarm-allow", "", "CIDR,...",
       "Networks peers may connect from, besides the hosts of --swarm-peers",
       [](C) { return std::string("the peers' addresses only"); }, ApplySwarmAllow},
      {kFleetGroup, "swarm-memory", "", "SIZE",
       "Memory for chunks kept for the peers (beyond it the least recently read are dropped)",
       [](C) { return std::string("a quarter of the cache budget"); }, ApplySwarmMemory},
      {kFleetGroup, "swarm-ca", "", "FILE",
       "The fleet's CA certificate (PEM): only nodes whose certificate it signed take part "
       "(mutual TLS between peers, signed torrents in --swarm-dir); needs --swarm-cert and "
       "--swarm-key",
       [](C) { return std::string("none: peers and the dir's torrents are not authenticated"); },
       [](const std::string& v, Config& c, const ParseContext&) {
         return ApplyAbsolute("swarm-ca", v, c.swarm_ca);
       }},
      {kFleetGroup, "swarm-cert", "", "FILE",
       "This node's certificate (PEM), signed by --swarm-ca, named accelfs (CN or DNS "
       "subjectAltName) or *",
       [](C) { return std::string("none"); },
       [](const std::string& v, Config& c, const ParseContext&) {
         return ApplyAbsolute("swarm-cert", v, c.swarm_cert);
       }},
      {kFleetGroup, "swarm-key", "", "FILE",
       "The private key of --swarm-cert (PEM, no pass phrase)",
       [](C) { return std::string("none"); },
       [](const std::string& v, Config& c, const ParseContext&) {
         return ApplyAbsolute("swarm-key", v, c.swarm_key);
       }},
  };
}

Status FinishSwarm(const Config& config) {
  if (config.swarm_listen.empty()) {
    if (!config.swarm_peers.empty() || !config.swarm_dir.empty() || !config.swarm_allow.empty() ||
        config.swarm_memory != 0 || !config.swarm_ca.empty() || !config.swarm_cert.empty() ||
        !config.swarm_key.empty()) {
      return Bad("the --swarm-* options need --swarm-listen ADDR:PORT, which turns the swarm on");
    }
    return Status::Ok();
  }
  if (config.swarm_dir.empty()) {
    return Bad("--swarm-listen needs --swarm-dir DIR, a directory every node of the fleet shares");
  }
  const int given = int{!config.swarm_ca.empty()} + int{!config.swarm_cert.empty()} +
                    int{!config.swarm_key.empty()};
  if (given != 0 && given != 3) {
    return Bad(
        "--swarm-ca, --swarm-cert and --swarm-key come together: the fleet's CA, this "
        "node's certificate signed by it, and that certificate's key");
  }
  return Status::Ok();
}

}  // namespace accelfs
