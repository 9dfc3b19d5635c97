/* Tenants: who a call is, which sessions it may touch, what it may create.
 *
 * The tenants file (--tenants FILE, JSON, read again on SIGHUP):
 *   {"tenants": [
 *     {"name": "alice", "role": "user",
 *      "token_sha256": ["<64 hex digits: SHA-256 of the token>"],
 *      "subjects": ["CN=alice,O=Example"],
 *      "limits": {"max_sessions": 4, "memory_bytes": "8G", "time_share": 1,
 *                 "max_compiles": 2}}]}
 * It holds hashes only, never tokens. A call names its tenant by a bearer
 * token ("authorization: Bearer TOKEN" metadata), whose SHA-256 (OpenSSL's
 * EVP) is compared in constant time with every hash in the file, or by the
 * subject of its verified client certificate (mTLS, with --tls-client-ca):
 * the certificate's PEM, kept by the HTTP/2 gate's TLS handshake
 * (h2gate.c), is parsed with OpenSSL and its subject compared attribute
 * by attribute with each configured subject, parsed once when the file is
 * loaded (subject.c; never as text). A token,
 * when sent, decides; a wrong token is refused even with a good certificate.
 *
 * Without a tenants file nothing changes: every call is the one anonymous
 * tenant, which sees and may touch every session. */
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server.h"

#define HEALTH_PATH "/grpc.health.v1.Health/Check"
#define STATS_PATH "/fusebox.v1.Fusebox/GetStats"
#define MAX_TOKEN 4096

/* ---------------------------------------------------------------- the file */

static void tenant_clear(fbd_tenant *t) {
  for (int i = 0; i < t->nsubjects; i++) fbd_subject_clear(&t->subjects[i]);
  free(t->subjects);
  free(t->hashes);
  t->subjects = NULL;
  t->hashes = NULL;
  t->nsubjects = t->nhashes = 0;
}

static int hexval(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

static int parse_hash(const char *s, uint8_t out[32]) {
  if (!s || strlen(s) != 64) return FB_EINVAL;
  for (int i = 0; i < 32; i++) {
    int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return FB_EINVAL;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

static int good_name(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n >= FBD_TENANT_NAME) return 0;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          *p == '_' || *p == '-' || *p == '.'))
      return 0;
  return 1;
}

static int limits_from_json(fbd_tenant *t, json_t *v, const char *where, char *err, size_t errlen) {
  if (!v) return 0;
  if (!json_is_object(v)) {
    fb_errf(err, errlen, "%s.limits: expected an object", where);
    return FB_EINVAL;
  }
  const char *key;
  json_t *x;
  json_object_foreach(v, key, x) {
    if (!strcmp(key, "max_sessions")) {
      if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1 << 20) {
        fb_errf(err, errlen, "%s.limits.max_sessions: expected an integer 0..%d", where, 1 << 20);
        return FB_EINVAL;
      }
      t->max_sessions = (int)json_integer_value(x);
    } else if (!strcmp(key, "memory_bytes")) {
      char num[32];
      const char *s = json_is_string(x) ? json_string_value(x) : NULL;
      if (json_is_integer(x) && json_integer_value(x) >= 0) {
        snprintf(num, sizeof num, "%lld", (long long)json_integer_value(x));
        s = num;
      }
      if (!s || fbd_parse_bytes(s, &t->memory_bytes)) {
        fb_errf(err, errlen,
                "%s.limits.memory_bytes: expected bytes (a number, or text like "
                "\"8G\")",
                where);
        return FB_EINVAL;
      }
    } else if (!strcmp(key, "time_share")) {
      if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 1000) {
        fb_errf(err, errlen,
                "%s.limits.time_share: expected an integer 1..1000 (the tenant's "
                "weight in the fair scheduler)",
                where);
        return FB_EINVAL;
      }
      atomic_store(&t->time_share, (int)json_integer_value(x));
    } else if (!strcmp(key, "max_compiles")) {
      if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1024) {
        fb_errf(err, errlen, "%s.limits.max_compiles: expected an integer 0..1024 (0: no limit)",
                where);
        return FB_EINVAL;
      }
      atomic_store(&t->max_compiles, (int)json_integer_value(x));
    } else {
      fb_errf(err, errlen,
              "%s.limits: unknown key '%s' (expected max_sessions, memory_bytes, "
              "time_share, max_compiles)",
              where, key);
      return FB_EINVAL;
    }
  }
  return 0;
}

