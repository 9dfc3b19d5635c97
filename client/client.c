/* libfusebox connections: the channel and its completion queue, blocking
 * unary calls with deadlines, error codes from the server's status and its
 * "fusebox-code" trailer, and the server-wide calls: health check, info,
 * stats, and raw calls for tools and tests. */
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/client_internal.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEFAULT_MAX_MSG ((size_t)FB_CLIENT_MAX_MESSAGE_BYTES) /* fusebox/limits.h */
#define DEFAULT_CHUNK ((size_t)FB_CHUNK_BYTES_DEFAULT)
#define DEFAULT_BATCH 4096

static void cerr(fb_client *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void cerr(fb_client *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fb_verrf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
}

/* ---------------------------------------------------------------- calls */

void fbc_end_init(fbc_end *e) {
  grpc_metadata_array_init(&e->trailing);
  e->status = GRPC_STATUS_UNKNOWN;
  e->details = grpc_empty_slice();
}

void fbc_end_free(fbc_end *e) {
  grpc_metadata_array_destroy(&e->trailing);
  grpc_slice_unref(e->details);
  e->details = grpc_empty_slice();
}

int fbc_end_code(const fbc_end *e, char *err, size_t errlen) {
  if (e->status == GRPC_STATUS_OK) return FB_OK;
  int code = fbp_code_of_status((int)e->status);
  for (size_t i = 0; i < e->trailing.count; i++) {
    const grpc_metadata *m = &e->trailing.metadata[i];
    if (grpc_slice_str_cmp(m->key, FBP_CODE_KEY) != 0) continue;
    char num[16];
    size_t n = GRPC_SLICE_LENGTH(m->value) < 15 ? GRPC_SLICE_LENGTH(m->value) : 15;
    memcpy(num, GRPC_SLICE_START_PTR(m->value), n);
    num[n] = 0;
    int v = atoi(num);
    if (v < 0 && v >= FB_ELAST) code = v;
  }
  size_t n = GRPC_SLICE_LENGTH(e->details);
  if (n) fb_errf(err, errlen, "%.*s", (int)n, (const char *)GRPC_SLICE_START_PTR(e->details));
  else fb_errf(err, errlen, "%s (gRPC status %d)", fb_strerror(code), (int)e->status);
  return code;
}

static gpr_timespec deadline(const fb_client *c) {
  if (c->timeout_ms < 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                      gpr_time_from_millis(c->timeout_ms, GPR_TIMESPAN));
}

grpc_call *fbc_call_new(fb_client *c, const char *method, int with_deadline) {
  grpc_slice m = grpc_slice_from_static_string(method);
  gpr_timespec d = with_deadline ? deadline(c) : gpr_inf_future(GPR_CLOCK_REALTIME);
  grpc_call *call =
      grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq, m, NULL, d, NULL);
  grpc_slice_unref(m);
  return call;
}

void fbc_initial_md(fb_client *c, grpc_op *op) {
  op->op = GRPC_OP_SEND_INITIAL_METADATA;
  op->data.send_initial_metadata.count = c->nauth;
  op->data.send_initial_metadata.metadata = c->nauth ? &c->auth : NULL;
}

void fbc_initial_md_route(fb_client *c, grpc_op *op, grpc_metadata md[2], const fbc_route *rt) {
  fbc_initial_md(c, op);
  if (!rt || !rt->key[0] || c->no_route) return;
  size_t n = 0;
  if (c->nauth) md[n++] = c->auth;
  md[n].key = grpc_slice_from_static_string("fusebox-route");
  md[n++].value = grpc_slice_from_static_string(rt->key);
  op->data.send_initial_metadata.count = n;
  op->data.send_initial_metadata.metadata = md;
}

int fbc_route_init(fbc_route *rt) {
  memset(rt, 0, sizeof *rt);
  uint8_t b[16];
  FILE *f = fopen("/dev/urandom", "rb");
  size_t got = f ? fread(b, 1, sizeof b, f) : 0;
  if (f) fclose(f);
  if (got != sizeof b) return FB_EIO;
  for (int i = 0; i < 16; i++) snprintf(rt->key + 2 * i, 3, "%02x", b[i]);
  return 0;
}

