/* oob: see oob.h. */
#define _GNU_SOURCE
#include "parallel/oob.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_ADDRS 8

/* What every rank learns of every other at start. */
typedef struct {
  char host[64];
  int32_t pid;
  uint16_t port;
  uint16_t naddr;
  uint32_t addr[MAX_ADDRS]; /* IPv4, network order; non-loopback first */
} peer_t;

static struct {
  int fd;           /* listening socket; -1 when stopped */
  int rank, size;
  peer_t *peers;
  zt_oob_answer_fn answer;
} oob = {.fd = -1};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* This host's IPv4 addresses that are up, loopback last (another node
 * must reach us on a real interface; this node's ranks use loopback). */
static void local_addrs(peer_t *me) {
  struct ifaddrs *ifs = NULL;
  me->naddr = 0;
  if (getifaddrs(&ifs) == 0) {
    for (int loop = 0; loop < 2; loop++)
      for (struct ifaddrs *i = ifs; i && me->naddr < MAX_ADDRS; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
          continue;
        if (!!(i->ifa_flags & IFF_LOOPBACK) != loop) continue;
        me->addr[me->naddr++] = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
      }
    freeifaddrs(ifs);
  }
  if (me->naddr == 0) me->addr[me->naddr++] = htonl(INADDR_LOOPBACK);
}

static int listen_socket(uint16_t *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128) ||
      getsockname(fd, (struct sockaddr *)&a, &len)) {
    close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

int zt_oob_start(MPI_Comm world, zt_oob_answer_fn fn, double wait_s, char *why) {
  peer_t me = {0};
  MPI_Comm_rank(world, &oob.rank);
  MPI_Comm_size(world, &oob.size);
  gethostname(me.host, sizeof me.host - 1);
  me.pid = (int32_t)getpid();
  local_addrs(&me);
  oob.fd = listen_socket(&me.port);
  oob.answer = fn;
  oob.peers = calloc((size_t)oob.size, sizeof *oob.peers);
  if (!oob.peers) {
    snprintf(why, 256, "out of memory");
    return -1;
  }
  /* a rank without a socket still takes part: it is then never asked
   * (port 0), and says why on its own */
  MPI_Request r;
  MPI_Iallgather(&me, sizeof me, MPI_BYTE, oob.peers, sizeof me, MPI_BYTE, world, &r);
  double deadline = now_s() + wait_s;
  const struct timespec nap = {0, 1000000};
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (now_s() > deadline) {
      /* the exchange is the first thing every rank does after MPI starts */
      snprintf(why, 256, "not every rank started within %.0f s", wait_s);
      return -1;
    }
    nanosleep(&nap, NULL);
  }
  if (oob.fd < 0) {
    snprintf(why, 256, "cannot open a TCP socket: %s", strerror(errno));
    return -1;
  }
  return 0;
}

void zt_oob_stop(void) {
  if (oob.fd >= 0) close(oob.fd);
  oob.fd = -1;
  free(oob.peers);
  oob.peers = NULL;
}

const char *zt_oob_host(int rank) {
  return oob.peers && rank >= 0 && rank < oob.size ? oob.peers[rank].host : "?";
}

int zt_oob_pid(int rank) {
  return oob.peers && rank >= 0 && rank < oob.size ? oob.peers[rank].pid : -1;
}

/* Reads or writes exactly n bytes of a non-blocking socket within wait_ms. */
static int full_io(int fd, void *buf, size_t n, int writing, int wait_ms) {
  size_t got = 0;
  double deadline = now_s() + wait_ms * 1e-3;
  while (got < n) {
    ssize_t k = writing ? send(fd, (char *)buf + got, n - got, MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + got, n - got, 0);
    if (k > 0) {
      got += (size_t)k;
      continue;
    }
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
    int left = (int)((deadline - now_s()) * 1e3);
    if (left <= 0) return -1;
    struct pollfd p = {fd, writing ? POLLOUT : POLLIN, 0};
    poll(&p, 1, left);
  }
  return 0;
}

/* Connections accepted whose question has not fully arrived: a busy
 * asker may take a while between connecting and writing. */
#define PENDING 64
typedef struct {
  int fd;
  size_t got;
  double since;
  char q[ZT_OOB_QUESTION];
} pending_t;
static pending_t pending[PENDING];
static int npending;

static void drop(int i) {
  close(pending[i].fd);
  pending[i] = pending[--npending];
}

/* The process's last serve call, and its last stall: serve is called
 * every 20 ms at most by whatever the watchdog thread does, so a long
 * gap means the process did not run. */
static _Atomic double last_serve, stall_end, stall_len;

double zt_oob_stalled(double within) {
  double end = atomic_load(&stall_end);
  return end > 0 && now_s() - end < within ? atomic_load(&stall_len) : 0;
}

