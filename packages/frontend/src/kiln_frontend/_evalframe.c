/*
 * kiln_frontend._evalframe: kiln's PEP 523 frame-evaluation hook (CPython 3.11 to 3.13)
 * and the C TensorGuard (the GuardTree that checks a frame's guards is in _guardtree.c,
 * compiled into this same module).
 *
 * What it does (see docs/frontend-api.md and the frontend contract):
 *   - A per-thread "callback": NULL/None (off), False (run-only: cached entries only) or a
 *     callable (compile on a miss).
 *   - For each new Python frame with a callback installed, a per-code cache of
 *     (check_fn, fn) entries kept on the code object (co_extra) is searched in order with
 *     check_fn(*args); on the first truthy guard, fn(*args) is called and its result is the
 *     frame's result. On a miss in compile mode the callback gets a FrameInfo and returns
 *     None (mark the code "skip", run the frame as is), False (run this frame as is, no
 *     mark: asked again at the next call) or a new (check_fn, fn) entry.
 *
 * Design choices that CPython's internals force on us (read these before editing):
 *
 *  1. The frame we are handed has not run a single instruction. Its arguments sit in
 *     frame->localsplus[0 .. nargs) in the order positional (incl. positional-only),
 *     keyword-only, *args tuple, **kwargs dict. Cell/free variables are not made yet
 *     (MAKE_CELL / COPY_FREE_VARS are the first instructions), so those slots hold the plain
 *     argument values. We pass that array straight to check_fn/fn with PyObject_Vectorcall:
 *     no tuple is built on the hot path. The references stay owned by the frame.
 *     We must NOT pass PY_VECTORCALL_ARGUMENTS_OFFSET: localsplus[-1] is frame header.
 *
 *  2. Who clears the frame when we return without evaluating it differs:
 *       3.11: _PyEval_Vector() calls _PyEval_EvalFrame() and then _PyEvalFrameClearAndPop()
 *             itself, whatever the eval function did. So we just return the result.
 *       3.12, 3.13: _PyEval_Vector() returns _PyEval_EvalFrame(...) directly; the eval function
 *             owns the frame and _PyEval_EvalFrameDefault clears and pops it on exit. So
 *             when we do not run the frame (hit, new entry, or error) we must clear it:
 *             drop the locals/args, f_locals, the function and the code, and pop it off the
 *             thread's data stack. CPython's helpers for that (_PyFrame_ClearExceptCode,
 *             _PyThreadState_PopFrame, _PyObject_VirtualFree) are not exported from
 *             libpython (hidden symbols), so clear_unrun_frame() below re-does those few
 *             steps; the data-stack chunk is freed with the public arena allocator.
 *             frame_obj is always NULL here (we refuse frames that already have one).
 *     In both versions, whenever we fall back to the default evaluator, it does the usual
 *     clean-up itself.
 *
 *  3. We intercept only frames that are: owned by the thread (not generator frames, not
 *     frame-object-owned frames from PyEval_EvalFrameEx), not a throw() into a generator,
 *     at their first instruction, of CO_OPTIMIZED code (functions; module and class bodies
 *     and exec'd code use a locals dict and run as is), and not generators, coroutines or
 *     async generators (they copy the frame into the generator object on their first
 *     instruction; we leave them alone entirely).
 *
 *  4. The eval function pointer is per interpreter, the callback is per thread. While at
 *     least one thread has a non-None callback, our function is installed interpreter-wide
 *     (it returns straight to the previous evaluator for threads whose callback is None);
 *     when the count drops to zero the previous function is put back, so Python-to-Python
 *     calls are inlined by the interpreter again (with an eval function installed, CPython
 *     routes every Python call through it instead of inlining it). Every set_eval_frame()
 *     with an active callback re-checks the pointer, so another PEP 523 user that replaced
 *     ours in between is chained to, not lost. A thread that exits with a callback still set
 *     leaks one reference and keeps the hook installed (harmless, slower); the Python API
 *     always restores the previous callback.
 *     Living with TorchDynamo's hook (eval_declined(), with_callback): the other evaluator
 *     gets the frames we decline only on threads whose callback is None (a SKIP_TREE frame,
 *     e.g. a torch.compile'd call, runs so); while a thread has a kiln callback or kiln's own
 *     machinery runs, declined frames run on the default evaluator. A kiln callback set
 *     (with_callback, set_eval_frame) while another hook is installed and this thread has no
 *     kiln callback (torch.compile'd code calling a kiln-compiled function) is not
 *     installed: the call runs as plain Python under that hook (yields_to_foreign_hook),
 *     provided a frame of TorchDynamo's is on the stack: a hook left behind with none
 *     running (a failed torch.compile) is chained to, not obeyed.
 *
 *  5. "Hook disabled while guards and the callback run" is a per-thread depth counter
 *     (tls_disabled), not a change of the callback, so set_eval_frame() calls made inside
 *     stay balanced. run_without_hook(fn) uses the same counter; with_callback(cb, fn) (what
 *     the decorators return) swaps the callback around one call of fn, in C, so a decorated
 *     call adds no Python frame of its own.
 *
 *  6. The cache (a list of (check_fn, fn) tuples) and the skip mark live in a small C struct
 *     stored with _PyCode_SetExtra on the code object; the structs are also on a global
 *     doubly linked list so reset() can reach all of them. The co_extra free function
 *     unlinks and frees the struct when the code object dies. References held through
 *     co_extra are invisible to the cyclic GC: a cycle fn -> ... -> code lives until
 *     clear_cache()/reset().
 *
 *  7. fn's code object is marked skip when an entry is added, so fn's own frame runs as is
 *     (otherwise the hook would look fn's code up, miss, and ask the callback to compile the
 *     compiled code); frames that fn calls are seen by the hook as usual. fn must therefore
 *     not share the frame's code object (we raise ValueError if it does).
 *
 *  8. A cache entry's fn (the frame's code transformed) normally runs in the intercepted
 *     frame itself, not by a call: the frame is still unrun, its arguments sit in the slots
 *     where fn's code expects them (same argument counts and *args/**kwargs flags) and it is
 *     the top of the thread's data stack, so it is re-initialized as fn's frame with
 *     CPython's own frame initializer (FRAME_REINIT), grown or shrunk to fn's frame size
 *     when the data-stack chunk has the room, and handed to the default evaluator, which
 *     clears and pops it as usual. This is what a compiled call costs most over eager on the
 *     hot path otherwise: a second frame pushed, the arguments copied, and a second pass
 *     through this hook to decline it (and on 3.12+ releasing the first frame by hand).
 *     Where fn does not fit (another argument layout, not a plain function, no room in the
 *     chunk) it is called as before. entry_runs() counts both.
 *
 *  9. An entry may carry a DirectCall (the callback's optional third item): fn is known to
 *     do nothing but `return G(<argument slots>)[0]`, G a compiled graph (what the capture
 *     layer makes of a frame that is one graph: kiln_frontend.direct_entry finds it). The
 *     hook then calls G with the frame's argument slots and unpacks its one output itself,
 *     and releases the frame unrun: fn's frame (its evaluation, the global load, the call
 *     and the unpack in bytecode) is what a compiled call of one graph costs most over
 *     eager after the guards (~0.6k of ~4.3k instructions on 3.11, ~0.8k on 3.13). Two
 *     things fn's frame gave are kept: an exception raised by G gets a traceback entry
 *     for the user's function (its name, file and the line of the call, the frame's
 *     locals not kept); and while a tracer or profiler is active (kiln_tracing_active())
 *     fn runs as before, so they see the frame. entry_runs() counts these runs apart.
 *
 * Everything runs with the GIL held; the module keeps no per-interpreter state beyond the
 * eval-function pointer (single-phase init; subinterpreters are not supported).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "_kiln_internal.h"
#include "_tensorcheck.h"

/* The CPython-version differences (frame layout, private APIs) are all in _kiln_internal.h. */

/* ------------------------------------------------------------------------------------ */
/* Global and per-thread state                                                           */
/* ------------------------------------------------------------------------------------ */

/* Per-thread callback: NULL means None. Strong reference. */
static _Thread_local PyObject *tls_callback = NULL;
/* Per-thread "hook off" depth (guards, callback, run_without_hook). */
static _Thread_local int tls_disabled = 0;
/* Per-thread function of the frame whose guards or compile callback are running (borrowed,
 * NULL otherwise): guards on the frame's own closure cells read it (guarded_function()). */
static _Thread_local PyObject *tls_guard_func = NULL;

static Py_ssize_t active_threads = 0;         /* threads whose callback is not None */
/* the interpreter that imported the module, where the hook is installed: read once, as
 * PyThreadState_GET()->interp is a thread-local read through a call on 3.13, twice in every
 * decorated call (subinterpreters are not supported: see the top of this file) */
static PyInterpreterState *kiln_interp = NULL;
/* what we chain to (normally the default evaluator) */
static _PyFrameEvalFunction previous_eval = _PyEval_EvalFrameDefault;
static Py_ssize_t extra_index = -1;

/* Per-code data kept in co_extra. */
typedef struct CodeExtra {
    struct CodeExtra *prev, *next; /* global list, for reset() */
    PyObject *entries;             /* list of (check_fn, fn) tuples, or NULL */
    int skip;                      /* SKIP_FRAME, SKIP_TREE or 0 */
} CodeExtra;

