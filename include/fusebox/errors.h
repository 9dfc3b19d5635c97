/* The error codes of Fusebox, each described once here: the FB_E* enum
 * (fusebox/common.h), fb_strerror's message (ir/types.c) and the gRPC
 * status the server answers with (proto/convert.c, fbp_status_of_code) are
 * generated from this table (include this file with FB_ERR defined).
 *
 *   FB_ERR(NAME, value, "message", GRPC_STATUS)
 *
 * NAME gives FB_NAME; GRPC_STATUS names a gRPC status code (the FBP_GRPC_*
 * of proto/convert.h). The way back, status to code, is many to one and
 * is written out in fbp_code_of_status. */
#ifndef FB_ERR
#error "define FB_ERR before including fusebox/errors.h"
#endif

FB_ERR(OK, 0, "success", OK)
FB_ERR(EINVAL, -1, "invalid argument", INVALID_ARGUMENT)   /* bad argument or malformed input */
FB_ERR(ENOMEM, -2, "out of memory", RESOURCE_EXHAUSTED) /* host allocation failed */
FB_ERR(EVERIFY, -3, "IR failed verification", INVALID_ARGUMENT)   /* IR refused by the verifier */
FB_ERR(EPARSE, -4, "parse error", INVALID_ARGUMENT)   /* text (IR or .fbk) does not parse */
FB_ERR(ENOENT, -5, "no such object", NOT_FOUND)          /* no such kernel, field or session */
FB_ERR(ECOMPILE, -6, "compilation failed", INTERNAL)           /* code generation failed */
FB_ERR(EDEVICE, -7, "device error", INTERNAL)           /* the device failed or is absent */
FB_ERR(EQUOTA, -8, "over quota", RESOURCE_EXHAUSTED) /* over a memory or session quota */
FB_ERR(EBOUNDS, -9, "index out of bounds",
       OUT_OF_RANGE)       /* a kernel indexed a field out of its bounds */
FB_ERR(ETYPE, -10, "type mismatch", INVALID_ARGUMENT)   /* wrong argument type or count */
FB_ERR(EUNSUPPORTED, -11, "not supported",
       UNIMPLEMENTED)      /* valid request this build or backend cannot do */
FB_ERR(EIO, -12, "I/O error", UNAVAILABLE)        /* file or network I/O failed */
FB_ERR(EINTERNAL, -13, "internal error", INTERNAL)           /* a bug in Fusebox: please report */
FB_ERR(ECANCELLED, -14, "cancelled",
       CANCELLED)          /* the work was cancelled (Cancel, a vanished client) */
FB_ERR(ETIMEOUT, -15, "time limit exceeded",
       DEADLINE_EXCEEDED)  /* the work ran past its time limit (kernel_timeout_s) */
