/* A Hurray file's entry table of plain dense tensors, read into hb.Tensors over its map.
 *
 * hurray_tensors() is the mapped-file path of hb.load (without verify) for a table
 * whose every entry is a dense row-major tensor with one DATA buffer: the checks of
 * hurray_bridge/files/format.py's parse_index (each entry's fixed fields, its name,
 * no name twice, its buffer aligned and inside the data) and _check_packing (the
 * buffers tile the data with only alignment padding between them), then the tensors
 * that mapping.tensors_over would build, field for field. The header and the index
 * checksum are checked in Python first; the metadata block is read there after.
 *
 * It never refuses: at any other entry (another layout, several buffers, a shard
 * section ...) and at any defect it answers None, and parse_index, which stays the
 * reference, reads the table and names the defect. Each distinct descriptor is decoded
 * once, by a Python callable (wire.decode_prefix and its checks), with the real bytes
 * of its first entry; later entries whose descriptor bytes differ from it only in the
 * buffer offset share its answer, as parse_index's cache does (the decoder's checks do
 * not depend on the offset: those that do are made here for every entry). The answers
 * are kept across loads, in a bounded cache, as a checkpoint's files and each load of
 * one repeat the same descriptors.
 */
#include "speedups.h"

#include <string.h>

#define ENTRY_SIZE 16     /* format.ENTRY: name_length, descriptor_length, crc32, reserved */
#define MIN_DESCRIPTOR 56 /* format._MIN_DESCRIPTOR */
#define MAX_NAME 4096     /* format.MAX_NAME_BYTES */
#define BUFFER_ENTRY 24   /* a buffer table entry: role and flags, offset, length */

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

typedef struct {
    const unsigned char *s;
    Py_ssize_t table_length;
    uint64_t n_entries, data_length, alignment, base;
    int checksums;
    PyObject *owner, *describe;
    PyObject *out;    /* {name: Tensor} */
    HbSpans spans;
} Table;

/* {descriptor bytes, offset zeroed: describe's answer}, across loads */
static PyObject *seen_descriptors;

typedef struct {
    PyObject *describe;
    const unsigned char *d;
    Py_ssize_t n;
} EntryDescriptor;

static PyObject *
describe_bytes(void *arg)
{
    EntryDescriptor *e = arg;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)e->d, e->n);
    PyObject *got = raw ? PyObject_CallOneArg(e->describe, raw) : NULL;
    Py_XDECREF(raw);
    return got;
}

/* describe(descriptor bytes) for an entry's descriptor d[0:n], whose one buffer's offset
 * is at d[at:at + 8]: (Descriptor, shape, dtype, padded, buffer length) or None; a new
 * reference (hb_cached_answer). */
static PyObject *
described(Table *t, const unsigned char *d, Py_ssize_t n, Py_ssize_t at)
{
    PyObject *key = PyBytes_FromStringAndSize((const char *)d, n);
    if (key == NULL) {
        return NULL;
    }
    memset(PyBytes_AS_STRING(key) + at, 0, 8);
    EntryDescriptor e = {t->describe, d, n};
    PyObject *got = hb_cached_answer(&seen_descriptors, key, describe_bytes, &e, 5, 4,
                                     "(Descriptor, shape, DType, padded, buffer length)");
    Py_DECREF(key);
    return got;
}

