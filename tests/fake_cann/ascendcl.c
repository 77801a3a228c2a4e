/* libascendcl.so: runtime emulation, the single emulator state, fakecann_* API. */
#define _GNU_SOURCE
#include "fake_cann.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FC_MAX_DEVICES 64
#define FC_MAX_OPTS 16
#define FC_STREAM_MAGIC 0x5354524du

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCK() pthread_mutex_lock(&g_mu)
#define UNLOCK() pthread_mutex_unlock(&g_mu)

/* ---------------------------------------------------------------- config */
static fakecann_priv_config_t g_cfg;
static int g_cfg_ready = 0;

static void cfg_defaults(void)
{
    memset(&g_cfg, 0, sizeof g_cfg);
    snprintf(g_cfg.soc_name, sizeof g_cfg.soc_name, "%s", "Ascend910B2");
    g_cfg.device_count = 1;
    g_cfg.fail_init = 0;
    g_cfg.workspace_size = 512;
    g_cfg.check_device_ptr = 1;
    g_cfg.strict_outputs = 0;
    g_cfg.emulate_precision = 1;
    g_cfg_ready = 1;
}

__attribute__((constructor)) static void fc_init_state(void)
{
    if (!g_cfg_ready) cfg_defaults();
}

const fakecann_priv_config_t *fakecann_priv_config(void) { return &g_cfg; }

/* -------------------------------------------------------------- registry */
typedef struct {
    const void **items;
    size_t n, cap;
} ptrset_t;

static ptrset_t g_live[FAKECANN_KIND_COUNT];

typedef struct {
    char *base;
    size_t size;
    int device; /* the device whose (shared default) context owns it */
} devalloc_t;
static devalloc_t *g_allocs = NULL;
static size_t g_nallocs = 0, g_cap_allocs = 0;

static int64_t g_misuse = 0;
static int g_prepare = 0;

static void set_add(ptrset_t *s, const void *p)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        const void **ni = realloc(s->items, nc * sizeof *ni);
        if (!ni) abort();
        s->items = ni;
        s->cap = nc;
    }
    s->items[s->n++] = p;
}

static int set_find(const ptrset_t *s, const void *p)
{
    for (size_t i = s->n; i > 0; i--)
        if (s->items[i - 1] == p) return (int)(i - 1);
    return -1;
}

void fakecann_priv_register(int kind, const void *obj)
{
    if (kind < 0 || kind >= FAKECANN_KIND_COUNT || !obj) return;
    LOCK();
    set_add(&g_live[kind], obj);
    UNLOCK();
}

int fakecann_priv_unregister(int kind, const void *obj)
{
    if (kind < 0 || kind >= FAKECANN_KIND_COUNT || !obj) return 0;
    LOCK();
    ptrset_t *s = &g_live[kind];
    int i = set_find(s, obj);
    if (i >= 0) s->items[i] = s->items[--s->n];
    UNLOCK();
    return i >= 0;
}

int fakecann_priv_is_live(int kind, const void *obj)
{
    if (kind < 0 || kind >= FAKECANN_KIND_COUNT || !obj) return 0;
    LOCK();
    int r = set_find(&g_live[kind], obj) >= 0;
    UNLOCK();
    return r;
}

/* caller holds the lock */
static int find_alloc_containing(const void *p, uint64_t bytes)
{
    const char *c = (const char *)p;
    for (size_t i = 0; i < g_nallocs; i++) {
        const char *b = g_allocs[i].base;
        if (c >= b && c < b + g_allocs[i].size) {
            uint64_t room = (uint64_t)(b + g_allocs[i].size - c);
            return bytes <= room ? (int)i : -2;
        }
    }
    return -1;
}

int fakecann_priv_in_device_mem(const void *p, uint64_t bytes)
{
    if (!p) return 0;
    LOCK();
    int r = find_alloc_containing(p, bytes) >= 0;
    UNLOCK();
    return r;
}

void fakecann_priv_misuse(void)
{
    LOCK();
    g_misuse++;
    UNLOCK();
}

void fakecann_priv_count_prepare(void)
{
    LOCK();
    g_prepare++;
    UNLOCK();
}

/* ------------------------------------------------------- error messages */
static _Thread_local char *tl_pending = NULL;
static _Thread_local size_t tl_pending_len = 0;
static _Thread_local char *tl_returned = NULL;