/* skip values: the frame runs as is (a mark learned from the callback, cleared by reset());
 * or the frame and everything it calls run as is, with this thread's callback None for the
 * frame's duration (a standing rule, kept across reset(): what torch tells TorchDynamo not to
 * trace into, torch.utils.checkpoint's forward and recomputation, a function marked
 * torch.compiler.disable; a callback that marks the code it was asked about before answering
 * None has that frame run so already). A decorated call inside
 * (with_callback) still swaps its own callback in, as under kiln.disable(). */
#define SKIP_FRAME 1
#define SKIP_TREE 2

static CodeExtra extras_head = {&extras_head, &extras_head, NULL, 0};

static void
extra_free(void *ptr)
{
    CodeExtra *extra = (CodeExtra *)ptr;
    if (extra == NULL) {
        return;
    }
    /* Unlink first: dropping the entries may free other code objects (and their extras). */
    extra->prev->next = extra->next;
    extra->next->prev = extra->prev;
    PyObject *entries = extra->entries;
    extra->entries = NULL;
    PyMem_Free(extra);
    Py_XDECREF(entries);
}

static CodeExtra *
get_extra(PyObject *code)
{
    void *ptr = NULL;
    if (CODE_GET_EXTRA(code, extra_index, &ptr) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return (CodeExtra *)ptr;
}

/* Returns a borrowed pointer to the code's extra, creating it; NULL with an error set. */
static CodeExtra *
get_or_create_extra(PyObject *code)
{
    CodeExtra *extra = get_extra(code);
    if (extra != NULL) {
        return extra;
    }
    extra = PyMem_Calloc(1, sizeof(CodeExtra));
    if (extra == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (CODE_SET_EXTRA(code, extra_index, extra) < 0) {
        PyMem_Free(extra);
        return NULL;
    }
    extra->next = extras_head.next;
    extra->prev = &extras_head;
    extras_head.next->prev = extra;
    extras_head.next = extra;
    return extra;
}

/* Mark code SKIP_FRAME or SKIP_TREE; a SKIP_TREE mark stays (only unskip_code lifts it). */
static int
mark_skip(PyObject *code, int skip)
{
    CodeExtra *extra = get_or_create_extra(code);
    if (extra == NULL) {
        return -1;
    }
    if (extra->skip != SKIP_TREE) {
        extra->skip = skip;
    }
    return 0;
}

static PyObject *
current_callback(void)
{
    return tls_callback == NULL ? Py_None : tls_callback;
}

/* ------------------------------------------------------------------------------------ */
/* FrameInfo: what the Python callback sees on a miss                                    */
/* ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *code, *func, *globals, *builtins, *args, *closure;
} FrameInfo;

static void
frameinfo_dealloc(FrameInfo *self)
{
    Py_XDECREF(self->code);
    Py_XDECREF(self->func);
    Py_XDECREF(self->globals);
    Py_XDECREF(self->builtins);
    Py_XDECREF(self->args);
    Py_XDECREF(self->closure);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
frameinfo_repr(FrameInfo *self)
{
    PyCodeObject *co = (PyCodeObject *)self->code;
    return PyUnicode_FromFormat("<FrameInfo %U at %U:%d, %zd args>", co->co_qualname,
                                co->co_filename, co->co_firstlineno,
                                PyTuple_GET_SIZE(self->args));
}

static PyMemberDef frameinfo_members[] = {
    {"code", T_OBJECT, offsetof(FrameInfo, code), READONLY, "the frame's code object"},
    {"func", T_OBJECT, offsetof(FrameInfo, func), READONLY, "the function object"},
    {"globals", T_OBJECT, offsetof(FrameInfo, globals), READONLY, "the frame's globals"},
    {"builtins", T_OBJECT, offsetof(FrameInfo, builtins), READONLY, "the frame's builtins"},
    {"args", T_OBJECT, offsetof(FrameInfo, args), READONLY,
     "tuple of the argument slots: positional, keyword-only, *args, **kwargs"},
    {"closure", T_OBJECT, offsetof(FrameInfo, closure), READONLY, "func.__closure__"},
    {NULL}};

static PyTypeObject FrameInfoType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frontend._evalframe.FrameInfo",
    .tp_basicsize = sizeof(FrameInfo),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A not-yet-run Python frame, as handed to the eval-frame callback.",
    .tp_dealloc = (destructor)frameinfo_dealloc,
    .tp_repr = (reprfunc)frameinfo_repr,
    .tp_members = frameinfo_members,
};

static PyObject *
frameinfo_new(_PyInterpreterFrame *frame, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *argtuple = PyTuple_New(nargs);
    if (argtuple == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyTuple_SET_ITEM(argtuple, i, Py_NewRef(args[i]));
    }
    FrameInfo *info = PyObject_New(FrameInfo, &FrameInfoType);
    if (info == NULL) {
        Py_DECREF(argtuple);
        return NULL;
    }
    PyObject *func = FRAME_FUNC(frame);
    PyObject *closure = PyFunction_GET_CLOSURE(func);
    info->code = Py_NewRef((PyObject *)FRAME_CODE(frame));
    info->func = Py_NewRef(func);
    info->globals = Py_NewRef(frame->f_globals);
    info->builtins = Py_NewRef(frame->f_builtins);
    info->args = argtuple;
    info->closure = Py_NewRef(closure ? closure : Py_None);
    return (PyObject *)info;
}

/* ------------------------------------------------------------------------------------ */
/* The eval-frame function                                                               */
/* ------------------------------------------------------------------------------------ */

#define NOT_INTERCEPTED_FLAGS \
    (CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR)

/* 3.12+ only: release an untouched frame that we are not going to evaluate
 * (see note 2 at the top). No-op on 3.11, where _PyEval_Vector does it. */
static void
clear_unrun_frame(PyThreadState *tstate, _PyInterpreterFrame *frame)
{
#if KILN_EVAL_OWNS_FRAME
    /* Drop what the frame owns. Finalizers run here may push frames, but only above ours:
     * our frame stays allocated until the pop below. */
    for (int i = 0; i < frame->stacktop; i++) {
        Py_XDECREF(frame->localsplus[i]);
    }
    Py_XDECREF(frame->f_locals);
    Py_DECREF(frame->f_funcobj);
    Py_DECREF((PyObject *)FRAME_CODE(frame));
    /* Pop it off the thread's data stack. If it was the first frame of a chunk, free the
     * chunk and go back to the previous one (the root chunk is never in this position). */
    PyObject **base = (PyObject **)frame;
    _PyStackChunk *chunk = tstate->datastack_chunk;
    if (base == &chunk->data[0]) {
        _PyStackChunk *previous = chunk->previous;
        tstate->datastack_top = &previous->data[previous->top];
        tstate->datastack_chunk = previous;
        tstate->datastack_limit = (PyObject **)(((char *)previous) + previous->size);
        PyObjectArenaAllocator arena;
        PyObject_GetArenaAllocator(&arena);
        arena.free(arena.ctx, chunk, chunk->size);
    }
    else {
        tstate->datastack_top = base;
    }
#else
    (void)tstate;
    (void)frame;
#endif
}

static inline Py_ssize_t
code_nargs(PyCodeObject *co)
{
    return co->co_argcount + co->co_kwonlyargcount + ((co->co_flags & CO_VARARGS) != 0) +
           ((co->co_flags & CO_VARKEYWORDS) != 0);
}

/* Run the guards of `entries` in order with the hook off. On the first truthy one, store a
 * new reference to the entry in *out_entry. Returns 0 (hit or miss) or -1 on error.
 * `owner` is the compiling callback (compile mode) or NULL (run-only mode): in compile mode
 * only entries that this same callback made are eligible, so code compiled for one backend
 * (or one set of options, or fullgraph) is never run by a call that asked for another. */
static int
cache_lookup(PyObject *entries, PyObject *const *args, Py_ssize_t nargs, PyObject *owner,
             PyObject **out_entry)
{
    int rc = 0;
    *out_entry = NULL;
    Py_INCREF(entries); /* a guard could clear the cache under us */
    tls_disabled++;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (owner != NULL && PyTuple_GET_SIZE(entry) > 2 && PyTuple_GET_ITEM(entry, 2) != owner) {
            continue;
        }
        Py_INCREF(entry);
        PyObject *ok = kiln_vectorcall(PyTuple_GET_ITEM(entry, 0), args, nargs, NULL);
        int truth;
        if (ok == NULL) {
            truth = -1;
        }
        else {
            truth = (ok == Py_True) ? 1 : (ok == Py_False) ? 0 : PyObject_IsTrue(ok);
            Py_DECREF(ok);
        }
        if (truth != 0) {
            if (truth > 0) {
                *out_entry = entry; /* the reference taken above */
            }
            else {
                rc = -1;
                Py_DECREF(entry);
            }
            break;
        }
        Py_DECREF(entry);
    }
    tls_disabled--;
    Py_DECREF(entries);
    return rc;
}

/* A cached fn was built with the closure of the call that compiled it. A later call of the
 * same code may come from another function object (a closure made anew, e.g. a comprehension
 * or nested function on every call): then run a copy of fn bound to *this* frame's cells, so
 * free variables read the caller's values. Replaces *fn (a new reference) when needed. */
static int
rebind_closure(PyObject **fn, PyObject *frame_func)
{
    if (!PyFunction_Check(*fn) || frame_func == NULL || !PyFunction_Check(frame_func)) {
        return 0;
    }
    PyObject *want = PyFunction_GET_CLOSURE(frame_func);
    PyObject *have = PyFunction_GET_CLOSURE(*fn);
    if (want == have || want == NULL) {
        return 0;
    }
    /* Only a transformed copy of the frame's own code takes the frame's cells: same free
     * variable names. A wrapper of another shape keeps its own closure. */
    PyObject *fn_free = PyCode_GetFreevars((PyCodeObject *)PyFunction_GET_CODE(*fn));
    PyObject *frame_free = fn_free == NULL ? NULL
        : PyCode_GetFreevars((PyCodeObject *)PyFunction_GET_CODE(frame_func));
    int same = frame_free == NULL ? -1 : PyObject_RichCompareBool(fn_free, frame_free, Py_EQ);
    Py_XDECREF(fn_free);
    Py_XDECREF(frame_free);
    if (same <= 0) {
        return same;
    }
    PyObject *copy = PyFunction_New(PyFunction_GET_CODE(*fn), PyFunction_GET_GLOBALS(*fn));
    if (copy == NULL || PyFunction_SetClosure(copy, want) < 0) {
        Py_XDECREF(copy);
        return -1;
    }
    Py_SETREF(*fn, copy);
    return 0;
}

/* How the frames whose result was a cache entry's fn ran it (entry_runs()): in the
 * intercepted frame, or by a call. Process-wide; the GIL guards them. */
static Py_ssize_t runs_in_frame = 0, runs_called = 0, runs_direct = 0;

/* fn can run in the intercepted frame itself (note 8): a plain function of optimized,
 * non-generator code that takes its arguments in the same slots as `code`, and whose frame
 * fits where the intercepted one lies, on top of the thread's data stack. */
static int
fits_in_frame(PyThreadState *tstate, _PyInterpreterFrame *frame, PyCodeObject *code,
              PyObject *fn)
{
    if (!PyFunction_Check(fn)) {
        return 0;
    }
    PyCodeObject *co = (PyCodeObject *)PyFunction_GET_CODE(fn);
    const int layout = CO_OPTIMIZED | NOT_INTERCEPTED_FLAGS | CO_VARARGS | CO_VARKEYWORDS;
    PyObject **base = (PyObject **)frame;
    return frame->frame_obj == NULL && (co->co_flags & layout) == (code->co_flags & layout) &&
           co->co_argcount == code->co_argcount &&
           co->co_kwonlyargcount == code->co_kwonlyargcount &&
           tstate->datastack_top == base + CODE_FRAMESIZE(code) &&
           CODE_FRAMESIZE(co) < tstate->datastack_limit - base;
}

/* Run fn (a new reference, taken over; fits_in_frame() holds) in the intercepted frame: the
 * frame becomes fn's (its arguments are already in place) and the default evaluator runs
 * it, then clears and pops it as it does any frame it runs (3.11: _PyEval_Vector does).
 * Calling fn instead would push a second frame, copy the arguments into it and come back
 * through this hook to be declined; on the hot path of a compiled call that is most of what
 * the hook itself costs. */
static PyObject *
run_in_frame(PyThreadState *tstate, _PyInterpreterFrame *frame, PyObject *fn)
{
    PyObject *old_func = FRAME_FUNC(frame);
    PyCodeObject *old_code = FRAME_CODE(frame);
    PyCodeObject *co = (PyCodeObject *)PyFunction_GET_CODE(fn);
    tstate->datastack_top = (PyObject **)frame + CODE_FRAMESIZE(co);
    FRAME_REINIT(frame, fn, co, (int)code_nargs(co));
    /* the frame is whole again before anything a decref may run pushes frames above it */
    Py_DECREF(old_func);
    Py_DECREF((PyObject *)old_code);
    return _PyEval_EvalFrameDefault(tstate, frame, 0);
}

/* The frame's result is fn(*args) (fn a new reference, taken over): run in the frame when it
 * fits, else called, the frame then released unrun. Either way the frame is done with. */
static PyObject *
run_entry_fn(PyThreadState *tstate, _PyInterpreterFrame *frame, PyCodeObject *code,
             PyObject *fn)
{
    if (fits_in_frame(tstate, frame, code, fn)) {
        runs_in_frame++;
        return run_in_frame(tstate, frame, fn);
    }
    runs_called++;
    PyObject *result = PyObject_Vectorcall(fn, frame->localsplus, code_nargs(code), NULL);
    Py_DECREF(fn);
    clear_unrun_frame(tstate, frame);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* DirectCall: an entry whose fn only returns its graph's one output (note 9)            */
/* ------------------------------------------------------------------------------------ */

/* slots taken out of order are gathered on the C stack: at most this many */
#define DIRECT_MAX_GATHERED 32

typedef struct {
    PyObject_HEAD
    PyObject *callable; /* G */
    int lineno;         /* the line of the call in fn: the traceback entry's */
    int in_order;       /* slots are 0, 1, ..., nslots - 1: the frame's slots are passed */
    Py_ssize_t nslots;
    Py_ssize_t slots[DIRECT_MAX_GATHERED];
} DirectCall;

static PyTypeObject DirectCallType;

static PyObject *
directcall_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"callable", "slots", "lineno", NULL};
    PyObject *callable, *slots;
    int lineno;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!i:DirectCall", kwlist, &callable,
                                     &PyTuple_Type, &slots, &lineno)) {
        return NULL;
    }
    if (!PyCallable_Check(callable)) {
        PyErr_SetString(PyExc_TypeError, "DirectCall(): callable must be callable");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    if (n > DIRECT_MAX_GATHERED) {
        PyErr_Format(PyExc_ValueError, "DirectCall(): at most %d slots", DIRECT_MAX_GATHERED);
        return NULL;
    }
    DirectCall *self = (DirectCall *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->in_order = 1;
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, k));
        if (slot < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "DirectCall(): slots are argument indices");
            }
            Py_DECREF(self);
            return NULL;
        }
        self->slots[k] = slot;
        self->in_order &= slot == k;
    }
    self->nslots = n;
    self->lineno = lineno;
    self->callable = Py_NewRef(callable);
    return (PyObject *)self;
}