int zt_oob_size(void) { return oob.size; }

void zt_oob_serve(int wait_ms) {
  if (oob.fd < 0) return;
  double now = now_s(), last = atomic_exchange(&last_serve, now);
  if (last > 0 && now - last > 1.5) {
    atomic_store(&stall_len, now - last);
    atomic_store(&stall_end, now);
  }
  struct pollfd p[PENDING + 1];
  p[0] = (struct pollfd){oob.fd, POLLIN, 0};
  for (int i = 0; i < npending; i++) p[i + 1] = (struct pollfd){pending[i].fd, POLLIN, 0};
  if (poll(p, (nfds_t)npending + 1, wait_ms) <= 0 && !npending) return;
  for (int c; npending < PENDING &&
              (c = accept4(oob.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;)
    pending[npending++] = (pending_t){.fd = c, .since = now_s()};
  for (int i = npending - 1; i >= 0; i--) {
    ssize_t k = recv(pending[i].fd, pending[i].q + pending[i].got,
                     ZT_OOB_QUESTION - pending[i].got, 0);
    if (k > 0) pending[i].got += (size_t)k;
    if (pending[i].got == ZT_OOB_QUESTION) {
      char a[ZT_OOB_ANSWER];
      memset(a, 0, sizeof a);
      oob.answer(pending[i].q, a);
      full_io(pending[i].fd, a, sizeof a, 1, 200); /* fits the fresh socket's buffer */
      drop(i);
    } else if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) ||
               now_s() - pending[i].since > 10) {
      drop(i);
    }
  }
}

enum { CONNECTING, SENT, DONE };

void zt_oob_ask(const int *ranks, int n, const void *question, void *answers,
                zt_oob_status *st, double wait_s) {
  int *fd = malloc((size_t)n * sizeof *fd), *state = malloc((size_t)n * sizeof *state);
  size_t *got = calloc((size_t)n, sizeof *got);
  struct pollfd *p = malloc((size_t)n * sizeof *p);
  int *idx = malloc((size_t)n * sizeof *idx);
  if (!fd || !state || !got || !p || !idx) {
    for (int i = 0; i < n; i++) st[i] = ZT_OOB_SILENT;
    goto out;
  }
  const char *me = zt_oob_host(oob.rank);
  for (int i = 0; i < n; i++) {
    const peer_t *peer = oob.peers ? &oob.peers[ranks[i]] : NULL;
    st[i] = ZT_OOB_SILENT;
    state[i] = DONE;
    fd[i] = -1;
    if (!peer || !peer->port) continue;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(peer->port)};
    a.sin_addr.s_addr = strcmp(peer->host, me) ? peer->addr[0] : htonl(INADDR_LOOPBACK);
    fd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd[i] < 0) continue;
    if (connect(fd[i], (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
      st[i] = errno == ECONNREFUSED ? ZT_OOB_GONE : ZT_OOB_SILENT;
      continue;
    }
    state[i] = CONNECTING;
  }
  double deadline = now_s() + wait_s;
  for (;;) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (state[i] != DONE) {
        p[m] = (struct pollfd){fd[i], state[i] == CONNECTING ? POLLOUT : POLLIN, 0};
        idx[m++] = i;
      }
    if (!m || now_s() > deadline) break;
    zt_oob_serve(0); /* the ranks asked may be asking us the same */
    if (poll(p, (nfds_t)m, 10) <= 0) continue;
    for (int k = 0; k < m; k++) {
      int i = idx[k];
      if (!p[k].revents) continue;
      if (state[i] == CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd[i], SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
          st[i] = err == ECONNREFUSED ? ZT_OOB_GONE : ZT_OOB_SILENT;
          state[i] = DONE;
        } else if (full_io(fd[i], (void *)question, ZT_OOB_QUESTION, 1, 100)) {
          st[i] = ZT_OOB_GONE;
          state[i] = DONE;
        } else {
          state[i] = SENT;
        }
        continue;
      }
      char *a = (char *)answers + (size_t)i * ZT_OOB_ANSWER;
      ssize_t r = recv(fd[i], a + got[i], ZT_OOB_ANSWER - got[i], 0);
      if (r > 0 && (got[i] += (size_t)r) == ZT_OOB_ANSWER) {
        st[i] = ZT_OOB_ANSWERED;
        state[i] = DONE;
      } else if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        /* closed before answering: the process ended meanwhile */
        st[i] = ZT_OOB_GONE;
        state[i] = DONE;
      }
    }
  }
out:
  for (int i = 0; fd && i < n; i++)
    if (fd[i] >= 0) close(fd[i]);
  free(fd);
  free(state);
  free(got);
  free(p);
  free(idx);
}
