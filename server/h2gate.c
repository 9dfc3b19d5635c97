/* The HTTP/2 gate: fuseboxd's own front for plain host:port listeners.
 *
 * Debian's gRPC core 1.51 predates the fixes for CVE-2023-44487 ("rapid
 * reset"): it reads HEADERS as fast as a client sends them, makes a call of
 * each (even one the client cancels at once with RST_STREAM) and queues it
 * for fuseboxd without bound, so one client with no credentials stalled
 * every tenant and grew the server by gigabytes. It has no per-address
 * limit on connections either. So on a plain host:port listener fuseboxd
 * accepts the TCP connections itself and hands gRPC one end of a socket
 * pair per connection (grpc_server_add_channel_from_fd, which 1.51 offers
 * for insecure credentials only); one thread relays the bytes both ways and
 * reads the client's frame headers (9 bytes each: no HPACK) on the way in:
 *
 *  - connections: at most max_connections in all and max_connections_per_ip
 *    from one client address (an IPv6 address counts by its /64): past
 *    either, a new connection is closed at once;
 *  - new streams: each client address gets stream_rate a second (a burst
 *    of as many); past it the gate stops reading that client until the
 *    budget refills (gRPC never sees the HEADERS, TCP pushes back);
 *  - resets: each client address may cancel reset_rate streams a second (a
 *    burst of twice as many); the connection whose RST_STREAM passes that
 *    is closed;
 *  - streams opened before the client acknowledged the server's SETTINGS
 *    (where gRPC's max_streams_per_connection does not hold yet): past
 *    max_streams_per_connection the connection is closed.
 *
 * A client's bytes are read only while gRPC has taken the last ones, and
 * gRPC's only while the client has taken the last ones: the gate holds at
 * most two buffers a connection.
 *
 * On a TLS listener (--tls-cert/--tls-key) the gate terminates TLS itself
 * with OpenSSL (non-blocking, on the same thread): TLS 1.2 or later, ALPN
 * "h2" as gRPC's own server demands, and with --tls-client-ca a client
 * certificate from that CA required and verified. A handshake counts as a
 * connection of its address and must end within GATE_HANDSHAKE_S; only then
 * does gRPC get its end of the pair, and the plaintext HTTP/2 passes the
 * same budgets as on a plain listener. The verified client certificate is
 * kept with the connection for auth.c (fbd_gate_peer). The SSL_CTX is
 * replaced on SIGHUP (fbd_gate_set_tls, from tls.c): new handshakes use the
 * new one, open connections keep theirs. docs/security.md "The transport". */
#define _GNU_SOURCE 1 /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/server.h"

#define GATE_BUF 16384 /* each way, a connection: 1024 of them hold 32 MiB */
#define GATE_PEERS 4096 /* client addresses remembered at once */
#define PREFACE_LEN 24
#define GATE_HANDSHAKE_S 5.0 /* a TLS handshake not done by then is cut */
#define F_HEADERS 1
#define F_RST_STREAM 3
#define F_SETTINGS 4
#define FLAG_ACK 1

enum { END_LISTEN, END_CLIENT, END_GRPC, END_WAKE };

typedef struct gate_peer {
  char key[64]; /* "" when free */
  int conns;
  double streams, resets; /* the budgets left */
  double t;               /* when they were last refilled */
} gate_peer;

typedef struct gate_conn gate_conn;

typedef struct gate_end {
  int kind;
  int fd;
  gate_conn *c; /* NULL for a listener or the wake-up */
  int tls;      /* a listener: TLS terminated here */
} gate_end;

struct gate_conn {
  gate_end client, grpc;
  gate_peer *peer;
  char addr[80]; /* for the log */
  int grpc_fd;    /* gRPC's end of the pair: its calls' peer is "fd:N" (fbd_gate_peer) */
  /* client -> gRPC: [off, len) not yet written; [off, checked) may go */
  unsigned char up[GATE_BUF];
  size_t up_off, up_len, checked;
  /* the client's frames: preface bytes left, then headers and payloads */
  size_t preface_left;
  uint64_t skip; /* payload bytes of the current frame left */
  uint32_t last_stream;
  int settings_acked, early_streams;
  double paused_until; /* 0: reading */
  /* gRPC -> client */
  unsigned char down[GATE_BUF];
  size_t down_off, down_len;
  int grpc_eof, grpc_watched, dead;
  /* TLS: ssl NULL on a plain listener; ready once the handshake is done
   * and gRPC has its end (at once on a plain one) */
  SSL *ssl;
  int ready;
  double hs_deadline;
  int hs_wants_write, rd_wants_write, wr_wants_read; /* what OpenSSL waits for */
  char *cert_pem; /* the verified client certificate (mTLS); set before ready, read under mu */
  gate_conn *prev, *next;
};

