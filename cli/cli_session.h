/* JSON session files (docs/sessions.md): loading with strict key checking and
 * parameter substitution, and running setup / step / checks against an
 * engine session. `fusebox run` runs one mode; `fusebox bench` (later) runs
 * several modes side by side through the same functions. */
#ifndef FB_CLI_SESSION_H
#define FB_CLI_SESSION_H

#include <jansson.h>
#include <stdio.h>

#include "fusebox/engine.h"
#include "fusebox/lang.h"

typedef struct fb_sess_file {
  char *path;       /* the JSON file */
  char *dir;        /* its folder: relative paths start here */
  char *name;
  json_t *root;     /* after ${param} substitution */
  char *program_path; /* NULL for inline source */
  char *source;     /* program text after substitution */
  fb_program *prog;
} fb_sess_file;

/* Load, substitute params (overrides, may be NULL, replace the file's
 * params: --param NAME=VALUE), check keys, parse the program. On failure
 * returns a negative code and writes a message (with the JSON path, or the
 * rendered .fbk diagnostics) to err (malloc'd, caller frees). */
int fb_sess_load(const char *path, json_t *overrides, fb_sess_file *out, char **err);
/* Parse NAME=VALUE into params (VALUE as a JSON number when it reads as
 * one); -1 with a message on stderr when malformed. */
int fb_cli_add_param(json_t *params, const char *arg);
/* Replace every ${NAME} in text by params[NAME] (malloc'd); NULL with err
 * set (naming `where`) when a name is not a parameter. */
char *fb_sess_subst(const char *text, json_t *params, const char *where, char **err);
void fb_sess_free(fb_sess_file *f);

/* Passes a mode turns off (fusebox bench's async-no-PASS modes). */
enum {
  FB_SESS_NO_LISTGEN = 1,
  FB_SESS_NO_DEMOTE = 2,
  FB_SESS_NO_FUSION = 4,
  FB_SESS_NO_DSE = 8
};

typedef struct fb_sess_opts {
  const char *mode;  /* overrides session.mode when not NULL */
  unsigned passes_off; /* FB_SESS_NO_* bits, on top of session.passes */
  int verbose;       /* print each launch's return value */
  const char *server; /* run on this fuseboxd ("host:port", "unix:PATH") */
  int private_server; /* run on a private fuseboxd started for this run */
  int progress;      /* a progress line on stderr (a terminal) during long lists */
  const char *outdir; /* relative output files ("to") go here; NULL: beside the JSON file */
  int skip_saves;    /* ignore "save" actions (fusebox bench times the step) */
  FILE *out;         /* where check outcomes go */
  int cpu_threads;   /* in-process engine: the CPU device's threads (0: one per core) */
  /* checkpoints (in-process sessions; docs/checkpoint.md "The CLI") */
  uint64_t ckpt_every;  /* a sealed checkpoint every this many launches (0: none) */
  const char *ckpt_dir; /* ... into this folder, the last two kept */
  const char *ckpt_key; /* the key file; NULL: $XDG_CONFIG_HOME/fusebox/checkpoint.key */
  const char *resume;   /* start from this sealed checkpoint (overrides session.resume) */
} fb_sess_opts;

/* A running session: the engine objects and the kernel cache. */
typedef struct fb_sess_run fb_sess_run;

int fb_sess_start(fb_sess_file *f, const fb_sess_opts *o, fb_sess_run **out, char **err);
void fb_sess_stop(fb_sess_run *r);
/* Run the actions of a list ("setup" or "step"). */
int fb_sess_actions(fb_sess_run *r, const char *list, char **err);
/* Evaluate "checks"; returns the number of failed checks (>= 0) or a
 * negative code with err set. Outcomes are printed to o->out. */
int fb_sess_checks(fb_sess_run *r, char **err);
/* The in-process session (NULL when the session runs on a server). */
fb_session *fb_sess_session(fb_sess_run *r);
/* The backend the run's session is on ("cpu", "cuda"; "?" if unknown). */
void fb_sess_backend(fb_sess_run *r, char *buf, size_t n);
/* The in-process engine's device in words ("CPU (2 threads)"); "" on a server. */
void fb_sess_device(fb_sess_run *r, char *buf, size_t n);
/* Wait for everything launched; a launch that failed (now or in the
 * background, in this process or on a server) fails it, the message naming
 * the kernel, the launch number (from 1) and the JSON path of the action
 * that launched it. Counters so far (either kind of session). */
int fb_sess_sync(fb_sess_run *r, char **err);
void fb_sess_counters(fb_sess_run *r, fb_counters *c);
/* A field's contents as float64, components innermost (malloc'd). */
int fb_sess_read_f64(fb_sess_run *r, const char *field, double **vals, int64_t *n, char **err);

#endif
