// The ranks of a multi-GPU run: layout from flags and environment, TCP rendezvous, command channel,
// watchdog, and the spawning of one process per local GPU.
#include "hotops/ranks.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

extern char** environ;

namespace hotops::ranks {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[] = "hotops-rendezvous-1";
constexpr std::uint32_t kMaxMessage = 1u << 20;

Layout& the_layout() {
  static Layout l;
  return l;
}

std::string errno_text() { return std::strerror(errno); }

int parse_int(const std::string& name, const std::string& v, int lo, int hi, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    throw LaunchError("hotops: bad value '" + v + "' for " + name + where + ": expected an integer from " +
                      std::to_string(lo) + " to " + std::to_string(hi));
  return static_cast<int>(x);
}

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Waits for `events` on fd until the deadline (none: forever). False on timeout.
bool wait_for(int fd, short events, std::optional<Clock::time_point> deadline) {
  for (;;) {
    int ms = -1;
    if (deadline) {
      const double left = seconds_left(*deadline);
      if (left <= 0) return false;
      ms = static_cast<int>(std::ceil(left * 1000));
    }
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw ChannelError("poll failed: " + errno_text());
  }
}

void send_all(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw ChannelError("the connection broke (" + errno_text() + ")");
    p += k, n -= static_cast<std::size_t>(k);
  }
}

// Reads exactly n bytes; false on an orderly close before the first byte, ChannelError otherwise.
bool recv_all(int fd, void* data, std::size_t n, std::optional<Clock::time_point> deadline) {
  char* p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < n) {
    if (!wait_for(fd, POLLIN, deadline)) throw ChannelError("no answer within the time allowed");
    const ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 && got == 0) return false;
    if (k <= 0) throw ChannelError("the connection broke (" + (k == 0 ? std::string("closed mid-message") : errno_text()) + ")");
    got += static_cast<std::size_t>(k);
  }
  return true;
}

// A message: its length (4 bytes, network order), then its bytes.
void send_message(int fd, const std::string& m) {
  const std::uint32_t n = htonl(static_cast<std::uint32_t>(m.size()));
  std::string frame(reinterpret_cast<const char*>(&n), 4);
  frame += m;
  send_all(fd, frame.data(), frame.size());
}

// The next message; nullopt when the peer closed the connection between messages.
std::optional<std::string> recv_message(int fd, std::optional<Clock::time_point> deadline = std::nullopt) {
  std::uint32_t n = 0;
  if (!recv_all(fd, &n, 4, deadline)) return std::nullopt;
  n = ntohl(n);
  if (n > kMaxMessage) throw ChannelError("a message of " + std::to_string(n) + " bytes: not a hotops peer");
  std::string m(n, '\0');
  if (n > 0 && !recv_all(fd, m.data(), n, deadline)) throw ChannelError("the connection closed mid-message");
  return m;
}

std::string must_recv(int fd, const std::string& peer, std::optional<Clock::time_point> deadline = std::nullopt) {
  auto m = recv_message(fd, deadline);
  if (!m) throw ChannelError(peer + " ended: its connection closed");
  return *m;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
                                  strsignal(WTERMSIG(status)) + ")";
  return "ended";
}

}  // namespace

const Layout& layout() { return the_layout(); }
void set_layout(const Layout& l) { the_layout() = l; }

void split_address(const std::string& address, const std::string& what, std::string* host, int* port) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    throw LaunchError("hotops: bad address '" + address + "' in " + what + ": expected host:port");
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);  // [IPv6]:port
  *port = parse_int(what, address.substr(colon + 1), 1, 65535, " (its port)");
  *host = h;
}

double seconds_from_env(const char* name, double fallback, const std::function<const char*(const char*)>& env) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (!*v || *end != '\0' || !(s > 0) || !std::isfinite(s))
    throw LaunchError(std::string("hotops: bad value '") + v + "' for " + name + " in the environment: expected seconds > 0");
  return s;
}