void fbc_route_replica(fbc_route *rt, const grpc_metadata_array *md) {
  /* any answer of a draining replica: the session moves at its next call */
  for (size_t i = 0; rt && md && i < md->count; i++)
    if (grpc_slice_str_cmp(md->metadata[i].key, "fusebox-draining") == 0) rt->draining = 1;
  /* the first answer's (CreateSession): the replica that holds the session */
  for (size_t i = 0; rt && !rt->replica[0] && md && i < md->count; i++) {
    const grpc_metadata *m = &md->metadata[i];
    if (grpc_slice_str_cmp(m->key, "fusebox-replica") != 0) continue;
    size_t n = GRPC_SLICE_LENGTH(m->value);
    if (n >= sizeof rt->replica) n = sizeof rt->replica - 1;
    memcpy(rt->replica, GRPC_SLICE_START_PTR(m->value), n);
    rt->replica[n] = 0;
  }
}

int fbc_route_lost(const fbc_route *rt, char *err, size_t errlen) {
  fb_errf(err, errlen,
          "session %.8s lost: replica %s unreachable (its state is gone; open a new session)",
          rt->session, rt->replica[0] ? rt->replica : "?");
  return FB_EIO;
}

/* Whether e says the session's replica is gone rather than anything of
 * fuseboxd's own (which always sends fusebox-code). */
static int end_lost(const fbc_end *e) {
  int fuseboxd = 0;
  for (size_t i = 0; i < e->trailing.count; i++)
    fuseboxd |= grpc_slice_str_cmp(e->trailing.metadata[i].key, FBP_CODE_KEY) == 0;
  char d[512];
  size_t n = GRPC_SLICE_LENGTH(e->details) < sizeof d - 1 ? GRPC_SLICE_LENGTH(e->details)
                                                          : sizeof d - 1;
  memcpy(d, GRPC_SLICE_START_PTR(e->details), n);
  d[n] = 0;
  if (e->status == GRPC_STATUS_NOT_FOUND && strstr(d, "(lost or moved)")) return 1;
  if (fuseboxd) return 0;
  /* a proxy's 502/503/504 reads as UNAVAILABLE or UNKNOWN "Received http2
     header with status: 502"; a backend gone mid-stream as a reset stream */
  return e->status == GRPC_STATUS_UNAVAILABLE || strstr(d, "http2 header with status") ||
         ((e->status == GRPC_STATUS_INTERNAL || e->status == GRPC_STATUS_UNKNOWN ||
           e->status == GRPC_STATUS_CANCELLED) &&
          strstr(d, "RST_STREAM")); /* HAProxy: RST_STREAM CANCEL */
}

int fbc_end_route(const fbc_end *e, const fbc_route *rt, char *err, size_t errlen) {
  int code = fbc_end_code(e, err, errlen);
  if (code && rt && rt->session && end_lost(e)) return fbc_route_lost(rt, err, errlen);
  return code;
}

int fbc_start(grpc_call *call, const grpc_op *ops, size_t n, void *tag) {
  return grpc_call_start_batch(call, ops, n, tag, NULL) == GRPC_CALL_OK ? 0 : FB_EINTERNAL;
}

int fbc_wait(fb_client *c, grpc_call *call, void *tag) {
  grpc_event ev = grpc_completion_queue_pluck(c->cq, tag, deadline(c), NULL);
  if (ev.type == GRPC_OP_COMPLETE) return ev.success ? 1 : 0;
  /* timed out: cancel, then collect the op so that its tag is free again */
  grpc_call_cancel_with_status(call, GRPC_STATUS_DEADLINE_EXCEEDED, "client timeout", NULL);
  grpc_completion_queue_pluck(c->cq, tag, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  return -1;
}

int fbc_batch(fb_client *c, grpc_call *call, const grpc_op *ops, size_t n, void *tag) {
  if (fbc_start(call, ops, n, tag)) return 0;
  return fbc_wait(c, call, tag);
}

int fbc_start_status(grpc_call *call, fbc_end *e, void *tag) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &e->trailing;
  op.data.recv_status_on_client.status = &e->status;
  op.data.recv_status_on_client.status_details = &e->details;
  return fbc_start(call, &op, 1, tag);
}

