/*
 * GuardTree: all the guards of one cache entry, checked in C (kiln_frontend._evalframe).
 *
 * guards.py builds the tree from a frame's Guard list and hands it over as nested tuples:
 *
 *   node = (accessor, key, leaves, children)      leaves = ((kind, a, b), ...)
 *
 * A node fetches ONE value from its parent's (accessor + key: an argument slot, a global,
 * a closure cell of the guarded function, a constant object, an attribute by interned
 * name, an item), runs its leaf checks on it, then its children on values reached from it.
 * A walk shared by many guards (self -> _modules -> layer1 -> _parameters -> weight) is thus
 * done once per call. The root's value is the frame's argument array.
 *
 * A dict key known by identity (a module) is held by a weak reference (weak_item nodes, the
 * keys leaf's flagged items): a cache entry does not keep a model alive, and a read of a key
 * that died is a miss (no object alive can be that key).
 *
 * tree(*args) -> True when every leaf passes. Like the generated Python check it replaces,
 * an exception (a missing attribute, a changed type) is a miss (False), except for
 * non-Exception BaseExceptions (KeyboardInterrupt), which propagate.
 *
 * The "keys" leaf skips its comparison when an exact dict still has the version tag it had
 * when the comparison last passed (ma_version_tag, PEP 509: every dict gets a fresh value
 * from an interpreter-wide counter when it is created and whenever it is modified, so an
 * equal tag means the same, unmodified dict). It is deprecated in 3.12 but still maintained
 * there (the low bits hold watcher flags: a watched dict only compares again). On 3.13 an
 * instance __dict__ sharing its object's inline values is changed by attribute stores without
 * a new tag: such a dict counts as unversioned (dict_version() 0), always compared.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#include "_kiln_internal.h"

#if KILN_PY313
/* the split-table layout (ma_values, the shared keys' entries) that the 3.13 memo reads */
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#define KILN_UNDEF_BUILD_CORE 1
#endif
#include <internal/pycore_dict.h>
#ifdef KILN_UNDEF_BUILD_CORE
#undef Py_BUILD_CORE
#undef KILN_UNDEF_BUILD_CORE
#endif
#endif

typedef enum {
    ACC_ROOT, ACC_ARG, ACC_GLOBAL, ACC_CLOSURE, ACC_CONST, ACC_ATTR, ACC_ITEM,
    ACC_WEAK_ITEM, /* an item whose key (a module) the node holds by a weak reference */
    ACC_DICT_KEY,  /* list(v.keys())[index] */
    ACC_COUNT
} Accessor;

static const char *const accessor_names[ACC_COUNT] = {
    "root", "arg", "global", "closure", "const", "attr", "item", "weak_item", "dict_key",
};

typedef enum {
    LEAF_TYPE,     /* type(v) is a */
    LEAF_ID,       /* id(v) == a */
    LEAF_IS,       /* v is a */
    LEAF_EQ,       /* bool(v == a) */
    LEAF_SAME,     /* v is a or v == a (a tuple item compared as tuples compare) */
    LEAF_NAN,      /* bool(v != v) */
    LEAF_LEN,      /* len(v) == a */
    LEAF_FALSY,    /* not v */
    LEAF_KEYS,     /* list(v.keys()) == a (a list; where b, a tuple of flags, says so,
                    * a's item is a weak reference to the key) */
    LEAF_HASATTR,  /* hasattr(v, a) is b */
    LEAF_TENSOR,   /* TensorGuard a matches v */
    LEAF_CALL_IS,  /* a() is b */
    LEAF_CALL_EQ,  /* bool(a() == b) */
    LEAF_PYTHON,   /* bool(a(*args)): a guard no other leaf expresses */
    LEAF_COUNT
} LeafKind;

static const char *const leaf_names[LEAF_COUNT] = {
    "type", "id", "is", "eq", "same", "nan", "len", "falsy", "keys", "hasattr", "tensor",
    "call_is", "call_eq", "python",
};

typedef struct {
    LeafKind kind;
    PyObject *a, *b;   /* strong references (b may be NULL) */
    Py_ssize_t n;      /* LEN: the length; HASATTR: the expected flag */
    uintptr_t id;      /* ID */
    uint64_t seen_tag; /* KEYS: version tag of the exact dict that last passed, 0: none */
    /* CALL_IS/CALL_EQ on one of torch's global-state getters (grad mode, default dtype...):
     * its C++ reader and the reading that passes (_tensorcheck's state_getter); NULL: a is
     * called */
    int64_t (*state_read)(void);
    int64_t state_code;
} Leaf;

typedef struct Node {
    Accessor acc;
    PyObject *key;     /* GLOBAL/ATTR/ITEM key, CONST object (strong) */
    Py_ssize_t index;  /* ARG/CLOSURE slot; ITEM: the int key, or PY_SSIZE_T_MIN */
    /* ATTR: the last type found to read `key` from the instance __dict__ (borrowed, only
     * compared) and its version tag; see attr_in_instance_dict() */
    PyTypeObject *dict_type;
    unsigned int dict_type_version;
    /* Skipping what cannot fail (see "Memo" below). As a parent: its first ncand children
     * are memo candidates, and the memo of their last full pass is the value's type (and
     * version tag) and instance __dict__ (borrowed, and its version tag); memo_dict NULL:
     * none. As a candidate: its kind, and its value at that pass (borrowed) with, for a
     * dict value, the dict's version tag. */
    Py_ssize_t ncand;
    PyTypeObject *memo_type;
    unsigned int memo_type_version;
    PyObject *memo_dict;
    uint64_t memo_dict_tag;
    int cand;
    PyObject *memo_value;
    uint64_t memo_value_tag;
    /* 3.13, a value whose __dict__ is a split table (see "Memo"): as a parent, memo_slots
     * says the memo holds by slot, and memo_keys is the table's keys; as a candidate, its
     * name's entry index in those keys and the object read at the last full pass (strong:
     * while held, no other object can have its address). */
    int memo_slots;
    void *memo_keys;
    Py_ssize_t slot;
    PyObject *memo_ref;
    Py_ssize_t memo_hits; /* calls whose candidates the memo answered (GuardTree.memo_hits) */
    Py_ssize_t nleaves, nchildren;
    Leaf *leaves;
    struct Node *children;
} Node;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;    /* instance attributes (guards.py sets .guards, .failure_reason...) */
    PyObject *globals; /* the frame's globals: GLOBAL nodes read it */
    Py_ssize_t nargs;
    Py_ssize_t nnodes, nleaves;
    Py_ssize_t nstate; /* CALL_IS/CALL_EQ leaves read in C++ (state_read) */
    Node root;
} GuardTree;

