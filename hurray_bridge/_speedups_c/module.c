/* hurray_bridge._speedups: compiled hot paths of hurray_bridge, each with a Python
 * fallback that runs where this module was not built (setup.py builds it optionally).
 *
 * One extension, one concern per source file (see speedups.h): hb.convert's shortcut
 * front (front.c), the deleters of our DLPack exports (deleters.c), the dense
 * descriptor decoder (decoder.c), hb.Tensor from C (tensor.c) and DLPack import and
 * export through the C exchange API (xapi_in.c, xapi_out.c), the data checksums'
 * CRC-32 (crc32.c), hb.load's readers of plain safetensors headers (st_header.c) and
 * Hurray entry tables (hry_index.c) and the planners of small files of hb.save and
 * safetensors_io.save (small_files.c).
 * This file only puts them into one module.
 */
#include "speedups.h"

static PyMethodDef speedups_functions[] = {
    {"decode_dense", (PyCFunction)(void (*)(void))hb_decode_dense, METH_FASTCALL,
     "decode_dense(data, n) -> (Descriptor, data offset, data length, total) or None"},
    {"dense_decoder_setup", hb_dense_decoder_setup, METH_VARARGS,
     "dense_decoder_setup(Descriptor, dtypes[256], bits[256], row_major, strided, slots)"},
    {"capsule_hooks", hb_capsule_hooks, METH_VARARGS,
     "capsule_hooks(exports, name_v, name_l) -> (deleter address, destructor address)"},
    {"exchange_setup", hb_exchange_setup, METH_VARARGS,
     "exchange_setup(Tensor, slots, Device, CPU, cpu_dl, UnsupportedError, ROW_MAJOR, "
     "STRIDED, dlpack_py, dlpack_device_py, export_py, generic_ok, dtypes)"},
    {"arrow_release_hooks", hb_arrow_release_hooks, METH_VARARGS,
     "arrow_release_hooks(release_schema, release_array) -> (schema release address, "
     "array release address): C callbacks that call them under the exit guard"},
    {"stop_foreign_releases", hb_stop_foreign_releases, METH_O,
     "stop_foreign_releases(timeout_ms) -> unfinished deleter calls: at exit, threads "
     "without the GIL stop releasing exports"},
    {"buffer_address", hb_buffer_address, METH_O,
     "buffer_address(obj) -> the address of obj's contiguous buffer (the caller keeps it "
     "exported)"},
    {"crc32", (PyCFunction)(void (*)(void))hb_crc32, METH_FASTCALL,
     "crc32(data, value=0, /) -> zlib.crc32's value, faster where CRC32_CLMUL"},
    {"crc32_by", (PyCFunction)(void (*)(void))hb_crc32_by, METH_FASTCALL,
     "crc32_by(way, data, value, /): crc32 by way 0 (table) to CRC32_WAYS - 1, for tests"},
    {"crc32_combine", (PyCFunction)(void (*)(void))hb_crc32_combine, METH_FASTCALL,
     "crc32_combine(crc1, crc2, len2, /) -> the CRC-32 of A + B from A's, B's and len(B)"},
    {"safetensors_tensors", hb_safetensors_tensors, METH_VARARGS,
     "safetensors_tensors(header, data_size, base, owner, describe, checkpoint, cap) -> "
     "({name: Tensor}, metadata_at, alignment, unaligned) or None"},
    {"hurray_tensors", hb_hurray_tensors, METH_VARARGS,
     "hurray_tensors(table, n_entries, checksums, data_length, alignment, base, owner, "
     "describe) -> {name: Tensor} or None"},
    {"small_file", hb_small_file, METH_VARARGS,
     "small_file(mapping, alignment, checksums, metadata, n_metadata, limit, describe) -> "
     "[head, bytes ...] or None"},
    {"small_safetensors", hb_small_safetensors, METH_VARARGS,
     "small_safetensors(mapping, metadata_json, max_header, limit, describe) -> "
     "[head, bytes ...] or None"},
    {NULL}
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hurray_bridge._speedups",
    .m_doc = "Compiled hot paths of hurray_bridge (optional; Python fallbacks exist).",
    .m_size = -1,
    .m_methods = speedups_functions,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    if (hb_add_front(m) < 0 || hb_add_import(m) < 0 || hb_add_export(m) < 0
        || hb_add_crc32(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
