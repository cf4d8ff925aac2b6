"""Hurray files and the other file formats the bridge reads and writes, one concern a module.

``format``: the ``.hurray`` header, entry table and metadata, and their checks
(``docs/spec/container.md``). ``data_checks``: data checksums and padding.
``checksums``: the CRC-32. ``disk``: paths, atomic output, stale temporaries.
``pread``: positional reads. ``mapping``: memory maps and who owns them.
``tensor_file``: what a load returns. ``reading``: ``hb.load``, ``hb.loads``, ``verify``.
``sharded``: a sharded tensor's entries. ``regions``: file regions as sources of bytes.
``plan``: a file's layout before a byte is written. ``engine``: the threaded data
writer. ``writing``: ``hb.save``, ``hb.dumps`` and entries written by other processes.
``convert``: a file written again as a Hurray file. ``safetensors_header`` and
``safetensors``: that format's header, and its writer and conversions. ``numpy_files``:
``.npy`` and ``.npz`` files read for ``hurray convert``.

The package imports none of them: ``hurray inspect`` reads an index through ``format``
without importing the readers or the writer.
"""