/* ------------------------------------------------------------------------------------ */
/* Checking                                                                              */
/* ------------------------------------------------------------------------------------ */

/* A new reference to weak reference r's object, or NULL without an exception once it died
 * (a guard reading a dead key fails: nothing alive can be that key). */
static PyObject *
weak_get(PyObject *r)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o = NULL;
    if (PyWeakref_GetRef(r, &o) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return o;
#else
    PyObject *o = PyWeakref_GET_OBJECT(r);
    return o == Py_None ? NULL : Py_NewRef(o);
#endif
}

/* d's version tag, or 0 (never equal to a remembered tag: nothing is skipped) where the
 * tag does not follow d's changes (DICT_VERSION_TRUSTED, _kiln_internal.h). */
static inline uint64_t
dict_version(PyObject *d)
{
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return DICT_VERSION_TRUSTED(d) ? ((PyDictObject *)d)->ma_version_tag : 0;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
}

static int
truth_of(PyObject *r)
{
    if (r == NULL) {
        return -1;
    }
    int t = r == Py_True ? 1 : r == Py_False ? 0 : PyObject_IsTrue(r);
    Py_DECREF(r);
    return t;
}

static int
keys_match(Leaf *l, PyObject *v)
{
    PyObject *expected = l->a;
    if (PyDict_CheckExact(v)) {
        uint64_t tag = dict_version(v);
        if (tag != 0 && tag == l->seen_tag) {
            return 1;
        }
        if (PyDict_GET_SIZE(v) != PyList_GET_SIZE(expected)) {
            return 0;
        }
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *val;
        while (PyDict_Next(v, &pos, &k, &val)) {
            if (i >= PyList_GET_SIZE(expected)) {
                return 0; /* the dict grew while a key compared */
            }
            int weak = l->b != Py_None && PyTuple_GET_ITEM(l->b, i) == Py_True;
            PyObject *e = PyList_GET_ITEM(expected, i++);
            if (weak) { /* an identity key: the object itself, or a miss once it died */
                PyObject *obj = weak_get(e);
                Py_XDECREF(obj);
                if (obj != k) {
                    return 0;
                }
            }
            else if (k != e) {
                Py_INCREF(k);
                Py_INCREF(e);
                int eq = PyObject_RichCompareBool(k, e, Py_EQ);
                Py_DECREF(k);
                Py_DECREF(e);
                if (eq <= 0) {
                    return eq;
                }
            }
        }
        if (i != PyList_GET_SIZE(expected)) {
            return 0;
        }
        if (dict_version(v) == tag) { /* no __eq__ above changed it */
            l->seen_tag = tag;
        }
        return 1;
    }
    /* a dict subclass (OrderedDict keeps its own order): as Python would */
    PyObject *keys = PyObject_CallMethod(v, "keys", NULL);
    if (keys == NULL) {
        return -1;
    }
    PyObject *list = PySequence_List(keys);
    Py_DECREF(keys);
    if (list == NULL) {
        return -1;
    }
    if (l->b != Py_None) { /* the live keys, in place of their weak references */
        PyObject *live = PySequence_List(expected);
        if (live == NULL) {
            Py_DECREF(list);
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(live); i++) {
            if (PyTuple_GET_ITEM(l->b, i) == Py_True) {
                PyObject *obj = weak_get(PyList_GET_ITEM(live, i));
                if (obj == NULL) {
                    Py_DECREF(live);
                    Py_DECREF(list);
                    return 0;
                }
                PyList_SetItem(live, i, obj); /* (steals obj) */
            }
        }
        int eq = truth_of(PyObject_RichCompare(list, live, Py_EQ));
        Py_DECREF(live);
        Py_DECREF(list);
        return eq;
    }
    int eq = truth_of(PyObject_RichCompare(list, expected, Py_EQ));
    Py_DECREF(list);
    return eq;
}

static int
leaf_check(Leaf *l, PyObject *v, PyObject *const *args, Py_ssize_t nargs)
{
    switch (l->kind) {
    case LEAF_TYPE:
        return (PyObject *)Py_TYPE(v) == l->a;
    case LEAF_ID:
        return (uintptr_t)v == l->id;
    case LEAF_IS:
        return v == l->a;
    case LEAF_EQ:
        return truth_of(PyObject_RichCompare(v, l->a, Py_EQ));
    case LEAF_SAME:
        return PyObject_RichCompareBool(v, l->a, Py_EQ);
    case LEAF_NAN:
        return truth_of(PyObject_RichCompare(v, v, Py_NE));
    case LEAF_LEN: {
        Py_ssize_t n = (PyList_CheckExact(v) || PyTuple_CheckExact(v)) ? Py_SIZE(v)
                       : PyDict_CheckExact(v)                          ? PyDict_GET_SIZE(v)
                                                                       : PyObject_Size(v);
        return n < 0 ? -1 : n == l->n;
    }
    case LEAF_FALSY: {
        if (PyDict_CheckExact(v)) {
            return PyDict_GET_SIZE(v) == 0;
        }
        int t = PyObject_IsTrue(v);
        return t < 0 ? -1 : !t;
    }
    case LEAF_KEYS:
        return keys_match(l, v);
    case LEAF_HASATTR: {
        PyObject *res = NULL;
        int has = KILN_LOOKUP_ATTR(v, l->a, &res);
        Py_XDECREF(res);
        return has < 0 ? -1 : has == l->n;
    }
    case LEAF_TENSOR:
        return kiln_tensorguard_check(l->a, v);
    case LEAF_CALL_IS: {
        if (l->state_read != NULL) {
            return l->state_read() == l->state_code;
        }
        PyObject *r = PyObject_CallNoArgs(l->a);
        if (r == NULL) {
            return -1;
        }
        int ok = r == l->b;
        Py_DECREF(r);
        return ok;
    }
    case LEAF_CALL_EQ: {
        if (l->state_read != NULL) {
            return l->state_read() == l->state_code;
        }
        PyObject *r = PyObject_CallNoArgs(l->a);
        if (r == NULL) {
            return -1;
        }
        int ok = truth_of(PyObject_RichCompare(r, l->b, Py_EQ));
        Py_DECREF(r);
        return ok;
    }
    case LEAF_PYTHON:
        return truth_of(PyObject_Vectorcall(l->a, args, nargs, NULL));
    default:
        PyErr_Format(PyExc_SystemError, "GuardTree: bad leaf kind %d", (int)l->kind);
        return -1;
    }
}

