/* GPU telemetry through NVML (telemetry.h). The types come from the toolkit's nvml.h at
 * build time (SHLM_HAVE_NVML); libnvidia-ml.so.1 is opened with dlopen at run time, so
 * the program needs no NVML to start and a machine without a driver runs as before. One
 * thread samples every GPU of the node at the interval and folds the samples into each
 * GPU's window under a mutex; readers copy under the same mutex. XID errors arrive as
 * NVML events, whose wait is the thread's sleep between samples. */
#include "src/watch/telemetry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CONFIG_H
#include "shlm_config.h"
#endif

const char *const tel_field_keys[TEL_N] = {"util_pct", "mem_copy_util_pct", "sm_clock_mhz",
                                           "power_w", "temp_c", "mem_used_mib"};

#ifndef SHLM_HAVE_NVML

telemetry *telemetry_start(const char *const *bus_ids, const int *ranks, int n, int interval_ms,
                           char *why, size_t whylen) {
    snprintf(why, whylen, "this build has no NVML telemetry (configure found no nvml.h; "
             "NVML_CPPFLAGS points at one)");
    return NULL;
}
void telemetry_stop(telemetry *t) {}
int telemetry_gpu_count(const telemetry *t) { return 0; }
int telemetry_window(telemetry *t, tel_gpu *out, int max) { return 0; }
void telemetry_reset_window(telemetry *t) {}
int telemetry_latest(telemetry *t, tel_gpu *out, int max) { return 0; }

#else

#include <dlfcn.h>
#include <nvml.h>
#include <pthread.h>
#include <time.h>

#include "src/base/signals.h"

/* The NVML entry points used, typed here (not through the header's declarations, some
 * of which newer headers mark deprecated while drivers keep exporting them). */
typedef struct nvml_api {
    void *lib;
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    const char *(*error_string)(nvmlReturn_t);
    nvmlReturn_t (*by_pci_bus_id)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*get_index)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t *);
    nvmlReturn_t (*clock_info)(nvmlDevice_t, nvmlClockType_t, unsigned int *);
    nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*temperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int *);
    nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t *);
    /* v2 (R510 on): `used` without the driver's reservation, as nvidia-smi shows it (v1's
     * counts the reservation, some hundreds of MiB); NULL on older drivers */
    nvmlReturn_t (*memory_info_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*clock_reasons)(nvmlDevice_t, unsigned long long *);
    nvmlReturn_t (*ecc_total)(nvmlDevice_t, nvmlMemoryErrorType_t, nvmlEccCounterType_t,
                              unsigned long long *);
    nvmlReturn_t (*event_set_create)(nvmlEventSet_t *);
    nvmlReturn_t (*register_events)(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
    nvmlReturn_t (*event_set_wait)(nvmlEventSet_t, nvmlEventData_t *, unsigned int);
    nvmlReturn_t (*event_set_free)(nvmlEventSet_t);
} nvml_api;

typedef struct gpu_state {
    nvmlDevice_t dev;
    tel_gpu win;           /* the window: mean[] holds sums until read (under mu) */
    tel_gpu latest;        /* under mu */
    tel_gpu fresh;         /* the sampler's own, filled outside the lock */
} gpu_state;

struct telemetry {
    nvml_api api;
    int n, interval_ms;
    gpu_state *gpus;
    nvmlEventSet_t events; /* NULL when XID events cannot be registered */
    pthread_t thread;
    pthread_mutex_t mu;
    int stop;              /* under mu */
};

/* Resolves name (or, failing that, alt) from the library; -1 names the missing one. */
static int sym(void *lib, void *fn, const char *name, const char *alt, char *why, size_t whylen) {
    void *p = dlsym(lib, name);
    if (!p && alt) p = dlsym(lib, alt);
    if (!p) {
        snprintf(why, whylen, "libnvidia-ml.so.1 lacks %s", name);
        return -1;
    }
    memcpy(fn, &p, sizeof p);
    return 0;
}