static int strings_from_json(json_t *v, const char *where, const char *key, char ***out, int *n,
                             char *err, size_t errlen) {
  if (!v) return 0;
  if (!json_is_array(v)) {
    fb_errf(err, errlen, "%s.%s: expected an array of strings", where, key);
    return FB_EINVAL;
  }
  size_t i;
  json_t *x;
  *out = calloc(json_array_size(v) + 1, sizeof **out);
  if (!*out) return FB_ENOMEM;
  json_array_foreach(v, i, x) {
    if (!json_is_string(x) || !*json_string_value(x)) {
      fb_errf(err, errlen, "%s.%s[%zu]: expected a non-empty string", where, key, i);
      return FB_EINVAL;
    }
    if (!((*out)[(*n)++] = strdup(json_string_value(x)))) return FB_ENOMEM;
  }
  return 0;
}

/* One tenant object into t (cleared first). */
static int tenant_from_json(fbd_tenant *t, json_t *o, size_t idx, char *err, size_t errlen) {
  char where[96];
  snprintf(where, sizeof where, "tenants[%zu]", idx);
  if (!json_is_object(o)) {
    fb_errf(err, errlen, "%s: expected an object", where);
    return FB_EINVAL;
  }
  const char *key;
  json_t *x;
  json_object_foreach(o, key, x) {
    static const char *const known[] = {"name", "role", "token_sha256", "subjects", "limits"};
    int k = 0;
    while (k < 5 && strcmp(key, known[k])) k++;
    if (k == 5) {
      fb_errf(err, errlen,
              "%s: unknown key '%s' (expected name, role, token_sha256, subjects, "
              "limits; plain tokens never go in this file)",
              where, key);
      return FB_EINVAL;
    }
  }
  const char *name = json_string_value(json_object_get(o, "name"));
  if (!name || !good_name(name)) {
    fb_errf(err, errlen, "%s.name: expected 1 to %d letters, digits, '_', '-' or '.'", where,
            FBD_TENANT_NAME - 1);
    return FB_EINVAL;
  }
  snprintf(where, sizeof where, "tenant '%s'", name);
  snprintf(t->name, sizeof t->name, "%s", name);
  json_t *role = json_object_get(o, "role");
  const char *r = role ? json_string_value(role) : "user";
  if (!r || (strcmp(r, "user") && strcmp(r, "admin"))) {
    fb_errf(err, errlen, "%s.role: expected \"user\" or \"admin\"", where);
    return FB_EINVAL;
  }
  t->admin = !strcmp(r, "admin");
  atomic_store(&t->time_share, 1);
  atomic_store(&t->max_compiles, FBD_DEFAULT_MAX_COMPILES);
  char **hex = NULL;
  int nhex = 0;
  int rc = strings_from_json(json_object_get(o, "token_sha256"), where, "token_sha256", &hex, &nhex,
                             err, errlen);
  if (!rc && nhex && !(t->hashes = calloc((size_t)nhex, sizeof *t->hashes))) rc = FB_ENOMEM;
  for (int i = 0; !rc && i < nhex; i++, t->nhashes++)
    if (parse_hash(hex[i], t->hashes[i])) {
      fb_errf(err, errlen, "%s.token_sha256[%d]: expected 64 hex digits (sha256sum of the token)",
              where, i);
      rc = FB_EINVAL;
    }
  for (int i = 0; hex && hex[i]; i++) free(hex[i]);
  free(hex);
  char **subj = NULL;
  int nsubj = 0;
  if (!rc)
    rc = strings_from_json(json_object_get(o, "subjects"), where, "subjects", &subj, &nsubj, err,
                           errlen);
  if (!rc && nsubj && !(t->subjects = calloc((size_t)nsubj, sizeof *t->subjects))) rc = FB_ENOMEM;
  for (int i = 0; !rc && i < nsubj; i++, t->nsubjects++) {
    char why[FBD_ERRLEN];
    if ((rc = fbd_subject_parse(subj[i], &t->subjects[i], why, sizeof why)) == FB_EINVAL)
      fb_errf(err, errlen, "%s.subjects[%d] '%s': %s", where, i, subj[i], why);
  }
  for (int i = 0; subj && subj[i]; i++) free(subj[i]);
  free(subj);
  if (!rc) rc = limits_from_json(t, json_object_get(o, "limits"), where, err, errlen);
  if (!rc && !t->nhashes && !t->nsubjects) {
    fb_errf(err, errlen, "%s: no token_sha256 and no subjects: nobody could be this tenant", where);
    rc = FB_EINVAL;
  }
  return rc;
}