/* The ops of one request and its reply on a fresh call (ops zeroed by the
 * caller): initial metadata, the request, close, the reply's metadata and
 * its message. */
static void unary_ops(fb_client *c, grpc_op *ops, grpc_byte_buffer *req, grpc_metadata_array *md,
                      grpc_byte_buffer **rbb, grpc_metadata rmd[2], const fbc_route *rt) {
  fbc_initial_md_route(c, &ops[0], rmd, rt);
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = req;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = rbb;
}

/* One message each way on a fresh call. */
static int raw_unary(fb_client *c, fbc_route *rt, const char *method, grpc_byte_buffer *req,
                     grpc_slice *resp, char *err, size_t errlen) {
  grpc_call *call = fbc_call_new(c, method, 1);
  if (!call) {
    fb_errf(err, errlen, "cannot create a call to %s", method);
    return FB_EINTERNAL;
  }
  fbc_end e;
  fbc_end_init(&e);
  grpc_metadata_array init_md;
  grpc_metadata_array_init(&init_md);
  grpc_byte_buffer *rbb = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  grpc_metadata rmd[2];
  unary_ops(c, ops, req, &init_md, &rbb, rmd, rt);
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &e.trailing;
  ops[5].data.recv_status_on_client.status = &e.status;
  ops[5].data.recv_status_on_client.status_details = &e.details;
  int tag;
  int ok = fbc_batch(c, call, ops, 6, &tag);
  int rc = ok > 0 ? fbc_end_route(&e, rt, err, errlen) : FB_EIO;
  if (ok > 0) fbc_route_replica(rt, &init_md);
  if (ok == 0 && rt && rt->session) rc = fbc_route_lost(rt, err, errlen);
  else if (ok == 0) fb_errf(err, errlen, "%s: the call failed", method);
  if (ok < 0)
    fb_errf(err, errlen, "%s: no answer within %lld ms", method, (long long)c->timeout_ms);
  if (resp) *resp = rc == 0 && rbb ? fbp_bb_slice(rbb) : grpc_empty_slice();
  if (rbb) grpc_byte_buffer_destroy(rbb);
  grpc_metadata_array_destroy(&init_md);
  fbc_end_free(&e);
  grpc_call_unref(call);
  return rc;
}

int fbc_unary(fb_client *c, const char *method, const ProtobufCMessage *req, grpc_slice *resp,
              char *err, size_t errlen) {
  return fbc_unary_route(c, NULL, method, req, resp, err, errlen);
}

int fbc_unary_route(fb_client *c, fbc_route *rt, const char *method, const ProtobufCMessage *req,
                    grpc_slice *resp, char *err, size_t errlen) {
  grpc_byte_buffer *bb = fbp_bb_pack(req, NULL);
  int rc = raw_unary(c, rt, method, bb, resp, err, errlen);
  grpc_byte_buffer_destroy(bb);
  return rc;
}

/* ---------------------------------------------------------------- connection */

static const char *opt_or_env(const char *v, const char *env) {
  if (v && *v) return v;
  const char *e = getenv(env);
  return e && *e ? e : NULL;
}

