/* pool: a cmocka test's buffers, kept until its teardown (free_pool) frees
 * them, so that a failing assertion, which longjmps out of the test, leaks
 * nothing. Include after cmocka.h. */
#ifndef ZT_TEST_POOL_H
#define ZT_TEST_POOL_H

#include <stdlib.h>

static void *pool[256];
static int npool;

static void *keep(void *p) {
  assert_non_null(p);
  assert_true(npool < (int)(sizeof pool / sizeof *pool));
  return pool[npool++] = p;
}

static int free_pool(void **state) {
  (void)state;
  while (npool) free(pool[--npool]);
  return 0;
}

#endif
