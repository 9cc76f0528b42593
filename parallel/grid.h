/* grid: the process grid dp x tp x pp and its groups. The default order
 * "tp-dp-pp" puts TP fastest: rank = tp + TP*(dp + DP*pp), so a TP group
 * is consecutive ranks, which launchers place on one node. Groups: tp, dp,
 * pp, mp (the model-parallel group tp x pp of one data-parallel replica),
 * embed (first and last pipeline stage, for tied embeddings), world. */
#ifndef ZT_GRID_H
#define ZT_GRID_H

#include "parallel/comm.h"
#include "src/core/err.h"

#define ZT_GRID_HOST 64 /* bytes of a node's name */

typedef struct zt_grid {
  int dp, tp, pp;
  int dp_rank, tp_rank, pp_rank;
  /* Placement: a node is the ranks that share memory (MPI's
   * MPI_COMM_TYPE_SHARED), numbered in order of their lowest world rank
   * and named by its host name. */
  int nodes;          /* nodes the world spans */
  int node;           /* this rank's */
  int *node_of;       /* world rank -> node */
  char (*node_name)[ZT_GRID_HOST];
  /* nodes the widest group of each kind spans (the same on every rank) */
  int tp_nodes, dp_nodes, pp_nodes;
  /* this rank's next member in its dp / tp group (the ring's direction)
   * sits on another node: in a ring collective every byte it sends
   * crosses the network, else none does */
  int dp_inter, tp_inter;
  zt_comm world, tp_comm, dp_comm, pp_comm, mp_comm;
  zt_comm embed_comm; /* only on first/last stage ranks; else mpi = NULL */
} zt_grid;

/* Collective over MPI_COMM_WORLD; dp*tp*pp must equal the world size
 * (the caller checked it and reported it). */
int zt_grid_init(zt_grid *g, int dp, int tp, int pp, zt_err *e);
void zt_grid_free(zt_grid *g);

/* The placement a run of dp x tp x pp ranks would get with ranks_per_node
 * consecutive ranks on each node (as mpirun --map-by slot and srun
 * place them), without MPI: nodes, node_of, names "node 0", ..., and the
 * spans; no groups (free with zt_grid_free). For ztrain plan. */
int zt_grid_plan_placement(zt_grid *g, int dp, int tp, int pp, int ranks_per_node, zt_err *e);

/* The most ranks any node holds. */
int zt_grid_max_node_ranks(const zt_grid *g);

/* "2 nodes (node1: ranks 0-1; node2: ranks 2-3); tp groups inside nodes,
 * dp groups across 2 nodes, pp inside" into buf. */
void zt_grid_describe(const zt_grid *g, char *buf, size_t n);

#endif
