/* grid: see grid.h. */
#include "parallel/grid.h"

#include <string.h>

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

  /* Nodes: the lowest world rank sharing memory with this one names the node. */
  int32_t leader = zt_comm_node_rank() == 0, lo = zt_comm_node_id(), hi = lo;
  zt_comm_allreduce(&g->world, &leader, 1, ZT_I32, ZT_SUM);
  g->nodes = leader;
  zt_comm_allreduce(&g->tp_comm, &lo, 1, ZT_I32, ZT_MIN);
  zt_comm_allreduce(&g->tp_comm, &hi, 1, ZT_I32, ZT_MAX);
  g->tp_spans_nodes = lo != hi;
  return ZT_OK;
}

void zt_grid_free(zt_grid *g) {
  zt_comm *cs[] = {&g->embed_comm, &g->mp_comm, &g->pp_comm, &g->dp_comm, &g->tp_comm, &g->world};
  for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
    if (cs[i]->world_ranks) zt_comm_free(cs[i]);
}
