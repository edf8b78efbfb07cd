// The ranks of a run over several GPUs: one process per GPU, as NCCL and PyTorch DDP run. Where a
// process stands (its layout, from bench's --hotops_gpus or a launcher's environment), the TCP
// rendezvous that hands rank 0's NCCL id to every rank, the command channel over which rank 0 tells
// the others what to run, and the watchdog that ends every rank when one of them fails.
// Plain POSIX sockets: no NCCL and no GPU needed (docs/scaling.md describes the protocol).
#pragma once
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace hotops::ranks {

// Bad launch input (inconsistent environment, a rank without a rendezvous address): what() is the
// one line the user sees.
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failure of the rendezvous or of the command channel (a peer gone, a timeout, a protocol error).
struct ChannelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Layout {
  int rank = 0;         // 0 .. world - 1; rank 0 runs Google Benchmark and writes the output
  int world = 1;        // processes, one per GPU, in the whole run
  int local_rank = 0;   // among the processes of this machine: which of its GPUs this one uses
  int local_world = 1;  // processes on this machine
  bool spawn = false;   // this process starts local_world - 1 copies of itself (--hotops_gpus)
  std::string root;     // rank 0's rendezvous address, host:port ("" single-node spawn: rank 0 picks a port)
  std::string source;   // what set the layout, for messages: "--hotops_gpus", "HOTOPS_RANK", ...; "" alone
};

// The layout from --hotops_gpus (`gpus`, 0 when not given) and the environment (`env`: getenv, or a
// table in tests). In order: HOTOPS_RANK, HOTOPS_WORLD_SIZE, HOTOPS_LOCAL_RANK,
// HOTOPS_LOCAL_WORLD_SIZE (what bench gives the copies it spawns, or any launcher of one's own);
// Open MPI's OMPI_COMM_WORLD_*; srun's SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID; MPICH's
// PMI_RANK, PMI_SIZE, MPI_LOCALRANKID. A launcher's ranks need rank 0's address: HOTOPS_ROOT_ADDR
// (host:port), else MASTER_ADDR and MASTER_PORT (PyTorch's names). Without a launcher,
// --hotops_gpus=G makes this process rank 0 of G, spawning the other G - 1; with HOTOPS_NNODES=N and
// HOTOPS_NODE_RANK=k (and a root address) it is rank k*G of N*G. Throws LaunchError.
Layout layout_from(int gpus, const std::function<const char*(const char*)>& env);

// The run's layout: set once by bench before its benchmarks are registered (default: one process).
const Layout& layout();
void set_layout(const Layout& l);

// Splits "host:port"; throws LaunchError naming `what` on anything else.
void split_address(const std::string& address, const std::string& what, std::string* host, int* port);

// The seconds from an environment variable (`fallback` when unset); throws LaunchError when bad.
double seconds_from_env(const char* name, double fallback, const std::function<const char*(const char*)>& env);

// Rank 0's listening socket, made before the other ranks exist so that they can connect to it
// (bound to 127.0.0.1 for a single-node spawn, to every interface for a given port).
class Listener {
 public:
  explicit Listener(const std::string& root);  // "" : 127.0.0.1 on a free port
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  int port() const { return port_; }
  std::string address() const;  // host:port to hand to the other ranks
  int release();                 // the socket, now owned by the caller

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string host_;
};

// The ranks' connections: rank 0 holds one to every other rank, each other rank one to rank 0.
// Every exchange below is made by all the ranks it names, in the same order.
class Group {
 public:
  // What each rank tells rank 0 when it joins. `signature` must be the same on every rank (the
  // build and the arguments: another binary or other flags would run other entries); `about` is
  // this rank's description for the output's context (machine, GPU, bus id).
  struct Hello {
    std::string signature;
    std::string about;
  };

  // Rank 0: accepts the world's other ranks on `listener` within `timeout_s`, checks their hellos
  // and sends each one `blob` (the NCCL unique id). `give_up`, asked twice a second, ends the wait
  // early with its reason (e.g. a spawned rank that exited). Throws ChannelError naming the
  // missing ranks.
  static std::unique_ptr<Group> accept(Listener& listener, const Layout& l, const Hello& mine, const std::string& blob,
                                       double timeout_s, const std::function<std::string()>& give_up = {});
  // Every other rank: connects to l.root (retrying until `timeout_s`: rank 0 may not listen yet),
  // sends its hello and receives the blob. Throws ChannelError.
  static std::unique_ptr<Group> join(const Layout& l, const Hello& mine, double timeout_s, std::string* blob);

  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Rank 0: every rank's `about`, by rank.
  const std::vector<std::string>& about() const { return about_; }

  // Rank 0 sends a command to every other rank; they receive it in order. A closed connection
  // (rank 0 ended) throws ChannelError.
  void send_command(const std::string& command);
  std::string next_command();

  // The verdict of ranks [0, members) on something each did: "" when every rank's `mine` is "",
  // else the first non-empty one prefixed with its rank ("rank 2: out of GPU memory ..."). Every
  // rank gets the same verdict.
  std::string agree(const std::string& mine, int members);
  // The largest `mine` of ranks [0, members), on every one of them.
  double agree_max(double mine, int members);

  // The watchdog: a thread that ends this process (after a line on stderr naming the cause, and
  // ending the processes it spawned) when a peer's connection closes while the run is not ending,
  // when a spawned process ends first, or when the run is busy (between busy() and idle()) without
  // progress() for `stall_s` seconds: a collective that some rank never reaches waits forever.
  void start_watchdog(double stall_s);
  void busy(const std::string& what);  // names the work for the stall message
  void progress();
  void idle();
  void ending();  // from here on a closed connection is the orderly end of the run
  // Processes this one spawned: ended with it; one that ends first ends the run.
  void adopt(const std::vector<pid_t>& children);
  // Waits for the adopted processes (up to `timeout_s`); "" when each exited 0, else what happened.
  std::string reap(double timeout_s);

  // Ends this process and the ones it spawned after one line on stderr, "hotops: rank R: <why>;
  // ending the run" (the other ranks follow when its connections close).
  void fatal(const std::string& why);  // returns only with on_fatal_for_test
  // Test only: the watchdog's verdict instead of ending the process.
  void on_fatal_for_test(std::function<void(const std::string&)> f) { fatal_hook_ = std::move(f); }

 private:
  Group(int rank, int world) : rank_(rank), world_(world) {}
  void watch();

  int rank_, world_;
  std::vector<int> fds_;  // rank 0: by rank (fds_[0] unused); others: fds_[0] is rank 0
  std::vector<std::string> about_;
  struct Child {
    pid_t pid;
    int status;  // waitpid's, once done
    bool done;
  };
  std::vector<Child> children_;
  std::mutex children_mutex_;
  std::thread watchdog_;
  std::atomic<bool> stop_{false}, ending_{false}, busy_{false};
  std::atomic<std::int64_t> last_progress_ns_{0};
  std::mutex what_mutex_;
  std::string what_;
  double stall_s_ = 0;
  std::function<void(const std::string&)> fatal_hook_;
};

// Starts local_world - 1 copies of this executable (/proc/self/exe) with `argv` (the command line
// as given) and this process's environment plus HOTOPS_RANK, HOTOPS_WORLD_SIZE, HOTOPS_LOCAL_RANK,
// HOTOPS_LOCAL_WORLD_SIZE and HOTOPS_ROOT_ADDR=`root`; each ends when this process does. Throws
// ChannelError when one cannot be started.
std::vector<pid_t> spawn_local(const Layout& l, const std::vector<std::string>& argv, const std::string& root);

}  // namespace hotops::ranks