static char *read_pem(const char *path, const char *what, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  char *buf = f ? malloc((1 << 20) + 1) : NULL;
  size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
  int bad = !f || !buf || ferror(f) || !n;
  if (f) fclose(f);
  if (bad) {
    free(buf);
    fb_errf(err, errlen, "%s: cannot read '%s'", what, path);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

/* The channel's credentials: TLS when a CA (or a client certificate) is
 * given and the target is host:port; else plain. NULL with err. */
static grpc_channel_credentials *channel_creds(const char *target, const fb_client_options *opt,
                                               char *err, size_t errlen) {
  const char *ca = opt_or_env(opt ? opt->tls_ca : NULL, "FUSEBOX_TLS_CA");
  const char *cert = opt_or_env(opt ? opt->tls_cert : NULL, "FUSEBOX_TLS_CERT");
  const char *key = opt_or_env(opt ? opt->tls_key : NULL, "FUSEBOX_TLS_KEY");
  if (!strncmp(target, "unix:", 5) || (!ca && !cert && !key))
    return grpc_insecure_credentials_create();
  if (!cert != !key) {
    fb_errf(err, errlen,
            "a client certificate needs both its certificate "
            "and its key (FUSEBOX_TLS_CERT, FUSEBOX_TLS_KEY)");
    return NULL;
  }
  char *ca_pem = NULL, *cert_pem = NULL, *key_pem = NULL;
  grpc_channel_credentials *cr = NULL;
  if ((ca && !(ca_pem = read_pem(ca, "TLS CA", err, errlen))) ||
      (cert && !(cert_pem = read_pem(cert, "TLS certificate", err, errlen))) ||
      (key && !(key_pem = read_pem(key, "TLS key", err, errlen))))
    goto out;
  grpc_ssl_pem_key_cert_pair pair = {key_pem, cert_pem};
  cr = grpc_ssl_credentials_create(ca_pem, cert_pem ? &pair : NULL, NULL, NULL);
  if (!cr) fb_errf(err, errlen, "gRPC refused the TLS settings");
out:
  if (key_pem) memset(key_pem, 0, strlen(key_pem));
  free(ca_pem);
  free(cert_pem);
  free(key_pem);
  return cr;
}

/* A target whose traffic stays on this machine: unix:PATH or loopback. */
static int local_target(const char *t) {
  if (!strncmp(t, "unix:", 5) || !strncmp(t, "unix-abstract:", 14)) return 1;
  if (!strncmp(t, "dns:///", 7)) t += 7;
  else if (!strncmp(t, "ipv4:", 5) || !strncmp(t, "ipv6:", 5)) t += 5;
  return !strncmp(t, "127.", 4) || !strncmp(t, "localhost:", 10) || !strncmp(t, "[::1]:", 6);
}

/* The bearer token (from opt or FUSEBOX_TOKEN) as call metadata. */
static int set_token(fb_client *c, const fb_client_options *opt, char *err, size_t errlen) {
  const char *tok = opt_or_env(opt ? opt->token : NULL, "FUSEBOX_TOKEN");
  if (!tok) return 0;
  size_t n = strlen(tok);
  while (n && (tok[n - 1] == '\n' || tok[n - 1] == '\r' || tok[n - 1] == ' ')) n--;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)tok[i] < 0x21 || (unsigned char)tok[i] > 0x7e) {
      fb_errf(err, errlen,
              "the token holds a character that is not "
              "printable ASCII (at byte %zu)",
              i);
      return FB_EINVAL;
    }
  char *v = malloc(n + 8);
  if (!v) return FB_ENOMEM;
  memcpy(v, "Bearer ", 7);
  memcpy(v + 7, tok, n);
  c->auth.key = grpc_slice_from_static_string("authorization");
  c->auth.value = grpc_slice_from_copied_buffer(v, n + 7);
  memset(v, 0, n + 7);
  free(v);
  c->nauth = 1;
  return 0;
}

fb_client *fbc_next_address(fb_client *c) {
  fb_client *h = c ? c->head : NULL;
  return h && h->npeers > 1 ? h->peers[(c->index + 1) % h->npeers] : NULL;
}

