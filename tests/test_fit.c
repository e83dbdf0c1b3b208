/* The host side of the fit check (src/job/fit.h): the memory a rank may allocate from
 * /proc/meminfo and the memory cgroup (v1 and v2, a limit or none, a namespace whose
 * root the cgroup is, the inactive file cache not counted), read from files made here
 * under a directory standing for /, and the check's verdict and line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "src/job/fit.h"
#include "tests/check.h"

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * MIB)

static char root[256];

/* root/rel with its text, the directories on the way made */
static void put(const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(99);
    }
}

/* a fresh root holding /proc/meminfo with MemAvailable = avail_kb */
static void fresh_root(const char *name, long long avail_kb) {
    snprintf(root, sizeof root, "%s/%s", getenv("SHLM_FIT_TMP"), name);
    mkdir(root, 0755);
    char meminfo[256];
    snprintf(meminfo, sizeof meminfo,
             "MemTotal:       24683652 kB\nMemFree:         1000000 kB\n"
             "MemAvailable:   %lld kB\nBuffers:          123456 kB\n", avail_kb);
    put("proc/meminfo", meminfo);
}

/* fit_host_memory_at(root, ranks) must give `want` bytes and a text holding `says` */
static void expect(const char *what, int ranks, double want, const char *says) {
    double got = -1;
    char text[256] = "";
    int rc = fit_host_memory_at(root, ranks, &got, text, sizeof text);
    check(rc == 0 && fabs(got - want) < 0.5 && strstr(text, says), "%s: %.0f bytes, want %.0f; '%s'",
          what, got, want, text);
}