static int
directcall_traverse(DirectCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->callable);
    return 0;
}

static int
directcall_clear(DirectCall *self)
{
    Py_CLEAR(self->callable);
    return 0;
}

static void
directcall_dealloc(DirectCall *self)
{
    PyObject_GC_UnTrack(self);
    directcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
directcall_slots(DirectCall *self, void *unused)
{
    PyObject *slots = PyTuple_New(self->nslots);
    for (Py_ssize_t k = 0; slots != NULL && k < self->nslots; k++) {
        PyTuple_SET_ITEM(slots, k, PyLong_FromSsize_t(self->slots[k]));
    }
    return slots;
}

static PyObject *
directcall_repr(DirectCall *self)
{
    PyObject *slots = directcall_slots(self, NULL);
    PyObject *r = slots == NULL ? NULL
        : PyUnicode_FromFormat("<DirectCall %R%R line %d>", self->callable, slots, self->lineno);
    Py_XDECREF(slots);
    return r;
}

static PyMemberDef directcall_members[] = {
    {"callable", T_OBJECT, offsetof(DirectCall, callable), READONLY, "the graph called"},
    {"lineno", T_INT, offsetof(DirectCall, lineno), READONLY,
     "the line of the call: the traceback entry's when the graph raises"},
    {NULL}};

static PyGetSetDef directcall_getset[] = {
    {"slots", (getter)directcall_slots, NULL, "the argument slots passed, in order", NULL},
    {NULL}};

static PyTypeObject DirectCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frontend._evalframe.DirectCall",
    .tp_basicsize = sizeof(DirectCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "DirectCall(callable, slots, lineno): a cache entry's fn that only returns "
              "callable(*(frame slots))[0]; the hook calls callable itself (note 9).",
    .tp_new = directcall_new,
    .tp_dealloc = (destructor)directcall_dealloc,
    .tp_traverse = (traverseproc)directcall_traverse,
    .tp_clear = (inquiry)directcall_clear,
    .tp_repr = (reprfunc)directcall_repr,
    .tp_members = directcall_members,
    .tp_getset = directcall_getset,
};

/* `(x,) = out` (out a new reference, taken over) with UNPACK_SEQUENCE 1's errors. */
static PyObject *
unpack_one(PyObject *out)
{
    PyObject *item = NULL;
    if ((PyTuple_CheckExact(out) || PyList_CheckExact(out)) && Py_SIZE(out) == 1) {
        item = Py_NewRef(PySequence_Fast_ITEMS(out)[0]);
        Py_DECREF(out);
        return item;
    }
    PyObject *it = PyObject_GetIter(out);
    if (it == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError) && Py_TYPE(out)->tp_iter == NULL &&
            !PySequence_Check(out)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "cannot unpack non-iterable %.200s object",
                         Py_TYPE(out)->tp_name);
        }
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(out);
    item = PyIter_Next(it);
    if (item == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "not enough values to unpack (expected 1, got 0)");
        }
    }
    else {
        PyObject *extra = PyIter_Next(it);
        if (extra != NULL || PyErr_Occurred()) {
            if (extra != NULL) {
                PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 1)");
                Py_DECREF(extra);
            }
            Py_CLEAR(item);
        }
    }
    Py_DECREF(it);
    return item;
}

/* The frame's result is d's graph called with its argument slots, its one output unpacked;
 * the frame is released unrun (note 9). An error gets a traceback entry for the frame's
 * function at d's line. */