Layout layout_from(int gpus, const std::function<const char*(const char*)>& env) {
  auto has = [&](const char* name) { return name && env(name) && *env(name); };
  auto num = [&](const char* name, int lo, int hi) {
    return parse_int(name, env(name), lo, hi, " in the environment");
  };
  // Rank 0's address, from HOTOPS_ROOT_ADDR or MASTER_ADDR and MASTER_PORT; "" when neither.
  auto root_address = [&]() -> std::string {
    std::string address, what;
    if (has("HOTOPS_ROOT_ADDR")) {
      address = env("HOTOPS_ROOT_ADDR"), what = "HOTOPS_ROOT_ADDR";
    } else if (has("MASTER_ADDR") || has("MASTER_PORT")) {
      if (!has("MASTER_ADDR") || !has("MASTER_PORT"))
        throw LaunchError("hotops: MASTER_ADDR and MASTER_PORT go together: set both (or HOTOPS_ROOT_ADDR=host:port)");
      address = std::string(env("MASTER_ADDR")) + ":" + env("MASTER_PORT"), what = "MASTER_ADDR and MASTER_PORT";
    } else {
      return "";
    }
    std::string host;
    int port = 0;
    split_address(address, what, &host, &port);
    return address;
  };

  struct Launcher {
    const char *rank, *size, *local_rank, *local_size;
  };
  constexpr Launcher kLaunchers[] = {
      {"HOTOPS_RANK", "HOTOPS_WORLD_SIZE", "HOTOPS_LOCAL_RANK", "HOTOPS_LOCAL_WORLD_SIZE"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", nullptr},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", nullptr},
  };
  for (const Launcher& k : kLaunchers) {
    if (!has(k.rank)) continue;
    if (!has(k.size)) {
      if (k.rank == kLaunchers[0].rank)
        throw LaunchError("hotops: HOTOPS_RANK is set but HOTOPS_WORLD_SIZE is not: set both (docs/scaling.md)");
      continue;  // e.g. SLURM_PROCID in a batch script, outside srun
    }
    Layout l;
    l.world = num(k.size, 1, 1 << 16);
    if (l.world == 1) break;  // one rank: as if started alone
    l.rank = num(k.rank, 0, l.world - 1);
    l.source = k.rank;
    l.local_rank = has(k.local_rank) ? num(k.local_rank, 0, l.world - 1) : l.rank;
    l.local_world = k.local_size && has(k.local_size) ? num(k.local_size, 1, l.world) : 0;  // 0: not known
    if (l.local_world && l.local_rank >= l.local_world)
      throw LaunchError(std::string("hotops: ") + k.local_rank + " (" + std::to_string(l.local_rank) + ") is not below " +
                        k.local_size + " (" + std::to_string(l.local_world) + ")");
    const int here = l.local_world ? l.local_world : l.world;
    if (gpus > 0 && gpus != here)
      throw LaunchError("hotops: --hotops_gpus=" + std::to_string(gpus) + " but " + k.size + " (" + l.source +
                        ") starts " + std::to_string(here) + " ranks" + (l.local_world ? " on this machine" : "") +
                        ": leave the flag out under a launcher, or make them agree");
    l.root = root_address();
    if (l.root.empty())
      throw LaunchError("hotops: rank " + std::to_string(l.rank) + " of " + std::to_string(l.world) + " (from " + l.source +
                        ") needs rank 0's address: set HOTOPS_ROOT_ADDR=host:port (or MASTER_ADDR and MASTER_PORT) "
                        "on every rank (docs/scaling.md)");
    return l;
  }

  // No launcher: --hotops_gpus=G on each of HOTOPS_NNODES machines.
  Layout l;
  const int per_node = gpus > 0 ? gpus : 1;
  const int nodes = has("HOTOPS_NNODES") ? num("HOTOPS_NNODES", 1, 4096) : 1;
  if (nodes > 1 && !has("HOTOPS_NODE_RANK"))
    throw LaunchError("hotops: HOTOPS_NNODES=" + std::to_string(nodes) +
                      " needs HOTOPS_NODE_RANK (0 on the machine of rank 0) on each machine");
  const int node = has("HOTOPS_NODE_RANK") ? num("HOTOPS_NODE_RANK", 0, nodes - 1) : 0;
  l.world = nodes * per_node;
  if (l.world == 1) return Layout{};
  l.rank = node * per_node;
  l.local_world = per_node;
  l.spawn = per_node > 1;
  l.source = "--hotops_gpus";
  l.root = root_address();
  if (nodes > 1 && l.root.empty())
    throw LaunchError("hotops: a run over " + std::to_string(nodes) +
                      " machines needs rank 0's address on each: HOTOPS_ROOT_ADDR=host:port (or MASTER_ADDR and "
                      "MASTER_PORT), host being the machine with HOTOPS_NODE_RANK=0");
  return l;
}

