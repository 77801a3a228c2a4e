/*
 * fake_cann.h - ABI-faithful emulator of the parts of Huawei CANN used by a
 * ctypes shim over aclnnConvolutionBackward / aclnnConvolution.
 *
 * Written from the public CANN documentation (see shared/reference/cann-abi.md);
 * no CANN code is used.  Three shared libraries are built from these sources:
 *
 *   libascendcl.so  runtime (aclInit, aclrt*) + ALL emulator state + the
 *                   fakecann_* test-control API (section 4 below)
 *   libnnopbase.so  aclCreateTensor / aclCreateIntArray / aclCreateBoolArray ...
 *   libopapi.so     aclnnConvolutionBackward*, aclnnConvolution*
 *
 * libnnopbase.so and libopapi.so are linked against libascendcl.so with
 * rpath $ORIGIN, so whichever library is loaded first, a process has exactly
 * one emulator state.
 */
#ifndef FAKE_CANN_H
#define FAKE_CANN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FC_API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* 1. Public CANN types, enums and status codes (values from cann-abi.md)    */
/* ------------------------------------------------------------------------ */
typedef int aclError;
typedef int aclnnStatus;
typedef void *aclrtStream;

typedef struct aclTensor aclTensor;
typedef struct aclIntArray aclIntArray;
typedef struct aclBoolArray aclBoolArray;
typedef struct aclOpExecutor aclOpExecutor;

typedef enum {
    ACL_DT_UNDEFINED = -1,
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_INT8 = 2,
    ACL_INT32 = 3,
    ACL_UINT8 = 4,
    ACL_INT16 = 6,
    ACL_UINT16 = 7,
    ACL_UINT32 = 8,
    ACL_INT64 = 9,
    ACL_UINT64 = 10,
    ACL_DOUBLE = 11,
    ACL_BOOL = 12,
    ACL_BF16 = 27
} aclDataType;

typedef enum {
    ACL_FORMAT_UNDEFINED = -1,
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_NHWC = 1,
    ACL_FORMAT_ND = 2,
    ACL_FORMAT_NC1HWC0 = 3,
    ACL_FORMAT_FRACTAL_Z = 4,
    ACL_FORMAT_NDHWC = 27,
    ACL_FORMAT_NCDHW = 30,
    ACL_FORMAT_NCL = 47
} aclFormat;

typedef enum { ACL_OPT_DETERMINISTIC = 0 } aclSysParamOpt;

typedef enum {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3
} aclrtMemcpyKind;

typedef enum { ACL_MEM_MALLOC_HUGE_FIRST = 0 } aclrtMemMallocPolicy;

/* cubeMathType (int8_t) */
#define FC_KEEP_DTYPE 0
#define FC_ALLOW_FP32_DOWN_PRECISION 1
#define FC_USE_FP16 2
#define FC_USE_HF32 3

/* aclError (runtime) */
#define ACL_SUCCESS 0
#define ACL_ERROR_INVALID_PARAM 100000
#define ACL_ERROR_UNINITIALIZE 100001
#define ACL_ERROR_REPEAT_INITIALIZE 100002
#define ACL_ERROR_INVALID_FILE 100003
#define ACL_ERROR_REPEAT_FINALIZE 100037
#define ACL_ERROR_RT_PARAM_INVALID 107000
#define ACL_ERROR_RT_INVALID_DEVICEID 107001
#define ACL_ERROR_RT_CONTEXT_NULL 107002
#define ACL_ERROR_RT_MEMORY_ALLOCATION 207001

/* aclnnStatus */
#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_INNER_NULLPTR 561103

/* ------------------------------------------------------------------------ */
/* 2. Exported CANN API (exact signatures)                                   */
/* ------------------------------------------------------------------------ */
/* libascendcl.so */
FC_API aclError aclInit(const char *configPath);
FC_API aclError aclFinalize(void);
FC_API aclError aclrtSetDevice(int32_t deviceId);
FC_API aclError aclrtResetDevice(int32_t deviceId);
FC_API aclError aclrtGetDevice(int32_t *deviceId);
FC_API aclError aclrtGetDeviceCount(uint32_t *count);
FC_API aclError aclrtCreateStream(aclrtStream *stream);
FC_API aclError aclrtDestroyStream(aclrtStream stream);
FC_API aclError aclrtSynchronizeStream(aclrtStream stream);
FC_API aclError aclrtSynchronizeDevice(void);
FC_API aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
FC_API aclError aclrtFree(void *devPtr);
FC_API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                            aclrtMemcpyKind kind);
FC_API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                 aclrtMemcpyKind kind, aclrtStream stream);
FC_API aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count);
FC_API aclError aclrtCtxSetSysParamOpt(aclSysParamOpt opt, int64_t value);
FC_API aclError aclrtCtxGetSysParamOpt(aclSysParamOpt opt, int64_t *value);
/* Process level (acl_rt.h: "set/get system param option value in current process") */
FC_API aclError aclrtSetSysParamOpt(aclSysParamOpt opt, int64_t value);
FC_API aclError aclrtGetSysParamOpt(aclSysParamOpt opt, int64_t *value);
FC_API const char *aclGetRecentErrMsg(void);
FC_API const char *aclrtGetSocName(void);