static void push_msg(const char *msg)
{
    size_t add = strlen(msg);
    size_t need = tl_pending_len + add + 2;
    char *np = realloc(tl_pending, need);
    if (!np) return;
    tl_pending = np;
    if (tl_pending_len) tl_pending[tl_pending_len++] = '\n';
    memcpy(tl_pending + tl_pending_len, msg, add);
    tl_pending_len += add;
    tl_pending[tl_pending_len] = '\0';
}

void fakecann_priv_error(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    push_msg(buf);
}

#define ERR(...) fakecann_priv_error(__VA_ARGS__)

const char *aclGetRecentErrMsg(void)
{
    free(tl_returned);
    tl_returned = NULL;
    if (!tl_pending || tl_pending_len == 0) return NULL;
    tl_returned = tl_pending;
    tl_pending = NULL;
    tl_pending_len = 0;
    return tl_returned;
}

/* ------------------------------------------------------------ injections */
#define FC_MAX_INJ 32
typedef struct {
    char func[96];
    int code;
    int times;
} inj_t;
static inj_t g_inj[FC_MAX_INJ];

void fakecann_fail_next(const char *func, int code, int times)
{
    if (!func) return;
    LOCK();
    int slot = -1;
    for (int i = 0; i < FC_MAX_INJ; i++)
        if (g_inj[i].times > 0 && strcmp(g_inj[i].func, func) == 0) slot = i;
    if (slot < 0)
        for (int i = 0; i < FC_MAX_INJ && slot < 0; i++)
            if (g_inj[i].times <= 0) slot = i;
    if (slot >= 0) {
        if (code == 0 || times <= 0) {
            g_inj[slot].times = 0;
        } else {
            snprintf(g_inj[slot].func, sizeof g_inj[slot].func, "%s", func);
            g_inj[slot].code = code;
            g_inj[slot].times = times;
        }
    }
    UNLOCK();
}

int fakecann_priv_take_injection(const char *func)
{
    int code = 0;
    LOCK();
    for (int i = 0; i < FC_MAX_INJ; i++) {
        if (g_inj[i].times > 0 && strcmp(g_inj[i].func, func) == 0) {
            code = g_inj[i].code;
            g_inj[i].times--;
            break;
        }
    }
    UNLOCK();
    if (code) ERR("%s: injected failure %d (fakecann_fail_next)", func, code);
    return code;
}

#define INJECT(name)                                      \
    do {                                                  \
        int inj_code_ = fakecann_priv_take_injection(name); \
        if (inj_code_) return inj_code_;                  \
    } while (0)

/* --------------------------------------------------------- call records */
static fakecann_priv_record_t *g_rec = NULL;
static int g_nrec = 0, g_cap_rec = 0;

void fakecann_priv_record(const fakecann_priv_record_t *rec)
{
    LOCK();
    if (g_nrec == g_cap_rec) {
        int nc = g_cap_rec ? g_cap_rec * 2 : 64;
        fakecann_priv_record_t *n = realloc(g_rec, (size_t)nc * sizeof *n);
        if (!n) abort();
        g_rec = n;
        g_cap_rec = nc;
    }
    g_rec[g_nrec++] = *rec;
    UNLOCK();
}

static int rec_ok(int i) { return i >= 0 && i < g_nrec; }

int fakecann_call_count(void) { return g_nrec; }
int fakecann_call_op(int i) { return rec_ok(i) ? g_rec[i].op : -1; }
int64_t fakecann_call_deterministic(int i) { return rec_ok(i) ? g_rec[i].deterministic : -1; }
int fakecann_call_cube_math(int i) { return rec_ok(i) ? g_rec[i].cube_math : -1; }
int fakecann_call_mask(int i) { return rec_ok(i) ? g_rec[i].mask : -1; }
int fakecann_call_transposed(int i) { return rec_ok(i) ? g_rec[i].transposed : -1; }
int64_t fakecann_call_groups(int i) { return rec_ok(i) ? g_rec[i].groups : -1; }
int fakecann_call_dtype(int i) { return rec_ok(i) ? g_rec[i].dtype : -1; }
void *fakecann_call_stream(int i) { return rec_ok(i) ? g_rec[i].stream : NULL; }
uint64_t fakecann_call_workspace_size(int i) { return rec_ok(i) ? g_rec[i].workspace_size : 0; }
int fakecann_prepare_count(void) { return g_prepare; }