// ---- rendezvous ---------------------------------------------------------------------------

Listener::Listener(const std::string& root) {
  int port = 0;
  if (!root.empty()) split_address(root, "the rendezvous address", &host_, &port);
  // Dual-stack on every interface for a given address (other machines connect to it); loopback
  // for a single-node spawn.
  if (!root.empty()) {
    fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ >= 0) {
      int off = 0, one = 1;
      ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<std::uint16_t>(port));
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) ::close(fd_), fd_ = -1;
    }
  }
  if (fd_ < 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) throw ChannelError("hotops: rendezvous: cannot make a socket: " + errno_text());
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = root.empty() ? htonl(INADDR_LOOPBACK) : htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      const std::string e = errno_text();
      ::close(fd_);
      throw ChannelError("hotops: rendezvous: cannot listen on port " + std::to_string(port) + ": " + e +
                         (port ? " (is another run using it? pick another port)" : ""));
    }
  }
  if (::listen(fd_, 1024) != 0) throw ChannelError("hotops: rendezvous: listen failed: " + errno_text());
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (root.empty()) host_ = "127.0.0.1";
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Listener::address() const { return host_ + ":" + std::to_string(port_); }

int Listener::release() { return std::exchange(fd_, -1); }

std::unique_ptr<Group> Group::accept(Listener& listener, const Layout& l, const Hello& mine, const std::string& blob,
                                     double timeout_s, const std::function<std::string()>& give_up) {
  std::unique_ptr<Group> g(new Group(0, l.world));
  g->fds_.assign(static_cast<std::size_t>(l.world), -1);
  g->about_.assign(static_cast<std::size_t>(l.world), "");
  g->about_[0] = mine.about;
  const int lfd = listener.release();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  int joined = 1;
  try {
    while (joined < l.world) {
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(500));
      if (!wait_for(lfd, POLLIN, slice)) {
        const std::string why = give_up ? give_up() : "";
        if (!why.empty()) throw ChannelError("hotops: rendezvous: " + why);
        if (Clock::now() < deadline) continue;
        std::vector<int> missing;
        for (int r = 1; r < l.world; ++r)
          if (g->fds_[static_cast<std::size_t>(r)] < 0) missing.push_back(r);
        throw ChannelError("hotops: rendezvous: rank" + std::string(missing.size() > 1 ? "s " : " ") + join_ranks(missing) +
                           " of " + std::to_string(l.world) + " did not join within " + std::to_string(int(timeout_s)) +
                           " s (rank 0 listens on port " + std::to_string(listener.port()) +
                           "; HOTOPS_RENDEZVOUS_TIMEOUT_S sets the wait)");
      }
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      set_nodelay(fd);
      // A connection that does not speak the protocol (a port scanner, a stale run) is dropped.
      const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
      std::vector<std::string> f;
      try {
        for (int i = 0; i < 5; ++i) f.push_back(must_recv(fd, "a joining rank", hello_deadline));
      } catch (const ChannelError&) {
        ::close(fd);
        continue;
      }
      if (f[0] != kMagic) {
        ::close(fd);
        continue;
      }
      std::string refused;
      int rank = -1;
      try {
        rank = parse_int("the joining rank", f[1], 1, l.world - 1, "");
      } catch (const LaunchError&) {
        refused = "a rank " + f[1] + " joined a run of " + std::to_string(l.world) + " ranks";
      }
      if (refused.empty() && f[2] != std::to_string(l.world))
        refused = "rank " + f[1] + " believes the run has " + f[2] + " ranks; rank 0 has " + std::to_string(l.world);
      if (refused.empty() && g->fds_[static_cast<std::size_t>(rank)] >= 0)
        refused = "two processes joined as rank " + f[1] + " (is another run using the same address?)";
      if (refused.empty() && f[3] != mine.signature)
        refused = "rank " + f[1] + " runs another build or other arguments than rank 0 (" + f[3] + " against " +
                  mine.signature + ")";
      if (!refused.empty()) {
        try {
          send_message(fd, "refused");
          send_message(fd, refused);
        } catch (const ChannelError&) {
        }
        ::close(fd);
        throw ChannelError("hotops: rendezvous: " + refused);
      }
      send_message(fd, "ok");
      send_message(fd, blob);
      g->fds_[static_cast<std::size_t>(rank)] = fd;
      g->about_[static_cast<std::size_t>(rank)] = f[4];
      ++joined;
    }
  } catch (...) {
    ::close(lfd);
    throw;
  }
  ::close(lfd);
  return g;
}

