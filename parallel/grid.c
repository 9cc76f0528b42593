/* grid: see grid.h. */
#include "parallel/grid.h"

#include <string.h>

static void split(zt_comm *c, const char *name, int color, int key) {
  MPI_Comm m;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &m);
  if (m == MPI_COMM_NULL) {
    memset(c, 0, sizeof *c);
    c->mpi = MPI_COMM_NULL;
    return;
  }
  zt_comm_wrap(c, name, m, 1);
}

int zt_grid_init(zt_grid *g, int dp, int tp, int pp, zt_err *e) {
  memset(g, 0, sizeof *g);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (dp * tp * pp != size)
    return zt_err_set(e, ZT_EINPUT, "grid %d*%d*%d does not match %d ranks", dp, tp, pp, size);
  g->dp = dp;
  g->tp = tp;
  g->pp = pp;
  g->tp_rank = rank % tp;
  g->dp_rank = rank / tp % dp;
  g->pp_rank = rank / (tp * dp);
  zt_comm_wrap(&g->world, "world", MPI_COMM_WORLD, 0);
  split(&g->tp_comm, "tp", g->dp_rank + dp * g->pp_rank, g->tp_rank);
  split(&g->dp_comm, "dp", g->tp_rank + tp * g->pp_rank, g->dp_rank);
  split(&g->pp_comm, "pp", g->tp_rank + tp * g->dp_rank, g->pp_rank);
  split(&g->mp_comm, "mp", g->dp_rank, g->tp_rank + tp * g->pp_rank);
  int ends = g->pp_rank == 0 || g->pp_rank == pp - 1;
  split(&g->embed_comm, "embed", ends ? g->tp_rank + tp * g->dp_rank : MPI_UNDEFINED,
        g->pp_rank);

  /* Nodes: the lowest world rank sharing memory with this one names the node. */
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_id = rank, lo, hi, leader;
  MPI_Allreduce(MPI_IN_PLACE, &node_id, 1, MPI_INT, MPI_MIN, node);
  int node_rank;
  MPI_Comm_rank(node, &node_rank);
  MPI_Comm_free(&node);
  leader = node_rank == 0;
  MPI_Allreduce(&leader, &g->nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&node_id, &lo, 1, MPI_INT, MPI_MIN, g->tp_comm.mpi);
  MPI_Allreduce(&node_id, &hi, 1, MPI_INT, MPI_MAX, g->tp_comm.mpi);
  g->tp_spans_nodes = lo != hi;
  return ZT_OK;
}

void zt_grid_free(zt_grid *g) {
  zt_comm *cs[] = {&g->embed_comm, &g->mp_comm, &g->pp_comm, &g->dp_comm, &g->tp_comm, &g->world};
  for (size_t i = 0; i < sizeof cs / sizeof *cs; i++)
    if (cs[i]->world_ranks) zt_comm_free(cs[i]);
}