/* --------------------------------------------------------------- runtime */
static int g_initialized = 0;
static int g_refcount[FC_MAX_DEVICES];
static uint64_t g_generation[FC_MAX_DEVICES];
static int64_t g_opts[FC_MAX_DEVICES][FC_MAX_OPTS];
/* The process-level slot of each option (aclrtSetSysParamOpt / aclrtGetSysParamOpt). CANN's
 * rtCtxSetSysParamOpt writes it as well as the context's, and aclnn reads this one at phase 1
 * (ops-nn: aclrtGetSysParamOpt(ACL_OPT_DETERMINISTIC, ...)). Default 0; it outlives contexts. */
static int64_t g_proc_opts[FC_MAX_OPTS];
static int64_t g_proc_opt_writes = 0;

static _Thread_local int32_t tl_dev = -1;
static _Thread_local uint64_t tl_gen = 0;

static int64_t g_reclaimed = 0;
static void reclaim_device(int d); /* below: device memory and streams die with the context */

/* caller holds the lock */
static void kill_context(int d)
{
    g_refcount[d] = 0;
    g_generation[d]++;
    memset(g_opts[d], 0, sizeof g_opts[d]);
    reclaim_device(d);
}

/* caller holds the lock */
static int ctx_device(void)
{
    if (!g_initialized || tl_dev < 0 || tl_dev >= FC_MAX_DEVICES) return -1;
    if (g_refcount[tl_dev] <= 0 || g_generation[tl_dev] != tl_gen) return -1;
    return tl_dev;
}

int fakecann_priv_has_context(void)
{
    LOCK();
    int r = ctx_device() >= 0;
    UNLOCK();
    return r;
}

int64_t fakecann_priv_process_deterministic(void)
{
    LOCK();
    int64_t r = g_proc_opts[ACL_OPT_DETERMINISTIC];
    UNLOCK();
    return r;
}

int64_t fakecann_priv_ctx_deterministic(void)
{
    LOCK();
    int d = ctx_device();
    int64_t r = d >= 0 ? g_opts[d][ACL_OPT_DETERMINISTIC] : -1;
    UNLOCK();
    return r;
}

#define NEED_CTX(name)                                                                  \
    do {                                                                                \
        if (!fakecann_priv_has_context()) {                                             \
            ERR("%s: no current context on this thread (call aclrtSetDevice first)", name); \
            return ACL_ERROR_RT_CONTEXT_NULL;                                           \
        }                                                                               \
    } while (0)

aclError aclInit(const char *configPath)
{
    INJECT("aclInit");
    LOCK();
    int fail = g_cfg.fail_init, was = g_initialized;
    UNLOCK();
    if (fail) {
        ERR("aclInit: initialization failed (fakecann_set_fail_init(%d))", fail);
        return fail;
    }
    if (was) {
        ERR("aclInit: repeated initialization");
        return ACL_ERROR_REPEAT_INITIALIZE;
    }
    if (configPath && configPath[0] && access(configPath, R_OK) != 0) {
        ERR("aclInit: cannot read config file '%s'", configPath);
        return ACL_ERROR_INVALID_FILE;
    }
    LOCK();
    g_initialized = 1;
    UNLOCK();
    return ACL_SUCCESS;
}

static void runtime_teardown(void)
{
    g_initialized = 0;
    for (int d = 0; d < FC_MAX_DEVICES; d++)
        if (g_refcount[d] > 0) kill_context(d);
}