std::unique_ptr<Group> Group::join(const Layout& l, const Hello& mine, double timeout_s, std::string* blob) {
  std::string host;
  int port = 0;
  split_address(l.root, "the rendezvous address", &host, &port);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  const std::string where = "rank 0 at " + l.root;
  std::string last = "no attempt";
  int fd = -1;
  while (fd < 0) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
        const int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) continue;
        if (::connect(s, a->ai_addr, a->ai_addrlen) == 0) {
          fd = s;
        } else {
          last = errno_text();
          ::close(s);
        }
      }
      ::freeaddrinfo(found);
    }
    if (fd >= 0) break;
    if (seconds_left(deadline) <= 0)
      throw ChannelError("hotops: rank " + std::to_string(l.rank) + " could not reach " + where + " within " +
                         std::to_string(int(timeout_s)) + " s: " + last +
                         " (is rank 0 running, and is the address one this machine can reach?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  set_nodelay(fd);
  std::unique_ptr<Group> g(new Group(l.rank, l.world));
  g->fds_ = {fd};
  try {
    send_message(fd, kMagic);
    send_message(fd, std::to_string(l.rank));
    send_message(fd, std::to_string(l.world));
    send_message(fd, mine.signature);
    send_message(fd, mine.about);
    const std::string verdict = must_recv(fd, where, deadline);
    const std::string body = must_recv(fd, where, deadline);
    if (verdict != "ok") throw ChannelError("hotops: rendezvous: " + body);
    *blob = body;
  } catch (const ChannelError& e) {
    const std::string what = e.what();
    throw ChannelError(what.rfind("hotops:", 0) == 0 ? what : "hotops: rank " + std::to_string(l.rank) + ": rendezvous with " +
                                                                   where + " failed: " + what);
  }
  return g;
}

Group::~Group() {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  std::lock_guard<std::mutex> lock(children_mutex_);
  for (const Child& c : children_)
    if (!c.done) ::kill(c.pid, SIGTERM);
}

// ---- commands and agreement -----------------------------------------------------------------

void Group::send_command(const std::string& command) {
  for (int r = 1; r < world_; ++r) send_message(fds_[static_cast<std::size_t>(r)], command);
}

