/* A DLPack C exchange API consumer and producer, built by tests/hurray_bridge/test_exchange_api.py.
 *
 * Written against the DLPack 1.3 header's definitions only (its own copy below), as a
 * framework outside hurray_bridge would be: it finds a type's table with
 * type(obj).__dlpack_c_exchange_api__, checks the major version and calls the
 * functions with the GIL held.
 *
 * Consumer side (of hb.Tensor): table(), managed() (a Held object owns the struct and
 * runs its deleter once, at release() or when it dies), borrowed(), to_py(),
 * alloc(), stream(). Producer side: Producer objects publish their own table (and
 * __dlpack__), with failure modes, for hb.from_dlpack's generic import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint32_t major, minor; } Version;
typedef struct { int32_t device_type, device_id; } Device;
typedef struct { uint8_t code, bits; uint16_t lanes; } DType;
typedef struct {
    void *data; Device device; int32_t ndim; DType dtype;
    int64_t *shape; int64_t *strides; uint64_t byte_offset;
} DLTensor;
typedef struct MTV {
    Version version; void *manager_ctx; void (*deleter)(struct MTV *); uint64_t flags;
    DLTensor dl_tensor;
} MTV;
typedef struct Header { Version version; struct Header *prev_api; } Header;
typedef struct {
    Header header;
    int (*allocator)(DLTensor *, MTV **, void *, void (*)(void *, const char *, const char *));
    int (*from_py)(void *, MTV **);
    int (*to_py)(MTV *, void **);
    int (*dltensor_from_py)(void *, DLTensor *);
    int (*stream)(int32_t, int32_t, void **);
} API;

static const API *
table_of(PyObject *obj)
{
    PyObject *cap = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__dlpack_c_exchange_api__");
    if (cap == NULL) {
        return NULL;
    }
    const API *api = PyCapsule_GetPointer(cap, "dlpack_exchange_api");
    Py_DECREF(cap);
    if (api != NULL && api->header.version.major != 1) {
        PyErr_SetString(PyExc_BufferError, "exchange API major version is not 1");
        return NULL;
    }
    return api;
}

static PyObject *
i64_tuple(const int64_t *p, int n)
{
    if (p == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t != NULL && i < n; i++) {
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(p[i]));
    }
    return t;
}

static PyObject *
describe(const DLTensor *t)
{
    return Py_BuildValue("{s:K,s:(ii),s:i,s:(iii),s:N,s:N,s:K}",
                         "data", (unsigned long long)(uintptr_t)t->data,
                         "device", t->device.device_type, t->device.device_id,
                         "ndim", t->ndim, "dtype", t->dtype.code, t->dtype.bits, t->dtype.lanes,
                         "shape", i64_tuple(t->shape, t->ndim),
                         "strides", i64_tuple(t->strides, t->ndim),
                         "byte_offset", (unsigned long long)t->byte_offset);
}

static PyObject *
table(PyObject *self, PyObject *obj)
{
    (void)self;
    const API *api = table_of(obj);
    if (api == NULL) {
        return NULL;
    }
    return Py_BuildValue("{s:I,s:I,s:O,s:O,s:O,s:O,s:O,s:O}", "major", api->header.version.major,
                         "minor", api->header.version.minor,
                         "prev_api", api->header.prev_api ? Py_True : Py_False,
                         "allocator", api->allocator ? Py_True : Py_False,
                         "from_py", api->from_py ? Py_True : Py_False,
                         "to_py", api->to_py ? Py_True : Py_False,
                         "dltensor_from_py", api->dltensor_from_py ? Py_True : Py_False,
                         "stream", api->stream ? Py_True : Py_False);
}

/* ---------------------------------------------------------------- Held */

typedef struct {
    PyObject_HEAD
    MTV *mt;
} Held;

static void
held_release(Held *h)
{
    MTV *mt = h->mt;
    h->mt = NULL;
    if (mt != NULL && mt->deleter != NULL) {
        mt->deleter(mt);
    }
}

static PyObject *
held_release_m(Held *h, PyObject *unused)
{
    (void)unused;
    held_release(h);
    Py_RETURN_NONE;
}

static PyObject *
held_fields(Held *h, PyObject *unused)
{
    (void)unused;
    if (h->mt == NULL) {
        PyErr_SetString(PyExc_ValueError, "released");
        return NULL;
    }
    PyObject *d = describe(&h->mt->dl_tensor);
    if (d == NULL) {
        return NULL;
    }
    PyObject *v = Py_BuildValue("(II)", h->mt->version.major, h->mt->version.minor);
    PyObject *f = PyLong_FromUnsignedLongLong(h->mt->flags);
    PyDict_SetItemString(d, "version", v);
    PyDict_SetItemString(d, "flags", f);
    PyDict_SetItemString(d, "has_deleter", h->mt->deleter ? Py_True : Py_False);
    Py_XDECREF(v);
    Py_XDECREF(f);
    return d;
}

