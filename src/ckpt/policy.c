/* policy: see policy.h. Only rank 0 touches the directory; the others learn
 * the outcome by broadcast. */
#include "src/ckpt/policy.h"
#include "src/ckpt/h5util.h"
#include "src/core/timer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_KEPT 4096

static int cmp_desc(const void *a, const void *b) {
  return -strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names of dir's checkpoints, newest first (the zero-padded step sorts). */
static int list(const char *dir, char **names, int max) {
  DIR *d = opendir(dir);
  int n = 0;
  if (!d) return 0;
  for (struct dirent *de; (de = readdir(d)) && n < max;) {
    size_t l = strlen(de->d_name);
    if (!strncmp(de->d_name, "step_", 5) && l > 8 && !strcmp(de->d_name + l - 3, ".h5"))
      names[n++] = strdup(de->d_name);
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_desc);
  return n;
}

/* Temporary files of saves that crashed: never renamed, never to be read. */
static void remove_stale(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  for (struct dirent *de; (de = readdir(d));)
    if (!strncmp(de->d_name, "step_", 5) && strstr(de->d_name, ".h5.tmp.")) {
      char path[4200];
      snprintf(path, sizeof path, "%s/%.255s", dir, de->d_name);
      unlink(path);
    }
  closedir(d);
}

static int write_latest(const char *dir, const char *name) {
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/latest.tmp", dir);
  snprintf(path, sizeof path, "%s/latest", dir);
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  int ok = fprintf(f, "%s\n", name) > 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  return ok && !rename(tmp, path) ? 0 : -1;
}

/* Rank 0, after a save into dir succeeded: point `latest` at it, drop the
 * oldest beyond keep and the leftovers of crashed saves. */
static int finish(const char *dir, const char *name, int keep, zt_err *e) {
  if (write_latest(dir, name))
    return zt_err_set(e, ZT_ERUNTIME, "cannot update %s/latest: %s", dir, strerror(errno));
  remove_stale(dir);
  char *names[MAX_KEPT];
  int k = list(dir, names, MAX_KEPT);
  for (int i = 0; i < k; i++) {
    if (i >= keep) {
      char old[4200];
      snprintf(old, sizeof old, "%s/%.255s", dir, names[i]);
      unlink(old);
    }
    free(names[i]);
  }
  return ZT_OK;
}

/* The asynchronous save in flight (one at a time): where it goes. */
static struct {
  char dir[4096], name[64];
  int keep, rank0;
  double t0;
} job;

static void finish_async(zt_ckpt_async *a) {
  if (!job.rank0) return;
  a->rc = finish(job.dir, job.name, job.keep, &a->err);
  /* the line a synchronous save gets from the CLI, when this one is done */
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", job.dir, job.name);
  struct stat st;
  double dt = zt_timer_now() - job.t0;
  if (!a->rc && !stat(path, &st)) {
    printf("checkpoint %s written in the background: %.1f MB in %.2f s, step %lld\n", path,
           st.st_size / 1e6, dt, (long long)a->step);
    fflush(stdout);
  }
}

int zt_ckpt_dir_make(const char *dir, zt_comm *world, int code, zt_err *e) {
  int rc = world->rank == 0 ? zt_fs_make_dirs("checkpoint.dir", dir, code, e) : ZT_OK;
  zt_comm_bcast(world, &rc, sizeof rc, ZT_U8, 0);
  if (rc) zt_comm_bcast(world, e->msg, sizeof e->msg, ZT_U8, 0);
  return rc ? (e->code = rc) : ZT_OK;
}

int zt_ckpt_dir_save(const char *dir, int keep, const zt_ckpt_state *s, zt_ckpt_async *async,
                     char *written, size_t n, zt_err *e) {
  zt_comm *world = &s->grid->world;
  int rc = async ? zt_ckpt_async_wait(async, e) : ZT_OK;
  if (rc) return rc;
  if ((rc = zt_ckpt_dir_make(dir, world, ZT_ERUNTIME, e))) return rc;
  char name[64], path[4200];
  snprintf(name, sizeof name, "step_%08lld.h5", (long long)*s->step);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (written) snprintf(written, n, "%s", path);
  if (async) {
    snprintf(job.dir, sizeof job.dir, "%s", dir);
    snprintf(job.name, sizeof job.name, "%s", name);
    job.keep = keep;
    job.rank0 = world->rank == 0;
    job.t0 = zt_timer_now();
    return zt_ckpt_async_start(async, path, s, finish_async, e);
  }
  rc = zt_ckpt_save(path, s, e);
  if (!rc && world->rank == 0) rc = finish(dir, name, keep, e);
  zt_comm_bcast(world, &rc, sizeof rc, ZT_U8, 0);
  if (rc) zt_comm_bcast(world, e->msg, sizeof e->msg, ZT_U8, 0);
  return e->code = rc;
}

/* The step in a checkpoint's name, step_<digits>.h5; -1 for any other name. */
static long long name_step(const char *name) {
  if (strncmp(name, "step_", 5)) return -1;
  size_t digits = strspn(name + 5, "0123456789");
  if (digits == 0 || digits > 18 || strcmp(name + 5 + digits, ".h5")) return -1;
  return strtoll(name + 5, NULL, 10);
}

/* Text from a file or the file system, made printable for a message. */
static void printable(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) *s = '?';
}

