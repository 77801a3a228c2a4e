"""The CANN ABI as the Ascend backend declares it: constants, status names, ctypes signatures.

Data only, as in CANN's public headers (``acl/acl_rt.h``, ``acl/acl_base_rt.h``,
``aclnn/acl_meta.h``, ``aclnnop/aclnn_convolution*.h``; ``shared/reference/cann-abi.md``).
:mod:`.driver` applies :data:`SIGNATURES` to the loaded libraries.
"""

from __future__ import annotations

from ctypes import POINTER, c_bool, c_char_p, c_int, c_int8, c_int32, c_int64, c_size_t, c_uint32, c_uint64
from ctypes import c_void_p

LIBRARIES = ("ascendcl", "nnopbase", "opapi")  # SIGNATURES groups, in load order

# acl_base_rt.h / rt_error_codes.h (aclError) and the aclnn return codes (aclnnStatus)
ACL_SUCCESS = 0
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_RT_SYSPARAMOPT_NOT_SET = 107021
ACL_OPT_DETERMINISTIC = 0                      # aclSysParamOpt
ACL_MEM_MALLOC_HUGE_FIRST = 0                  # aclrtMemMallocPolicy
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2  # aclrtMemcpyKind

#: Status code -> name. aclError values from hicann/runtime include/external/acl/acl_base_rt.h and
#: error_codes/rt_error_codes.h; aclnnStatus values from the "aclnn返回码" table of the CANN op docs.
STATUS_NAMES = {
    0: "ACL_SUCCESS",
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    200000: "ACL_ERROR_BAD_ALLOC",
    200001: "ACL_ERROR_API_NOT_SUPPORT",
    200002: "ACL_ERROR_INVALID_DEVICE",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    107003: "ACL_ERROR_RT_STREAM_CONTEXT",
    107021: "ACL_ERROR_RT_SYSPARAMOPT_NOT_SET",
    207000: "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    207002: "ACL_ERROR_RT_MEMORY_FREE",
    207004: "ACL_ERROR_RT_NO_DEVICE",
    507033: "ACL_ERROR_RT_DEV_SETUP_ERROR",
    507899: "ACL_ERROR_RT_DRV_INTERNAL_ERROR",
    161001: "ACLNN_ERR_PARAM_NULLPTR",
    161002: "ACLNN_ERR_PARAM_INVALID",
    361001: "ACLNN_ERR_RUNTIME_ERROR",
    561000: "ACLNN_ERR_INNER",
    561001: "ACLNN_ERR_INNER_INFERSHAPE_ERROR",
    561002: "ACLNN_ERR_INNER_TILING_ERROR",
    561003: "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
    561101: "ACLNN_ERR_INNER_CREATE_EXECUTOR",
    561102: "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR",
    561103: "ACLNN_ERR_INNER_NULLPTR",
    561104: "ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE",
    561105: "ACLNN_ERR_INNER_KEY_CONFLICT",
    561106: "ACLNN_ERR_INNER_INVALID_IMPL_MODE",
    561107: "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
    561108: "ACLNN_ERR_INNER_LOAD_JSON_FAILED",
    561109: "ACLNN_ERR_INNER_JSON_VALUE_NOT_FOUND",
    561110: "ACLNN_ERR_INNER_JSON_FORMAT_INVALID",
    561111: "ACLNN_ERR_INNER_JSON_DTYPE_INVALID",
    561112: "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND",
    561113: "ACLNN_ERR_INNER_OP_FILE_INVALID",
}


def status_name(status: int) -> str:
    """The name of an aclError/aclnnStatus code, or ``"status N"`` for one the table does not know."""
    return STATUS_NAMES.get(int(status), f"status {int(status)}")


def describe_status(status: int) -> str:
    """``"NAME (code)"``, or ``"status code"`` for an unknown code."""
    status = int(status)
    return f"{STATUS_NAMES[status]} ({status})" if status in STATUS_NAMES else f"status {status}"