static void
held_dealloc(Held *h)
{
    held_release(h);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMethodDef held_methods[] = {
    {"release", (PyCFunction)held_release_m, METH_NOARGS, NULL},
    {"fields", (PyCFunction)held_fields, METH_NOARGS, NULL},
    {NULL}
};

static PyTypeObject HeldType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exchange_api_consumer.Held",
    .tp_basicsize = sizeof(Held),
    .tp_dealloc = (destructor)held_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = held_methods,
};

static PyObject *
hold(MTV *mt)
{
    Held *h = PyObject_New(Held, &HeldType);
    if (h == NULL) {
        mt->deleter(mt);
        return NULL;
    }
    h->mt = mt;
    return (PyObject *)h;
}

/* managed(obj) -> Held */
static PyObject *
managed(PyObject *self, PyObject *obj)
{
    (void)self;
    const API *api = table_of(obj);
    if (api == NULL) {
        return NULL;
    }
    MTV *mt = NULL;
    if (api->from_py(obj, &mt) != 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError, "from_py failed without an exception");
        }
        return NULL;
    }
    if (PyErr_Occurred()) {
        mt->deleter(mt);
        PyErr_SetString(PyExc_SystemError, "from_py succeeded with an exception set");
        return NULL;
    }
    return hold(mt);
}

static PyObject *
borrowed(PyObject *self, PyObject *obj)
{
    (void)self;
    const API *api = table_of(obj);
    if (api == NULL) {
        return NULL;
    }
    DLTensor t;
    memset(&t, 0, sizeof t);
    if (api->dltensor_from_py(obj, &t) != 0) {
        return NULL;
    }
    return describe(&t);
}

static PyObject *
stream(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *obj;
    int dt, di;
    if (!PyArg_ParseTuple(args, "Oii", &obj, &dt, &di)) {
        return NULL;
    }
    const API *api = table_of(obj);
    if (api == NULL) {
        return NULL;
    }
    void *s = (void *)0x1;
    if (api->stream(dt, di, &s) != 0) {
        return NULL;
    }
    return PyLong_FromVoidPtr(s);
}

/* ------------------------------------------------------------- to_py */

static long own_deleter_calls = 0;

typedef struct {
    MTV mt;
    int64_t dims[16];
    unsigned char *buffer;
} Own;

static void
own_deleter(MTV *self)
{
    Own *o = (Own *)self;
    own_deleter_calls++;
    free(o->buffer);
    free(o);
}

static Own *last_refused = NULL;

/* to_py(obj, shape, strides or None, code, bits, lanes, flags, nbytes, major) -> the
 * producer's object over a fresh buffer of bytes 0, 1, 2, ... (its deleter counted) */
static PyObject *
to_py(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *obj, *shape, *strides;
    int code, bits, lanes, major;
    unsigned long long flags;
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "OO!OiiiKni", &obj, &PyTuple_Type, &shape, &strides, &code,
                          &bits, &lanes, &flags, &nbytes, &major)) {
        return NULL;
    }
    const API *api = table_of(obj);
    if (api == NULL) {
        return NULL;
    }
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > 8) {
        PyErr_SetString(PyExc_ValueError, "rank 8 at most here");
        return NULL;
    }
    Own *o = calloc(1, sizeof(Own));
    o->buffer = malloc(nbytes ? (size_t)nbytes : 1);
    for (Py_ssize_t i = 0; i < nbytes; i++) {
        o->buffer[i] = (unsigned char)i;
    }
    for (Py_ssize_t i = 0; i < ndim; i++) {
        o->dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        o->dims[8 + i] = strides == Py_None ? 0 : PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
    }
    o->mt.version.major = (uint32_t)major;
    o->mt.version.minor = 3;
    o->mt.manager_ctx = o;
    o->mt.deleter = own_deleter;
    o->mt.flags = flags;
    o->mt.dl_tensor.data = o->buffer;
    o->mt.dl_tensor.device.device_type = 1;
    o->mt.dl_tensor.ndim = (int32_t)ndim;
    o->mt.dl_tensor.dtype.code = (uint8_t)code;
    o->mt.dl_tensor.dtype.bits = (uint8_t)bits;
    o->mt.dl_tensor.dtype.lanes = (uint16_t)lanes;
    o->mt.dl_tensor.shape = o->dims;
    o->mt.dl_tensor.strides = strides == Py_None ? NULL : o->dims + 8;
    void *out = NULL;
    if (api->to_py(&o->mt, &out) != 0) {
        last_refused = o; /* still ours: release_refused() frees it */
        return NULL;
    }
    return (PyObject *)out;
}