/* What getattr() runs for a Python class that defines __getattr__ (found at init from a
 * probe class): it tries object.__getattribute__ first, so an instance-__dict__ hit is
 * the answer, as for PyObject_GenericGetAttr. */
static getattrofunc getattr_hook_slot = NULL;
static PyObject *object_getattribute = NULL; /* object.__getattribute__ */
static PyObject *str_getattribute = NULL;

/* Whether `getattr(obj, name)` is `obj.__dict__[name]` for every obj of type tp whose
 * __dict__ holds name: tp looks attributes up generically (object.__getattribute__, with
 * or without a __getattr__ for misses) and no class in its MRO has a data descriptor
 * (property, slot, ...) called name, which would win over the __dict__. The answer holds
 * while tp's version tag is unchanged: assigning an attribute of tp or of a base changes
 * it (PyType_Modified), and tags are never reused. */
static int
attr_in_instance_dict(PyTypeObject *tp, PyObject *name)
{
    if (tp->tp_dictoffset == 0 && !(tp->tp_flags & Py_TPFLAGS_MANAGED_DICT)) {
        return 0;
    }
    /* a module's getattr also looks in its __dict__ first (then calls a module __getattr__) */
    if (tp->tp_getattro != PyObject_GenericGetAttr && tp->tp_getattro != PyModule_Type.tp_getattro) {
        if (tp->tp_getattro != getattr_hook_slot ||
            _PyType_Lookup(tp, str_getattribute) != object_getattribute) {
            return 0;
        }
    }
    PyObject *descr = _PyType_Lookup(tp, name);
    if (descr != NULL && Py_TYPE(descr)->tp_descr_set != NULL) {
        return 0;
    }
    return TYPE_VERSION_VALID(tp);
}

static PyObject *
fetch_attr(Node *n, PyObject *obj, int *from_dict_hit)
{
    PyTypeObject *tp = Py_TYPE(obj);
    int from_dict = tp == n->dict_type && tp->tp_version_tag == n->dict_type_version &&
                    TYPE_VERSION_VALID(tp);
    if (!from_dict && attr_in_instance_dict(tp, n->key)) {
        n->dict_type = tp;
        n->dict_type_version = tp->tp_version_tag;
        from_dict = 1;
    }
    if (from_dict) {
        PyObject **dictptr = _PyObject_GetDictPtr(obj);
        if (dictptr != NULL && *dictptr != NULL && PyDict_CheckExact(*dictptr)) {
            PyObject *v = PyDict_GetItemWithError(*dictptr, n->key);
            if (v != NULL) {
                *from_dict_hit = 1;
                return Py_NewRef(v);
            }
            if (PyErr_Occurred()) {
                return NULL;
            }
        }
    }
    return PyObject_GetAttr(obj, n->key); /* not in the __dict__: getattr says what */
}

/* A new reference to node n's value, read from its parent's value; NULL without an
 * exception for a value that is not there (a missing key or global, an empty cell), which
 * fails the guards below; NULL with an exception on error. */
