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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "hurray.h" /* the C library's descriptor decoder (c/src/descriptor.c) */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _WIN32
#include <windows.h>
#else
#include <pthread.h>
#include <time.h>
#endif

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
dispatcher_get_general(Dispatcher *self, void *closure)
{
    Py_INCREF(self->general);
    return self->general;
}

static PyObject *
dispatcher_get_table(Dispatcher *self, void *closure)
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

/* ---------------------------------------------------------------------------
 * The DLPack deleter and capsule destructor of hurray_bridge._capsule's exports.
 *
 * The ctypes versions cannot leave an exception that was in flight when a consumer
 * released our memory (a TypeError raised while a NumPy temporary dies): ctypes
 * reports it as SystemError. In C the exception is simply set aside and put back.
 * Both only remove the export's entry from _capsule._EXPORTS (keyed by the managed
 * struct's address), which frees the struct and releases the owner. */

static PyObject *exports = NULL;   /* _capsule._EXPORTS */
static PyObject *names = NULL;     /* the two fresh-name bytes objects, kept alive */
static const char *name_v = NULL, *name_l = NULL;

static void
drop_export(void *managed)
{
    PyObject *key = PyLong_FromVoidPtr(managed);
    if (key == NULL || PyDict_DelItem(exports, key) < 0) {
        PyErr_Clear();  /* already gone (or out of memory): nothing else to do */
    }
    Py_XDECREF(key);
}

/* Interpreter exit. A thread that asks for the GIL while CPython finalises is ended
 * on the spot (pthread_exit), and the unwinding through the consumer's C++ frames --
 * XLA calls DLPack deleters from noexcept destructors on its worker threads --
 * ends in std::terminate ("terminate called without an active exception"). So at
 * exit, before finalisation, stop_foreign_releases() sets `exiting`; from then on a
 * thread that does not hold the GIL leaves the export alone (the process is ending)
 * instead of asking for it. Calls that passed the check earlier are counted in
 * `in_flight` and finish first: stop_foreign_releases() waits for them with the GIL
 * released. Sequentially consistent atomics, so the two sides cannot both miss the
 * other's write. */
static atomic_int exiting = 0;
static atomic_int in_flight = 0;

/* Whether this thread holds the GIL. Not PyGILState_Check(): it answers 1 on every
 * thread once a subinterpreter has been created, and after Py_Finalize on 3.10/3.11. */
static int
holds_gil(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked() != NULL;  /* this thread's attached state */
#elif PY_VERSION_HEX >= 0x030C0000
    return _PyThreadState_UncheckedGet() != NULL;  /* thread-local since 3.12 */
#else
    /* The state holding the GIL, process-wide: ours only if it is this thread's. */
    PyThreadState *current = _PyThreadState_UncheckedGet();
    return current != NULL && current == PyGILState_GetThisThreadState();
#endif
}

