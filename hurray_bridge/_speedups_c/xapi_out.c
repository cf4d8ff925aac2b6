/* DLPack export in C: the compiled Tensor.__dlpack__ / __dlpack_device__, and the C
 * exchange API that hb.Tensor's type publishes (__dlpack_c_exchange_api__).
 *
 * The Python Tensor.__dlpack__ (tensor.py) holds every rule and error message. The
 * compiled one answers the calls whose answer is a plain export of the tensor's own
 * memory -- dense, a DLPack element type, no copy, no stream or device change, no
 * forwarding to a device producer, no legacy capsule of read-only memory -- with the
 * capsule the Python one would make (same fields and flags), and hands every other
 * call to the Python one with its arguments unchanged.
 *
 * An export is one malloc'd block: the managed struct, a reference to the tensor
 * (which keeps its memory alive) and the shape and strides arrays. Its deleter drops
 * that reference and frees the block, once, from any thread; at interpreter exit it
 * keeps the guard of deleters.c (a thread without the GIL leaves the export alone).
 * A capsule that nobody consumed releases it in its destructor.
 *
 * The exchange table (docs/impl/c-ffi.md §8): managed_tensor_from_py_object_no_sync
 * is __dlpack__(max_version=(1, 3)) without the capsule, except that it refuses
 * (BufferError) what a consumer should take through __dlpack__ instead: read-only
 * memory -- its consumers cannot be told from the ones that ignore READ_ONLY
 * (apache-tvm-ffi does), and __dlpack__ then sets the flag or refuses a legacy
 * capsule -- and device memory of another producer, which only __dlpack__(stream=)
 * can order. dltensor_from_py_object_no_sync refuses the same, and padded sub-byte
 * data (a DLTensor has no flag for it). managed_tensor_to_py_object_no_sync imports
 * as hb.from_dlpack does; on failure the struct stays the caller's. The allocator
 * gives 64-byte aligned host memory and needs no GIL. hurray_bridge runs no work on
 * any stream: current_work_stream answers NULL.
 */
#include "speedups.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#ifdef _WIN32
#include <malloc.h>
#endif

static const char NAME_V[] = "dltensor_versioned";
static const char NAME_L[] = "dltensor";
static const char USED_V[] = "used_dltensor_versioned";

/* Changed only with the GIL held (made there; released there, or left alone at exit). */
static long live_exports = 0;

typedef struct {
    union {
        HbDLManagedTensorVersioned v;
        HbDLManagedTensor l;
    } mt;            /* first: the struct's address is the block's */
    PyObject *owner; /* the hb.Tensor */
    int ndim;        /* our own copy (a consumer may write the struct) */
    int64_t dims[];  /* shape, then strides */
} Export;

/* Blocks of rank <= SMALL_RANK are kept for reuse: made and released with the GIL held
 * (the deleter takes it first), so the list needs no lock of its own. */
#define SMALL_RANK 4
#define KEPT_BLOCKS 32
static Export *kept[KEPT_BLOCKS];
static int n_kept = 0;

static Export *
new_block(int ndim)
{
    if (ndim <= SMALL_RANK && n_kept > 0) {
        return kept[--n_kept];
    }
    size_t ndims = 2 * (size_t)(ndim <= SMALL_RANK ? SMALL_RANK : ndim);
    return malloc(sizeof(Export) + sizeof(int64_t) * ndims);
}

static void
free_block(Export *e, int ndim)
{
    if (ndim <= SMALL_RANK && n_kept < KEPT_BLOCKS) {
        kept[n_kept++] = e;
    }
    else {
        free(e);
    }
}

