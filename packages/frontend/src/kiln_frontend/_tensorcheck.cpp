// kiln_frontend._tensorcheck: TensorGuard's fast path.  Reads dtype, device, requires_grad,
// dispatch keys, sizes and strides from the tensor's TensorImpl (tens of nanoseconds)
// instead of six Python attribute reads and calls (about a microsecond).  Built only where
// torch's headers are found (hatch_build.py); without it TensorGuard reads the same facts
// through Python, with the same result.  Interface: _tensorcheck.h.
#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>

#include "_tensorcheck.h"

namespace {

int facts_of(const at::Tensor &t, KilnTensorFacts *out) {
    out->dispatch_keys = t.key_set().raw_repr();
    out->dtype = static_cast<int32_t>(t.scalar_type());
    out->device_index = t.device().has_index() ? t.device().index() : -1;
    out->requires_grad = t.requires_grad() ? 1 : 0;
    return 0;
}

int kiln_facts(PyObject *obj, KilnTensorFacts *out) {
    if (!THPVariable_Check(obj)) {
        return -1;
    }
    try {
        return facts_of(THPVariable_Unpack(obj), out);
    } catch (...) {
        return -1;
    }
}

int kiln_check(PyObject *obj, const KilnTensorFacts *expected, Py_ssize_t ndim,
               const int64_t *sizes, const int64_t *strides, const char *dynamic,
               int check_strides) {
    if (!THPVariable_Check(obj)) {
        return -1;
    }
    try {
        const at::Tensor &t = THPVariable_Unpack(obj);
        KilnTensorFacts now;
        facts_of(t, &now);
        if (now.dispatch_keys != expected->dispatch_keys || now.dtype != expected->dtype ||
            now.device_index != expected->device_index ||
            now.requires_grad != expected->requires_grad) {
            return 0;
        }
        if (t.dim() != ndim) {
            return 0;
        }
        c10::IntArrayRef actual = t.sizes();
        for (Py_ssize_t i = 0; i < ndim; i++) {
            if (!dynamic[i] && actual[i] != sizes[i]) {
                return 0;
            }
        }
        if (check_strides && ndim > 0 && t.layout() == c10::kStrided) {
            c10::IntArrayRef st = t.strides();
            for (Py_ssize_t i = 0; i < ndim; i++) {
                if (!dynamic[i] && st[i] != strides[i]) {
                    return 0;
                }
            }
        }
        else if (check_strides && ndim > 0) {
            return -1;  // strides of a non-strided tensor: the Python path says what
        }
        return 1;
    } catch (...) {
        return -1;
    }
}

KilnTensorCheckAPI api = {KILN_TENSORCHECK_VERSION, kiln_facts, kiln_check};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_tensorcheck",
    "TensorGuard's fast path: tensor metadata read from the TensorImpl (see _tensorcheck.h).",
    -1, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__tensorcheck(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == nullptr) {
        return nullptr;
    }
    PyObject *capsule = PyCapsule_New(&api, KILN_TENSORCHECK_CAPSULE, nullptr);
    if (capsule == nullptr || PyModule_AddObject(m, "API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
