/* Small files of plain dense arrays, planned in one pass: the fast paths of hb.save
 * (small_file) and safetensors_io.save (small_safetensors).
 *
 * Each takes what its save takes (a dict of names to arrays and the format's options)
 * and gives the pieces to write from offset 0, in order: the head, then each array's
 * bytes (for a Hurray file with the zero padding before each). A Hurray file's layout is
 * files/plan.py's plan_items and Plan.head, field for field (and c/src/writer.c's, which
 * agrees with both): each buffer at the next multiple of the alignment, the data region
 * at the index end rounded up to max(4096, alignment). A safetensors file's header is
 * the JSON text files/safetensors.py's _write_safetensors encodes (json's compact form,
 * non-ASCII as it is), padded with spaces to 8 bytes, its tensors back to back.
 *
 * Neither ever refuses. At anything the Python path would treat otherwise (a name that
 * is not a str, or for a Hurray file not a short NUL-free one; a value that is not a
 * plain dense array; a data region or a head of `limit` bytes or more, which the data
 * writers write in slices) they answer None, and the Python path writes the file,
 * raising its own errors. What the file needs of an array (for a Hurray file its
 * descriptor's bytes up to the buffer's place, for safetensors its header object's text
 * up to its offsets; its byte count) comes from a Python callable, describe(value), once
 * per (type, dtype, shape), as the compiled readers ask theirs: a save of many tensors
 * repeats a few shapes and types. A save of ten small tensors spent a third of its time
 * planning in Python.
 */
#include "speedups.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define ENTRY_SIZE 16  /* format.ENTRY: name_length, descriptor_length, crc32, reserved */
#define PLACE_SIZE 16  /* wire.DENSE_PLACE: the data buffer's offset and length */
#define PAGE 4096u     /* format.PAGE_ALIGNMENT */

/* (bytes or None, shape, byte count, dtype, type), per (id(type), id(dtype), shape),
 * across saves: one cache a format. The key holds the addresses, not the objects: a
 * NumPy dtype hashes by building a tuple of its fields (twice a lookup, a fifth of the
 * planning), and a type may define its own equality; the answer, a "no" too, holds the
 * dtype and the type themselves, so no other can have those addresses while it is kept. */
static PyObject *hurray_answers, *safetensors_answers;
static PyObject *cast_name, *byte_format; /* "cast", "B" */

typedef struct {
    PyObject *describe, *value;
} Ask;

static PyObject *
ask(void *arg)
{
    Ask *a = arg;
    return PyObject_CallOneArg(a->describe, a->value);
}

typedef struct {
    const char *name;
    Py_ssize_t name_length;
    PyObject *text;  /* describe's bytes, borrowed from the answer, which `held` holds */
    PyObject *bytes; /* the array's bytes: a 1-D memoryview of format B */
    uint64_t offset, length;
} Planned;

/* 1 when the exception set is an Exception (declined); 0 for KeyboardInterrupt and the
 * like, which must go on */
