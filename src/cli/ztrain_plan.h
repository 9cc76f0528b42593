/* ztrain_plan: the `ztrain plan` subcommand (ztrain_plan.c). */
#ifndef ZT_CLI_ZTRAIN_PLAN_H
#define ZT_CLI_ZTRAIN_PLAN_H

/* argv[0] is "plan"; returns the exit status (0, 2 bad input). */
int zt_plan_main(int argc, char **argv);

#endif