static int load_api(nvml_api *a, char *why, size_t whylen) {
    memset(a, 0, sizeof *a);
    const char *path = getenv("SHLM_NVML_LIBRARY"); /* another NVML build, for tests */
    if (!path || !*path) path = "libnvidia-ml.so.1";
    a->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!a->lib) {
        snprintf(why, whylen, "%s not found (no NVIDIA driver on this machine?)", path);
        return -1;
    }
    int rc = 0;
    rc |= sym(a->lib, &a->init, "nvmlInit_v2", NULL, why, whylen);
    rc |= sym(a->lib, &a->shutdown, "nvmlShutdown", NULL, why, whylen);
    rc |= sym(a->lib, &a->error_string, "nvmlErrorString", NULL, why, whylen);
    rc |= sym(a->lib, &a->by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2", NULL, why, whylen);
    rc |= sym(a->lib, &a->get_index, "nvmlDeviceGetIndex", NULL, why, whylen);
    rc |= sym(a->lib, &a->utilization, "nvmlDeviceGetUtilizationRates", NULL, why, whylen);
    rc |= sym(a->lib, &a->clock_info, "nvmlDeviceGetClockInfo", NULL, why, whylen);
    rc |= sym(a->lib, &a->power_usage, "nvmlDeviceGetPowerUsage", NULL, why, whylen);
    rc |= sym(a->lib, &a->temperature, "nvmlDeviceGetTemperature", NULL, why, whylen);
    rc |= sym(a->lib, &a->memory_info, "nvmlDeviceGetMemoryInfo", NULL, why, whylen);
    void *v2 = dlsym(a->lib, "nvmlDeviceGetMemoryInfo_v2");
    memcpy(&a->memory_info_v2, &v2, sizeof v2);
    /* renamed in R535; older drivers have only the throttle name */
    rc |= sym(a->lib, &a->clock_reasons, "nvmlDeviceGetCurrentClocksEventReasons",
              "nvmlDeviceGetCurrentClocksThrottleReasons", why, whylen);
    rc |= sym(a->lib, &a->ecc_total, "nvmlDeviceGetTotalEccErrors", NULL, why, whylen);
    rc |= sym(a->lib, &a->event_set_create, "nvmlEventSetCreate", NULL, why, whylen);
    rc |= sym(a->lib, &a->register_events, "nvmlDeviceRegisterEvents", NULL, why, whylen);
    rc |= sym(a->lib, &a->event_set_wait, "nvmlEventSetWait_v2", NULL, why, whylen);
    rc |= sym(a->lib, &a->event_set_free, "nvmlEventSetFree", NULL, why, whylen);
    if (rc != 0) {
        dlclose(a->lib);
        a->lib = NULL;
        return -1;
    }
    return 0;
}

/* One sample of every gauge of a GPU into g->fresh (NaN where the device says no). */
static void sample(const nvml_api *a, gpu_state *g) {
    tel_gpu *s = &g->fresh;
    double v[TEL_N];
    for (int f = 0; f < TEL_N; f++) v[f] = NAN;
    nvmlUtilization_t u;
    unsigned int x;
    nvmlMemory_t m;
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    unsigned long long reasons = 0, ecc;
    if (a->utilization(g->dev, &u) == NVML_SUCCESS) {
        v[TEL_GPU_UTIL] = u.gpu;
        v[TEL_MEM_COPY_UTIL] = u.memory;
    }
    if (a->clock_info(g->dev, NVML_CLOCK_SM, &x) == NVML_SUCCESS) v[TEL_SM_CLOCK] = x;
    if (a->power_usage(g->dev, &x) == NVML_SUCCESS) v[TEL_POWER] = x / 1000.0; /* mW */
    if (a->temperature(g->dev, NVML_TEMPERATURE_GPU, &x) == NVML_SUCCESS) v[TEL_TEMP] = x;
    if (a->memory_info_v2 && a->memory_info_v2(g->dev, &m2) == NVML_SUCCESS)
        v[TEL_MEM_USED] = m2.used / 1048576.0;
    else if (a->memory_info(g->dev, &m) == NVML_SUCCESS)
        v[TEL_MEM_USED] = m.used / 1048576.0;
    if (a->clock_reasons(g->dev, &reasons) != NVML_SUCCESS) reasons = 0;
    s->ecc_corrected = a->ecc_total(g->dev, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC,
                                    &ecc) == NVML_SUCCESS ? (double)ecc : NAN;
    s->ecc_uncorrected = a->ecc_total(g->dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      NVML_VOLATILE_ECC, &ecc) == NVML_SUCCESS ? (double)ecc : NAN;
    for (int f = 0; f < TEL_N; f++) s->last[f] = s->mean[f] = s->max[f] = v[f];
    s->throttle_reasons = reasons;
    s->samples = 1;
}

/* Makes g->fresh the latest sample and folds it into the window (under the mutex). */
static void fold(gpu_state *g) {
    tel_gpu *w = &g->win;
    const tel_gpu *s = &g->fresh;
    tel_gpu *l = &g->latest;
    memcpy(l->mean, s->mean, sizeof l->mean);
    memcpy(l->max, s->max, sizeof l->max);
    memcpy(l->last, s->last, sizeof l->last);
    l->samples = 1;
    l->throttle_reasons = s->throttle_reasons;
    l->ecc_corrected = s->ecc_corrected;
    l->ecc_uncorrected = s->ecc_uncorrected;
    for (int f = 0; f < TEL_N; f++) {
        w->last[f] = s->last[f];
        w->mean[f] = w->samples ? w->mean[f] + s->last[f] : s->last[f]; /* a sum until read */
        w->max[f] = w->samples && !(s->last[f] > w->max[f]) ? w->max[f] : s->last[f];
    }
    w->throttle_reasons |= s->throttle_reasons;
    w->ecc_corrected = s->ecc_corrected;
    w->ecc_uncorrected = s->ecc_uncorrected;
    w->samples++;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void *sampler(void *arg) {
    telemetry *t = arg;
    for (;;) {
        for (int i = 0; i < t->n; i++) sample(&t->api, &t->gpus[i]); /* outside the lock */
        pthread_mutex_lock(&t->mu);
        for (int i = 0; i < t->n; i++) fold(&t->gpus[i]);
        int stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop) break;
        if (!t->events) {
            sleep_ms(t->interval_ms);
            continue;
        }
        /* the event wait is the sleep; XID events end it early and are counted */
        nvmlEventData_t ev;
        nvmlReturn_t rc = t->api.event_set_wait(t->events, &ev, (unsigned)t->interval_ms);
        if (rc == NVML_SUCCESS && (ev.eventType & nvmlEventTypeXidCriticalError)) {
            pthread_mutex_lock(&t->mu);
            for (int i = 0; i < t->n; i++) {
                if (t->gpus[i].dev != ev.device) continue;
                t->gpus[i].win.xid_count = ++t->gpus[i].latest.xid_count;
                t->gpus[i].win.xid_last = t->gpus[i].latest.xid_last = ev.eventData;
            }
            pthread_mutex_unlock(&t->mu);
        } else if (rc != NVML_SUCCESS && rc != NVML_ERROR_TIMEOUT) {
            sleep_ms(t->interval_ms); /* the wait failed at once: do not spin */
        }
    }
    return NULL;
}

