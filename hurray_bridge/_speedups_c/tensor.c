/* hb.Tensor from C: its slots, the dense constructor, the DLPack address checks.
 *
 * hb.Tensor is a Python class with __slots__. exchange_setup() (called once by
 * hurray_bridge/_exchange.py when tensor.py is imported) hands over the class, the
 * member descriptors of its slots and the few objects a tensor is made of (CPU, the
 * element types); from then on the import paths build a Tensor exactly as
 * Tensor._dense does -- same slots, same values -- without a Python frame, and the
 * export paths read its slots directly.
 *
 * hb_span_ok() is _capsule._element_address (docs/spec/buffer-protocol.md §1.1):
 * foreign memory is accepted only when every byte the tensor can reach lies in the
 * 64-bit address space. Where it says no, the callers decline, and the Python path
 * raises the error that names the defect.
 */
#include "speedups.h"

#include <string.h>
#include <structmember.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

HbWorld hb_world;

int
hb_world_ready(void)
{
    return hb_world.tensor_type != NULL;
}

/* Leaves the error only when it is not an Exception (KeyboardInterrupt, SystemExit):
 * returns NULL either way, for "declined" or "failed" alike. */
PyObject *
hb_swallow(void)
{
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
    }
    return NULL;
}

const HbDType *
hb_dtype_of(unsigned code, unsigned bits)
{
    for (int i = 0; i < hb_world.n_dtypes; i++) {
        const HbDType *e = &hb_world.dtypes[i];
        if (e->code == code && e->bits == bits) {
            return e;
        }
    }
    return NULL;
}

const HbDType *
hb_dtype_entry(PyObject *dtype)
{
    /* Most hand-offs repeat one element type: start where the last lookup ended. */
    static int last = 0;
    int n = hb_world.n_dtypes;
    for (int k = 0; k < n; k++) {
        int i = (last + k) % n;
        if (hb_world.dtypes[i].dtype == dtype) {
            last = i;
            return &hb_world.dtypes[i];
        }
    }
    return NULL;
}

PyObject *
hb_shape_tuple(int ndim, const int64_t *dims)
{
    PyObject *t = PyTuple_New(ndim);
    if (t == NULL) {
        return NULL;
    }
    for (int i = 0; i < ndim; i++) {
        PyObject *v = PyLong_FromLongLong(dims[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* tensor.py's _is_compact: strides of size-1 dimensions carry no information. */
int
hb_is_compact(int ndim, const int64_t *shape, const int64_t *strides)
{
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1) {
            if (strides[i] != expected) {
                return 0;
            }
            if (__builtin_mul_overflow(expected, shape[i], &expected)) {
                return 0;
            }
        }
    }
    return 1;
}

#if defined(__SIZEOF_INT128__)
typedef __int128 wide;
#define WIDE_LIMIT ((wide)1 << 100) /* far beyond any span we accept, far from overflow */

int
hb_span_ok(uint64_t data, uint64_t byte_offset, int ndim, const int64_t *shape,
           const int64_t *strides, unsigned bits, uint64_t *element0)
{
    const wide end64 = (wide)1 << 64, i64max = ((wide)1 << 63) - 1;
    if (data == 0) {
        return 0;
    }
    wide p = (wide)data + (wide)byte_offset;
    if (p >= end64) {
        return 0;
    }
    wide isz = (bits + 7) >> 3;
    if (isz == 0) {
        isz = 1;
    }
    wide n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i];
        if (n > WIDE_LIMIT) {
            n = WIDE_LIMIT;  /* saturated: more than 2**64 elements either way */
        }
    }
    wide lo = 0, hi = 0;
    if (strides == NULL || ndim == 0) {
        hi = n - 1;
    }
    else {
        for (int i = 0; i < ndim; i++) {
            if (strides[i] == INT64_MIN) {
                return 0;
            }
            wide step = (wide)(shape[i] - 1) * strides[i];
            if (step < 0) {
                lo += step;
            }
            else {
                hi += step;
            }
            if (lo < -WIDE_LIMIT || hi > WIDE_LIMIT) {
                return 0;
            }
        }
        if (n >= end64) {
            return 0;  /* more than 2**64 - 1 elements, even if they share memory */
        }
    }
    wide first = p + lo * isz, end = p + (hi + 1) * isz;
    if (end - first > i64max || first < 0 || end > end64) {
        return 0;
    }
    *element0 = (uint64_t)p;
    return 1;
}
#else
int
hb_span_ok(uint64_t data, uint64_t byte_offset, int ndim, const int64_t *shape,
           const int64_t *strides, unsigned bits, uint64_t *element0)
{
    /* No 128-bit integers here: the Python path checks (and decides) every import. */
    (void)data; (void)byte_offset; (void)ndim; (void)shape; (void)strides; (void)bits;
    (void)element0;
    return 0;
}
#endif

