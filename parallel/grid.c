/* grid: see grid.h. */
#include "parallel/grid.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether this rank's next member in group c (cyclic) is on another node. */
static int next_inter(const zt_grid *g, const zt_comm *c) {
  return g->node_of[c->world_ranks[(c->rank + 1) % c->size]] != g->node;
}

/* Nodes the widest tp, dp and pp group spans, from the grid's rank order
 * (rank = tp + TP*(dp + DP*pp)) and node_of: no communication, so that
 * ztrain plan gives the placement a run would. */
static void spans(zt_grid *g) {
  int n[3] = {0, 0, 0}, sz[3] = {g->tp, g->dp, g->pp};
  int step[3] = {1, g->tp, g->tp * g->dp};
  char *seen = calloc((size_t)g->nodes, 1);
  for (int r = 0; seen && r < g->world.size; r++) {
    int coord[3] = {r % g->tp, r / g->tp % g->dp, r / (g->tp * g->dp)};
    for (int k = 0; k < 3; k++) {
      if (coord[k]) continue; /* each group once: from its first member */
      memset(seen, 0, (size_t)g->nodes);
      int m = 0;
      for (int i = 0; i < sz[k]; i++) {
        int node = g->node_of[r + i * step[k]];
        m += !seen[node];
        seen[node] = 1;
      }
      if (m > n[k]) n[k] = m;
    }
  }
  free(seen);
  g->tp_nodes = n[0], g->dp_nodes = n[1], g->pp_nodes = n[2];
}

static int alloc_nodes(zt_grid *g, int size, zt_err *e) {
  g->node_of = malloc((size_t)size * sizeof *g->node_of);
  g->node_name = calloc((size_t)size, ZT_GRID_HOST);
  if (!g->node_of || !g->node_name)
    return zt_err_set(e, ZT_ERUNTIME, "grid: out of memory for the placement of %d ranks", size);
  return ZT_OK;
}

int zt_grid_plan_placement(zt_grid *g, int dp, int tp, int pp, int ranks_per_node, zt_err *e) {
  memset(g, 0, sizeof *g);
  g->dp = dp, g->tp = tp, g->pp = pp;
  g->world.size = dp * tp * pp;
  int rc = alloc_nodes(g, g->world.size, e);
  for (int r = 0; !rc && r < g->world.size; r++) {
    g->node_of[r] = r / ranks_per_node;
    if (r % ranks_per_node == 0)
      snprintf(g->node_name[g->nodes++], ZT_GRID_HOST, "node %d", r / ranks_per_node);
  }
  if (!rc) spans(g);
  return rc;
}

/* Every rank learns every rank's node and every node's name. */
static int place(zt_grid *g, zt_err *e) {
  int size = g->world.size;
  int32_t *ids = malloc((size_t)size * sizeof *ids);
  char (*hosts)[ZT_GRID_HOST] = calloc((size_t)size, ZT_GRID_HOST);
  if (!ids || !hosts || alloc_nodes(g, size, e)) {
    free(ids);
    free(hosts);
    return zt_err_set(e, ZT_ERUNTIME, "grid: out of memory for the placement of %d ranks", size);
  }
  ids[g->world.rank] = zt_comm_node_id();
  gethostname(hosts[g->world.rank], ZT_GRID_HOST - 1);
  int *counts = malloc((size_t)size * sizeof *counts), *hc = malloc((size_t)size * sizeof *hc);
  int *displs = malloc((size_t)size * sizeof *displs), *hd = malloc((size_t)size * sizeof *hd);
  for (int r = 0; counts && hc && displs && hd && r < size; r++)
    counts[r] = 1, displs[r] = r, hc[r] = ZT_GRID_HOST, hd[r] = r * ZT_GRID_HOST;
  if (counts && hc && displs && hd) {
    zt_comm_allgather(&g->world, ids, counts, displs, ZT_I32);
    zt_comm_allgather(&g->world, hosts, hc, hd, ZT_U8);
  }
  int ok = counts && hc && displs && hd;
  free(counts), free(hc), free(displs), free(hd);
  /* a node's lowest rank names it; numbered in that order */
  g->nodes = 0;
  for (int r = 0; ok && r < size; r++) {
    if (ids[r] == r) {
      memcpy(g->node_name[g->nodes], hosts[r], ZT_GRID_HOST);
      g->node_name[g->nodes][ZT_GRID_HOST - 1] = 0;
      ids[r] = -1 - g->nodes++; /* marks it numbered */
    }
    int lead = ids[r] < 0 ? r : ids[r];
    g->node_of[r] = -1 - ids[lead];
  }
  free(ids);
  free(hosts);
  if (!ok) return zt_err_set(e, ZT_ERUNTIME, "grid: out of memory for the placement of %d ranks", size);
  g->node = g->node_of[g->world.rank];
  spans(g);
  g->tp_inter = next_inter(g, &g->tp_comm);
  g->dp_inter = next_inter(g, &g->dp_comm);
  return ZT_OK;
}