/* libnnopbase.so */
FC_API aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
                                  aclDataType dataType, const int64_t *stride, int64_t offset,
                                  aclFormat format, const int64_t *storageDims,
                                  uint64_t storageDimsNum, void *tensorData);
FC_API aclnnStatus aclDestroyTensor(const aclTensor *tensor);
FC_API aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size);
FC_API aclnnStatus aclDestroyIntArray(const aclIntArray *array);
FC_API aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size);
FC_API aclnnStatus aclDestroyBoolArray(const aclBoolArray *array);

/* libopapi.so */
FC_API aclnnStatus aclnnConvolutionBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *input, const aclTensor *weight,
    const aclIntArray *biasSizes, const aclIntArray *stride, const aclIntArray *padding,
    const aclIntArray *dilation, bool transposed, const aclIntArray *outputPadding, int groups,
    const aclBoolArray *outputMask, int8_t cubeMathType, aclTensor *gradInput,
    aclTensor *gradWeight, aclTensor *gradBias, uint64_t *workspaceSize,
    aclOpExecutor **executor);
FC_API aclnnStatus aclnnConvolutionBackward(void *workspace, uint64_t workspaceSize,
                                            aclOpExecutor *executor, aclrtStream stream);
FC_API aclnnStatus aclnnConvolutionGetWorkspaceSize(
    const aclTensor *input, const aclTensor *weight, const aclTensor *bias,
    const aclIntArray *stride, const aclIntArray *padding, const aclIntArray *dilation,
    bool transposed, const aclIntArray *outputPadding, const int64_t groups, aclTensor *output,
    int8_t cubeMathType, uint64_t *workspaceSize, aclOpExecutor **executor);
FC_API aclnnStatus aclnnConvolution(void *workspace, const uint64_t workspaceSize,
                                    aclOpExecutor *executor, aclrtStream stream);

/* ------------------------------------------------------------------------ */
/* 3. Emulator behaviour (what a shim author must know)                      */
/* ------------------------------------------------------------------------ */
/*
 * Runtime
 *  - aclrtSetDevice needs aclInit first (else 100001) and a device id in
 *    [0, device_count) (else 107001).  It makes the device's default context,
 *    shared by every thread, *current on the calling thread* (like real CANN):
 *    a thread that did not call aclrtSetDevice gets 107002 from aclrtMalloc /
 *    aclrtFree / aclrtCreateStream / aclrtMemcpy(Async) / aclrtMemset /
 *    aclrtCtxSet/GetSysParamOpt / aclrtGetDevice / aclrtSynchronize* and from
 *    the second phase of the aclnn ops.  Set/Reset are reference counted per
 *    device; when the count drops to 0 (or on aclFinalize) the context dies:
 *    its options return to 0 and its device memory and streams are reclaimed
 *    (fakecann_reclaimed_count()); using them afterwards is misuse.
 *  - ACL_OPT_DETERMINISTIC also has a process-level slot (aclrtSetSysParamOpt /
 *    aclrtGetSysParamOpt, no context needed, default 0, outlives contexts).
 *    aclrtCtxSetSysParamOpt writes it as well as the context's (CANN runtime
 *    rtCtxSetSysParamOpt), and the aclnn ops read it at phase 1 (ops-nn calls
 *    aclrtGetSysParamOpt): fakecann_call_deterministic() is that reading.
 *  - Device memory is host memory, tracked per allocation, filled with 0xFF
 *    bytes (NaN in every float type) on allocation: never rely on zeroed
 *    device memory.  aclrtMalloc rejects size 0 (100000).  aclrtFree of NULL
 *    or of a pointer that is not the base of a live allocation -> 100000.
 *  - aclrtMemcpy: count > destMax, NULL pointers, kind outside 0..3 -> 100000.
 *    The device side(s) of the copy must lie inside one live allocation and
 *    the host side(s) must NOT lie in device memory (catches a wrong kind).
 *  - aclGetRecentErrMsg returns the messages pushed on the calling thread
 *    since the last call (newline separated) and clears them, or NULL.
 *    The returned string stays valid until the next call on that thread.
 *  - aclrtGetSocName returns NULL before aclInit.
 *
 * nnopbase
 *  - aclCreate* return NULL (and push a message) for bad arguments
 *    (NULL arrays with nonzero length, negative dims/offset, > 8 dims).
 *  - aclDestroy*(NULL) returns 0; destroying an unknown or already destroyed
 *    object returns 161002 and bumps fakecann_misuse_count().
 *
 * aclnn ops
 *  - Phase 1 validates everything (161001 for NULL required pointers, 161002
 *    otherwise, always with a message naming the parameter).  Required:
 *    gradOutput, input, weight, stride, padding, dilation, outputPadding,
 *    outputMask, gradInput, gradWeight, workspaceSize, executor; biasSizes
 *    and gradBias are required only when outputMask[2] is true.  Outputs
 *    whose mask bit is false are never read, written or shape-checked.
 *  - Tensor data must lie inside device memory from aclrtMalloc (checked in
 *    both phases, so freeing a buffer between the phases is caught), all
 *    accessed elements must lie inside the declared storage, strides >= 0.
 *  - Phase 1 returns workspace size fakecann workspace_size (default 512) and
 *    a fresh executor; phase 2 consumes (frees) the executor, also when it
 *    fails; it needs workspace != NULL and workspaceSize >= requested
 *    (161002), a current context (107002), stream NULL or live (161002), and
 *    every tensor of phase 1 still alive (161002).  It fills the workspace
 *    with garbage before computing.
 *  - Precision: with emulate_precision on (default), float32 inputs are
 *    rounded as the cube unit would: cubeMathType 1 -> HF32 (11-bit
 *    mantissa) on Ascend910B/910_93 and other SoCs, FP16 on older series;
 *    2 -> FP16; 3 -> HF32.  Accumulation in double, output rounded (RNE) to
 *    the tensor dtype.
 */

