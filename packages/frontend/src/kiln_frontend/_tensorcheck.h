/* The interface between _evalframe.c's TensorGuard and the optional C++ module
 * kiln_frontend._tensorcheck, which reads a tensor's metadata from its TensorImpl (torch's
 * C++ API) instead of through Python attributes.  _tensorcheck exports one capsule,
 * "kiln_frontend._tensorcheck.API", pointing at a KilnTensorCheckAPI. */
#ifndef KILN_TENSORCHECK_H
#define KILN_TENSORCHECK_H

#include <stdint.h>

#define KILN_TENSORCHECK_CAPSULE "kiln_frontend._tensorcheck.API"
#define KILN_TENSORCHECK_VERSION 2

/* What a TensorGuard compares besides the class: the facts C++ reads directly. */
typedef struct {
    uint64_t dispatch_keys; /* DispatchKeySet::raw_repr() (covers the device type) */
    int32_t dtype;          /* ScalarType */
    int32_t device_index;   /* -1: none (cpu) */
    int32_t requires_grad;
} KilnTensorFacts;

typedef struct {
    int version; /* KILN_TENSORCHECK_VERSION */
    /* Fills *facts for a tensor. 0 on success, -1 when it cannot be read directly (not a
     * tensor, an exception from torch): the caller uses the Python-attribute path. */
    int (*facts)(PyObject *tensor, KilnTensorFacts *facts);
    /* 1: matches (facts, sizes and strides except dims flagged in dynamic; strides only
     * if check_strides), 0: does not, -1: cannot tell directly (use the Python path). */
    int (*check)(PyObject *tensor, const KilnTensorFacts *facts, Py_ssize_t ndim,
                 const int64_t *sizes, const int64_t *strides, const char *dynamic,
                 int check_strides);
    /* torch's global-state getters (functions of torch._C taking no arguments: grad mode,
     * default dtype, ...), read from their C++ state instead of called. 1 when `getter` is
     * one of them, its C++ reading agrees with calling it now, and `value` is a value it
     * returns: then `getter() is value` (identity) or `getter() == value` holds exactly
     * when (*read)() == *code. 0 otherwise (the caller calls the getter), -1 on error. */
    int (*state_getter)(PyObject *getter, PyObject *value, int identity,
                        int64_t (**read)(void), int64_t *code);
} KilnTensorCheckAPI;

#endif