_P = c_void_p
_I64P = POINTER(c_int64)

#: Every function the backend calls, per library: name -> (restype, argtypes). Enums (aclDataType,
#: aclFormat, aclrtMemcpyKind, aclrtMemMallocPolicy, aclSysParamOpt) are C ``int``s; aclError and
#: aclnnStatus are ``int``; handles (aclTensor*, aclIntArray*, aclBoolArray*, aclOpExecutor*,
#: aclrtStream) are opaque pointers.
SIGNATURES = {
    "ascendcl": {
        "aclInit": (c_int, [c_char_p]),                                        # const char *configPath
        "aclrtSetDevice": (c_int, [c_int32]),
        "aclrtResetDevice": (c_int, [c_int32]),
        "aclrtGetDevice": (c_int, [POINTER(c_int32)]),                        # 107002 without a context
        "aclrtGetDeviceCount": (c_int, [POINTER(c_uint32)]),
        "aclrtCreateStream": (c_int, [POINTER(c_void_p)]),
        "aclrtDestroyStream": (c_int, [_P]),
        "aclrtSynchronizeStream": (c_int, [_P]),
        "aclrtMalloc": (c_int, [POINTER(c_void_p), c_size_t, c_int]),
        "aclrtFree": (c_int, [_P]),
        "aclrtMemcpy": (c_int, [_P, c_size_t, _P, c_size_t, c_int]),
        "aclrtMemset": (c_int, [_P, c_size_t, c_int32, c_size_t]),
        "aclrtCtxSetSysParamOpt": (c_int, [c_int, c_int64]),
        "aclrtCtxGetSysParamOpt": (c_int, [c_int, _I64P]),
        "aclrtSetSysParamOpt": (c_int, [c_int, c_int64]),                      # process level
        "aclrtGetSysParamOpt": (c_int, [c_int, _I64P]),
        "aclGetRecentErrMsg": (c_char_p, []),
        "aclrtGetSocName": (c_char_p, []),
    },
    "nnopbase": {
        # aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
        #     const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storageDims,
        #     uint64_t storageDimsNum, void *tensorData)
        "aclCreateTensor": (_P, [_I64P, c_uint64, c_int, _I64P, c_int64, c_int, _I64P, c_uint64, _P]),
        "aclDestroyTensor": (c_int, [_P]),
        "aclCreateIntArray": (_P, [_I64P, c_uint64]),
        "aclDestroyIntArray": (c_int, [_P]),
        "aclCreateBoolArray": (_P, [POINTER(c_bool), c_uint64]),
        "aclDestroyBoolArray": (c_int, [_P]),
    },
    "opapi": {
        # gradOutput, input, weight, biasSizes, stride, padding, dilation, bool transposed, outputPadding,
        # int groups, outputMask, int8_t cubeMathType, gradInput, gradWeight, gradBias, uint64_t *workspaceSize,
        # aclOpExecutor **executor
        "aclnnConvolutionBackwardGetWorkspaceSize": (
            c_int, [_P, _P, _P, _P, _P, _P, _P, c_bool, _P, c_int, _P, c_int8, _P, _P, _P, POINTER(c_uint64),
                    POINTER(c_void_p)]),
        "aclnnConvolutionBackward": (c_int, [_P, c_uint64, _P, _P]),
        # input, weight, bias, stride, padding, dilation, bool transposed, outputPadding, const int64_t groups,
        # output, int8_t cubeMathType, uint64_t *workspaceSize, aclOpExecutor **executor
        "aclnnConvolutionGetWorkspaceSize": (
            c_int, [_P, _P, _P, _P, _P, _P, c_bool, _P, c_int64, _P, c_int8, POINTER(c_uint64), POINTER(c_void_p)]),
        "aclnnConvolution": (c_int, [_P, c_uint64, _P, _P]),
    },
}
