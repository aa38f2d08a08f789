// A fleet's CA and node certificates for tests of --swarm-ca/--swarm-cert/--swarm-key, made with
// the `openssl` lines docs/FLEET.md shows (EC P-256 keys, no pass phrase).
#pragma once

#include <cstdlib>
#include <string>

namespace accelfs::testing {

struct FleetCerts {
  std::string ca, ca_key;  // the fleet's CA
  std::string cert, key;   // one node's
};

// Runs `openssl` in `dir`; "" when it succeeded, else the command that failed.
inline std::string OpenSsl(const std::string& dir, const std::string& args) {
  const std::string command = "cd '" + dir + "' && openssl " + args + " > openssl.log 2>&1";
  return std::system(command.c_str()) == 0 ? "" : command;
}

// A new CA in `dir` (ca.pem, ca.key).
inline std::string MakeCa(const std::string& dir, FleetCerts& out) {
  out.ca = dir + "/ca.pem";
  out.ca_key = dir + "/ca.key";
  return OpenSsl(dir,
                 "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
                 "-out ca.pem -days 3650 -subj /CN=accelfs-fleet-ca");
}

// A node's key and certificate `name`.pem/.key in `dir`, signed by `ca` (named CN=`cn`).
inline std::string MakeNode(const std::string& dir, const FleetCerts& ca, const std::string& name,
                            const std::string& cn, FleetCerts& out) {
  out.ca = ca.ca;
  out.ca_key = ca.ca_key;
  out.cert = dir + "/" + name + ".pem";
  out.key = dir + "/" + name + ".key";
  if (std::string failed = OpenSsl(dir,
                                   "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                                   "-keyout " +
                                       name + ".key -out " + name + ".csr -subj /CN=" + cn);
      !failed.empty()) {
    return failed;
  }
  return OpenSsl(dir, "x509 -req -in " + name + ".csr -CA '" + ca.ca + "' -CAkey '" + ca.ca_key +
                          "' -CAcreateserial -days 825 -out " + name + ".pem");
}

}  // namespace accelfs::testing