static PyObject *
fetch(Node *n, PyObject *parent, PyObject *const *args, PyObject *globals, int *from_dict_hit)
{
    PyObject *v;
    *from_dict_hit = 0;
    switch (n->acc) {
    case ACC_ARG:
        return Py_NewRef(args[n->index]);
    case ACC_CONST:
        return Py_NewRef(n->key);
    case ACC_GLOBAL:
        if (PyDict_CheckExact(globals)) {
            v = PyDict_GetItemWithError(globals, n->key);
            return v == NULL ? NULL : Py_NewRef(v);
        }
        return PyObject_GetItem(globals, n->key);
    case ACC_CLOSURE: {
        PyObject *func = kiln_guarded_function();
        if (func == NULL || !PyFunction_Check(func)) {
            return NULL;
        }
        PyObject *closure = PyFunction_GET_CLOSURE(func);
        if (closure == NULL || !PyTuple_Check(closure) || n->index >= PyTuple_GET_SIZE(closure)) {
            return NULL;
        }
        v = PyCell_GET(PyTuple_GET_ITEM(closure, n->index));
        return v == NULL ? NULL : Py_NewRef(v);
    }
    case ACC_ATTR:
        return fetch_attr(n, parent, from_dict_hit);
    case ACC_ITEM:
        if (PyDict_CheckExact(parent)) {
            v = PyDict_GetItemWithError(parent, n->key);
            return v == NULL ? NULL : Py_NewRef(v);
        }
        if (n->index != PY_SSIZE_T_MIN && (PyList_CheckExact(parent) || PyTuple_CheckExact(parent))) {
            Py_ssize_t i = n->index, size = Py_SIZE(parent);
            if (i < 0) {
                i += size;
            }
            if (i < 0 || i >= size) {
                return NULL;
            }
            return Py_NewRef(PyList_CheckExact(parent) ? PyList_GET_ITEM(parent, i)
                                                        : PyTuple_GET_ITEM(parent, i));
        }
        return PyObject_GetItem(parent, n->key);
    case ACC_DICT_KEY: {
        if (PyDict_CheckExact(parent)) {
            Py_ssize_t pos = 0, i = 0;
            PyObject *k, *val;
            while (PyDict_Next(parent, &pos, &k, &val)) {
                if (i++ == n->index) {
                    return Py_NewRef(k);
                }
            }
            return NULL;
        }
        PyObject *keys = PyObject_CallMethod(parent, "keys", NULL);
        if (keys == NULL) {
            return NULL;
        }
        PyObject *list = PySequence_List(keys);
        Py_DECREF(keys);
        if (list == NULL) {
            return NULL;
        }
        v = n->index < PyList_GET_SIZE(list) ? Py_NewRef(PyList_GET_ITEM(list, n->index)) : NULL;
        Py_DECREF(list);
        return v;
    }
    case ACC_WEAK_ITEM: {
        PyObject *key = weak_get(n->key);
        if (key == NULL) {
            return NULL;
        }
        if (PyDict_CheckExact(parent)) {
            v = PyDict_GetItemWithError(parent, key);
            Py_XINCREF(v);
        }
        else {
            v = PyObject_GetItem(parent, key);
        }
        Py_DECREF(key);
        return v;
    }
    default:
        PyErr_Format(PyExc_SystemError, "GuardTree: bad accessor %d", (int)n->acc);
        return NULL;
    }
}

/* ------------------------------------------------------------------------------------ */
/* Memo: skipping checks that cannot fail                                                */
/* ------------------------------------------------------------------------------------ */
/*
 * A module's settings (.training, .eps, .stride...) and its hook dicts are read from its
 * instance __dict__ on every call, and their checks depend only on which object was read
 * (identity, type, value of an immutable scalar) or on a dict's contents. So: after a full
 * pass in which every candidate child (an attribute with no children of its own and only
 * such leaves) was read from the parent's __dict__, the parent node remembers its value's
 * type (+ version tag) and __dict__ (+ version tag). Next call, if the value has that type
 * with that tag and that very __dict__ with that tag, each attribute read would give the
 * same object as then (the dict is unchanged, and attribute lookup on the unchanged type
 * still goes to the __dict__: attr_in_instance_dict), so the identity and immutable-value
 * checks pass again without reading anything; a dict value (a hook dict) still compares
 * its own version tag (dict contents changed without its owner's __dict__ changing). The
 * remembered pointers are borrowed: they are only compared, or read while the unchanged
 * owning dict keeps them alive. Version tags are never reused (types: a global counter;
 * dicts: PEP 509), so a freed object whose address is reused cannot match.
 *
 * On 3.13 an instance __dict__ that shares its object's inline values (a split table) has
 * no trustworthy tag (dict_version() 0): `o.x = v` writes the shared values with neither a
 * new tag nor a dict-watcher event. There the memo holds by slot instead: after a full pure
 * pass, each candidate remembers the entry index of its name in the table's keys and holds
 * (strongly) the object it read. A later value of the same type (same version tag) whose
 * __dict__ is a split table with the same keys object, where each candidate's entry still
 * names it and the value slot at that index still holds that very object, would give the
 * same object to every attribute read (the unchanged type still reads them from the
 * __dict__), so the checks pass again. An attribute stored, deleted or replaced changes the
 * slot; a dict replaced by a combined one, or another keys object, is a miss; the strong
 * reference rules out an address reused by another object.
 */
enum { CAND_NONE, CAND_IDENTITY, CAND_VALUE, CAND_DICT };