static void tenants_free(fbd_tenant *v, int n) {
  for (int i = 0; i < n; i++) tenant_clear(&v[i]);
  free(v);
}

/* The whole file into a fresh array (nothing shared with the running set). */
static int load_file(const char *path, fbd_tenant **out, int *nout, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, 0, &je);
  if (!root) {
    fb_errf(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    return FB_EINVAL;
  }
  int rc = 0;
  json_t *arr = json_is_object(root) ? json_object_get(root, "tenants") : NULL;
  const char *key;
  json_t *x;
  if (json_is_object(root)) json_object_foreach(root, key, x) if (strcmp(key, "tenants")) {
      fb_errf(err, errlen, "%s: unknown key '%s' (expected \"tenants\")", path, key);
      rc = FB_EINVAL;
      break;
    }
  if (!rc && !json_is_array(arr)) {
    fb_errf(err, errlen, "%s: expected {\"tenants\": [...]}", path);
    rc = FB_EINVAL;
  }
  size_t n = rc ? 0 : json_array_size(arr);
  fbd_tenant *v = calloc(n + 1, sizeof *v);
  if (!v) rc = FB_ENOMEM;
  char why[FBD_ERRLEN];
  for (size_t i = 0; !rc && i < n; i++) {
    if ((rc = tenant_from_json(&v[i], json_array_get(arr, i), i, why, sizeof why))) {
      fb_errf(err, errlen, "%s: %s", path, why);
      n = i + 1;
    }
  }
  /* names unique; a token or subject names one tenant only */
  for (size_t i = 0; !rc && i < n; i++)
    for (size_t j = 0; !rc && j < i; j++) {
      if (!strcmp(v[i].name, v[j].name)) {
        fb_errf(err, errlen, "%s: tenant '%s' appears twice", path, v[i].name);
        rc = FB_EINVAL;
      }
      for (int a = 0; !rc && a < v[i].nhashes; a++)
        for (int b = 0; !rc && b < v[j].nhashes; b++)
          if (!memcmp(v[i].hashes[a], v[j].hashes[b], 32)) {
            fb_errf(err, errlen, "%s: tenants '%s' and '%s' share a token hash", path, v[j].name,
                    v[i].name);
            rc = FB_EINVAL;
          }
      for (int a = 0; !rc && a < v[i].nsubjects; a++)
        for (int b = 0; !rc && b < v[j].nsubjects; b++)
          if (fbd_subject_equal(&v[i].subjects[a], &v[j].subjects[b])) {
            const char *x = v[j].subjects[b].text, *y = v[i].subjects[a].text;
            fb_errf(err, errlen, "%s: tenants '%s' and '%s' share the subject '%s'%s%s%s", path,
                    v[j].name, v[i].name, x, strcmp(x, y) ? " (written '" : "",
                    strcmp(x, y) ? y : "", strcmp(x, y) ? "' the second time)" : "");
            rc = FB_EINVAL;
          }
    }
  json_decref(root);
  if (rc) {
    if (v) tenants_free(v, (int)n);
    return rc;
  }
  *out = v;
  *nout = (int)n;
  return 0;
}