/* void (*deleter)(DLManagedTensor[Versioned] *self): any thread, GIL or not. */
static void
export_deleter(void *managed)
{
    if (managed == NULL || exports == NULL) {
        return;
    }
    atomic_fetch_add(&in_flight, 1);
    if (atomic_load(&exiting) && !holds_gil()) {
        atomic_fetch_sub(&in_flight, 1);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    drop_export(managed);
    PyErr_Restore(type, value, tb);
    PyGILState_Release(gil);
    atomic_fetch_sub(&in_flight, 1);
}

static double
monotonic_ms(void)
{
#ifdef _WIN32
    return (double)GetTickCount64();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
#endif
}

static void
sleep_1ms(void)
{
#ifdef _WIN32
    Sleep(1);
#else
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
#endif
}

/* stop_foreign_releases(timeout_ms) -> deleter calls still unfinished (0 normally). */
static PyObject *
stop_foreign_releases(PyObject *module, PyObject *arg)
{
    long timeout_ms = PyLong_AsLong(arg);
    if (timeout_ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    atomic_store(&exiting, 1);
    int left;
    Py_BEGIN_ALLOW_THREADS
    double deadline = monotonic_ms() + (double)timeout_ms;
    while ((left = atomic_load(&in_flight)) > 0 && monotonic_ms() < deadline) {
        sleep_1ms();
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(left);
}

#ifndef _WIN32
/* A child forked while another thread was inside the deleter inherits its count, but
 * not the thread: without this its exit would wait out the whole timeout. */
static void
forget_in_flight(void)
{
    atomic_store(&in_flight, 0);
}
#endif

/* A capsule still under our fresh name was never consumed: its deleter is ours to run. */
static void
capsule_destructor(PyObject *capsule)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    const char *name = PyCapsule_GetName(capsule);
    if (name != NULL && (name == name_v || name == name_l)) {
        void *managed = PyCapsule_GetPointer(capsule, name);
        if (managed != NULL) {
            drop_export(managed);
        }
    }
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

static PyObject *
capsule_hooks(PyObject *module, PyObject *args)
{
    PyObject *table, *v, *l;
    if (!PyArg_ParseTuple(args, "O!SS:capsule_hooks", &PyDict_Type, &table, &v, &l)) {
        return NULL;
    }
    if (exports != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "capsule_hooks: already installed");
        return NULL;
    }
    names = PyTuple_Pack(2, v, l);
    if (names == NULL) {
        return NULL;
    }
#ifndef _WIN32
    if (pthread_atfork(NULL, NULL, forget_in_flight) != 0) {
        Py_CLEAR(names);
        PyErr_SetString(PyExc_RuntimeError, "capsule_hooks: pthread_atfork failed");
        return NULL;
    }
#endif
    Py_INCREF(table);
    exports = table;
    name_v = PyBytes_AS_STRING(v);
    name_l = PyBytes_AS_STRING(l);
    /* Both live as long as the process: consumers may call them at any time. */
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)export_deleter),
                         PyLong_FromVoidPtr((void *)capsule_destructor));
}

/* ---------------------------------------------------------------------------
 * The descriptor decoder's dense fast path: wire._decode_dense, rule for rule, with the
 * rules themselves in the C library (check() below).
 *
 * It reads only simple descriptors (dense row-major or strided, static, one DATA
 * buffer, no quantization or shard section) and returns None for anything else or
 * anything it would not accept: the general decoder then decides and names the
 * defect. tests/test_perf_paths.py compares it with the Python version and with the
 * general decoder on valid, mutated and random bytes. Every read is bounds-checked
 * against the buffer length before it happens; every product is overflow-checked. */

#define N_SLOTS 9
/* The largest descriptor the fast path accepts: header, 64 shape and 64 stride words,
 * one buffer entry. check() reads nothing past total, and accepts only total <= this. */
#define MAX_DENSE (32 + 16 * 64 + 24)
static PyTypeObject *dd_type = NULL;       /* Descriptor */
static PyObject *dd_dtypes[256];           /* tag -> DType (NULL: unknown tag) */
static PyObject *dd_row_major = NULL, *dd_strided = NULL;
static PyObject *dd_slots[N_SLOTS];        /* member descriptors, in field order */
static PyObject *dd_empty = NULL;
static int dd_tables_differ = 0;           /* dtypes.py and the C library disagree: off */

