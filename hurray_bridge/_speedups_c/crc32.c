/* The Python face of the project's one CRC-32 (c/src/crc32.c, the C library's): crc32(),
 * crc32_by() for the tests of each way, crc32_combine(), and the CRC32_CLMUL and CRC32_WAYS
 * flags. Buffers of 4 KiB and more are summed with the GIL released, as zlib does.
 */
#include "speedups.h"
#include "internal.h"

/* crc32(data, value) by `way` (below hry__crc32_ways()), NULL with an exception set. */
static PyObject *
crc_call(int way, PyObject *data, PyObject *value)
{
    uint32_t crc = 0;
    if (value != NULL) {
        unsigned long v = PyLong_AsUnsignedLongMask(value);  /* as zlib: the low 32 bits */
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        crc = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *p = view.buf;
    size_t n = (size_t)view.len;
    if (n >= 4096) {  /* as zlib: a short buffer is not worth the GIL's round trip */
        Py_BEGIN_ALLOW_THREADS
        crc = hry__crc32_by(way, crc, p, n);
        Py_END_ALLOW_THREADS
    } else {
        crc = hry__crc32_by(way, crc, p, n);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

HB_INTERNAL PyObject *
hb_crc32(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0, /)");
        return NULL;
    }
    return crc_call(hry__crc32_ways() - 1, args[0], nargs == 2 ? args[1] : NULL);
}

/* crc32_by(way, data, value): the same by a given way, for the tests of each. */
HB_INTERNAL PyObject *
hb_crc32_by(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "crc32_by(way, data, value, /)");
        return NULL;
    }
    long way = PyLong_AsLong(args[0]);
    if (way == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (way < 0 || way >= hry__crc32_ways()) {
        PyErr_Format(PyExc_ValueError, "crc32_by: way %ld is not available here (0 to %d)",
                     way, hry__crc32_ways() - 1);
        return NULL;
    }
    return crc_call((int)way, args[1], args[2]);
}

/* crc32_combine(crc1, crc2, len2): the CRC-32 of A + B from that of A and that of B
 * (len2 bytes): crc1 times x^(8 len2), plus crc2 (the pre- and post-conditioning
 * cancel out). */
HB_INTERNAL PyObject *
hb_crc32_combine(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "crc32_combine(crc1, crc2, len2, /)");
        return NULL;
    }
    unsigned long long v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred()) {
            return NULL;
        }
        if (i < 2 && v[i] > 0xFFFFFFFFull) {
            PyErr_SetString(PyExc_OverflowError, "crc32_combine: a CRC-32 is below 2**32");
            return NULL;
        }
    }
    return PyLong_FromUnsignedLong(
        hry__crc32_combine((uint32_t)v[0], (uint32_t)v[1], (uint64_t)v[2]));
}

HB_INTERNAL int
hb_add_crc32(PyObject *module)
{
    PyObject *flag = PyBool_FromLong(hry__crc32_ways() > 1);
    if (PyModule_AddObject(module, "CRC32_CLMUL", flag) < 0) {
        Py_DECREF(flag);
        return -1;
    }
    return PyModule_AddIntConstant(module, "CRC32_WAYS", hry__crc32_ways());
}
