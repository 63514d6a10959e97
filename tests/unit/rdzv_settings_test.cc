#include "rendezvous/settings.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "agent/launch_checks.h"

namespace ctrun::rdzv {
namespace {

TEST(ParseHostPort, AcceptsNamesIPv4AndBracketedIPv6) {
  auto a = ParseHostPort("node1:1234", 29400);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "node1");
  EXPECT_EQ(a->port, 1234);
  auto b = ParseHostPort("10.0.0.1", 29400);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->port, 29400);
  auto c = ParseHostPort("[::1]:5", 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 5);
  EXPECT_EQ(c->ToString(), "[::1]:5");
  auto d = ParseHostPort("[fe80::1]", 7);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->port, 7);
  auto e = ParseHostPort("::1", 7);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  for (const char* bad : {"", "h:", "h:0", "h:65536", "h:12x", "[::1", "[::1]x", ":80", "[]:1"})
    EXPECT_FALSE(ParseHostPort(bad, 1).ok()) << bad;
}

// torchrun splits at the last ':' (so "::1" would be host ":" and port 1); ctrun takes a valid
// bare IPv6 address as an address, and refuses the rest in one line that shows what to write.
TEST(ParseHostPort, TextWithManyColonsIsAnIPv6AddressOrAnError) {
  auto v6 = ParseHostPort("fe80::1:2961", 7);
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "fe80::1:2961");
  EXPECT_EQ(v6->port, 7);
  EXPECT_EQ(ParseHostPort("fe80::1%eth0", 7)->host, "fe80::1%eth0");
  EXPECT_EQ(ParseHostPort("fe80::1%lo:29613", 7).message(),
            "'fe80::1%lo:29613': an IPv6 address with a port is written in brackets: [fe80::1%lo]:29613");
  EXPECT_EQ(ParseHostPort("::1:29613", 7).message(),
            "'::1:29613': an IPv6 address with a port is written in brackets: [::1]:29613");
  EXPECT_EQ(ParseHostPort("127.0.0.1::", 7).message(), "'127.0.0.1::' is neither HOST:PORT nor an IPv6 address");
  EXPECT_EQ(ParseHostPort("a:b:c", 7).message(), "'a:b:c' is neither HOST:PORT nor an IPv6 address");
}

LaunchConfig Multi(const std::string& backend, int min, int max) {
  LaunchConfig c;
  c.rdzv_backend = backend;
  c.min_nodes = min;
  c.max_nodes = max;
  return c;
}

TEST(ResolveSettings, StandaloneAndOneStaticNodeStaySingleNode) {
  LaunchConfig c;
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_FALSE(c.rdzv.multi_node);
  c = Multi("c10d", 1, 1);
  c.standalone = true;
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_FALSE(c.rdzv.multi_node);
  c = Multi("c10d", 2, 2);
  c.standalone = true;
  EXPECT_EQ(ResolveSettings(&c).message(), "--standalone runs a single node, but --nnodes=2 asks for more: drop one of them");
  c = Multi("c10d", 1, 3);
  c.standalone = true;
  c.nnodes_from_env = true;  // a Kubeflow pod's PET_NNODES: named as such
  EXPECT_EQ(ResolveSettings(&c).message(), "--standalone runs a single node, but PET_NNODES=1:3 asks for more: drop one of them");
}

TEST(ResolveSettings, StaticUsesMasterAddrAndPortLikeTorchrun) {
  LaunchConfig c = Multi("static", 2, 2);
  c.master_addr = "10.1.2.3";
  c.master_port = 1234;
  c.node_rank = 1;
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_TRUE(c.rdzv.multi_node);
  ASSERT_EQ(c.rdzv.endpoints.size(), 1u);
  EXPECT_EQ(c.rdzv.endpoints[0].ToString(), "10.1.2.3:1234");
  c = Multi("static", 2, 2);
  c.master_addr = "[::1]";
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.endpoints[0].host, "::1");
  EXPECT_EQ(c.rdzv.endpoints[0].port, 29500);
}

// torchrun sets rdzv_configs["timeout"] = 900 when it is missing; the static backend waits that
// long for the other nodes, c10d's join_timeout stays 600.
TEST(ResolveSettings, StaticWaitsTorchrunsNineHundredSecondsUnlessTold) {
  LaunchConfig c = Multi("static", 2, 2);
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.join_timeout, 900);
  c = Multi("static", 2, 2);
  c.rdzv_conf = {{"timeout", "30"}};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.join_timeout, 30);
  c = Multi("c10d", 1, 2);
  c.rdzv_endpoint = "127.0.0.1:29400";
  ASSERT_TRUE(ResolveSettings(&c).ok()) << ResolveSettings(&c).message();
  EXPECT_EQ(c.rdzv.join_timeout, 600);
}