static fbd_tenant *find_by_name(fbd_auth *a, const char *name) {
  for (int i = 0; i < a->n; i++)
    if (!strcmp(a->t[i]->name, name)) return a->t[i];
  return NULL;
}

/* With --worker-uid-base, every name ever loaded needs a uid of its own
 * (worker_slot: a->n + 1 for a new name, and 0 stays the anonymous one):
 * a set whose new names would run past worker_uid_count is refused whole,
 * before anything changes, rather than have two tenants share a uid. */
static int slots_fit(fbd_auth *a, const fbd_config *cfg, fbd_tenant *v, int n, char *err,
                     size_t errlen) {
  if (!cfg->worker_uid_base) return 0;
  long need = a->n;
  for (int i = 0; i < n; i++) need += find_by_name(a, v[i].name) == NULL;
  if (need + 1 <= (long)cfg->worker_uid_count) return 0;
  fb_errf(err, errlen,
          "worker_uid_count %d is too small: %ld tenants (every name loaded since the start, "
          "removed ones included) need %ld uids from worker_uid_base %lu, one each and one for "
          "sessions without a tenant; no two tenants share a uid",
          cfg->worker_uid_count, need, need + 1, (unsigned long)cfg->worker_uid_base);
  return FB_EINVAL;
}

/* Install a loaded set (under a->mu): update tenants by name, add new ones,
 * mark the missing ones removed (their sessions live on; nobody can
 * authenticate as them any more). slots_fit was checked. */
static int install(fbd_auth *a, fbd_tenant *v, int n) {
  for (int i = 0; i < a->n; i++) a->t[i]->removed = 1;
  for (int i = 0; i < n; i++) {
    fbd_tenant *t = find_by_name(a, v[i].name);
    if (!t) {
      if (a->n == a->cap) {
        int nc = a->cap ? 2 * a->cap : 16;
        fbd_tenant **nt = realloc(a->t, sizeof *nt * (size_t)nc);
        if (!nt) return FB_ENOMEM;
        a->t = nt;
        a->cap = nc;
      }
      if (!(t = calloc(1, sizeof *t))) return FB_ENOMEM;
      snprintf(t->name, sizeof t->name, "%s", v[i].name);
      a->t[a->n++] = t;
      t->worker_slot = a->n; /* never reused: a->n only grows */
    }
    tenant_clear(t);
    t->removed = 0;
    t->admin = v[i].admin;
    t->max_sessions = v[i].max_sessions;
    t->memory_bytes = v[i].memory_bytes;
    atomic_store(&t->time_share, atomic_load(&v[i].time_share));
    atomic_store(&t->max_compiles, atomic_load(&v[i].max_compiles));
    t->hashes = v[i].hashes;
    t->nhashes = v[i].nhashes;
    t->subjects = v[i].subjects;
    t->nsubjects = v[i].nsubjects;
    v[i].hashes = NULL;
    v[i].subjects = NULL;
    v[i].nhashes = v[i].nsubjects = 0;
  }
  for (int i = 0; i < a->n; i++)
    if (a->t[i]->removed) tenant_clear(a->t[i]);
  return 0;
}