static PyObject *
release_refused(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    if (last_refused != NULL) {
        own_deleter(&last_refused->mt);
        last_refused = NULL;
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *
deleter_calls(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(own_deleter_calls);
}

/* ------------------------------------------------------------- alloc */

static char alloc_error[512];

static void
set_error(void *ctx, const char *kind, const char *message)
{
    snprintf(alloc_error, sizeof alloc_error, "%s: %s", kind, message);
    *(int *)ctx += 1;
}

/* alloc(obj, shape, code, bits, device_type) -> Held, or (error calls, message) */
static PyObject *
alloc(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *obj, *shape;
    int code, bits, device_type;
    if (!PyArg_ParseTuple(args, "OO!iii", &obj, &PyTuple_Type, &shape, &code, &bits,
                          &device_type)) {
        return NULL;
    }
    const API *api = table_of(obj);
    if (api == NULL) {
        return NULL;
    }
    int64_t dims[8];
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    for (Py_ssize_t i = 0; i < ndim && i < 8; i++) {
        dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    }
    DLTensor proto;
    memset(&proto, 0, sizeof proto);
    proto.device.device_type = device_type;
    proto.ndim = (int32_t)ndim;
    proto.shape = dims;
    proto.dtype.code = (uint8_t)code;
    proto.dtype.bits = (uint8_t)bits;
    proto.dtype.lanes = 1;
    MTV *mt = NULL;
    int errors = 0;
    alloc_error[0] = 0;
    int rc;
    /* The allocator needs no GIL: called without it, as a kernel library would. */
    Py_BEGIN_ALLOW_THREADS
    rc = api->allocator(&proto, &mt, &errors, set_error);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        return Py_BuildValue("(is)", errors, alloc_error);
    }
    /* the memory is ours to write */
    size_t n = 1;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        n *= (size_t)dims[i];
    }
    memset(mt->dl_tensor.data, 0x5a, n * ((size_t)bits / 8));
    return hold(mt);
}

/* ---------------------------------------------------------- Producer */

typedef struct {
    PyObject_HEAD
    unsigned char *buffer;
    int64_t dims[16];
    int ndim, code, bits, mode;
    uint64_t flags, offset;
    long exports, releases;
} Producer;

enum { OK, FAIL, NULL_DATA, MAJOR2, LANES2, PAST_END, BUFFER_ERROR };

typedef struct {
    MTV mt;
    PyObject *owner;
} ProducerExport;

static void
producer_deleter(MTV *self)
{
    ProducerExport *e = (ProducerExport *)self;
    PyGILState_STATE g = PyGILState_Ensure();
    ((Producer *)e->owner)->releases++;
    Py_DECREF(e->owner);
    free(e);
    PyGILState_Release(g);
}

static int
producer_export(Producer *p, MTV **out)
{
    if (p->mode == FAIL) {
        PyErr_SetString(PyExc_RuntimeError, "this producer's table refuses (as torch's does)");
        return -1;
    }
    if (p->mode == BUFFER_ERROR) {
        PyErr_SetString(PyExc_BufferError, "this producer's table refuses with BufferError");
        return -1;
    }
    ProducerExport *e = calloc(1, sizeof(ProducerExport));
    e->owner = Py_NewRef((PyObject *)p);
    e->mt.version.major = p->mode == MAJOR2 ? 2 : 1;
    e->mt.version.minor = 3;
    e->mt.manager_ctx = e;
    e->mt.deleter = producer_deleter;
    e->mt.flags = p->flags;
    e->mt.dl_tensor.data = p->mode == NULL_DATA ? NULL : p->buffer;
    e->mt.dl_tensor.device.device_type = 1;
    e->mt.dl_tensor.ndim = p->ndim;
    e->mt.dl_tensor.dtype.code = (uint8_t)p->code;
    e->mt.dl_tensor.dtype.bits = (uint8_t)p->bits;
    e->mt.dl_tensor.dtype.lanes = p->mode == LANES2 ? 2 : 1;
    e->mt.dl_tensor.shape = p->dims;
    e->mt.dl_tensor.strides = p->dims + 8;
    e->mt.dl_tensor.byte_offset = p->mode == PAST_END ? UINT64_MAX - 2 : p->offset;
    p->exports++;
    *out = &e->mt;
    return 0;
}

static int
producer_from_py(void *obj, MTV **out)
{
    return producer_export((Producer *)obj, out);
}