static uint64_t
le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static PyObject *
build(const unsigned char *b, uint32_t rank, int strided, PyObject *dtype, int padded)
{
    PyObject *shape = PyTuple_New(rank), *strides = NULL;
    if (shape == NULL) {
        return NULL;
    }
    for (uint32_t i = 0; i < rank; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(le64(b + 32 + 8 * i));
        if (v == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, v);
    }
    if (strided) {
        strides = PyTuple_New(rank);
        if (strides == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
        for (uint32_t i = 0; i < rank; i++) {
            PyObject *v = PyLong_FromLongLong((long long)le64(b + 32 + 8 * (rank + i)));
            if (v == NULL) {
                Py_DECREF(shape);
                Py_DECREF(strides);
                return NULL;
            }
            PyTuple_SET_ITEM(strides, i, v);
        }
    }
    else {
        strides = Py_NewRef(Py_None);
    }
    /* Descriptor's fields in order (borrowed): shape, dtype, layout, strides, tile,
     * sparse, quantization, shard, padded. */
    PyObject *values[N_SLOTS] = {
        shape, dtype, strided ? dd_strided : dd_row_major, strides,
        Py_None, Py_None, Py_None, Py_None, padded ? Py_True : Py_False,
    };
    PyObject *d = PyBaseObject_Type.tp_new(dd_type, dd_empty, NULL);
    for (int i = 0; d != NULL && i < N_SLOTS; i++) {
        if (Py_TYPE(dd_slots[i])->tp_descr_set(dd_slots[i], d, values[i]) < 0) {
            Py_CLEAR(d);
        }
    }
    Py_DECREF(shape);
    Py_DECREF(strides);
    return d;
}

/* The checks of wire._decode_dense, made by the C library's decoder (c/src/descriptor.c,
 * compiled into this module by setup.py): the one C copy of the wire rules. It accepts
 * exactly what the general Python decoder accepts (tests/test_c_library.py compares them
 * field for field); of that, the fast path takes the dense descriptors -- row-major or
 * strided, static, one DATA buffer, no quantization or shard section. 1: accepted (fills
 * *out), 0: not. Reads at most MAX_DENSE bytes: a descriptor the fast path takes is no
 * longer, and a longer one fails here on total_size. */
static int
check(const unsigned char *b, Py_ssize_t n, uint32_t *rank_out, int *strided_out,
      int *tag_out, int *padded_out, uint64_t *off_out, uint64_t *nbytes_out, uint64_t *total_out)
{
    hry_descriptor d;
    hry_buffer_table table;
    size_t total;
    if (n < 0 || hry_decode_prefix(b, (size_t)(n < MAX_DENSE ? n : MAX_DENSE), &d, &table, &total,
                                   NULL, NULL) != HRY_OK) {
        return 0;
    }
    if ((d.layout != HRY_ROW_MAJOR && d.layout != HRY_STRIDED) || d.has_quantization
            || d.has_shard || table.count != 1) {
        return 0;
    }
    *rank_out = d.rank;
    *strided_out = d.layout == HRY_STRIDED;
    *tag_out = d.dtype;
    *padded_out = d.padded;
    *off_out = table.entry[0].offset;
    *nbytes_out = table.entry[0].length;
    *total_out = total;
    return 1;
}

static PyObject *
decode_dense(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_dense(data, n)");
        return NULL;
    }
    if (dd_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "decode_dense: dense_decoder_setup() not called");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (dd_tables_differ) {
        Py_RETURN_NONE;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    uint32_t rank;
    int strided, tag, padded;
    uint64_t off, nbytes, total;
    /* One snapshot of the bytes, checked and then built from: the buffer may be shared
     * memory or a file map that another process writes while we read, and a value
     * read twice could pass the checks once and differ the second time. An accepted
     * descriptor is at most MAX_DENSE bytes, so the snapshot holds all it needs. */
    unsigned char snap[MAX_DENSE];
    if (n >= 0 && view.len >= n) {
        memcpy(snap, view.buf, (size_t)(n < MAX_DENSE ? n : MAX_DENSE));
    }
    if (n < 0 || view.len < n
            || !check(snap, n, &rank, &strided, &tag, &padded, &off, &nbytes, &total)) {
        result = Py_NewRef(Py_None);
    }
    else {
        PyObject *d = build(snap, rank, strided, dd_dtypes[tag], padded);
        if (d != NULL) {
            result = Py_BuildValue("(NKKK)", d, (unsigned long long)off,
                                   (unsigned long long)nbytes, (unsigned long long)total);
        }
    }
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
dense_decoder_setup(PyObject *module, PyObject *args)
{
    PyObject *type, *dtypes, *bits, *row_major, *strided, *slots;
    if (!PyArg_ParseTuple(args, "O!O!O!OOO!:dense_decoder_setup", &PyType_Type, &type,
                          &PyList_Type, &dtypes, &PyList_Type, &bits, &row_major, &strided,
                          &PyTuple_Type, &slots)) {
        return NULL;
    }
    if (PyList_GET_SIZE(dtypes) != 256 || PyList_GET_SIZE(bits) != 256
            || PyTuple_GET_SIZE(slots) != N_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "dense_decoder_setup: 256 dtypes and bits, 9 slots");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < N_SLOTS; i++) {
        PyObject *s = PyTuple_GET_ITEM(slots, i);
        if (Py_TYPE(s)->tp_descr_set == NULL) {
            PyErr_SetString(PyExc_TypeError, "dense_decoder_setup: slots must be descriptors");
            return NULL;
        }
    }
    if (dd_empty == NULL && (dd_empty = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    int differ = -1;
    for (int i = 0; i < 256; i++) {
        PyObject *dt = PyList_GET_ITEM(dtypes, i);
        long nb = PyLong_AsLong(PyList_GET_ITEM(bits, i));
        if (nb == -1 && PyErr_Occurred()) {
            return NULL;
        }
        /* dtypes.py's table and the C library's must be the same table: if they are not,
         * the fast path turns itself off (the general decoder in Python decides every
         * input) and says so, rather than answer by a table Python does not have */
        const hry_dtype_info *c_type = hry_dtype((unsigned)i);
        if (differ < 0 && ((dt == Py_None) != (c_type == NULL)
                           || (c_type != NULL && c_type->bits != nb))) {
            differ = i;
        }
        Py_XSETREF(dd_dtypes[i], dt == Py_None ? NULL : Py_NewRef(dt));
    }
    dd_tables_differ = differ >= 0;
    if (differ >= 0 && PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                                        "element type tag %d differs between "
                                        "hurray_bridge/dtypes.py and c/src/descriptor.c: the "
                                        "compiled descriptor decoder is off", differ) < 0) {
        return NULL;
    }
    for (int i = 0; i < N_SLOTS; i++) {
        Py_XSETREF(dd_slots[i], Py_NewRef(PyTuple_GET_ITEM(slots, i)));
    }
    Py_XSETREF(dd_row_major, Py_NewRef(row_major));
    Py_XSETREF(dd_strided, Py_NewRef(strided));
    Py_XSETREF(dd_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

static PyMethodDef speedups_functions[] = {
    {"decode_dense", (PyCFunction)(void (*)(void))decode_dense, METH_FASTCALL,
     "decode_dense(data, n) -> (Descriptor, data offset, data length, total) or None"},
    {"dense_decoder_setup", dense_decoder_setup, METH_VARARGS,
     "dense_decoder_setup(Descriptor, dtypes[256], bits[256], row_major, strided, slots)"},
    {"capsule_hooks", capsule_hooks, METH_VARARGS,
     "capsule_hooks(exports, name_v, name_l) -> (deleter address, destructor address)"},
    {"stop_foreign_releases", stop_foreign_releases, METH_O,
     "stop_foreign_releases(timeout_ms) -> unfinished deleter calls: at exit, threads "
     "without the GIL stop releasing exports"},
    {NULL}
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hurray_bridge._speedups",
    .m_doc = "Compiled hot paths of hurray_bridge (optional; Python fallbacks exist).",
    .m_size = -1,
    .m_methods = speedups_functions,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&DispatcherType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&DispatcherType);
    if (PyModule_AddObject(m, "Dispatcher", (PyObject *)&DispatcherType) < 0) {
        Py_DECREF(&DispatcherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
