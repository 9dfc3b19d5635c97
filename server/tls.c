/* The credentials of each listening address:
 *  - unix:PATH is always plain (the socket file's mode and group guard it);
 *  - host:port with --tls-cert/--tls-key is TLS; with --tls-client-ca too,
 *    every client must present a certificate signed by that CA (mTLS), and
 *    its subject may name a tenant (auth.c);
 *  - host:port without TLS is allowed on loopback; anywhere else only with
 *    --insecure, and then with a warning in the log.
 * TLS is not gRPC's: the HTTP/2 gate (h2gate.c) terminates it with the
 * OpenSSL SSL_CTX made here (TLS 1.2+, ALPN "h2", client certificates
 * verified against the client CA), so that its budgets see the plaintext
 * HTTP/2 of TLS clients too; gRPC gets the plaintext over a socket pair.
 * The certificate, key and client CA are checked at start (PEM, and a key
 * that belongs to the certificate) and re-read on SIGHUP: a new SSL_CTX is
 * made and handed to the gate for the next handshakes. */
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
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

/* The certificates served now (PEM text), re-read on SIGHUP (fbd_tls_reload). */
struct fbd_tls {
  char *cert, *key, *ca; /* ca NULL without mTLS */
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

/* ALPN: "h2" or no handshake (gRPC clients offer it; gRPC's own server
 * refused a client that did not). */
static int alpn_h2(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg) {
  (void)ssl, (void)arg;
  for (unsigned int i = 0; i < inlen && i + 1u + in[i] <= inlen; i += 1u + in[i])
    if (in[i] == 2 && !memcmp(in + i + 1, "h2", 2)) {
      *out = in + i + 1;
      *outlen = 2;
      return SSL_TLSEXT_ERR_OK;
    }
  return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* The certificates of PEM text: into the context as its chain (chain: the
 * first is the server's, the rest its chain) or as the CAs that client
 * certificates must come from. The number read. */
static int add_certs(SSL_CTX *ctx, const char *pem, int chain) {
  BIO *b = BIO_new_mem_buf(pem, -1);
  int n = 0;
  X509 *x;
  while (b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
    int ok = chain ? (n == 0 ? SSL_CTX_use_certificate(ctx, x) : SSL_CTX_add1_chain_cert(ctx, x))
                   : X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), x) &&
                         SSL_CTX_add_client_CA(ctx, x);
    X509_free(x);
    if (!ok) break;
    n++;
  }
  BIO_free(b);
  ERR_clear_error(); /* the end of the text reads as an error */
  return n;
}

/* The gate's SSL_CTX for cert, key and ca (NULL: no client certificates). */
static SSL_CTX *make_ctx(const char *cert, const char *key, const char *ca, char *err,
                         size_t errlen) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  const char *bad = !ctx ? "out of memory" : NULL;
  if (!bad) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* TLS 1.2: the AEAD suites gRPC offers (RFC 7540 9.2.2 forbids the rest) */
    SSL_CTX_set_cipher_list(ctx, "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
                                 "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:"
                                 "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305");
    /* no resumption: each connection is verified against the CA of now */
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"fuseboxd", 8);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_h2, NULL);
    if (add_certs(ctx, cert, 1) < 1) bad = "--tls-cert: no certificate can be read from it";
  }
  if (!bad) {
    BIO *kb = BIO_new_mem_buf(key, -1);
    EVP_PKEY *pk = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
    if (!pk) bad = "--tls-key: no private key can be read from it";
    else if (SSL_CTX_use_PrivateKey(ctx, pk) != 1 || SSL_CTX_check_private_key(ctx) != 1)
      bad = "--tls-key does not belong to the --tls-cert certificate";
    EVP_PKEY_free(pk);
    BIO_free(kb);
  }
  if (!bad && ca) {
    if (add_certs(ctx, ca, 0) < 1) bad = "--tls-client-ca: no certificate can be read from it";
    else SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
  }
  ERR_clear_error();
  if (bad) {
    fb_errf(err, errlen, "%s", bad);
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
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
  /* TLS: the gate's (fbd_tls_gate); gRPC gets plaintext from it */
  return tls_state(srv, err, errlen) ? grpc_insecure_server_credentials_create() : NULL;
}

int fbd_tls_gate(fbd_server *srv, char *err, size_t errlen) {
  struct fbd_tls *t = srv->tls;
  if (!t) {
    fb_errf(err, errlen, "TLS needs both --tls-cert and --tls-key");
    return FB_EINVAL;
  }
  SSL_CTX *ctx = make_ctx(t->cert, t->key, t->ca, err, errlen);
  if (!ctx) return FB_EINVAL;
  fbd_gate_set_tls(srv, ctx);
  return 0;
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
  SSL_CTX *ctx = make_ctx(cert, key, ca, err, sizeof err);
  if (!ctx) {
    fbd_logf(srv->log, FBD_LOG_ERROR,
             "SIGHUP: TLS certificate not reloaded, keeping the running one: %s", err);
    free(cert);
    free_key(key);
    free(ca);
    return;
  }
  fbd_gate_set_tls(srv, ctx); /* the next handshakes; open connections keep theirs */
  char *oc = t->cert, *ok = t->key, *oa = t->ca;
  t->cert = cert;
  t->key = key;
  t->ca = ca;
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
  free(t);
  srv->tls = NULL;
}