int main(void) {
    char tmpl[] = "/tmp/shlm-test-fit.XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 99;
    }
    setenv("SHLM_FIT_TMP", tmpl, 1);
    const double avail = 8 * GIB;

    fresh_root("meminfo", 8 * 1024 * 1024);
    expect("MemAvailable alone, 1 rank", 1, avail, "8.00 GiB (MemAvailable) shared by 1 rank");
    expect("MemAvailable alone, 4 ranks", 4, avail / 4, "shared by 4 ranks");

    fresh_root("v2", 8 * 1024 * 1024);
    put("proc/self/cgroup", "0::/job/step\n");
    put("sys/fs/cgroup/job/step/memory.max", "2147483648\n");
    put("sys/fs/cgroup/job/step/memory.current", "1073741824\n");
    put("sys/fs/cgroup/job/step/memory.stat", "anon 1000\nfile 600000000\ninactive_file 536870912\n");
    expect("cgroup v2 limit 2 GiB, 1 GiB used of which 512 MiB inactive file cache", 2,
           1.5 * GIB / 2, "its memory cgroup's limit less its usage");

    fresh_root("v2max", 8 * 1024 * 1024);
    put("proc/self/cgroup", "0::/job\n");
    put("sys/fs/cgroup/job/memory.max", "max\n");
    put("sys/fs/cgroup/job/memory.current", "1073741824\n");
    expect("cgroup v2 without a limit (max)", 1, avail, "MemAvailable");

    fresh_root("v2ns", 8 * 1024 * 1024);
    put("proc/self/cgroup", "0::/outside/the/namespace\n");
    put("sys/fs/cgroup/memory.max", "1073741824\n");
    put("sys/fs/cgroup/memory.current", "268435456\n");
    expect("cgroup v2, a namespace whose root the cgroup is", 1, 0.75 * GIB, "cgroup");

    fresh_root("v2big", 8 * 1024 * 1024);
    put("proc/self/cgroup", "0::/\n");
    put("sys/fs/cgroup/memory.max", "68719476736\n");
    put("sys/fs/cgroup/memory.current", "0\n");
    expect("cgroup v2 limit above MemAvailable", 1, avail, "MemAvailable");

    fresh_root("v1", 8 * 1024 * 1024);
    put("proc/self/cgroup", "9:cpu:/x\n4:memory:/docker/abc\n0::/\n");
    put("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "1073741824\n");
    put("sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", "536870912\n");
    put("sys/fs/cgroup/memory/docker/abc/memory.stat",
        "cache 300000000\ninactive_file 1\ntotal_inactive_file 268435456\n");
    expect("cgroup v1 limit 1 GiB, 512 MiB used of which 256 MiB inactive file cache", 1,
           0.75 * GIB, "cgroup");

    fresh_root("v1nolimit", 8 * 1024 * 1024);
    put("proc/self/cgroup", "4:memory:/\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    put("sys/fs/cgroup/memory/memory.usage_in_bytes", "536870912\n");
    expect("cgroup v1 without a limit (2^63 rounded to a page)", 1, avail, "MemAvailable");

    snprintf(root, sizeof root, "%s/none", tmpl);
    mkdir(root, 0755);
    double got = 0;
    char text[256];
    int rc;
    check(fit_host_memory_at(root, 1, &got, text, sizeof text) == -1,
          "no /proc/meminfo: -1 (no figure, no check)");
    rc = fit_host_memory(1, &got, text, sizeof text);
    check(rc == 0 && got > 0, "this machine: %.2f GiB (%s)", got / GIB, text);

    /* the verdict: the plan's total against what is free, one line with both */
    shard_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.total = (size_t)(133.56 * GIB);
    pl.state = (size_t)(100.41 * GIB);
    pl.bytes[PLAN_ACTIVATIONS] = (size_t)(33.15 * GIB);
    char err[1024] = "";
    check(fit_check_memory(&pl, 200 * GIB, "w", "job.ini", 1, err, sizeof err) == 0,
          "133.56 GiB needed, 200 free: fits");
    rc = fit_check_memory(&pl, 16.99 * GIB, "this machine's available memory", "job.ini", 2,
                              err, sizeof err);
    check(rc == -1 && strstr(err, "job.ini: the job needs 133.56 GiB per rank") &&
              strstr(err, "activations 33.15") &&
              strstr(err, "but 16.99 GiB are free per rank (this machine's available memory)") &&
              strstr(err, "shardlm plan job.ini --ranks 2") && !strchr(err, '\n'),
          "133.56 GiB needed, 16.99 free: refused in one line: %s", err);

    /* fsdp.offload: the host's share against the offloaded state (and on the cpu backend
     * the plan's total beside it); nothing to check without the offload */
    memset(&pl, 0, sizeof pl);
    pl.bytes[PLAN_GRAD] = (size_t)(1.0 * GIB); /* master and moments: 3 GiB */
    pl.host_bytes = (size_t)(3.5 * GIB);
    check(fit_check_host(&pl, 0, 1 * GIB, "w", "job.ini", err, sizeof err) == 0,
          "no offload: no host check");
    pl.offload = 1;
    check(fit_check_host(&pl, 0, 3.5 * GIB, "w", "job.ini", err, sizeof err) == 0,
          "3.5 GiB offloaded, 3.5 free: fits");
    rc = fit_check_host(&pl, 0, 3.4 * GIB, "this machine's available memory", "job.ini", err,
                        sizeof err);
    check(rc == -1 && strstr(err, "job.ini: fsdp.offload = optimizer needs 3.50 GiB of host memory per rank") &&
              strstr(err, "master and AdamW moments 3.00, gradient and upload staging 0.50)") &&
              strstr(err, "but 3.40 GiB are free per rank (this machine's available memory)") &&
              !strchr(err, '\n'),
          "3.5 GiB offloaded, 3.4 free: refused in one line: %s", err);
    rc = fit_check_host(&pl, 2 * GIB, 5 * GIB, "w", "job.ini", err, sizeof err);
    check(rc == -1 && strstr(err, "needs 5.50 GiB") && strstr(err, "the plan's other buffers 2.00"),
          "on the cpu backend the plan's 2 GiB count too: 5.5 of 5 refused: %s", err);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    if (system(cmd) != 0) fprintf(stderr, "test_fit: could not remove %s\n", tmpl);
    printf("test_fit: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
