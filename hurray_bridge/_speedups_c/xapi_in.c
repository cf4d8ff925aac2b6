/* DLPack import in C: producer types' C exchange API, and the fronts that use it.
 *
 * Two ways in, both optional (without this module every call takes the Python path,
 * which stays the reference for every answer):
 *
 * 1. Registered types (an adapter's: torch.Tensor). register_import() gets the
 *    producer's exchange table and the adapter's rules, checked once against sample
 *    tensors: which attributes and methods send a tensor to the Python path when true
 *    (requires_grad, is_neg, for complex types is_conj: the exchange API would hand
 *    over the raw memory of a conj/neg view), which native dtypes map to which
 *    hb.DType (several torch dtypes share one DLPack code), how devices map. An
 *    ImportFront (hb.asarray, the adapter's to_hurray) then reads such a tensor with
 *    dltensor_from_py_object_no_sync -- non-owning, so the tensor itself is the owner,
 *    as on the Python path -- and builds the hb.Tensor in C. Anything it does not
 *    take, or any failure, goes to the front's Python function with the same
 *    arguments. numpy_entry() builds the NumPy array of such a tensor the same way
 *    (hb.convert's torch -> numpy shortcut).
 *
 * 2. Any other producer type that publishes a table (import_exchange(), reached from
 *    hb.from_dlpack): managed_tensor_from_py_object_no_sync gives an owning struct,
 *    read with the checks of _capsule.consume_capsule and kept by a ManagedTensor
 *    owner whose death runs the producer's deleter once. Types that an adapter
 *    claims never take this way (their adapter decides), nor does anything the
 *    checks refuse: the struct is then released and the capsule path answers.
 *
 * Tables are looked up on the type (DLPack's rule), cached per type and re-read when
 * the type changes (its version tag); the major version must be 1.
 */
#include "speedups.h"

#include <stddef.h>
#include <string.h>

#define EXCHANGE_ATTR "__dlpack_c_exchange_api__"

/* ------------------------------------------------------------ ManagedTensor owner */

typedef struct {
    PyObject_HEAD
    HbDLManagedTensorVersioned *managed; /* NULL once released */
    PyObject *weakrefs;
} ManagedTensor;

