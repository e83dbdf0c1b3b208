/* A table of typed keys: what the job file's keys (src/job/config.c) and a model family's
 * [model] keys (src/model/family.h) are made of. Each key is a field of a struct at an
 * offset; its default is text, parsed like a value; one line of doc says what it means
 * (`shardlm keys` and README's table are printed from the tables). */
#ifndef SHLM_KEYS_H
#define SHLM_KEYS_H

#include <stddef.h>

typedef enum key_type {
    KT_INT,    /* int */
    KT_FLOAT,  /* float */
    KT_U64,    /* uint64_t, decimal or 0x-hex */
    KT_BOOL,   /* int 0/1: true/false, yes/no, on/off, 1/0 */
    KT_STRING, /* char[size]; may be "quoted" with \" \\ \n \t escapes */
    KT_ENUM,   /* an enum (int-sized): the index of the value in `choices` ("a|b|c"), whose
                * order is the enum's (each table checks its enums with _Static_assert) */
} key_type;

enum key_flags {
    KF_REQUIRED = 1 << 0, /* no default: the job must set it */
    KF_MODEL = 1 << 1,    /* a model shape field: its default comes from the preset */
    KF_SHAPE = 1 << 2,    /* required when no preset is given */
    KF_DERIVED = 1 << 3,  /* default computed from other keys (the family's derive, or the
                           * job's resolution) */
    KF_PATH = 1 << 4,     /* a file: relative to the job file's directory when set there */
    KF_PRESET = 1 << 5,   /* must name a preset of a model family */
    KF_MIN_OPEN = 1 << 6, /* value must be > min (not >=) */
    KF_MAX_OPEN = 1 << 7, /* value must be < max (not <=) */
    KF_TRAINING = 1 << 8, /* KF_REQUIRED only when the job trains */
    KF_LAYOUT = 1 << 9,   /* a model key the parameters' shapes follow: weights saved under
                           * another value cannot load */
};

typedef struct key_def {
    const char *section, *key;
    key_type type;
    size_t offset, size;  /* of the field in its struct */
    const char *def;      /* default, as text, parsed like a value; NULL: see flags */
    double min, max;      /* inclusive bounds of numbers unless KF_*_OPEN */
    const char *choices;  /* KT_ENUM only: the words, in the enum's order */
    unsigned flags;
    const char *doc;      /* one line: what the key means (shardlm keys, README's table) */
} key_def;

/* Parses text v as key k's type into its field of the struct at base. On error writes the
 * reason ("not an integer", "out of range, must be in [0, 1)", ...) into why and returns -1,
 * leaving the field alone. */
int key_parse(const key_def *k, const char *v, void *base, char *why, size_t whylen);
/* The field as text that key_parse reads back as the same value. */
void key_format(const key_def *k, const void *base, char *out, size_t outlen);
/* A numeric field's value (an enum's index; 0 for a string). */
double key_number(const key_def *k, const void *base);
/* 1 when the field holds the same value in both structs (floats within 1e-6 relative). */
int key_equal(const key_def *k, const void *a, const void *b);
/* Whether number v (read from elsewhere: a checkpoint's attribute) obeys k's type and
 * bounds; 0, or -1 with the reason in why. */
int key_check_number(const key_def *k, double v, char *why, size_t whylen);
/* "must be in [min, max]" or "must be >= min" for k. */
void key_range_text(const key_def *k, char *out, size_t outlen);
int key_in_range(const key_def *k, double v);
/* The index-th word of a choices list ("a|b|c"), into out ("?" past its end). */
const char *key_choice_word(const char *choices, int index, char *out, size_t outlen);

#endif