/* With the GIL held (hb_release). */
static void
drop_owner(void *block)
{
    Export *e = block;
    PyObject *owner = e->owner;
    free_block(e, e->ndim);
    live_exports--;
    if (PyErr_Occurred()) {
        /* A consumer releasing while an exception is in flight (a temporary dying
         * during unwinding): the release must neither see nor lose it. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_XDECREF(owner);
        PyErr_Restore(type, value, tb);
    }
    else {
        Py_XDECREF(owner);
    }
}

static void
release_export(Export *e)
{
    hb_release(drop_owner, e);
}

static void
deleter_v(HbDLManagedTensorVersioned *self)
{
    if (self != NULL) {
        release_export((Export *)self);
    }
}

static void
deleter_l(HbDLManagedTensor *self)
{
    if (self != NULL) {
        release_export((Export *)self);
    }
}

/* A capsule still under our name was never consumed: the deleter is ours to run. A
 * consumer renames it with its own string, so our pointer means "fresh". */
static void
capsule_destructor(PyObject *capsule)
{
    const char *name = PyCapsule_GetName(capsule);
    if (name == NAME_V || name == NAME_L) {
        Export *e = PyCapsule_GetPointer(capsule, name);
        if (e != NULL) {
            release_export(e);
        }
    }
}

/* What an export of t says, read from its slots. */
typedef struct {
    uint64_t data;
    int32_t device_type, device_id;
    int ndim;
    const HbDType *dtype;
    int readonly, padded, has_source;
    int64_t nbytes;
    int64_t dims[2 * HB_MAX_RANK]; /* shape, then strides */
} Fields;

static int
as_i64(PyObject *v, int64_t *out)
{
    if (!PyLong_Check(v)) {
        return 0;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

static int
host_accessible(int32_t type)
{
    return type == 1 || type == 3 || type == 11 || type == 13;
}

/* 1: t is a plain dense export (fields filled), 0: the Python path decides. */
static int
read_fields(PyObject *t, Fields *f)
{
    if (!hb_world_ready() || !PyObject_TypeCheck(t, hb_world.tensor_type)) {
        return 0;
    }
    PyObject *desc = HB_SLOT(t, HB_S_DESC);
    if (!desc) {
        return 0;
    }
    if (desc != Py_None) {
        /* A tensor whose descriptor was read: dense and not quantized only. The two
         * reads may run Python code (a forged _desc), which may replace any slot: desc
         * is held across them, and the other slots are read only after them. */
        Py_INCREF(desc);
        PyObject *layout = PyObject_GetAttrString(desc, "layout");
        PyObject *quant = layout ? PyObject_GetAttrString(desc, "quantization") : NULL;
        int dense = (layout == hb_world.row_major || layout == hb_world.strided)
                    && quant == Py_None && HB_SLOT(t, HB_S_DESC) == desc;
        Py_XDECREF(layout);
        Py_XDECREF(quant);
        Py_DECREF(desc);
        if (!dense) {
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *device = HB_SLOT(t, HB_S_DEVICE);
    PyObject *source = HB_SLOT(t, HB_S_SOURCE), *dtype = HB_SLOT(t, HB_S_DTYPE);
    PyObject *readonly = HB_SLOT(t, HB_S_READONLY), *padded = HB_SLOT(t, HB_S_PADDED);
    PyObject *shape = HB_SLOT(t, HB_S_SHAPE), *strides = HB_SLOT(t, HB_S_STRIDES);
    PyObject *data = HB_SLOT(t, HB_S_DATA), *nbytes = HB_SLOT(t, HB_S_NBYTES);
    if (!device || !source || !dtype || !readonly || !padded || !shape || !strides
            || !data || !nbytes) {
        return 0;
    }
    int64_t dt = HB_KDL_CPU, di = 0;
    if (device != hb_world.cpu
            && (!PyTuple_Check(device) || PyTuple_GET_SIZE(device) != 2
                || !as_i64(PyTuple_GET_ITEM(device, 0), &dt)
                || !as_i64(PyTuple_GET_ITEM(device, 1), &di)
                || dt < 0 || dt > INT32_MAX || di < 0 || di > INT32_MAX)) {
        return 0;
    }
    f->device_type = (int32_t)dt;
    f->device_id = (int32_t)di;
    f->has_source = source != Py_None;
    if (f->has_source && !host_accessible(f->device_type)) {
        return 0; /* forwarded to the producer (streams) */
    }
    if ((f->dtype = hb_dtype_entry(dtype)) == NULL) {
        return 0;
    }
    if ((readonly != Py_True && readonly != Py_False) || (padded != Py_True && padded != Py_False)
            || !PyTuple_Check(shape)) {
        return 0;
    }
    f->nbytes = 0; /* asked only of read-only memory */
    if (readonly == Py_True && !as_i64(nbytes, &f->nbytes)) {
        return 0;
    }
    f->readonly = readonly == Py_True;
    f->padded = padded == Py_True;
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    if (ndim > HB_MAX_RANK) {
        return 0;
    }
    f->ndim = (int)ndim;
    int64_t *sh = f->dims, *st = f->dims + ndim;
    int empty = 0;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        if (!as_i64(PyTuple_GET_ITEM(shape, i), &sh[i]) || sh[i] < 0) {
            return 0;
        }
        empty |= sh[i] == 0;
    }
    if (strides == Py_None) {
        int64_t step = 1;
        for (Py_ssize_t i = ndim - 1; i >= 0; i--) {
            st[i] = step;
            /* descriptor.compact_strides: a 0 counts as 1, as in NumPy and torch */
            if (__builtin_mul_overflow(step, sh[i] > 1 ? sh[i] : 1, &step) && i > 0) {
                return 0; /* compact strides beyond int64 (an empty shape): Python says so */
            }
        }
    }
    else {
        if (!PyTuple_Check(strides) || PyTuple_GET_SIZE(strides) != ndim) {
            return 0;
        }
        for (Py_ssize_t i = 0; i < ndim; i++) {
            if (!as_i64(PyTuple_GET_ITEM(strides, i), &st[i])) {
                return 0;
            }
        }
    }
    if (empty) {
        f->data = 0;
    }
    else {
        f->data = PyLong_AsUnsignedLongLong(data);
        if (PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* The export of fields f as an owning struct of t (no capsule yet). */
static Export *
new_export(PyObject *t, const Fields *f, int versioned, uint64_t flags)
{
    size_t ndims = 2 * (size_t)f->ndim;
    Export *e = new_block(f->ndim);
    if (e == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    e->ndim = f->ndim;
    memcpy(e->dims, f->dims, sizeof(int64_t) * ndims);
    HbDLTensor *dl = versioned ? &e->mt.v.dl_tensor : &e->mt.l.dl_tensor;
    dl->data = (void *)(uintptr_t)f->data;
    dl->device.device_type = f->device_type;
    dl->device.device_id = f->device_id;
    dl->ndim = f->ndim;
    dl->dtype.code = f->dtype->code;
    dl->dtype.bits = f->dtype->bits;
    dl->dtype.lanes = 1;
    /* Both arrays right after the struct, also for rank 0: a valid (empty) array is
     * safer than NULL for consumers older than DLPack 1.3. */
    dl->shape = e->dims;
    dl->strides = e->dims + f->ndim;
    dl->byte_offset = 0;
    if (versioned) {
        e->mt.v.version.major = HB_DLPACK_MAJOR;
        e->mt.v.version.minor = HB_DLPACK_MINOR;
        e->mt.v.manager_ctx = e;
        e->mt.v.deleter = deleter_v;
        e->mt.v.flags = flags;
    }
    else {
        e->mt.l.manager_ctx = e;
        e->mt.l.deleter = deleter_l;
    }
    e->owner = Py_NewRef(t);
    live_exports++;
    return e;
}

/* The flags of a plain export, or -1: not a plain export (the Python path decides). */
static int64_t
plain_flags(const Fields *f, int versioned)
{
    uint64_t flags = 0;
    if (f->readonly) {
        if (!versioned && f->nbytes) {
            return -1; /* a legacy capsule of read-only memory: refused, in Python's words */
        }
        flags |= HB_DLFLAG_READ_ONLY;
    }
    if (f->padded) {
        if (!versioned) {
            return -1;
        }
        flags |= HB_DLFLAG_SUBBYTE_PADDED;
    }
    return (int64_t)flags;
}

/* Tensor.__dlpack__ in Python, with the arguments of this call. */
static PyObject *
python_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *small[8], **stack = small;
    if (nargs + nkw + 1 > 8 && (stack = PyMem_Malloc(sizeof(PyObject *) * (size_t)(nargs + nkw + 1))) == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) {
        stack[1 + i] = args[i];
    }
    PyObject *r = PyObject_Vectorcall(hb_world.dlpack_py, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return r;
}

/* max_version, stream, copy, dl_device (interned) */
static PyObject *kw_names[4];

static PyObject *
tensor_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *stream = NULL, *max_version = NULL, *dl_device = NULL, *copy = NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs != 0) {
        return python_dlpack(self, args, nargs, kwnames);
    }
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        /* Keyword names are interned where the caller wrote them; any other string is
         * compared by value. */
        int k = 0;
        while (k < 4 && name != kw_names[k]) {
            k++;
        }
        if (k == 4 && PyUnicode_Check(name)) {
            k = 0;
            while (k < 4 && PyUnicode_Compare(name, kw_names[k]) != 0) {
                k++;
            }
        }
        if (k == 4) {
            PyErr_Clear();
            return python_dlpack(self, args, nargs, kwnames);
        }
        PyObject **slot[4] = {&max_version, &stream, &copy, &dl_device};
        *slot[k] = args[i];
    }
    int versioned = 0;
    if (max_version != NULL && max_version != Py_None) {
        int64_t major;
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) < 1
                || !as_i64(PyTuple_GET_ITEM(max_version, 0), &major)) {
            return python_dlpack(self, args, nargs, kwnames);
        }
        versioned = major >= 1;
    }
    int overflow = 0;
    if ((stream != NULL && stream != Py_None
         && !(PyLong_CheckExact(stream) && PyLong_AsLongAndOverflow(stream, &overflow) == -1
              && !overflow))
            || (dl_device != NULL && dl_device != Py_None)
            || (copy != NULL && copy != Py_None && copy != Py_False)) {
        return python_dlpack(self, args, nargs, kwnames);
    }
    Fields f;
    int64_t flags;
    if (!read_fields(self, &f) || (flags = plain_flags(&f, versioned)) < 0) {
        return python_dlpack(self, args, nargs, kwnames);
    }
    Export *e = new_export(self, &f, versioned, (uint64_t)flags);
    if (e == NULL) {
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(e, versioned ? NAME_V : NAME_L, capsule_destructor);
    if (capsule == NULL) {
        release_export(e);
    }
    return capsule;
}

static PyObject *
tensor_dlpack_device(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    if (hb_world_ready() && PyObject_TypeCheck(self, hb_world.tensor_type)) {
        PyObject *device = HB_SLOT(self, HB_S_DEVICE);
        int64_t dt, di;
        if (device == hb_world.cpu) {
            return Py_NewRef(hb_world.cpu_dl);
        }
        if (device != NULL && PyTuple_Check(device) && PyTuple_GET_SIZE(device) == 2
                && as_i64(PyTuple_GET_ITEM(device, 0), &dt) && dt == HB_KDL_CPU
                && as_i64(PyTuple_GET_ITEM(device, 1), &di) && di == 0) {
            return Py_NewRef(hb_world.cpu_dl);
        }
    }
    return PyObject_CallOneArg(hb_world.dlpack_device_py, self);
}

static PyMethodDef dlpack_def = {
    "__dlpack__", (PyCFunction)(void (*)(void))tensor_dlpack, METH_FASTCALL | METH_KEYWORDS,
    "Export as a DLPack capsule (Python array API semantics).\n\n"
    "Versioned (DLPack 1.x) when max_version >= (1, 0), legacy otherwise. A device tensor\n"
    "forwards the request to the object it came from, so that producer synchronises with\n"
    "the consumer's stream.\n\n"
    "A legacy capsule has no READ_ONLY flag: one of read-only memory is refused with\n"
    "BufferError (as NumPy refuses it) unless copy=True asks for a private copy.\n"
    "hb.convert(t, 'jax') still hands read-only memory to JAX without a copy (JAX arrays\n"
    "are immutable).\n\n"
    "(Compiled: plain exports are made in C, every other call by the Python method.)"};

static PyMethodDef dlpack_device_def = {
    "__dlpack_device__", (PyCFunction)tensor_dlpack_device, METH_NOARGS,
    "__dlpack_device__($self, /)\n--\n\nThe (DLDeviceType, device_id) of the tensor's memory."};

/* ------------------------------------------------ __dlpack__, bound as functions are
 *
 * A method_descriptor (PyDescr_NewMethod) builds a builtin method object on every
 * attribute read, and torch.from_dlpack reads __dlpack__ twice that way: hasattr, then
 * a call with **kwargs, which the compiler cannot make a method call. Bound as a Python
 * function is (PyMethod_New), a read costs about a quarter less (31 -> 25 ns), and
 * Py_TPFLAGS_METHOD_DESCRIPTOR keeps `t.__dlpack__(...)` free of any bound object.
 * __dlpack_device__ stays a method_descriptor: it is only ever called as a method,
 * which CPython 3.11+ specialises for method_descriptors (10 ns against 15). */

/* METH_FASTCALL | METH_KEYWORDS (public as PyCFunctionFastWithKeywords only from 3.13) */
typedef PyObject *(*FastWithKeywords)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    const PyMethodDef *def;
    const char *signature; /* __text_signature__ */
} Method;

static PyObject *
method_self_check(const Method *m, Py_ssize_t nargs, PyObject *const *args)
{
    if (nargs < 1) {
        PyErr_Format(PyExc_TypeError, "unbound method Tensor.%s() needs an argument",
                     m->def->ml_name);
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], hb_world.tensor_type)) {
        PyErr_Format(PyExc_TypeError,
                     "descriptor '%s' for 'Tensor' objects doesn't apply to a '%.100s' object",
                     m->def->ml_name, Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    return args[0];
}

static PyObject *
method_call_keywords(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    const Method *m = (const Method *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *self = method_self_check(m, nargs, args);
    if (self == NULL) {
        return NULL;
    }
    return ((FastWithKeywords)(void (*)(void))m->def->ml_meth)(self, args + 1, nargs - 1,
                                                               kwnames);
}

static PyObject *
method_get(PyObject *self, PyObject *obj, PyObject *Py_UNUSED(type))
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyObject *
method_name(Method *m, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(m->def->ml_name);
}

static PyObject *
method_qualname(Method *m, void *Py_UNUSED(closure))
{
    return PyUnicode_FromFormat("Tensor.%s", m->def->ml_name);
}

static PyObject *
method_doc(Method *m, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(m->def->ml_doc);
}

static PyObject *
method_signature(Method *m, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(m->signature);
}

static PyObject *
method_objclass(Method *Py_UNUSED(m), void *Py_UNUSED(closure))
{
    return Py_NewRef((PyObject *)hb_world.tensor_type);
}

static PyObject *
method_module(Method *Py_UNUSED(m), void *Py_UNUSED(closure))
{
    Py_RETURN_NONE; /* what the builtin method of a method_descriptor answered */
}

/* Pickled and copied by name, as a method_descriptor is: getattr(Tensor, name). */
static PyObject *
method_reduce(Method *m, PyObject *Py_UNUSED(ignored))
{
    PyObject *getattr = PyDict_GetItemString(PyEval_GetBuiltins(), "getattr");
    if (getattr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "builtins.getattr is missing");
        return NULL;
    }
    return Py_BuildValue("O(Os)", getattr, (PyObject *)hb_world.tensor_type, m->def->ml_name);
}

static PyMethodDef method_methods[] = {
    {"__reduce__", (PyCFunction)method_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}
};

static PyObject *
method_repr(Method *m)
{
    return PyUnicode_FromFormat("<method '%s' of 'Tensor' objects>", m->def->ml_name);
}

static PyGetSetDef method_getset[] = {
    {"__name__", (getter)method_name, NULL, NULL, NULL},
    {"__qualname__", (getter)method_qualname, NULL, NULL, NULL},
    {"__doc__", (getter)method_doc, NULL, NULL, NULL},
    {"__text_signature__", (getter)method_signature, NULL, NULL, NULL},
    {"__objclass__", (getter)method_objclass, NULL, NULL, NULL},
    {"__module__", (getter)method_module, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyTypeObject MethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hurray_bridge._speedups.Method",
    .tp_basicsize = sizeof(Method),
    .tp_dealloc = (destructor)PyObject_Del,
    .tp_vectorcall_offset = offsetof(Method, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = (reprfunc)method_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "hb.Tensor.__dlpack__ compiled, bound as a Python function is.",
    .tp_getset = method_getset,
    .tp_methods = method_methods,
    .tp_descr_get = method_get,
};

static PyObject *
new_method(const PyMethodDef *def, const char *signature)
{
    Method *m = PyObject_New(Method, &MethodType);
    if (m == NULL) {
        return NULL;
    }
    m->vectorcall = method_call_keywords;
    m->def = def;
    m->signature = signature;
    return (PyObject *)m;
}

/* ------------------------------------------------------ the exchange API table */

static int
refuse(const char *message)
{
    PyErr_SetString(hb_world.unsupported ? hb_world.unsupported : PyExc_BufferError, message);
    return -1;
}

static const char READ_ONLY_REFUSAL[] =
    "this hb.Tensor's memory is read-only, and the DLPack C exchange API gives it to a "
    "consumer that did not ask for read-only memory (apache-tvm-ffi 0.1.15 ignores the "
    "READ_ONLY flag): ask through __dlpack__(max_version=(1, 0)) or later, where READ_ONLY "
    "travels with the memory, or with copy=True for a private copy";
static const char FORWARD_REFUSAL[] =
    "this hb.Tensor is device memory of another producer, which only that producer can "
    "order with the consumer's stream: the DLPack C exchange API does not synchronise; "
    "ask through __dlpack__(stream=...)";

/* Refusals common to both exports from the table; 0: fields f may be exported. */
static int
table_checks(PyObject *t, Fields *f, int *plain)
{
    if (!hb_world_ready() || !PyObject_TypeCheck(t, hb_world.tensor_type)) {
        PyErr_Format(PyExc_TypeError, "expected an hb.Tensor, got %.100s", Py_TYPE(t)->tp_name);
        return -1;
    }
    *plain = read_fields(t, f);
    PyObject *readonly = HB_SLOT(t, HB_S_READONLY), *nbytes = HB_SLOT(t, HB_S_NBYTES);
    PyObject *source = HB_SLOT(t, HB_S_SOURCE), *device = HB_SLOT(t, HB_S_DEVICE);
    if (readonly == Py_True && nbytes != NULL && PyObject_IsTrue(nbytes) == 1) {
        return refuse(READ_ONLY_REFUSAL);
    }
    int64_t dt;
    if (source != NULL && source != Py_None && device != NULL && PyTuple_Check(device)
            && PyTuple_GET_SIZE(device) == 2 && as_i64(PyTuple_GET_ITEM(device, 0), &dt)
            && !host_accessible((int32_t)dt)) {
        return refuse(FORWARD_REFUSAL);
    }
    return 0;
}

/* The Python path's versioned export of t (it raises whatever it refuses), taken out
 * of its capsule. */
static HbDLManagedTensorVersioned *
python_export(PyObject *t)
{
    PyObject *version = Py_BuildValue("(ii)", HB_DLPACK_MAJOR, HB_DLPACK_MINOR);
    if (version == NULL) {
        return NULL;
    }
    PyObject *stack[6] = {t, Py_None, version, Py_None, Py_None, Py_False};
    PyObject *capsule = PyObject_Vectorcall(hb_world.export_py, stack, 6, NULL);
    Py_DECREF(version);
    if (capsule == NULL) {
        return NULL;
    }
    HbDLManagedTensorVersioned *mt = NULL;
    if (PyCapsule_IsValid(capsule, (const char *)NAME_V)) {
        mt = PyCapsule_GetPointer(capsule, NAME_V);
        if (mt != NULL && PyCapsule_SetName(capsule, USED_V) < 0) {
            mt = NULL;
        }
    }
    else {
        refuse("this hb.Tensor's producer answered with a legacy DLPack capsule: "
               "import it through __dlpack__");
    }
    Py_DECREF(capsule); /* an unconsumed capsule releases its export here */
    return mt;
}

static int
api_managed_from_py(void *py_object, HbDLManagedTensorVersioned **out)
{
    PyObject *t = (PyObject *)py_object;
    Fields f;
    int plain;
    if (table_checks(t, &f, &plain) < 0) {
        return -1;
    }
    int64_t flags = plain ? plain_flags(&f, 1) : -1;
    if (flags >= 0) {
        Export *e = new_export(t, &f, 1, (uint64_t)flags);
        if (e == NULL) {
            return -1;
        }
        *out = &e->mt.v;
        return 0;
    }
    HbDLManagedTensorVersioned *mt = python_export(t);
    if (mt == NULL) {
        return -1;
    }
    *out = mt;
    return 0;
}

/* The shape and strides of t as int64 arrays that live as long as t does: a bytes
 * object in its _dl slot, made again when _shape or _strides was replaced. */
static int64_t *
persistent_dims(PyObject *t, const Fields *f)
{
    PyObject *shape = HB_SLOT(t, HB_S_SHAPE), *strides = HB_SLOT(t, HB_S_STRIDES);
    PyObject *cache = HB_SLOT(t, HB_S_DL);
    size_t n = sizeof(int64_t) * 2 * (size_t)f->ndim;
    /* Only our own entry is read back: _dl is a slot Python code can set to anything. */
    if (cache != NULL && PyTuple_CheckExact(cache) && PyTuple_GET_SIZE(cache) == 3
            && PyTuple_GET_ITEM(cache, 0) == shape && PyTuple_GET_ITEM(cache, 1) == strides
            && PyBytes_CheckExact(PyTuple_GET_ITEM(cache, 2))
            && (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(cache, 2)) == (n ? n : 8)) {
        return (int64_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(cache, 2));
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)f->dims, (Py_ssize_t)(n ? n : 8));
    if (bytes == NULL) {
        return NULL;
    }
    PyObject *entry = PyTuple_Pack(3, shape, strides, bytes);
    Py_DECREF(bytes);
    if (entry == NULL) {
        return NULL;
    }
    PyObject **slot = &HB_SLOT(t, HB_S_DL);
    Py_XSETREF(*slot, entry);
    return (int64_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(entry, 2));
}

static int
api_dltensor_from_py(void *py_object, HbDLTensor *out)
{
    PyObject *t = (PyObject *)py_object;
    Fields f;
    int plain;
    if (table_checks(t, &f, &plain) < 0) {
        return -1;
    }
    if (!plain) {
        /* The Python path names what it refuses; what it would export, a borrowed
         * DLTensor cannot carry (it has no owner, no flags). */
        HbDLManagedTensorVersioned *mt = python_export(t);
        if (mt == NULL) {
            return -1;
        }
        mt->deleter(mt);
        return refuse("this hb.Tensor has no borrowed DLTensor form: import it with "
                      "managed_tensor_from_py_object_no_sync");
    }
    if (f.padded) {
        return refuse("padded sub-byte data needs the IS_SUBBYTE_TYPE_PADDED flag of a "
                      "managed tensor, which a DLTensor has no field for");
    }
    int64_t *dims = persistent_dims(t, &f);
    if (dims == NULL) {
        return -1;
    }
    out->data = (void *)(uintptr_t)f.data;
    out->device.device_type = f.device_type;
    out->device.device_id = f.device_id;
    out->ndim = f.ndim;
    out->dtype.code = f.dtype->code;
    out->dtype.bits = f.dtype->bits;
    out->dtype.lanes = 1;
    out->shape = dims;
    out->strides = dims + f.ndim;
    out->byte_offset = 0;
    return 0;
}

static int
api_managed_to_py(HbDLManagedTensorVersioned *tensor, void **out_py_object)
{
    int declined;
    PyObject *t = hb_import_managed(tensor, NULL, &declined);
    if (t == NULL) {
        if (declined && !PyErr_Occurred()) {
            refuse("hurray_bridge cannot import this DLManagedTensorVersioned (another major "
                   "version, a rank above 64, vector lanes, an element type without a Hurray "
                   "type, memory outside the address space, or packed sub-byte data with "
                   "strides); it stays the caller's");
        }
        return -1;
    }
    *out_py_object = t;
    return 0;
}

typedef struct {
    HbDLManagedTensorVersioned mt;
    void *memory;
    int64_t dims[];
} Allocation;

static void
free_allocation(HbDLManagedTensorVersioned *self)
{
    if (self != NULL) {
        Allocation *a = (Allocation *)self;
#ifdef _WIN32
        _aligned_free(a->memory);
#else
        free(a->memory);
#endif
        free(a);
    }
}

/* Host memory for a prototype: no Python, no GIL needed (errors through set_error). */
static int
api_allocator(HbDLTensor *proto, HbDLManagedTensorVersioned **out, void *error_ctx,
              void (*set_error)(void *error_ctx, const char *kind, const char *message))
{
#define FAIL(kind, msg) do { if (set_error) set_error(error_ctx, kind, msg); return -1; } while (0)
    if (proto == NULL || out == NULL) {
        FAIL("ValueError", "no prototype or no out pointer");
    }
    if (proto->device.device_type != HB_KDL_CPU) {
        FAIL("BufferError", "hurray_bridge allocates host memory (kDLCPU) only");
    }
    if (proto->ndim < 0 || proto->ndim > HB_MAX_RANK || (proto->ndim && proto->shape == NULL)) {
        FAIL("ValueError", "rank outside 0..64, or a NULL shape");
    }
    const HbDType *dtype = proto->dtype.lanes == 1 ? hb_dtype_of(proto->dtype.code,
                                                                 proto->dtype.bits) : NULL;
    if (dtype == NULL) {
        FAIL("BufferError", "an element type without a Hurray type");
    }
    uint64_t n = 1;
    for (int i = 0; i < proto->ndim; i++) {
        if (proto->shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)proto->shape[i], &n)) {
            FAIL("ValueError", "a negative dimension, or more elements than 2**64");
        }
    }
    uint64_t bits;
    if (__builtin_mul_overflow(n, (uint64_t)dtype->bits, &bits) || bits / 8 > INT64_MAX / 2) {
        FAIL("MemoryError", "the tensor is too large");
    }
    size_t nbytes = (size_t)(bits / 8 + (bits % 8 != 0));
    size_t size = (nbytes + 63) / 64 * 64;
    Allocation *a = malloc(sizeof(Allocation) + sizeof(int64_t) * 2 * (size_t)(proto->ndim + 1));
    void *memory = NULL;
#ifdef _WIN32
    memory = _aligned_malloc(size ? size : 64, 64);
#else
    if (posix_memalign(&memory, 64, size ? size : 64) != 0) {
        memory = NULL;
    }
#endif
    if (a == NULL || memory == NULL) {
        free(a);
#ifdef _WIN32
        _aligned_free(memory);
#else
        free(memory);
#endif
        FAIL("MemoryError", "out of host memory");
    }
    int64_t step = 1;
    for (int i = proto->ndim - 1; i >= 0; i--) {
        a->dims[i] = proto->shape[i];
        a->dims[proto->ndim + i] = step;
        step *= proto->shape[i] ? proto->shape[i] : 1;
    }
    a->memory = memory;
    a->mt.version.major = HB_DLPACK_MAJOR;
    a->mt.version.minor = HB_DLPACK_MINOR;
    a->mt.manager_ctx = a;
    a->mt.deleter = free_allocation;
    a->mt.flags = 0;
    a->mt.dl_tensor.data = memory;
    a->mt.dl_tensor.device.device_type = HB_KDL_CPU;
    a->mt.dl_tensor.device.device_id = 0;
    a->mt.dl_tensor.ndim = proto->ndim;
    a->mt.dl_tensor.dtype = proto->dtype;
    a->mt.dl_tensor.shape = a->dims;
    a->mt.dl_tensor.strides = a->dims + proto->ndim;
    a->mt.dl_tensor.byte_offset = 0;
    *out = &a->mt;
    return 0;
#undef FAIL
}

static int
api_current_work_stream(int32_t device_type, int32_t device_id, void **out_stream)
{
    (void)device_type;
    (void)device_id;
    if (out_stream != NULL) {
        *out_stream = NULL; /* the bridge runs nothing on any stream */
    }
    return 0;
}

static HbDLPackExchangeAPI exchange_table = {
    .header = {.version = {HB_DLPACK_MAJOR, HB_DLPACK_MINOR}, .prev_api = NULL},
    .managed_tensor_allocator = api_allocator,
    .managed_tensor_from_py_object_no_sync = api_managed_from_py,
    .managed_tensor_to_py_object_no_sync = api_managed_to_py,
    .dltensor_from_py_object_no_sync = api_dltensor_from_py,
    .current_work_stream = api_current_work_stream,
};

/* exchange_methods() -> (__dlpack__, __dlpack_device__, __dlpack_c_exchange_api__) for
 * the tensor type given to exchange_setup(). */
static PyObject *
exchange_methods(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    if (!hb_world_ready()) {
        PyErr_SetString(PyExc_RuntimeError, "exchange_methods: exchange_setup() not called");
        return NULL;
    }
    PyObject *dlpack = new_method(&dlpack_def, "($self, /, *, stream=None, max_version=None, "
                                              "dl_device=None, copy=None)");
    PyObject *device = PyDescr_NewMethod(hb_world.tensor_type, &dlpack_device_def);
    PyObject *capsule = PyCapsule_New(&exchange_table, HB_EXCHANGE_API_NAME, NULL);
    if (dlpack == NULL || device == NULL || capsule == NULL) {
        Py_XDECREF(dlpack);
        Py_XDECREF(device);
        Py_XDECREF(capsule);
        return NULL;
    }
    return Py_BuildValue("(NNN)", dlpack, device, capsule);
}

static PyObject *
live_exports_fn(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(live_exports);
}

static PyMethodDef export_functions[] = {
    {"exchange_methods", exchange_methods, METH_NOARGS,
     "exchange_methods() -> (__dlpack__, __dlpack_device__, __dlpack_c_exchange_api__)"},
    {"live_exports", live_exports_fn, METH_NOARGS,
     "live_exports() -> exports made in C whose deleter has not run yet"},
    {NULL}
};

int
hb_add_export(PyObject *module)
{
    const char *names[4] = {"max_version", "stream", "copy", "dl_device"};
    for (int i = 0; i < 4; i++) {
        if (kw_names[i] == NULL && (kw_names[i] = PyUnicode_InternFromString(names[i])) == NULL) {
            return -1;
        }
    }
    if (PyType_Ready(&MethodType) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, export_functions);
}