/* "A,B,C": a client for each address, the first holding the others. */
static int connect_list(const char *target, const fb_client_options *opt, fb_client **out,
                        char *err, size_t errlen) {
  char *list = strdup(target);
  int n = 1, rc = list ? 0 : FB_ENOMEM;
  for (const char *p = target; *p; p++) n += *p == ',';
  fb_client **v = rc ? NULL : calloc((size_t)n, sizeof *v);
  if (!rc && !v) rc = FB_ENOMEM;
  if (rc) fb_errf(err, errlen, "out of memory");
  int k = 0;
  for (char *save = NULL, *a = rc ? NULL : strtok_r(list, ",", &save); a && !rc;
       a = strtok_r(NULL, ",", &save)) {
    if ((rc = fb_client_connect(a, opt, &v[k], err, errlen)) == 0) k++;
  }
  if (!rc && k != n) {
    fb_errf(err, errlen, "address list '%s': an address is empty", target);
    rc = FB_EINVAL;
  }
  free(list);
  if (rc) {
    for (int i = 0; i < k; i++) fb_client_close(v[i]);
    free(v);
    return rc;
  }
  for (int i = 0; i < n; i++) {
    v[i]->head = v[0];
    v[i]->index = i;
  }
  v[0]->peers = v;
  v[0]->npeers = n;
  *out = v[0];
  return 0;
}