static int
clear_if_ordinary(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* The array's answer (a new reference: None when declined) and its bytes in p->bytes;
 * NULL with an exception set: describe's own (a bug, not a value to decline) or an
 * interrupt. Any value may be given: one whose dtype, shape or buffer cannot be had is
 * declined. Its memory is checked before describe is asked (C-contiguous, not empty):
 * what is kept per (type, dtype, shape) must not depend on one array's memory (a
 * transposed array's answer kept would have declined every later array of its kind). */
static PyObject *
plan_value(PyObject *value, PyObject *describe, PyObject **cache, Planned *p)
{
    PyObject *view = PyMemoryView_FromObject(value);
    Py_buffer *b = view ? PyMemoryView_GET_BUFFER(view) : NULL;
    PyObject *type = (PyObject *)Py_TYPE(value);
    PyObject *dtype = NULL, *shape = NULL, *at = NULL, *kind = NULL, *key = NULL;
    if (b != NULL && b->len > 0 && PyBuffer_IsContiguous(b, 'C')) {
        dtype = PyObject_GetAttrString(value, "dtype");
        shape = dtype ? PyObject_GetAttrString(value, "shape") : NULL;
        at = shape ? PyLong_FromVoidPtr(dtype) : NULL;
        kind = at ? PyLong_FromVoidPtr(type) : NULL;
    }
    if (kind != NULL && PyTuple_CheckExact(shape)) {
        int ints = 1;  /* (so that the key hashes: NumPy's shapes are tuples of ints) */
        for (Py_ssize_t k = 0; ints && k < PyTuple_GET_SIZE(shape); k++) {
            ints = PyLong_CheckExact(PyTuple_GET_ITEM(shape, k));
        }
        key = ints ? PyTuple_Pack(3, kind, at, shape) : NULL;
    }
    Py_XDECREF(shape);
    Py_XDECREF(at);
    Py_XDECREF(kind);
    if (key == NULL) {
        Py_XDECREF(dtype);
        Py_XDECREF(view);
        if (!PyErr_Occurred()) {
            return Py_NewRef(Py_None);
        }
        return clear_if_ordinary() ? Py_NewRef(Py_None) : NULL;
    }
    Ask a = {describe, value};
    PyObject *got = hb_cached_answer(cache, key, ask, &a, 5, 2,
                                     "(bytes or None, shape, nbytes, dtype, type)");
    Py_DECREF(key);
    /* an answer kept for another type or dtype at those addresses cannot be: it holds
     * both (a "no" too: (None, ...)); a plain None (not describe's form) is a "no" */
    int mine = got != NULL && got != Py_None && PyTuple_GET_ITEM(got, 3) == dtype
               && PyTuple_GET_ITEM(got, 4) == type && PyBytes_Check(PyTuple_GET_ITEM(got, 0));
    Py_DECREF(dtype);
    unsigned long long nbytes = mine ? PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(got, 2)) : 0;
    PyObject *flat = NULL;
    if (mine && nbytes == (unsigned long long)b->len) {
        flat = b->ndim == 1 && b->format != NULL && strcmp(b->format, "B") == 0
                   ? Py_NewRef(view)
                   : PyObject_CallMethodOneArg(view, cast_name, byte_format);
    }
    Py_DECREF(view);
    if (got == NULL) {
        return NULL;
    }
    if (flat == NULL) {
        Py_DECREF(got);
        if (PyErr_Occurred() && !clear_if_ordinary()) {
            return NULL;
        }
        return Py_NewRef(Py_None);
    }
    p->bytes = flat;
    p->text = PyTuple_GET_ITEM(got, 0);
    p->length = nbytes;
    return got;
}

/* Every entry of `items` (a snapshot of the dict's items: describe may run any code,
 * another thread's included, which may change the dict) planned into e[] (name,
 * describe's text, bytes): 1; 0 where one is declined, or as soon as the bytes reach
 * `limit` (a big checkpoint is declined at its first 4 MiB, not after every array was
 * looked at); -1 with an exception set. `held` (a list) takes describe's answers; it,
 * `items` and the entries' bytes are the caller's to release. `hurray_names`: names of
 * 1 to HRY_MAX_NAME_BYTES bytes without NUL only; else any name but the one
 * safetensors' header keeps for the metadata. */
static int
plan_entries(PyObject *items, PyObject *describe, PyObject **cache, int hurray_names,
             uint64_t limit, Planned *e, PyObject *held)
{
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *name = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 0);
        PyObject *value = PyTuple_GET_ITEM(PyList_GET_ITEM(items, i), 1);
        if (!PyUnicode_CheckExact(name)) {
            return 0;
        }
        e[i].name = PyUnicode_AsUTF8AndSize(name, &e[i].name_length);
        if (e[i].name == NULL) {
            return clear_if_ordinary() ? 0 : -1;
        }
        if (hurray_names ? e[i].name_length < 1 || e[i].name_length > HRY_MAX_NAME_BYTES
                               || memchr(e[i].name, 0, (size_t)e[i].name_length) != NULL
                         : e[i].name_length == 12 && memcmp(e[i].name, "__metadata__", 12) == 0) {
            return 0;
        }
        PyObject *got = plan_value(value, describe, cache, &e[i]);
        if (got == NULL) {
            return -1;
        }
        int kept = PyList_Append(held, got);
        Py_DECREF(got);
        if (kept < 0) {
            return -1;
        }
        if (got == Py_None) {
            return 0;
        }
        total += e[i].length;
        if (total >= limit) {
            return 0;
        }
    }
    return 1;
}