struct fbd_gate {
  fbd_server *srv;
  int ep, wake;
  gate_end listeners[FBD_MAX_LISTEN * 4];
  int nlisteners;
  gate_end wake_end;
  pthread_t thread;
  int running;
  atomic_int stop;
  gate_conn *conns, *graves; /* graves: closed this round, freed after it */
  int nconns;
  pthread_mutex_t mu; /* the list of conns (read by fbd_gate_peer); closed_to_new; tls_ctx */
  int closed_to_new;
  SSL_CTX *tls_ctx; /* for new handshakes on TLS listeners (fbd_gate_set_tls) */
  gate_peer peers[GATE_PEERS];
  double last_warn[5]; /* a warning of each kind at most once a second */
  /* counted for the log and tests */
  uint64_t refused_conns, closed_resets, closed_early, paused, tls_failed, tls_slow;
};

/* ---------------------------------------------------------------- peers */

/* The key of a client address: IPv4 as is (also v4-mapped IPv6), IPv6 by
 * its /64, which one host is commonly given whole. */
static void peer_key(const struct sockaddr_storage *ss, char *key, size_t n, char *shown,
                     size_t sn) {
  char a[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
    snprintf(key, n, "%s", a);
    snprintf(shown, sn, "%s:%u", a, ntohs(s4->sin_port));
    return;
  }
  const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
  if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
    inet_ntop(AF_INET, &s6->sin6_addr.s6_addr[12], a, sizeof a);
    snprintf(key, n, "%s", a);
    snprintf(shown, sn, "%s:%u", a, ntohs(s6->sin6_port));
    return;
  }
  inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
  snprintf(shown, sn, "[%s]:%u", a, ntohs(s6->sin6_port));
  struct in6_addr p = s6->sin6_addr;
  memset(&p.s6_addr[8], 0, 8);
  inet_ntop(AF_INET6, &p, a, sizeof a);
  snprintf(key, n, "%s/64", a);
}

static void peer_refill(const fbd_config *cfg, gate_peer *p, double now) {
  double dt = now - p->t;
  p->t = now;
  if (dt <= 0) return;
  p->streams = fmin((double)cfg->stream_rate, p->streams + dt * cfg->stream_rate);
  p->resets = fmin(2.0 * cfg->reset_rate, p->resets + dt * cfg->reset_rate);
}

/* A peer with no connection whose budgets are whole again is forgotten. */
static int peer_idle(const fbd_config *cfg, gate_peer *p, double now) {
  peer_refill(cfg, p, now);
  return p->conns == 0 && p->streams >= cfg->stream_rate && p->resets >= 2.0 * cfg->reset_rate;
}