static void
managed_release(ManagedTensor *self)
{
    HbDLManagedTensorVersioned *mt = self->managed;
    self->managed = NULL;
    if (mt != NULL && mt->deleter != NULL) {
        /* Foreign deleters run with the GIL held, as NumPy and torch call theirs; an
         * exception in flight (a dying temporary) is set aside and put back. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        mt->deleter(mt);
        PyErr_Restore(type, value, tb);
    }
}

static PyObject *
managed_release_method(ManagedTensor *self, PyObject *Py_UNUSED(ignored))
{
    managed_release(self);
    Py_RETURN_NONE;
}

static void
managed_dealloc(ManagedTensor *self)
{
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    managed_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
managed_repr(ManagedTensor *self)
{
    if (self->managed == NULL) {
        return PyUnicode_FromString("<DLPack managed tensor released>");
    }
    return PyUnicode_FromFormat("<DLPack managed tensor %p>", (void *)self->managed);
}

static PyMethodDef managed_methods[] = {
    {"release", (PyCFunction)managed_release_method, METH_NOARGS,
     "Run the producer's deleter now (idempotent); the memory must no longer be used."},
    {NULL}
};

static PyTypeObject ManagedTensorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hurray_bridge._speedups.ManagedTensor",
    .tp_basicsize = sizeof(ManagedTensor),
    .tp_dealloc = (destructor)managed_dealloc,
    .tp_repr = (reprfunc)managed_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Owns one imported DLManagedTensorVersioned; its deleter runs once, when this "
              "object goes (or at release()).",
    .tp_weaklistoffset = offsetof(ManagedTensor, weakrefs),
    .tp_methods = managed_methods,
};

/* --------------------------------------------------------- a managed struct, read */

static PyObject *
device_object(int32_t type, int32_t id)
{
    if (type == HB_KDL_CPU && id == 0) {
        return Py_NewRef(hb_world.cpu);
    }
    return PyObject_CallFunction(hb_world.device_type, "ii", (int)type, (int)id);
}

/* An hb.Tensor over the memory of an owning struct, as tensor.from_dlview(
 * _capsule.consume_capsule(capsule)) builds it. NULL with *declined set: not taken
 * (anything the Python path refuses or treats specially), no error set and the struct
 * still the caller's. NULL with an error: failed, the struct still the caller's. On
 * success a ManagedTensor inside the tensor owns the struct. */
PyObject *
hb_import_managed(HbDLManagedTensorVersioned *mt, PyObject *source, int *declined)
{
    *declined = 1;
    if (!hb_world_ready() || mt == NULL || mt->version.major != HB_DLPACK_MAJOR) {
        return NULL;
    }
    const HbDLTensor *dl = &mt->dl_tensor;
    int ndim = dl->ndim;
    if (ndim < 0 || ndim > HB_MAX_RANK || (ndim > 0 && dl->shape == NULL)
            || dl->dtype.lanes != 1) {
        return NULL;
    }
    int64_t shape[HB_MAX_RANK], strides[HB_MAX_RANK];
    int has_strides = ndim > 0 && dl->strides != NULL, empty = 0;
    for (int i = 0; i < ndim; i++) {
        shape[i] = dl->shape[i];
        if (shape[i] < 0) {
            return NULL;
        }
        empty |= shape[i] == 0;
        if (has_strides) {
            strides[i] = dl->strides[i];
        }
    }
    const HbDType *dtype = hb_dtype_of(dl->dtype.code, dl->dtype.bits);
    if (dtype == NULL) {
        return NULL;
    }
    uint64_t data = 0;
    if (!empty && !hb_span_ok((uint64_t)(uintptr_t)dl->data, dl->byte_offset, ndim, shape,
                              has_strides ? strides : NULL, dtype->bits, &data)) {
        return NULL;
    }
    int padded = (mt->flags & HB_DLFLAG_SUBBYTE_PADDED) && dtype->bits < 8;
    const int64_t *use_strides = NULL;
    if (has_strides && !empty && !hb_is_compact(ndim, shape, strides)) {
        if (dtype->bits < 8 && !padded) {
            return NULL; /* packed sub-byte data with strides: the Python path says why */
        }
        /* A stride whose bytes no int64 holds: the Python path rewrites size-1 ones. */
        int64_t isz = dtype->bits >> 3 ? dtype->bits >> 3 : 1, limit = INT64_MAX / isz;
        for (int i = 0; i < ndim; i++) {
            if (strides[i] > limit || strides[i] < -limit) {
                return NULL;
            }
        }
        use_strides = strides;
    }
    *declined = 0;
    PyObject *device = device_object(dl->device.device_type, dl->device.device_id);
    if (device == NULL) {
        return NULL;
    }
    ManagedTensor *owner = PyObject_New(ManagedTensor, &ManagedTensorType);
    if (owner == NULL) {
        Py_DECREF(device);
        return NULL;
    }
    owner->managed = NULL;
    owner->weakrefs = NULL;
    HbDense d = {
        .data = data, .ndim = ndim, .shape = shape, .strides = use_strides,
        .shape_tuple = NULL, .dtype = dtype, .padded = padded,
        .readonly = (mt->flags & HB_DLFLAG_READ_ONLY) != 0,
        .copied = (mt->flags & HB_DLFLAG_IS_COPIED) != 0,
        .device = device, .owner = (PyObject *)owner, .source = source, .nbytes_obj = NULL,
    };
    PyObject *t = hb_dense_tensor(&d);
    Py_DECREF(device);
    if (t != NULL) {
        owner->managed = mt; /* only now: a failure above leaves the struct the caller's */
    }
    Py_DECREF(owner);
    return t;
}

/* ----------------------------------------------------- tables of producer types */

typedef struct {
    PyTypeObject *type;      /* strong */
    unsigned int tag;        /* tp_version_tag when read (0: never cached) */
    const HbDLPackExchangeAPI *api; /* NULL: none, or not for the generic path */
} TypeTable;

#define N_TYPE_TABLES 16
static TypeTable type_tables[N_TYPE_TABLES];
static int type_tables_next = 0;

/* The type's exchange table (DLPack 1.3: a capsule on the type; major version 1 with
 * the function this module calls), or NULL, with no error set. */
static const HbDLPackExchangeAPI *
read_table(PyTypeObject *tp)
{
    PyObject *cap = PyObject_GetAttrString((PyObject *)tp, EXCHANGE_ATTR);
    if (cap == NULL) {
        hb_swallow();
        return NULL;
    }
    const HbDLPackExchangeAPI *api = NULL;
    if (PyCapsule_IsValid(cap, HB_EXCHANGE_API_NAME)) {
        api = PyCapsule_GetPointer(cap, HB_EXCHANGE_API_NAME);
        if (api != NULL && api->header.version.major != HB_DLPACK_MAJOR) {
            api = NULL;
        }
    }
    Py_DECREF(cap);
    return api;
}

/* For the generic path: the table of a type no adapter claims (cached per type). */
static const HbDLPackExchangeAPI *
generic_table(PyTypeObject *tp)
{
    for (int i = 0; i < N_TYPE_TABLES; i++) {
        TypeTable *e = &type_tables[i];
        if (e->type == tp) {
            if (e->tag != 0 && e->tag == tp->tp_version_tag) {
                return e->api;
            }
            break;
        }
    }
    const HbDLPackExchangeAPI *api = read_table(tp);
    if (api != NULL && api->managed_tensor_from_py_object_no_sync == NULL) {
        api = NULL;
    }
    if (api != NULL) {
        PyObject *ok = PyObject_CallOneArg(hb_world.generic_ok, (PyObject *)tp);
        int yes = ok != NULL ? PyObject_IsTrue(ok) : -1;
        Py_XDECREF(ok);
        if (yes < 0) {
            hb_swallow();
            return NULL;
        }
        if (!yes) {
            api = NULL;
        }
    }
    /* The attribute lookup above gave the type a version tag when it can have one. */
    unsigned int tag = tp->tp_version_tag;
    if (tag != 0) {
        TypeTable *slot = NULL;
        for (int i = 0; i < N_TYPE_TABLES && slot == NULL; i++) {
            if (type_tables[i].type == tp) {
                slot = &type_tables[i];
            }
        }
        if (slot == NULL) {
            slot = &type_tables[type_tables_next];
            type_tables_next = (type_tables_next + 1) % N_TYPE_TABLES;
            Py_XSETREF(slot->type, (PyTypeObject *)Py_NewRef(tp));
        }
        slot->tag = tag;
        slot->api = api;
    }
    return api;
}

/* import_exchange(obj) -> hb.Tensor over obj's memory through its type's exchange
 * table, or None (no table, an adapter's type, a refusal or anything the checks do
 * not take: the capsule path then decides). The tensor has no source set. */
static PyObject *
import_exchange(PyObject *Py_UNUSED(module), PyObject *obj)
{
    if (!hb_world_ready()) {
        Py_RETURN_NONE;
    }
    const HbDLPackExchangeAPI *api = generic_table(Py_TYPE(obj));
    if (api == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    HbDLManagedTensorVersioned *mt = NULL;
    if (api->managed_tensor_from_py_object_no_sync(obj, &mt) != 0 || mt == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        return NULL;
    }
    int declined;
    PyObject *t = hb_import_managed(mt, NULL, &declined);
    if (t == NULL) {
        /* Not taken: released now, and the capsule path decides (and names why). */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (mt->deleter != NULL) {
            mt->deleter(mt);
        }
        PyErr_Restore(type, value, tb);
        hb_swallow();
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return t;
}

/* ------------------------------------------------------------- registered types */

/* One attribute or method of the producer type, resolved to its C function where the
 * type defines it in C (a getset, a METH_NOARGS method), else asked by name. */
typedef struct {
    PyObject *name;        /* interned */
    PyObject *descr;       /* what the type had under that name (strong), or NULL */
    getter get;
    void *closure;
    PyCFunction noargs;
    int is_method;
} Guard;

#define MAX_GUARDS 4
#define HOLD_SEEN_BITS 3
#define HOLD_SEEN (1 << HOLD_SEEN_BITS)
#define MAX_NATIVES 64
#define MAX_GPU_IDS 16

typedef struct {
    uint8_t code, bits;
    int ambiguous;         /* several native dtypes export this code: ask the dtype */
    const HbDType *dtype;  /* the one, when not ambiguous (NULL: no hb type) */
} Key;

/* A tensor seen on a storage that was not resizable, by weak references only: while
 * both referents live and the tensor's first element is still at data, the tensor is
 * still over that storage (a live storage's bytes are no other storage's), and the mark
 * is permanent. The storage's reference is the key that matters: a storage swapped
 * under the same tensor (x.data = y) may land at a freed one's address, but the freed
 * storage's object is dead. torch keeps a storage's Python object as long as the
 * storage; where a framework does not, its references die at once and nothing is
 * remembered. (torch's share_memory_ moves a live storage's bytes and frees the old
 * ones: docs/impl/c-ffi.md §8.1 says what that leaves.) */
typedef struct {
    PyObject *tensor;      /* weak reference, NULL: an empty slot */
    PyObject *storage;     /* weak reference */
    uint64_t data;
} HoldSeen;

typedef struct {
    PyTypeObject *type;    /* strong */
    unsigned int tag;      /* tp_version_tag the guards were resolved at */
    const HbDLPackExchangeAPI *api;
    Guard decline[MAX_GUARDS];
    int n_decline;
    Guard complex_decline[MAX_GUARDS];
    int n_complex;
    Guard pinned;
    int has_pinned;
    /* Host memory about to be shared: hold_storage() gives the object's storage, whose
     * hold_check() true means hold_fn(obj, storage) must run first (torch: a storage
     * that resize_ could free is made non-resizable, as Tensor.numpy() does). */
    Guard hold_storage;
    PyObject *hold_check;  /* interned method name */
    PyObject *hold_fn;
    int has_hold;
    /* Tensors already found held, by their data address: a loop that hands one
     * tensor over again and again skips the two calls. The GIL guards it (the module
     * declares no free-threading support, so such a build enables the GIL for it). */
    HoldSeen hold_seen[HOLD_SEEN];
    Guard dtype_attr;
    Key keys[MAX_NATIVES];
    int n_keys;
    int8_t key_at[32][8];  /* keys index by code (< 32) and bits_index(bits); -1: none */
    PyObject *natives[MAX_NATIVES];   /* native dtype objects (strong) */
    const HbDType *native_dtypes[MAX_NATIVES];
    int n_natives;
    int always_ask;        /* a native dtype had no sample: ask the dtype every time */
    PyObject *pinned_device;
    int32_t gpu_type;
    PyObject *gpu_devices[MAX_GPU_IDS];
    int max_rank;
    /* The last shape tuple made, and its byte count for last_bits: an import loop
     * sees one shape (and element type) again and again. */
    PyObject *last_shape;
    int last_ndim;
    int64_t last_dims[HB_MAX_RANK];
    PyObject *last_nbytes;
    unsigned last_bits;
    /* The address of the last tensor made, as an int: an import loop sees one
     * tensor's memory again and again. */
    PyObject *last_data;
    uint64_t last_data_value;
} Handler;

/* log2 of a power-of-two bit width up to 128, else -1 */
static inline int
bits_index(unsigned bits)
{
    switch (bits) {
    case 1: return 0;
    case 2: return 1;
    case 4: return 2;
    case 8: return 3;
    case 16: return 4;
    case 32: return 5;
    case 64: return 6;
    case 128: return 7;
    default: return -1;
    }
}

#define MAX_HANDLERS 8
static Handler *handlers[MAX_HANDLERS];
static int n_handlers = 0;

static Handler *
handler_for(PyTypeObject *tp)
{
    for (int i = 0; i < n_handlers; i++) {
        if (handlers[i]->type == tp) {
            return handlers[i];
        }
    }
    return NULL;
}

static int
guard_resolve(Guard *g, PyTypeObject *tp)
{
    Py_CLEAR(g->descr);
    g->get = NULL;
    g->closure = NULL;
    g->noargs = NULL;
    PyObject *d = _PyType_Lookup(tp, g->name); /* borrowed, no error set */
    if (d == NULL) {
        return 0;
    }
    g->descr = Py_NewRef(d);
    if (!g->is_method && Py_TYPE(d) == &PyGetSetDescr_Type) {
        PyGetSetDef *gs = ((PyGetSetDescrObject *)d)->d_getset;
        g->get = gs->get;
        g->closure = gs->closure;
    }
    else if (g->is_method && Py_TYPE(d) == &PyMethodDescr_Type) {
        PyMethodDef *m = ((PyMethodDescrObject *)d)->d_method;
        if ((m->ml_flags & (METH_VARARGS | METH_KEYWORDS | METH_NOARGS | METH_O
                            | METH_FASTCALL)) == METH_NOARGS) {
            g->noargs = m->ml_meth;
        }
    }
    return 0;
}

static void
handler_resolve(Handler *h)
{
    for (int i = 0; i < h->n_decline; i++) {
        guard_resolve(&h->decline[i], h->type);
    }
    for (int i = 0; i < h->n_complex; i++) {
        guard_resolve(&h->complex_decline[i], h->type);
    }
    if (h->has_pinned) {
        guard_resolve(&h->pinned, h->type);
    }
    if (h->has_hold) {
        guard_resolve(&h->hold_storage, h->type);
    }
    guard_resolve(&h->dtype_attr, h->type);
    h->tag = h->type->tp_version_tag;
}

/* The guard's value for obj: a new reference, NULL with an error on failure. */
static inline PyObject *
guard_value(const Guard *g, PyObject *obj)
{
    if (g->get != NULL) {
        return g->get(obj, g->closure);
    }
    if (g->noargs != NULL) {
        return g->noargs(obj, NULL);
    }
    return g->is_method ? PyObject_CallMethodNoArgs(obj, g->name) : PyObject_GetAttr(obj, g->name);
}

/* 1 true, 0 false, -1 failed (error set). */
static inline int
guard_true(const Guard *g, PyObject *obj)
{
    PyObject *v = guard_value(g, obj);
    if (v == NULL) {
        return -1;
    }
    int r = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* 1: ref's referent is alive (and is obj, unless obj is NULL); no error. */
static inline int
weak_is(PyObject *ref, PyObject *obj)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o;
    if (PyWeakref_GetRef(ref, &o) <= 0) {
        return 0;
    }
    Py_DECREF(o);
    return obj == NULL || o == obj;
#else
    PyObject *o = PyWeakref_GET_OBJECT(ref);
    return o != Py_None && (obj == NULL || o == obj);
#endif
}

/* ref's referent, a new reference, or NULL (dead); no error. */
static inline PyObject *
weak_get(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *o;
    return PyWeakref_GetRef(ref, &o) > 0 ? o : NULL;
#else
    PyObject *o = PyWeakref_GET_OBJECT(ref);
    return o != Py_None ? Py_NewRef(o) : NULL;
#endif
}

/* 1: storage needs the hold (hold_check() true), 0: not, -1: failed, error set. */
static int
hold_needed(Handler *h, PyObject *storage)
{
    PyObject *v = PyObject_CallMethodNoArgs(storage, h->hold_check);
    int needed = v == NULL ? -1 : v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    return needed;
}

static void
hold_remember(HoldSeen *seen, PyObject *obj, PyObject *storage, uint64_t data)
{
    /* Both made before the slot changes: making one may collect garbage, whose
     * finalizers may hand tensors over and write this slot. */
    PyObject *t = PyWeakref_NewRef(obj, NULL);
    PyObject *s = t == NULL ? NULL : PyWeakref_NewRef(storage, NULL);
    if (s == NULL) {
        Py_XDECREF(t);
        PyErr_Clear(); /* not weakly referable: it is just not remembered */
        return;
    }
    Py_XSETREF(seen->tensor, t);
    Py_XSETREF(seen->storage, s);
    seen->data = data;
}

/* Before obj's host memory, its first element at data (0: no elements), is shared:
 * the adapter's hold (see Handler). Returns what keeps that memory alive, a new
 * reference: the storage where the adapter names one (the object's storage may be
 * swapped, x.set_(y) or x.data = y, which frees the old memory under an export owned by
 * the object alone), else obj. NULL: failed, error set (the caller declines to the
 * Python path, which meets the same failure in its own words). */
static PyObject *
hold_host(Handler *h, PyObject *obj, uint64_t data)
{
    if (!h->has_hold) {
        return Py_NewRef(obj);
    }
    /* An empty tensor's address may be the end of one storage and the start of the
     * next: only elements prove which storage they are in. */
    HoldSeen *seen = NULL;
    if (data != 0) {
        /* Fibonacci hashing: the top bits of the product depend on every bit of data. */
        seen = &h->hold_seen[(data * 0x9E3779B97F4A7C15ull) >> (64 - HOLD_SEEN_BITS)];
        if (seen->tensor != NULL && seen->data == data && weak_is(seen->tensor, obj)) {
            PyObject *held = weak_get(seen->storage);
            if (held != NULL) {
                return held;
            }
        }
    }
    PyObject *storage = guard_value(&h->hold_storage, obj);
    if (storage == NULL) {
        return NULL;
    }
    int needed = hold_needed(h, storage);
    if (needed > 0) {
        PyObject *done = PyObject_CallFunctionObjArgs(h->hold_fn, obj, storage, NULL);
        /* Asked again: remembered is only a storage seen not resizable (the hold
         * leaves it resizable where it cannot mark it). */
        needed = done == NULL ? -1 : hold_needed(h, storage);
        Py_XDECREF(done);
    }
    if (needed < 0) {
        Py_DECREF(storage);
        return NULL;
    }
    if (needed == 0 && seen != NULL) {
        hold_remember(seen, obj, storage, data);
    }
    return storage;
}

static const HbDType *
native_dtype(Handler *h, PyObject *obj)
{
    PyObject *native = guard_value(&h->dtype_attr, obj);
    if (native == NULL) {
        return NULL;
    }
    const HbDType *found = NULL;
    for (int i = 0; i < h->n_natives; i++) {
        if (h->natives[i] == native) {
            found = h->native_dtypes[i];
            break;
        }
    }
    Py_DECREF(native);
    return found;
}

static PyObject *
gpu_device(Handler *h, int32_t id)
{
    if (id < 0 || id >= MAX_GPU_IDS) {
        return PyObject_CallFunction(hb_world.device_type, "ii", (int)h->gpu_type, (int)id);
    }
    if (h->gpu_devices[id] == NULL) {
        h->gpu_devices[id] = PyObject_CallFunction(hb_world.device_type, "ii",
                                                   (int)h->gpu_type, (int)id);
        if (h->gpu_devices[id] == NULL) {
            return NULL;
        }
    }
    return Py_NewRef(h->gpu_devices[id]);
}

/* What the registered type's exchange table says of obj, with the handler's rules
 * applied. 1: taken (out filled, shape/strides copied into the arrays), 0: declined,
 * -1: an error that is not an Exception (KeyboardInterrupt): propagate. */
typedef struct {
    HbDLTensor dl;
    int64_t shape[HB_MAX_RANK];
    int64_t strides[HB_MAX_RANK];
    const HbDType *dtype;
    int compact;
    uint64_t data;        /* element [0, ..., 0]; 0 when empty */
    int empty;
} Read;

static int
declined(void)
{
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return -1;
        }
        PyErr_Clear();
    }
    return 0;
}

static int
read_registered(Handler *h, PyObject *obj, Read *r)
{
    if (h->tag == 0 || h->type->tp_version_tag != h->tag) {
        handler_resolve(h); /* the type changed: its attributes may be others now */
    }
    for (int i = 0; i < h->n_decline; i++) {
        int t = guard_true(&h->decline[i], obj);
        if (t != 0) {
            return declined();
        }
    }
    /* Copied out at once: the producer's arrays are valid only until it runs again. */
    if (h->api->dltensor_from_py_object_no_sync(obj, &r->dl) != 0) {
        return declined();
    }
    int ndim = r->dl.ndim;
    if (ndim < 0 || ndim > h->max_rank || r->dl.dtype.lanes != 1
            || (ndim > 0 && (r->dl.shape == NULL || r->dl.strides == NULL))) {
        return 0;
    }
    int empty = 0, overflow = 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        r->shape[i] = r->dl.shape[i];
        r->strides[i] = r->dl.strides[i];
        if (r->shape[i] < 0) {
            return 0;
        }
        empty |= r->shape[i] == 0;
        overflow |= __builtin_mul_overflow(n, r->shape[i], &n);
    }
    r->empty = empty;
    const HbDType *dtype = NULL;
    int b = bits_index(r->dl.dtype.bits);
    int k = r->dl.dtype.code < 32 && b >= 0 ? h->key_at[r->dl.dtype.code][b] : -1;
    if (k < 0) {
        return 0;
    }
    if (h->always_ask || h->keys[k].ambiguous) {
        dtype = native_dtype(h, obj);
        if (dtype == NULL) {
            return declined();
        }
        if (dtype->code != r->dl.dtype.code || dtype->bits != r->dl.dtype.bits) {
            return 0;
        }
    }
    else if ((dtype = h->keys[k].dtype) == NULL) {
        return 0;
    }
    r->dtype = dtype;
    if (dtype->is_complex) {
        for (int i = 0; i < h->n_complex; i++) {
            int t = guard_true(&h->complex_decline[i], obj);
            if (t != 0) {
                return declined();
            }
        }
    }
    r->data = 0;
    r->compact = empty || hb_is_compact(ndim, r->shape, r->strides);
    if (!empty) {
        /* Compact whole-byte memory at offset 0: its span is n elements from data, in
         * the address space when that sum does not wrap. Anything else: all the checks
         * of _capsule._element_address. */
        uint64_t p = (uint64_t)(uintptr_t)r->dl.data;
        int64_t bytes;
        if (r->compact && !overflow && p != 0 && r->dl.byte_offset == 0 && dtype->bits >= 8
                && !__builtin_mul_overflow(n, (int64_t)(dtype->bits >> 3), &bytes)
                && p + (uint64_t)bytes > p) {
            r->data = p;
        }
        else if (!hb_span_ok(p, r->dl.byte_offset, ndim, r->shape,
                             r->compact ? NULL : r->strides, dtype->bits, &r->data)) {
            return 0;
        }
    }
    return 1;
}

static PyObject *
cached_shape(Handler *h, int ndim, const int64_t *dims)
{
    if (h->last_shape != NULL && h->last_ndim == ndim) {
        int i = 0;
        while (i < ndim && h->last_dims[i] == dims[i]) {
            i++;
        }
        if (i == ndim) {
            return Py_NewRef(h->last_shape);
        }
    }
    PyObject *t = hb_shape_tuple(ndim, dims);
    if (t != NULL) {
        Py_XSETREF(h->last_shape, Py_NewRef(t));
        Py_CLEAR(h->last_nbytes);
        h->last_ndim = ndim;
        memcpy(h->last_dims, dims, sizeof(int64_t) * (size_t)ndim);
    }
    return t;
}

/* The hb.Tensor of a registered type's object, as the adapter's Python to_hurray makes
 * it; NULL with no error: declined (the caller takes the Python path). */
static PyObject *
import_registered(Handler *h, PyObject *obj)
{
    Read r;
    int got = read_registered(h, obj, &r);
    if (got <= 0) {
        return NULL;
    }
    PyObject *device, *source = NULL, *owner = NULL;
    if (r.dl.device.device_type == HB_KDL_CPU) {
        device = hb_world.cpu;
        if (h->has_pinned) {
            int pinned = guard_true(&h->pinned, obj);
            if (pinned < 0) {
                return hb_swallow();
            }
            if (pinned) {
                device = h->pinned_device;
            }
        }
        owner = hold_host(h, obj, r.data);
        if (owner == NULL) {
            return hb_swallow();
        }
        Py_INCREF(device);
    }
    else if (h->gpu_type != 0 && r.dl.device.device_type == h->gpu_type) {
        device = gpu_device(h, r.dl.device.device_id);
        if (device == NULL) {
            return hb_swallow();
        }
        source = obj; /* exports forward to the producer, which orders its stream */
        owner = Py_NewRef(obj);
    }
    else {
        return NULL;
    }
    PyObject *shape = cached_shape(h, r.dl.ndim, r.shape);
    if (shape == NULL) {
        Py_DECREF(owner);
        Py_DECREF(device);
        return hb_swallow();
    }
    PyObject *t;
    if (r.compact) {
        /* Compact (or empty): base = element 0, and the byte count depends on the shape
         * and element size alone (remembered for the shape just seen). */
        PyObject *nbytes;
        if (shape == h->last_shape && h->last_nbytes != NULL && h->last_bits == r.dtype->bits) {
            nbytes = Py_NewRef(h->last_nbytes);
        }
        else {
            int64_t n = 1, isz = r.dtype->bits >> 3;
            for (int i = 0; i < r.dl.ndim; i++) {
                n *= r.shape[i]; /* within int64: the span check bounded it */
            }
            nbytes = PyLong_FromLongLong(r.empty ? 0 : n * isz);
            if (nbytes != NULL && shape == h->last_shape) {
                Py_XSETREF(h->last_nbytes, Py_NewRef(nbytes));
                h->last_bits = r.dtype->bits;
            }
        }
        PyObject *data = NULL;
        if (nbytes != NULL) {
            if (h->last_data != NULL && h->last_data_value == r.data) {
                data = Py_NewRef(h->last_data);
            }
            else if ((data = PyLong_FromUnsignedLongLong(r.data)) != NULL) {
                Py_XSETREF(h->last_data, Py_NewRef(data));
                h->last_data_value = r.data;
            }
        }
        t = data != NULL ? hb_tensor_alloc() : NULL;
        if (t == NULL) {
            Py_XDECREF(nbytes);
            Py_XDECREF(data);
            Py_DECREF(shape);
            Py_DECREF(owner);
            Py_DECREF(device);
            return hb_swallow();
        }
        /* the slots are NULL; Tensor._dense's values, references taken here */
        HB_SLOT(t, HB_S_DESC) = Py_NewRef(Py_None);
        HB_SLOT(t, HB_S_BUFFERS) = Py_NewRef(Py_None);
        HB_SLOT(t, HB_S_SHAPE) = shape;
        HB_SLOT(t, HB_S_DTYPE) = Py_NewRef(r.dtype->dtype);
        HB_SLOT(t, HB_S_STRIDES) = Py_NewRef(Py_None);
        HB_SLOT(t, HB_S_PADDED) = Py_NewRef(Py_False);
        HB_SLOT(t, HB_S_DEVICE) = device;
        HB_SLOT(t, HB_S_OWNER) = owner;
        HB_SLOT(t, HB_S_READONLY) = Py_NewRef(Py_False);
        HB_SLOT(t, HB_S_COPIED) = Py_NewRef(Py_False);
        HB_SLOT(t, HB_S_SOURCE) = Py_NewRef(source != NULL ? source : Py_None);
        HB_SLOT(t, HB_S_BASE0) = Py_NewRef(data);
        HB_SLOT(t, HB_S_DATA) = data;
        HB_SLOT(t, HB_S_NBYTES) = nbytes;
        return t;
    }
    HbDense d = {
        .data = r.data, .ndim = r.dl.ndim, .shape = r.shape, .strides = r.strides,
        .shape_tuple = shape, .dtype = r.dtype, .padded = 0, .readonly = 0, .copied = 0,
        .device = device, .owner = owner, .source = source, .nbytes_obj = NULL,
    };
    t = hb_dense_tensor(&d);
    Py_DECREF(shape);
    Py_DECREF(owner);
    Py_DECREF(device);
    return t != NULL ? t : hb_swallow();
}

static int
guards_from(Guard *out, int *n, PyObject *names, int is_method)
{
    if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) > MAX_GUARDS) {
        PyErr_SetString(PyExc_ValueError, "register_import: at most 4 names, in a tuple");
        return -1;
    }
    *n = (int)PyTuple_GET_SIZE(names);
    for (int i = 0; i < *n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "register_import: names must be strings");
            return -1;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        out[i].name = name;
        out[i].is_method = is_method;
    }
    return 0;
}