/* An immutable scalar, or an exact tuple of them: == on it gives what it gave before. */
static int
deep_immutable(PyObject *o, int depth)
{
    PyTypeObject *tp = Py_TYPE(o);
    if (o == Py_None || tp == &PyLong_Type || tp == &PyFloat_Type || tp == &PyUnicode_Type ||
        tp == &PyBool_Type || tp == &PyBytes_Type || tp == &PyComplex_Type) {
        return 1;
    }
    if (tp == &PyTuple_Type && depth < 4) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++) {
            if (!deep_immutable(PyTuple_GET_ITEM(o, i), depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    return 0;
}

/* A dict whose truth and length are its storage's (no Python __len__/__bool__). */
static int
plain_dict(PyObject *o, int keys_leaf)
{
    return PyDict_CheckExact(o) || (!keys_leaf && PyODict_CheckExact(o));
}

/* The candidate kind of a built child (CAND_NONE: always checked in full): an attribute
 * whose leaves are all of the kinds below, with no children, or only items (of items...)
 * with such leaves, checked as CAND_VALUE: an immutable tuple's items are fixed too. */
static int
candidate_kind_at(Node *c, Accessor acc)
{
    if (c->acc != acc || (c->nleaves == 0 && c->nchildren == 0)) {
        return CAND_NONE;
    }
    int value = 0, dict = 0;
    for (Py_ssize_t i = 0; i < c->nleaves; i++) {
        Leaf *l = &c->leaves[i];
        switch (l->kind) {
        case LEAF_ID:
        case LEAF_IS:
            break;
        case LEAF_TYPE: { /* an object of an immutable type cannot change its __class__ */
            PyTypeObject *tp = (PyTypeObject *)l->a;
            if (!(tp->tp_flags & Py_TPFLAGS_IMMUTABLETYPE) ||
                PyType_IsSubtype(tp, &PyModule_Type)) {
                return CAND_NONE;
            }
            break;
        }
        case LEAF_EQ:
        case LEAF_SAME: /* the constant too: its __eq__ may be asked first */
            if (!deep_immutable(l->a, 0)) {
                return CAND_NONE;
            }
            value = 1;
            break;
        case LEAF_NAN:
            value = 1;
            break;
        case LEAF_FALSY:
        case LEAF_LEN:
        case LEAF_KEYS:
            dict = 1;
            break;
        default:
            return CAND_NONE;
        }
    }
    if (value && dict) {
        return CAND_NONE;
    }
    if (c->nchildren > 0) {
        if (dict) {
            return CAND_NONE;
        }
        for (Py_ssize_t i = 0; i < c->nchildren; i++) {
            if (candidate_kind_at(&c->children[i], ACC_ITEM) == CAND_NONE) {
                return CAND_NONE;
            }
        }
        return CAND_VALUE;
    }
    return dict ? CAND_DICT : value ? CAND_VALUE : CAND_IDENTITY;
}

static int
candidate_kind(Node *c)
{
    return candidate_kind_at(c, ACC_ATTR);
}

static int
has_keys_leaf(Node *c)
{
    for (Py_ssize_t i = 0; i < c->nleaves; i++) {
        if (c->leaves[i].kind == LEAF_KEYS) {
            return 1;
        }
    }
    return 0;
}

static PyObject *
instance_dict(PyObject *v)
{
    PyObject **dictptr = _PyObject_GetDictPtr(v);
    return dictptr != NULL ? *dictptr : NULL;
}

#if KILN_PY313
/* v's __dict__ as a split table (NULL: none, or a combined table). */
static PyDictObject *
split_dict(PyObject *v)
{
    PyObject *d = instance_dict(v);
    return d != NULL && PyDict_CheckExact(d) && ((PyDictObject *)d)->ma_values != NULL
               ? (PyDictObject *)d
               : NULL;
}

/* The slot memo of n (see "Memo"): each candidate's slot still holds the object it read. */
static int
memo_slots_hit(Node *n, PyObject *v)
{
    PyDictObject *d = split_dict(v);
    if (d == NULL || (void *)d->ma_keys != n->memo_keys) {
        return 0;
    }
    PyDictKeysObject *keys = d->ma_keys;
    PyDictValues *values = d->ma_values;
    if (keys->dk_kind != DICT_KEYS_SPLIT) {
        return 0;
    }
    PyDictUnicodeEntry *entries = DK_UNICODE_ENTRIES(keys);
    for (Py_ssize_t i = 0; i < n->ncand; i++) {
        Node *c = &n->children[i];
        Py_ssize_t ix = c->slot;
        if (ix < 0 || ix >= keys->dk_nentries || ix >= values->capacity ||
            entries[ix].me_key != c->key || values->values[ix] != c->memo_ref) {
            return 0;
        }
    }
    return 1;
}

/* After a full pure pass over n's candidates on v, whose __dict__ d is a split table: the
 * slot memo, or 0 where a candidate's name has no entry holding what was read. */
static int
memo_slots_record(Node *n, PyDictObject *d)
{
    PyDictKeysObject *keys = d->ma_keys;
    if (keys->dk_kind != DICT_KEYS_SPLIT) {
        return 0;
    }
    PyDictUnicodeEntry *entries = DK_UNICODE_ENTRIES(keys);
    for (Py_ssize_t i = 0; i < n->ncand; i++) {
        Node *c = &n->children[i];
        Py_CLEAR(c->memo_ref);
        c->slot = -1;
        for (Py_ssize_t ix = 0; ix < keys->dk_nentries && ix < d->ma_values->capacity; ix++) {
            if (entries[ix].me_key == c->key) {
                c->slot = ix;
                break;
            }
        }
        if (c->slot < 0 || d->ma_values->values[c->slot] != c->memo_value) {
            return 0;
        }
        c->memo_ref = Py_NewRef(c->memo_value);
    }
    n->memo_keys = (void *)keys;
    return 1;
}
#endif

static int
memo_hit(Node *n, PyObject *v)
{
    PyTypeObject *tp = Py_TYPE(v);
    if (n->memo_dict == NULL || tp != n->memo_type || !TYPE_VERSION_VALID(tp) ||
        tp->tp_version_tag != n->memo_type_version) {
        return 0;
    }
#if KILN_PY313
    if (n->memo_slots) {
        return memo_slots_hit(n, v);
    }
#endif
    return instance_dict(v) == n->memo_dict && dict_version(n->memo_dict) == n->memo_dict_tag;
}

static int node_check(Node *n, PyObject *v, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *globals);

/* Fetches and checks child c of a node whose value is v. *pure (if not NULL) is cleared
 * unless c's value came from v's __dict__ and c may be skipped next time; c's memo_value
 * and memo_value_tag are set. */
static int
child_check(Node *c, PyObject *v, PyObject *const *args, Py_ssize_t nargs, PyObject *globals,
            int *pure)
{
    int from_dict;
    PyObject *cv = fetch(c, v, args, globals, &from_dict);
    if (cv == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    uint64_t tag = (pure && PyDict_Check(cv)) ? dict_version(cv) : 0;
    int r = node_check(c, cv, args, nargs, globals);
    if (pure != NULL && *pure && r == 1) {
        int ok = from_dict;
        if (ok && c->cand == CAND_VALUE) {
            ok = deep_immutable(cv, 0);
        }
        else if (ok && c->cand == CAND_DICT) {
            ok = plain_dict(cv, has_keys_leaf(c)) && tag != 0 && dict_version(cv) == tag;
        }
        c->memo_value = cv;
        c->memo_value_tag = c->cand == CAND_DICT ? tag : 0;
        *pure = ok;
    }
    Py_DECREF(cv);
    return r;
}

static int
node_check(Node *n, PyObject *v, PyObject *const *args, Py_ssize_t nargs, PyObject *globals)
{
    for (Py_ssize_t i = 0; i < n->nleaves; i++) {
        int r = leaf_check(&n->leaves[i], v, args, nargs);
        if (r != 1) {
            return r;
        }
    }
    Py_ssize_t i = 0;
    if (n->ncand > 0) {
        if (memo_hit(n, v)) {
            n->memo_hits++;
            for (; i < n->ncand; i++) {
                Node *c = &n->children[i];
                if (c->cand == CAND_DICT && dict_version(c->memo_value) != c->memo_value_tag) {
                    int pure = 1;
                    int r = child_check(c, v, args, nargs, globals, &pure);
                    if (r != 1) {
                        return r;
                    }
                    if (!pure) {
                        n->memo_dict = NULL;
                    }
                }
            }
        }
        else {
            PyObject *dict = instance_dict(v);
            uint64_t dict_tag = dict != NULL && PyDict_CheckExact(dict) ? dict_version(dict) : 0;
            int pure = dict_tag != 0;
#if KILN_PY313
            PyDictObject *split = dict_tag == 0 ? split_dict(v) : NULL;
            pure = pure || split != NULL;
#endif
            n->memo_dict = NULL;
            for (; i < n->ncand; i++) {
                int r = child_check(&n->children[i], v, args, nargs, globals, &pure);
                if (r != 1) {
                    return r;
                }
            }
            PyTypeObject *tp = Py_TYPE(v);
            if (pure && instance_dict(v) == dict && TYPE_VERSION_VALID(tp)) {
                int memo = dict_tag != 0 && dict_version(dict) == dict_tag;
#if KILN_PY313
                n->memo_slots = 0;
                if (!memo && split != NULL && (PyObject *)split == dict) {
                    memo = n->memo_slots = memo_slots_record(n, split);
                }
#endif
                if (memo) {
                    n->memo_type = tp;
                    n->memo_type_version = tp->tp_version_tag;
                    n->memo_dict = dict;
                    n->memo_dict_tag = dict_tag;
                }
            }
        }
    }
    for (; i < n->nchildren; i++) {
        int r = child_check(&n->children[i], v, args, nargs, globals, NULL);
        if (r != 1) {
            return r;
        }
    }
    return 1;
}

static PyObject *
guardtree_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    GuardTree *t = (GuardTree *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != t->nargs || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_Format(PyExc_TypeError, "GuardTree takes exactly %zd positional arguments (%zd given)",
                     t->nargs, nargs);
        return NULL;
    }
    int r = node_check(&t->root, NULL, args, nargs, t->globals);
    if (r < 0) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL;
        }
        PyErr_Clear();
        r = 0;
    }
    return Py_NewRef(r ? Py_True : Py_False);
}