static PyObject *
run_direct(PyThreadState *tstate, _PyInterpreterFrame *frame, PyCodeObject *code,
           DirectCall *d)
{
    runs_direct++;
    PyObject *gathered[DIRECT_MAX_GATHERED];
    PyObject *const *args = frame->localsplus;
    if (!d->in_order) {
        for (Py_ssize_t k = 0; k < d->nslots; k++) {
            gathered[k] = frame->localsplus[d->slots[k]];
        }
        args = gathered;
    }
    Py_INCREF(d); /* the entry may be dropped while the graph runs (a reset() inside) */
    PyObject *out = kiln_vectorcall(d->callable, args, d->nslots, NULL);
    PyObject *result = out == NULL ? NULL : unpack_one(out);
    if (result == NULL) {
        const char *name = PyUnicode_AsUTF8(code->co_name);
        const char *file = name == NULL ? NULL : PyUnicode_AsUTF8(code->co_filename);
        if (file != NULL) {
            _PyTraceback_Add(name, file, d->lineno);
        }
    }
    Py_DECREF(d);
    clear_unrun_frame(tstate, frame);
    return result;
}

/* Run a cache entry (a new reference, taken over) as the frame's result: its DirectCall
 * when it has one and no tracer is active, else its fn (bound to the frame's closure). */
static PyObject *
run_entry(PyThreadState *tstate, _PyInterpreterFrame *frame, PyCodeObject *code,
          PyObject *entry)
{
    PyObject *direct = PyTuple_GET_SIZE(entry) > 3 ? PyTuple_GET_ITEM(entry, 3) : Py_None;
    if (direct != Py_None && !kiln_tracing_active(tstate)) {
        PyObject *result = run_direct(tstate, frame, code, (DirectCall *)direct);
        Py_DECREF(entry);
        return result;
    }
    PyObject *fn = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
    Py_DECREF(entry);
    if (rebind_closure(&fn, FRAME_FUNC(frame)) < 0) {
        Py_DECREF(fn);
        clear_unrun_frame(tstate, frame);
        return NULL;
    }
    return run_entry_fn(tstate, frame, code, fn);
}

static PyObject *swap_callback(PyObject *callback);
static PyObject *kiln_eval_frame(PyThreadState *tstate, _PyInterpreterFrame *frame,
                                 int throwflag);

/* Another PEP 523 user's eval function is installed (TorchDynamo's, while torch.compile'd
 * code runs): on top of the interpreter, or under ours as what we chain to. */
static int
foreign_hook_installed(void)
{
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(kiln_interp);
    if (current == kiln_eval_frame) {
        return previous_eval != _PyEval_EvalFrameDefault;
    }
    return current != _PyEval_EvalFrameDefault;
}

/* A torch.compile'd call is running on this thread: a frame of TorchDynamo's own wrapper
 * (torch/_dynamo/) is on the Python stack. Another hook installed with none of its frames
 * below us is one left behind (a failed torch.compile can leave TorchDynamo's installed):
 * kiln does not stand aside for it, or every later kiln-compiled call would silently run
 * uncompiled. Only walked while another hook is installed. */
static int
torch_compile_region_active(void)
{
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        const char *filename = PyUnicode_AsUTF8(code->co_filename);
        int inside = filename != NULL && strstr(filename, "/torch/_dynamo/") != NULL;
        Py_DECREF(code);
        if (filename == NULL) {
            PyErr_Clear();
        }
        if (inside) {
            Py_DECREF(frame);
            return 1;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    return 0;
}

/* A kiln callback about to be installed on a thread that has none, while another hook is
 * installed: that hook owns the frames below (torch.compile'd code calling a kiln-compiled
 * function or module), so kiln stays out and the call runs as plain Python under it. */
static int
yields_to_foreign_hook(PyObject *callback)
{
    return callback != Py_None && (tls_callback == NULL || tls_callback == Py_None) &&
           foreign_hook_installed() && torch_compile_region_active();
}


/* The frame being handed to previous_eval by eval_declined() on this thread (borrowed). */
static _Thread_local _PyInterpreterFrame *tls_forwarding = NULL;

/* A frame kiln leaves alone. It goes on to the evaluator installed before ours (another
 * PEP 523 user: TorchDynamo's hook while torch.compile'd code runs) only on a thread kiln
 * does not hold now: while this thread has a kiln callback (None aside), or kiln's own
 * machinery runs (the callback, guards, compiled graphs: tls_disabled), every frame kiln
 * does not take runs on the default evaluator, so the other hook never sees kiln's frames
 * nor kiln's transformed code, and never compiles what kiln compiles. A SKIP_TREE frame
 * (a torch.compile'd call) sets this thread's callback None first, so the other hook gets it
 * and what it calls. Two hooks that each chain to the other (each installed while the other
 * was) would hand one frame back and forth: a frame that comes back to us while we are
 * forwarding it runs on the default evaluator. */
static PyObject *
eval_declined(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    if (previous_eval == _PyEval_EvalFrameDefault || previous_eval == kiln_eval_frame ||
        tls_forwarding == frame || tls_disabled ||
        (tls_callback != NULL && tls_callback != Py_None)) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    _PyInterpreterFrame *outer = tls_forwarding;
    tls_forwarding = frame;
    PyObject *result = previous_eval(tstate, frame, throwflag);
    tls_forwarding = outer;
    return result;
}

/* A SKIP_TREE frame: evaluated with this thread's callback None, then the callback put back. */
static PyObject *
eval_with_callback_none(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    PyObject *previous = swap_callback(Py_None);
    PyObject *result = eval_declined(tstate, frame, throwflag);
    PyObject *none = swap_callback(previous);
    Py_DECREF(previous);
    Py_DECREF(none);
    return result;
}

static PyObject *
kiln_eval_frame(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    PyObject *callback = tls_callback;
    if (callback == NULL || callback == Py_None || tls_disabled || throwflag) {
        return eval_declined(tstate, frame, throwflag);
    }
    if (!FRAME_HAS_CODE(frame)) {
        return eval_declined(tstate, frame, throwflag);
    }
    PyCodeObject *code = FRAME_CODE(frame);
    if (!(code->co_flags & CO_OPTIMIZED) || (code->co_flags & NOT_INTERCEPTED_FLAGS) ||
        frame->owner != FRAME_OWNED_BY_THREAD || frame->frame_obj != NULL ||
        frame->f_locals != NULL || !FRAME_AT_START(frame, code)) {
        return eval_declined(tstate, frame, throwflag);
    }
    CodeExtra *extra = get_extra((PyObject *)code);
    if (extra != NULL && extra->skip == SKIP_TREE) {
        return eval_with_callback_none(tstate, frame, throwflag);
    }
    if (extra != NULL && extra->skip) {
        return eval_declined(tstate, frame, throwflag);
    }
    PyObject *const *args = frame->localsplus;
    Py_ssize_t nargs = code_nargs(code);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (args[i] == NULL) { /* cannot happen for a fresh frame; be safe */
            return eval_declined(tstate, frame, throwflag);
        }
    }

    PyObject *fn = NULL, *entry = NULL;
    Py_INCREF(callback); /* set_eval_frame() may replace it while Python code runs */

    /* 1. Cache lookup (compile and run-only modes). */
    if (extra != NULL && extra->entries != NULL && PyList_GET_SIZE(extra->entries) > 0) {
        PyObject *owner = callback == Py_False ? NULL : callback;
        PyObject *prev_func = tls_guard_func;
        tls_guard_func = FRAME_FUNC(frame);
        int lookup_rc = cache_lookup(extra->entries, args, nargs, owner, &entry);
        tls_guard_func = prev_func;
        if (lookup_rc < 0) {
            goto error;
        }
        if (entry != NULL) {
            Py_DECREF(callback);
            return run_entry(tstate, frame, code, entry);
        }
    }

    /* 2. Miss. Run-only mode: run the frame as is. */
    if (callback == Py_False) {
        Py_DECREF(callback);
        return eval_declined(tstate, frame, throwflag);
    }

    /* 3. Miss in compile mode: ask the callback, with the hook off. */
    PyObject *info = frameinfo_new(frame, args, nargs);
    if (info == NULL) {
        goto error;
    }
    tls_disabled++;
    PyObject *prev_func = tls_guard_func;
    tls_guard_func = FRAME_FUNC(frame);
    PyObject *ret = PyObject_CallOneArg(callback, info);
    tls_guard_func = prev_func;
    tls_disabled--;
    Py_DECREF(info);
    if (ret == NULL) {
        goto error;
    }
    if (ret == Py_None) {
        Py_DECREF(ret);
        if (mark_skip((PyObject *)code, SKIP_FRAME) < 0) {
            goto error;
        }
        Py_DECREF(callback);
        /* the callback may have marked the code SKIP_TREE (skip_code_tree): this frame,
         * the first one of it, already runs that way */
        if (get_extra((PyObject *)code)->skip == SKIP_TREE) {
            return eval_with_callback_none(tstate, frame, throwflag);
        }
        return eval_declined(tstate, frame, throwflag);
    }
    if (ret == Py_False) { /* "not now": run this frame as is, ask again next time */
        Py_DECREF(ret);
        Py_DECREF(callback);
        return eval_declined(tstate, frame, throwflag);
    }
    if (!PyTuple_CheckExact(ret) || PyTuple_GET_SIZE(ret) < 2 || PyTuple_GET_SIZE(ret) > 3 ||
        (PyTuple_GET_SIZE(ret) == 3 && PyTuple_GET_ITEM(ret, 2) != Py_None &&
         !Py_IS_TYPE(PyTuple_GET_ITEM(ret, 2), &DirectCallType))) {
        PyErr_Format(PyExc_TypeError,
                     "eval-frame callback must return None, False or a (check_fn, fn) or "
                     "(check_fn, fn, DirectCall or None) tuple, not %R", ret);
        Py_DECREF(ret);
        goto error;
    }
    fn = PyTuple_GET_ITEM(ret, 1);
    if (PyFunction_Check(fn)) {
        PyObject *fn_code = PyFunction_GET_CODE(fn);
        if (fn_code == (PyObject *)code) {
            PyErr_SetString(PyExc_ValueError,
                            "eval-frame callback returned an fn that shares the frame's code "
                            "object; fn needs a code object of its own (code.replace())");
            Py_DECREF(ret);
            goto error;
        }
        if (mark_skip(fn_code, SKIP_FRAME) < 0) {
            Py_DECREF(ret);
            goto error;
        }
    }
    extra = get_or_create_extra((PyObject *)code);
    if (extra == NULL) {
        Py_DECREF(ret);
        goto error;
    }
    if (extra->entries == NULL && (extra->entries = PyList_New(0)) == NULL) {
        Py_DECREF(ret);
        goto error;
    }
    /* Stored as (check_fn, fn, owner) or, with a DirectCall, (check_fn, fn, owner, direct):
     * see cache_lookup() and run_entry(). */
    PyObject *direct = PyTuple_GET_SIZE(ret) == 3 ? PyTuple_GET_ITEM(ret, 2) : Py_None;
    entry = direct == Py_None ? PyTuple_Pack(3, PyTuple_GET_ITEM(ret, 0), fn, callback)
                              : PyTuple_Pack(4, PyTuple_GET_ITEM(ret, 0), fn, callback, direct);
    if (entry == NULL || PyList_Append(extra->entries, entry) < 0) {
        Py_XDECREF(entry);
        Py_DECREF(ret);
        goto error;
    }
    Py_DECREF(ret);
    Py_DECREF(callback);
    /* the first call runs the entry as a hit does (a rebind is a no-op: same closure) */
    return run_entry(tstate, frame, code, entry);

error:
    Py_DECREF(callback);
    clear_unrun_frame(tstate, frame);
    return NULL;
}