static int
producer_stream(int32_t dt, int32_t di, void **out)
{
    (void)dt;
    (void)di;
    *out = NULL;
    return 0;
}

static API producer_api = {
    .header = {{1, 3}, NULL}, .from_py = producer_from_py, .stream = producer_stream,
};

static void
producer_capsule_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        MTV *mt = PyCapsule_GetPointer(cap, "dltensor_versioned");
        mt->deleter(mt);
    }
}

/* The capsule path: the same struct, with the mode's defect, except for FAIL (the
 * table's refusal is the table's: __dlpack__ exports fine). */
static PyObject *
producer_dlpack(Producer *p, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    int mode = p->mode;
    if (mode == FAIL || mode == BUFFER_ERROR) {
        p->mode = OK;
    }
    MTV *mt;
    int rc = producer_export(p, &mt);
    p->mode = mode;
    if (rc != 0) {
        return NULL;
    }
    return PyCapsule_New(mt, "dltensor_versioned", producer_capsule_destructor);
}

static PyObject *
producer_dlpack_device(Producer *p, PyObject *unused)
{
    (void)p;
    (void)unused;
    return Py_BuildValue("(ii)", 1, 0);
}

static PyObject *
producer_counts(Producer *p, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(ll)", p->exports, p->releases);
}

static PyObject *
producer_address(Producer *p, PyObject *unused)
{
    (void)unused;
    return PyLong_FromVoidPtr(p->buffer);
}

/* Producer(nbytes, shape, strides, code, bits, flags=0, mode=0, offset=0) */
static PyObject *
producer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)kwargs;
    Py_ssize_t nbytes;
    PyObject *shape, *strides;
    int code, bits, mode = OK;
    unsigned long long flags = 0, offset = 0;
    if (!PyArg_ParseTuple(args, "nO!O!ii|KiK", &nbytes, &PyTuple_Type, &shape, &PyTuple_Type,
                          &strides, &code, &bits, &flags, &mode, &offset)) {
        return NULL;
    }
    Producer *p = (Producer *)type->tp_alloc(type, 0);
    if (p == NULL) {
        return NULL;
    }
    p->buffer = malloc(nbytes ? (size_t)nbytes : 1);
    for (Py_ssize_t i = 0; i < nbytes; i++) {
        p->buffer[i] = (unsigned char)(i * 7);
    }
    p->ndim = (int)PyTuple_GET_SIZE(shape);
    for (int i = 0; i < p->ndim && i < 8; i++) {
        p->dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        p->dims[8 + i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, i));
    }
    p->code = code;
    p->bits = bits;
    p->flags = flags;
    p->mode = mode;
    p->offset = offset;
    return (PyObject *)p;
}

static void
producer_dealloc(Producer *p)
{
    free(p->buffer);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef producer_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))producer_dlpack, METH_VARARGS | METH_KEYWORDS,
     NULL},
    {"__dlpack_device__", (PyCFunction)producer_dlpack_device, METH_NOARGS, NULL},
    {"counts", (PyCFunction)producer_counts, METH_NOARGS, NULL},
    {"address", (PyCFunction)producer_address, METH_NOARGS, NULL},
    {NULL}
};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exchange_api_consumer.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_dealloc = (destructor)producer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = producer_methods,
    .tp_new = producer_new,
};

static PyMethodDef functions[] = {
    {"table", table, METH_O, NULL},
    {"managed", managed, METH_O, NULL},
    {"borrowed", borrowed, METH_O, NULL},
    {"stream", stream, METH_VARARGS, NULL},
    {"to_py", to_py, METH_VARARGS, NULL},
    {"release_refused", release_refused, METH_NOARGS, NULL},
    {"deleter_calls", deleter_calls, METH_NOARGS, NULL},
    {"alloc", alloc, METH_VARARGS, NULL},
    {NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "exchange_api_consumer", NULL, -1,
                                    functions};

PyMODINIT_FUNC
PyInit_exchange_api_consumer(void)
{
    if (PyType_Ready(&HeldType) < 0 || PyType_Ready(&ProducerType) < 0) {
        return NULL;
    }
    PyObject *cap = PyCapsule_New(&producer_api, "dlpack_exchange_api", NULL);
    if (cap == NULL || PyDict_SetItemString(ProducerType.tp_dict, "__dlpack_c_exchange_api__",
                                            cap) < 0) {
        return NULL;
    }
    Py_DECREF(cap);
    PyType_Modified(&ProducerType);
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&ProducerType);
    PyModule_AddObject(m, "Producer", (PyObject *)&ProducerType);
    return m;
}
