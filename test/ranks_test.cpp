// The ranks of a multi-GPU run without a GPU: the layout read from flags and launchers'
// environments, and the rendezvous, commands, agreement and watchdog over loopback TCP, with
// threads as the ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hotops/ranks.h"

namespace hotops::ranks {
namespace {

using Env = std::map<std::string, std::string>;

Layout layout_with(int gpus, const Env& env) {
  return layout_from(gpus, [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

// What `f()` threw as an E, "" when it returned.
template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

std::string refusal(int gpus, const Env& env) {
  return error_of<LaunchError>([&] { layout_with(gpus, env); });
}

TEST(RanksLayout, AloneUnlessAskedOrLaunched) {
  const Layout l = layout_with(0, {});
  EXPECT_EQ(l.world, 1);
  EXPECT_EQ(l.rank, 0);
  EXPECT_FALSE(l.spawn);
  EXPECT_EQ(layout_with(1, {}).world, 1);
  // Slurm's variables in a batch script, outside srun, launch nothing.
  EXPECT_EQ(layout_with(0, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}).world, 1);
}

TEST(RanksLayout, GpusFlagSpawnsThisMachinesRanks) {
  const Layout l = layout_with(4, {});
  EXPECT_EQ(l.world, 4);
  EXPECT_EQ(l.rank, 0);
  EXPECT_EQ(l.local_world, 4);
  EXPECT_TRUE(l.spawn);
  EXPECT_EQ(l.root, "");
  EXPECT_EQ(l.source, "--hotops_gpus");
  // Several machines: machine k holds ranks k*G .. k*G+G-1 and needs rank 0's address.
  const Layout m = layout_with(8, {{"HOTOPS_NNODES", "2"}, {"HOTOPS_NODE_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(m.world, 16);
  EXPECT_EQ(m.rank, 8);
  EXPECT_EQ(m.root, "node0:29500");
  EXPECT_NE(refusal(8, {{"HOTOPS_NNODES", "2"}, {"HOTOPS_NODE_RANK", "1"}}).find("needs rank 0's address"), std::string::npos);
  EXPECT_NE(refusal(8, {{"HOTOPS_NNODES", "2"}}).find("needs HOTOPS_NODE_RANK"), std::string::npos);
}

TEST(RanksLayout, LaunchersEnvironments) {
  const Layout own = layout_with(2, {{"HOTOPS_RANK", "1"}, {"HOTOPS_WORLD_SIZE", "2"}, {"HOTOPS_LOCAL_RANK", "1"},
                                     {"HOTOPS_LOCAL_WORLD_SIZE", "2"}, {"HOTOPS_ROOT_ADDR", "127.0.0.1:4000"}});
  EXPECT_EQ(own.rank, 1);
  EXPECT_EQ(own.world, 2);
  EXPECT_EQ(own.local_rank, 1);
  EXPECT_FALSE(own.spawn);
  EXPECT_EQ(own.source, "HOTOPS_RANK");
  const Layout mpi = layout_with(0, {{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"HOTOPS_ROOT_ADDR", "head:29500"}});
  EXPECT_EQ(mpi.rank, 5);
  EXPECT_EQ(mpi.local_rank, 1);
  EXPECT_EQ(mpi.local_world, 4);
  EXPECT_EQ(mpi.source, "OMPI_COMM_WORLD_RANK");
  const Layout srun = layout_with(0, {{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "3"},
                                      {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(srun.rank, 3);
  EXPECT_EQ(srun.root, "n1:1234");
}

TEST(RanksLayout, BadLaunchInputIsOneClearLine) {
  EXPECT_NE(refusal(0, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}).find(
                "needs rank 0's address: set HOTOPS_ROOT_ADDR=host:port"),
            std::string::npos);
  EXPECT_NE(refusal(0, {{"HOTOPS_RANK", "1"}}).find("HOTOPS_WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(refusal(0, {{"HOTOPS_RANK", "2"}, {"HOTOPS_WORLD_SIZE", "2"}, {"HOTOPS_ROOT_ADDR", "a:1"}}).find(
                "bad value '2' for HOTOPS_RANK"),
            std::string::npos);
  EXPECT_NE(refusal(0, {{"HOTOPS_RANK", "1"}, {"HOTOPS_WORLD_SIZE", "2"}, {"HOTOPS_ROOT_ADDR", "nocolon"}}).find(
                "expected host:port"),
            std::string::npos);
  EXPECT_NE(refusal(0, {{"HOTOPS_RANK", "1"}, {"HOTOPS_WORLD_SIZE", "2"}, {"MASTER_ADDR", "x"}}).find("go together"),
            std::string::npos);
  EXPECT_NE(refusal(4, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"},
                        {"HOTOPS_ROOT_ADDR", "h:1"}})
                .find("--hotops_gpus=4 but OMPI_COMM_WORLD_SIZE"),
            std::string::npos);
  for (const std::string& e : {refusal(0, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}), refusal(0, {{"HOTOPS_RANK", "1"}})})
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

constexpr double kTimeout = 20;

// A run of `world` ranks over loopback: rank 0 here, the others on threads; `body(rank, group)`
// runs on every rank once all have joined.
template <class Body>
void run_ranks(int world, Body body) {
  Layout root;
  root.world = world;
  Listener listener("");
  const std::string address = listener.address();
  std::vector<std::future<void>> others;
  for (int r = 1; r < world; ++r)
    others.push_back(std::async(std::launch::async, [&, r] {
      Layout l;
      l.rank = r, l.world = world, l.root = address;
      std::string blob;
      auto g = Group::join(l, {"same", "rank " + std::to_string(r) + " gpu"}, kTimeout, &blob);
      EXPECT_EQ(blob, std::string("the id\0with a zero", 17));
      body(r, *g);
    }));
  auto g = Group::accept(listener, root, {"same", "rank 0 gpu"}, std::string("the id\0with a zero", 17), kTimeout);
  ASSERT_EQ(g->about().size(), static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) EXPECT_EQ(g->about()[static_cast<std::size_t>(r)], "rank " + std::to_string(r) + " gpu");
  body(0, *g);
  for (auto& f : others) f.get();
}

TEST(RanksRendezvous, CommandsAndAgreementReachEveryRank) {
  run_ranks(4, [](int rank, Group& g) {
    EXPECT_EQ(g.rank(), rank);
    if (rank == 0) {
      g.send_command("run 1 10 allreduce/x");
      g.send_command("exit");
    } else {
      EXPECT_EQ(g.next_command(), "run 1 10 allreduce/x");
      EXPECT_EQ(g.next_command(), "exit");
    }
    // Every rank fine: no verdict. Ranks 1 and 2 fail: every rank hears rank 1's reason.
    EXPECT_EQ(g.agree("", 4), "");
    EXPECT_EQ(g.agree(rank == 1 || rank == 2 ? "out of memory on " + std::to_string(rank) : "", 4), "rank 1: out of memory on 1");
    // Ranks 0..1 only: rank 3 is not asked (it would wait for the next command).
    if (rank < 2) {
      EXPECT_EQ(g.agree(rank == 0 ? "bad" : "", 2), "rank 0: bad");
    }
    EXPECT_DOUBLE_EQ(g.agree_max(rank == 2 ? 3.5 : 1.0 + rank * 0.1, 4), 3.5);
    if (rank < 3) {
      EXPECT_DOUBLE_EQ(g.agree_max(rank, 3), 2.0);
    }
  });
}

// Rank 0 of a run of `world` ranks accepts (waiting up to `root_wait_s`) while rank 1 joins on a
// thread, each saying its own hello: what each threw ("" where it returned).
struct Refusals {
  std::string root, joiner;
};
Refusals rank_one_joins(int world, const Group::Hello& root_hello, const Group::Hello& joiner_hello, double root_wait_s) {
  Layout root;
  root.world = world;
  Listener listener("");
  Layout l;
  l.rank = 1, l.world = world, l.root = listener.address();
  auto joiner = std::async(std::launch::async, [&] {
    std::string blob;
    return error_of<ChannelError>([&] { Group::join(l, joiner_hello, kTimeout, &blob); });
  });
  Refusals r;
  r.root = error_of<ChannelError>([&] { Group::accept(listener, root, root_hello, "id", root_wait_s); });
  r.joiner = joiner.get();
  return r;
}

TEST(RanksRendezvous, AnotherBuildOrOtherArgumentsAreRefused) {
  const Refusals r = rank_one_joins(2, {"hotops 0.1.0 abc --benchmark_filter=y", ""},
                                    {"hotops 0.1.0 abc --benchmark_filter=x", ""}, kTimeout);
  EXPECT_NE(r.root.find("rank 1 runs another build or other arguments than rank 0"), std::string::npos) << r.root;
  EXPECT_NE(r.joiner.find("another build or other arguments"), std::string::npos) << r.joiner;
}

TEST(RanksRendezvous, MissingRanksAreNamed) {
  const Refusals r = rank_one_joins(3, {"s", ""}, {"s", ""}, 1.0);
  EXPECT_NE(r.root.find("rank 2 of 3 did not join within 1 s"), std::string::npos) << r.root;
  EXPECT_EQ(r.joiner, "");
  // A spawned rank that ended ends the wait at once, with its reason.
  Layout root;
  root.world = 3;
  Listener again("");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string refused = error_of<ChannelError>(
      [&] { Group::accept(again, root, {"s", ""}, "id", 60, [] { return std::string("rank 1 exited with code 2"); }); });
  EXPECT_NE(refused.find("rank 1 exited with code 2"), std::string::npos) << refused;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(RanksRendezvous, AnUnreachableRootIsNamed) {
  int port = 0;
  {
    Listener gone("");  // a port nobody listens on once it is closed
    port = gone.port();
  }
  Layout l;
  l.rank = 3, l.world = 4, l.root = "127.0.0.1:" + std::to_string(port);
  std::string blob;
  const std::string error = error_of<ChannelError>([&] { Group::join(l, {"s", ""}, 0.5, &blob); });
  EXPECT_NE(error.find("rank 3 could not reach rank 0 at 127.0.0.1:" + std::to_string(port) + " within 0 s"), std::string::npos)
      << error;
}

// Rank 0 and rank 1 of a run of two, joined over loopback.
struct TwoRanks {
  std::unique_ptr<Group> root, worker;
};
TwoRanks two_ranks() {
  Layout root;
  root.world = 2;
  Listener listener("");
  Layout l;
  l.rank = 1, l.world = 2, l.root = listener.address();
  auto joiner = std::async(std::launch::async, [&] {
    std::string blob;
    return Group::join(l, {"s", ""}, kTimeout, &blob);
  });
  TwoRanks t;
  t.root = Group::accept(listener, root, {"s", ""}, "id", kTimeout);
  t.worker = joiner.get();
  return t;
}

TEST(RanksWatchdog, APeerThatEndsEndsTheRun) {
  TwoRanks t = two_ranks();
  std::promise<std::string> verdict;
  t.root->on_fatal_for_test([&](const std::string& why) { verdict.set_value(why); });
  t.root->start_watchdog(0);
  t.worker.reset();  // rank 1 ends without the run ending
  auto f = verdict.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "the watchdog did not notice";
  EXPECT_NE(f.get().find("rank 1's connection closed"), std::string::npos);
}

TEST(RanksWatchdog, AnOrderlyEndIsNotAFailureAndRankZerosEndReachesTheOthers) {
  TwoRanks t = two_ranks();
  std::atomic<bool> failed{false};
  t.root->on_fatal_for_test([&](const std::string&) { failed = true; });
  t.root->start_watchdog(0);
  t.root->ending();
  t.root->send_command("exit");
  EXPECT_EQ(t.worker->next_command(), "exit");
  t.worker.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_FALSE(failed);
  // Rank 0 gone: the next command is an error that says so.
  TwoRanks u = two_ranks();
  u.root.reset();
  const std::string error = error_of<ChannelError>([&] { u.worker->next_command(); });
  EXPECT_NE(error.find("rank 0 ended"), std::string::npos) << error;
}

TEST(RanksWatchdog, AStallEndsTheRun) {
  run_ranks(2, [](int rank, Group& g) {
    if (rank != 0) return;
    std::promise<std::string> verdict;
    g.on_fatal_for_test([&](const std::string& why) { verdict.set_value(why); });
    g.ending();  // the other rank may leave first here
    g.start_watchdog(0.3);
    g.busy("allreduce/cuda/f32/fwd/bytes:8/gpus:2/inplace:0");
    auto f = verdict.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_NE(f.get().find("no progress for 0 s in allreduce/cuda/f32/fwd/bytes:8/gpus:2/inplace:0"), std::string::npos);
  });
}

}  // namespace
}  // namespace hotops::ranks