/* Make the interpreter's eval function ours while some thread has a callback, and put the
 * previous one back when none has. Looks at the current pointer each time, so another PEP 523
 * user (a debugger, torch's own frame hook) replacing ours while we are active is undone at the next
 * set_eval_frame(), and we chain to whatever was installed before us. */
static void
update_installation(void)
{
    PyInterpreterState *interp = kiln_interp;
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (active_threads > 0) {
        if (current != kiln_eval_frame) {
            previous_eval = current;
            EVAL_FRAME_SET(interp, kiln_eval_frame);
        }
    }
    else if (current == kiln_eval_frame) {
        EVAL_FRAME_SET(interp, previous_eval);
    }
}

/* ------------------------------------------------------------------------------------ */
/* Module functions                                                                      */
/* ------------------------------------------------------------------------------------ */

/* Install `callback` (None, False or a callable; not checked here) as this thread's callback
 * and return the previous one (a new reference). Never fails. */
static PyObject *
swap_callback(PyObject *callback)
{
    PyObject *previous = tls_callback == NULL ? Py_NewRef(Py_None) : tls_callback;
    int was_active = previous != Py_None;
    int now_active = callback != Py_None;
    tls_callback = Py_NewRef(callback);
    if (was_active != now_active) {
        active_threads += now_active ? 1 : -1;
    }
    if (was_active != now_active || now_active) {
        update_installation();
    }
    return previous; /* the reference tls_callback held */
}

