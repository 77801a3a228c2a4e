/* libnnopbase.so: aclTensor / aclIntArray / aclBoolArray objects. */
#include "fake_cann.h"

#include <stdlib.h>
#include <string.h>

#define ERR(...) fakecann_priv_error(__VA_ARGS__)
#define TENSOR_MAGIC 0x54454e53u
#define INTARR_MAGIC 0x494e5441u
#define BOOLARR_MAGIC 0x424f4f4cu

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
                           const int64_t *stride, int64_t offset, aclFormat format,
                           const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData)
{
    if (fakecann_priv_take_injection("aclCreateTensor")) return NULL;
    if (viewDimsNum > FC_MAX_DIMS || storageDimsNum > FC_MAX_DIMS) {
        ERR("aclCreateTensor: at most %d dims are supported (view %llu, storage %llu)", FC_MAX_DIMS,
            (unsigned long long)viewDimsNum, (unsigned long long)storageDimsNum);
        return NULL;
    }
    if (viewDimsNum > 0 && (!viewDims || !stride)) {
        ERR("aclCreateTensor: viewDims/stride must not be NULL when viewDimsNum > 0");
        return NULL;
    }
    if (storageDimsNum > 0 && !storageDims) {
        ERR("aclCreateTensor: storageDims must not be NULL when storageDimsNum > 0");
        return NULL;
    }
    if (offset < 0) {
        ERR("aclCreateTensor: offset must be >= 0, got %lld", (long long)offset);
        return NULL;
    }
    for (uint64_t i = 0; i < viewDimsNum; i++) {
        if (viewDims[i] < 0) {
            ERR("aclCreateTensor: viewDims[%llu] = %lld is negative", (unsigned long long)i,
                (long long)viewDims[i]);
            return NULL;
        }
    }
    for (uint64_t i = 0; i < storageDimsNum; i++) {
        if (storageDims[i] < 0) {
            ERR("aclCreateTensor: storageDims[%llu] = %lld is negative", (unsigned long long)i,
                (long long)storageDims[i]);
            return NULL;
        }
    }
    aclTensor *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->magic = TENSOR_MAGIC;
    t->ndim = viewDimsNum;
    for (uint64_t i = 0; i < viewDimsNum; i++) {
        t->dims[i] = viewDims[i];
        t->strides[i] = stride[i];
    }
    t->offset = offset;
    t->dtype = (int)dataType;
    t->format = (int)format;
    t->sndim = storageDimsNum;
    for (uint64_t i = 0; i < storageDimsNum; i++) t->sdims[i] = storageDims[i];
    t->data = tensorData;
    fakecann_priv_register(FAKECANN_KIND_TENSOR, t);
    return t;
}

aclnnStatus aclDestroyTensor(const aclTensor *tensor)
{
    int inj = fakecann_priv_take_injection("aclDestroyTensor");
    if (inj) return inj;
    if (!tensor) return ACLNN_SUCCESS;
    if (!fakecann_priv_unregister(FAKECANN_KIND_TENSOR, tensor)) {
        fakecann_priv_misuse();
        ERR("aclDestroyTensor: %p is not a live aclTensor (double destroy?)", (const void *)tensor);
        return ACLNN_ERR_PARAM_INVALID;
    }
    free((void *)tensor);
    return ACLNN_SUCCESS;
}

aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size)
{
    if (fakecann_priv_take_injection("aclCreateIntArray")) return NULL;
    if (size > 0 && !value) {
        ERR("aclCreateIntArray: value must not be NULL when size > 0");
        return NULL;
    }
    if (size > (1u << 20)) {
        ERR("aclCreateIntArray: size %llu too large", (unsigned long long)size);
        return NULL;
    }
    aclIntArray *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->magic = INTARR_MAGIC;
    a->size = size;
    a->values = calloc(size ? size : 1, sizeof(int64_t));
    if (!a->values) {
        free(a);
        return NULL;
    }
    if (size) memcpy(a->values, value, size * sizeof(int64_t));
    fakecann_priv_register(FAKECANN_KIND_INT_ARRAY, a);
    return a;
}

aclnnStatus aclDestroyIntArray(const aclIntArray *array)
{
    int inj = fakecann_priv_take_injection("aclDestroyIntArray");
    if (inj) return inj;
    if (!array) return ACLNN_SUCCESS;
    if (!fakecann_priv_unregister(FAKECANN_KIND_INT_ARRAY, array)) {
        fakecann_priv_misuse();
        ERR("aclDestroyIntArray: %p is not a live aclIntArray (double destroy?)", (const void *)array);
        return ACLNN_ERR_PARAM_INVALID;
    }
    free(array->values);
    free((void *)array);
    return ACLNN_SUCCESS;
}

aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size)
{
    if (fakecann_priv_take_injection("aclCreateBoolArray")) return NULL;
    if (size > 0 && !value) {
        ERR("aclCreateBoolArray: value must not be NULL when size > 0");
        return NULL;
    }
    if (size > (1u << 20)) {
        ERR("aclCreateBoolArray: size %llu too large", (unsigned long long)size);
        return NULL;
    }
    aclBoolArray *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->magic = BOOLARR_MAGIC;
    a->size = size;
    a->values = calloc(size ? size : 1, sizeof(bool));
    if (!a->values) {
        free(a);
        return NULL;
    }
    if (size) memcpy(a->values, value, size * sizeof(bool));
    fakecann_priv_register(FAKECANN_KIND_BOOL_ARRAY, a);
    return a;
}

aclnnStatus aclDestroyBoolArray(const aclBoolArray *array)
{
    int inj = fakecann_priv_take_injection("aclDestroyBoolArray");
    if (inj) return inj;
    if (!array) return ACLNN_SUCCESS;
    if (!fakecann_priv_unregister(FAKECANN_KIND_BOOL_ARRAY, array)) {
        fakecann_priv_misuse();
        ERR("aclDestroyBoolArray: %p is not a live aclBoolArray (double destroy?)", (const void *)array);
        return ACLNN_ERR_PARAM_INVALID;
    }
    free(array->values);
    free((void *)array);
    return ACLNN_SUCCESS;
}
