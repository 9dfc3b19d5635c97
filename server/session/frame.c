/* The broker<->session frame protocol's I/O, both ends (frame.h holds the
 * frames): a frame's header with a descriptor riding on it, bodies read and
 * written in full; the broker's reads and writes within a frame_clock, the
 * session process's blocking. */
#define _GNU_SOURCE
#include "server/session/proc.h"

frame_clock fbd_frame_clock_start(fbd_session *s, double limit_s) {
  frame_clock c = {s, fbd_now(), s ? fbd_sched_held(s) : 0, limit_s};
  return c;
}

int fbd_frame_clock_past(const frame_clock *c) {
  if (!c) return 0;
  double held = c->s ? fbd_sched_held(c->s) - c->held0 : 0;
  return fbd_now() - c->t0 - held > c->limit_s;
}

/* With a clock: FB_ETIMEOUT once it has passed. */
int fbd_frame_write(int fd, const void *p, size_t n, const frame_clock *clk) {
  const uint8_t *b = p;
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL | (clk ? MSG_DONTWAIT : 0));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (fbd_frame_clock_past(clk)) return FB_ETIMEOUT;
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 50);
      continue;
    }
    if (w <= 0) return FB_EIO;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Room for one descriptor riding on a frame (SCM_RIGHTS). */
typedef union fd_cmsg {
  char buf[CMSG_SPACE(sizeof(int))];
  struct cmsghdr align;
} fd_cmsg;

static void msg_init(struct msghdr *mh, struct iovec *iov, size_t n, fd_cmsg *u) {
  memset(mh, 0, sizeof *mh);
  mh->msg_iov = iov;
  mh->msg_iovlen = n;
  if (u) {
    memset(u, 0, sizeof *u);
    mh->msg_control = u->buf;
    mh->msg_controllen = sizeof u->buf;
  }
}

/* Write the n pieces of iov in full, in as few sends as the socket takes
 * (one, as a rule: a frame's header and body go together); the first
 * carries pass_fd when it is >= 0. Without a clock it blocks; with one it
 * gives FB_ETIMEOUT once the clock has passed. iov is used up. */
int fbd_frame_writev(int fd, struct iovec *iov, int n, int pass_fd, const frame_clock *clk) {
  fd_cmsg u;
  struct msghdr mh;
  while (n && !iov->iov_len) iov++, n--;
  msg_init(&mh, iov, (size_t)n, pass_fd >= 0 ? &u : NULL);
  if (pass_fd >= 0) {
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
  }
  while (mh.msg_iovlen) {
    ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL | (clk ? MSG_DONTWAIT : 0));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (fbd_frame_clock_past(clk)) return FB_ETIMEOUT;
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 50);
      continue;
    }
    if (w <= 0) return FB_EIO;
    mh.msg_control = NULL; /* the fd rode on the first byte */
    mh.msg_controllen = 0;
    size_t left = (size_t)w;
    while (mh.msg_iovlen && left >= mh.msg_iov->iov_len) {
      left -= mh.msg_iov->iov_len;
      mh.msg_iov++;
      mh.msg_iovlen--;
    }
    if (mh.msg_iovlen) {
      mh.msg_iov->iov_base = (uint8_t *)mh.msg_iov->iov_base + left;
      mh.msg_iov->iov_len -= left;
    }
  }
  return 0;
}

/* Send head (with fd attached when fd >= 0) and body, within clk. */
int fbd_frame_send(int fd, const void *head, size_t hn, int pass_fd, const void *body, size_t bn,
                   const frame_clock *clk) {
  struct iovec iov[2] = {{(void *)head, hn}, {(void *)body, bn}};
  return fbd_frame_writev(fd, iov, 2, pass_fd, clk);
}

/* Wait until fd is readable: spin (yielding) for spin_s first, then poll in
 * steps of at most step_ms. 1 readable, 0 the step passed. */
int fbd_frame_wait(int fd, double spin_s, int step_ms) {
  struct pollfd pf = {fd, POLLIN, 0};
  if (spin_s > 0) {
    double t0 = fbd_now();
    do {
      if (poll(&pf, 1, 0) > 0) return 1;
      sched_yield();
    } while (fbd_now() - t0 < spin_s);
  }
  int r = poll(&pf, 1, step_ms);
  return r > 0 || (r < 0 && errno != EINTR);
}

/* Read exactly n bytes; *fdout gets an fd passed with them. Without a clock
 * it blocks; with one it gives FB_ETIMEOUT once the clock has passed. */
int fbd_frame_read(int fd, void *p, size_t n, int *fdout, const frame_clock *clk) {
  uint8_t *b = p;
  while (n) {
    struct iovec iov = {b, n};
    fd_cmsg u;
    struct msghdr mh;
    msg_init(&mh, &iov, 1, fdout ? &u : NULL);
    ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | (clk ? MSG_DONTWAIT : 0));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (fbd_frame_clock_past(clk)) return FB_ETIMEOUT;
      struct pollfd pf = {fd, POLLIN, 0};
      poll(&pf, 1, 50);
      continue;
    }
    if (r <= 0) return FB_EIO;
    if (fdout) {
      for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
          int got;
          memcpy(&got, CMSG_DATA(cm), sizeof got);
          if (*fdout >= 0) close(got); /* one fd per frame */
          else *fdout = got;
        }
    }
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

int fbd_frame_read_full(int fd, void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

int fbd_frame_write_full(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n) {
    ssize_t r = send(fd, b, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}