/* Tensor._dense(data, shape, dtype, strides=..., padded=..., device=..., owner=...,
 * readonly=..., copied=..., source=...), field for field. */
PyObject *
hb_dense_tensor(const HbDense *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) {
        if (__builtin_mul_overflow(n, d->shape[i], &n)) {
            n = INT64_MAX; /* not empty; the byte counts below then overflow-check */
            for (int j = 0; j < d->ndim; j++) {
                if (d->shape[j] == 0) {
                    n = 0;
                }
            }
            break;
        }
    }
    unsigned bits = d->dtype->bits;
    int64_t isz = bits >> 3 ? bits >> 3 : 1;
    uint64_t data = 0, base0 = 0;
    int64_t nbytes = 0;
    if (n != 0) {
        if (d->strides == NULL) {
            int64_t total;
            if (bits < 8 && !d->padded) {
                if (__builtin_mul_overflow(n, (int64_t)bits, &total)) {
                    goto overflow;
                }
                nbytes = total / 8 + (total % 8 != 0);
            }
            else if (__builtin_mul_overflow(n, isz, &nbytes)) {
                goto overflow;
            }
            data = base0 = d->data;
        }
        else {
            int64_t span = 1, back = 0, step;
            for (int i = 0; i < d->ndim; i++) {
                if (__builtin_mul_overflow(d->shape[i] - 1, d->strides[i], &step)) {
                    goto overflow;
                }
                if (step < 0) {
                    if (__builtin_sub_overflow(back, step, &back)
                            || __builtin_sub_overflow(span, step, &span)) {
                        goto overflow;
                    }
                }
                else if (__builtin_add_overflow(span, step, &span)) {
                    goto overflow;
                }
            }
            int64_t back_bytes;
            if (__builtin_mul_overflow(span, isz, &nbytes)
                    || __builtin_mul_overflow(back, isz, &back_bytes)) {
                goto overflow;
            }
            data = d->data;
            base0 = d->data - (uint64_t)back_bytes;
        }
    }
    PyObject *shape = d->shape_tuple != NULL ? Py_NewRef(d->shape_tuple)
                                             : hb_shape_tuple(d->ndim, d->shape);
    if (shape == NULL) {
        return NULL;
    }
    PyObject *strides;
    if (d->strides == NULL || n == 0) {
        strides = Py_NewRef(Py_None);
    }
    else if ((strides = hb_shape_tuple(d->ndim, d->strides)) == NULL) {
        Py_DECREF(shape);
        return NULL;
    }
    PyObject *o_data = PyLong_FromUnsignedLongLong(data);
    PyObject *o_base0 = base0 == data ? Py_XNewRef(o_data) : PyLong_FromUnsignedLongLong(base0);
    PyObject *o_nbytes = d->nbytes_obj != NULL ? Py_NewRef(d->nbytes_obj)
                                               : PyLong_FromLongLong(nbytes);
    PyObject *t = (o_data && o_base0 && o_nbytes) ? hb_tensor_alloc() : NULL;
    if (t == NULL) {
        Py_DECREF(shape);
        Py_DECREF(strides);
        Py_XDECREF(o_data);
        Py_XDECREF(o_base0);
        Py_XDECREF(o_nbytes);
        return NULL;
    }
    /* The slots are NULL (allocated zeroed, or cleared when kept): each is set once,
     * taking the reference made here. */
    HB_SLOT(t, HB_S_DESC) = Py_NewRef(Py_None);
    HB_SLOT(t, HB_S_BUFFERS) = Py_NewRef(Py_None);
    HB_SLOT(t, HB_S_SHAPE) = shape;
    HB_SLOT(t, HB_S_DTYPE) = Py_NewRef(d->dtype->dtype);
    HB_SLOT(t, HB_S_STRIDES) = strides;
    HB_SLOT(t, HB_S_PADDED) = Py_NewRef(d->padded ? Py_True : Py_False);
    HB_SLOT(t, HB_S_DEVICE) = Py_NewRef(d->device);
    HB_SLOT(t, HB_S_OWNER) = Py_NewRef(d->owner);
    HB_SLOT(t, HB_S_READONLY) = Py_NewRef(d->readonly ? Py_True : Py_False);
    HB_SLOT(t, HB_S_COPIED) = Py_NewRef(d->copied ? Py_True : Py_False);
    HB_SLOT(t, HB_S_SOURCE) = Py_NewRef(d->source != NULL ? d->source : Py_None);
    HB_SLOT(t, HB_S_BASE0) = o_base0;
    HB_SLOT(t, HB_S_DATA) = o_data;
    HB_SLOT(t, HB_S_NBYTES) = o_nbytes;
    return t; /* _dl stays unset, as on the Python path */
