/* What _evalframe.c shares with _guardtree.c inside the one extension module
 * kiln_frontend._evalframe (both files are compiled into it; hatch_build.py). */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include <Python.h>

/* TensorGuard's check on `value`: 1 match, 0 mismatch, -1 error. `guard` must be a
 * TensorGuard (kiln_is_tensorguard). */
int kiln_tensorguard_check(PyObject *guard, PyObject *value);
int kiln_is_tensorguard(PyObject *obj);

/* The function whose frame's guards are running on this thread (borrowed), or NULL. */
PyObject *kiln_guarded_function(void);

/* Adds the GuardTree type to the module. 0, or -1 with an exception. */
int kiln_guardtree_init(PyObject *module);

#endif
