/* The compiled front of hb.convert: the shortcut lookup, without a Python frame.
 *
 * Optional: when this module is not built, hurray_bridge/_dispatch.py does the same
 * steps in Python (and the test suite runs both). A hand-off such as Arrow -> NumPy
 * costs about 0.25 us when done directly; one Python frame in front of it is
 * already a 40 % overhead, so the step that decides "take the shortcut" lives here.
 *
 * Dispatcher(general, table) is a callable. For a call with exactly two positional
 * arguments (obj, to), and no keyword but copy=None or copy=False, it looks up
 * table[type(obj)][to]. An entry is a tuple (fn, attr, value, kwnames, kwvalues,
 * nonempty), as _shortcuts.entry() makes them (anything else is ignored): when attr
 * is not None, getattr(obj, attr) must equal value; when nonempty is True, len(obj)
 * must be above 0. It then returns
 * fn(obj, **dict(zip(kwnames, kwvalues))), unless fn returns NotImplemented or raises an
 * Exception, in which case -- and on any miss, or any other call form -- the call
 * goes to general(*args, **kwargs), which holds every rule and every error message.
 * A shortcut can only ever answer what general would have answered.
 */
#include "speedups.h"

#include <stddef.h>

#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL
#endif

#define MAX_KWARGS 4
#define ENTRY_SIZE 6

typedef struct {
    PyObject_HEAD
    PyObject *general;
    PyObject *table;
    PyObject *dict;
    vectorcallfunc vectorcall;
    /* The last entry served, by (type, target string) identity: a hand-off loop
     * converts one kind of object to one target, and the two dict lookups are a
     * third of this module's cost. Entries are never replaced once learned, so a
     * cached one stays right; forget() drops it when the table is cleared. */
    PyObject *last_type;
    PyObject *last_to;
    PyObject *last_entry;
} Dispatcher;

/* Leaves the error only when it is not an Exception (KeyboardInterrupt, SystemExit). */
static int
swallow(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* Whether entry is a well-formed (fn, attr, value, kwnames, kwvalues, nonempty). */
static int
valid_entry(PyObject *entry)
{
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != ENTRY_SIZE) {
        return 0;
    }
    PyObject *kwnames = PyTuple_GET_ITEM(entry, 3), *kwvalues = PyTuple_GET_ITEM(entry, 4);
    return PyTuple_CheckExact(kwnames) && PyTuple_CheckExact(kwvalues)
           && PyTuple_GET_SIZE(kwnames) == PyTuple_GET_SIZE(kwvalues)
           && PyTuple_GET_SIZE(kwnames) <= MAX_KWARGS;
}

/* A new reference to the shortcut's result; NULL with no error set means "not taken". */
static PyObject *
try_shortcut(Dispatcher *self, PyObject *const *args)
{
    PyObject *obj = args[0], *to = args[1];
    PyObject *entry;
    if ((PyObject *)Py_TYPE(obj) == self->last_type && to == self->last_to) {
        entry = Py_NewRef(self->last_entry);
    }
    else {
        if (!PyUnicode_CheckExact(to)) {
            return NULL;
        }
        PyObject *inner = PyDict_GetItemWithError(self->table, (PyObject *)Py_TYPE(obj));
        if (inner == NULL || !PyDict_CheckExact(inner)) {
            return NULL;  /* a type hashes by identity: no error can be set here */
        }
        entry = PyDict_GetItemWithError(inner, to);
        if (entry == NULL || !valid_entry(entry)) {
            if (entry == NULL && PyErr_Occurred()) {
                PyErr_Clear();
            }
            return NULL;
        }
        /* Own it before anything can run: releasing the old cached values below may
         * call finalisers, which may change the table or call this front again. */
        Py_INCREF(entry);
        PyObject *old_type = self->last_type, *old_to = self->last_to;
        PyObject *old_entry = self->last_entry;
        self->last_type = Py_NewRef((PyObject *)Py_TYPE(obj));
        self->last_to = Py_NewRef(to);
        self->last_entry = Py_NewRef(entry);
        Py_XDECREF(old_type);
        Py_XDECREF(old_to);
        Py_XDECREF(old_entry);
    }
    PyObject *result = NULL;
    if (PyTuple_GET_ITEM(entry, 5) == Py_True) {
        Py_ssize_t len = PyObject_Length(obj);
        if (len < 0) {
            goto failed;
        }
        if (len == 0) {
            goto done;
        }
    }
    if (PyTuple_GET_ITEM(entry, 1) != Py_None) {
        PyObject *got = PyObject_GetAttr(obj, PyTuple_GET_ITEM(entry, 1));
        if (got == NULL) {
            goto failed;
        }
        int same = PyObject_RichCompareBool(got, PyTuple_GET_ITEM(entry, 2), Py_EQ);
        Py_DECREF(got);
        if (same < 0) {
            goto failed;
        }
        if (!same) {
            goto done;
        }
    }
    PyObject *kwnames = PyTuple_GET_ITEM(entry, 3), *kwvalues = PyTuple_GET_ITEM(entry, 4);
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    PyObject *stack[1 + MAX_KWARGS];
    stack[0] = obj;
    for (Py_ssize_t i = 0; i < n; i++) {
        stack[1 + i] = PyTuple_GET_ITEM(kwvalues, i);
    }
    result = PyObject_Vectorcall(PyTuple_GET_ITEM(entry, 0), stack, 1, n ? kwnames : NULL);
    if (result == NULL) {
        goto failed;
    }
    if (result == Py_NotImplemented) {
        Py_CLEAR(result);
    }
    goto done;
failed:
    swallow();
done:
    Py_DECREF(entry);
    return result;
}

