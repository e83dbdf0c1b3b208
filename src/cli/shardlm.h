/* Entry point of the shardlm program, kept in the library so tests can call it. */
#ifndef SHLM_SHARDLM_H
#define SHLM_SHARDLM_H

/* Runs `shardlm <command> ...`; returns the process exit status. */
int shardlm_main(int argc, char **argv);

#endif