telemetry *telemetry_start(const char *const *bus_ids, const int *ranks, int n, int interval_ms,
                           char *why, size_t whylen) {
    telemetry *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    if (load_api(&t->api, why, whylen) != 0) {
        free(t);
        return NULL;
    }
    nvmlReturn_t rc = t->api.init();
    if (rc != NVML_SUCCESS) {
        snprintf(why, whylen, "nvmlInit: %s", t->api.error_string(rc));
        dlclose(t->api.lib);
        free(t);
        return NULL;
    }
    t->n = n;
    t->interval_ms = interval_ms;
    t->gpus = calloc((size_t)(n > 0 ? n : 1), sizeof *t->gpus);
    int ok = t->gpus != NULL;
    for (int i = 0; ok && i < n; i++) {
        gpu_state *g = &t->gpus[i];
        unsigned idx = 0;
        rc = t->api.by_pci_bus_id(bus_ids[i], &g->dev);
        if (rc == NVML_SUCCESS) rc = t->api.get_index(g->dev, &idx);
        if (rc != NVML_SUCCESS) {
            snprintf(why, whylen, "NVML: GPU at PCI bus id %s (rank %d): %s", bus_ids[i],
                     ranks[i], t->api.error_string(rc));
            ok = 0;
            break;
        }
        g->latest.index = g->win.index = (int)idx;
        g->latest.rank = g->win.rank = ranks[i];
    }
    if (ok && t->api.event_set_create(&t->events) == NVML_SUCCESS) {
        /* XID events need the right to watch them (a container may refuse): without
         * them the counts stay 0 and the samples go on */
        for (int i = 0; i < n; i++)
            if (t->api.register_events(t->gpus[i].dev, nvmlEventTypeXidCriticalError,
                                       t->events) != NVML_SUCCESS) {
                t->api.event_set_free(t->events);
                t->events = NULL;
                break;
            }
    } else {
        t->events = NULL;
    }
    if (ok) {
        for (int i = 0; i < n; i++) { /* a first sample now */
            sample(&t->api, &t->gpus[i]);
            fold(&t->gpus[i]);
        }
        pthread_mutex_init(&t->mu, NULL);
        if (shlm_thread_create_unsignalled(&t->thread, sampler, t) != 0) {
            snprintf(why, whylen, "cannot start the telemetry thread");
            pthread_mutex_destroy(&t->mu);
            ok = 0;
        }
    }
    if (!ok) {
        if (t->events) t->api.event_set_free(t->events);
        t->api.shutdown();
        dlclose(t->api.lib);
        free(t->gpus);
        free(t);
        return NULL;
    }
    return t;
}

void telemetry_stop(telemetry *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL); /* at most one interval */
    if (t->events) t->api.event_set_free(t->events);
    t->api.shutdown();
    dlclose(t->api.lib);
    pthread_mutex_destroy(&t->mu);
    free(t->gpus);
    free(t);
}

int telemetry_gpu_count(const telemetry *t) { return t ? t->n : 0; }

int telemetry_window(telemetry *t, tel_gpu *out, int max) {
    if (!t) return 0;
    int n = t->n < max ? t->n : max;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < n; i++) {
        const gpu_state *g = &t->gpus[i];
        out[i] = g->win.samples ? g->win : g->latest;
        if (g->win.samples)
            for (int f = 0; f < TEL_N; f++) out[i].mean[f] = g->win.mean[f] / g->win.samples;
        else
            out[i].samples = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

void telemetry_reset_window(telemetry *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++) {
        tel_gpu *w = &t->gpus[i].win;
        w->samples = 0;
        w->throttle_reasons = 0;
    }
    pthread_mutex_unlock(&t->mu);
}

int telemetry_latest(telemetry *t, tel_gpu *out, int max) {
    if (!t) return 0;
    int n = t->n < max ? t->n : max;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < n; i++) out[i] = t->gpus[i].latest;
    pthread_mutex_unlock(&t->mu);
    return n;
}

#endif
