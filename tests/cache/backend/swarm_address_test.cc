#include "cache/backend/swarm_address.h"

#include <gtest/gtest.h>

namespace accelfs::testing {
namespace {

IpAddress V4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  IpAddress ip;
  ip.bytes[0] = a;
  ip.bytes[1] = b;
  ip.bytes[2] = c;
  ip.bytes[3] = d;
  return ip;
}

TEST(SwarmAddressTest, EndpointsParseNumericAndBracketedAddresses) {
  Result<Endpoint> e = ParseEndpoint("10.79.0.2:6881", /*resolve=*/false);
  ASSERT_TRUE(e.ok()) << e.error().Message();
  EXPECT_EQ(e->address, V4(10, 79, 0, 2));
  EXPECT_EQ(e->port, 6881);
  Result<Endpoint> v6 = ParseEndpoint("[::1]:7000", /*resolve=*/false);
  ASSERT_TRUE(v6.ok()) << v6.error().Message();
  EXPECT_TRUE(v6->address.v6);
  EXPECT_EQ(v6->address.bytes[15], 1);
  EXPECT_EQ(v6->port, 7000);
  Result<Endpoint> named = ParseEndpoint("localhost:1", /*resolve=*/true);
  ASSERT_TRUE(named.ok()) << named.error().Message();
  EXPECT_EQ(named->port, 1);
}

TEST(SwarmAddressTest, BadEndpointsSayWhy) {
  for (const char* bad : {"10.0.0.1", "10.0.0.1:", "10.0.0.1:99999", "10.0.0.1:6a", ":80",
                          "host.invalid.:80", "[::1]:123456"}) {
    Result<Endpoint> e = ParseEndpoint(bad, /*resolve=*/false);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error().Message().find(bad), std::string::npos) << e.error().Message();
  }
  EXPECT_FALSE(ParseEndpoint("not-a-number:80", /*resolve=*/false).ok());
}

TEST(SwarmAddressTest, NetworksGiveTheirFirstAndLastAddress) {
  auto net = ParseNetwork("10.79.3.7/16");
  ASSERT_TRUE(net.ok()) << net.error().Message();
  EXPECT_EQ(net->first, V4(10, 79, 0, 0));
  EXPECT_EQ(net->second, V4(10, 79, 255, 255));
  net = ParseNetwork("192.168.1.5");  // one host
  ASSERT_TRUE(net.ok());
  EXPECT_EQ(net->first, V4(192, 168, 1, 5));
  EXPECT_EQ(net->second, V4(192, 168, 1, 5));
  net = ParseNetwork("0.0.0.0/0");
  ASSERT_TRUE(net.ok());
  EXPECT_EQ(net->second, V4(255, 255, 255, 255));
  net = ParseNetwork("10.1.2.3/13");  // a prefix inside a byte
  ASSERT_TRUE(net.ok());
  EXPECT_EQ(net->first, V4(10, 0, 0, 0));
  EXPECT_EQ(net->second, V4(10, 7, 255, 255));
  auto v6 = ParseNetwork("fd00::/8");
  ASSERT_TRUE(v6.ok()) << v6.error().Message();
  EXPECT_TRUE(v6->first.v6);
  EXPECT_EQ(v6->first.bytes[0], 0xfd);
  EXPECT_EQ(v6->first.bytes[1], 0);
  EXPECT_EQ(v6->second.bytes[0], 0xfd);
  EXPECT_EQ(v6->second.bytes[15], 0xff);
}

TEST(SwarmAddressTest, BadNetworksSayWhy) {
  for (const char* bad :
       {"10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "fd00::/129", "10.0.0/8", "name/8", ""}) {
    auto net = ParseNetwork(bad);
    ASSERT_FALSE(net.ok()) << bad;
    EXPECT_NE(net.error().Message().find(std::string("'") + bad + "'"), std::string::npos)
        << net.error().Message();
  }
}

}  // namespace
}  // namespace accelfs::testing