/* ------------------------------------------------------------------------ */
/* 4. Test-only control API (exported by libascendcl.so)                     */
/* ------------------------------------------------------------------------ */
enum {
    FAKECANN_KIND_TENSOR = 0,
    FAKECANN_KIND_INT_ARRAY = 1,
    FAKECANN_KIND_BOOL_ARRAY = 2,
    FAKECANN_KIND_EXECUTOR = 3,
    FAKECANN_KIND_DEVICE_MEM = 4,
    FAKECANN_KIND_STREAM = 5,
    FAKECANN_KIND_COUNT = 6
};

/* The emulator's marker: a symbol real CANN lacks. It returns what the emulator is, in words; the
 * xconv Ascend backend looks for it in every library it loads and labels results "emulated" (the
 * devices, bundle manifests, compare output and reports say so). Everything else keeps CANN's ABI:
 * aclrtGetSocName still returns the emulated SoC ("Ascend910B2"), which selects the SoC's rules. */
#define FAKECANN_MARKER "xconv_cann_emulator"
FC_API const char *xconv_cann_emulator(void);

/* op codes of the call records */
#define FAKECANN_OP_CONV_BACKWARD 1
#define FAKECANN_OP_CONV_FORWARD 2

/* live objects: total over all kinds / one kind (-1 for a bad kind) */
FC_API int64_t fakecann_live_objects(void);
FC_API int64_t fakecann_live_count(int kind);
FC_API uint64_t fakecann_live_device_bytes(void);
/* destroy/free of unknown or already freed objects, phase 2 with a dead executor */
FC_API int64_t fakecann_misuse_count(void);

/* configuration (fakecann_reset restores the defaults shown) */
FC_API void fakecann_set_soc_name(const char *name); /* "Ascend910B2" */
FC_API const char *fakecann_get_soc_name(void);
FC_API void fakecann_set_device_count(uint32_t count); /* 1; 0 -> aclrtSetDevice fails */
FC_API void fakecann_set_fail_init(int err);            /* 0; else aclInit returns err */
FC_API void fakecann_set_workspace_size(uint64_t size); /* 512 */
FC_API void fakecann_set_check_device_ptr(int on);      /* 1 */
FC_API void fakecann_set_strict_outputs(int on);        /* 0; 1: reject non-contiguous outputs */
FC_API void fakecann_set_emulate_precision(int on);     /* 1 */
/* make the next `times` calls of exported function `func` fail with `code`
 * (pointer-returning functions return NULL; an aclnn phase 2 still consumes
 * its executor).  code 0 or times 0 removes the injection for func. */