static int
check_callback(PyObject *callback)
{
    if (callback != Py_None && callback != Py_False && !PyCallable_Check(callback)) {
        PyErr_Format(PyExc_TypeError, "eval-frame callback must be None, False or a callable, not %.100s",
                     Py_TYPE(callback)->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *
set_eval_frame(PyObject *module, PyObject *callback)
{
    if (check_callback(callback) < 0) {
        return NULL;
    }
    if (yields_to_foreign_hook(callback)) {
        return Py_NewRef(Py_None); /* nothing installed: restoring None is a no-op */
    }
    return swap_callback(callback);
}

static PyObject *
get_eval_frame(PyObject *module, PyObject *unused)
{
    return Py_NewRef(current_callback());
}

static int
check_code(PyObject *code)
{
    if (!PyCode_Check(code)) {
        PyErr_Format(PyExc_TypeError, "expected a code object, not %.100s",
                     Py_TYPE(code)->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *
skip_code(PyObject *module, PyObject *code)
{
    if (check_code(code) < 0 || mark_skip(code, SKIP_FRAME) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
skip_code_tree(PyObject *module, PyObject *code)
{
    if (check_code(code) < 0 || mark_skip(code, SKIP_TREE) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
unskip_code(PyObject *module, PyObject *code)
{
    if (check_code(code) < 0) {
        return NULL;
    }
    CodeExtra *extra = get_extra(code);
    if (extra != NULL) {
        extra->skip = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
is_skipped(PyObject *module, PyObject *code)
{
    if (check_code(code) < 0) {
        return NULL;
    }
    CodeExtra *extra = get_extra(code);
    return PyBool_FromLong(extra != NULL && extra->skip);
}

static PyObject *
cache_entries(PyObject *module, PyObject *code)
{
    if (check_code(code) < 0) {
        return NULL;
    }
    CodeExtra *extra = get_extra(code);
    if (extra == NULL || extra->entries == NULL) {
        return PyList_New(0);
    }
    return PyList_GetSlice(extra->entries, 0, PyList_GET_SIZE(extra->entries));
}

static PyObject *
clear_cache(PyObject *module, PyObject *code)
{
    if (check_code(code) < 0) {
        return NULL;
    }
    CodeExtra *extra = get_extra(code);
    if (extra != NULL) {
        Py_CLEAR(extra->entries);
    }
    Py_RETURN_NONE;
}

/* Drop the entries of `code` whose check_fn is `check_fn` (an entry whose guards can never
 * pass again: an object they fix by identity died). The cache gets a new list without them,
 * so a lookup iterating the old one (a guard's allocation can run the weakref callback that
 * calls this) goes on over the list it holds. Returns how many were dropped. */
static PyObject *
drop_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "drop_entry(code, check_fn) takes 2 arguments");
        return NULL;
    }
    if (check_code(args[0]) < 0) {
        return NULL;
    }
    CodeExtra *extra = get_extra(args[0]);
    if (extra == NULL || extra->entries == NULL) {
        return PyLong_FromLong(0);
    }
    PyObject *old = extra->entries;
    PyObject *kept = PyList_New(0);
    if (kept == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(old);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(old, i);
        if (PyTuple_GET_ITEM(entry, 0) != args[1] && PyList_Append(kept, entry) < 0) {
            Py_DECREF(kept);
            return NULL;
        }
    }
    Py_ssize_t dropped = n - PyList_GET_SIZE(kept);
    if (dropped == 0) {
        Py_DECREF(kept);
        return PyLong_FromLong(0);
    }
    extra->entries = kept;
    Py_DECREF(old); /* may free the dropped entries' fn, code and graphs */
    return PyLong_FromSsize_t(dropped);
}

static PyObject *
reset(PyObject *module, PyObject *unused)
{
    /* Detach every entries list first, then drop them: dropping can free code objects,
     * which unlinks their extras from the list we are walking. */
    PyObject *dropped = PyList_New(0);
    if (dropped == NULL) {
        return NULL;
    }
    for (CodeExtra *e = extras_head.next; e != &extras_head; e = e->next) {
        if (e->skip != SKIP_TREE) {
            e->skip = 0;
        }
        if (e->entries != NULL) {
            if (PyList_Append(dropped, e->entries) < 0) {
                Py_DECREF(dropped);
                return NULL;
            }
            Py_CLEAR(e->entries); /* still referenced by `dropped`: no code runs here */
        }
    }
    Py_DECREF(dropped);
    Py_RETURN_NONE;
}

static PyObject *
is_hook_installed(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(_PyInterpreterState_GetEvalFrameFunc(kiln_interp) == kiln_eval_frame);
}

static PyObject *
entry_runs(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(nnn)", runs_in_frame, runs_called, runs_direct);
}

static PyObject *
is_other_hook_installed(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(foreign_hook_installed());
}

/* ------------------------------------------------------------------------------------ */
/* run_without_hook(fn): a callable that runs fn with this thread's hook off             */
/* ------------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    vectorcallfunc vectorcall;
} HookOff;

static PyObject *
hookoff_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    tls_disabled++;
    PyObject *result = kiln_vectorcall(((HookOff *)self)->fn, args, nargsf, kwnames);
    tls_disabled--;
    return result;
}

static int
hookoff_traverse(HookOff *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    return 0;
}

static int
hookoff_clear(HookOff *self)
{
    Py_CLEAR(self->fn);
    return 0;
}

static void
hookoff_dealloc(HookOff *self)
{
    PyObject_GC_UnTrack(self);
    hookoff_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
hookoff_repr(HookOff *self)
{
    return PyUnicode_FromFormat("<run_without_hook(%R)>", self->fn);
}

static PyMemberDef hookoff_members[] = {
    {"__wrapped__", T_OBJECT, offsetof(HookOff, fn), READONLY, "the wrapped callable"},
    {NULL}};

static PyTypeObject HookOffType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frontend._evalframe.run_without_hook",
    .tp_basicsize = sizeof(HookOff),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "run_without_hook(fn): calling it calls fn with this thread's eval-frame hook "
              "off (no Python frame of its own).",
    .tp_dealloc = (destructor)hookoff_dealloc,
    .tp_traverse = (traverseproc)hookoff_traverse,
    .tp_clear = (inquiry)hookoff_clear,
    .tp_repr = (reprfunc)hookoff_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(HookOff, vectorcall),
    .tp_members = hookoff_members,
};

static PyObject *
run_without_hook(PyObject *module, PyObject *fn)
{
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "run_without_hook() needs a callable");
        return NULL;
    }
    HookOff *self = PyObject_GC_New(HookOff, &HookOffType);
    if (self == NULL) {
        return NULL;
    }
    self->fn = Py_NewRef(fn);
    self->vectorcall = hookoff_vectorcall;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ------------------------------------------------------------------------------------ */
/* with_callback(callback, fn): a callable running fn with this thread's callback set    */
/* ------------------------------------------------------------------------------------ */

/* What optimize()/run()/disable() return when they decorate a function: no Python frame of
 * its own, so the decorated call costs little more than two pointer swaps. It binds like a
 * function (descriptor), and has a __dict__ so functools.update_wrapper() can copy
 * __name__, __doc__, __wrapped__ etc. onto it. */
typedef struct {
    PyObject_HEAD
    PyObject *callback;
    PyObject *fn;
    PyObject *dict;
    vectorcallfunc vectorcall;
} WithCallback;

static PyObject *
withcb_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    WithCallback *w = (WithCallback *)self;
    if (yields_to_foreign_hook(w->callback)) {
        /* Called from code another PEP 523 hook runs (a torch.compile'd function calling a
         * kiln-compiled one): that hook owns the frames below it, so fn runs as plain Python
         * there (TorchDynamo compiles it as part of its region). Installing our callback
         * would have TorchDynamo's hook, put back on top of ours whenever its callback is
         * toggled (torch's own _disable_dynamo functions do), trace kiln's capture
         * machinery and kiln's transformed code. */
        return PyObject_Vectorcall(w->fn, args, nargsf, kwnames);
    }
    PyObject *previous = swap_callback(w->callback);
    PyObject *result = kiln_vectorcall(w->fn, args, nargsf, kwnames);
    PyObject *ours = swap_callback(previous);
    Py_DECREF(previous);
    Py_DECREF(ours);
    return result;
}

static PyObject *
withcb_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static int
withcb_traverse(WithCallback *self, visitproc visit, void *arg)
{
    Py_VISIT(self->callback);
    Py_VISIT(self->fn);
    Py_VISIT(self->dict);
    return 0;
}

static int
withcb_clear(WithCallback *self)
{
    Py_CLEAR(self->callback);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->dict);
    return 0;
}

static void
withcb_dealloc(WithCallback *self)
{
    PyObject_GC_UnTrack(self);
    withcb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
withcb_repr(WithCallback *self)
{
    return PyUnicode_FromFormat("<with_callback(%R, %R)>", self->callback, self->fn);
}

static PyMemberDef withcb_members[] = {
    {"callback", T_OBJECT, offsetof(WithCallback, callback), READONLY,
     "the callback installed while fn runs"},
    {"fn", T_OBJECT, offsetof(WithCallback, fn), READONLY, "the wrapped callable"},
    {NULL}};

static PyGetSetDef withcb_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL}};

static PyTypeObject WithCallbackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frontend._evalframe.with_callback",
    .tp_basicsize = sizeof(WithCallback),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "with_callback(callback, fn): calling it calls fn with this thread's eval-frame "
              "callback set to `callback` (restored afterwards). Binds as a method.",
    .tp_dealloc = (destructor)withcb_dealloc,
    .tp_traverse = (traverseproc)withcb_traverse,
    .tp_clear = (inquiry)withcb_clear,
    .tp_repr = (reprfunc)withcb_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(WithCallback, vectorcall),
    .tp_descr_get = withcb_descr_get,
    .tp_dictoffset = offsetof(WithCallback, dict),
    .tp_members = withcb_members,
    .tp_getset = withcb_getset,
};

static PyObject *
with_callback(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "with_callback(callback, fn) takes 2 arguments");
        return NULL;
    }
    if (check_callback(args[0]) < 0) {
        return NULL;
    }
    if (!PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "with_callback(): fn must be callable");
        return NULL;
    }
    WithCallback *self = PyObject_GC_New(WithCallback, &WithCallbackType);
    if (self == NULL) {
        return NULL;
    }
    self->callback = Py_NewRef(args[0]);
    self->fn = Py_NewRef(args[1]);
    self->dict = NULL;
    self->vectorcall = withcb_vectorcall;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* ------------------------------------------------------------------------------------ */
/* TensorGuard                                                                           */
/* ------------------------------------------------------------------------------------ */

static PyObject *str_dtype, *str_device, *str_requires_grad, *str_shape, *str_stride;
static PyObject *dispatch_keys_fn = NULL; /* torch._C._dispatch_keys, loaded lazily */

/* The C++ fast path (kiln_frontend._tensorcheck, _tensorcheck.h), loaded with the first
 * TensorGuard; NULL where it was not built: the Python-attribute path below is used. */
static const KilnTensorCheckAPI *tensorcheck_api = NULL;
static int tensorcheck_loaded = 0;

static const KilnTensorCheckAPI *
load_tensorcheck(void)
{
    if (!tensorcheck_loaded) {
        tensorcheck_loaded = 1;
        /* PyCapsule_Import only reads attributes after the top package: import it first */
        PyObject *module = PyImport_ImportModule("kiln_frontend._tensorcheck");
        const KilnTensorCheckAPI *api = NULL;
        if (module != NULL) {
            api = (const KilnTensorCheckAPI *)PyCapsule_Import(KILN_TENSORCHECK_CAPSULE, 0);
            Py_DECREF(module);
        }
        if (api == NULL) {
            PyErr_Clear(); /* not built (no torch headers at build time) */
        }
        else if (api->version == KILN_TENSORCHECK_VERSION) {
            tensorcheck_api = api;
        }
    }
    return tensorcheck_api;
}

const KilnTensorCheckAPI *
kiln_tensorcheck_api(void)
{
    return load_tensorcheck();
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    PyObject *dtype, *device, *dispatch_keys, *dynamic_dims;
    int requires_grad, check_strides;
    int fast;               /* facts read by _tensorcheck: check() may use it */
    KilnTensorFacts facts;
    Py_ssize_t ndim;
    int64_t *sizes, *strides; /* ndim each, -1 for dynamic dims */
    char *dynamic;            /* ndim flags */
} TensorGuard;

static PyTypeObject TensorGuardType;

static PyObject *
type_qualname(PyTypeObject *tp)
{
    PyObject *module = PyObject_GetAttrString((PyObject *)tp, "__module__");
    PyObject *qualname = PyObject_GetAttrString((PyObject *)tp, "__qualname__");
    PyObject *result = NULL;
    if (module && qualname && PyUnicode_Check(module) &&
        PyUnicode_CompareWithASCIIString(module, "builtins") != 0) {
        result = PyUnicode_FromFormat("%U.%U", module, qualname);
    }
    else if (qualname) {
        result = Py_NewRef(qualname);
    }
    PyErr_Clear();
    Py_XDECREF(module);
    Py_XDECREF(qualname);
    return result ? result : PyUnicode_FromString(tp->tp_name);
}

/* Converts a tuple of Python ints (torch.Size or stride tuple) into int64s.
 * Returns 0, or -1 with an exception. */
static int
int_tuple_item(PyObject *tup, Py_ssize_t i, int64_t *out)
{
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tup, i));
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

#define MISMATCH(...)                                        \
    do {                                                     \
        if (reason != NULL) {                                \
            *reason = PyUnicode_FromFormat(__VA_ARGS__);     \
            rc = (*reason == NULL) ? -1 : 0;                 \
        }                                                    \
        else {                                               \
            rc = 0;                                          \
        }                                                    \
        goto out;                                            \
    } while (0)

/* The check itself. Returns 1 on a match, 0 on a mismatch (and, if reason is not NULL, a
 * new str explaining the first mismatch in *reason), -1 on error. */
static int
tensorguard_check(TensorGuard *g, PyObject *value, PyObject **reason)
{
    int rc = -1;
    PyObject *attr = NULL, *shape = NULL, *stride = NULL, *keys = NULL;
    if (Py_TYPE(value) != g->cls) {
        if (reason != NULL) {
            PyObject *expected = type_qualname(g->cls), *actual = type_qualname(Py_TYPE(value));
            if (expected && actual) {
                *reason = PyUnicode_FromFormat("class mismatch: expected %U, actual %U",
                                               expected, actual);
            }
            Py_XDECREF(expected);
            Py_XDECREF(actual);
            return *reason == NULL ? -1 : 0;
        }
        return 0;
    }
    if (g->fast && reason == NULL) { /* the C++ path; the reason always comes from below */
        int fast = tensorcheck_api->check(value, &g->facts, g->ndim, g->sizes, g->strides,
                                          g->dynamic, g->check_strides);
        if (fast >= 0) {
            return fast;
        }
    }
    /* dtype objects are singletons: identity is the fast path. */
    if ((attr = PyObject_GetAttr(value, str_dtype)) == NULL) {
        goto out;
    }
    if (attr != g->dtype) {
        int eq = PyObject_RichCompareBool(attr, g->dtype, Py_EQ);
        if (eq < 0) {
            goto out;
        }
        if (!eq) {
            MISMATCH("dtype mismatch: expected %R, actual %R", g->dtype, attr);
        }
    }
    Py_CLEAR(attr);
    if ((attr = PyObject_GetAttr(value, str_device)) == NULL) {
        goto out;
    }
    int eq = PyObject_RichCompareBool(attr, g->device, Py_EQ);
    if (eq < 0) {
        goto out;
    }
    if (!eq) {
        MISMATCH("device mismatch: expected %S, actual %S", g->device, attr);
    }
    Py_CLEAR(attr);
    if ((attr = PyObject_GetAttr(value, str_requires_grad)) == NULL) {
        goto out;
    }
    int requires_grad = PyObject_IsTrue(attr);
    if (requires_grad < 0) {
        goto out;
    }
    if (requires_grad != g->requires_grad) {
        MISMATCH("requires_grad mismatch: expected %s, actual %s",
                 g->requires_grad ? "True" : "False", requires_grad ? "True" : "False");
    }
    Py_CLEAR(attr);
    if ((shape = PyObject_GetAttr(value, str_shape)) == NULL) {
        goto out;
    }
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "TensorGuard: tensor.shape is not a tuple");
        goto out;
    }
    if (PyTuple_GET_SIZE(shape) != g->ndim) {
        MISMATCH("ndim mismatch: expected %zd, actual %zd", g->ndim, PyTuple_GET_SIZE(shape));
    }
    for (Py_ssize_t i = 0; i < g->ndim; i++) {
        int64_t size;
        if (g->dynamic[i]) {
            continue;
        }
        if (int_tuple_item(shape, i, &size) < 0) {
            goto out;
        }
        if (size != g->sizes[i]) {
            MISMATCH("size mismatch at index %zd: expected %lld, actual %lld", i,
                     (long long)g->sizes[i], (long long)size);
        }
    }
    if (g->check_strides && g->ndim > 0) {
        if ((stride = PyObject_CallMethodNoArgs(value, str_stride)) == NULL) {
            goto out;
        }
        if (!PyTuple_Check(stride) || PyTuple_GET_SIZE(stride) != g->ndim) {
            PyErr_SetString(PyExc_TypeError, "TensorGuard: tensor.stride() is not a tuple");
            goto out;
        }
        for (Py_ssize_t i = 0; i < g->ndim; i++) {
            int64_t st;
            if (g->dynamic[i]) {
                continue;
            }
            if (int_tuple_item(stride, i, &st) < 0) {
                goto out;
            }
            if (st != g->strides[i]) {
                MISMATCH("stride mismatch at index %zd: expected %lld, actual %lld", i,
                         (long long)g->strides[i], (long long)st);
            }
        }
    }
    if ((keys = PyObject_CallOneArg(dispatch_keys_fn, value)) == NULL) {
        goto out;
    }
    eq = PyObject_RichCompareBool(keys, g->dispatch_keys, Py_EQ);
    if (eq < 0) {
        goto out;
    }
    if (!eq) {
        MISMATCH("dispatch key set mismatch: expected %S, actual %S", g->dispatch_keys, keys);
    }
    rc = 1;
out:
    Py_XDECREF(attr);
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(keys);
    return rc;
}