// Each backend reads its own key, as torchrun's do: c10d join_timeout (timeout is torchrun's
// static one, which it always passes as 900 and c10d ignores), static timeout; a static job
// given join_timeout alone waits that long.
TEST(ResolveSettings, EachBackendReadsItsOwnTimeoutKey) {
  LaunchConfig c = Multi("c10d", 1, 2);
  c.rdzv_endpoint = "127.0.0.1:29400";
  c.rdzv_conf = {{"join_timeout", "600"}, {"timeout", "2"}};
  ASSERT_TRUE(ResolveSettings(&c).ok()) << ResolveSettings(&c).message();
  EXPECT_EQ(c.rdzv.join_timeout, 600);
  c = Multi("static", 2, 2);
  c.rdzv_conf = {{"join_timeout", "600"}, {"timeout", "2"}};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.join_timeout, 2);
  c = Multi("static", 2, 2);
  c.rdzv_conf = {{"join_timeout", "45"}};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.join_timeout, 45);
  c = Multi("static", 2, 2);
  c.rdzv_conf = {{"rank", "1"}};  // torchrun's own key: accepted, --node_rank decides
  ASSERT_TRUE(ResolveSettings(&c).ok()) << ResolveSettings(&c).message();
  EXPECT_EQ(c.node_rank, 0);
}

// Restart flags of one node are not silently ignored in a multi-node job.
TEST(ResolveSettings, MultiNodeSaysItIgnoresSingleNodeRestartFlags) {
  LaunchConfig c = Multi("static", 2, 2);
  c.restart_backoff = 5;
  c.heartbeat_timeout = 30;
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(MultiNodeRestartFlagsNotice(c),
            "--restart-backoff and the crash-loop guard (--crash-loop-limit): ignored in a multi-node job, which "
            "restarts when its rendezvous says so (single node only)");
  LaunchConfig one;
  one.restart_backoff = 5;
  ASSERT_TRUE(ResolveSettings(&one).ok());
  EXPECT_EQ(MultiNodeRestartFlagsNotice(one), "");
}

