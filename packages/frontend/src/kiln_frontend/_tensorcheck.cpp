// kiln_frontend._tensorcheck: TensorGuard's fast path.  Reads dtype, device, requires_grad,
// dispatch keys, sizes and strides from the tensor's TensorImpl (tens of nanoseconds)
// instead of six Python attribute reads and calls (about a microsecond).  Built only where
// torch's headers are found (hatch_build.py); without it TensorGuard reads the same facts
// through Python, with the same result.  Also reads torch's global state (grad mode,
// default dtype, ...) for the guard tree's global-state leaves, which would otherwise call
// a torch._C getter per leaf on every guarded call.  Interface: _tensorcheck.h.
#include <Python.h>

#include <ATen/Context.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>

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

// ---- torch's global state ------------------------------------------------------------

// A value a getter returns, as the integer its reader gives for the state that returns it;
// false for a value no state returns (or one whose identity is not fixed by its value).
using Encode = bool (*)(PyObject *value, int identity, int64_t *code);

bool encode_bool(PyObject *value, int, int64_t *code) {
    if (!PyBool_Check(value)) {
        return false;
    }
    *code = value == Py_True;
    return true;
}

bool encode_dtype(PyObject *value, int, int64_t *code) {
    if (!THPDtype_Check(value)) {
        return false;
    }
    auto scalar_type = reinterpret_cast<THPDtype *>(value)->scalar_type;
    // the getter returns torch's one dtype object per ScalarType
    if (reinterpret_cast<PyObject *>(torch::getTHPDtype(scalar_type)) != value) {
        return false;
    }
    *code = static_cast<int64_t>(scalar_type);
    return true;
}

bool encode_int(PyObject *value, int identity, int64_t *code) {
    if (identity || !PyLong_CheckExact(value)) {
        return false;  // `is` on ints depends on CPython's small-int cache: call it
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
    }
    *code = v;
    return true;
}

// torch._C._get_float32_matmul_precision's strings, by Float32MatmulPrecision
bool encode_matmul_precision(PyObject *value, int identity, int64_t *code) {
    if (identity || !PyUnicode_CheckExact(value)) {
        return false;
    }
    const char *s = PyUnicode_AsUTF8(value);
    if (s == nullptr) {
        PyErr_Clear();
        return false;
    }
    static const std::pair<const char *, at::Float32MatmulPrecision> names[] = {
        {"highest", at::Float32MatmulPrecision::HIGHEST},
        {"high", at::Float32MatmulPrecision::HIGH},
        {"medium", at::Float32MatmulPrecision::MEDIUM}};
    for (const auto &[name, precision] : names) {
        if (std::strcmp(s, name) == 0) {
            *code = static_cast<int64_t>(precision);
            return true;
        }
    }
    return false;
}

int64_t read_grad_mode() { return c10::GradMode::is_enabled(); }
int64_t read_inference_mode() { return c10::InferenceMode::is_enabled(); }
int64_t read_deterministic() { return at::globalContext().deterministicAlgorithms(); }
int64_t read_default_dtype() {
    return static_cast<int64_t>(c10::get_default_dtype_as_scalartype());
}
int64_t read_torch_function_stack() { return at::impl::PythonTorchFunctionTLS::stack_len(); }
int64_t read_matmul_precision() {
    return static_cast<int64_t>(at::globalContext().float32MatmulPrecision());
}
// autocast is on for a device while its Autocast key is not excluded (what
// at::autocast::is_autocast_enabled reads); any device's key counts here, a superset of the
// devices torch._C._is_any_autocast_enabled asks about: where they differ the reading
// disagrees with the getter when the tree is built and the getter is called instead.
int64_t read_any_autocast() {
    return !c10::impl::tls_local_dispatch_key_set().excluded_.has_all(
        c10::autocast_dispatch_keyset);
}

struct StateGetter {
    const char *name;  // the function's name in torch._C
    int64_t (*read)();
    Encode encode;
    PyObject *function;  // torch._C.<name>, found at the first call (strong)
};

StateGetter state_getters[] = {
    {"is_grad_enabled", read_grad_mode, encode_bool, nullptr},
    {"is_inference_mode_enabled", read_inference_mode, encode_bool, nullptr},
    {"_get_deterministic_algorithms", read_deterministic, encode_bool, nullptr},
    {"get_default_dtype", read_default_dtype, encode_dtype, nullptr},
    {"_len_torch_function_stack", read_torch_function_stack, encode_int, nullptr},
    {"_get_float32_matmul_precision", read_matmul_precision, encode_matmul_precision, nullptr},
    {"_is_any_autocast_enabled", read_any_autocast, encode_bool, nullptr},
};

int find_state_getters() {
    static bool found = false;
    if (found) {
        return 0;
    }
    PyObject *torch_c = PyImport_ImportModule("torch._C");
    if (torch_c == nullptr) {
        return -1;
    }
    for (auto &g : state_getters) {
        g.function = PyObject_GetAttrString(torch_c, g.name);
        if (g.function == nullptr) {
            PyErr_Clear();  // another torch: that getter is called
        }
    }
    Py_DECREF(torch_c);
    found = true;
    return 0;
}

int kiln_state_getter(PyObject *getter, PyObject *value, int identity, int64_t (**read)(),
                      int64_t *code) {
    if (find_state_getters() < 0) {
        return -1;
    }
    for (const auto &g : state_getters) {
        if (g.function == nullptr || g.function != getter) {
            continue;
        }
        // the reading must agree with the getter now, and value must be one it returns
        PyObject *now = PyObject_CallNoArgs(getter);
        if (now == nullptr) {
            return -1;
        }
        int64_t now_code = 0;
        bool agrees = g.encode(now, identity, &now_code) && now_code == g.read();
        Py_DECREF(now);
        if (!agrees || !g.encode(value, identity, code)) {
            return 0;
        }
        *read = g.read;
        return 1;
    }
    return 0;
}

KilnTensorCheckAPI api = {KILN_TENSORCHECK_VERSION, kiln_facts, kiln_check, kiln_state_getter};

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
