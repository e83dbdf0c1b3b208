/* The backend registry's pairing and runtime.backend's decision (kernels/backends/backends.h):
 * shlm_backend_decide for every case a machine can present (no cuda in the build, no GPU,
 * a GPU this build's kernels do not run on, one they run on), then shlm_backend_pick on
 * this machine: cpu pairs with mpi, auto agrees with what decide says here.
 * Reproduce: ./tests/test_backends */
#include <stdio.h>
#include <string.h>

#include "kernels/backends/backends.h"
#include "tests/check.h"

static const char *A100 = "device 0, NVIDIA A100-SXM4-80GB (compute capability 8.0), cannot "
                          "run this build's CUDA kernels (built for compute capability 9.0)";

/* decide(want, probe) with its note and error, checked against the expected choice and
 * the words each must hold ("" for an empty note) */
static void expect(const char *what, shlm_backend_choice want, shlm_backend_probe p, int choice,
                   const char *note_has, const char *err_has) {
    char note[600] = "x", err[600] = "";
    int got = shlm_backend_decide(want, &p, note, sizeof note, err, sizeof err);
    int ok = got == choice && (note_has[0] ? strstr(note, note_has) != NULL : note[0] == '\0') &&
             (err_has[0] ? strstr(err, err_has) != NULL : 1);
    check(ok, "%s: runtime.backend = %s -> %s%s%s%s%s", what, shlm_backend_choice_name(want),
          got < 0 ? "refused" : shlm_backend_choice_name((shlm_backend_choice)got),
          note[0] ? "; note: " : "", note, err[0] && got < 0 ? "; error: " : "",
          got < 0 ? err : "");
}

int main(void) {
    const shlm_backend_probe none = {0};
    const shlm_backend_probe no_gpu = {.cuda_built = 1, .nccl_built = 1, .gpus = 0};
    const shlm_backend_probe hopper = {.cuda_built = 1, .nccl_built = 1, .gpus = 8};
    const shlm_backend_probe ampere = {.cuda_built = 1, .nccl_built = 1, .gpus = 8,
                                       .device_why = A100};
    const shlm_backend_probe no_nccl = {.cuda_built = 1, .nccl_built = 0, .gpus = 2};

    expect("cpu is always taken", SHLM_BACKEND_CPU, ampere, SHLM_BACKEND_CPU, "", "");
    expect("a cpu-only build", SHLM_BACKEND_AUTO, none, SHLM_BACKEND_CPU, "", "");
    expect("a cpu-only build", SHLM_BACKEND_CUDA, none, -1, "", "runtime.backend = cuda: this "
           "build has no cuda backend");
    expect("no GPU visible", SHLM_BACKEND_AUTO, no_gpu, SHLM_BACKEND_CPU, "", "");
    expect("no GPU visible", SHLM_BACKEND_CUDA, no_gpu, -1, "", "no GPU is visible");
    expect("a GPU the kernels run on", SHLM_BACKEND_AUTO, hopper, SHLM_BACKEND_CUDA, "", "");
    expect("a GPU the kernels run on", SHLM_BACKEND_CUDA, hopper, SHLM_BACKEND_CUDA, "", "");
    /* the A100 case: auto falls back with a line naming the device and its compute
     * capability; an explicit cuda is refused with that line */
    expect("a GPU the kernels do not run on", SHLM_BACKEND_AUTO, ampere, SHLM_BACKEND_CPU,
           "runtime.backend = auto: device 0, NVIDIA A100-SXM4-80GB (compute capability 8.0)", "");
    expect("a GPU the kernels do not run on", SHLM_BACKEND_AUTO, ampere, SHLM_BACKEND_CPU,
           "; using cpu", "");
    expect("a GPU the kernels do not run on", SHLM_BACKEND_CUDA, ampere, -1, "",
           "runtime.backend = cuda: device 0, NVIDIA A100-SXM4-80GB (compute capability 8.0)");
    expect("cuda without the nccl backend", SHLM_BACKEND_AUTO, no_nccl, SHLM_BACKEND_CPU,
           "not the NCCL comm backend", "");
    expect("cuda without the nccl backend", SHLM_BACKEND_CUDA, no_nccl, -1, "",
           "not the NCCL comm backend");

    /* this machine: the pairs the registry hands out */
    shlm_backend_options opt = {.backend = SHLM_BACKEND_CPU, .threads = 1};
    shlm_backend_pair pair = {0};
    char note[600], err[600] = "";
    int rc = shlm_backend_pick(&opt, NULL, NULL, &pair, note, sizeof note, err, sizeof err);
    check(rc == 0 && pair.ops == &shlm_ops_cpu && pair.comm == &shlm_comm_mpi && !note[0],
          "pick cpu: the cpu compute backend with the mpi comm backend (%s)", err);
    const shlm_ops *cuda = shlm_ops_find("cuda");
    if (!cuda || !cuda->available()) {
        /* no GPU here: auto is cpu + mpi without a note, cuda is refused in one line */
        opt.backend = SHLM_BACKEND_AUTO;
        rc = shlm_backend_pick(&opt, NULL, NULL, &pair, note, sizeof note, err, sizeof err);
        check(rc == 0 && pair.ops == &shlm_ops_cpu && pair.comm == &shlm_comm_mpi && !note[0],
              "pick auto where no GPU is visible: cpu with mpi");
        opt.backend = SHLM_BACKEND_CUDA;
        rc = shlm_backend_pick(&opt, NULL, NULL, &pair, note, sizeof note, err, sizeof err);
        check(rc == -1 && strncmp(err, "runtime.backend = cuda: ", 24) == 0 && !strchr(err, '\n'),
              "pick cuda where no GPU is visible: refused in one line (%s)", err);
    } else {
        printf("note: a GPU is visible; the pick of auto and cuda is tested by make check-gpu\n");
    }
    return check_exit();
}