static PyObject *
dispatcher_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                      PyObject *kwnames)
{
    Dispatcher *self = (Dispatcher *)callable;
    /* (obj, to) alone, or with copy=None / copy=False as its one keyword: every shortcut
     * result shares the source's memory, so "never copy" changes nothing it returns. */
    int plain = kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0;
    if (!plain && PyTuple_GET_SIZE(kwnames) == 1 && PyVectorcall_NARGS(nargsf) == 2) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0), *value = args[2];
        plain = (value == Py_None || value == Py_False) && PyUnicode_Check(name)
                && PyUnicode_CompareWithASCIIString(name, "copy") == 0;
    }
    if (plain && PyVectorcall_NARGS(nargsf) == 2) {
        PyObject *result = try_shortcut(self, args);
        if (result != NULL || PyErr_Occurred()) {
            return result;
        }
    }
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
}

static PyObject *
dispatcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *general, *table;
    static char *kwlist[] = {"general", "table", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!:Dispatcher", kwlist, &general,
                                     &PyDict_Type, &table)) {
        return NULL;
    }
    if (!PyCallable_Check(general)) {
        PyErr_SetString(PyExc_TypeError, "Dispatcher: general must be callable");
        return NULL;
    }
    Dispatcher *self = (Dispatcher *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(general);
    self->general = general;
    Py_INCREF(table);
    self->table = table;
    self->dict = NULL;
    self->last_type = self->last_to = self->last_entry = NULL;
    self->vectorcall = dispatcher_vectorcall;
    return (PyObject *)self;
}

static int
dispatcher_traverse(Dispatcher *self, visitproc visit, void *arg)
{
    Py_VISIT(self->general);
    Py_VISIT(self->table);
    Py_VISIT(self->dict);
    Py_VISIT(self->last_type);
    Py_VISIT(self->last_to);
    Py_VISIT(self->last_entry);
    return 0;
}

static int
dispatcher_clear(Dispatcher *self)
{
    Py_CLEAR(self->general);
    Py_CLEAR(self->table);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->last_type);
    Py_CLEAR(self->last_to);
    Py_CLEAR(self->last_entry);
    return 0;
}

static void
dispatcher_dealloc(Dispatcher *self)
{
    PyObject_GC_UnTrack(self);
    dispatcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
dispatcher_get_general(Dispatcher *self, void *Py_UNUSED(closure))
{
    Py_INCREF(self->general);
    return self->general;
}

static PyObject *
dispatcher_get_table(Dispatcher *self, void *Py_UNUSED(closure))
{
    Py_INCREF(self->table);
    return self->table;
}

static PyObject *
dispatcher_forget(Dispatcher *self, PyObject *Py_UNUSED(ignored))
{
    Py_CLEAR(self->last_type);
    Py_CLEAR(self->last_to);
    Py_CLEAR(self->last_entry);
    Py_RETURN_NONE;
}

static PyObject *
dispatcher_repr(Dispatcher *self)
{
    return PyUnicode_FromFormat("<compiled shortcut front of %R>", self->general);
}

static PyMethodDef dispatcher_methods[] = {
    {"forget", (PyCFunction)dispatcher_forget, METH_NOARGS,
     "Drop the cached last entry (call after removing entries from the table)."},
    {NULL}
};

static PyGetSetDef dispatcher_getset[] = {
    {"general", (getter)dispatcher_get_general, NULL, "the full conversion", NULL},
    {"table", (getter)dispatcher_get_table, NULL, "type -> target -> shortcut entry", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}
};

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hurray_bridge._speedups.Dispatcher",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_dealloc = (destructor)dispatcher_dealloc,
    .tp_vectorcall_offset = offsetof(Dispatcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Dispatcher(general, table): table[type(obj)][to] shortcuts in front of general.",
    .tp_traverse = (traverseproc)dispatcher_traverse,
    .tp_clear = (inquiry)dispatcher_clear,
    .tp_getset = dispatcher_getset,
    .tp_methods = dispatcher_methods,
    .tp_repr = (reprfunc)dispatcher_repr,
    .tp_dictoffset = offsetof(Dispatcher, dict),
    .tp_new = dispatcher_new,
};

int
hb_add_front(PyObject *module)
{
    if (PyType_Ready(&DispatcherType) < 0) {
        return -1;
    }
    Py_INCREF(&DispatcherType);
    if (PyModule_AddObject(module, "Dispatcher", (PyObject *)&DispatcherType) < 0) {
        Py_DECREF(&DispatcherType);
        return -1;
    }
    return 0;
}
