/* Holds: how a compiled export keeps an hb.Tensor's memory alive without holding a
 * Python reference to it, so that its deleter needs no GIL while the tensor lives.
 *
 * torch releases an imported tensor with the GIL dropped (THPVariable_clear). An
 * export that held a reference to the hb.Tensor had to take the GIL back there only
 * to drop it: ~410 of the deleter's ~510 instructions, and most of the export's
 * distance to apache-tvm-ffi, whose deleter is a C++ reference count. A hold is that
 * count for an hb.Tensor: one per exported tensor, counting the live exports plus one
 * while the tensor is alive. An export's release only decrements it.
 *
 * The tensor may die first. Its dealloc (tensor.c) asks hb_hold_tensor_dies(): while
 * exports are alive, the tensor is resurrected with one reference that the hold owns,
 * before anything in it is cleared (weak references included), and the last export's
 * release drops that reference with the GIL -- so the tensor and everything it holds
 * live exactly as long as before, when each export held a reference.
 *
 * The collector cannot see a hold's count: it would find a tensor that only garbage
 * refers to unreachable, clear its weak references (running their callbacks) and its
 * cycle, under the export. So a held tensor is untracked while it has live exports --
 * the collector never looks at it, and what it refers to counts as referenced from
 * outside -- and tracked again at the start of the next collection after they are gone
 * (a gc.callbacks entry): a cycle through it is then collected as before, one
 * collection later.
 *
 * The table from tensor to hold is used under the GIL only; a hold's count from any
 * thread. Only for the one type whose dealloc is tensor.c's (hb_holds_setup), in
 * builds whose reference counts a resurrection cannot confuse.
 */
#include "speedups.h"

#include <stdatomic.h>
#include <stdlib.h>

#if PY_VERSION_HEX < 0x030D0000 && !defined(Py_REF_DEBUG) && !defined(Py_TRACE_REFS)
#define HB_HOLDS 1
#else
#define HB_HOLDS 0
#endif

struct HbHold {
    atomic_long count; /* live exports, + 1 while the tensor is alive */
    PyObject *tensor;  /* the key; owned (one reference) once it was resurrected */
    int untracked;     /* we untracked the tensor: track it again once unexported */
    HbHold *prev, *next; /* in `orphans` once it was */
};

/* The holds of resurrected tensors (out of the table), for hb_held_exports(). */
static HbHold orphans = {0, NULL, 0, &orphans, &orphans};

/* The type holds serve: the one whose dealloc tensor.c installed (a second Tensor
 * class, say after a reload, keeps CPython's dealloc and gets references). */
static PyTypeObject *held_type = NULL;

/* Open addressing with linear probing, deletion by backward shift (no tombstones). */
typedef struct {
    PyObject *key;
    HbHold *hold;
} Entry;

static Entry *table = NULL;
static size_t capacity = 0; /* a power of two, or 0 */
static size_t used = 0;

static size_t
home(PyObject *key, size_t cap)
{
    uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(h >> 32) & (cap - 1);
}

static Entry *
find(PyObject *key)
{
    if (used == 0) {
        return NULL;
    }
    for (size_t i = home(key, capacity);; i = (i + 1) & (capacity - 1)) {
        if (table[i].key == key) {
            return &table[i];
        }
        if (table[i].key == NULL) {
            return NULL;
        }
    }
}

static int
grow(void)
{
    size_t cap = capacity ? capacity * 2 : 64;
    Entry *t = calloc(cap, sizeof(Entry));
    if (t == NULL) {
        return -1;
    }
    for (size_t j = 0; j < capacity; j++) {
        if (table[j].key != NULL) {
            size_t i = home(table[j].key, cap);
            while (t[i].key != NULL) {
                i = (i + 1) & (cap - 1);
            }
            t[i] = table[j];
        }
    }
    free(table);
    table = t;
    capacity = cap;
    return 0;
}

static void
remove_entry(Entry *gone)
{
    size_t i = (size_t)(gone - table);
    table[i].key = NULL;
    table[i].hold = NULL;
    used--;
    /* Shift back each later entry of the run that the hole now separates from home. */
    for (size_t j = (i + 1) & (capacity - 1); table[j].key != NULL; j = (j + 1) & (capacity - 1)) {
        size_t h = home(table[j].key, capacity);
        int between = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!between) {
            table[i] = table[j];
            table[j].key = NULL;
            table[j].hold = NULL;
            i = j;
        }
    }
}

/* Holds are made and freed with the GIL held (the last release takes it first), so a
 * few are kept for reuse without a lock. */
#define KEPT_HOLDS 16
static HbHold *kept[KEPT_HOLDS];
static int n_kept = 0;

static void
free_hold(HbHold *hold)
{
    if (n_kept < KEPT_HOLDS) {
        kept[n_kept++] = hold;
    }
    else {
        free(hold);
    }
}