static uint64_t
pad8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

/* Header, entry table, metadata and zero padding: data_offset bytes (Plan.head). */
static PyObject *
hurray_head(const Planned *e, Py_ssize_t n, const uint32_t *crcs, int checksums,
            const char *meta, Py_ssize_t meta_length, uint32_t n_meta, uint64_t table_length,
            uint64_t data_offset, uint64_t data_length, uint32_t alignment)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)data_offset);
    if (out == NULL) {
        return NULL;
    }
    uint8_t *h = (uint8_t *)PyBytes_AS_STRING(out);
    memset(h, 0, (size_t)data_offset);
    uint8_t *p = h + HRY_FILE_HEADER_SIZE;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t head_length = PyBytes_GET_SIZE(e[i].text);
        hry__put_entry_head(p, (uint32_t)e[i].name_length, (uint32_t)(head_length + PLACE_SIZE),
                            checksums ? crcs[i] : 0);
        memcpy(p + ENTRY_SIZE, e[i].name, (size_t)e[i].name_length);
        p += ENTRY_SIZE + pad8((uint64_t)e[i].name_length);
        memcpy(p, PyBytes_AS_STRING(e[i].text), (size_t)head_length);
        hry__put64(p + head_length, e[i].offset);
        hry__put64(p + head_length + 8, e[i].length);
        p += head_length + PLACE_SIZE;
    }
    if (meta_length) {
        memcpy(p, meta, (size_t)meta_length);
    }
    hry__put_file_header(h, (uint32_t)n, n_meta, checksums, table_length, (uint64_t)meta_length,
                         data_offset, data_length, alignment);
    return out;
}

/* [head, then each entry's bytes after zeros up to its offset (counted from the end of
 * the head)]; NULL with an exception set. The head is taken (stolen), even on failure. */
static PyObject *
pieces_after(PyObject *head, const Planned *e, Py_ssize_t n)
{
    PyObject *out = head ? PyList_New(1) : NULL;
    if (out == NULL) {
        Py_XDECREF(head);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, head);
    uint64_t end = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (e[k].offset > end) {
            Py_ssize_t gap = (Py_ssize_t)(e[k].offset - end);
            PyObject *zeros = PyBytes_FromStringAndSize(NULL, gap);
            if (zeros != NULL) {
                memset(PyBytes_AS_STRING(zeros), 0, (size_t)gap);
            }
            if (zeros == NULL || PyList_Append(out, zeros) < 0) {
                Py_XDECREF(zeros);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(zeros);
        }
        if (PyList_Append(out, e[k].bytes) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        end = e[k].offset + e[k].length;
    }
    return out;
}

/* The planned entries of a Hurray file as pieces, or None (see the top). */
static PyObject *
hurray_pieces(Planned *e, Py_ssize_t n, uint32_t alignment, int checksums, const char *meta,
              Py_ssize_t meta_length, uint32_t n_meta, uint64_t limit)
{
    uint64_t cursor = 0, table = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        cursor = (cursor + alignment - 1) & ~(uint64_t)(alignment - 1);
        e[i].offset = cursor;
        cursor += e[i].length;
        if (cursor >= limit) {
            Py_RETURN_NONE;
        }
        table += ENTRY_SIZE + pad8((uint64_t)e[i].name_length)
                 + (uint64_t)PyBytes_GET_SIZE(e[i].text) + PLACE_SIZE;
    }
    uint64_t index_end = HRY_FILE_HEADER_SIZE + table + (uint64_t)meta_length;
    uint64_t page = alignment > PAGE ? alignment : PAGE;
    uint64_t data_offset = cursor ? (index_end + page - 1) & ~(page - 1) : index_end;
    if (data_offset >= limit) {  /* thousands of long names: the file is not small */
        Py_RETURN_NONE;
    }
    uint32_t *crcs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *crcs);
    if (crcs == NULL) {
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; checksums && k < n; k++) {
        Py_buffer *b = PyMemoryView_GET_BUFFER(e[k].bytes);
        if (b->len >= 4096) {  /* as the Python path's crc32: the GIL goes for long sums */
            Py_BEGIN_ALLOW_THREADS
            crcs[k] = hry_crc32(0, b->buf, (size_t)b->len);
            Py_END_ALLOW_THREADS
        } else {
            crcs[k] = hry_crc32(0, b->buf, (size_t)b->len);
        }
    }
    PyObject *head = hurray_head(e, n, crcs, checksums, meta, meta_length, n_meta, table,
                                 data_offset, cursor, alignment);
    PyMem_Free(crcs);
    return pieces_after(head, e, n);
}

