/* err: status codes with a message, returned up the stack instead of
 * printing and exiting in library code. The codes are the process exit codes
 * the CLI uses, so a status travels unchanged from where it arose to exit(). */
#ifndef ZT_ERR_H
#define ZT_ERR_H

enum {
  ZT_OK = 0,
  ZT_ERUNTIME = 1, /* the input was fine, something failed while running */
  ZT_EINPUT = 2    /* bad input: script, data, checkpoint, arguments */
};

typedef struct zt_err {
  int code;
  char msg[2048];
} zt_err;

/* Sets code and message (printf format) and returns code, so callers can
 * write `return zt_err_set(e, ZT_EINPUT, "...")`. */
int zt_err_set(zt_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
