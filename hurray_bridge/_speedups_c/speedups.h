/* What the sources of the one extension hurray_bridge._speedups share (not installed).
 *
 * module.c   the module: its function table and PyInit__speedups
 * front.c    Dispatcher, hb.convert's compiled shortcut front
 * deleters.c the DLPack deleter and capsule destructor of hurray_bridge._capsule's exports
 * decoder.c  the dense descriptor fast path of hurray_bridge.wire, over c/src/descriptor.c
 *
 * The directory is not called _speedups: a directory of that name next to the module
 * would import as a namespace package wherever the module was not built, and
 * `from . import _speedups` would then succeed with none of the functions in it.
 */
#ifndef HURRAY_SPEEDUPS_H
#define HURRAY_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Shared between these files only: not part of the extension's exported symbols. */
#if defined(__GNUC__) && !defined(_WIN32)
#define HB_INTERNAL __attribute__((visibility("hidden")))
#else
#define HB_INTERNAL
#endif

/* front.c: readies Dispatcher and adds it to the module; -1 with an exception set. */
HB_INTERNAL int hb_add_front(PyObject *module);

/* deleters.c */
HB_INTERNAL PyObject *hb_capsule_hooks(PyObject *module, PyObject *args);
HB_INTERNAL PyObject *hb_stop_foreign_releases(PyObject *module, PyObject *arg);

/* decoder.c */
HB_INTERNAL PyObject *hb_decode_dense(PyObject *module, PyObject *const *args,
                                      Py_ssize_t nargs);
HB_INTERNAL PyObject *hb_dense_decoder_setup(PyObject *module, PyObject *args);

#endif /* HURRAY_SPEEDUPS_H */
