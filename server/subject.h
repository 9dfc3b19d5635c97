/* Certificate subjects as structured names (subject.c), for the tenants
 * file's "subjects" (auth.c): a configured subject is parsed once, when the
 * file is loaded, and a client's verified certificate is parsed from its PEM
 * with OpenSSL; the two are compared attribute by attribute, never as text.
 *
 * The text form (RFC 4514-like, the order `openssl x509 -nameopt RFC2253`
 * prints): RDNs separated by ',', the leftmost being the certificate's last;
 * the attributes of a multi-valued RDN separated by '+'; each attribute
 * TYPE=VALUE, TYPE an OpenSSL short or long name (CN, O, OU, commonName) or
 * a dotted OID (2.5.4.3). In a VALUE, '\' escapes one of , + = \ " ; < > #
 * or a space, and \XX (two hex digits) is one byte; those characters, a
 * leading '#', a leading or trailing space and control bytes must be
 * escaped. A value is non-empty UTF-8 without NUL. Included by auth.h. */
#ifndef FUSEBOX_SERVER_SUBJECT_H
#define FUSEBOX_SERVER_SUBJECT_H

#include <stddef.h>

#define FBD_SUBJECT_MAX_AVAS 64    /* attributes in one subject, either side */
#define FBD_SUBJECT_MAX_TEXT 4096  /* a configured subject's length */
#define FBD_SUBJECT_MAX_OID 64     /* bytes of an attribute type's OID */

typedef struct fbd_ava {
  int rdn;                                /* its RDN: 0 is the leftmost in the text */
  unsigned char oid[FBD_SUBJECT_MAX_OID]; /* the type's OID (DER contents) */
  size_t oidlen;
  char type[48];   /* for messages: CN, O, or the dotted OID */
  char *value;     /* UTF-8, no NUL inside; NUL-terminated for messages */
  size_t len;
} fbd_ava;

typedef struct fbd_subject {
  int n, nrdn; /* attributes, RDNs */
  fbd_ava *ava;  /* n of them, by rdn ascending */
  char *text;    /* as configured, or as formatted from a certificate */
} fbd_subject;

/* A configured subject; on error *out is clear and err says what and where. */
int fbd_subject_parse(const char *text, fbd_subject *out, char *err, size_t errlen);
/* The subject of the first certificate in a PEM buffer. A certificate no
 * configured subject could equal (a value with a NUL byte, one that is not
 * text or not valid UTF-8, too many attributes) is an error naming it. */
int fbd_subject_from_pem(const char *pem, size_t len, fbd_subject *out, char *err,
                         size_t errlen);
/* Equal: the same RDNs in the same order, each with the same attributes
 * (type and value bytes; the attributes of one RDN in any order). */
int fbd_subject_equal(const fbd_subject *a, const fbd_subject *b);
void fbd_subject_clear(fbd_subject *s);

#endif
