// Unit tests of the pieces behind issue 9's "first minute" fixes that need no process: who holds a
// port (/proc/net/tcp parsing, the message), the worker limits, the descendant tree, the cgroup v2
// path parsing, and the address syntax of --master_addr / --local_addr.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "agent/worker_limits.h"
#include "cli/value_parsers.h"
#include "process/descendants.h"
#include "sys/cgroup.h"
#include "sys/port_owner.h"

namespace ctrun {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PortOwner, FindsTheSocketsOnAPortListeningFirst) {
  const std::string tcp =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      "   0: 0100007F:7335 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 111 1 0\n"
      "   1: 0100007F:7335 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0\n"
      "   2: 0100007F:7335 0100007F:A001 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0\n"
      "   3: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0\n";
  EXPECT_THAT(SocketInodesOnPort(tcp, 0x7335), ElementsAre(222u, 111u));
  EXPECT_THAT(SocketInodesOnPort(tcp, 8080), ElementsAre(333u));
  EXPECT_TRUE(SocketInodesOnPort(tcp, 1).empty());
}

TEST(PortOwner, NamesARunOfTheSameJobAndOtherHolders) {
  PortHolder same{42, "ctrun --master_port 29500 ./train", "none"};
  EXPECT_EQ(DescribePortHolder(same, "none", "train", "--master_port"),
            "the port is held by pid 42 (ctrun --master_port 29500 ./train), a run of this same job (run id "
            "'none') that is still running: stop it (kill 42) or pick another --master_port");
  // The default run id alone does not make it the same job: the entrypoint must match too.
  EXPECT_EQ(DescribePortHolder(same, "none", "other", "--master_port"),
            "the port is held by pid 42 (ctrun --master_port 29500 ./train), a job with run id 'none': pick "
            "another --master_port, or --standalone for a free one");
  PortHolder job7{7, "ctrun x", "job7"};
  EXPECT_THAT(DescribePortHolder(job7, "job7", "y", "--rdzv_endpoint"), HasSubstr("a run of this same job (run id 'job7')"));
  EXPECT_EQ(DescribePortHolder(PortHolder{0, "", ""}, "none", "t", "--master_port"),
            "the port is in use by a process this user cannot see: pick another --master_port, or --standalone "
            "for a free one");
  EXPECT_EQ(DescribePortHolder(std::nullopt, "none", "t", "--master_port"),
            "the port is in use: pick another --master_port, or --standalone for a free one");
  // --standalone cannot help a multi-node job's rendezvous store.
  EXPECT_EQ(DescribePortHolder(std::nullopt, "none", "t", "--master_port", /*single_node=*/false),
            "the port is in use: pick another --master_port");
}

// A holder's command line is shown on one line: a `python -c` program's newlines become spaces.
TEST(PortOwner, TheHoldersCommandLineIsOneLine) {
  char tmpl[] = "/tmp/ctrun-proc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  ASSERT_EQ(::mkdir((root + "/net").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/42").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/42/fd").c_str(), 0755), 0);
  auto write = [](const std::string& path, const std::string& text) {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  };
  write(root + "/net/tcp", "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
                           "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345\n");
  write(root + "/42/cmdline", std::string("python3\0-c\0import socket\nprint(1)\0", 34));
  ASSERT_EQ(::symlink("socket:[12345]", (root + "/42/fd/3").c_str()), 0);
  auto holder = FindPortHolder(30000, root);
  ASSERT_TRUE(holder);
  EXPECT_EQ(holder->pid, 42);
  EXPECT_EQ(holder->command, "python3 -c import socket print(1)");
  (void)std::system(("rm -rf " + root).c_str());
}

TEST(WorkerLimits, RefusesWhatThePidFdAndProcessLimitsCannotTakeWithTheNumbers) {
  SystemLimits l;
  l.pid_max = 32768;
  l.nofile = 20000;
  EXPECT_TRUE(CheckWorkerLimits(64, l).ok());
  const Status s = CheckWorkerLimits(100000, l);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "--nproc_per_node=100000 is more workers than this machine allows: pid_max is 32768 "
            "(/proc/sys/kernel/pid_max); RLIMIT_NOFILE is 20000 (ulimit -Hn) and ctrun needs up to 8 per worker "
            "+ 64, so at most 2492 workers");
  l.nproc = 100;  // not root
  EXPECT_THAT(CheckWorkerLimits(100, l).message(), HasSubstr("RLIMIT_NPROC is 100 processes for this user (ulimit -u)"));
  EXPECT_TRUE(CheckWorkerLimits(99, l).ok());
  EXPECT_TRUE(CheckWorkerLimits(2492, SystemLimits{std::nullopt, std::nullopt, 20000}).ok());
  EXPECT_FALSE(CheckWorkerLimits(2493, SystemLimits{std::nullopt, std::nullopt, 20000}).ok());
}