/* Checks a sample against what the exchange table says of it: 1 the same, 0 not. */
static int
sample_key(const HbDLPackExchangeAPI *api, PyObject *sample, uint8_t *code, uint8_t *bits)
{
    HbDLTensor dl;
    if (api->dltensor_from_py_object_no_sync(sample, &dl) != 0) {
        PyErr_Clear();
        return 0;
    }
    if (dl.dtype.lanes != 1) {
        return 0;
    }
    *code = dl.dtype.code;
    *bits = dl.dtype.bits;
    return 1;
}

/* register_import(type, decline_attrs, decline_methods, complex_methods, pinned_method,
 *                 dtype_attr, samples, pinned_device, gpu_type, max_rank, probe, hold)
 *   -> None when registered, else why not (a str)
 *
 * samples: [(native dtype, sample object or None, hb.DType or None)] for every native
 * dtype; probe: (object, its strides tuple), a tensor whose size-1 dimension has a
 * stride that is not 1 (the table must report it as it is); hold: None, or
 * (storage method, check method, callable) for host memory (see Handler). */
static PyObject *
register_import(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyTypeObject *tp;
    PyObject *decline_attrs, *decline_methods, *complex_methods, *pinned_method, *dtype_attr;
    PyObject *samples, *pinned_device, *probe, *hold;
    int gpu_type, max_rank;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OUO!OiiO!O:register_import", &PyType_Type, &tp,
                          &PyTuple_Type, &decline_attrs, &PyTuple_Type, &decline_methods,
                          &PyTuple_Type, &complex_methods, &pinned_method, &dtype_attr,
                          &PyList_Type, &samples, &pinned_device, &gpu_type, &max_rank,
                          &PyTuple_Type, &probe, &hold)) {
        return NULL;
    }
    PyObject *hold_method = NULL, *hold_check = NULL, *hold_fn = NULL;
    if (hold != Py_None && !PyArg_ParseTuple(hold, "UUO:register_import hold", &hold_method,
                                             &hold_check, &hold_fn)) {
        return NULL;
    }
    if (!hb_world_ready()) {
        return PyUnicode_FromString("exchange_setup() was not called");
    }
    if (handler_for(tp) != NULL) {
        Py_RETURN_NONE;
    }
    if (n_handlers == MAX_HANDLERS) {
        return PyUnicode_FromString("too many registered types");
    }
    const HbDLPackExchangeAPI *api = read_table(tp);
    if (api == NULL || api->dltensor_from_py_object_no_sync == NULL) {
        return PyUnicode_FromString("the type publishes no usable DLPack 1.x exchange table");
    }
    if (PyList_GET_SIZE(samples) > MAX_NATIVES || max_rank < 0 || max_rank > HB_MAX_RANK) {
        return PyUnicode_FromString("too many native dtypes, or a rank limit beyond 64");
    }
    Handler *h = PyMem_Calloc(1, sizeof(Handler));
    if (h == NULL) {
        return PyErr_NoMemory();
    }
    const char *why = NULL;
    /* attributes first, then methods, in one list */
    int n_attrs, n_methods;
    if (PyTuple_GET_SIZE(decline_attrs) + PyTuple_GET_SIZE(decline_methods) > MAX_GUARDS) {
        why = "more than 4 attributes and methods to ask";
        goto refuse;
    }
    if (guards_from(h->decline, &n_attrs, decline_attrs, 0) < 0
            || guards_from(h->decline + n_attrs, &n_methods, decline_methods, 1) < 0) {
        goto error;
    }
    h->n_decline = n_attrs + n_methods;
    if (guards_from(h->complex_decline, &h->n_complex, complex_methods, 1) < 0) {
        goto error;
    }
    if (pinned_method != Py_None) {
        int one;
        PyObject *t = PyTuple_Pack(1, pinned_method);
        if (t == NULL || guards_from(&h->pinned, &one, t, 1) < 0) {
            Py_XDECREF(t);
            goto error;
        }
        Py_DECREF(t);
        h->has_pinned = 1;
    }
    if (hold_method != NULL) {
        int one;
        PyObject *t = PyTuple_Pack(1, hold_method);
        if (t == NULL || guards_from(&h->hold_storage, &one, t, 1) < 0) {
            Py_XDECREF(t);
            goto error;
        }
        Py_DECREF(t);
        Py_INCREF(hold_check);
        PyUnicode_InternInPlace(&hold_check);
        h->hold_check = hold_check;
        h->hold_fn = Py_NewRef(hold_fn);
        h->has_hold = 1;
    }
    Py_INCREF(dtype_attr);
    PyUnicode_InternInPlace(&dtype_attr);
    h->dtype_attr.name = dtype_attr;
    h->type = tp;
    h->api = api;
    /* Element types: each sample's code and bits; a code that two native dtypes share
     * (torch.int1 ... int7 export as int8) is decided by the native dtype. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(samples); i++) {
        PyObject *native, *sample, *dtype;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(samples, i), "OOO:register_import samples",
                              &native, &sample, &dtype)) {
            goto error;
        }
        const HbDType *hd = dtype == Py_None ? NULL : hb_dtype_entry(dtype);
        h->natives[h->n_natives] = Py_NewRef(native);
        h->native_dtypes[h->n_natives++] = hd;
        uint8_t code, bits;
        if (sample == Py_None || Py_TYPE(sample) != tp || !sample_key(api, sample, &code, &bits)) {
            if (hd != NULL) {
                h->always_ask = 1; /* a type we map, not seen through the table */
            }
            continue;
        }
        if (hd != NULL && (hd->code != code || hd->bits != bits)) {
            why = "a native dtype exports another DLPack code than its hb.DType's";
            goto refuse;
        }
        int k = 0;
        for (; k < h->n_keys; k++) {
            if (h->keys[k].code == code && h->keys[k].bits == bits) {
                break;
            }
        }
        if (k == h->n_keys) {
            h->keys[k].code = code;
            h->keys[k].bits = bits;
            h->keys[k].dtype = hd;
            h->n_keys++;
        }
        else {
            h->keys[k].ambiguous = 1;
        }
    }
    /* The probe: strides exactly as the object reports them (some producers rewrite
     * those of size-1 dimensions, and the hb.Tensor must have the object's own). */
    PyObject *probe_obj, *probe_strides;
    HbDLTensor dl;
    if (!PyArg_ParseTuple(probe, "OO!:register_import probe", &probe_obj, &PyTuple_Type,
                          &probe_strides)) {
        goto error;
    }
    if (api->dltensor_from_py_object_no_sync(probe_obj, &dl) != 0) {
        PyErr_Clear();
        why = "the probe tensor does not export";
        goto refuse;
    }
    if (dl.ndim != PyTuple_GET_SIZE(probe_strides) || dl.strides == NULL) {
        why = "the probe tensor exports another rank";
        goto refuse;
    }
    for (int i = 0; i < dl.ndim; i++) {
        long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(probe_strides, i));
        if (s == -1 && PyErr_Occurred()) {
            goto error;
        }
        if (dl.strides[i] != s) {
            why = "the exchange table rewrites strides";
            goto refuse;
        }
    }
    memset(h->key_at, -1, sizeof(h->key_at));
    for (int k = 0; k < h->n_keys; k++) {
        int b = bits_index(h->keys[k].bits);
        if (h->keys[k].code < 32 && b >= 0) {
            h->key_at[h->keys[k].code][b] = (int8_t)k;
        }
    }
    h->pinned_device = Py_NewRef(pinned_device);
    h->gpu_type = gpu_type;
    h->max_rank = max_rank;
    Py_INCREF(tp);
    handler_resolve(h);
    handlers[n_handlers++] = h;
    Py_RETURN_NONE;