int fbd_auth_init(fbd_server *srv, char *err, size_t errlen) {
  fbd_auth *a = calloc(1, sizeof *a);
  if (!a) return FB_ENOMEM;
  pthread_mutex_init(&a->mu, NULL);
  pthread_mutex_init(&a->admit, NULL);
  pthread_mutex_init(&a->logmu, NULL);
  atomic_init(&a->failures, 0);
  srv->auth = a;
  const char *path = srv->cfg->tenants;
  if (!path || !*path) return 0;
  fbd_tenant *v = NULL;
  int n = 0, rc = load_file(path, &v, &n, err, errlen);
  if (rc) return rc;
  rc = slots_fit(a, srv->cfg, v, n, err, errlen);
  if (!rc) rc = install(a, v, n);
  tenants_free(v, n);
  a->enabled = 1;
  if (!rc)
    fbd_logf(srv->log, FBD_LOG_INFO, "tenants: %d from %s; every call must authenticate", n, path);
  return rc;
}

void fbd_auth_free(fbd_server *srv) {
  fbd_auth *a = srv->auth;
  if (!a) return;
  for (int i = 0; i < a->n; i++) {
    tenant_clear(a->t[i]);
    free(a->t[i]);
  }
  free(a->t);
  pthread_mutex_destroy(&a->mu);
  pthread_mutex_destroy(&a->admit);
  pthread_mutex_destroy(&a->logmu);
  free(a);
  srv->auth = NULL;
}

void fbd_auth_reload(fbd_server *srv) {
  fbd_auth *a = srv->auth;
  const char *path = srv->cfg->tenants;
  if (!a || !a->enabled || !path) return;
  char err[FBD_ERRLEN] = "";
  fbd_tenant *v = NULL;
  int n = 0, rc = load_file(path, &v, &n, err, sizeof err);
  if (rc) {
    fbd_logf(srv->log, FBD_LOG_ERROR,
             "SIGHUP: tenants file not reloaded, keeping the running "
             "tenants: %s",
             err);
    return;
  }
  pthread_mutex_lock(&a->mu);
  rc = slots_fit(a, srv->cfg, v, n, err, sizeof err);
  if (!rc) rc = install(a, v, n);
  pthread_mutex_unlock(&a->mu);
  tenants_free(v, n);
  if (rc == FB_EINVAL)
    fbd_logf(srv->log, FBD_LOG_ERROR,
             "SIGHUP: tenants file not reloaded, keeping the running tenants: %s", err);
  else if (rc) fbd_logf(srv->log, FBD_LOG_ERROR, "SIGHUP: tenants: out of memory");
  else fbd_logf(srv->log, FBD_LOG_INFO, "SIGHUP: reloaded %d tenants from %s", n, path);
}

/* ---------------------------------------------------------------- who calls */

static int sha256(const char *p, size_t n, uint8_t out[32]) {
  unsigned len = 0;
  return EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : FB_EINTERNAL;
}

/* The token of "authorization: Bearer TOKEN": 1 (with *tok and its length *n) when present
 * and well-formed, 0 when absent, -1 when malformed. */
static int bearer(const grpc_metadata_array *md, const char **tok, size_t *n) {
  for (size_t i = 0; md && i < md->count; i++) {
    const grpc_metadata *m = &md->metadata[i];
    if (grpc_slice_str_cmp(m->key, "authorization") != 0) continue;
    const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
    size_t len = GRPC_SLICE_LENGTH(m->value);
    if (len <= 7 || strncasecmp(v, "Bearer ", 7) != 0 || len - 7 > MAX_TOKEN) return -1;
    *tok = v + 7;
    *n = len - 7;
    return 1;
  }
  return 0;
}

/* Under a->mu: the tenant whose token hashes to h. Every hash is compared,
 * in constant time, whatever matches. */
static fbd_tenant *by_hash(fbd_auth *a, const uint8_t h[32]) {
  fbd_tenant *found = NULL;
  for (int i = 0; i < a->n; i++)
    for (int k = 0; k < a->t[i]->nhashes; k++)
      if (CRYPTO_memcmp(a->t[i]->hashes[k], h, 32) == 0) found = a->t[i];
  return found;
}