/* The bytes of `s` (UTF-8, n bytes) as the inside of a JSON string, as Python's json
 * writes it with ensure_ascii=False: '"', '\\' and the control characters escaped (the
 * five with a short form by it, the others as \u00xx), everything else as it is. Into
 * `out` (NULL: only counted); the length. */
static size_t
json_escaped(const char *s, Py_ssize_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char two = c == '"' ? '"' : c == '\\' ? '\\' : c == '\n' ? 'n' : c == '\r' ? 'r'
                 : c == '\t' ? 't' : c == '\b' ? 'b' : c == '\f' ? 'f' : 0;
        if (two) {
            if (out) {
                out[w] = '\\';
                out[w + 1] = two;
            }
            w += 2;
        } else if (c < 0x20) {
            if (out) {
                memcpy(out + w, "\\u00", 4);
                out[w + 4] = hex[c >> 4];
                out[w + 5] = hex[c & 15];
            }
            w += 6;
        } else {
            if (out) {
                out[w] = (char)c;
            }
            w += 1;
        }
    }
    return w;
}

/* The planned entries of a safetensors file as pieces, or None (see the top). `meta`:
 * the __metadata__ object's JSON text (empty: no metadata). */
static PyObject *
safetensors_pieces(Planned *e, Py_ssize_t n, const char *meta, Py_ssize_t meta_length,
                   uint64_t max_header, uint64_t limit)
{
    static const char meta_key[] = "\"__metadata__\":";
    /* each entry: "NAME":TEXTa,b]} and a comma; the offsets two of up to 20 digits */
    uint64_t size = 2 + (meta_length ? sizeof meta_key - 1 + (uint64_t)meta_length + 1 : 0);
    uint64_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        e[i].offset = pos;
        pos += e[i].length;
        if (pos >= limit) {
            Py_RETURN_NONE;
        }
        size += 3 + json_escaped(e[i].name, e[i].name_length, NULL)
                + (uint64_t)PyBytes_GET_SIZE(e[i].text) + 2 * 20 + 4;
    }
    if (size > limit) {
        Py_RETURN_NONE;
    }
    char *text = PyMem_Malloc((size_t)size);
    if (text == NULL) {
        return PyErr_NoMemory();
    }
    size_t w = 0;
    text[w++] = '{';
    if (meta_length) {
        memcpy(text + w, meta_key, sizeof meta_key - 1);
        w += sizeof meta_key - 1;
        memcpy(text + w, meta, (size_t)meta_length);
        w += (size_t)meta_length;
        text[w++] = ',';
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        text[w++] = '"';
        w += json_escaped(e[i].name, e[i].name_length, text + w);
        text[w++] = '"';
        text[w++] = ':';
        Py_ssize_t t = PyBytes_GET_SIZE(e[i].text);
        memcpy(text + w, PyBytes_AS_STRING(e[i].text), (size_t)t);
        w += (size_t)t;
        w += (size_t)snprintf(text + w, (size_t)size - w, "%llu,%llu]}",
                              (unsigned long long)e[i].offset,
                              (unsigned long long)(e[i].offset + e[i].length));
        text[w++] = ',';
    }
    if (n || meta_length) {
        w--;  /* (the last comma) */
    }
    text[w++] = '}';
    size_t padded = (w + 7) & ~(size_t)7;  /* safetensors pads its header with spaces */
    PyObject *head = NULL;
    if (padded <= max_header) {
        head = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(8 + padded));
        if (head != NULL) {
            uint8_t *h = (uint8_t *)PyBytes_AS_STRING(head);
            hry__put64(h, (uint64_t)padded);
            memcpy(h + 8, text, w);
            memset(h + 8 + w, ' ', padded - w);
        }
    }
    PyMem_Free(text);
    if (padded > max_header) {
        Py_RETURN_NONE;  /* the Python path says it is over the limit */
    }
    return pieces_after(head, e, n);
}