/* The peer of key, made when new; NULL when the table is full of busy ones. */
static gate_peer *peer_get(struct fbd_gate *g, const char *key, double now) {
  const fbd_config *cfg = g->srv->cfg;
  uint32_t h = 2166136261u;
  for (const char *s = key; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  gate_peer *spare = NULL;
  for (int i = 0; i < GATE_PEERS; i++) {
    gate_peer *p = &g->peers[(h + (uint32_t)i) % GATE_PEERS];
    if (p->key[0] && !strcmp(p->key, key)) {
      peer_refill(cfg, p, now);
      return p;
    }
    if (!spare && (!p->key[0] || peer_idle(cfg, p, now))) spare = p;
    if (!p->key[0]) break; /* past a free one: key is nowhere */
  }
  if (!spare) return NULL;
  memset(spare, 0, sizeof *spare);
  snprintf(spare->key, sizeof spare->key, "%s", key);
  spare->streams = cfg->stream_rate;
  spare->resets = 2.0 * cfg->reset_rate;
  spare->t = now;
  return spare;
}

/* ---------------------------------------------------------------- connections */

/* what (a verb and its object) addr, and why: at most one a second, or an
 * attack would flood the log (the counts come at shutdown) */
static void warn(struct fbd_gate *g, int kind, const char *what, const char *addr,
                 const char *why) {
  double now = fbd_now();
  if (now - g->last_warn[kind] < 1.0) return;
  g->last_warn[kind] = now;
  fbd_logf(g->srv->log, FBD_LOG_WARN, "%s %s: %s", what, addr, why);
}

/* Close both sockets; c itself is freed after this round of events (one
 * of them may still name it). */
static void conn_close(struct fbd_gate *g, gate_conn *c) {
  pthread_mutex_lock(&g->mu);
  if (c->prev) c->prev->next = c->next;
  else g->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  pthread_mutex_unlock(&g->mu);
  epoll_ctl(g->ep, EPOLL_CTL_DEL, c->client.fd, NULL);
  if (c->grpc_watched) epoll_ctl(g->ep, EPOLL_CTL_DEL, c->grpc.fd, NULL);
  close(c->client.fd);
  close(c->grpc.fd); /* gRPC reads EOF and ends the transport and its calls */
  if (!c->ready) close(c->grpc_fd); /* never handed to gRPC (a TLS handshake) */
  SSL_free(c->ssl);
  c->ssl = NULL;
  if (c->peer) c->peer->conns--;
  g->nconns--;
  c->dead = 1;
  c->next = g->graves;
  g->graves = c;
}

static void bury(struct fbd_gate *g) {
  while (g->graves) {
    gate_conn *c = g->graves;
    g->graves = c->next;
    free(c->cert_pem); /* out of the list since conn_close: no fbd_gate_peer sees it */
    free(c);
  }
}

/* May the client's bytes be read now? */
static int may_read(const gate_conn *c) {
  return !c->paused_until && c->up_len < GATE_BUF && c->up_off == c->checked;
}

/* Plaintext OpenSSL decrypted and holds, that no epoll event will announce. */
static int tls_pending(const gate_conn *c) {
  return c->ssl && c->ready && may_read(c) && SSL_pending(c->ssl) > 0;
}

static void watch(struct fbd_gate *g, gate_conn *c) {
  struct epoll_event ev;
  int up_pending = c->up_off < c->checked, down_pending = c->down_off < c->down_len;
  if (!c->ready) /* a TLS handshake: what it waits for */
    ev.events = c->hs_wants_write ? EPOLLOUT : EPOLLIN;
  else
    ev.events = (may_read(c) || c->wr_wants_read ? EPOLLIN : 0) |
                (down_pending || c->rd_wants_write ? EPOLLOUT : 0);
  ev.data.ptr = &c->client;
  epoll_ctl(g->ep, EPOLL_CTL_MOD, c->client.fd, &ev);
  if (!c->grpc_watched && !c->grpc_eof) return; /* gRPC has no end yet */
  if (c->grpc_eof) { /* its hang-up would be reported again and again */
    if (c->grpc_watched) epoll_ctl(g->ep, EPOLL_CTL_DEL, c->grpc.fd, NULL);
    c->grpc_watched = 0;
    return;
  }
  ev.events = (!down_pending ? EPOLLIN : 0) | (up_pending ? EPOLLOUT : 0);
  ev.data.ptr = &c->grpc;
  epoll_ctl(g->ep, EPOLL_CTL_MOD, c->grpc.fd, &ev);
}

/* Check the client's frames in [checked, up_len) against the budgets.
 * Returns 0 to go on (checked moved up to where it may), -1 to close. */
static int check_frames(struct fbd_gate *g, gate_conn *c, double now) {
  const fbd_config *cfg = g->srv->cfg;
  while (c->checked < c->up_len) {
    size_t have = c->up_len - c->checked;
    if (c->preface_left) {
      size_t n = have < c->preface_left ? have : c->preface_left;
      c->preface_left -= n;
      c->checked += n;
      continue;
    }
    if (c->skip) {
      size_t n = have < c->skip ? have : (size_t)c->skip;
      c->skip -= n;
      c->checked += n;
      continue;
    }
    if (have < 9) return 0; /* the rest of the header comes with the next read */
    const unsigned char *h = c->up + c->checked;
    uint32_t len = (uint32_t)h[0] << 16 | (uint32_t)h[1] << 8 | h[2];
    uint32_t sid = ((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]) &
                   0x7fffffffu;
    if (h[3] == F_HEADERS && sid > c->last_stream) { /* a new stream */
      if (!c->settings_acked && ++c->early_streams > cfg->max_streams_per_connection) {
        g->closed_early++;
        warn(g, 2, "closed the HTTP/2 connection of", c->addr,
             "more streams than max_streams_per_connection before it acknowledged the "
             "server's SETTINGS");
        return -1;
      }
      if (c->peer->streams < 1) {
        double wait = (1 - c->peer->streams) / cfg->stream_rate;
        c->paused_until = now + (wait < 0.001 ? 0.001 : wait);
        g->paused++;
        return 0;
      }
      c->peer->streams -= 1;
      c->last_stream = sid;
    } else if (h[3] == F_RST_STREAM) {
      if (c->peer->resets < 1) {
        g->closed_resets++;
        warn(g, 1, "closed the HTTP/2 connection of", c->addr,
             "it cancelled streams faster than reset_rate allows (rapid reset)");
        return -1;
      }
      c->peer->resets -= 1;
    } else if (h[3] == F_SETTINGS && (h[4] & FLAG_ACK)) {
      c->settings_acked = 1;
    }
    c->checked += 9;
    c->skip = len;
  }
  return 0;
}

/* Write what may go from one buffer; -1 when the other side is gone. */
static int flush(int fd, const unsigned char *buf, size_t *off, size_t end) {
  while (*off < end) {
    ssize_t n = send(fd, buf + *off, end - *off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    *off += (size_t)n;
  }
  return 0;
}

/* Read the client's bytes (plaintext on TLS): >0 bytes, 0 none yet, -1
 * when the client is gone (EOF, TLS close_notify, a bad record). */
static ssize_t client_read(gate_conn *c, unsigned char *buf, size_t n) {
  if (!c->ssl) {
    ssize_t r = recv(c->client.fd, buf, n, 0);
    if (r > 0) return r;
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
  }
  c->rd_wants_write = 0;
  ERR_clear_error();
  int r = SSL_read(c->ssl, buf, n > INT_MAX ? INT_MAX : (int)n);
  if (r > 0) return r;
  switch (SSL_get_error(c->ssl, r)) {
  case SSL_ERROR_WANT_READ: return 0;
  case SSL_ERROR_WANT_WRITE: c->rd_wants_write = 1; return 0;
  default: ERR_clear_error(); return -1;
  }
}

/* Write the down buffer to the client (encrypted on TLS); -1 when it is gone. */
static int client_flush(gate_conn *c) {
  if (!c->ssl) return flush(c->client.fd, c->down, &c->down_off, c->down_len);
  c->wr_wants_read = 0;
  while (c->down_off < c->down_len) {
    size_t n = c->down_len - c->down_off;
    ERR_clear_error();
    int r = SSL_write(c->ssl, c->down + c->down_off, n > INT_MAX ? INT_MAX : (int)n);
    if (r > 0) {
      c->down_off += (size_t)r;
      continue;
    }
    switch (SSL_get_error(c->ssl, r)) {
    case SSL_ERROR_WANT_WRITE: return 0; /* retried with the same bytes when writable */
    case SSL_ERROR_WANT_READ: c->wr_wants_read = 1; return 0;
    default: ERR_clear_error(); return -1;
    }
  }
  return 0;
}

/* Give gRPC its end of the pair: the connection is gRPC's from now on. */
static void hand_to_grpc(struct fbd_gate *g, gate_conn *c) {
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->grpc};
  epoll_ctl(g->ep, EPOLL_CTL_ADD, c->grpc.fd, &ev);
  c->grpc_watched = 1;
  pthread_mutex_lock(&g->mu);
  c->ready = 1;
  if (g->closed_to_new) close(c->grpc_fd); /* shutting down: the relay ends at EOF */
  else {
    grpc_server_credentials *cr = grpc_insecure_server_credentials_create();
    grpc_server_add_channel_from_fd(g->srv->server, c->grpc_fd, cr); /* gRPC owns it now */
    grpc_server_credentials_release(cr);
  }
  pthread_mutex_unlock(&g->mu);
}

/* The PEM of the client's verified certificate, or NULL (none, or no memory). */
static char *peer_pem(SSL *ssl) {
  X509 *x = SSL_get1_peer_certificate(ssl);
  if (!x) return NULL;
  char *out = NULL;
  BIO *b = BIO_new(BIO_s_mem());
  if (b && PEM_write_bio_X509(b, x)) {
    char *p;
    long n = BIO_get_mem_data(b, &p);
    if (n > 0 && (out = malloc((size_t)n + 1))) {
      memcpy(out, p, (size_t)n);
      out[n] = 0;
    }
  }
  BIO_free(b);
  X509_free(x);
  return out;
}

/* Go on with c's TLS handshake: 0 while it goes on or once done, -1 to close. */
static int handshake(struct fbd_gate *g, gate_conn *c) {
  ERR_clear_error();
  int r = SSL_do_handshake(c->ssl);
  c->hs_wants_write = 0;
  if (r != 1) {
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ) return 0;
    if (e == SSL_ERROR_WANT_WRITE) {
      c->hs_wants_write = 1;
      return 0;
    }
    char why[160] = "the client hung up";
    unsigned long oe = ERR_peek_error();
    if (oe) ERR_error_string_n(oe, why, sizeof why);
    long v = SSL_get_verify_result(c->ssl);
    if (v != X509_V_OK)
      snprintf(why, sizeof why, "client certificate: %s", X509_verify_cert_error_string(v));
    ERR_clear_error();
    g->tls_failed++;
    warn(g, 3, "TLS handshake failed with", c->addr, why);
    return -1;
  }
  const unsigned char *alpn = NULL;
  unsigned alen = 0;
  SSL_get0_alpn_selected(c->ssl, &alpn, &alen);
  if (alen != 2 || memcmp(alpn, "h2", 2) != 0) { /* gRPC's own server refuses these too */
    g->tls_failed++;
    warn(g, 3, "TLS handshake failed with", c->addr, "the client offered no ALPN \"h2\"");
    return -1;
  }
  char *pem = peer_pem(c->ssl); /* verified by the handshake (SSL_VERIFY_PEER) */
  if (SSL_get_verify_mode(c->ssl) & SSL_VERIFY_FAIL_IF_NO_PEER_CERT && !pem) {
    g->tls_failed++;
    warn(g, 3, "TLS handshake failed with", c->addr, "no client certificate kept");
    return -1;
  }
  pthread_mutex_lock(&g->mu);
  c->cert_pem = pem;
  pthread_mutex_unlock(&g->mu);
  hand_to_grpc(g, c);
  return 0;
}