int
kiln_is_tensorguard(PyObject *obj)
{
    return Py_IS_TYPE(obj, &TensorGuardType);
}

int
kiln_tensorguard_check(PyObject *guard, PyObject *value)
{
    return tensorguard_check((TensorGuard *)guard, value, NULL);
}

static PyObject *
tensorguard_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "TensorGuard takes exactly one argument");
        return NULL;
    }
    int rc = tensorguard_check((TensorGuard *)self, args[0], NULL);
    if (rc < 0) {
        return NULL;
    }
    return Py_NewRef(rc ? Py_True : Py_False);
}

static PyObject *
tensorguard_reason(TensorGuard *self, PyObject *value)
{
    PyObject *reason = NULL;
    int rc = tensorguard_check(self, value, &reason);
    if (rc < 0) {
        return NULL;
    }
    if (rc == 1) {
        Py_RETURN_NONE;
    }
    return reason;
}

static int
load_dispatch_keys_fn(void)
{
    if (dispatch_keys_fn != NULL) {
        return 0;
    }
    PyObject *torch_c = PyImport_ImportModule("torch._C");
    if (torch_c == NULL) {
        return -1;
    }
    dispatch_keys_fn = PyObject_GetAttrString(torch_c, "_dispatch_keys");
    Py_DECREF(torch_c);
    return dispatch_keys_fn == NULL ? -1 : 0;
}

static void
tensorguard_dealloc(TensorGuard *self)
{
    Py_XDECREF(self->cls);
    Py_XDECREF(self->dtype);
    Py_XDECREF(self->device);
    Py_XDECREF(self->dispatch_keys);
    Py_XDECREF(self->dynamic_dims);
    PyMem_Free(self->sizes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
tensorguard_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"expected", "dynamic_dims", "check_strides", NULL};
    PyObject *expected, *dims_arg = NULL;
    int check_strides = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Op:TensorGuard", kwlist, &expected,
                                     &dims_arg, &check_strides)) {
        return NULL;
    }
    if (load_dispatch_keys_fn() < 0) {
        return NULL;
    }
    TensorGuard *g = (TensorGuard *)type->tp_alloc(type, 0);
    if (g == NULL) {
        return NULL;
    }
    g->vectorcall = tensorguard_vectorcall;
    g->check_strides = check_strides;
    PyObject *shape = NULL, *stride = NULL, *dims = NULL, *attr = NULL;
    g->cls = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(expected));
    if ((g->dtype = PyObject_GetAttr(expected, str_dtype)) == NULL ||
        (g->device = PyObject_GetAttr(expected, str_device)) == NULL ||
        (attr = PyObject_GetAttr(expected, str_requires_grad)) == NULL ||
        (g->requires_grad = PyObject_IsTrue(attr)) < 0 ||
        (g->dispatch_keys = PyObject_CallOneArg(dispatch_keys_fn, expected)) == NULL ||
        (shape = PyObject_GetAttr(expected, str_shape)) == NULL ||
        (stride = PyObject_CallMethodNoArgs(expected, str_stride)) == NULL) {
        goto fail;
    }
    if (!PyTuple_Check(shape) || !PyTuple_Check(stride) ||
        PyTuple_GET_SIZE(shape) != PyTuple_GET_SIZE(stride)) {
        PyErr_SetString(PyExc_TypeError, "TensorGuard: expected a tensor");
        goto fail;
    }
    g->ndim = PyTuple_GET_SIZE(shape);
    size_t n = g->ndim > 0 ? (size_t)g->ndim : 1;
    g->sizes = PyMem_Calloc(n, 2 * sizeof(int64_t) + 1);
    if (g->sizes == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    g->strides = g->sizes + n;
    g->dynamic = (char *)(g->strides + n);
    /* dynamic dims: any iterable of ints, negative ones count from the end */
    dims = (dims_arg == NULL || dims_arg == Py_None) ? PyTuple_New(0)
                                                     : PySequence_Tuple(dims_arg);
    if (dims == NULL) {
        goto fail;
    }
    PyObject *normalized = PyList_New(0);
    if (normalized == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(dims); i++) {
        Py_ssize_t d = PyNumber_AsSsize_t(PyTuple_GET_ITEM(dims, i), PyExc_IndexError);
        if (d == -1 && PyErr_Occurred()) {
            Py_DECREF(normalized);
            goto fail;
        }
        if (d < 0) {
            d += g->ndim;
        }
        if (d < 0 || d >= g->ndim) {
            PyErr_Format(PyExc_IndexError,
                         "TensorGuard: dynamic dim %R out of range for a %zd-d tensor",
                         PyTuple_GET_ITEM(dims, i), g->ndim);
            Py_DECREF(normalized);
            goto fail;
        }
        if (!g->dynamic[d]) {
            g->dynamic[d] = 1;
            PyObject *dobj = PyLong_FromSsize_t(d);
            if (dobj == NULL || PyList_Append(normalized, dobj) < 0) {
                Py_XDECREF(dobj);
                Py_DECREF(normalized);
                goto fail;
            }
            Py_DECREF(dobj);
        }
    }
    if (PyList_Sort(normalized) < 0 ||
        (g->dynamic_dims = PyList_AsTuple(normalized)) == NULL) {
        Py_DECREF(normalized);
        goto fail;
    }
    Py_DECREF(normalized);
    for (Py_ssize_t i = 0; i < g->ndim; i++) {
        if (g->dynamic[i]) {
            g->sizes[i] = g->strides[i] = -1;
            continue;
        }
        if (int_tuple_item(shape, i, &g->sizes[i]) < 0 ||
            int_tuple_item(stride, i, &g->strides[i]) < 0) {
            goto fail;
        }
    }
    if (load_tensorcheck() != NULL && tensorcheck_api->facts(expected, &g->facts) == 0) {
        g->fast = 1;
    }
    Py_DECREF(shape);
    Py_DECREF(stride);
    Py_DECREF(dims);
    Py_DECREF(attr);
    return (PyObject *)g;
fail:
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(dims);
    Py_XDECREF(attr);
    Py_DECREF(g);
    return NULL;
}