HbHold *
hb_hold_export(PyObject *tensor)
{
#if HB_HOLDS
    if (held_type == NULL || !Py_IS_TYPE(tensor, held_type)) {
        return NULL;
    }
    Entry *e = find(tensor);
    /* A tensor that only the export's caller refers to -- a temporary, as in
     * torch.from_dlpack(hb.asarray(x)), where torch's call and its argument make 2, or
     * np.from_dlpack's 1 -- dies before its export: its last release needs the GIL
     * anyway, and a hold would only add the resurrection to it (~240 instructions per
     * round trip). It gets a reference. A named tensor (3 in torch's call) gets a hold.
     * Either is correct; this only picks the cheaper. */
    if (e == NULL && Py_REFCNT(tensor) <= 2) {
        return NULL;
    }
    if (e != NULL) {
        HbHold *hold = e->hold;
        atomic_fetch_add(&hold->count, 1);
        /* Whatever the flag says: CPython may have tracked it again since (a subclass's
         * __del__ resurrecting it is tracked to run). */
        if (PyObject_GC_IsTracked(tensor)) {
            PyObject_GC_UnTrack(tensor);
            hold->untracked = 1;
        }
        return hold;
    }
    if ((used + 1) * 2 > capacity && grow() < 0) {
        return NULL; /* the caller holds a reference instead */
    }
    HbHold *hold = n_kept > 0 ? kept[--n_kept] : malloc(sizeof(HbHold));
    if (hold == NULL) {
        return NULL;
    }
    atomic_init(&hold->count, 2); /* the tensor and this export */
    hold->tensor = tensor;
    hold->untracked = PyObject_GC_IsTracked(tensor);
    if (hold->untracked) {
        PyObject_GC_UnTrack(tensor);
    }
    size_t i = home(tensor, capacity);
    while (table[i].key != NULL) {
        i = (i + 1) & (capacity - 1);
    }
    table[i].key = tensor;
    table[i].hold = hold;
    used++;
    return hold;
#else
    (void)tensor;
    return NULL;
#endif
}

int
hb_hold_release(HbHold *hold)
{
    return atomic_fetch_sub(&hold->count, 1) == 1;
}

void
hb_hold_end(HbHold *hold)
{
    PyObject *tensor = hold->tensor; /* it died while exported, and was kept for them */
    hold->prev->next = hold->next;
    hold->next->prev = hold->prev;
    free_hold(hold);
    hb_decref_aside(tensor);
}

int
hb_hold_tensor_dies(PyObject *self)
{
    Entry *e = find(self);
    if (e == NULL) {
        return 0;
    }
    HbHold *hold = e->hold;
    remove_entry(e);
    /* An export released on another thread meanwhile only decrements the count; the
     * last one needs the GIL, which this thread holds until the tensor is resurrected. */
    if (atomic_fetch_sub(&hold->count, 1) == 1) {
        free_hold(hold);
        return 0;
    }
    /* Untracked as it was while exported: the collector must not find it (above). */
    Py_SET_REFCNT(self, 1); /* the hold's, which the last export's hb_hold_end drops */
    hold->next = &orphans;
    hold->prev = orphans.prev;
    orphans.prev->next = hold;
    orphans.prev = hold;
    PyObject_GC_Track(self);
    return 1;
}

int
hb_hold_has_exports(PyObject *self)
{
    Entry *e = find(self);
    return e != NULL && atomic_load(&e->hold->count) > 1;
}

/* gc.callbacks entry: at the start of a collection, held tensors whose exports are all
 * gone are tracked again (a count of 1 only grows under the GIL, which this holds). */
static PyObject *
gc_callback(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *phase, *info;
    if (!PyArg_UnpackTuple(args, "gc_callback", 2, 2, &phase, &info)) {
        return NULL;
    }
    if (PyUnicode_Check(phase) && PyUnicode_CompareWithASCIIString(phase, "start") == 0) {
        for (size_t i = 0; i < capacity; i++) {
            HbHold *hold = table[i].hold;
            if (table[i].key != NULL && hold->untracked && atomic_load(&hold->count) == 1) {
                hold->untracked = 0;
                if (!PyObject_GC_IsTracked(table[i].key)) { /* tracking twice aborts */
                    PyObject_GC_Track(table[i].key);
                }
            }
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef gc_callback_def = {
    "_hurray_holds", gc_callback, METH_VARARGS,
    "hurray_bridge: tracks unexported tensors again before a collection (holds.c)"};

int
hb_holds_setup(PyTypeObject *type)
{
#if HB_HOLDS
    if (held_type != NULL) {
        return -1;
    }
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *callbacks = gc ? PyObject_GetAttrString(gc, "callbacks") : NULL;
    PyObject *fn = callbacks ? PyCFunction_New(&gc_callback_def, NULL) : NULL;
    int ok = fn != NULL && PyList_Check(callbacks) && PyList_Append(callbacks, fn) == 0;
    Py_XDECREF(fn);
    Py_XDECREF(callbacks);
    Py_XDECREF(gc);
    if (!ok) {
        return -1;
    }
    held_type = (PyTypeObject *)Py_NewRef(type);
    return 0;
#else
    (void)type;
    return -1;
#endif
}

long
hb_held_exports(void)
{
    long n = 0;
    for (size_t i = 0; i < capacity; i++) {
        if (table[i].key != NULL) {
            n += atomic_load(&table[i].hold->count) - 1;
        }
    }
    for (HbHold *h = orphans.next; h != &orphans; h = h->next) {
        n += atomic_load(&h->count);
    }
    return n;
}

PyObject *
hb_export_holds_fn(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(nO)", (Py_ssize_t)used, held_type != NULL ? Py_True : Py_False);
}