std::string Group::next_command() { return must_recv(fds_[0], "rank 0"); }

std::string Group::agree(const std::string& mine, int members) {
  if (members <= 1 || rank_ >= members) return mine;
  if (rank_ != 0) {
    send_message(fds_[0], mine);
    return must_recv(fds_[0], "rank 0");
  }
  std::string verdict = mine.empty() ? "" : "rank 0: " + mine;
  for (int r = 1; r < members; ++r) {
    const std::string theirs = must_recv(fds_[static_cast<std::size_t>(r)], "rank " + std::to_string(r));
    if (verdict.empty() && !theirs.empty()) verdict = "rank " + std::to_string(r) + ": " + theirs;
  }
  for (int r = 1; r < members; ++r) send_message(fds_[static_cast<std::size_t>(r)], verdict);
  return verdict;
}

double Group::agree_max(double mine, int members) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", mine);
  if (members <= 1 || rank_ >= members) return mine;
  if (rank_ != 0) {
    send_message(fds_[0], text);
    return std::strtod(must_recv(fds_[0], "rank 0").c_str(), nullptr);
  }
  double m = mine;
  for (int r = 1; r < members; ++r)
    m = std::max(m, std::strtod(must_recv(fds_[static_cast<std::size_t>(r)], "rank " + std::to_string(r)).c_str(), nullptr));
  std::snprintf(text, sizeof text, "%.17g", m);
  for (int r = 1; r < members; ++r) send_message(fds_[static_cast<std::size_t>(r)], text);
  return m;
}

// ---- the watchdog -----------------------------------------------------------------------------

void Group::start_watchdog(double stall_s) {
  stall_s_ = stall_s;
  progress();
  watchdog_ = std::thread([this] { watch(); });
}

void Group::busy(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(what_mutex_);
    what_ = what;
  }
  progress();
  busy_ = true;
}

void Group::progress() {
  last_progress_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void Group::idle() { busy_ = false; }
void Group::ending() { ending_ = true; }

void Group::adopt(const std::vector<pid_t>& children) {
  std::lock_guard<std::mutex> lock(children_mutex_);
  for (pid_t pid : children) children_.push_back({pid, 0, false});
}

void Group::fatal(const std::string& why) {
  if (fatal_hook_) {
    fatal_hook_(why);
    stop_ = true;
    return;
  }
  std::fprintf(stderr, "hotops: rank %d: %s; ending the run\n", rank_, why.c_str());
  std::fflush(stderr);
  {
    std::lock_guard<std::mutex> lock(children_mutex_);
    for (const Child& c : children_)
      if (!c.done) ::kill(c.pid, SIGTERM);
  }
  std::_Exit(1);
}

void Group::watch() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (stop_) break;
    {
      std::unique_lock<std::mutex> lock(children_mutex_);
      for (Child& c : children_) {
        if (c.done || ::waitpid(c.pid, &c.status, WNOHANG) != c.pid) continue;
        c.done = true;
        if (ending_ && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) continue;
        const std::string why = "a process it spawned (pid " + std::to_string(c.pid) + ") " + describe_status(c.status) +
                                " (its message, if any, is above)";
        lock.unlock();
        fatal(why);
        return;
      }
    }
    if (!ending_) {
      for (std::size_t r = 0; r < fds_.size(); ++r) {
        if (fds_[r] < 0) continue;
        pollfd p{fds_[r], POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
          const int peer = rank_ == 0 ? static_cast<int>(r) : 0;
          fatal("rank " + std::to_string(peer) + "'s connection closed: it ended (its message, if any, is above) or its "
                "machine is unreachable");
          return;
        }
      }
    }
    if (busy_ && stall_s_ > 0) {
      const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
      const double stalled = static_cast<double>(now - last_progress_ns_.load()) * 1e-9;
      if (stalled > stall_s_) {
        std::string what;
        {
          std::lock_guard<std::mutex> lock(what_mutex_);
          what = what_;
        }
        char text[64];
        std::snprintf(text, sizeof text, "no progress for %.0f s", stalled);
        fatal(std::string(text) + " in " + what +
              ": a rank is stuck (a collective that another rank never reached, or a hung GPU); "
              "HOTOPS_STALL_TIMEOUT_S sets the limit");
        return;
      }
    }
  }
}

