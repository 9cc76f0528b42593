/* grid: the process grid dp x tp x pp and its groups. The default order
 * "tp-dp-pp" puts TP fastest: rank = tp + TP*(dp + DP*pp), so a TP group
 * is consecutive ranks, which launchers place on one node. Groups: tp, dp,
 * pp, mp (the model-parallel group tp x pp of one data-parallel replica),
 * embed (first and last pipeline stage, for tied embeddings), world. */
#ifndef ZT_GRID_H
#define ZT_GRID_H

#include "parallel/comm.h"
#include "src/core/err.h"

typedef struct zt_grid {
  int dp, tp, pp;
  int dp_rank, tp_rank, pp_rank;
  int nodes;          /* nodes the world spans */
  int tp_spans_nodes; /* this rank's TP group crosses a node boundary */
  zt_comm world, tp_comm, dp_comm, pp_comm, mp_comm;
  zt_comm embed_comm; /* only on first/last stage ranks; else mpi = NULL */
} zt_grid;

/* Collective over MPI_COMM_WORLD; dp*tp*pp must equal the world size
 * (the caller checked it and reported it). */
int zt_grid_init(zt_grid *g, int dp, int tp, int pp, zt_err *e);
void zt_grid_free(zt_grid *g);

#endif
