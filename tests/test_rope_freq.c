/* RoPE's frequencies (kernels/rope_freq.h): the default type bit for bit the expression the
 * rope kernels evaluated themselves before they took a description (so trained losses do
 * not move), linear and llama3 by their definitions, bad parameters refused in one line
 * naming them; with --ref FILE, every frequency against transformers' own (the lines
 * tests/rope_freq_ref.py prints, which tests/rope_freq_ref.sh passes).
 *
 * Usage: test_rope_freq [--ref FILE] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/rope_freq.h"
#include "tests/check.h"

static shlm_rope make(shlm_rope_type type, double theta, int hd, double factor, double low,
                      double high, int orig) {
    const shlm_rope_params p = {type, theta, factor, low, high, orig};
    shlm_rope r;
    char err[256] = "";
    if (shlm_rope_init(&r, hd, &p, err, sizeof err) != 0) {
        printf("FAIL - shlm_rope_init(%s, theta %g, hd %d): %s\n", shlm_rope_type_name(type),
               theta, hd, err);
        exit(1);
    }
    return r;
}

static void test_default(void) {
    static const struct {
        int hd;
        float theta; /* the model's rope_theta is a float: the kernels took it as one */
    } cases[] = {{2, 10000.0f}, {10, 10000.0f}, {64, 10000.0f}, {128, 500000.0f},
                 {128, 1000000.0f}, {96, 100000.0f}, {512, 10000.0f}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int hd = cases[k].hd;
        const shlm_rope r = make(SHLM_ROPE_DEFAULT, (double)cases[k].theta, hd, 0, 0, 0, 0);
        int same = r.head_dim == hd, rest_zero = 1;
        for (int i = 0; i < hd / 2; i++)
            same &= r.freq[i] == pow((double)cases[k].theta, -2.0 * i / hd);
        for (int i = hd / 2; i < SHLM_ROPE_MAX_HEAD_DIM / 2; i++) rest_zero &= r.freq[i] == 0.0;
        check(same && rest_zero,
              "default hd %d theta %g: freq[i] == pow(theta, -2.0*i/hd) bit for bit, the rest 0",
              hd, cases[k].theta);
    }
}

static void test_linear(void) {
    const shlm_rope d = make(SHLM_ROPE_DEFAULT, 10000.0, 64, 0, 0, 0, 0);
    const shlm_rope r = make(SHLM_ROPE_LINEAR, 10000.0, 64, 4.0, 0, 0, 0);
    int same = 1;
    for (int i = 0; i < 32; i++) same &= r.freq[i] == d.freq[i] / 4.0;
    check(same, "linear factor 4: the default's frequencies divided by 4");
}

/* each pair in its band by its wavelength: kept, divided by factor, or strictly between
 * the two; the frequencies fall with i (monotone through the band edges) */
static void test_llama3(void) {
    const double theta = 10000.0, factor = 4.0, low = 1.0, high = 4.0;
    const int hd = 16, orig = 256;
    const shlm_rope d = make(SHLM_ROPE_DEFAULT, theta, hd, 0, 0, 0, 0);
    const shlm_rope r = make(SHLM_ROPE_LLAMA3, theta, hd, factor, low, high, orig);
    int kept = 0, divided = 0, between = 0, ok = 1, falls = 1;
    for (int i = 0; i < hd / 2; i++) {
        const double wavelen = 2.0 * M_PI / d.freq[i];
        if (wavelen < orig / high) {
            ok &= r.freq[i] == d.freq[i];
            kept++;
        } else if (wavelen > orig / low) {
            ok &= r.freq[i] == d.freq[i] / factor;
            divided++;
        } else {
            ok &= r.freq[i] > d.freq[i] / factor && r.freq[i] < d.freq[i];
            between++;
        }
        if (i > 0) falls &= r.freq[i] < r.freq[i - 1];
    }
    check(ok && kept && divided && between,
          "llama3: %d pairs kept, %d divided by factor, %d between the two", kept, divided,
          between);
    check(falls, "llama3: the frequencies fall with the pair index");
    /* the band's ends meet the two rules (s = 1 at wavelength orig/high, 0 at orig/low):
     * heads of 4 whose pair 1 (theta^(-1/2)) sits on an edge, up to the rounding of
     * 2π/(2π/edge) */
    for (int edge = 0; edge < 2; edge++) {
        const double f = 2.0 * M_PI / (edge ? orig / low : orig / high);
        const shlm_rope e = make(SHLM_ROPE_LLAMA3, pow(f, -2.0), 4, factor, low, high, orig);
        const double want = edge ? f / factor : f;
        check(fabs(e.freq[1] - want) <= 1e-12 * want,
              "llama3: a wavelength of original/%s gives the %s frequency",
              edge ? "low_freq_factor" : "high_freq_factor", edge ? "divided" : "kept");
    }
}