/* ------------------------------------------------------------------------------------ */
/* Building from the nested-tuple spec                                                   */
/* ------------------------------------------------------------------------------------ */

static void
node_free(Node *n)
{
    for (Py_ssize_t i = 0; i < n->nleaves; i++) {
        Py_CLEAR(n->leaves[i].a);
        Py_CLEAR(n->leaves[i].b);
    }
    for (Py_ssize_t i = 0; i < n->nchildren; i++) {
        node_free(&n->children[i]);
    }
    Py_CLEAR(n->memo_ref);
    PyMem_Free(n->leaves);
    PyMem_Free(n->children);
    Py_CLEAR(n->key);
    n->leaves = NULL;
    n->children = NULL;
    n->nleaves = n->nchildren = 0;
}

static int
node_traverse(Node *n, visitproc visit, void *arg)
{
    Py_VISIT(n->key);
    Py_VISIT(n->memo_ref);
    for (Py_ssize_t i = 0; i < n->nleaves; i++) {
        Py_VISIT(n->leaves[i].a);
        Py_VISIT(n->leaves[i].b);
    }
    for (Py_ssize_t i = 0; i < n->nchildren; i++) {
        int r = node_traverse(&n->children[i], visit, arg);
        if (r) {
            return r;
        }
    }
    return 0;
}

/* The table index of `name` (a str), or -1 with a ValueError naming it. */
static int
lookup_name(PyObject *name, const char *const *names, int count, const char *what)
{
    if (PyUnicode_Check(name)) {
        for (int i = 0; i < count; i++) {
            if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) {
                return i;
            }
        }
    }
    PyErr_Format(PyExc_ValueError, "GuardTree: unknown %s %R", what, name);
    return -1;
}

/* A CALL_IS/CALL_EQ leaf on one of torch's global-state getters reads the state in C++
 * instead of calling the getter (a torch._C builtin; several per guarded call, each a
 * Python call that makes or looks up its result object). 0, or -1 with an exception. */
static int
leaf_read_state_in_cxx(GuardTree *t, Leaf *l)
{
    const KilnTensorCheckAPI *api = kiln_tensorcheck_api();
    if (api == NULL) {
        return 0;
    }
    int r = api->state_getter(l->a, l->b, l->kind == LEAF_CALL_IS, &l->state_read,
                              &l->state_code);
    if (r < 0) {
        return -1;
    }
    if (r == 0) {
        l->state_read = NULL;
    }
    else {
        t->nstate++;
    }
    return 0;
}