refuse:
    /* The handler's references are few and the refusal is once per process: leak them
     * rather than free a half-built handler. */
    return PyUnicode_FromString(why);
error:
    return NULL;
}

/* ------------------------------------------------------------------ ImportFront */

#ifndef Py_TPFLAGS_HAVE_VECTORCALL
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL
#endif

typedef struct {
    PyObject_HEAD
    PyObject *general;
    PyObject *dict;
    vectorcallfunc vectorcall;
    int positional_copy; /* general(obj, copy) also takes copy by position */
} ImportFront;

static inline int
no_copy(PyObject *v)
{
    return v == Py_None || v == Py_False;
}

static PyObject *
front_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ImportFront *self = (ImportFront *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int plain = 0;
    if (nargs == 1 && nkw == 0) {
        plain = 1;
    }
    else if (nargs == 1 && nkw == 1) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
        plain = no_copy(args[1]) && PyUnicode_Check(name)
                && PyUnicode_CompareWithASCIIString(name, "copy") == 0;
    }
    else if (nargs == 2 && nkw == 0 && self->positional_copy) {
        plain = no_copy(args[1]);
    }
    if (plain && n_handlers > 0) {
        Handler *h = handler_for(Py_TYPE(args[0]));
        if (h != NULL) {
            PyObject *t = import_registered(h, args[0]);
            if (t != NULL || PyErr_Occurred()) {
                return t;
            }
        }
    }
    return PyObject_Vectorcall(self->general, args, nargsf, kwnames);
}

