/* The DLPack deleter and capsule destructor of hurray_bridge._capsule's exports, and the
 * exit-time guard that every deleter of ours (xapi_out.c's too) goes through.
 *
 * The ctypes versions cannot leave an exception that was in flight when a consumer
 * released our memory (a TypeError raised while a NumPy temporary dies): ctypes
 * reports it as SystemError. In C the exception is simply set aside and put back.
 * Both only remove the export's entry from _capsule._EXPORTS (keyed by the managed
 * struct's address), which frees the struct and releases the owner.
 */
#include "speedups.h"

#include <stdatomic.h>
#ifdef _WIN32
#include <windows.h>
#else
#include <pthread.h>
#include <time.h>
#endif

static PyObject *exports = NULL;   /* _capsule._EXPORTS */
static PyObject *names = NULL;     /* the two fresh-name bytes objects, kept alive */
static const char *name_v = NULL, *name_l = NULL;

/* With the GIL held; an exception in flight is set aside and put back. */
static void
drop_export(void *managed)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *key = PyLong_FromVoidPtr(managed);
    if (key == NULL || PyDict_DelItem(exports, key) < 0) {
        PyErr_Clear();  /* already gone (or out of memory): nothing else to do */
    }
    Py_XDECREF(key);
    PyErr_Restore(type, value, tb);
}

/* Interpreter exit. A thread that asks for the GIL while CPython finalises is ended
 * on the spot (pthread_exit), and the unwinding through the consumer's C++ frames --
 * XLA calls DLPack deleters from noexcept destructors on its worker threads --
 * ends in std::terminate ("terminate called without an active exception"). So at
 * exit, before finalisation, stop_foreign_releases() sets `exiting`; from then on a
 * thread that does not hold the GIL leaves the export alone (the process is ending)
 * instead of asking for it. Calls that passed the check earlier are counted in
 * `in_flight` and finish first: stop_foreign_releases() waits for them with the GIL
 * released. Sequentially consistent atomics, so the two sides cannot both miss the
 * other's write. */
static atomic_int exiting = 0;
static atomic_int in_flight = 0;

/* Whether this thread holds the GIL. Not PyGILState_Check(): it answers 1 on every
 * thread once a subinterpreter has been created, and after Py_Finalize on 3.10/3.11. */
static int
holds_gil(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked() != NULL;  /* this thread's attached state */
#elif PY_VERSION_HEX >= 0x030C0000
    return _PyThreadState_UncheckedGet() != NULL;  /* thread-local since 3.12 */
#else
    /* The state holding the GIL, process-wide: ours only if it was made for this
     * thread. Not compared with PyGILState_GetThisThreadState(): that is the main
     * interpreter's state of this thread, and a thread inside a subinterpreter holds
     * the GIL with another one (the release then waited for the GIL it held). */
    PyThreadState *current = _PyThreadState_UncheckedGet();
    return current != NULL && current->thread_id == PyThread_get_thread_ident();
#endif
}

/* Releases by threads that hold the GIL are counted apart, in a plain integer changed
 * and read only with the GIL held: no atomic operation for them. They must be counted
 * all the same, since the owner's release may run code that drops the GIL (a weakref
 * callback, a __del__, torch freeing a source tensor), and finalisation must not start
 * while one of them waits to take it back. */
static int held_in_flight = 0;

void
hb_release(void (*drop)(void *), void *arg)
{
    if (holds_gil()) {
        /* NumPy, a dying capsule, our own imports */
        held_in_flight++;
        drop(arg);
        held_in_flight--;
        return;
    }
    atomic_fetch_add(&in_flight, 1);
    if (atomic_load(&exiting)) {
        atomic_fetch_sub(&in_flight, 1);
        return; /* the process is exiting and this thread has no GIL: leave it */
    }
    /* torch releases its tensors with the GIL dropped (THPVariable_clear): take it back
     * on this thread's own state, or on a new one for a thread Python never saw (XLA's
     * workers). */
    PyThreadState *own = PyGILState_GetThisThreadState();
    if (own != NULL) {
        PyEval_RestoreThread(own);
        drop(arg);
        PyEval_SaveThread();
    }
    else {
        PyGILState_STATE gil = PyGILState_Ensure();
        drop(arg);
        PyGILState_Release(gil);
    }
    atomic_fetch_sub(&in_flight, 1);
}

/* void (*deleter)(DLManagedTensor[Versioned] *self): any thread, GIL or not. */
static void
export_deleter(void *managed)
{
    if (managed != NULL && exports != NULL) {
        hb_release(drop_export, managed);
    }
}

static double
monotonic_ms(void)
{
#ifdef _WIN32
    return (double)GetTickCount64();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
#endif
}

static void
sleep_1ms(void)
{
#ifdef _WIN32
    Sleep(1);
#else
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
#endif
}

/* stop_foreign_releases(timeout_ms) -> deleter calls still unfinished (0 normally). */
PyObject *
hb_stop_foreign_releases(PyObject *Py_UNUSED(module), PyObject *arg)
{
    long timeout_ms = PyLong_AsLong(arg);
    if (timeout_ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    atomic_store(&exiting, 1);
    double deadline = monotonic_ms() + (double)timeout_ms;
    int left;
    for (;;) {
        /* held_in_flight is read here, with the GIL held, and only the sleep drops it */
        int held = held_in_flight > 0 ? held_in_flight : 0;
        int gilless = atomic_load(&in_flight);
        left = held + (gilless > 0 ? gilless : 0);
        if (left == 0 || monotonic_ms() >= deadline) {
            break;
        }
        Py_BEGIN_ALLOW_THREADS
        sleep_1ms();
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromLong(left);
}

#ifndef _WIN32
/* A child forked while another thread was inside the deleter inherits its count, but
 * not the thread: without this its exit would wait out the whole timeout. */
static void
forget_in_flight(void)
{
    atomic_store(&in_flight, 0);
    held_in_flight = 0;
}
#endif

/* A capsule still under our fresh name was never consumed: its deleter is ours to run. */
static void
capsule_destructor(PyObject *capsule)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    const char *name = PyCapsule_GetName(capsule);
    if (name != NULL && (name == name_v || name == name_l)) {
        void *managed = PyCapsule_GetPointer(capsule, name);
        if (managed != NULL) {
            hb_release(drop_export, managed);
        }
    }
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

PyObject *
hb_capsule_hooks(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *table, *v, *l;
    if (!PyArg_ParseTuple(args, "O!SS:capsule_hooks", &PyDict_Type, &table, &v, &l)) {
        return NULL;
    }
    if (exports != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "capsule_hooks: already installed");
        return NULL;
    }
    names = PyTuple_Pack(2, v, l);
    if (names == NULL) {
        return NULL;
    }
#ifndef _WIN32
    if (pthread_atfork(NULL, NULL, forget_in_flight) != 0) {
        Py_CLEAR(names);
        PyErr_SetString(PyExc_RuntimeError, "capsule_hooks: pthread_atfork failed");
        return NULL;
    }
#endif
    Py_INCREF(table);
    exports = table;
    name_v = PyBytes_AS_STRING(v);
    name_l = PyBytes_AS_STRING(l);
    /* Both live as long as the process: consumers may call them at any time. */
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)export_deleter),
                         PyLong_FromVoidPtr((void *)capsule_destructor));
}