/* The subject of the call's verified client certificate, when the server
 * verifies them (--tls-client-ca: the gate's TLS handshake refused every
 * client without a certificate from that CA and kept the one it verified
 * with the connection, rpc.c took it from there), into *out: 1 when there
 * is one, 0 when there is none, -1 (and why) when it is one no configured
 * subject can be (subject.c: a NUL or non-text value, too many attributes). */
static int peer_subject(fbd_call *c, fbd_subject *out, char *why, size_t whylen) {
  const char *ca = c->srv->cfg->tls_client_ca;
  if (!ca || !*ca || !c->peer_cert) return 0;
  char e[FBD_ERRLEN] = "out of memory";
  if (!fbd_subject_from_pem(c->peer_cert, strlen(c->peer_cert), out, e, sizeof e)) return 1;
  fb_errf(why, whylen, "client certificate refused: %s", e);
  return -1;
}

/* Under a->mu: the tenant one of whose subjects is s. */
static fbd_tenant *by_subject(fbd_auth *a, const fbd_subject *s) {
  for (int i = 0; i < a->n; i++)
    for (int k = 0; k < a->t[i]->nsubjects; k++)
      if (fbd_subject_equal(&a->t[i]->subjects[k], s)) return a->t[i];
  return NULL;
}

#define LOG_PER_SECOND 20

/* May one more refusal be logged now? A client that hammers the server
 * with bad tokens must not flood the log: past LOG_PER_SECOND lines in a
 * second the rest are counted, and the count is logged with the next line
 * of a later second. */
static int log_allowed(fbd_auth *a, uint64_t *suppressed) {
  double now = fbd_now();
  pthread_mutex_lock(&a->logmu);
  *suppressed = 0;
  if (now - a->log_window >= 1.0) {
    *suppressed = a->suppressed;
    a->suppressed = 0;
    a->logged = 0;
    a->log_window = now;
  }
  int ok = a->logged < LOG_PER_SECOND;
  if (ok) a->logged++;
  else a->suppressed++;
  pthread_mutex_unlock(&a->logmu);
  return ok;
}

/* A refusal: counted and logged here, answered by the caller (rpc.c). */
static void refuse(fbd_call *c, const char *why, char *out, size_t outlen) {
  fbd_auth *a = c->srv->auth;
  atomic_fetch_add(&a->failures, 1);
  uint64_t skipped;
  if (log_allowed(a, &skipped)) {
    if (skipped)
      fbd_logf(c->srv->log, FBD_LOG_WARN,
               "auth: %llu more refusals not logged (over %d a "
               "second)",
               (unsigned long long)skipped, LOG_PER_SECOND);
    fbd_logf(c->srv->log, FBD_LOG_WARN, "auth: %s refused from %s: %s", c->m->path + 1,
             c->peer ? c->peer : "?", why);
  }
  snprintf(out, outlen, "%s", why);
}

int fbd_auth_call(fbd_call *c, const grpc_metadata_array *md, char *refused, size_t refusedlen) {
  fbd_auth *a = c->srv->auth;
  c->tenant = NULL;
  c->admin = 1;
  if (!a || !a->enabled) return 0;
  c->admin = 0;
  /* probes need no identity: a health check with none (or a bad one) goes
   * on as no tenant's, one with a known token or subject is its tenant's
   * (rpc.c counts its open calls by who made them) */
  int probe = !strcmp(c->m->path, HEALTH_PATH);
  const char *tok = NULL;
  size_t n = 0;
  int has = bearer(md, &tok, &n);
  if (has < 0) {
    if (probe) return 0;
    refuse(c, "malformed authorization metadata (expected 'Bearer TOKEN')", refused,
           refusedlen);
    return FB_EINVAL;
  }
  uint8_t h[32];
  if (has && sha256(tok, n, h)) {
    if (probe) return 0;
    refuse(c, "cannot hash the token", refused, refusedlen);
    return FB_EINTERNAL;
  }
  /* a certificate is parsed before the lock, and only without a token */
  fbd_subject subj = {0};
  char why[FBD_ERRLEN] = "";
  int cert = has ? 0 : peer_subject(c, &subj, why, sizeof why);
  pthread_mutex_lock(&a->mu);
  fbd_tenant *t = has ? by_hash(a, h) : cert > 0 ? by_subject(a, &subj) : NULL;
  if (t) c->admin = t->admin;
  pthread_mutex_unlock(&a->mu);
  if (!t && !probe) {
    if (cert > 0) /* what the operator would write in "subjects", escaped, at most ~300 bytes */
      fb_errf(why, sizeof why, "client certificate subject '%.300s%s' is no tenant's subject",
              subj.text, strlen(subj.text) > 300 ? "..." : "");
    else if (!cert)
      snprintf(why, sizeof why, "no credentials: send 'authorization: Bearer TOKEN' "
                                "metadata or a client certificate of a known subject");
  }
  fbd_subject_clear(&subj);
  if (!t && probe) return 0;
  if (!t) {
    refuse(c, has ? "unknown token" : why, refused, refusedlen);
    return FB_EINVAL;
  }
  c->tenant = t;
  if (!probe) atomic_fetch_add(&t->calls, 1); /* its counters count what it asks, as before */
  return 0;
}

