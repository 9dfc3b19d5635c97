/* The credentials of each listening address, on the gRPC C core's SSL
 * credentials:
 *  - unix:PATH is always plain (the socket file's mode and group guard it);
 *  - host:port with --tls-cert/--tls-key is TLS; with --tls-client-ca too,
 *    every client must present a certificate signed by that CA (mTLS), and
 *    its subject may name a tenant (auth.c);
 *  - host:port without TLS is allowed on loopback; anywhere else only with
 *    --insecure, and then with a warning in the log.
 * The certificate, key and client CA are checked at start (PEM, and a key
 * that belongs to the certificate) and re-read on SIGHUP: gRPC's
 * certificate-config fetcher hands the new ones to the next handshakes. */
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

#define MAX_PEM ((size_t)1 << 20)

char *fbd_read_text(const char *path, size_t max, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fb_errf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    return NULL;
  }
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad || n > max) {
    free(buf);
    fb_errf(err, errlen, "cannot read '%s': %s", path,
            !buf  ? "out of memory"
            : bad ? "read error"
                  : "file too large");
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

static int set(const char *s) { return s && *s; }

/* host:port on a loopback address ("127.x.y.z", "localhost", "[::1]"). */
static int loopback(const char *addr) {
  if (!strncmp(addr, "ipv4:", 5)) addr += 5;
  else if (!strncmp(addr, "ipv6:", 5)) addr += 5;
  return !strncmp(addr, "127.", 4) || !strncmp(addr, "localhost:", 10) ||
         !strncmp(addr, "[::1]:", 6);
}

static int pem(const char *path, const char *what, const char *marker, char **out, char *err,
               size_t errlen) {
  char why[512];
  if (!(*out = fbd_read_text(path, MAX_PEM, why, sizeof why))) {
    fb_errf(err, errlen, "%s: %s", what, why);
    return FB_EINVAL;
  }
  if (!strstr(*out, marker)) {
    fb_errf(err, errlen, "%s: '%s' is not PEM (no '%s')", what, path, marker);
    free(*out);
    *out = NULL;
    return FB_EINVAL;
  }
  return 0;
}

/* The certificates served now, re-read on SIGHUP (fbd_tls_reload). gRPC
 * asks each listening address's fetcher at every new handshake; a fetcher
 * that has not yet handed out the current generation hands it out, so new
 * connections get the new certificate and open ones keep theirs. */
struct fbd_tls_addr {
  struct fbd_tls *tls;
  uint64_t seen;            /* the generation this address serves */
};

struct fbd_tls {
  pthread_mutex_t mu;
  char *cert, *key, *ca;    /* PEM text; ca NULL without mTLS */
  uint64_t gen;
  struct fbd_tls_addr addrs[FBD_MAX_LISTEN];
  int naddrs;
};

static void free_key(char *key) {
  if (key) OPENSSL_cleanse(key, strlen(key)); /* no private key left in freed memory */
  free(key);
}

/* Does the private key belong to the first certificate of the chain? */
static int key_matches(const char *cert, const char *key, char *err, size_t errlen) {
  BIO *cb = BIO_new_mem_buf(cert, -1), *kb = BIO_new_mem_buf(key, -1);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *pk = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  int ok = x && pk && X509_check_private_key(x, pk) == 1;
  if (!ok)
    fb_errf(err, errlen, "%s",
            !x    ? "--tls-cert: no certificate can be read from it"
            : !pk ? "--tls-key: no private key can be read from it"
                  : "--tls-key does not belong to the --tls-cert certificate");
  X509_free(x);
  EVP_PKEY_free(pk);
  BIO_free(cb);
  BIO_free(kb);
  ERR_clear_error();
  return ok ? 0 : FB_EINVAL;
}

/* The three files of cfg, checked: PEM, and a key that fits the certificate. */
static int load(const fbd_config *cfg, char **cert, char **key, char **ca, char *err,
                size_t errlen) {
  *cert = *key = *ca = NULL;
  int rc = pem(cfg->tls_cert, "--tls-cert", "-----BEGIN CERTIFICATE", cert, err, errlen);
  if (!rc) rc = pem(cfg->tls_key, "--tls-key", "-----BEGIN ", key, err, errlen);
  if (!rc && set(cfg->tls_client_ca))
    rc = pem(cfg->tls_client_ca, "--tls-client-ca", "-----BEGIN CERTIFICATE", ca, err, errlen);
  if (!rc) rc = key_matches(*cert, *key, err, errlen);
  if (rc) {
    free(*cert);
    free_key(*key);
    free(*ca);
    *cert = *key = *ca = NULL;
  }
  return rc;
}

static grpc_ssl_certificate_config_reload_status fetch(void *user,
                                                       grpc_ssl_server_certificate_config **out) {
  struct fbd_tls_addr *a = user;
  struct fbd_tls *t = a->tls;
  grpc_ssl_certificate_config_reload_status st = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  pthread_mutex_lock(&t->mu);
  if (a->seen != t->gen) {
    grpc_ssl_pem_key_cert_pair pair = {t->key, t->cert};
    /* gRPC 1.51 asserts root certificates in a fetched config even when it
     * requests no client certificate; without --tls-client-ca it gets the
     * server's own chain, which is then never used (no CertificateRequest
     * is sent, so no client certificate is asked for or verified) */
    *out = grpc_ssl_server_certificate_config_create(t->ca ? t->ca : t->cert, &pair, 1);
    st = *out ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
    if (*out) a->seen = t->gen;
  }
  pthread_mutex_unlock(&t->mu);
  return st;
}

static struct fbd_tls *tls_state(fbd_server *srv, char *err, size_t errlen) {
  if (srv->tls) return srv->tls;
  struct fbd_tls *t = calloc(1, sizeof *t);
  if (!t) {
    fb_errf(err, errlen, "out of memory");
    return NULL;
  }
  if (load(srv->cfg, &t->cert, &t->key, &t->ca, err, errlen)) {
    free(t);
    return NULL;
  }
  pthread_mutex_init(&t->mu, NULL);
  t->gen = 1;
  srv->tls = t;
  return t;
}

grpc_server_credentials *fbd_tls_server_creds(fbd_server *srv, const char *addr, char *err,
                                              size_t errlen) {
  const fbd_config *cfg = srv->cfg;
  int tls = set(cfg->tls_cert) || set(cfg->tls_key);
  if (set(cfg->tls_cert) != set(cfg->tls_key)) {
    fb_errf(err, errlen, "TLS needs both --tls-cert and --tls-key");
    return NULL;
  }
  if (set(cfg->tls_client_ca) && !tls) {
    fb_errf(err, errlen, "--tls-client-ca needs --tls-cert and --tls-key (the server's own)");
    return NULL;
  }
  if (!strncmp(addr, "unix:", 5)) return grpc_insecure_server_credentials_create();
  if (!tls) {
    if (loopback(addr)) return grpc_insecure_server_credentials_create();
    if (!cfg->insecure) {
      fb_errf(err, errlen,
              "refusing plain TCP on '%s' (not loopback): give --tls-cert and "
              "--tls-key, or --insecure to accept unencrypted, unauthenticated traffic",
              addr);
      return NULL;
    }
    fbd_logf(srv->log, FBD_LOG_WARN,
             "listening on %s WITHOUT TLS (--insecure): tokens and data "
             "travel in the clear",
             addr);
    return grpc_insecure_server_credentials_create();
  }
  struct fbd_tls *t = tls_state(srv, err, errlen);
  if (!t) return NULL;
  if (t->naddrs == FBD_MAX_LISTEN) {
    fb_errf(err, errlen, "too many TLS addresses");
    return NULL;
  }
  struct fbd_tls_addr *a = &t->addrs[t->naddrs++];
  a->tls = t;
  grpc_ssl_server_credentials_options *o =
      grpc_ssl_server_credentials_create_options_using_config_fetcher(
          t->ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
          fetch, a);
  grpc_server_credentials *cr = o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
  if (!cr) fb_errf(err, errlen, "gRPC refused the TLS certificate or key");
  return cr;
}

void fbd_tls_reload(fbd_server *srv) {
  struct fbd_tls *t = srv->tls;
  if (!t) return;
  char err[FBD_ERRLEN] = "", *cert, *key, *ca;
  if (load(srv->cfg, &cert, &key, &ca, err, sizeof err)) {
    fbd_logf(srv->log, FBD_LOG_ERROR,
             "SIGHUP: TLS certificate not reloaded, keeping the running "
             "one: %s",
             err);
    return;
  }
  pthread_mutex_lock(&t->mu);
  char *oc = t->cert, *ok = t->key, *oa = t->ca;
  t->cert = cert;
  t->key = key;
  t->ca = ca;
  t->gen++;
  pthread_mutex_unlock(&t->mu);
  free(oc);
  free_key(ok);
  free(oa);
  fbd_logf(srv->log, FBD_LOG_INFO,
           "SIGHUP: TLS certificate reloaded from %s%s%s; new connections "
           "get it",
           srv->cfg->tls_cert, ca ? ", client CA from " : "", ca ? srv->cfg->tls_client_ca : "");
}

void fbd_tls_free(fbd_server *srv) {
  struct fbd_tls *t = srv->tls;
  if (!t) return;
  free(t->cert);
  free_key(t->key);
  free(t->ca);
  pthread_mutex_destroy(&t->mu);
  free(t);
  srv->tls = NULL;
}