TEST(Descendants, WalksTheTreeBelowTheRootParentsFirst) {
  // 1 -> 10 -> {11, 12}; 12 -> 13; 20 is elsewhere; 14's parent 13 (a setsid grandchild's child).
  const std::map<pid_t, pid_t> parents = {{10, 1}, {11, 10}, {12, 10}, {13, 12}, {14, 13}, {20, 2}, {1, 0}};
  EXPECT_THAT(DescendantsFromParents(10, parents), ElementsAre(11, 12, 13, 14));
  EXPECT_THAT(DescendantsFromParents(1, parents), ElementsAre(10, 11, 12, 13, 14));
  EXPECT_TRUE(DescendantsFromParents(20, parents).empty());
}

TEST(Descendants, ListsThisProcessesChildren) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  const std::vector<pid_t> d = ListDescendants(::getpid());
  EXPECT_NE(std::find(d.begin(), d.end(), child), d.end());
  ::kill(child, SIGKILL);
  int st = 0;
  ::waitpid(child, &st, 0);
}

TEST(Cgroup, FindsTheCgroup2MountAndOwnDirectory) {
  const std::string mountinfo =
      "25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755\n"
      "36 25 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n";
  const auto m = ParseCgroup2Mount(mountinfo);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mount_point, "/sys/fs/cgroup/unified");
  EXPECT_EQ(CgroupDirectory(*m, "/"), "/sys/fs/cgroup/unified");
  EXPECT_EQ(CgroupDirectory(*m, "/user.slice/job.scope"), "/sys/fs/cgroup/unified/user.slice/job.scope");
  EXPECT_EQ(CgroupDirectory(Cgroup2Mount{"/sys/fs/cgroup", "/kubepods/pod1"}, "/kubepods/pod1/c"), "/sys/fs/cgroup/c");
  EXPECT_FALSE(ParseCgroup2Mount("25 30 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n").has_value());
  EXPECT_EQ(ParseCgroup2Path("4:memory:/x\n0::/user.slice/a.scope\n"), std::optional<std::string>("/user.slice/a.scope"));
  EXPECT_FALSE(ParseCgroup2Path("4:memory:/x\n").has_value());
}

TEST(Cgroup, AWorkersCgroupNameIsCtrunDashPidWithAnOptionalNamespaceSuffix) {
  const auto plain = ParseWorkerCgroupName("ctrun-4242");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->pid, 4242);
  EXPECT_EQ(plain->suffix, "");
  const auto ns = ParseWorkerCgroupName("ctrun-7-ns4026532281");
  ASSERT_TRUE(ns.has_value());
  EXPECT_EQ(ns->pid, 7);
  EXPECT_EQ(ns->suffix, "-ns4026532281");
  for (const char* other : {"ctrun-", "ctrun-x1", "ctrun-0", "ctrun--3", "ctrun", "rank-0", "xctrun-5", "/sys/fs/cgroup/ctrun-5",
                            "ctrun-99999999999999999999", "ctrun-5junk", "ctrun-5-ns", "ctrun-5-nsx", "ctrun-5-ns7x"})
    EXPECT_FALSE(ParseWorkerCgroupName(other).has_value()) << other;
}

TEST(ParseAddress, TakesNamesIpv4AndIpv6WithOrWithoutBracketsButNoPort) {
  EXPECT_EQ(*ParseAddress("[::1]"), "::1");
  EXPECT_EQ(*ParseAddress("::1"), "::1");
  EXPECT_EQ(*ParseAddress("fe80::1%eth0"), "fe80::1%eth0");
  EXPECT_EQ(*ParseAddress("node-1.example.com"), "node-1.example.com");
  EXPECT_EQ(*ParseAddress("10.0.0.1"), "10.0.0.1");
  for (const char* bad : {"", "[::1", "[]", "[::1]:29500", "host:29500", "a b", "h/x"})
    EXPECT_FALSE(ParseAddress(bad).ok()) << bad;
  EXPECT_THAT(ParseAddress("host:29500").message(), HasSubstr("an address takes no port here"));
}

}  // namespace
}  // namespace ctrun