/* Bytes written to gRPC leave the up buffer; an incomplete frame header
 * moves to its start. */
static void up_compact(gate_conn *c) {
  if (c->up_off == 0) return;
  size_t keep = c->up_len - c->up_off;
  memmove(c->up, c->up + c->up_off, keep);
  c->up_len = keep;
  c->checked -= c->up_off;
  c->up_off = 0;
}

/* Move what can move on c; -1 when it is to be closed. */
static int pump_conn(struct fbd_gate *g, gate_conn *c, int client_in, int grpc_in) {
  double now = fbd_now();
  if (!c->ready) {
    if (handshake(g, c)) return -1;
    if (!c->ready) {
      watch(g, c);
      return 0;
    }
    client_in = 1; /* application data may have come with the handshake's last flight */
  }
  /* on TLS, tried on any event: OpenSSL may wait on a write, or hold plaintext */
  if ((client_in || c->ssl) && may_read(c)) {
    ssize_t n = client_read(c, c->up + c->up_len, GATE_BUF - c->up_len);
    if (n < 0) return -1;
    c->up_len += (size_t)n;
  }
  if (c->paused_until && now >= c->paused_until) c->paused_until = 0;
  if (!c->paused_until) {
    if (c->peer) peer_refill(g->srv->cfg, c->peer, now);
    if (check_frames(g, c, now)) {
      flush(c->grpc.fd, c->up, &c->up_off, c->checked); /* what came before the offence */
      return -1;
    }
  }
  if (flush(c->grpc.fd, c->up, &c->up_off, c->checked)) return -1;
  if (c->up_off == c->checked) up_compact(c);
  if (grpc_in && !c->grpc_eof && c->down_off == c->down_len) {
    ssize_t n = recv(c->grpc.fd, c->down, GATE_BUF, 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      c->grpc_eof = 1;
    else if (n > 0) {
      c->down_off = 0;
      c->down_len = (size_t)n;
    }
  }
  if (client_flush(c)) return -1;
  if (c->grpc_eof && c->down_off == c->down_len) return -1; /* gRPC ended it */
  watch(g, c);
  return 0;
}

/* -1 when there was none to accept */
static int accept_one(struct fbd_gate *g, const gate_end *le) {
  const fbd_config *cfg = g->srv->cfg;
  int lfd = le->fd;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE)
      warn(g, 0, "cannot accept a connection on", "a plain listener", "out of file descriptors");
    return -1;
  }
  char key[64], shown[80];
  peer_key(&ss, key, sizeof key, shown, sizeof shown);
  double now = fbd_now();
  gate_peer *p = peer_get(g, key, now);
  const char *why = g->nconns >= cfg->max_connections ? "max_connections"
                    : !p                               ? "too many client addresses at once"
                    : p->conns >= cfg->max_connections_per_ip ? "max_connections_per_ip"
                                                              : NULL;
  int pair[2] = {-1, -1};
  gate_conn *c = NULL;
  SSL *ssl = NULL;
  if (!why && le->tls) {
    pthread_mutex_lock(&g->mu);
    ssl = g->tls_ctx ? SSL_new(g->tls_ctx) : NULL; /* holds its own reference to the context */
    pthread_mutex_unlock(&g->mu);
    if (!ssl || !SSL_set_fd(ssl, fd)) why = "out of resources (TLS)";
    else SSL_set_accept_state(ssl);
    ERR_clear_error();
  }
  if (!why && (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0 ||
               !(c = calloc(1, sizeof *c))))
    why = "out of resources";
  if (why) {
    g->refused_conns++;
    warn(g, 0, "refused a connection from", shown, why);
    if (pair[0] >= 0) close(pair[0]), close(pair[1]);
    SSL_free(ssl);
    close(fd);
    return 0;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->client = (gate_end){END_CLIENT, fd, c, 0};
  c->grpc = (gate_end){END_GRPC, pair[0], c, 0};
  c->peer = p;
  p->conns++;
  snprintf(c->addr, sizeof c->addr, "%s", shown);
  c->grpc_fd = pair[1];
  c->preface_left = PREFACE_LEN;
  c->ssl = ssl;
  c->hs_deadline = now + GATE_HANDSHAKE_S;
  pthread_mutex_lock(&g->mu);
  c->next = g->conns;
  if (g->conns) g->conns->prev = c;
  g->conns = c;
  pthread_mutex_unlock(&g->mu);
  g->nconns++;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->client};
  epoll_ctl(g->ep, EPOLL_CTL_ADD, fd, &ev);
  if (!ssl) hand_to_grpc(g, c); /* TLS: once the handshake is done (handshake) */
  return 0;
}

