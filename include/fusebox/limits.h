/* Fusebox's limits that more than one folder (or the Python client) must
 * agree on, each written once, with the reason for its value. A limit that
 * one file alone uses stays in that file; settings a deployment may change
 * (deploy/README.md) have their defaults here when another folder needs
 * them too. The Python client's copies (python/fusebox) are checked
 * against this file by tests/test_lists.py. */
#ifndef FUSEBOX_LIMITS_H
#define FUSEBOX_LIMITS_H

/* ------------------------------------------------------------ kernels */

/* Deepest block nesting of a kernel's IR: the verifier refuses deeper
 * (ir/verify.c), and every walker that recurses over blocks (the
 * interpreter, hashing, printing, the optimizer's passes, code generation)
 * stops there, so that tenant IR cannot overflow a thread's stack: 256
 * frames of a few hundred bytes each is well inside the smallest stack a
 * worker runs on, and far deeper than any front end nests (the .fbk
 * parser stops at 100, lang/lang_parse.c). */
#define FB_MAX_BLOCK_DEPTH 256

/* Statements of one kernel, three caps from tight to loose:
 * - FB_MAX_KERNEL_STATEMENTS_DEFAULT, a session's compile budget
 *   (max_kernel_statements): it bounds LLVM's memory and time for one
 *   kernel (about 38 MiB at this value, docs/security.md); kernels over it
 *   are refused before anything compiles them;
 * - FB_LANG_MAX_STATEMENTS, what the .fbk front end builds for one kernel
 *   before it gives up (inlining and differentiation multiply statements),
 *   above the budget so that a session configured higher can use it;
 * - FB_MAX_STATEMENTS_ANY, what any kernel may have at all: the protocol
 *   refuses a kernel message with more statements or blocks (it bounds the
 *   arrays a decoded kernel allocates), and differentiation with no budget
 *   stops there. */
#define FB_MAX_KERNEL_STATEMENTS_DEFAULT 20000
#define FB_LANG_MAX_STATEMENTS 100000
#define FB_MAX_STATEMENTS_ANY (1 << 22)

/* Launches one fused task may stand for (the optimizer's max_fused_tasks):
 * beyond it a fused task's parameter list and compile time grow with no
 * gain. fuseboxd refuses a max_fuse_per_task above it by name. */
#define FB_MAX_FUSED_TASKS 256

/* ------------------------------------------------------------ messages */

/* The largest message a client sends or accepts unless told otherwise:
 * gRPC's own default receive limit (4 MiB), so that a client talks to any
 * server, and a server to any client, with no setting on either side. */
#define FB_CLIENT_MAX_MESSAGE_BYTES (4u << 20)
/* fuseboxd's default max_message_bytes (largest request accepted): above
 * FB_CLIENT_MAX_MESSAGE_BYTES, so that a client's largest message always
 * fits. */
#define FB_SERVER_MAX_MESSAGE_BYTES_DEFAULT (16u << 20)
/* Bytes of field data per transfer message when neither side asks for
 * another size: a quarter of the message limit, large enough that the
 * per-message cost is lost in the copy, small enough that a transfer
 * shows progress and holds little memory per message. */
#define FB_CHUNK_BYTES_DEFAULT (1u << 20)
/* The chunk sizes the server grants: at least a page; at most the client
 * message limit less 4096 bytes for the message's other fields. */
#define FB_CHUNK_BYTES_MIN 4096u
#define FB_CHUNK_BYTES_MAX (FB_CLIENT_MAX_MESSAGE_BYTES - 4096u)

#endif