/* Whether the resolved path real lies directly in the folder real_dir. */
static int lies_in(const char *real, const char *real_dir) {
  const char *slash = strrchr(real, '/');
  size_t plen = !slash ? 0 : slash == real ? 1 : (size_t)(slash - real); /* "/x" lies in "/" */
  return slash && real_dir && strlen(real_dir) == plen && !strncmp(real, real_dir, plen);
}

/* Rank 0: why dir/name must not be loaded ("" when it may be): a name
 * that carries no step to check, or a path that resolves outside dir
 * (real_dir: dir resolved), such as a link to another run's file, whose
 * state would continue this run as if it were its own. */
static void refusal(const char *dir, const char *real_dir, const char *name, char *why,
                    size_t n) {
  why[0] = 0;
  if (name_step(name) < 0) {
    snprintf(why, n, "its name is not step_NNNNNNNN.h5, so the step it holds cannot be checked");
    return;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *real = realpath(path, NULL);
  if (!real) return; /* missing or unreadable: the load says which */
  if (!lies_in(real, real_dir)) {
    char target[4096] = "";
    struct stat st;
    if (!lstat(path, &st) && S_ISLNK(st.st_mode)) {
      ssize_t k = readlink(path, target, sizeof target - 1);
      target[k > 0 ? k : 0] = 0;
    }
    printable(target);
    printable(real);
    if (target[0])
      snprintf(why, n, "it is a symbolic link to %s (%s), outside %s (another run's file?); "
               "refused", target, real, dir);
    else
      snprintf(why, n, "it resolves to %s, outside %s (another run's file?); refused", real, dir);
  }
  free(real);
}

/* Rank 0: the name `latest` holds, when it is a bare file name that fits
 * a candidate; else "" and, when it holds something, a warning saying
 * what and where it points (returns 1: one candidate skipped). */
static int read_latest(const char *dir, const char *real_dir, char *first, size_t n) {
  char path[4200], line[4096];
  first[0] = 0;
  snprintf(path, sizeof path, "%s/latest", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t len = fread(line, 1, sizeof line - 1, f);
  fclose(f);
  const char *nl = memchr(line, '\n', len);
  if (nl) len = (size_t)(nl - line);
  line[len] = 0;
  if (!len) return 0;
  int text = 1; /* what finish() writes: one printable name, one newline */
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)line[i] <= 0x20 || (unsigned char)line[i] > 0x7e) text = 0, line[i] = '?';
  if (!text || len >= n) {
    fprintf(stderr, "ztrain: warning: --resume auto skips %s: it holds %.200s%s, not the name of a "
            "checkpoint; refused\n", path, line, len > 200 ? "..." : "");
    return 1;
  }
  if (!strchr(line, '/') && strcmp(line, ".") && strcmp(line, "..")) {
    memcpy(first, line, len + 1);
    return 0;
  }
  /* finish() writes a bare name: anything else points elsewhere */
  char where[4200];
  if (line[0] == '/')
    snprintf(where, sizeof where, "%s", line);
  else
    snprintf(where, sizeof where, "%s/%s", dir, line);
  char *real = realpath(where, NULL);
  int in = real && lies_in(real, real_dir);
  printable(line);
  if (real) printable(real);
  fprintf(stderr, "ztrain: warning: --resume auto skips %s: it names %s%s%s%s, %s %s; refused "
          "(latest holds the bare name of a checkpoint in its own directory)\n", path, line,
          real ? " (" : "", real ? real : "", real ? ")" : "",
          !real ? "a path that does not resolve, not a file of" : in ? "a path into" : "outside",
          dir);
  free(real);
  return 1;
}

