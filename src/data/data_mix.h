/* The training data of a run: one token file, or a weighted mixture of several
 * (data.train = chat.bin:0.7, code.bin:0.2, web.bin:0.1), each optimizer step drawing
 * its windows from the sources in the weights' proportions.
 *
 * The list: entries separated by ','; spaces around an entry are dropped; an entry's
 * weight is the text after its last ':' where that text is a number (num_parse_double),
 * else the whole entry is the path (so "old:v1.bin" is a path, and "run:3.bin:1" is the
 * file "run:3.bin" with weight 1). A path cannot hold ','. Weights must be > 0 and are
 * normalised to sum 1. One entry, with or without a weight, is one file: the loader of
 * data_loader.h, unchanged. Several entries must each have a weight.
 *
 * A mixture (two sources or more): optimizer step s takes the global batch's G samples
 * in order; sample j of the step goes to the source whose deficit (n+1)·w - c is largest
 * (n: samples taken since the weights took effect, c: the source's share of them; ties
 * to the first listed), so after any n samples every source holds its share to within
 * one or two samples. A source's k-th sample is its window perm_k of its own data
 * loader (its own epochs: a source that runs out starts its next epoch on its own, in
 * the order of (train.seed, source index) with data.shuffle). The step's samples then go
 * to the ranks and micro-batches as in data_loader.h (row b of micro-batch m of rank r
 * of W: sample (m·mb + b)·W + r), so every world size trains on the same windows. Loss
 * masks and document starts are each source's own. The plan depends on the state
 * (each source's windows taken, and taken since the weights took effect) and G only:
 * a checkpoint holds that state (data_mix_state_text), so a resume continues exactly. */
#ifndef SHLM_DATA_MIX_H
#define SHLM_DATA_MIX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/tokens.h"
#include "src/data/data_loader.h"

enum { DATA_MIX_MAX = 16, DATA_MIX_PATH = 1024 };

/* One entry of data.train. */
typedef struct data_mix_entry {
    char path[DATA_MIX_PATH];
    char weight_text[32]; /* as written; "" when none */
    double weight;        /* normalised: the weights sum to 1 (1 for one entry) */
} data_mix_entry;

typedef struct data_mix_list {
    int n;
    data_mix_entry e[DATA_MIX_MAX];
} data_mix_list;

/* Parses data.train's text (rules above) into *out. Returns 0, or -1 with one line in
 * why (no key or file:line: the caller adds them): an empty entry, a weight <= 0, an
 * entry of several without a weight, more than DATA_MIX_MAX entries, the same path
 * twice, a path too long. */
int data_mix_parse(const char *text, data_mix_list *out, char *why, size_t whylen);

/* The list as data.train text that parses back to it: for one entry its path alone (with
 * ":1" where the path itself ends in ':' and a number), else "PATH:WEIGHT, PATH:WEIGHT"
 * with the weights as written. Returns the length, or -1 when it does not fit in outlen
 * or a path holds ',' (it would not parse back). */
int data_mix_format(const data_mix_list *l, char *out, size_t outlen);

/* What a checkpoint keeps of each source of a mixture. */
typedef struct data_mix_saved {
    uint64_t drawn;        /* windows taken from it: its position, epoch = drawn / windows */
    uint64_t sched;        /* windows taken since the weights took effect */
    uint64_t bytes, fingerprint; /* the file's identity (io/tokens.h) */
    double weight;         /* normalised */
    char path[DATA_MIX_PATH];
} data_mix_saved;

/* A source of the run's mixture. */
typedef struct data_mix_source {
    data_loader dl;        /* its windows, their order and reading (rank 0 of 1) */
    double weight;
    uint64_t drawn, sched; /* as data_mix_saved */
    uint64_t drawn_at_open;/* drawn when this run began: its share of this run */
} data_mix_source;

typedef struct data_mix {
    int n;                 /* sources; 1: the plain loader on global samples */
    data_mix_source src[DATA_MIX_MAX];
    int rank, world, micro_batch, seq_len;
    uint64_t step_start;   /* the planned step's first global sample */
    int planned;           /* samples in the planned step (G) */
    uint8_t *plan_src;     /* a mixture: source and window of each of the step's samples */
    uint64_t *plan_window;
} data_mix;

/* Sources tfs[0..n) with normalised weights, seq_len, data order (shuffle, seed), this
 * rank's place and micro-batch, doc_mask; saved: each source's state from a checkpoint
 * (NULL: a fresh start). For n = 1 the loader of data_loader.h, with this rank's place.
 * Returns 0, or -1 with one line in err (a file shorter than one window). */
int data_mix_init(data_mix *m, const token_file *const *tfs, const double *weights, int n,
                  int seq_len, int shuffle, uint64_t seed, int rank, int world, int micro_batch,
                  int doc_mask, const data_mix_saved *saved, char *err, size_t errlen);
void data_mix_free(data_mix *m);

/* Plans the next optimizer step (G = global_batch samples; step_start, its first global
 * sample, is what one file uses) and counts its trained targets over every rank's rows
 * into *targets (what the step's loss sum is divided by; every rank gets the same number,
 * no collective). The state moves past the step. Returns 0, or -1 with one line in err
 * when a file cannot be read. */
int data_mix_step(data_mix *m, uint64_t step_start, int global_batch, int64_t *targets,
                  char *err, size_t errlen);

/* This rank's micro-batch mb of the planned step, as data_loader_batch (every source's
 * file checked first; on failure the rows are zeros and -1 with one line in err). */
int data_mix_batch(data_mix *m, int mb, int32_t *inputs, int32_t *targets, int32_t *doc_start,
                   char *err, size_t errlen);

/* The global sample that row b of micro-batch mb of this rank holds in the planned step
 * (step_start + (mb·micro_batch + b)·world + rank, one file or a mixture): what the row's
 * LoRA dropout key is drawn from, the same on any world size. */
uint64_t data_mix_sample(const data_mix *m, int mb, int b);

/* A mixture's state as a checkpoint keeps it: one line per source
 * "DRAWN SCHED BYTES FINGERPRINT WEIGHT PATH\n" (WEIGHT as %.17g), "" for one file.
 * Returns 0, or -1 when it does not fit. */
int data_mix_state_text(const data_mix *m, const data_mix_list *l, char *out, size_t outlen);
/* The same text of saved[0..n). */
int data_mix_saved_text(const data_mix_saved *saved, int n, char *out, size_t outlen);
/* Parses that text into saved[0..*n). Returns 0, or -1 with why (a corrupt attribute). */
int data_mix_state_parse(const char *text, data_mix_saved *saved, int *n, char *why,
                         size_t whylen);

/* Tokens taken from source i so far (windows x seq_len, resumed steps included). */
long long data_mix_tokens(const data_mix *m, int i);

/* Rank 0's closing lines: each source's share of this run's windows (against its weight),
 * its tokens and its epochs (windows taken / windows in the file). No-op for one file. */
void data_mix_print_summary(const data_mix *m, const data_mix_list *l, FILE *out);

#endif