overflow:
    PyErr_SetString(PyExc_OverflowError, "tensor byte count beyond int64");
    return NULL;
}

static int
read_slots(PyTypeObject *type, PyObject *slots)
{
    if (!PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) != HB_N_SLOTS) {
        PyErr_Format(PyExc_ValueError, "exchange_setup: %d slot descriptors expected",
                     HB_N_SLOTS);
        return -1;
    }
    for (int i = 0; i < HB_N_SLOTS; i++) {
        PyObject *s = PyTuple_GET_ITEM(slots, i);
        if (Py_TYPE(s) != &PyMemberDescr_Type
                || ((PyDescrObject *)s)->d_type != type) {
            PyErr_SetString(PyExc_TypeError,
                            "exchange_setup: slots must be the tensor type's own slots");
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)s)->d_member;
        if (m->type != Py_T_OBJECT_EX || (m->flags & Py_READONLY) || m->offset <= 0
                || m->offset + (Py_ssize_t)sizeof(PyObject *) > type->tp_basicsize) {
            PyErr_SetString(PyExc_TypeError, "exchange_setup: a slot is not a plain object slot");
            return -1;
        }
        hb_world.slot[i] = m->offset;
    }
    return 0;
}

static int
read_dtypes(PyObject *list)
{
    if (!PyList_Check(list) || PyList_GET_SIZE(list) > HB_MAX_DTYPES) {
        PyErr_SetString(PyExc_ValueError, "exchange_setup: at most 64 element types");
        return -1;
    }
    int n = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *dtype;
        int code, bits, is_complex;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "Oiip:exchange_setup dtypes", &dtype,
                              &code, &bits, &is_complex)) {
            return -1;
        }
        if (code < 0 || code > 255 || bits <= 0 || bits > 255) {
            continue;
        }
        HbDType *e = &hb_world.dtypes[n++];
        Py_XSETREF(e->dtype, Py_NewRef(dtype));
        e->code = (uint8_t)code;
        e->bits = (uint8_t)bits;
        e->is_complex = (uint8_t)is_complex;
    }
    hb_world.n_dtypes = n;
    return 0;
}

/* hb.Tensor's tp_dealloc, in place of the generic subtype_dealloc: it does what that
 * one does for this type -- untrack, clear the weak references, drop every slot, free,
 * drop the type -- without walking the type's member table on every call. Installed
 * only for a class whose layout is exactly object + the slots exchange_setup() read +
 * __weakref__, without finalizer or __dict__ (see tensor_dealloc_ok). For a subclass,
 * subtype_dealloc clears the subclass's own slots, re-tracks and calls this as the
 * base's dealloc, as for any heap type with a dealloc of its own. */
static Py_ssize_t dealloc_slots[HB_N_SLOTS], dealloc_weaklist; /* of the type it serves */

/* Released tensors of exactly hb.Tensor, kept for the next ones the import paths make
 * (as CPython keeps floats and tuples): their memory, GC header included, untracked,
 * every slot cleared. Used under the GIL only. Where _Py_NewReference is not public
 * API (3.13 on), no tensor is kept. */
#if PY_VERSION_HEX < 0x030D0000
#define KEPT_TENSORS 16
#else
#define KEPT_TENSORS 0
#endif
#if KEPT_TENSORS
static PyObject *kept_tensors[KEPT_TENSORS];
static int n_kept_tensors = 0;
#endif
static int use_kept = 0; /* tensor_dealloc serves hb_world.tensor_type */

PyObject *
hb_tensor_alloc(void)
{
    PyTypeObject *tp = hb_world.tensor_type;
#if KEPT_TENSORS
    if (n_kept_tensors > 0) {
        PyObject *t = kept_tensors[--n_kept_tensors];
        Py_SET_TYPE(t, (PyTypeObject *)Py_NewRef(tp));
        _Py_NewReference(t);
        PyObject_GC_Track(t);
        return t;
    }
#endif
    return tp->tp_alloc(tp, 0);
}

static void
tensor_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Py_TRASHCAN_BEGIN(self, tensor_dealloc)
    if (*(PyObject **)((char *)self + dealloc_weaklist) != NULL) {
        PyObject_ClearWeakRefs(self);
    }
    for (int i = 0; i < HB_N_SLOTS; i++) {
        Py_CLEAR(*(PyObject **)((char *)self + dealloc_slots[i]));
    }
