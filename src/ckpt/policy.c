/* policy: see policy.h. Only rank 0 touches the directory; the others learn
 * the outcome by broadcast. */
#include "src/ckpt/policy.h"

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
} job;

static void finish_async(zt_ckpt_async *a) {
  if (job.rank0) a->rc = finish(job.dir, job.name, job.keep, &a->err);
}

int zt_ckpt_dir_save(const char *dir, int keep, const zt_ckpt_state *s, zt_ckpt_async *async,
                     char *written, size_t n, zt_err *e) {
  zt_comm *world = &s->grid->world;
  int rc = async ? zt_ckpt_async_wait(async, e) : ZT_OK;
  if (rc) return rc;
  if (world->rank == 0 && mkdir(dir, 0777) && errno != EEXIST)
    rc = zt_err_set(e, ZT_ERUNTIME, "cannot create checkpoint dir %s: %s", dir, strerror(errno));
  zt_comm_bcast(world, &rc, sizeof rc, 0);
  if (rc) {
    zt_comm_bcast(world, e->msg, sizeof e->msg, 0);
    return e->code = rc;
  }
  char name[64], path[4200];
  snprintf(name, sizeof name, "step_%08lld.h5", (long long)*s->step);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (written) snprintf(written, n, "%s", path);
  if (async) {
    snprintf(job.dir, sizeof job.dir, "%s", dir);
    snprintf(job.name, sizeof job.name, "%s", name);
    job.keep = keep;
    job.rank0 = world->rank == 0;
    return zt_ckpt_async_start(async, path, s, finish_async, e);
  }
  rc = zt_ckpt_save(path, s, e);
  if (!rc && world->rank == 0) rc = finish(dir, name, keep, e);
  zt_comm_bcast(world, &rc, sizeof rc, 0);
  if (rc) zt_comm_bcast(world, e->msg, sizeof e->msg, 0);
  return e->code = rc;
}

int zt_ckpt_dir_resume(const char *dir, const zt_ckpt_state *s, char *used, size_t n,
                       zt_err *e) {
  zt_comm *world = &s->grid->world;
  /* rank 0 builds the candidate list: `latest` first, then all, newest first */
  char cands[64][64];
  int count = 0;
  if (world->rank == 0) {
    char path[4096], first[64] = "";
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f) {
      if (fgets(first, sizeof first, f)) first[strcspn(first, "\n")] = 0;
      fclose(f);
    }
    if (*first && !strchr(first, '/')) snprintf(cands[count++], 64, "%s", first);
    char *names[MAX_KEPT];
    int k = list(dir, names, MAX_KEPT);
    for (int i = 0; i < k; i++) {
      if (count < 64 && strcmp(names[i], first) && strlen(names[i]) < 64)
        memcpy(cands[count++], names[i], strlen(names[i]) + 1);
      free(names[i]);
    }
  }
  zt_comm_bcast(world, &count, sizeof count, 0);
  zt_comm_bcast(world, cands, sizeof cands, 0);
  used[0] = 0;
  for (int i = 0; i < count; i++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%.64s", dir, cands[i]);
    zt_err tried = {0};
    int rc = zt_ckpt_load(path, s, &tried);
    if (!rc) {
      snprintf(used, n, "%s", path);
      return ZT_OK;
    }
    if (world->rank == 0)
      fprintf(stderr, "ztrain: warning: --resume auto skips %s: %s\n", path, tried.msg);
  }
  if (count)
    return zt_err_set(e, ZT_EINPUT, "--resume auto: none of the %d checkpoints in %s loads "
                      "(see the warnings above)", count, dir);
  return ZT_OK;
}