TEST(ResolveSettings, StaticRefusesRangesAndOutOfRangeNodeRanks) {
  LaunchConfig c = Multi("static", 1, 2);
  auto s = ResolveSettings(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fixed node count"), std::string::npos);
  c = Multi("static", 2, 2);
  c.node_rank = 2;
  s = ResolveSettings(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--node_rank=2 is out of range"), std::string::npos);
}

TEST(ResolveSettings, NodeRankMustBeBelowNnodesForStaticAndStandalone) {
  LaunchConfig c;
  c.node_rank = 1;  // --node_rank=1 without --nnodes
  Status s = ResolveSettings(&c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "--node_rank=1 is out of range for --nnodes=1 (the default): node ranks are 0..0");
  c = LaunchConfig{};
  c.standalone = true;
  c.node_rank = 1;
  EXPECT_NE(ResolveSettings(&c).message().find("--node_rank=1 with --standalone"), std::string::npos);
  c = Multi("c10d", 1, 2);  // c10d assigns node ranks: --node_rank is not used
  c.rdzv_endpoint = "h:1";
  c.node_rank = 5;
  EXPECT_TRUE(ResolveSettings(&c).ok());
}

TEST(ResolveSettings, OneStaticNodeUsesTheEndpointWhichNeedsAPort) {
  LaunchConfig c;
  c.rdzv_endpoint = "127.0.0.1:1234";
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_FALSE(c.rdzv.multi_node);
  ASSERT_EQ(c.rdzv.endpoints.size(), 1u);
  EXPECT_EQ(c.rdzv.endpoints[0].ToString(), "127.0.0.1:1234");
  c = LaunchConfig{};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.endpoints[0].ToString(), "127.0.0.1:29500");
  c = LaunchConfig{};
  c.rdzv_endpoint = "localhost:abc";
  EXPECT_EQ(ResolveSettings(&c).message(), "--rdzv_endpoint=localhost:abc: bad port in 'localhost:abc'");
  c.rdzv_endpoint = "localhost";
  EXPECT_NE(ResolveSettings(&c).message().find("the static backend needs HOST:PORT"), std::string::npos);
  c = LaunchConfig{};
  c.rdzv_conf = {{"timeout", "abc"}};
  EXPECT_NE(ResolveSettings(&c).message().find("timeout=abc"), std::string::npos);
  c.standalone = true;
  EXPECT_NE(ResolveSettings(&c).message().find("timeout=abc"), std::string::npos);
}

// No endpoint is torchrun's localhost at the backend's port: `--rdzv_backend=c10d` alone runs a
// single machine's job, as under torchrun.
TEST(ResolveSettings, C10dWithoutAnEndpointIsLocalhostAndTakesTorchrunsConfKeys) {
  LaunchConfig c = Multi("c10d", 1, 4);
  ASSERT_TRUE(ResolveSettings(&c).ok()) << ResolveSettings(&c).message();
  ASSERT_EQ(c.rdzv.endpoints.size(), 1u);
  EXPECT_EQ(c.rdzv.endpoints[0].host, "localhost");
  EXPECT_EQ(c.rdzv.endpoints[0].port, 29400);
  c = Multi("etcd", 1, 4);
  ASSERT_TRUE(ResolveSettings(&c).ok()) << ResolveSettings(&c).message();
  EXPECT_EQ(c.rdzv.endpoints[0].port, 2379);
  c = Multi("c10d", 1, 4);
  c.rdzv_endpoint = "head";
  c.rdzv_conf = {{"join_timeout", "30"}, {"last_call_timeout", "0.5"}, {"keep_alive_interval", "1"},
                 {"keep_alive_max_attempt", "2"}, {"is_host", "0"}};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_TRUE(c.rdzv.multi_node);
  EXPECT_EQ(c.rdzv.endpoints[0].port, 29400);
  EXPECT_EQ(c.rdzv.join_timeout, 30);
  EXPECT_EQ(c.rdzv.last_call_timeout, 0.5);
  EXPECT_EQ(c.rdzv.keep_alive_max_attempt, 2);
  ASSERT_TRUE(c.rdzv.is_host);
  EXPECT_FALSE(*c.rdzv.is_host);
  // torch's get_as_bool spellings, in any case.
  for (const auto& [text, value] : std::vector<std::pair<std::string, bool>>{
           {"T", true}, {"y", true}, {"YES", true}, {"TRUE", true}, {"n", false}, {"F", false}, {"No", false}}) {
    c.rdzv_conf = {{"is_host", text}};
    ASSERT_TRUE(ResolveSettings(&c).ok()) << text;
    ASSERT_TRUE(c.rdzv.is_host);
    EXPECT_EQ(*c.rdzv.is_host, value) << text;
  }
  // A timeout past ~9.2e9 s would wrap the clocks' nanoseconds: at most 1e9.
  c.rdzv_conf = {{"join_timeout", "1e10"}};
  EXPECT_NE(ResolveSettings(&c).message().find("join_timeout=1e10: expected a number of seconds: must be at most 1e9"),
            std::string::npos);
  c.rdzv_conf = {};
}

// torchrun takes a c10d endpoint on port 0 (any free port; its --standalone is just that), and
// launch scripts use it for one node (torchtitan's run_train.sh): ctrun runs such a job as
// --standalone. On more nodes the others could not learn the port: refused, saying so.
TEST(ResolveSettings, AC10dEndpointOnPortZeroIsStandaloneForOneNode) {
  LaunchConfig c = Multi("c10d", 1, 1);
  c.rdzv_endpoint = "localhost:0";
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_TRUE(c.standalone);
  EXPECT_FALSE(c.rdzv.multi_node);
  c = Multi("c10d", 1, 1);
  c.rdzv_endpoint = "[::1]:0";
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_TRUE(c.standalone);
  c = Multi("c10d", 1, 1);
  c.rdzv_endpoint = "fe80::1:0";  // a bare IPv6 address: the default port, a real rendezvous
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_FALSE(c.standalone);
  c = Multi("c10d", 1, 2);
  c.rdzv_endpoint = "localhost:0";
  const Status st = ResolveSettings(&c);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "--rdzv_endpoint=localhost:0: port 0 (any free port) works only for a single node "
                          "(--nnodes=1): the other nodes could not learn the port");
  c = Multi("etcd", 1, 1);
  c.rdzv_endpoint = "localhost:0";
  EXPECT_FALSE(ResolveSettings(&c).ok()) << "etcd listens on a real port";
}