static int cmp_step_desc(const void *a, const void *b) {
  long long x = name_step(a), y = name_step(b);
  return x < y ? 1 : x > y ? -1 : strcmp(b, a);
}

int zt_ckpt_dir_resume(const char *dir, const zt_ckpt_state *s, char *used, size_t n,
                       zt_err *e) {
  zt_comm *world = &s->grid->world;
  /* rank 0 builds the candidate list: `latest` first, then all, newest first */
  char cands[64][64];
  int count = 0, skipped = 0;
  char *real_dir = world->rank == 0 ? realpath(dir, NULL) : NULL;
  if (world->rank == 0) {
    char first[64];
    skipped = read_latest(dir, real_dir, first, sizeof first);
    if (*first) snprintf(cands[count++], 64, "%s", first);
    char *names[MAX_KEPT];
    int k = list(dir, names, MAX_KEPT);
    int from = count;
    for (int i = 0; i < k; i++) {
      if (count < 64 && strcmp(names[i], first) && strlen(names[i]) < 64)
        memcpy(cands[count++], names[i], strlen(names[i]) + 1);
      free(names[i]);
    }
    /* by the step's value: names past 8 digits do not sort as text */
    qsort(cands[from], (size_t)(count - from), sizeof cands[0], cmp_step_desc);
  }
  zt_comm_bcast(world, &count, sizeof count, ZT_U8, 0);
  zt_comm_bcast(world, &skipped, sizeof skipped, ZT_U8, 0);
  zt_comm_bcast(world, cands, sizeof cands, ZT_U8, 0);
  used[0] = 0;
  int64_t before = *s->step;
  for (int i = 0; i < count; i++) {
    char path[4200], why[8600] = "";
    snprintf(path, sizeof path, "%s/%.64s", dir, cands[i]);
    int refused = 0;
    if (world->rank == 0) {
      refusal(dir, real_dir, cands[i], why, sizeof why);
      refused = why[0] != 0;
    }
    zt_comm_bcast(world, &refused, sizeof refused, ZT_U8, 0);
    zt_err tried = {0};
    int rc = refused ? ZT_EINPUT : ZT_OK;
    if (!rc) {
      /* the file's own step is known only once it is loaded */
      *s->step = -1;
      rc = zt_ckpt_load(path, s, &tried);
      long long want = name_step(cands[i]);
      if (rc)
        snprintf(why, sizeof why, "%s", tried.msg);
      else if (*s->step < 0)
        snprintf(why, sizeof why, "it holds no optimizer state, so no step to resume from "
                 "(written by --save?)");
      else if (*s->step != want)
        snprintf(why, sizeof why, "it records step %lld, but its name says step %lld (a renamed "
                 "copy or a link to another checkpoint?)", (long long)*s->step, want);
      if (!rc && why[0]) rc = ZT_EINPUT;
    }
    if (!rc) {
      snprintf(used, n, "%s", path);
      free(real_dir);
      return ZT_OK;
    }
    *s->step = before;
    if (world->rank == 0) {
      printable(path); /* a name from readdir: any bytes */
      fprintf(stderr, "ztrain: warning: --resume auto skips %s: %s\n", path, why);
    }
    skipped++;
  }
  free(real_dir);
  if (skipped)
    return zt_err_set(e, ZT_EINPUT, "--resume auto: none of the %d checkpoints in %s loads "
                      "(see the warnings above)", skipped, dir);
  return ZT_OK;
}