#if KEPT_TENSORS
    /* Not one that was finalized: a __del__ of a subclass that set __class__ back to
     * hb.Tensor leaves the GC header's finalized bit, which would then stop the __del__
     * of whatever the memory becomes next. */
    if (use_kept && tp == hb_world.tensor_type && n_kept_tensors < KEPT_TENSORS
            && !PyObject_GC_IsFinalized(self)) {
        kept_tensors[n_kept_tensors++] = self; /* slots and weak list are NULL now */
    }
    else
#endif
    {
        tp->tp_free(self);
    }
    Py_DECREF(tp);
    Py_TRASHCAN_END
}

/* Whether tensor_dealloc may replace type's generic dealloc: object + the slots read
 * (HB_N_SLOTS of them) + __weakref__, nothing else, no finalizer. */
static int
tensor_dealloc_ok(PyTypeObject *type)
{
    return type->tp_base == &PyBaseObject_Type && Py_SIZE(type) == HB_N_SLOTS
           && type->tp_dictoffset == 0 && type->tp_weaklistoffset > 0
           && type->tp_basicsize == (Py_ssize_t)sizeof(PyObject)
                                    + (HB_N_SLOTS + 1) * (Py_ssize_t)sizeof(PyObject *)
           && type->tp_finalize == NULL && type->tp_del == NULL
           && (type->tp_flags & Py_TPFLAGS_HAVE_GC)
           && type->tp_free == PyObject_GC_Del;
}

/* exchange_setup(Tensor, slots, Device, CPU, cpu_dl, UnsupportedError, ROW_MAJOR,
 *                STRIDED, dlpack_py, dlpack_device_py, export_py, generic_ok, dtypes) */
PyObject *
hb_exchange_setup(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyTypeObject *type;
    PyObject *slots, *device_type, *cpu, *cpu_dl, *unsupported, *row_major, *strided;
    PyObject *dlpack_py, *dlpack_device_py, *export_py, *generic_ok, *dtypes;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOOOOO:exchange_setup", &PyType_Type, &type, &slots,
                          &device_type, &cpu, &cpu_dl, &unsupported, &row_major, &strided,
                          &dlpack_py, &dlpack_device_py, &export_py, &generic_ok, &dtypes)) {
        return NULL;
    }
    if (type->tp_alloc == NULL || (type->tp_flags & Py_TPFLAGS_HEAPTYPE) == 0) {
        PyErr_SetString(PyExc_TypeError, "exchange_setup: the tensor type must be a class");
        return NULL;
    }
    if (read_slots(type, slots) < 0 || read_dtypes(dtypes) < 0) {
        return NULL;
    }
    Py_XSETREF(hb_world.device_type, Py_NewRef(device_type));
    Py_XSETREF(hb_world.cpu, Py_NewRef(cpu));
    Py_XSETREF(hb_world.cpu_dl, Py_NewRef(cpu_dl));
    Py_XSETREF(hb_world.unsupported, Py_NewRef(unsupported));
    Py_XSETREF(hb_world.row_major, Py_NewRef(row_major));
    Py_XSETREF(hb_world.strided, Py_NewRef(strided));
    Py_XSETREF(hb_world.dlpack_py, Py_NewRef(dlpack_py));
    Py_XSETREF(hb_world.dlpack_device_py, Py_NewRef(dlpack_device_py));
    Py_XSETREF(hb_world.export_py, Py_NewRef(export_py));
    Py_XSETREF(hb_world.generic_ok, Py_NewRef(generic_ok));
    if (hb_world.tensor_type == NULL && tensor_dealloc_ok(type)) {
        memcpy(dealloc_slots, hb_world.slot, sizeof(dealloc_slots));
        dealloc_weaklist = type->tp_weaklistoffset;
        type->tp_dealloc = tensor_dealloc;
        use_kept = type->tp_alloc == PyType_GenericAlloc && type->tp_itemsize == 0;
    }
    Py_XSETREF(hb_world.tensor_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

/* buffer_address(obj): the address of obj's buffer, asked as PyBUF_SIMPLE (contiguous
 * bytes). The caller keeps the buffer exported (a memoryview of it) for as long as the
 * address is used. _memory.buffer_address's ctypes way (a Py_buffer object and two
 * foreign calls) was a tenth of a small file's load. */
HB_INTERNAL PyObject *
hb_buffer_address(PyObject *Py_UNUSED(module), PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *out = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return out;
}