static PyObject *
front_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *general;
    int positional_copy = 0;
    static char *kwlist[] = {"general", "positional_copy", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p:ImportFront", kwlist, &general,
                                     &positional_copy)) {
        return NULL;
    }
    if (!PyCallable_Check(general)) {
        PyErr_SetString(PyExc_TypeError, "ImportFront: general must be callable");
        return NULL;
    }
    ImportFront *self = (ImportFront *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->general = Py_NewRef(general);
    self->dict = NULL;
    self->positional_copy = positional_copy;
    self->vectorcall = front_vectorcall;
    return (PyObject *)self;
}

static int
front_traverse(ImportFront *self, visitproc visit, void *arg)
{
    Py_VISIT(self->general);
    Py_VISIT(self->dict);
    return 0;
}

static int
front_clear(ImportFront *self)
{
    Py_CLEAR(self->general);
    Py_CLEAR(self->dict);
    return 0;
}

static void
front_dealloc(ImportFront *self)
{
    PyObject_GC_UnTrack(self);
    front_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
front_get_general(ImportFront *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->general);
}

static PyObject *
front_repr(ImportFront *self)
{
    return PyUnicode_FromFormat("<compiled import front of %R>", self->general);
}

static PyGetSetDef front_getset[] = {
    {"general", (getter)front_get_general, NULL, "the Python function", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}
};

