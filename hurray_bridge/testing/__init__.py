"""A conformance kit for array libraries: DLPack producer checks and framework round trips.

Two tools for authors of array libraries and of code that builds DLPack capsules:

* :func:`check_producer` runs a battery of checks on any object factory and
  returns a :class:`Report` (one :class:`CheckResult` per check, with the
  reason). The same battery runs as a pytest plugin
  (``pytest --hurray-producer mylib.testing:make_tensor``) and from the
  command line (``hurray check mylib.testing:make_tensor``).
* :func:`check_consumer` hands a library's ``from_dlpack`` the kit's own producer,
  in child processes, and reports whether it honours ``READ_ONLY`` (over a
  write-protected page), calls the deleter once and honours ``copy=``.
* :func:`assert_round_trip` hands a tensor through a chain of frameworks and
  back, asserting values, dtype, shape and (on request) pointer identity at
  every hop, and names the hop that broke.

Importing this package loads no framework; a check or a hop imports what it
needs. The checks read the producer's struct directly, before consumption,
because they look at exactly what a consumer normalises away (the version,
raw NULL pointers, NULL strides, byte offsets, the deleter); ownership then
goes through the ordinary consumer in :mod:`hurray_bridge._capsule`.

The producer checks run in the calling process: a producer that crashes the process
(for instance in its capsule destructor) crashes the check run with it. The consumer
checks run in child processes, since a consumer that ignores ``READ_ONLY`` is caught
by the write that kills its child.

The package's modules, by concern: ``_report`` (results), ``_raw`` (the kit's own
reader of a producer's struct, and the deleter watch), ``_context`` (the factory under
test), ``_checks`` (the battery), ``_consumer`` and ``_consumer_child`` (the consumer checks:
parent and child), ``_producer`` (:func:`check_producer`,
:func:`load_factory`), ``_round_trip`` and ``_dtypes``. Only the names below are the
kit's interface.
"""

from __future__ import annotations

from ._checks import CHECKS
from ._consumer import CONSUMER_CHECKS, check_consumer
from ._dtypes import numpy_dtype
from ._producer import check_producer, load_factory
from ._report import CheckResult, Report
from ._round_trip import assert_round_trip

__all__ = [
    "CHECKS",
    "CONSUMER_CHECKS",
    "CheckResult",
    "Report",
    "assert_round_trip",
    "check_consumer",
    "check_producer",
    "load_factory",
    "numpy_dtype",
]