/* The entry at *pos: 1 read (the tensor in t->out), 0 declined, -1 an error. */
static int
entry(Table *t, Py_ssize_t *pos)
{
    const unsigned char *s = t->s;
    Py_ssize_t p = *pos, end = t->table_length;
    if (end - p < ENTRY_SIZE) {
        return 0;
    }
    uint32_t name_len = le32(s + p), desc_len = le32(s + p + 4), crc = le32(s + p + 8);
    if (le32(s + p + 12) != 0 || name_len < 1 || name_len > MAX_NAME
            || desc_len < MIN_DESCRIPTOR || desc_len % 8 || (crc && !t->checksums)) {
        return 0;
    }
    Py_ssize_t name_at = p + ENTRY_SIZE;
    Py_ssize_t desc_at = name_at + (((Py_ssize_t)name_len + 7) & ~(Py_ssize_t)7);
    if ((Py_ssize_t)desc_len > end - desc_at) {
        return 0;
    }
    for (Py_ssize_t k = name_at + name_len; k < desc_at; k++) {
        if (s[k]) {
            return 0;
        }
    }
    const unsigned char *d = s + desc_at;
    /* one buffer (n_buf, bytes 14-15 of the descriptor): its offset and length last */
    if ((d[14] | d[15] << 8) != 1 || memchr(s + name_at, 0, name_len) != NULL) {
        return 0;
    }
    Py_ssize_t table_at = (Py_ssize_t)desc_len - BUFFER_ENTRY;
    uint64_t offset = le64(d + table_at + 8), length = le64(d + table_at + 16);
    if (length && (offset % t->alignment || offset > t->data_length
                   || length > t->data_length - offset)) {
        return 0;
    }
    PyObject *desc = described(t, d, desc_len, table_at + 8);
    if (desc == NULL) {
        return -1;
    }
    int rc = 0;
    if (desc == Py_None) {
        goto done;
    }
    const HbDType *dtype = hb_dtype_entry(PyTuple_GET_ITEM(desc, 2));
    PyObject *shape = PyTuple_GET_ITEM(desc, 1);
    Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
    unsigned long long decoded = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(desc, 4));
    if (decoded == (unsigned long long)-1 && PyErr_Occurred()) {
        { rc = -1; goto done; }
    }
    if (dtype == NULL || ndim > HB_MAX_RANK || decoded != length) {
        goto done;
    }
    int64_t dims[HB_MAX_RANK];
    for (Py_ssize_t k = 0; k < ndim; k++) {
        dims[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, k));
        if (dims[k] == -1 && PyErr_Occurred()) { /* beyond int64: parse_index decides */
            hb_swallow();
            { rc = PyErr_Occurred() ? -1 : 0; goto done; }
        }
    }
    PyObject *name = PyUnicode_DecodeUTF8((const char *)s + name_at, name_len, "strict");
    if (name == NULL) { /* not UTF-8: parse_index names it */
        hb_swallow();
        { rc = PyErr_Occurred() ? -1 : 0; goto done; }
    }
    int has = PyDict_Contains(t->out, name);
    if (has != 0) {
        Py_DECREF(name);
        { rc = has < 0 ? -1 : 0; goto done; }
    }
    HbDense dense = {
        .data = length ? t->base + offset : 0, .ndim = (int)ndim, .shape = dims,
        .strides = NULL, .shape_tuple = shape, .dtype = dtype,
        .padded = PyTuple_GET_ITEM(desc, 3) == Py_True, .readonly = 1, .copied = 0,
        .device = hb_world.cpu, .owner = t->owner, .source = NULL, .nbytes_obj = NULL,
    };
    PyObject *tensor = hb_dense_tensor(&dense);
    if (tensor == NULL) {
        Py_DECREF(name);
        { rc = -1; goto done; }
    }
    Py_SETREF(HB_SLOT(tensor, HB_S_DESC), Py_NewRef(PyTuple_GET_ITEM(desc, 0)));
    int failed = PyDict_SetItem(t->out, name, tensor);
    Py_DECREF(name);
    Py_DECREF(tensor);
    if (failed || (length && hb_spans_push(&t->spans, offset, offset + length) < 0)) {
        { rc = -1; goto done; }
    }
    *pos = desc_at + desc_len;
    rc = 1;
done:
    Py_DECREF(desc);
    return rc;
}

/* Every entry, then the buffers tiling the data: 1 accepted, 0 declined, -1 error. */
static int
read_table(Table *t)
{
    Py_ssize_t pos = 0;
    for (uint64_t i = 0; i < t->n_entries; i++) {
        int got = entry(t, &pos);
        if (got <= 0) {
            return got;
        }
    }
    if (pos != t->table_length) {
        return 0;
    }
    return hb_spans_tile(&t->spans, t->alignment, t->data_length);
}

/* hurray_tensors(table, n_entries, checksums, data_length, alignment, base, owner,
 *                describe) -> {name: Tensor} or None */
PyObject *
hb_hurray_tensors(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer view;
    unsigned long long n_entries, data_length, alignment, base;
    int checksums;
    PyObject *owner, *describe;
    if (!PyArg_ParseTuple(args, "y*KpKKKOO:hurray_tensors", &view, &n_entries, &checksums,
                          &data_length, &alignment, &base, &owner, &describe)) {
        return NULL;
    }
    if (!hb_world_ready() || alignment == 0 || (alignment & (alignment - 1)) != 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Table t = {
        .s = view.buf, .table_length = view.len, .n_entries = n_entries,
        .data_length = data_length, .alignment = alignment, .base = base,
        .checksums = checksums, .owner = owner, .describe = describe,
        .out = PyDict_New(),
    };
    PyObject *result = NULL;
    int got = t.out ? read_table(&t) : -1;
    if (got > 0) {
        result = Py_NewRef(t.out);
    }
    else if (got == 0) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(t.out);
    PyMem_Free(t.spans.at);
    PyBuffer_Release(&view);
    return result;
}
