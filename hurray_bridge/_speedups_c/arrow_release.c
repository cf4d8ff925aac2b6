/* The release callbacks of hurray_bridge._arrow_c's exports (the Arrow C Data Interface's
 * ArrowSchema and ArrowArray; an ArrowDeviceArray starts with its ArrowArray).
 *
 * A consumer calls `release` on any thread and at any time, late ones included: a C or
 * C++ library that keeps an imported array in a static releases it from its destructor,
 * after Py_Finalize. The ctypes callbacks asked for the GIL before any of our code ran,
 * and that crashed the process there. These go through hb_release (deleters.c), the
 * exit guard our DLPack deleters use: at once with the GIL, taken for it otherwise,
 * and not at all once the process is exiting (the export is then left to the process).
 * The Python release walk (_arrow_c._release, bound to each struct's offsets) does the
 * work, with any exception in flight set aside here; the struct is marked released in
 * every case, as the interface requires, so a consumer that looks at `release`
 * afterwards sees NULL even when nothing ran.
 */
#include "speedups.h"

/* The two structs as the C Data Interface fixes them (the ABI is stable); only
 * `release` is read here. _arrow_c.py holds the same layouts for ctypes. */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static PyObject *release_schema_fn = NULL;  /* _arrow_c._release, at a schema's offsets */
static PyObject *release_array_fn = NULL;   /* _arrow_c._release, at an array's offsets */

struct call {
    PyObject *fn;
    void *p;
};

/* With the GIL held. An exception in flight is set aside and put back; one raised by
 * the release itself is reported, never raised into the consumer's frames. */
static void
call_release(void *arg)
{
    struct call *c = arg;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallFunction(c->fn, "K", (unsigned long long)(uintptr_t)c->p);
    if (r == NULL) {
        PyErr_WriteUnraisable(c->fn);
    }
    else {
        Py_DECREF(r);
    }
    PyErr_Restore(type, value, tb);
}

static void
release_schema(struct ArrowSchema *s)
{
    if (s == NULL || s->release == NULL) {
        return;
    }
    struct call c = {release_schema_fn, s};
    hb_release(call_release, &c);
    s->release = NULL;
}

static void
release_array(struct ArrowArray *a)
{
    if (a == NULL || a->release == NULL) {
        return;
    }
    struct call c = {release_array_fn, a};
    hb_release(call_release, &c);
    a->release = NULL;
}

/* arrow_release_hooks(release_schema, release_array) -> (schema release address,
 * array release address). Once per process: the callbacks must outlive every export. */
PyObject *
hb_arrow_release_hooks(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *schema_fn, *array_fn;
    if (!PyArg_ParseTuple(args, "OO:arrow_release_hooks", &schema_fn, &array_fn)) {
        return NULL;
    }
    if (!PyCallable_Check(schema_fn) || !PyCallable_Check(array_fn)) {
        PyErr_SetString(PyExc_TypeError, "arrow_release_hooks: both must be callable");
        return NULL;
    }
    if (release_schema_fn != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "arrow_release_hooks: already installed");
        return NULL;
    }
    Py_INCREF(schema_fn);
    Py_INCREF(array_fn);
    release_schema_fn = schema_fn;
    release_array_fn = array_fn;
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)release_schema),
                         PyLong_FromVoidPtr((void *)release_array));
}
