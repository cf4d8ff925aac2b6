/* The descriptor decoder's dense fast path: wire._decode_dense, rule for rule, with the
 * rules themselves in the C library (check() below).
 *
 * It reads only simple descriptors (dense row-major or strided, static, one DATA
 * buffer, no quantization or shard section) and returns None for anything else or
 * anything it would not accept: the general decoder then decides and names the
 * defect. tests/hurray_bridge/test_perf_paths.py compares it with the Python version and with the
 * general decoder on valid, mutated and random bytes. Every read is bounds-checked
 * against the buffer length before it happens; every product is overflow-checked.
 */
#include "speedups.h"

#include "hurray.h" /* the C library's descriptor decoder (c/src/descriptor.c) */
#include <stdint.h>
#include <string.h>

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
 * exactly what the general Python decoder accepts (tests/c/test_c_library.py compares them
 * field for field); of that, the fast path takes the dense descriptors -- row-major or
 * strided, static, one DATA buffer, no quantization or shard section. 1: accepted (fills
 * *out), 0: not. Reads at most MAX_DENSE bytes: a descriptor the fast path takes is no
 * longer, and a longer one fails here on total_size. */
static int
check(const unsigned char *b, Py_ssize_t n, uint32_t *rank_out, int *strided_out,
      int *tag_out, int *padded_out, uint64_t *off_out, uint64_t *nbytes_out, uint64_t *total_out)
{
    hry_descriptor d;
    d.struct_size = (uint32_t)sizeof d; /* not hry_descriptor_init: no 2.6 KB memset per call,
                                           the decoder writes every field read below */
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

PyObject *
hb_decode_dense(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
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

PyObject *
hb_dense_decoder_setup(PyObject *Py_UNUSED(module), PyObject *args)
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
