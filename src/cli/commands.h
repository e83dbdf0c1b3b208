/* The subcommands of `shardlm`, one function each; src/cli/cli.c dispatches to them.
 * Each takes the arguments after `shardlm` (argv[0] is the command's own name) and
 * returns the process exit status. */
#ifndef SHLM_COMMANDS_H
#define SHLM_COMMANDS_H

/* shardlm train JOB.ini [--set section.key=value ...]   (src/cli/cmd_train.c; every rank) */
int cmd_train(int argc, char **argv);
/* shardlm eval JOB.ini [--ckpt CKPT] [--set section.key=value ...]   (src/cli/cmd_train.c; every rank) */
int cmd_eval(int argc, char **argv);
/* shardlm data prepare --tokenizer T [--width 2|4] IN.txt OUT.bin
 * (src/cli/cmd_data.c; a plain process, needs no MPI) */
int cmd_data(int argc, char **argv);
/* shardlm data encode|decode|tokenizer --tokenizer T ...   (src/cli/cmd_tokenize.c; called by
 * cmd_data with the same arguments) */
int cmd_data_encode(int argc, char **argv);
int cmd_data_decode(int argc, char **argv);
int cmd_data_tokenizer(int argc, char **argv);

/* shardlm keys [--markdown]   (src/cli/cmd_keys.c; a plain process) */
int cmd_keys(int argc, char **argv);

/* shardlm plan JOB.ini --ranks N [--ranks-per-node M]   (src/cli/plan.c; a plain process) */
int cmd_plan(int argc, char **argv);

/* shardlm plot [--out DIR] RUN_DIR...   (src/cli/cmd_plot.c; a plain process, runs gnuplot) */
int cmd_plot(int argc, char **argv);

/* shardlm ckpt info|verify|export CKPT ...   (src/cli/cmd_ckpt.c; one rank or many) */
int cmd_ckpt(int argc, char **argv);
/* shardlm generate JOB.ini [--ckpt CKPT] --prompt TEXT ...   (src/cli/cmd_generate.c; every rank) */
int cmd_generate(int argc, char **argv);

#endif