static PyTypeObject ImportFrontType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hurray_bridge._speedups.ImportFront",
    .tp_basicsize = sizeof(ImportFront),
    .tp_dealloc = (destructor)front_dealloc,
    .tp_vectorcall_offset = offsetof(ImportFront, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "ImportFront(general, positional_copy=False): registered types imported in C "
              "in front of general(obj, copy=None).",
    .tp_traverse = (traverseproc)front_traverse,
    .tp_clear = (inquiry)front_clear,
    .tp_getset = front_getset,
    .tp_repr = (reprfunc)front_repr,
    .tp_dictoffset = offsetof(ImportFront, dict),
    .tp_new = front_new,
};

/* -------------------------------------------------------------- NumPy arrays */

/* NumPy's C API without its headers: the function table every extension compiled
 * against NumPy reads (numpy._core._multiarray_umath._ARRAY_API), at the indices
 * NumPy keeps stable across releases. The ABI version is checked, and numpy_entry()
 * builds one array through it and compares it with what Python sees before use. */
#define NPY_ABI_1 0x01000009u
#define NPY_ABI_2 0x02000000u
#define NPY_IDX_GET_ABI 0
#define NPY_IDX_ARRAY_TYPE 2
#define NPY_IDX_NEW_FROM_DESCR 94
#define NPY_IDX_SET_BASE_OBJECT 282
#define NPY_ARRAY_WRITEABLE_FLAG 0x0400