TEST(ResolveSettings, EtcdTakesSeveralEndpointsAndV2IsAnAlias) {
  LaunchConfig c = Multi("etcd-v2", 2, 3);
  c.rdzv_endpoint = "e1,e2:2390,[::1]";
  c.rdzv_conf = {{"etcd_prefix", "/jobs"}, {"protocol", "https"}, {"cacert", "/proc/self/cmdline"}};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.backend, "etcd");
  ASSERT_EQ(c.rdzv.endpoints.size(), 3u);
  EXPECT_EQ(c.rdzv.endpoints[0].port, 2379);
  EXPECT_EQ(c.rdzv.endpoints[1].port, 2390);
  EXPECT_EQ(c.rdzv.etcd_prefix, "/jobs");
}

// torchrun's etcd-v2 backend names its TLS files ca_cert, ssl_cert, ssl_cert_key; a certificate
// alone is a PEM file that holds the key too (as torchrun takes it).
TEST(ResolveSettings, EtcdTlsFilesTakeBothBackendsNamesAndAreCheckedAtTheStart) {
  LaunchConfig c = Multi("etcd-v2", 2, 2);
  c.rdzv_endpoint = "e1";
  c.rdzv_conf = {{"ca_cert", "/proc/self/cmdline"}, {"ssl_cert", "/proc/self/environ"}, {"ssl_cert_key", "/proc/self/stat"}};
  ASSERT_TRUE(ResolveSettings(&c).ok());
  EXPECT_EQ(c.rdzv.cacert, "/proc/self/cmdline");
  EXPECT_EQ(c.rdzv.cert, "/proc/self/environ");
  EXPECT_EQ(c.rdzv.key, "/proc/self/stat");
  LaunchConfig alone = Multi("etcd", 2, 2);
  alone.rdzv_endpoint = "e1";
  alone.rdzv_conf = {{"cert", "/proc/self/environ"}};
  EXPECT_TRUE(ResolveSettings(&alone).ok());
  LaunchConfig missing = Multi("etcd", 2, 2);
  missing.rdzv_endpoint = "e1";
  missing.rdzv_conf = {{"ca_cert", "/nonexistent/ca.pem"}};
  EXPECT_EQ(ResolveSettings(&missing).message(), "--rdzv_conf ca_cert=/nonexistent/ca.pem: No such file or directory");
  LaunchConfig dir = Multi("etcd", 2, 2);
  dir.rdzv_endpoint = "e1";
  dir.rdzv_conf = {{"cacert", "/"}};
  EXPECT_EQ(ResolveSettings(&dir).message(), "--rdzv_conf cacert=/: not a regular file (give one PEM file)");
  const std::string pem = std::filesystem::temp_directory_path() / ("ctrun-cert-" + std::to_string(::getpid()) + ".pem");
  const std::string link = pem + ".link";
  std::ofstream(pem) << "x";
  std::filesystem::create_symlink(pem, link);
  LaunchConfig same = Multi("etcd", 2, 2);
  same.rdzv_endpoint = "e1";
  same.rdzv_conf = {{"cert", pem}, {"ssl_cert", link}};  // one file, two spellings
  EXPECT_TRUE(ResolveSettings(&same).ok());
  std::filesystem::remove(link);
  std::filesystem::remove(pem);
  LaunchConfig two = Multi("etcd", 2, 2);
  two.rdzv_endpoint = "e1";
  two.rdzv_conf = {{"cert", "/proc/self/environ"}, {"ssl_cert", "/proc/self/stat"}};
  EXPECT_EQ(ResolveSettings(&two).message(),
            "--rdzv_conf: cert=/proc/self/environ and ssl_cert=/proc/self/stat name two different files for one "
            "setting; give one");
}

TEST(ResolveSettings, BadConfValuesAreOneLineNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"join_timeout", "-1"}, {"join_timeout", "abc"}, {"keep_alive_max_attempt", "0"}, {"is_host", "maybe"},
      {"store_type", "file"}, {"protocol", "ftp"},     {"no_such_key", "1"},            {"cert", "/c.pem"},
      {"key", "/proc/self/stat"}};
  for (const auto& [k, v] : bad) {
    LaunchConfig c = Multi("c10d", 2, 2);
    c.rdzv_endpoint = "h";
    c.rdzv_conf = {{k, v}};
    auto s = ResolveSettings(&c);
    ASSERT_FALSE(s.ok()) << k << "=" << v;
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
    EXPECT_NE(s.message().find(k), std::string::npos) << s.message();
  }
  LaunchConfig c = Multi("zookeeper", 2, 2);
  EXPECT_NE(ResolveSettings(&c).message().find("unknown backend"), std::string::npos);
}

}  // namespace
}  // namespace ctrun::rdzv