static PyObject *
int64_list(TensorGuard *g, const int64_t *values)
{
    PyObject *tup = PyTuple_New(g->ndim);
    if (tup == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < g->ndim; i++) {
        PyObject *item = g->dynamic[i] ? Py_NewRef(Py_None) : PyLong_FromLongLong(values[i]);
        if (item == NULL) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, i, item);
    }
    return tup;
}

static PyObject *
tensorguard_get_sizes(TensorGuard *g, void *closure)
{
    return int64_list(g, g->sizes);
}

static PyObject *
tensorguard_get_strides(TensorGuard *g, void *closure)
{
    return int64_list(g, g->strides);
}

static PyObject *
tensorguard_get_cls(TensorGuard *g, void *closure)
{
    return Py_NewRef((PyObject *)g->cls);
}

/* "[3, *, 4]" with * for a dynamic dim */
static PyObject *
dims_text(TensorGuard *g, const int64_t *values)
{
    PyObject *parts = PyList_New(0), *sep = NULL, *joined = NULL;
    if (parts == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < g->ndim; i++) {
        PyObject *s = g->dynamic[i] ? PyUnicode_FromString("*")
                                    : PyUnicode_FromFormat("%lld", (long long)values[i]);
        if (s == NULL || PyList_Append(parts, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(parts);
            return NULL;
        }
        Py_DECREF(s);
    }
    if ((sep = PyUnicode_FromString(", ")) != NULL) {
        PyObject *inner = PyUnicode_Join(sep, parts);
        if (inner != NULL) {
            joined = PyUnicode_FromFormat("[%U]", inner);
            Py_DECREF(inner);
        }
        Py_DECREF(sep);
    }
    Py_DECREF(parts);
    return joined;
}

static PyObject *
tensorguard_repr(TensorGuard *g)
{
    PyObject *cls = type_qualname(g->cls);
    PyObject *sizes = dims_text(g, g->sizes);
    PyObject *strides = g->check_strides ? dims_text(g, g->strides)
                                         : PyUnicode_FromString("unchecked");
    PyObject *result = NULL;
    if (cls && sizes && strides) {
        result = PyUnicode_FromFormat(
            "TensorGuard(%U, dtype=%R, device=%S, requires_grad=%s, size=%U, stride=%U, "
            "dispatch_keys=%S)",
            cls, g->dtype, g->device, g->requires_grad ? "True" : "False", sizes, strides,
            g->dispatch_keys);
    }
    Py_XDECREF(cls);
    Py_XDECREF(sizes);
    Py_XDECREF(strides);
    return result;
}

static PyMethodDef tensorguard_methods[] = {
    {"reason", (PyCFunction)tensorguard_reason, METH_O,
     "reason(value) -> str | None: the first mismatch in words, or None if the guard passes."},
    {NULL}};

static PyMemberDef tensorguard_members[] = {
    {"dtype", T_OBJECT, offsetof(TensorGuard, dtype), READONLY},
    {"device", T_OBJECT, offsetof(TensorGuard, device), READONLY},
    {"dispatch_keys", T_OBJECT, offsetof(TensorGuard, dispatch_keys), READONLY},
    {"dynamic_dims", T_OBJECT, offsetof(TensorGuard, dynamic_dims), READONLY},
    {"requires_grad", T_BOOL, offsetof(TensorGuard, requires_grad), READONLY},
    {"check_strides", T_BOOL, offsetof(TensorGuard, check_strides), READONLY},
    {"fast", T_INT, offsetof(TensorGuard, fast), READONLY,
     "True when check() reads the tensor through the C++ module _tensorcheck"},
    {"ndim", T_PYSSIZET, offsetof(TensorGuard, ndim), READONLY},
    {NULL}};

static PyGetSetDef tensorguard_getset[] = {
    {"cls", (getter)tensorguard_get_cls, NULL, "the exact tensor class expected"},
    {"sizes", (getter)tensorguard_get_sizes, NULL, "expected sizes (None for dynamic dims)"},
    {"strides", (getter)tensorguard_get_strides, NULL,
     "expected strides (None for dynamic dims)"},
    {NULL}};

static PyTypeObject TensorGuardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frontend._evalframe.TensorGuard",
    .tp_basicsize = sizeof(TensorGuard),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "TensorGuard(expected, dynamic_dims=(), check_strides=True)\n\n"
              "Snapshots the exact class, dtype, device, requires_grad, dispatch-key set, "
              "ndim, sizes and strides of `expected`. guard(value) -> bool checks them in C; "
              "a dim in dynamic_dims matches any size and its stride is not checked. "
              "guard.reason(value) explains the first mismatch.",
    .tp_new = tensorguard_new,
    .tp_dealloc = (destructor)tensorguard_dealloc,
    .tp_repr = (reprfunc)tensorguard_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TensorGuard, vectorcall),
    .tp_methods = tensorguard_methods,
    .tp_members = tensorguard_members,
    .tp_getset = tensorguard_getset,
};

/* ------------------------------------------------------------------------------------ */
/* Module                                                                                */
/* ------------------------------------------------------------------------------------ */

PyObject *
kiln_guarded_function(void)
{
    return tls_guard_func;
}

static PyObject *
guarded_function(PyObject *self, PyObject *unused)
{
    return Py_NewRef(tls_guard_func != NULL ? tls_guard_func : Py_None);
}

static PyMethodDef module_methods[] = {
    {"guarded_function", guarded_function, METH_NOARGS,
     "guarded_function() -> the function whose frame's guards (or compile callback) are "
     "running on this thread, else None. Guards on the frame's closure cells read it."},
    {"set_eval_frame", set_eval_frame, METH_O,
     "set_eval_frame(callback) -> previous. callback: None (off), False (run-only: cached "
     "entries only) or a callable (called on a cache miss). Per thread."},
    {"get_eval_frame", get_eval_frame, METH_NOARGS, "This thread's current callback."},
    {"skip_code", skip_code, METH_O, "Mark a code object: its frames always run as is."},
    {"unskip_code", unskip_code, METH_O, "Remove a code object's skip mark."},
    {"is_skipped", is_skipped, METH_O, "Whether a code object is marked skip."},
    {"skip_code_tree", skip_code_tree, METH_O,
     "Mark a code object: its frames, and every frame they call, run as is (kept across "
     "reset())."},
    {"cache_entries", cache_entries, METH_O,
     "cache_entries(code) -> list of (check_fn, fn, owner_callback[, DirectCall]), in lookup "
     "order."},
    {"clear_cache", clear_cache, METH_O, "Drop a code object's cache entries."},
    {"drop_entry", (PyCFunction)(void (*)(void))drop_entry, METH_FASTCALL,
     "drop_entry(code, check_fn) -> n: drop the code's entries whose check_fn is check_fn."},
    {"reset", reset, METH_NOARGS, "Drop every cache entry and skip mark."},
    {"hook_installed", is_hook_installed, METH_NOARGS,
     "Whether kiln's eval-frame function is installed in this interpreter (some thread has a "
     "callback set)."},
    {"other_hook_installed", is_other_hook_installed, METH_NOARGS,
     "Whether another PEP 523 eval-frame function (TorchDynamo's) is installed in this "
     "interpreter, on top of kiln's or under it."},
    {"entry_runs", entry_runs, METH_NOARGS,
     "entry_runs() -> (in_frame, called, direct): how many frames since import had a cache "
     "entry as their result: its fn run in the intercepted frame itself or (its argument "
     "layout or frame size does not fit) called, or its DirectCall's graph called by the "
     "hook (note 9)."},
    {"with_callback", (PyCFunction)(void (*)(void))with_callback, METH_FASTCALL,
     "with_callback(callback, fn) -> callable running fn with this thread's callback set."},
    {"run_without_hook", run_without_hook, METH_O,
     "run_without_hook(fn) -> callable running fn with this thread's hook off."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kiln_frontend._evalframe",
    .m_doc = "kiln's PEP 523 eval-frame hook, per-code caches and C tensor guards.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__evalframe(void)
{
    kiln_interp = PyInterpreterState_Get();
    if (extra_index < 0) {
        extra_index = REQUEST_EXTRA_INDEX(extra_free);
        if (extra_index < 0) {
            PyErr_SetString(PyExc_RuntimeError, "no free co_extra index");
            return NULL;
        }
    }
    if (PyType_Ready(&FrameInfoType) < 0 || PyType_Ready(&HookOffType) < 0 ||
        PyType_Ready(&WithCallbackType) < 0 || PyType_Ready(&DirectCallType) < 0 ||
        PyType_Ready(&TensorGuardType) < 0) {
        return NULL;
    }
    if ((str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
        (str_device = PyUnicode_InternFromString("device")) == NULL ||
        (str_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL ||
        (str_shape = PyUnicode_InternFromString("shape")) == NULL ||
        (str_stride = PyUnicode_InternFromString("stride")) == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "FrameInfo", (PyObject *)&FrameInfoType) < 0 ||
        PyModule_AddObjectRef(m, "TensorGuard", (PyObject *)&TensorGuardType) < 0 ||
        PyModule_AddObjectRef(m, "DirectCall", (PyObject *)&DirectCallType) < 0 ||
        PyModule_AddIntConstant(m, "PY312", KILN_PY312) < 0 ||
        PyModule_AddIntConstant(m, "PY313", KILN_PY313) < 0 || kiln_guardtree_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