aclError aclFinalize(void)
{
    INJECT("aclFinalize");
    LOCK();
    if (!g_initialized) {
        UNLOCK();
        ERR("aclFinalize: not initialized");
        return ACL_ERROR_REPEAT_FINALIZE;
    }
    runtime_teardown();
    UNLOCK();
    return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId)
{
    INJECT("aclrtSetDevice");
    LOCK();
    if (!g_initialized) {
        UNLOCK();
        ERR("aclrtSetDevice: aclInit has not been called");
        return ACL_ERROR_UNINITIALIZE;
    }
    if (deviceId < 0 || (uint32_t)deviceId >= g_cfg.device_count || deviceId >= FC_MAX_DEVICES) {
        uint32_t n = g_cfg.device_count;
        UNLOCK();
        ERR("aclrtSetDevice: invalid device id %d (device count %u)", (int)deviceId, n);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    g_refcount[deviceId]++;
    tl_dev = deviceId;
    tl_gen = g_generation[deviceId];
    UNLOCK();
    return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId)
{
    INJECT("aclrtResetDevice");
    LOCK();
    if (deviceId < 0 || (uint32_t)deviceId >= g_cfg.device_count || deviceId >= FC_MAX_DEVICES) {
        UNLOCK();
        ERR("aclrtResetDevice: invalid device id %d", (int)deviceId);
        return ACL_ERROR_RT_INVALID_DEVICEID;
    }
    if (g_refcount[deviceId] > 0 && --g_refcount[deviceId] == 0) kill_context(deviceId);
    if (tl_dev == deviceId) tl_dev = -1;
    UNLOCK();
    return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t *deviceId)
{
    INJECT("aclrtGetDevice");
    if (!deviceId) {
        ERR("aclrtGetDevice: deviceId is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    NEED_CTX("aclrtGetDevice");
    *deviceId = tl_dev;
    return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t *count)
{
    INJECT("aclrtGetDeviceCount");
    if (!count) {
        ERR("aclrtGetDeviceCount: count is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    *count = g_cfg.device_count;
    return ACL_SUCCESS;
}

typedef struct {
    uint32_t magic;
    int32_t device;
} fc_stream_t;

aclError aclrtCreateStream(aclrtStream *stream)
{
    INJECT("aclrtCreateStream");
    if (!stream) {
        ERR("aclrtCreateStream: stream is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    NEED_CTX("aclrtCreateStream");
    fc_stream_t *s = calloc(1, sizeof *s);
    if (!s) return ACL_ERROR_RT_MEMORY_ALLOCATION;
    s->magic = FC_STREAM_MAGIC;
    s->device = tl_dev;
    fakecann_priv_register(FAKECANN_KIND_STREAM, s);
    *stream = s;
    return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream)
{
    INJECT("aclrtDestroyStream");
    if (!stream) {
        ERR("aclrtDestroyStream: stream is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (!fakecann_priv_unregister(FAKECANN_KIND_STREAM, stream)) {
        fakecann_priv_misuse();
        ERR("aclrtDestroyStream: %p is not a live stream", stream);
        return ACL_ERROR_INVALID_PARAM;
    }
    free(stream);
    return ACL_SUCCESS;
}

aclError aclrtSynchronizeStream(aclrtStream stream)
{
    INJECT("aclrtSynchronizeStream");
    NEED_CTX("aclrtSynchronizeStream");
    if (stream && !fakecann_priv_is_live(FAKECANN_KIND_STREAM, stream)) {
        fakecann_priv_misuse();
        ERR("aclrtSynchronizeStream: %p is not a live stream", stream);
        return ACL_ERROR_INVALID_PARAM;
    }
    return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void)
{
    INJECT("aclrtSynchronizeDevice");
    NEED_CTX("aclrtSynchronizeDevice");
    return ACL_SUCCESS;
}

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    INJECT("aclrtMalloc");
    if (!devPtr) {
        ERR("aclrtMalloc: devPtr is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (size == 0) {
        ERR("aclrtMalloc: size must be > 0");
        return ACL_ERROR_INVALID_PARAM;
    }
    if ((int)policy < 0) {
        ERR("aclrtMalloc: invalid policy %d", (int)policy);
        return ACL_ERROR_INVALID_PARAM;
    }
    NEED_CTX("aclrtMalloc");
    void *p = NULL;
    size_t rounded = (size + 31) & ~(size_t)31;
    if (rounded < size || posix_memalign(&p, 512, rounded) != 0 || !p) {
        ERR("aclrtMalloc: out of memory (%zu bytes)", size);
        return ACL_ERROR_RT_MEMORY_ALLOCATION;
    }
    memset(p, 0xFF, rounded);
    LOCK();
    if (g_nallocs == g_cap_allocs) {
        size_t nc = g_cap_allocs ? g_cap_allocs * 2 : 64;
        devalloc_t *n = realloc(g_allocs, nc * sizeof *n);
        if (!n) abort();
        g_allocs = n;
        g_cap_allocs = nc;
    }
    g_allocs[g_nallocs].base = p;
    g_allocs[g_nallocs].size = size;
    g_allocs[g_nallocs].device = tl_dev;
    g_nallocs++;
    UNLOCK();
    *devPtr = p;
    return ACL_SUCCESS;
}

/* Freed blocks are poisoned and kept for a while so that their addresses are
 * not handed out again at once: use-after-free between the two aclnn phases
 * is then reliably detected.  Caller holds the lock. */
#define FC_QUARANTINE_BLOCKS 256
#define FC_QUARANTINE_BYTES ((size_t)64 << 20)
static void *g_quar[FC_QUARANTINE_BLOCKS];
static size_t g_quar_size[FC_QUARANTINE_BLOCKS];
static size_t g_quar_head = 0, g_quar_n = 0, g_quar_bytes = 0;

static void quarantine(void *p, size_t size)
{
    memset(p, 0xDB, size);
    while (g_quar_n > 0 && (g_quar_n == FC_QUARANTINE_BLOCKS || g_quar_bytes + size > FC_QUARANTINE_BYTES)) {
        free(g_quar[g_quar_head]);
        g_quar_bytes -= g_quar_size[g_quar_head];
        g_quar_head = (g_quar_head + 1) % FC_QUARANTINE_BLOCKS;
        g_quar_n--;
    }
    if (size > FC_QUARANTINE_BYTES) {
        free(p);
        return;
    }
    size_t slot = (g_quar_head + g_quar_n) % FC_QUARANTINE_BLOCKS;
    g_quar[slot] = p;
    g_quar_size[slot] = size;
    g_quar_bytes += size;
    g_quar_n++;
}

aclError aclrtFree(void *devPtr)
{
    INJECT("aclrtFree");
    if (!devPtr) {
        ERR("aclrtFree: devPtr is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    NEED_CTX("aclrtFree"); /* like aclrtMalloc: the runtime frees through the current context */
    LOCK();
    size_t i;
    for (i = 0; i < g_nallocs; i++)
        if (g_allocs[i].base == (char *)devPtr) break;
    if (i == g_nallocs) {
        g_misuse++;
        UNLOCK();
        ERR("aclrtFree: %p is not the start of a live device allocation", devPtr);
        return ACL_ERROR_INVALID_PARAM;
    }
    size_t sz = g_allocs[i].size;
    g_allocs[i] = g_allocs[--g_nallocs];
    quarantine(devPtr, sz);
    UNLOCK();
    return ACL_SUCCESS;
}

/* caller holds the lock: what a device's context owned dies with it (CANN frees a device's memory and
 * streams when its reference count reaches 0). Counted by fakecann_reclaimed_count(). */
static void reclaim_device(int d)
{
    for (size_t i = 0; i < g_nallocs;) {
        if (g_allocs[i].device == d) {
            quarantine(g_allocs[i].base, g_allocs[i].size);
            g_allocs[i] = g_allocs[--g_nallocs];
            g_reclaimed++;
        } else {
            i++;
        }
    }
    ptrset_t *st = &g_live[FAKECANN_KIND_STREAM];
    for (size_t i = 0; i < st->n;) {
        fc_stream_t *stream = (fc_stream_t *)st->items[i];
        if (stream->device == d) {
            st->items[i] = st->items[--st->n];
            free(stream);
            g_reclaimed++;
        } else {
            i++;
        }
    }
}

int64_t fakecann_reclaimed_count(void) { return g_reclaimed; }

/* caller holds no lock */
static aclError check_side(const char *fn, const char *what, const void *p, size_t count, int dev)
{
    if (!g_cfg.check_device_ptr) return ACL_SUCCESS;
    LOCK();
    int r = find_alloc_containing(p, count);
    UNLOCK();
    if (dev && r < 0) {
        if (r == -2)
            ERR("%s: %s range [%p, +%zu) runs past the end of its device allocation", fn, what, p, count);
        else
            ERR("%s: %s %p is not device memory (wrong memcpy kind?)", fn, what, p);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (!dev && r != -1) {
        ERR("%s: %s %p is device memory but the copy kind says host", fn, what, p);
        return ACL_ERROR_INVALID_PARAM;
    }
    return ACL_SUCCESS;
}

static aclError do_memcpy(const char *fn, void *dst, size_t destMax, const void *src, size_t count,
                          aclrtMemcpyKind kind)
{
    NEED_CTX(fn);
    if (!dst || !src) {
        ERR("%s: %s is NULL", fn, dst ? "src" : "dst");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count > destMax) {
        ERR("%s: count %zu exceeds destMax %zu", fn, count, destMax);
        return ACL_ERROR_INVALID_PARAM;
    }
    if ((int)kind < 0 || (int)kind > 3) {
        ERR("%s: invalid memcpy kind %d", fn, (int)kind);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count == 0) return ACL_SUCCESS;
    int dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    int src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    aclError e = check_side(fn, "dst", dst, count, dst_dev);
    if (e) return e;
    e = check_side(fn, "src", src, count, src_dev);
    if (e) return e;
    memmove(dst, src, count);
    return ACL_SUCCESS;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    INJECT("aclrtMemcpy");
    return do_memcpy("aclrtMemcpy", dst, destMax, src, count, kind);
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                          aclrtMemcpyKind kind, aclrtStream stream)
{
    INJECT("aclrtMemcpyAsync");
    if (stream && !fakecann_priv_is_live(FAKECANN_KIND_STREAM, stream)) {
        fakecann_priv_misuse();
        ERR("aclrtMemcpyAsync: %p is not a live stream", stream);
        return ACL_ERROR_INVALID_PARAM;
    }
    return do_memcpy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    INJECT("aclrtMemset");
    NEED_CTX("aclrtMemset");
    if (!devPtr) {
        ERR("aclrtMemset: devPtr is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count > maxCount) {
        ERR("aclrtMemset: count %zu exceeds maxCount %zu", count, maxCount);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (count == 0) return ACL_SUCCESS;
    aclError e = check_side("aclrtMemset", "devPtr", devPtr, count, 1);
    if (e) return e;
    memset(devPtr, value, count);
    return ACL_SUCCESS;
}

aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    INJECT("aclrtCtxSetSysParamOpt");
    NEED_CTX("aclrtCtxSetSysParamOpt");
    if ((int)opt < 0 || (int)opt >= FC_MAX_OPTS) {
        ERR("aclrtCtxSetSysParamOpt: invalid option %d", (int)opt);
        return ACL_ERROR_INVALID_PARAM;
    }
    if (opt == ACL_OPT_DETERMINISTIC && value != 0 && value != 1) {
        ERR("aclrtCtxSetSysParamOpt: ACL_OPT_DETERMINISTIC value must be 0 or 1, got %lld",
            (long long)value);
        return ACL_ERROR_INVALID_PARAM;
    }
    LOCK();
    int d = ctx_device();
    if (d >= 0) g_opts[d][opt] = value;
    g_proc_opts[opt] = value;   /* rtCtxSetSysParamOpt also writes the process-level slot */
    g_proc_opt_writes++;
    UNLOCK();
    return ACL_SUCCESS;
}

static int bad_opt(const char *fn, aclSysParamOpt opt, int64_t value, int setting)
{
    if ((int)opt < 0 || (int)opt >= FC_MAX_OPTS) {
        ERR("%s: invalid option %d", fn, (int)opt);
        return 1;
    }
    if (setting && opt == ACL_OPT_DETERMINISTIC && value != 0 && value != 1) {
        ERR("%s: ACL_OPT_DETERMINISTIC value must be 0 or 1, got %lld", fn, (long long)value);
        return 1;
    }
    return 0;
}

/* Process-level: no context needed; unset options read as their default, 0. */
aclError aclrtSetSysParamOpt(aclSysParamOpt opt, int64_t value)
{
    INJECT("aclrtSetSysParamOpt");
    if (bad_opt("aclrtSetSysParamOpt", opt, value, 1)) return ACL_ERROR_INVALID_PARAM;
    LOCK();
    g_proc_opts[opt] = value;
    g_proc_opt_writes++;
    UNLOCK();
    return ACL_SUCCESS;
}

aclError aclrtGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    INJECT("aclrtGetSysParamOpt");
    if (!value) {
        ERR("aclrtGetSysParamOpt: value is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    if (bad_opt("aclrtGetSysParamOpt", opt, 0, 0)) return ACL_ERROR_INVALID_PARAM;
    LOCK();
    *value = g_proc_opts[opt];
    UNLOCK();
    return ACL_SUCCESS;
}

int64_t fakecann_get_process_deterministic(void) { return fakecann_priv_process_deterministic(); }
int64_t fakecann_process_option_writes(void) { return g_proc_opt_writes; }

aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t *value)
{
    INJECT("aclrtCtxGetSysParamOpt");
    if (!value) {
        ERR("aclrtCtxGetSysParamOpt: value is NULL");
        return ACL_ERROR_INVALID_PARAM;
    }
    NEED_CTX("aclrtCtxGetSysParamOpt");
    if ((int)opt < 0 || (int)opt >= FC_MAX_OPTS) {
        ERR("aclrtCtxGetSysParamOpt: invalid option %d", (int)opt);
        return ACL_ERROR_INVALID_PARAM;
    }
    LOCK();
    int d = ctx_device();
    *value = d >= 0 ? g_opts[d][opt] : 0;
    UNLOCK();
    return ACL_SUCCESS;
}

const char *aclrtGetSocName(void)
{
    if (fakecann_priv_take_injection("aclrtGetSocName")) return NULL;
    if (!g_initialized) return NULL;
    return g_cfg.soc_name;
}

/* ------------------------------------------------------- the marker (not CANN) */
const char *xconv_cann_emulator(void)
{
    return "xconv CANN emulator (tests/fake_cann): a CPU emulation, not Ascend hardware";
}

/* ------------------------------------------------------- fakecann_* API */
int64_t fakecann_live_count(int kind)
{
    if (kind < 0 || kind >= FAKECANN_KIND_COUNT) return -1;
    LOCK();
    int64_t r = kind == FAKECANN_KIND_DEVICE_MEM ? (int64_t)g_nallocs : (int64_t)g_live[kind].n;
    UNLOCK();
    return r;
}

int64_t fakecann_live_objects(void)
{
    int64_t t = 0;
    for (int k = 0; k < FAKECANN_KIND_COUNT; k++) t += fakecann_live_count(k);
    return t;
}

uint64_t fakecann_live_device_bytes(void)
{
    uint64_t t = 0;
    LOCK();
    for (size_t i = 0; i < g_nallocs; i++) t += g_allocs[i].size;
    UNLOCK();
    return t;
}

int64_t fakecann_misuse_count(void) { return g_misuse; }

void fakecann_set_soc_name(const char *name)
{
    LOCK();
    snprintf(g_cfg.soc_name, sizeof g_cfg.soc_name, "%s", name ? name : "");
    UNLOCK();
}
const char *fakecann_get_soc_name(void) { return g_cfg.soc_name; }
void fakecann_set_device_count(uint32_t count)
{
    g_cfg.device_count = count > FC_MAX_DEVICES ? FC_MAX_DEVICES : count;
}
void fakecann_set_fail_init(int err) { g_cfg.fail_init = err; }
void fakecann_set_workspace_size(uint64_t size) { g_cfg.workspace_size = size; }
void fakecann_set_check_device_ptr(int on) { g_cfg.check_device_ptr = on ? 1 : 0; }
void fakecann_set_strict_outputs(int on) { g_cfg.strict_outputs = on ? 1 : 0; }
void fakecann_set_emulate_precision(int on) { g_cfg.emulate_precision = on ? 1 : 0; }
void fakecann_set_phase1_delay_us(uint32_t us) { g_cfg.phase1_delay_us = us; }

int fakecann_is_initialized(void) { return g_initialized; }
int fakecann_device_refcount(int32_t deviceId)
{
    if (deviceId < 0 || deviceId >= FC_MAX_DEVICES) return -1;
    return g_refcount[deviceId];
}
int32_t fakecann_current_device(void)
{
    LOCK();
    int d = ctx_device();
    UNLOCK();
    return d;
}
int64_t fakecann_get_deterministic(int32_t deviceId)
{
    if (deviceId < 0 || deviceId >= FC_MAX_DEVICES) return -1;
    return g_opts[deviceId][ACL_OPT_DETERMINISTIC];
}

void fakecann_reset(void)
{
    LOCK();
    g_nrec = 0;
    g_reclaimed = 0;
    g_misuse = 0;
    g_prepare = 0;
    memset(g_inj, 0, sizeof g_inj);
    cfg_defaults();
    UNLOCK();
    free(tl_pending);
    tl_pending = NULL;
    tl_pending_len = 0;
}

void fakecann_reset_runtime(void)
{
    LOCK();
    runtime_teardown();
    memset(g_proc_opts, 0, sizeof g_proc_opts);
    g_proc_opt_writes = 0;
    UNLOCK();
    tl_dev = -1;
}