/* What the layouts take besides the entries: a save's options. */
typedef struct {
    uint32_t alignment, n_meta; /* (Hurray) */
    int checksums;              /* (Hurray) */
    const char *meta;           /* the metadata block (Hurray) or JSON text (safetensors) */
    Py_ssize_t meta_length;
    uint64_t max_header;        /* (safetensors) */
    uint64_t limit;
} Options;

static PyObject *
hurray_layout(Planned *e, Py_ssize_t n, const Options *o)
{
    return hurray_pieces(e, n, o->alignment, o->checksums, o->meta, o->meta_length, o->n_meta,
                         o->limit);
}

static PyObject *
safetensors_layout(Planned *e, Py_ssize_t n, const Options *o)
{
    return safetensors_pieces(e, n, o->meta, o->meta_length, o->max_header, o->limit);
}

/* The entries of `mapping` planned (plan_entries) and laid out by `layout`: the pieces,
 * None where declined, NULL with an exception set. */
static PyObject *
plan_small(PyObject *mapping, PyObject *describe, PyObject **cache, int hurray_names,
           PyObject *(*layout)(Planned *, Py_ssize_t, const Options *), const Options *o)
{
    if (cast_name == NULL && ((cast_name = PyUnicode_InternFromString("cast")) == NULL
                              || (byte_format = PyUnicode_InternFromString("B")) == NULL)) {
        Py_CLEAR(cast_name);
        return NULL;
    }
    /* the names and values as they are now, held while their bytes are read */
    PyObject *items = PyDict_Items(mapping);
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    Planned *e = PyMem_Calloc((size_t)(n ? n : 1), sizeof *e);
    PyObject *held = e ? PyList_New(0) : NULL;  /* describe's answers */
    PyObject *out = NULL;
    if (held != NULL) {
        int planned = plan_entries(items, describe, cache, hurray_names, o->limit, e, held);
        out = planned < 0 ? NULL : planned == 0 ? Py_NewRef(Py_None) : layout(e, n, o);
    } else if (e == NULL) {
        PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; e != NULL && k < n; k++) {
        Py_XDECREF(e[k].bytes);
    }
    PyMem_Free(e);
    Py_XDECREF(held);
    Py_DECREF(items);
    return out;
}

HB_INTERNAL PyObject *
hb_small_file(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *mapping, *describe;
    unsigned int alignment, n_meta;
    unsigned long long limit;
    Options o = {0};
    if (!PyArg_ParseTuple(args, "O!Ipy#IKO:small_file", &PyDict_Type, &mapping, &alignment,
                          &o.checksums, &o.meta, &o.meta_length, &n_meta, &limit, &describe)) {
        return NULL;
    }
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "small_file: alignment %u is not a power of two",
                     alignment);
        return NULL;
    }
    o.alignment = alignment;
    o.n_meta = n_meta;
    o.limit = limit;
    return plan_small(mapping, describe, &hurray_answers, 1, hurray_layout, &o);
}

HB_INTERNAL PyObject *
hb_small_safetensors(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *mapping, *describe;
    unsigned long long max_header, limit;
    Options o = {0};
    if (!PyArg_ParseTuple(args, "O!y#KKO:small_safetensors", &PyDict_Type, &mapping, &o.meta,
                          &o.meta_length, &max_header, &limit, &describe)) {
        return NULL;
    }
    o.max_header = max_header;
    o.limit = limit;
    return plan_small(mapping, describe, &safetensors_answers, 0, safetensors_layout, &o);
}