static int
leaf_build(GuardTree *t, Leaf *l, PyObject *spec)
{
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
        PyErr_Format(PyExc_TypeError, "GuardTree: a leaf is (kind, a, b), not %R", spec);
        return -1;
    }
    int kind = lookup_name(PyTuple_GET_ITEM(spec, 0), leaf_names, LEAF_COUNT, "leaf kind");
    if (kind < 0) {
        return -1;
    }
    l->kind = (LeafKind)kind;
    l->a = Py_NewRef(PyTuple_GET_ITEM(spec, 1));
    l->b = Py_NewRef(PyTuple_GET_ITEM(spec, 2));
    switch (l->kind) {
    case LEAF_TYPE:
        if (!PyType_Check(l->a)) {
            PyErr_Format(PyExc_TypeError, "GuardTree: a type leaf needs a type, not %R", l->a);
            return -1;
        }
        break;
    case LEAF_ID: {
        void *p = PyLong_AsVoidPtr(l->a);
        if (p == NULL && PyErr_Occurred()) {
            return -1;
        }
        l->id = (uintptr_t)p;
        break;
    }
    case LEAF_LEN:
        if ((l->n = PyLong_AsSsize_t(l->a)) == -1 && PyErr_Occurred()) {
            return -1;
        }
        break;
    case LEAF_KEYS:
        if (!PyList_CheckExact(l->a)) {
            PyErr_SetString(PyExc_TypeError, "GuardTree: a keys leaf needs a list");
            return -1;
        }
        if (l->b != Py_None) {
            if (!PyTuple_CheckExact(l->b) || PyTuple_GET_SIZE(l->b) != PyList_GET_SIZE(l->a)) {
                PyErr_SetString(PyExc_TypeError,
                                "GuardTree: a keys leaf's b is None or a flag per key");
                return -1;
            }
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(l->b); i++) {
                if (PyTuple_GET_ITEM(l->b, i) == Py_True &&
                    !PyWeakref_CheckRef(PyList_GET_ITEM(l->a, i))) {
                    PyErr_SetString(PyExc_TypeError,
                                    "GuardTree: a weak key of a keys leaf is a weakref.ref");
                    return -1;
                }
            }
        }
        break;
    case LEAF_HASATTR:
        if (!PyUnicode_Check(l->a) || (l->n = PyObject_IsTrue(l->b)) < 0) {
            PyErr_SetString(PyExc_TypeError, "GuardTree: a hasattr leaf needs (name, flag)");
            return -1;
        }
        break;
    case LEAF_TENSOR:
        if (!kiln_is_tensorguard(l->a)) {
            PyErr_Format(PyExc_TypeError, "GuardTree: a tensor leaf needs a TensorGuard, not %R",
                         l->a);
            return -1;
        }
        break;
    case LEAF_CALL_IS:
    case LEAF_CALL_EQ:
    case LEAF_PYTHON:
        if (!PyCallable_Check(l->a)) {
            PyErr_Format(PyExc_TypeError, "GuardTree: a %s leaf needs a callable, not %R",
                         leaf_names[l->kind], l->a);
            return -1;
        }
        if (l->kind != LEAF_PYTHON) {
            return leaf_read_state_in_cxx(t, l);
        }
        break;
    default:
        break;
    }
    return 0;
}

static int
node_build(GuardTree *t, Node *n, PyObject *spec, int level)
{
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 4 ||
        !PyTuple_Check(PyTuple_GET_ITEM(spec, 2)) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 3))) {
        PyErr_Format(PyExc_TypeError,
                     "GuardTree: a node is (accessor, key, leaves tuple, children tuple), not %R",
                     spec);
        return -1;
    }
    int acc = lookup_name(PyTuple_GET_ITEM(spec, 0), accessor_names, ACC_COUNT, "accessor");
    if (acc < 0) {
        return -1;
    }
    n->acc = (Accessor)acc;
    n->key = Py_NewRef(PyTuple_GET_ITEM(spec, 1));
    n->index = PY_SSIZE_T_MIN;
    n->slot = -1;
    /* the root reads nothing; its children read the frame; the nodes below read their
     * parent's value */
    int top = acc == ACC_ARG || acc == ACC_GLOBAL || acc == ACC_CLOSURE || acc == ACC_CONST;
    if (level == 0 ? acc != ACC_ROOT : level == 1 ? !top : (top || acc == ACC_ROOT)) {
        PyErr_Format(PyExc_ValueError, "GuardTree: accessor %s at depth %d", accessor_names[acc],
                     level);
        return -1;
    }
    if (acc == ACC_ARG || acc == ACC_CLOSURE || acc == ACC_DICT_KEY) {
        n->index = PyLong_AsSsize_t(n->key);
        if (n->index == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (n->index < 0 || (acc == ACC_ARG && n->index >= t->nargs)) { /* (a key's too) */
            PyErr_Format(PyExc_ValueError, "GuardTree: %s slot %zd out of range",
                         accessor_names[acc], n->index);
            return -1;
        }
    }
    else if (acc == ACC_ITEM && PyUnicode_CheckExact(n->key)) {
        PyUnicode_InternInPlace(&n->key);
    }
    else if (acc == ACC_ITEM && PyLong_CheckExact(n->key)) {
        n->index = PyLong_AsSsize_t(n->key);
        if (n->index == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* a huge int: generic item access */
            n->index = PY_SSIZE_T_MIN;
        }
    }
    else if (acc == ACC_WEAK_ITEM && !PyWeakref_CheckRef(n->key)) {
        PyErr_Format(PyExc_TypeError, "GuardTree: a weak_item key is a weakref.ref, not %R",
                     n->key);
        return -1;
    }
    else if (acc == ACC_ATTR) {
        if (!PyUnicode_CheckExact(n->key)) {
            PyErr_Format(PyExc_TypeError, "GuardTree: attribute name %R is not a str", n->key);
            return -1;
        }
        PyUnicode_InternInPlace(&n->key); /* getattr's dict lookups then hit by identity */
    }
    PyObject *leaves = PyTuple_GET_ITEM(spec, 2), *children = PyTuple_GET_ITEM(spec, 3);
    Py_ssize_t nl = PyTuple_GET_SIZE(leaves), nc = PyTuple_GET_SIZE(children);
    n->leaves = nl ? PyMem_Calloc(nl, sizeof(Leaf)) : NULL;
    n->children = nc ? PyMem_Calloc(nc, sizeof(Node)) : NULL;
    if ((nl && n->leaves == NULL) || (nc && n->children == NULL)) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < nl; i++) {
        n->nleaves = i + 1;
        if (leaf_build(t, &n->leaves[i], PyTuple_GET_ITEM(leaves, i)) < 0) {
            return -1;
        }
    }
    t->nleaves += nl;
    for (Py_ssize_t i = 0; i < nc; i++) {
        n->nchildren = i + 1;
        if (node_build(t, &n->children[i], PyTuple_GET_ITEM(children, i),
                       level < 2 ? level + 1 : 2) < 0) {
            return -1;
        }
        n->children[i].cand = candidate_kind(&n->children[i]);
    }
    /* memo candidates first (a stable partition: the others keep their order) */
    if (nc > 1) {
        Node *sorted = PyMem_Calloc(nc, sizeof(Node));
        if (sorted == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        Py_ssize_t k = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (Py_ssize_t i = 0; i < nc; i++) {
                if ((n->children[i].cand != CAND_NONE) == (pass == 0)) {
                    sorted[k++] = n->children[i];
                }
            }
        }
        PyMem_Free(n->children);
        n->children = sorted;
    }
    while (n->ncand < nc && n->children[n->ncand].cand != CAND_NONE) {
        n->ncand++;
    }
    t->nnodes += 1;
    return 0;
}