FC_API void fakecann_fail_next(const char *func, int code, int times);

/* runtime state */
FC_API int fakecann_is_initialized(void);
FC_API int fakecann_device_refcount(int32_t deviceId);
FC_API int32_t fakecann_current_device(void); /* calling thread, -1 if no valid context */
FC_API int64_t fakecann_get_deterministic(int32_t deviceId);
/* The process-level ACL_OPT_DETERMINISTIC (what aclnn phase 1 reads), and how many times any
 * process-level option was written (aclrtSetSysParamOpt, aclrtCtxSetSysParamOpt). */
FC_API int64_t fakecann_get_process_deterministic(void);
FC_API void fakecann_set_phase1_delay_us(uint32_t us);
/* Device allocations and streams destroyed with their context (a device reset to refcount 0)
 * since the last fakecann_reset(): what a caller still holding them has lost. */
FC_API int64_t fakecann_reclaimed_count(void);
FC_API int64_t fakecann_process_option_writes(void);

/* records of successful-or-not aclnn phase-2 calls that reached execution */
FC_API int fakecann_call_count(void);
FC_API int fakecann_call_op(int i); /* FAKECANN_OP_*; -1 if i out of range */
FC_API int64_t fakecann_call_deterministic(int i);
FC_API int fakecann_call_cube_math(int i);
FC_API int fakecann_call_mask(int i); /* bit0 gradInput, bit1 gradWeight, bit2 gradBias */
FC_API int fakecann_call_transposed(int i);
FC_API int64_t fakecann_call_groups(int i);
FC_API int fakecann_call_dtype(int i);
FC_API void *fakecann_call_stream(int i);
FC_API uint64_t fakecann_call_workspace_size(int i);
FC_API int fakecann_prepare_count(void); /* successful phase-1 calls since reset */

/* clear records, misuse count, injections, the calling thread's pending
 * error messages, and restore the configuration defaults.  Live objects and
 * the init/device state are kept. */
FC_API void fakecann_reset(void);
/* forget aclInit and every device context (as aclFinalize would), so that a
 * test can exercise aclInit again.  Live objects are kept. */
FC_API void fakecann_reset_runtime(void);

/* ------------------------------------------------------------------------ */
/* 5. Internal: shared between the three libraries, not for tests            */
/* ------------------------------------------------------------------------ */
#define FC_MAX_DIMS 8

struct aclTensor {
    uint32_t magic;
    uint64_t ndim;
    int64_t dims[FC_MAX_DIMS];
    int64_t strides[FC_MAX_DIMS];
    int64_t offset;
    int dtype;
    int format;
    uint64_t sndim;
    int64_t sdims[FC_MAX_DIMS];
    void *data;
};

struct aclIntArray {
    uint32_t magic;
    uint64_t size;
    int64_t *values;
};

struct aclBoolArray {
    uint32_t magic;
    uint64_t size;
    bool *values;
};

typedef struct {
    char soc_name[64];
    uint32_t device_count;
    int fail_init;
    uint64_t workspace_size;
    int check_device_ptr;
    int strict_outputs;
    int emulate_precision;
    uint32_t phase1_delay_us; /* sleep at phase 1 before reading the options (widens races in tests) */
} fakecann_priv_config_t;

typedef struct {
    int op;
    int64_t deterministic;
    int cube_math;
    int mask;
    int transposed;
    int64_t groups;
    int dtype;
    void *stream;
    uint64_t workspace_size;
} fakecann_priv_record_t;

FC_API const fakecann_priv_config_t *fakecann_priv_config(void);
FC_API void fakecann_priv_register(int kind, const void *obj);
FC_API int fakecann_priv_unregister(int kind, const void *obj); /* 1 if it was live */
FC_API int fakecann_priv_is_live(int kind, const void *obj);
/* 1 if [p, p+bytes) lies inside one live device allocation */
FC_API int fakecann_priv_in_device_mem(const void *p, uint64_t bytes);
FC_API void fakecann_priv_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
FC_API int fakecann_priv_take_injection(const char *func); /* code or 0 */
FC_API int fakecann_priv_has_context(void);
/* deterministic flag of the calling thread's context, -1 without context */
FC_API int64_t fakecann_priv_ctx_deterministic(void);
FC_API int64_t fakecann_priv_process_deterministic(void);
FC_API void fakecann_priv_record(const fakecann_priv_record_t *rec);
FC_API void fakecann_priv_count_prepare(void);
FC_API void fakecann_priv_misuse(void);

#ifdef __cplusplus
}
#endif
#endif /* FAKE_CANN_H */