/* ---------------------------------------------------------------- what it may do */

int fbd_auth_may_use(fbd_call *c, fbd_session *s) {
  fbd_tenant *owner = atomic_load(&s->owner);
  if (!c->srv->auth->enabled || owner == c->tenant) return 0;
  if (c->admin && !strcmp(c->m->path, STATS_PATH)) return 0; /* admins may look, not touch */
  atomic_fetch_add(&c->tenant->denied, 1);
  fbd_logf(c->srv->log, FBD_LOG_WARN,
           "auth: %s from %s (tenant '%s') on session %s of another "
           "tenant: denied",
           c->m->path + 1, c->peer ? c->peer : "?", c->tenant ? c->tenant->name : "?", s->tag);
  return FB_EINVAL;
}

void fbd_auth_count_stream(fbd_call *c, size_t launches, int sync) {
  if (!c->tenant) return;
  if (launches) atomic_fetch_add(&c->tenant->launches, launches);
  if (sync) atomic_fetch_add(&c->tenant->syncs, 1);
}

int fbd_auth_sees_all(fbd_server *srv, const fbd_tenant *t) {
  fbd_auth *a = srv->auth;
  if (!a || !a->enabled || !t) return 1; /* one anonymous tenant: nobody else to hide */
  pthread_mutex_lock(&a->mu);
  int admin = t->admin;
  pthread_mutex_unlock(&a->mu);
  return admin;
}

int fbd_auth_sees(const fbd_call *c, fbd_session *s) {
  return c->admin || atomic_load(&s->owner) == c->tenant;
}

void fbd_auth_scope_stats(const fbd_call *c, Fusebox__V1__ServerStats *r) {
  if (c->admin) return;
  /* only what its own sessions add up to */
  r->sessions_active = (uint32_t)r->n_sessions;
  r->memory_bytes = 0;
  for (size_t i = 0; i < r->n_sessions; i++) r->memory_bytes += r->sessions[i]->memory_bytes;
  r->sessions_created = r->sessions_closed = r->sessions_disconnected = 0;
  r->sessions_reaped = r->sessions_failed = 0;
  r->memory_peak_bytes = r->launches = r->syncs = 0;
  r->bad_requests = r->bytes_in = r->bytes_out = 0;
  r->calls_refused = r->tenant_calls_refused = 0; /* others' calls too */
  if (r->memory) { /* the budget, but not what other tenants make the server hold */
    uint64_t budget = r->memory->budget_bytes, limit = r->memory->code_cache_limit_bytes;
    fusebox__v1__memory_budget__init(r->memory);
    r->memory->budget_bytes = budget;
    r->memory->code_cache_limit_bytes = limit;
  }
}

/* Under srv->mu: the sessions of t in the table and the sum of their
 * memory limits. */