std::string Group::reap(double timeout_s) {
  stop_ = true;
  if (watchdog_.joinable()) watchdog_.join();
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::string problems;
  auto note = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  std::lock_guard<std::mutex> lock(children_mutex_);
  for (Child& c : children_) {
    while (!c.done) {
      const pid_t got = ::waitpid(c.pid, &c.status, WNOHANG);
      if (got == c.pid) {
        c.done = true;
      } else if (got < 0 || seconds_left(deadline) <= 0) {
        ::kill(c.pid, SIGTERM);
        ::waitpid(c.pid, nullptr, 0);
        c.done = true, c.status = 0;
        note("pid " + std::to_string(c.pid) + " did not end in time");
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (!(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) note("pid " + std::to_string(c.pid) + " " + describe_status(c.status));
  }
  return problems;
}

// ---- spawning -------------------------------------------------------------------------------

std::vector<pid_t> spawn_local(const Layout& l, const std::vector<std::string>& argv, const std::string& root) {
  static const char* const kOwn[] = {"HOTOPS_RANK=", "HOTOPS_WORLD_SIZE=", "HOTOPS_LOCAL_RANK=",
                                     "HOTOPS_LOCAL_WORLD_SIZE=", "HOTOPS_ROOT_ADDR="};
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e) {
    bool own = false;
    for (const char* k : kOwn) own |= std::strncmp(*e, k, std::strlen(k)) == 0;
    if (!own) base.emplace_back(*e);  // everything else passes on, NCCL_* settings included
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<pid_t> children;
  const pid_t parent = ::getpid();
  for (int local = 1; local < l.local_world; ++local) {
    std::vector<std::string> env = base;
    env.push_back("HOTOPS_RANK=" + std::to_string(l.rank + local));
    env.push_back("HOTOPS_WORLD_SIZE=" + std::to_string(l.world));
    env.push_back("HOTOPS_LOCAL_RANK=" + std::to_string(local));
    env.push_back("HOTOPS_LOCAL_WORLD_SIZE=" + std::to_string(l.local_world));
    env.push_back("HOTOPS_ROOT_ADDR=" + root);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    // exec's failure comes back through a close-on-exec pipe: nothing read means it started.
    int report[2];
    if (::pipe2(report, O_CLOEXEC) != 0) throw ChannelError("hotops: cannot spawn rank " + std::to_string(l.rank + local) + ": " + errno_text());
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(report[0]), ::close(report[1]);
      throw ChannelError("hotops: cannot spawn rank " + std::to_string(l.rank + local) + ": fork: " + errno_text());
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // ends with the process that spawned it
      if (::getppid() != parent) ::_exit(1);
      ::execve("/proc/self/exe", args.data(), envp.data());
      const int e = errno;
      ssize_t ignored = ::write(report[1], &e, sizeof e);
      (void)ignored;
      ::_exit(127);
    }
    ::close(report[1]);
    int e = 0;
    const ssize_t n = ::read(report[0], &e, sizeof e);
    ::close(report[0]);
    if (n == static_cast<ssize_t>(sizeof e)) {
      ::waitpid(pid, nullptr, 0);
      for (pid_t c : children) ::kill(c, SIGTERM);
      throw ChannelError("hotops: cannot spawn rank " + std::to_string(l.rank + local) + ": exec /proc/self/exe: " +
                         std::strerror(e));
    }
    children.push_back(pid);
  }
  return children;
}

}  // namespace hotops::ranks