static int
guardtree_traverse(GuardTree *t, visitproc visit, void *arg)
{
    Py_VISIT(t->dict);
    Py_VISIT(t->globals);
    return node_traverse(&t->root, visit, arg);
}

static int
guardtree_clear(GuardTree *t)
{
    Py_CLEAR(t->dict);
    Py_CLEAR(t->globals);
    node_free(&t->root);
    return 0;
}

static void
guardtree_dealloc(GuardTree *t)
{
    PyObject_GC_UnTrack(t);
    guardtree_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *
guardtree_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"nargs", "globals", "root", NULL};
    Py_ssize_t nargs;
    PyObject *globals, *root;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nOO:GuardTree", kwlist, &nargs, &globals,
                                     &root)) {
        return NULL;
    }
    if (nargs < 0) {
        PyErr_SetString(PyExc_ValueError, "GuardTree: nargs < 0");
        return NULL;
    }
    GuardTree *t = (GuardTree *)type->tp_alloc(type, 0);
    if (t == NULL) {
        return NULL;
    }
    t->vectorcall = guardtree_vectorcall;
    t->nargs = nargs;
    t->globals = Py_NewRef(globals);
    if (node_build(t, &t->root, root, 0) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static PyObject *
guardtree_repr(GuardTree *t)
{
    return PyUnicode_FromFormat("<GuardTree: %zd nodes, %zd leaves, %zd args>", t->nnodes,
                                t->nleaves, t->nargs);
}

static PyMemberDef guardtree_members[] = {
    {"nodes", T_PYSSIZET, offsetof(GuardTree, nnodes), READONLY,
     "number of nodes (value fetches per call when every guard passes, plus the root)"},
    {"leaves", T_PYSSIZET, offsetof(GuardTree, nleaves), READONLY, "number of leaf checks"},
    {"nargs", T_PYSSIZET, offsetof(GuardTree, nargs), READONLY, "argument slots it takes"},
    {"state_leaves", T_PYSSIZET, offsetof(GuardTree, nstate), READONLY,
     "call_is/call_eq leaves on torch's global-state getters that read the state in C++ "
     "(kiln_frontend._tensorcheck) instead of calling the getter"},
    {NULL}};

static Py_ssize_t
node_memo_hits(Node *n)
{
    Py_ssize_t hits = n->memo_hits;
    for (Py_ssize_t i = 0; i < n->nchildren; i++) {
        hits += node_memo_hits(&n->children[i]);
    }
    return hits;
}

static PyObject *
guardtree_get_memo_hits(GuardTree *t, void *closure)
{
    return PyLong_FromSsize_t(node_memo_hits(&t->root));
}

static PyGetSetDef guardtree_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {"memo_hits", (getter)guardtree_get_memo_hits, NULL,
     "how many times a node's memo answered its candidate children without reading them "
     "(summed over the nodes): shows the memo works on this CPython"},
    {NULL}};

static PyTypeObject GuardTreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kiln_frontend._evalframe.GuardTree",
    .tp_basicsize = sizeof(GuardTree),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "GuardTree(nargs, globals, root)\n\n"
              "A frame's guards as one tree checked in C (see _guardtree.c and guards.py). "
              "tree(*args) -> bool; an exception while checking counts as a miss.",
    .tp_new = guardtree_new,
    .tp_dealloc = (destructor)guardtree_dealloc,
    .tp_traverse = (traverseproc)guardtree_traverse,
    .tp_clear = (inquiry)guardtree_clear,
    .tp_repr = (reprfunc)guardtree_repr,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(GuardTree, vectorcall),
    .tp_dictoffset = offsetof(GuardTree, dict),
    .tp_members = guardtree_members,
    .tp_getset = guardtree_getset,
};

/* getattr_hook_slot, from a class with a __getattr__ */
static int
find_getattr_hook_slot(void)
{
    PyObject *len = PyDict_GetItemString(PyEval_GetBuiltins(), "len"); /* borrowed */
    if (len == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GuardTree: no builtins.len");
        return -1;
    }
    PyObject *probe = PyObject_CallFunction((PyObject *)&PyType_Type, "s(O){sO}",
                                            "_kiln_getattr_probe", &PyBaseObject_Type,
                                            "__getattr__", len);
    if (probe == NULL) {
        return -1;
    }
    getattr_hook_slot = ((PyTypeObject *)probe)->tp_getattro;
    Py_DECREF(probe);
    return 0;
}

int
kiln_guardtree_init(PyObject *module)
{
    if (PyType_Ready(&GuardTreeType) < 0 || find_getattr_hook_slot() < 0) {
        return -1;
    }
    if ((str_getattribute = PyUnicode_InternFromString("__getattribute__")) == NULL) {
        return -1;
    }
    object_getattribute = _PyType_Lookup(&PyBaseObject_Type, str_getattribute);
    if (object_getattribute == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GuardTree: no object.__getattribute__");
        return -1;
    }
    Py_INCREF(object_getattribute);
    return PyModule_AddObjectRef(module, "GuardTree", (PyObject *)&GuardTreeType);
}