static void *gate_main(void *arg) {
  struct fbd_gate *g = arg;
  struct epoll_event evs[64];
  while (!atomic_load(&g->stop)) {
    /* the soonest paused connection to resume */
    double now = fbd_now(), next = 0;
    int pending = 0;
    for (gate_conn *c = g->conns; c; c = c->next) {
      if (c->paused_until && (!next || c->paused_until < next)) next = c->paused_until;
      if (!c->ready && (!next || c->hs_deadline < next)) next = c->hs_deadline;
      pending |= tls_pending(c);
    }
    int timeout = next ? (int)ceil((next - now) * 1000) : -1;
    if ((next && timeout < 0) || pending) timeout = 0;
    int n = epoll_wait(g->ep, evs, 64, timeout);
    for (int i = 0; i < n; i++) {
      gate_end *e = evs[i].data.ptr;
      if (e->kind == END_WAKE) continue;
      if (e->kind == END_LISTEN) {
        for (int k = 0; k < 64 && !accept_one(g, e); k++) {} /* a few at a time */
        continue;
      }
      gate_conn *c = e->c;
      if (c->dead) continue; /* closed earlier in this round */
      if (e->kind == END_CLIENT && (evs[i].events & (EPOLLHUP | EPOLLERR))) {
        conn_close(g, c); /* the client has gone both ways */
        continue;
      }
      int in = (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0;
      int rc = pump_conn(g, c, e->kind == END_CLIENT && in, e->kind == END_GRPC && in);
      if (rc) conn_close(g, c);
    }
    now = fbd_now();
    for (gate_conn *c = g->conns, *nx; c; c = nx) {
      nx = c->next;
      if (c->dead) continue;
      if (!c->ready && now >= c->hs_deadline) { /* a slow handshake holds a connection */
        g->tls_slow++;
        char why[96];
        snprintf(why, sizeof why, "its TLS handshake was not done within %.0f s",
                 GATE_HANDSHAKE_S);
        warn(g, 4, "closed the connection of", c->addr, why);
        conn_close(g, c);
        continue;
      }
      if (((c->paused_until && now >= c->paused_until) || tls_pending(c)) && pump_conn(g, c, 0, 0))
        conn_close(g, c);
    }
    bury(g);
  }
  return NULL;
}

/* A call's peer as gRPC names it ("fd:N" on a gated connection): the
 * client's address instead ("ipv4:A:PORT", "ipv6:[A]:PORT"), in a copy
 * from gpr_malloc; NULL when the peer is not a gated connection. With
 * cert_pem: *cert_pem the PEM of the client's certificate as the TLS
 * handshake verified it (--tls-client-ca), a copy from malloc, else NULL. */
char *fbd_gate_peer(fbd_server *srv, const char *peer, char **cert_pem) {
  struct fbd_gate *g = srv->gate;
  if (cert_pem) *cert_pem = NULL;
  if (!g || !peer || strncmp(peer, "fd:", 3) != 0) return NULL;
  char *end = NULL;
  long fd = strtol(peer + 3, &end, 10);
  if (end == peer + 3 || *end) return NULL;
  char *out = NULL;
  pthread_mutex_lock(&g->mu);
  /* two with fd N: gRPC closed the older one's end and the number went to
   * a newer one before the gate saw that; which one the call came on is
   * unknown, so neither (the call gets no address and no certificate) */
  int matches = 0;
  for (gate_conn *c = g->conns; c; c = c->next) matches += c->ready && c->grpc_fd == fd;
  for (gate_conn *c = g->conns; c && !out && matches == 1; c = c->next)
    if (c->ready && c->grpc_fd == fd) { /* ready: gRPC has this fd, so it is this one */
      size_t n = strlen(c->addr) + 6;
      if ((out = gpr_malloc(n)))
        snprintf(out, n, "%s:%s", c->addr[0] == '[' ? "ipv6" : "ipv4", c->addr);
      if (out && cert_pem && c->cert_pem && !(*cert_pem = strdup(c->cert_pem))) {
        gpr_free(out); /* no identity without its certificate: the call fails as unknown */
        out = NULL;
      }
    }
  pthread_mutex_unlock(&g->mu);
  return out;
}

/* ---------------------------------------------------------------- setup */

void fbd_gate_set_tls(fbd_server *srv, SSL_CTX *ctx) {
  struct fbd_gate *g = srv->gate;
  if (!g) {
    SSL_CTX_free(ctx);
    return;
  }
  pthread_mutex_lock(&g->mu);
  SSL_CTX *old = g->tls_ctx;
  g->tls_ctx = ctx;
  pthread_mutex_unlock(&g->mu);
  SSL_CTX_free(old); /* open connections' SSLs hold their own references */
}

int fbd_gate_listen(fbd_server *srv, const char *addr, int tls, char *bound, size_t bn,
                    char *err, size_t errlen) {
  struct fbd_gate *g = srv->gate;
  if (!g) {
    if (!(g = calloc(1, sizeof *g))) return FB_ENOMEM;
    srv->gate = g;
    g->srv = srv;
    pthread_mutex_init(&g->mu, NULL);
    g->ep = epoll_create1(EPOLL_CLOEXEC);
    g->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    g->wake_end = (gate_end){END_WAKE, g->wake, NULL, 0};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &g->wake_end};
    if (g->ep < 0 || g->wake < 0 || epoll_ctl(g->ep, EPOLL_CTL_ADD, g->wake, &ev)) {
      fb_errf(err, errlen, "cannot listen on '%s': %s", addr, strerror(errno));
      return FB_EIO;
    }
  }
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || !colon[1]) {
    fb_errf(err, errlen, "cannot listen on '%s' (not host:port / unix:PATH)", addr);
    return FB_EINVAL;
  }
  char host[256], port[32];
  size_t hl = (size_t)(colon - addr);
  if (addr[0] == '[' && hl >= 2 && addr[hl - 1] == ']') snprintf(host, sizeof host, "%.*s",
                                                                  (int)(hl - 2), addr + 1);
  else snprintf(host, sizeof host, "%.*s", (int)hl, addr);
  snprintf(port, sizeof port, "%s", colon + 1);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int e = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (e) {
    fb_errf(err, errlen, "cannot listen on '%s': %s", addr, gai_strerror(e));
    return FB_EINVAL;
  }
  int nbound = 0, chosen = 0;
  char why[128] = "no address";
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    if (g->nlisteners == (int)(sizeof g->listeners / sizeof *g->listeners)) break;
    if (chosen) { /* port 0: every address of the host on the first one's port */
      if (ai->ai_family == AF_INET) ((struct sockaddr_in *)ai->ai_addr)->sin_port = htons((uint16_t)chosen);
      else if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)ai->ai_addr)->sin6_port = htons((uint16_t)chosen);
    }
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1, zero = 0;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd >= 0 && ai->ai_family == AF_INET6) /* "[::]" takes IPv4 too, as gRPC's does */
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1024)) {
      snprintf(why, sizeof why, "%s", strerror(errno));
      if (fd >= 0) close(fd);
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (!chosen && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
      chosen = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                             : ((struct sockaddr_in6 *)&ss)->sin6_port);
    gate_end *le = &g->listeners[g->nlisteners++];
    *le = (gate_end){END_LISTEN, fd, NULL, tls};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = le};
    epoll_ctl(g->ep, EPOLL_CTL_ADD, fd, &ev);
    nbound++;
  }
  freeaddrinfo(res);
  if (!nbound) {
    fb_errf(err, errlen, "cannot listen on '%s': %s", addr, why);
    return FB_EIO;
  }
  if (strcmp(port, "0") == 0) snprintf(bound, bn, "%.*s:%d", (int)hl, addr, chosen);
  else snprintf(bound, bn, "%s", addr);
  return 0;
}