static void usage(fbd_server *srv, const fbd_tenant *t, int *n, uint64_t *mem) {
  *n = 0;
  *mem = 0;
  for (int i = 0; i < srv->cfg->max_sessions; i++) {
    fbd_session *s = srv->sessions[i];
    if (!s || atomic_load(&s->owner) != t) continue;
    (*n)++;
    *mem += s->ecfg.memory_limit;
  }
}

static int admit(fbd_call *c, const fb_layout *l, fb_session_config *ec, char *err, size_t errlen) {
  fbd_server *srv = c->srv;
  fbd_tenant *t = c->tenant;
  pthread_mutex_lock(&srv->auth->mu);
  int max = t->max_sessions;
  uint64_t budget = t->memory_bytes;
  pthread_mutex_unlock(&srv->auth->mu);
  int n;
  uint64_t used;
  pthread_mutex_lock(&srv->mu);
  usage(srv, t, &n, &used);
  pthread_mutex_unlock(&srv->mu);
  if (max && n >= max) {
    atomic_fetch_add(&t->refused_sessions, 1);
    fb_errf(err, errlen, "tenant '%s' is at its session limit (max_sessions %d)", t->name, max);
    return FB_EQUOTA;
  }
  if (!budget) return 0;
  uint64_t left = used < budget ? budget - used : 0;
  /* a source's layout is not known yet: its dense storage is checked
     against the session's memory limit when it is (session.c) */
  uint64_t need = l && l->root_bytes ? l->root_bytes : 1;
  /* a limit the client asked for must fit; the server's default is cut below */
  int asked = ec->memory_limit && ec->memory_limit != srv->cfg->session_memory_limit;
  if (asked && ec->memory_limit > need) need = ec->memory_limit;
  if (left < need) {
    atomic_fetch_add(&t->refused_memory, 1);
    fb_errf(err, errlen,
            "tenant '%s' is at its memory limit (memory_bytes %llu): its sessions "
            "hold %llu bytes of limits, this one needs %llu",
            t->name, (unsigned long long)budget, (unsigned long long)used,
            (unsigned long long)need);
    return FB_EQUOTA;
  }
  /* the server's default limit shrinks to what the tenant has left */
  if (!ec->memory_limit || ec->memory_limit > left) ec->memory_limit = left;
  return 0;
}

/* A tenant's code cache partition (thread isolation shares one engine):
 * the first 8 bytes of its name's SHA-256, so that it outlives a reload
 * and no two names share one by design; never 0, the anonymous one. */
static int partition_of(const fbd_tenant *t, uint64_t *out, char *err, size_t errlen) {
  uint8_t h[32];
  if (sha256(t->name, strlen(t->name), h)) {
    fb_errf(err, errlen, "cannot hash the name of tenant '%s' for its code cache", t->name);
    return FB_EINTERNAL;
  }
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | h[i];
  *out = v | 1;
  return 0;
}

int fbd_auth_admit_begin(fbd_call *c, const fb_layout *l, fb_session_config *ec, char *err,
                         size_t errlen) {
  fbd_server *srv = c->srv;
  if (!srv->auth->enabled || !c->tenant) return 0;
  /* one admission at a time, so that two creates cannot both take the last slot */
  pthread_mutex_lock(&srv->auth->admit);
  int rc = admit(c, l, ec, err, errlen);
  if (!rc) /* no code shared across tenants */
    rc = partition_of(c->tenant, &ec->cache_partition, err, errlen);
  if (!rc) fbd_codestore_name(srv->codestore, ec->cache_partition, c->tenant->name);
  return rc;
}

void fbd_auth_admit_end(fbd_call *c, int created) {
  fbd_server *srv = c->srv;
  if (!srv->auth->enabled || !c->tenant) return;
  if (created) atomic_fetch_add(&c->tenant->sessions_created, 1);
  pthread_mutex_unlock(&srv->auth->admit);
}