typedef PyObject *(*NpyNewFromDescr)(PyTypeObject *subtype, PyObject *descr, int nd,
                                     const Py_ssize_t *dims, const Py_ssize_t *strides,
                                     void *data, int flags, PyObject *obj);
typedef int (*NpySetBaseObject)(PyObject *array, PyObject *base);

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    Handler *handler;       /* NULL: the entry of hb.Tensor itself */
    PyObject *fallback;     /* hb.Tensor's: what answers the tensors it declines */
    PyTypeObject *ndarray;
    NpyNewFromDescr new_from_descr;
    NpySetBaseObject set_base;
    PyObject *descrs[HB_MAX_DTYPES]; /* by hb_world.dtypes index (NULL: not taken) */
} NumpyEntry;

static PyObject *
numpy_array(NumpyEntry *e, PyObject *descr, int ndim, const int64_t *shape,
            const int64_t *strides, uint64_t data, PyObject *base)
{
    Py_ssize_t dims[HB_MAX_RANK], steps[HB_MAX_RANK];
    for (int i = 0; i < ndim; i++) {
        dims[i] = (Py_ssize_t)shape[i];
        if (strides != NULL) {
            steps[i] = (Py_ssize_t)strides[i];
        }
    }
    Py_INCREF(descr); /* stolen */
    PyObject *arr = e->new_from_descr(e->ndarray, descr, ndim, dims,
                                      strides != NULL ? steps : NULL, (void *)(uintptr_t)data,
                                      NPY_ARRAY_WRITEABLE_FLAG, NULL);
    if (arr == NULL) {
        return NULL;
    }
    Py_INCREF(base); /* stolen */
    if (e->set_base(arr, base) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *s_layout, *s_quantization;

/* _host.tensor_view(t) for the tensors whose view is one array over their read-only
 * memory: an hb.Tensor (exact type) on the CPU, compact, dense, holding elements of a
 * whole-byte type NumPy has, read-only (a writable one's view stays Python's, whose
 * base is a writable buffer). The array's base is t itself, which keeps the memory
 * and its owner alive (write_protected follows t's owner as it follows the Python
 * view's holder), and which lends no writable buffer: the array cannot be made
 * writable. NotImplemented for every other tensor: the Python view decides. */
static PyObject *
tensor_numpy(NumpyEntry *e, PyObject *t)
{
    if (Py_TYPE(t) != hb_world.tensor_type || HB_SLOT(t, HB_S_STRIDES) != Py_None
            || HB_SLOT(t, HB_S_READONLY) != Py_True || HB_SLOT(t, HB_S_DEVICE) != hb_world.cpu) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *desc = HB_SLOT(t, HB_S_DESC), *shape = HB_SLOT(t, HB_S_SHAPE);
    const HbDType *dtype = hb_dtype_entry(HB_SLOT(t, HB_S_DTYPE));
    PyObject *descr = dtype != NULL ? e->descrs[dtype - hb_world.dtypes] : NULL;
    /* a slot may be unset (deleted): the Python view then raises its AttributeError */
    if (descr == NULL || desc == NULL || shape == NULL || !PyTuple_CheckExact(shape)
            || PyTuple_GET_SIZE(shape) > HB_MAX_RANK) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (desc != Py_None) { /* t.is_dense: a row-major or strided layout, not quantized */
        PyObject *layout = PyObject_GetAttr(desc, s_layout);
        PyObject *quant = layout ? PyObject_GetAttr(desc, s_quantization) : NULL;
        int dense = quant != NULL && quant == Py_None
                    && (layout == hb_world.row_major || layout == hb_world.strided);
        Py_XDECREF(layout);
        Py_XDECREF(quant);
        if (!dense) {
            hb_swallow();
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    int ndim = (int)PyTuple_GET_SIZE(shape);
    int64_t dims[HB_MAX_RANK];
    for (int i = 0; i < ndim; i++) {
        dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (dims[i] == -1 && PyErr_Occurred()) {
            hb_swallow();
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    long long nbytes = PyLong_AsLongLong(HB_SLOT(t, HB_S_NBYTES));
    unsigned long long data = PyLong_AsUnsignedLongLong(HB_SLOT(t, HB_S_DATA));
    if (PyErr_Occurred()) {
        hb_swallow();
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (nbytes <= 0 || data == 0) { /* no elements: the Python view declines them too */
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_ssize_t np_dims[HB_MAX_RANK];
    for (int i = 0; i < ndim; i++) {
        np_dims[i] = (Py_ssize_t)dims[i];
    }
    Py_INCREF(descr); /* stolen */
    PyObject *arr = e->new_from_descr(e->ndarray, descr, ndim, np_dims, NULL,
                                      (void *)(uintptr_t)data, 0, NULL);
    if (arr == NULL) {
        return NULL;
    }
    Py_INCREF(t); /* stolen */
    if (e->set_base(arr, t) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* entry(x) -> a NumPy array over x's memory, or NotImplemented (the shortcut front then
 * takes the full path). Takes what Tensor.numpy() takes and the full path would give
 * the same for: CPU memory with elements, the element types NumPy has (descrs), no
 * autograd, conj or neg bit. Compact tensors get NumPy's compact strides. */
static PyObject *
numpy_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    NumpyEntry *e = (NumpyEntry *)callable;
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *obj = args[0];
    if (e->handler == NULL) {
        PyObject *arr = tensor_numpy(e, obj);
        if (arr != Py_NotImplemented || e->fallback == NULL) {
            return arr;
        }
        Py_DECREF(arr);
        return PyObject_CallOneArg(e->fallback, obj);
    }
    if (Py_TYPE(obj) != e->handler->type) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    Read r;
    int got = read_registered(e->handler, obj, &r);
    if (got < 0) {
        return NULL;
    }
    if (got == 0 || r.empty || r.dl.device.device_type != HB_KDL_CPU) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *descr = e->descrs[r.dtype - hb_world.dtypes];
    if (descr == NULL) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    int64_t bytes[HB_MAX_RANK];
    int64_t isz = r.dtype->bits >> 3;
    if (!r.compact) {
        for (int i = 0; i < r.dl.ndim; i++) {
            if (__builtin_mul_overflow(r.strides[i], isz, &bytes[i])) {
                Py_RETURN_NOTIMPLEMENTED;
            }
        }
    }
    PyObject *base = hold_host(e->handler, obj, r.data);
    if (base == NULL) {
        if (declined() < 0) {
            return NULL;
        }
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *arr = numpy_array(e, descr, r.dl.ndim, r.shape, r.compact ? NULL : bytes, r.data,
                                base);
    Py_DECREF(base);
    if (arr == NULL) {
        if (declined() < 0) {
            return NULL;
        }
        Py_RETURN_NOTIMPLEMENTED;
    }
    return arr;
}

static void
numpy_entry_dealloc(NumpyEntry *self)
{
    for (int i = 0; i < HB_MAX_DTYPES; i++) {
        Py_XDECREF(self->descrs[i]);
    }
    Py_XDECREF(self->ndarray);
    Py_XDECREF(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject NumpyEntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hurray_bridge._speedups.NumpyEntry",
    .tp_basicsize = sizeof(NumpyEntry),
    .tp_dealloc = (destructor)numpy_entry_dealloc,
    .tp_vectorcall_offset = offsetof(NumpyEntry, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A registered type's object as a NumPy array over its memory (NotImplemented "
              "when it would not be the full path's answer).",
};

/* numpy_entry(type, array_api_capsule, ndarray, descrs) -> NumpyEntry, or None when the
 * type is not registered or NumPy's table does not pass the check. descrs: {hb.DType:
 * numpy dtype} of the element types to take. For hb.Tensor itself (_host.tensor_view),
 * fallback(t) answers the tensors it declines. */
static PyObject *
numpy_entry(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyTypeObject *tp, *ndarray;
    PyObject *capsule, *descrs, *fallback = Py_None;
    if (!PyArg_ParseTuple(args, "O!OO!O!|O:numpy_entry", &PyType_Type, &tp, &capsule,
                          &PyType_Type, &ndarray, &PyDict_Type, &descrs, &fallback)) {
        return NULL;
    }
    /* hb.Tensor itself takes no handler: its slots are read directly */
    int for_tensor = hb_world_ready() && tp == hb_world.tensor_type;
    Handler *h = for_tensor ? NULL : handler_for(tp);
    if ((h == NULL && !for_tensor) || !PyCapsule_CheckExact(capsule)) {
        Py_RETURN_NONE;
    }
    if (s_layout == NULL && ((s_layout = PyUnicode_InternFromString("layout")) == NULL
            || (s_quantization = PyUnicode_InternFromString("quantization")) == NULL)) {
        return NULL;
    }
    void **api = PyCapsule_GetPointer(capsule, PyCapsule_GetName(capsule));
    if (api == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    unsigned abi = ((unsigned (*)(void))api[NPY_IDX_GET_ABI])();
    if ((abi != NPY_ABI_1 && abi != NPY_ABI_2) || (PyTypeObject *)api[NPY_IDX_ARRAY_TYPE] != ndarray) {
        Py_RETURN_NONE;
    }
    NumpyEntry *e = PyObject_New(NumpyEntry, &NumpyEntryType);
    if (e == NULL) {
        return NULL;
    }
    memset(e->descrs, 0, sizeof(e->descrs));
    e->vectorcall = numpy_vectorcall;
    e->handler = h;
    e->fallback = fallback == Py_None ? NULL : Py_NewRef(fallback);
    e->ndarray = (PyTypeObject *)Py_NewRef(ndarray);
    e->new_from_descr = (NpyNewFromDescr)api[NPY_IDX_NEW_FROM_DESCR];
    e->set_base = (NpySetBaseObject)api[NPY_IDX_SET_BASE_OBJECT];
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(descrs, &pos, &key, &value)) {
        const HbDType *d = hb_dtype_entry(key);
        if (d != NULL && d->bits >= 8) {
            Py_XSETREF(e->descrs[d - hb_world.dtypes], Py_NewRef(value));
        }
    }
    /* The check: a 2x3 array over a static buffer, with strides, read back in Python. */
    static double probe[6];
    const HbDType *f64 = NULL;
    PyObject *f64_descr = NULL;
    for (int i = 0; i < HB_MAX_DTYPES && f64 == NULL; i++) {
        if (e->descrs[i] != NULL && hb_world.dtypes[i].bits == 64) {
            f64 = &hb_world.dtypes[i];
            f64_descr = e->descrs[i];
        }
    }
    int ok = 0;
    if (f64 != NULL) {
        int64_t shape[2] = {2, 3}, steps[2] = {8, 16};
        PyObject *arr = numpy_array(e, f64_descr, 2, shape, steps, (uint64_t)(uintptr_t)probe,
                                    (PyObject *)e);
        if (arr != NULL) {
            PyObject *iface = PyObject_GetAttrString(arr, "__array_interface__");
            PyObject *got = iface == NULL ? NULL : Py_BuildValue(
                "(OOO)", PyDict_GetItemString(iface, "shape"),
                PyDict_GetItemString(iface, "strides"), PyDict_GetItemString(iface, "data"));
            PyObject *want = Py_BuildValue("((ii)(ii)(KO))", 2, 3, 8, 16,
                                           (unsigned long long)(uintptr_t)probe, Py_False);
            PyObject *base = PyObject_GetAttrString(arr, "base");
            PyObject *dt = PyObject_GetAttrString(arr, "dtype");
            ok = got != NULL && want != NULL && PyObject_RichCompareBool(got, want, Py_EQ) == 1
                 && base == (PyObject *)e && dt == f64_descr;
            Py_XDECREF(iface);
            Py_XDECREF(got);
            Py_XDECREF(want);
            Py_XDECREF(base);
            Py_XDECREF(dt);
            Py_DECREF(arr);
        }
        PyErr_Clear();
    }
    if (!ok) {
        Py_DECREF(e);
        Py_RETURN_NONE;
    }
    return (PyObject *)e;
}

/* -------------------------------------------------------------------- module */

static PyMethodDef import_functions[] = {
    {"import_exchange", import_exchange, METH_O,
     "import_exchange(obj) -> hb.Tensor through type(obj)'s DLPack C exchange API, or None"},
    {"register_import", register_import, METH_VARARGS,
     "register_import(type, ...) -> None when registered, else why not"},
    {"numpy_entry", numpy_entry, METH_VARARGS,
     "numpy_entry(type, array_api, ndarray, descrs, fallback=None) -> NumpyEntry or None"},
    {NULL}
};

int
hb_add_import(PyObject *module)
{
    PyTypeObject *types[] = {&ManagedTensorType, &ImportFrontType, &NumpyEntryType};
    const char *names[] = {"ManagedTensor", "ImportFront", "NumpyEntry"};
    for (int i = 0; i < 3; i++) {
        if (PyType_Ready(types[i]) < 0) {
            return -1;
        }
        Py_INCREF(types[i]);
        if (PyModule_AddObject(module, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            return -1;
        }
    }
    return PyModule_AddFunctions(module, import_functions);
}
