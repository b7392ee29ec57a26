/* What _evalframe.c shares with _guardtree.c inside the one extension module
 * kiln_frontend._evalframe (both files are compiled into it; hatch_build.py). */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include <Python.h>

/* ---- CPython versions: every #if on PY_VERSION_HEX of the extension lives here ---- */

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#error "kiln_frontend._evalframe supports CPython 3.11, 3.12 and 3.13 only"
#endif

#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE

/* Every difference between the CPython versions' interpreter frames and internal APIs, in
 * this one block (the code below uses only these names):
 *   FRAME_CODE(f)        the frame's code object: 3.11/3.12 f_code; 3.13 f_executable (a
 *                        strong reference typed PyObject *, a code object for every frame
 *                        that reaches an eval function; FRAME_HAS_CODE checks it).
 *   FRAME_FUNC(f)        the function: 3.11 f_func; 3.12+ f_funcobj.
 *   FRAME_AT_START(f,co) not a single instruction run yet: 3.11/3.12 prev_instr sits one
 *                        before the first code unit; 3.13 instr_ptr at the first one.
 *   KILN_EVAL_OWNS_FRAME the eval function clears and pops the frame (3.12+; see note 2).
 *   CODE_GET_EXTRA/...   co_extra access: private on 3.11, PyUnstable_ on 3.12+.
 *   TYPE_VERSION_VALID(tp) tp->tp_version_tag names tp's current attributes: 3.11/3.12
 *                        Py_TPFLAGS_VALID_VERSION_TAG and a non-zero tag; 3.13 no longer
 *                        sets that flag (a zero tag alone means invalid), so testing it
 *                        there would make every type look unversioned.
 *   FRAME_REINIT(f,fn,co,n) make a not-yet-run frame one of function fn (code co, a new
 *                        reference to fn taken over): its specials (function, code, globals,
 *                        builtins, first instruction, stacktop) reset with CPython's own
 *                        initializer, slots [n, co_nlocalsplus) NULL. The old function and
 *                        code references are the caller's to drop. 3.11
 *                        _PyFrame_InitializeSpecials; 3.12+ _PyFrame_Initialize.
 *   CODE_FRAMESIZE(co)   slots a frame of co takes on the thread's data stack: 3.12+
 *                        co_framesize; 3.11 computes it as _PyEvalFramePushAndInit does.
 *   DICT_VERSION_TRUSTED(d) d's ma_version_tag changes whenever d does: 3.11/3.12 always;
 *                        3.13 only for a combined table. A split table there (an instance
 *                        __dict__ sharing the object's inline values) is written through
 *                        the object by `o.x = v` with neither a new version tag nor a dict
 *                        watcher event (measured on 3.13.0), so its tag proves nothing
 *                        (the guard tree's memo holds such a table by slot instead). */
