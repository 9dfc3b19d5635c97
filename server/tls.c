/* The credentials of each listening address, on the gRPC C core's SSL
 * credentials:
 *  - unix:PATH is always plain (the socket file's mode and group guard it);
 *  - host:port with --tls-cert/--tls-key is TLS; with --tls-client-ca too,
 *    every client must present a certificate signed by that CA (mTLS), and
 *    its subject may name a tenant (auth.c);
 *  - host:port without TLS is allowed on loopback; anywhere else only with
 *    --insecure, and then with a warning in the log. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>

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
            !buf ? "out of memory" : bad ? "read error" : "file too large");
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

grpc_server_credentials *fbd_tls_server_creds(const fbd_config *cfg, fbd_log *log,
                                              const char *addr, char *err, size_t errlen) {
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
      fb_errf(err, errlen, "refusing plain TCP on '%s' (not loopback): give --tls-cert and "
              "--tls-key, or --insecure to accept unencrypted, unauthenticated traffic", addr);
      return NULL;
    }
    fbd_logf(log, FBD_LOG_WARN, "listening on %s WITHOUT TLS (--insecure): tokens and data travel "
             "in the clear", addr);
    return grpc_insecure_server_credentials_create();
  }
  char *cert = NULL, *key = NULL, *ca = NULL;
  grpc_server_credentials *cr = NULL;
  if (pem(cfg->tls_cert, "--tls-cert", "-----BEGIN CERTIFICATE", &cert, err, errlen) ||
      pem(cfg->tls_key, "--tls-key", "-----BEGIN ", &key, err, errlen) ||
      (set(cfg->tls_client_ca) &&
       pem(cfg->tls_client_ca, "--tls-client-ca", "-----BEGIN CERTIFICATE", &ca, err, errlen)))
    goto out;
  grpc_ssl_pem_key_cert_pair pair = {key, cert};
  cr = grpc_ssl_server_credentials_create_ex(
      ca, &pair, 1,
      ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
         : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
      NULL);
  if (!cr) fb_errf(err, errlen, "gRPC refused the TLS certificate or key");
out:
  free(cert);
  if (key) OPENSSL_cleanse(key, strlen(key)); /* no private key left in freed memory */
  free(key);
  free(ca);
  return cr;
}