int fb_client_connect(const char *target, const fb_client_options *opt, fb_client **out, char *err,
                      size_t errlen) {
  *out = NULL;
  if (!target || !*target) {
    fb_errf(err, errlen, "no server address given");
    return FB_EINVAL;
  }
  if (strchr(target, ',')) return connect_list(target, opt, out, err, errlen);
  fb_client *c = calloc(1, sizeof *c);
  if (!c || !(c->target = strdup(target))) {
    free(c);
    fb_errf(err, errlen, "out of memory");
    return FB_ENOMEM;
  }
  c->timeout_ms = opt && opt->timeout_ms ? opt->timeout_ms : DEFAULT_TIMEOUT_MS;
  c->max_msg = opt && opt->max_message_bytes ? opt->max_message_bytes : DEFAULT_MAX_MSG;
  c->chunk = opt && opt->chunk_bytes ? opt->chunk_bytes : DEFAULT_CHUNK;
  if (c->chunk + 256 > c->max_msg) c->chunk = c->max_msg - 256;
  c->batch = opt && opt->batch_launches > 0 ? opt->batch_launches : DEFAULT_BATCH;
  c->no_route = opt && opt->no_route_key;
  grpc_init();
  int rc = set_token(c, opt, err, errlen);
  int tls = !strncmp(target, "unix:", 5)
                ? 0
                : opt_or_env(opt ? opt->tls_ca : NULL, "FUSEBOX_TLS_CA") ||
                      opt_or_env(opt ? opt->tls_cert : NULL, "FUSEBOX_TLS_CERT");
  const char *ins = getenv("FUSEBOX_INSECURE");
  if (!rc && c->nauth && !tls && !local_target(target) && !(ins && !strcmp(ins, "1"))) {
    /* as gRPC does for call credentials: no token in the clear off this machine */
    fb_errf(err, errlen,
            "refusing to send a token in the clear to '%s': "
            "use TLS (FUSEBOX_TLS_CA, --tls-ca), or set FUSEBOX_INSECURE=1",
            target);
    rc = FB_EINVAL;
  }
  grpc_channel_credentials *cr = rc ? NULL : channel_creds(target, opt, err, errlen);
  if (!cr) {
    if (c->nauth) grpc_slice_unref(c->auth.value);
    free(c->target);
    free(c);
    grpc_shutdown();
    return rc ? rc : FB_EINVAL;
  }
  grpc_arg a[2];
  a[0].type = a[1].type = GRPC_ARG_INTEGER;
  a[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  a[0].value.integer = -1;
  a[1].key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  a[1].value.integer = -1;
  grpc_channel_args args = {2, a};
  c->ch = grpc_channel_create(target, cr, &args);
  grpc_channel_credentials_release(cr);
  c->cq = grpc_completion_queue_create_for_pluck(NULL);
  c->head = c;
  *out = c;
  return 0;
}

void fb_client_close(fb_client *c) {
  if (!c) return;
  for (int i = 1; i < c->npeers; i++) fb_client_close(c->peers[i]); /* the list's others */
  free(c->peers);
  grpc_channel_destroy(c->ch);
  grpc_completion_queue_shutdown(c->cq);
  while (grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {}
  grpc_completion_queue_destroy(c->cq);
  if (c->nauth) grpc_slice_unref(c->auth.value);
  free(c->target);
  free(c);
  grpc_shutdown();
}

const char *fb_client_errmsg(const fb_client *c) { return c ? c->err : "no client"; }
const char *fb_client_target(const fb_client *c) { return c ? c->target : ""; }

/* ---------------------------------------------------------------- server-wide calls */

int fb_client_ping(fb_client *c, int *status, double *rtt_s) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  grpc_slice resp;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = fbc_unary(c, "/grpc.health.v1.Health/Check", &req.base, &resp, c->err, sizeof c->err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rtt_s) *rtt_s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  if (status) *status = 0;
  if (rc) return rc;
  Grpc__Health__V1__HealthCheckResponse *m = grpc__health__v1__health_check_response__unpack(
      NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m) {
    cerr(c, "malformed health check answer");
    return FB_EINTERNAL;
  }
  int st = (int)m->status;
  grpc__health__v1__health_check_response__free_unpacked(m, NULL);
  if (status) *status = st;
  if (st != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
    cerr(c, "the server is not serving (status %d)", st);
    return FB_EIO;
  }
  return 0;
}

static void copy_str(char *dst, size_t n, const char *src) {
  snprintf(dst, n, "%s", src ? src : "");
}

int fb_client_info(fb_client *c, fb_server_info *out) {
  memset(out, 0, sizeof *out);
  Fusebox__V1__InfoRequest req = FUSEBOX__V1__INFO_REQUEST__INIT;
  grpc_slice resp;
  int rc = fbc_unary(c, "/fusebox.v1.Fusebox/GetInfo", &req.base, &resp, c->err, sizeof c->err);
  if (rc) return rc;
  Fusebox__V1__ServerInfo *m =
      fusebox__v1__server_info__unpack(NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m) {
    cerr(c, "malformed GetInfo answer");
    return FB_EINTERNAL;
  }
  copy_str(out->version, sizeof out->version, m->version);
  copy_str(out->backend, sizeof out->backend, m->backend);
  out->cores = m->cores;
  out->max_sessions = m->max_sessions;
  out->session_memory_limit = m->session_memory_limit;
  out->max_message_bytes = m->max_message_bytes;
  out->uptime_s = m->uptime_s;
  size_t used = 0;
  for (size_t i = 0; i < m->n_listen && used < sizeof out->listen; i++)
    used += (size_t)snprintf(out->listen + used, sizeof out->listen - used, "%s%s", i ? " " : "",
                             m->listen[i]);
  fusebox__v1__server_info__free_unpacked(m, NULL);
  return 0;
}

void fbc_learn_limits(fb_client *c) {
  if (c->limits_known) return;
  fb_server_info info;
  char keep[FBC_ERRLEN];
  memcpy(keep, c->err, sizeof keep);
  if (fb_client_info(c, &info) == 0 && info.max_message_bytes >= 16384) {
    c->limits_known = 1;
    if (c->max_msg > info.max_message_bytes) c->max_msg = info.max_message_bytes;
    if (c->chunk + 4096 > c->max_msg) c->chunk = c->max_msg - 4096;
  }
  memcpy(c->err, keep, sizeof keep);
}

static void session_stats(fb_session_stats *d, const Fusebox__V1__SessionStats *m) {
  copy_str(d->tag, sizeof d->tag, m->tag);
  d->memory_bytes = m->memory_bytes;
  d->attached = m->attached;
  d->idle_s = m->idle_s;
  fbp_counters_from_pb(m->counters, &d->counters);
}

/* Shared with remote.c: stats of the server, and of one session when id is
 * given. */
int fbc_stats(fb_client *c, const char *id, fb_server_stats *out, char *err, size_t errlen);

int fbc_stats(fb_client *c, const char *id, fb_server_stats *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  Fusebox__V1__StatsRequest req = FUSEBOX__V1__STATS_REQUEST__INIT;
  req.session_id = (char *)(id ? id : "");
  grpc_slice resp;
  int rc = fbc_unary(c, "/fusebox.v1.Fusebox/GetStats", &req.base, &resp, err, errlen);
  if (rc) return rc;
  Fusebox__V1__ServerStats *m =
      fusebox__v1__server_stats__unpack(NULL, GRPC_SLICE_LENGTH(resp), GRPC_SLICE_START_PTR(resp));
  grpc_slice_unref(resp);
  if (!m) {
    fb_errf(err, errlen, "malformed GetStats answer");
    return FB_EINTERNAL;
  }
  out->sessions_active = m->sessions_active;
  out->sessions_created = m->sessions_created;
  out->sessions_closed = m->sessions_closed;
  out->sessions_disconnected = m->sessions_disconnected;
  out->sessions_reaped = m->sessions_reaped;
  out->sessions_failed = m->sessions_failed;
  out->memory_bytes = m->memory_bytes;
  out->memory_peak_bytes = m->memory_peak_bytes;
  out->launches = m->launches;
  out->syncs = m->syncs;
  out->bad_requests = m->bad_requests;
  out->bytes_in = m->bytes_in;
  out->bytes_out = m->bytes_out;
  out->calls_refused = m->calls_refused;
  out->tenant_calls_refused = m->tenant_calls_refused;
  out->uptime_s = m->uptime_s;
  if (m->n_sessions && (out->sessions = calloc(m->n_sessions, sizeof *out->sessions))) {
    for (size_t i = 0; i < m->n_sessions; i++) session_stats(&out->sessions[i], m->sessions[i]);
    out->nsessions = (int)m->n_sessions;
  }
  fusebox__v1__server_stats__free_unpacked(m, NULL);
  return 0;
}

int fb_client_stats(fb_client *c, fb_server_stats *out) {
  return fbc_stats(c, NULL, out, c->err, sizeof c->err);
}

void fb_server_stats_free(fb_server_stats *s) {
  if (!s) return;
  free(s->sessions);
  s->sessions = NULL;
  s->nsessions = 0;
}

int fb_client_raw_call(fb_client *c, const char *method, const void *req, size_t len, void **resp,
                       size_t *resp_len, int *grpc_status) {
  if (resp) *resp = NULL;
  if (resp_len) *resp_len = 0;
  grpc_call *call = fbc_call_new(c, method, 1);
  fbc_end e;
  fbc_end_init(&e);
  grpc_metadata_array init_md;
  grpc_metadata_array_init(&init_md);
  grpc_byte_buffer *rq = fbp_bb_from(req, len), *rbb = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  grpc_metadata rmd[2];
  unary_ops(c, ops, rq, &init_md, &rbb, rmd, NULL);
  int tag, stag;
  int ok = fbc_batch(c, call, ops, 5, &tag);
  /* the status separately: a stream may answer with no message at all */
  if (fbc_start_status(call, &e, &stag) == 0) fbc_wait(c, call, &stag);
  int rc = fbc_end_code(&e, c->err, sizeof c->err);
  if (grpc_status) *grpc_status = (int)e.status;
  if (ok > 0 && rbb && resp) {
    grpc_slice s = fbp_bb_slice(rbb);
    size_t n = GRPC_SLICE_LENGTH(s);
    if ((*resp = malloc(n ? n : 1))) {
      memcpy(*resp, GRPC_SLICE_START_PTR(s), n);
      if (resp_len) *resp_len = n;
    }
    grpc_slice_unref(s);
  }
  if (rbb) grpc_byte_buffer_destroy(rbb);
  grpc_byte_buffer_destroy(rq);
  grpc_metadata_array_destroy(&init_md);
  fbc_end_free(&e);
  grpc_call_unref(call);
  return rc;
}