static void test_errors(void) {
    static const struct {
        shlm_rope_params p;
        int hd;
        const char *names;
    } bad[] = {
        {{SHLM_ROPE_DEFAULT, 10000.0, 0, 0, 0, 0}, 7, "head_dim"},
        {{SHLM_ROPE_DEFAULT, 10000.0, 0, 0, 0, 0}, 0, "head_dim"},
        {{SHLM_ROPE_DEFAULT, 10000.0, 0, 0, 0, 0}, SHLM_ROPE_MAX_HEAD_DIM + 2, "head_dim"},
        {{SHLM_ROPE_DEFAULT, 0.0, 0, 0, 0, 0}, 64, "rope_theta"},
        {{SHLM_ROPE_DEFAULT, NAN, 0, 0, 0, 0}, 64, "rope_theta"},
        {{SHLM_ROPE_LINEAR, 10000.0, 0.0, 0, 0, 0}, 64, "factor"},
        {{SHLM_ROPE_LINEAR, 10000.0, INFINITY, 0, 0, 0}, 64, "factor"},
        {{SHLM_ROPE_LLAMA3, 10000.0, 0.0, 1.0, 4.0, 8192}, 64, "factor"},
        {{SHLM_ROPE_LLAMA3, 10000.0, 8.0, 0.0, 4.0, 8192}, 64, "low_freq_factor"},
        {{SHLM_ROPE_LLAMA3, 10000.0, 8.0, 4.0, 4.0, 8192}, 64, "high_freq_factor"},
        {{SHLM_ROPE_LLAMA3, 10000.0, 8.0, 4.0, 1.0, 8192}, 64, "high_freq_factor"},
        {{SHLM_ROPE_LLAMA3, 10000.0, 8.0, 1.0, 4.0, 0}, 64, "original_max_position_embeddings"},
        {{(shlm_rope_type)7, 10000.0, 8.0, 1.0, 4.0, 8192}, 64, "default linear llama3"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        shlm_rope r;
        char err[256] = "";
        const int rc = shlm_rope_init(&r, bad[k].hd, &bad[k].p, err, sizeof err);
        check(rc == -1 && strstr(err, bad[k].names) != NULL && strchr(err, '\n') == NULL,
              "refused in one line naming %s: \"%s\"", bad[k].names, err);
    }
    /* parameters a type does not use are not looked at */
    const shlm_rope_params unused = {SHLM_ROPE_DEFAULT, 10000.0, -1.0, -1.0, -2.0, -5};
    shlm_rope r;
    check(shlm_rope_init(&r, 64, &unused, NULL, 0) == 0, "default ignores the scaling fields");
}

static void test_names(void) {
    int ok = 1;
    for (int t = SHLM_ROPE_DEFAULT; t <= SHLM_ROPE_LLAMA3; t++) {
        shlm_rope_type back;
        ok &= shlm_rope_type_parse(shlm_rope_type_name((shlm_rope_type)t), &back) == 0 &&
              back == (shlm_rope_type)t &&
              strstr(shlm_rope_type_names(), shlm_rope_type_name((shlm_rope_type)t)) != NULL;
    }
    shlm_rope_type back;
    check(ok && shlm_rope_type_parse("yarn", &back) == -1 &&
              shlm_rope_type_parse("dynamic", &back) == -1,
          "rope type names: default, linear, llama3 parse back; yarn and dynamic do not");
}

/* Against transformers' fp32 frequencies f_T: |ours − f_T| <= tol·f_T with
 * tol = 2^-24·(ln(theta) + 8 + band), transformers' own rounding: it forms theta^(2i/d)
 * in fp32, whose exponent's rounding (2^-24 relative) grows by ln(theta) in the power
 * (13 for theta 500000), then rounds the power, the reciprocal, the division by factor,
 * the wavelength and the smoothing once each (8 for those and margin); in the llama3 band
 * the smoothing factor s = (orig/wavelen − low)/(high − low) carries ~4·high/(high − low)
 * roundings of 2^-24, which the interpolation multiplies by up to factor − 1 relative to
 * the frequency (band = 4·(factor − 1)·high/(high − low)). Ours are doubles, exact to
 * 2^-52 by comparison. */
static void test_ref(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        check(0, "cannot open %s", path);
        return;
    }
    char type[32];
    double theta, factor, low, high;
    int hd, orig, cases = 0;
    while (fscanf(f, "%31s %lf %d %lf %lf %lf %d", type, &theta, &hd, &factor, &low, &high,
                  &orig) == 7) {
        shlm_rope_params p = {SHLM_ROPE_DEFAULT, theta, factor, low, high, orig};
        if (shlm_rope_type_parse(type, &p.type) != 0 || hd < 2 || hd > SHLM_ROPE_MAX_HEAD_DIM) {
            check(0, "%s: a line of type %s, head_dim %d", path, type, hd);
            break;
        }
        shlm_rope r;
        char err[256];
        if (shlm_rope_init(&r, hd, &p, err, sizeof err) != 0) {
            check(0, "%s %g hd %d: %s", type, theta, hd, err);
            break;
        }
        double worst = 0.0, worst_tol = 0.0;
        int ok = 1, got_all = 1;
        for (int i = 0; i < hd / 2; i++) {
            double ref;
            if (fscanf(f, "%lf", &ref) != 1) {
                got_all = 0;
                break;
            }
            double band = 0.0;
            if (p.type == SHLM_ROPE_LLAMA3) {
                const double base = pow(theta, -2.0 * i / hd), wavelen = 2.0 * M_PI / base;
                if (wavelen >= orig / high && wavelen <= orig / low)
                    band = 4.0 * (factor - 1.0) * high / (high - low);
            }
            const double tol = 0x1p-24 * (log(theta) + 8.0 + band);
            const double rel = fabs(r.freq[i] - ref) / ref;
            ok &= rel <= tol;
            if (rel / tol > worst / (worst_tol > 0 ? worst_tol : 1)) worst = rel, worst_tol = tol;
        }
        check(got_all && ok,
              "%s theta %g hd %d factor %g low %g high %g original %d: %d frequencies within "
              "transformers' fp32 rounding (worst %.2e of tol %.2e)",
              type, theta, hd, factor, low, high, orig, hd / 2, worst, worst_tol);
        cases++;
    }
    fclose(f);
    check(cases >= 3, "%s: %d cases compared", path, cases);
}

int main(int argc, char **argv) {
    printf("# reproduce: %s%s%s\n", argv[0], argc > 2 ? " --ref " : "", argc > 2 ? argv[2] : "");
    if (argc == 3 && strcmp(argv[1], "--ref") == 0) {
        test_ref(argv[2]);
    } else if (argc == 1) {
        test_default();
        test_linear();
        test_llama3();
        test_errors();
        test_names();
    } else {
        fprintf(stderr, "usage: %s [--ref FILE]\n", argv[0]);
        return 2;
    }
    printf("# %d checks, %d failed: %s\n", n_checks, n_failed, n_failed ? "FAIL" : "PASS");
    return n_failed ? 1 : 0;
}