int fbd_gate_start(fbd_server *srv, char *err, size_t errlen) {
  struct fbd_gate *g = srv->gate;
  if (!g) return 0;
  if (pthread_create(&g->thread, NULL, gate_main, g)) {
    fb_errf(err, errlen, "cannot start the HTTP/2 gate's thread");
    return FB_EINTERNAL;
  }
  g->running = 1;
  return 0;
}

void fbd_gate_stop_accepting(fbd_server *srv) {
  struct fbd_gate *g = srv->gate;
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  g->closed_to_new = 1;
  for (int i = 0; i < g->nlisteners; i++) epoll_ctl(g->ep, EPOLL_CTL_DEL, g->listeners[i].fd, NULL);
  pthread_mutex_unlock(&g->mu);
}

void fbd_gate_free(fbd_server *srv) {
  struct fbd_gate *g = srv->gate;
  if (!g) return;
  if (g->running) {
    atomic_store(&g->stop, 1);
    uint64_t one = 1;
    if (write(g->wake, &one, sizeof one) < 0) {} /* the loop sees stop either way */
    pthread_join(g->thread, NULL);
  }
  while (g->conns) conn_close(g, g->conns);
  bury(g);
  if (g->refused_conns || g->closed_resets || g->closed_early || g->tls_failed || g->tls_slow)
    fbd_logf(srv->log, FBD_LOG_INFO,
             "HTTP/2 gate: %llu connections refused (max_connections, max_connections_per_ip), "
             "%llu closed for rapid reset (reset_rate), %llu for streams before SETTINGS; "
             "new streams held back %llu times (stream_rate); TLS handshakes: %llu failed, "
             "%llu cut for taking too long",
             (unsigned long long)g->refused_conns, (unsigned long long)g->closed_resets,
             (unsigned long long)g->closed_early, (unsigned long long)g->paused,
             (unsigned long long)g->tls_failed, (unsigned long long)g->tls_slow);
  for (int i = 0; i < g->nlisteners; i++) close(g->listeners[i].fd);
  if (g->wake >= 0) close(g->wake);
  if (g->ep >= 0) close(g->ep);
  SSL_CTX_free(g->tls_ctx);
  pthread_mutex_destroy(&g->mu);
  free(g);
  srv->gate = NULL;
}