#if PY_VERSION_HEX >= 0x030D0000
#define KILN_PY313 1
#define TYPE_VERSION_VALID(tp) ((tp)->tp_version_tag != 0)
#define DICT_VERSION_TRUSTED(d) (((PyDictObject *)(d))->ma_values == NULL)
#define FRAME_HAS_CODE(f) (PyCode_Check((f)->f_executable))
#define FRAME_CODE(f) ((PyCodeObject *)(f)->f_executable)
#define FRAME_AT_START(f, co) ((f)->instr_ptr == _PyCode_CODE(co))
#else
#define KILN_PY313 0
#define TYPE_VERSION_VALID(tp) \
    (((tp)->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && (tp)->tp_version_tag != 0)
#define DICT_VERSION_TRUSTED(d) 1
#define FRAME_HAS_CODE(f) 1
#define FRAME_CODE(f) ((f)->f_code)
#define FRAME_AT_START(f, co) ((f)->prev_instr == _PyCode_CODE(co) - 1)
#endif

#if PY_VERSION_HEX >= 0x030C0000
#define CODE_FRAMESIZE(co) ((co)->co_framesize)
#define FRAME_REINIT(f, fn, co, n) \
    _PyFrame_Initialize((f), (PyFunctionObject *)(fn), NULL, (co), (n))
#else
#define CODE_FRAMESIZE(co) ((co)->co_nlocalsplus + (co)->co_stacksize + FRAME_SPECIALS_SIZE)
#define FRAME_REINIT(f, fn, co, n)                                                   \
    do {                                                                             \
        _PyFrame_InitializeSpecials((f), (PyFunctionObject *)(fn), NULL,             \
                                    (co)->co_nlocalsplus);                           \
        for (int kiln_i_ = (n); kiln_i_ < (co)->co_nlocalsplus; kiln_i_++) {         \
            (f)->localsplus[kiln_i_] = NULL;                                         \
        }                                                                            \
    } while (0)
#endif

#if PY_VERSION_HEX >= 0x030C0000
#define KILN_PY312 1
#define KILN_EVAL_OWNS_FRAME 1
#define FRAME_FUNC(f) ((f)->f_funcobj)
#define CODE_GET_EXTRA PyUnstable_Code_GetExtra
#define CODE_SET_EXTRA PyUnstable_Code_SetExtra
#define REQUEST_EXTRA_INDEX PyUnstable_Eval_RequestCodeExtraIndex
#else
#define KILN_PY312 0
#define KILN_EVAL_OWNS_FRAME 0
#define FRAME_FUNC(f) ((PyObject *)(f)->f_func)
#define CODE_GET_EXTRA _PyCode_GetExtra
#define CODE_SET_EXTRA _PyCode_SetExtra
#define REQUEST_EXTRA_INDEX _PyEval_RequestCodeExtraIndex
#endif

/*   EVAL_FRAME_SET(interp, fn) make fn interp's eval function (ours around a decorated call,
 *                        the default one back after it): 3.13 GIL builds without the tier-2
 *                        optimizer write interp->eval_frame (NULL: the default) themselves,
 *                        which is all the setter does there besides counting a "rare event"
 *                        that only the tier-2 optimizer reads (through a thread-local read of
 *                        the current interpreter, a third of what installing and removing the
 *                        hook costs a decorated call on 3.13). With the tier-2 optimizer
 *                        (KILN_PY_TIER2, set by hatch_build.py) installing must invalidate its
 *                        executors, and free-threaded builds stop the world to write it: the
 *                        setter. 3.11/3.12: the setter (a plain store). */
#if PY_VERSION_HEX >= 0x030D0000 && !defined(Py_GIL_DISABLED) && !defined(KILN_PY_TIER2)
#define Py_BUILD_CORE 1
#include <internal/pycore_interp.h>
#undef Py_BUILD_CORE
#define EVAL_FRAME_SET(interp, fn) \
    ((interp)->eval_frame = (fn) == _PyEval_EvalFrameDefault ? NULL : (fn))
#else
#define EVAL_FRAME_SET(interp, fn) _PyInterpreterState_SetEvalFrameFunc((interp), (fn))
#endif

/*   kiln_tracing_active(tstate) a tracer or profiler would see the frames this thread runs
 *                        (sys.settrace, sys.setprofile, cProfile, sys.monitoring): 3.11
 *                        tstate->cframe->use_tracing; 3.12+ any event of the interpreter's
 *                        global sys.monitoring set (settrace and setprofile set theirs
 *                        through it).
 *   _PyTraceback_Add      adds a traceback entry (function, file, line) for a frame that
 *                        did not run: declared in cpython/traceback.h on 3.11/3.12, in the
 *                        internal pycore_traceback.h on 3.13 (exported on all three). */
#if PY_VERSION_HEX >= 0x030C0000
#define Py_BUILD_CORE 1
#if PY_VERSION_HEX < 0x030D0000
/* 3.12's public objimpl.h defines _PyGC_FINALIZED as a macro that its internal pycore_gc.h
 * (included by pycore_interp.h) then defines as a function */
#undef _PyGC_FINALIZED
#endif
#include <internal/pycore_interp.h>
#undef Py_BUILD_CORE
static inline int
kiln_tracing_active(PyThreadState *tstate)
{
    const uint8_t *tools = tstate->interp->monitors.tools;
    for (int i = 0; i < _PY_MONITORING_UNGROUPED_EVENTS; i++) {
        if (tools[i]) {
            return 1;
        }
    }
    return 0;
}
#else
static inline int
kiln_tracing_active(PyThreadState *tstate)
{
    return tstate->cframe->use_tracing != 0;
}
#endif
#if PY_VERSION_HEX >= 0x030D0000
#define Py_BUILD_CORE 1
#include <internal/pycore_traceback.h>
#undef Py_BUILD_CORE
#endif

#if PY_VERSION_HEX >= 0x030D0000
/* 3.13 made the optional-attribute lookup public and dropped the private spelling. */
#define KILN_LOOKUP_ATTR PyObject_GetOptionalAttr
#else
#define KILN_LOOKUP_ATTR _PyObject_LookupAttr
#endif

/* A vectorcall on the hot path of a compiled call (a decorated call into its function, a
 * guard, a graph) without what PyObject_Vectorcall adds: on 3.13 it is a call that reads the
 * thread state (a thread-local read through __tls_get_addr from a shared libpython, ~15
 * instructions each time) and checks the result against the error indicator; 3.11 reads
 * the thread state from a global. Kept: a NULL result with no exception set becomes a
 * SystemError, as there. */
static inline PyObject *
kiln_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    vectorcallfunc func = PyVectorcall_Function(callable);
    if (func == NULL) {
        return PyObject_Vectorcall(callable, args, nargsf, kwnames);
    }
    PyObject *result = func(callable, args, nargsf, kwnames);
    if (result == NULL && !PyErr_Occurred()) {
        PyErr_Format(PyExc_SystemError, "%R returned NULL without setting an exception",
                     callable);
    }
    return result;
}

/* The C++ module _tensorcheck's interface (_tensorcheck.h), loaded on first use; NULL where
 * it was not built or is of another version. */
#include "_tensorcheck.h"
const KilnTensorCheckAPI *kiln_tensorcheck_api(void);

/* TensorGuard's check on `value`: 1 match, 0 mismatch, -1 error. `guard` must be a
 * TensorGuard (kiln_is_tensorguard). */
int kiln_tensorguard_check(PyObject *guard, PyObject *value);
int kiln_is_tensorguard(PyObject *obj);

/* The function whose frame's guards are running on this thread (borrowed), or NULL. */
PyObject *kiln_guarded_function(void);

/* Adds the GuardTree type to the module. 0, or -1 with an exception. */
int kiln_guardtree_init(PyObject *module);

#endif