int zt_grid_init(zt_grid *g, int dp, int tp, int pp, zt_err *e) {
  memset(g, 0, sizeof *g);
  zt_comm_wrap(&g->world, "world", MPI_COMM_WORLD, 0);
  int rank = g->world.rank, size = g->world.size;
  if (dp * tp * pp != size) {
    zt_comm_free(&g->world);
    return zt_err_set(e, ZT_EINPUT, "grid %d*%d*%d does not match %d ranks", dp, tp, pp, size);
  }
  g->dp = dp;
  g->tp = tp;
  g->pp = pp;
  g->tp_rank = rank % tp;
  g->dp_rank = rank / tp % dp;
  g->pp_rank = rank / (tp * dp);
  zt_comm_split(&g->world, "tp", g->dp_rank + dp * g->pp_rank, g->tp_rank, &g->tp_comm);
  zt_comm_split(&g->world, "dp", g->tp_rank + tp * g->pp_rank, g->dp_rank, &g->dp_comm);
  zt_comm_split(&g->world, "pp", g->tp_rank + tp * g->dp_rank, g->pp_rank, &g->pp_comm);
  zt_comm_split(&g->world, "mp", g->dp_rank, g->tp_rank + tp * g->pp_rank, &g->mp_comm);
  int ends = g->pp_rank == 0 || g->pp_rank == pp - 1;
  zt_comm_split(&g->world, "embed", ends ? g->tp_rank + tp * g->dp_rank : -1, g->pp_rank,
                &g->embed_comm);
  int rc = place(g, e);
  if (rc) zt_grid_free(g);
  return rc;
}

int zt_grid_max_node_ranks(const zt_grid *g) {
  int most = 0;
  for (int k = 0; k < g->nodes; k++) {
    int n = 0;
    for (int r = 0; r < g->world.size; r++) n += g->node_of[r] == k;
    most = n > most ? n : most;
  }
  return most;
}

/* "ranks 0-3" for the node's ranks when consecutive, else "ranks 0,2". */
static void node_ranks(const zt_grid *g, int k, char *buf, size_t n) {
  int first = -1, last = -1, runs = 0;
  size_t at = (size_t)snprintf(buf, n, "rank");
  for (int r = 0; r < g->world.size; r++) {
    if (g->node_of[r] != k) continue;
    if (first < 0) first = r;
    else if (r != last + 1) runs++;
    last = r;
  }
  if (!runs) {
    if (first == last) snprintf(buf + at, n - at, " %d", first);
    else snprintf(buf + at, n - at, "s %d-%d", first, last);
    return;
  }
  at += (size_t)snprintf(buf + at, n - at, "s");
  const char *sep = " ";
  for (int r = 0; r < g->world.size && at < n; r++)
    if (g->node_of[r] == k) {
      at += (size_t)snprintf(buf + at, n - at, "%s%d", sep, r);
      sep = ",";
    }
}

void zt_grid_describe(const zt_grid *g, char *buf, size_t n) {
  size_t at = (size_t)snprintf(buf, n, "%d node%s (", g->nodes, g->nodes == 1 ? "" : "s");
  for (int k = 0; k < g->nodes && at < n; k++) {
    char ranks[160];
    node_ranks(g, k, ranks, sizeof ranks);
    at += (size_t)snprintf(buf + at, n - at, "%s%s: %s", k ? "; " : "", g->node_name[k], ranks);
  }
  const char *kind[3] = {"tp", "dp", "pp"};
  int size[3] = {g->tp, g->dp, g->pp}, spans[3] = {g->tp_nodes, g->dp_nodes, g->pp_nodes};
  const char *sep = "); ";
  for (int i = 0; i < 3 && at < n; i++) {
    if (size[i] == 1) continue;
    if (spans[i] > 1)
      at += (size_t)snprintf(buf + at, n - at, "%s%s groups across %d nodes", sep, kind[i], spans[i]);
    else
      at += (size_t)snprintf(buf + at, n - at, "%s%s groups inside nodes", sep, kind[i]);
    sep = ", ";
  }
  if (at < n && !strcmp(sep, "); ")) snprintf(buf + at, n - at, ")");
}

void zt_grid_free(zt_grid *g) {
  zt_comm *cs[] = {&g->embed_comm, &g->mp_comm, &g->pp_comm, &g->dp_comm, &g->tp_comm, &g->world};
  for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
    if (cs[i]->world_ranks) zt_comm_free(cs[i]);
  free(g->node_of);
  free(g->node_name);
  g->node_of = NULL;
  g->node_name = NULL;
}
