/* Time at a Python program's exit, as a real GPU's work would have given it.
 *
 * On the fake GPU kernels take no time, so a Python program can reach the end of its script
 * within microseconds of its last backward. PyTorch 2.15's autograd worker thread may then
 * still hold the last reference to the finished graph task, whose thread-local state keeps a
 * Python object: its destructor waits for the GIL, which the main thread holds until the
 * interpreter is finalizing, and a thread that asks for the GIL then is ended by
 * pthread_exit inside a noexcept destructor: std::terminate, "terminate called without an
 * active exception", exit status 134 (gdb: PyThread_exit_thread under ~ThreadLocalState on
 * pt_autograd_0). Measured on this project's 2-core machine with the fakes alone: 5 to 7 runs
 * in 12 of a Linear layer's forward, backward and exit; 0 in 12 when the script sleeps 2 ms
 * after the backward. On a real GPU the last kernels' time passes first (a synchronize or a
 * copy waits for them, and a thread waiting longer than the 5 ms switch interval is handed the
 * GIL), so the worker lets go in time.
 *
 * So in a Python process the fake driver registers one `atexit` callback, time.sleep(0.02),
 * when it first runs on a thread that holds the GIL (cuInit or a primary context's retain,
 * which torch makes while initialising CUDA): Python runs it before finalizing, with the GIL
 * released, and the worker finishes. Nothing else of the program changes; a process that is
 * not Python, or calls the driver only from threads without the GIL, gets nothing.
 * VRAMSHIM_FAKEGPU_EXIT_GRACE=0 turns it off. */
#include "driver.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* Seconds the callback sleeps. */
#define GRACE_SECONDS 0.02

typedef struct py_object py_object;

void fg_python_exit_grace(void)
{
    /* 0: not tried yet; 1: done or not to be done. */
    static int settled;
    if (__atomic_load_n(&settled, __ATOMIC_ACQUIRE))
        return;
    /* Looked up once (a racing first lookup finds the same addresses). */
    static int (*is_initialized)(void), (*holds_gil)(void);
    if (!is_initialized || !holds_gil) {
        is_initialized = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_IsInitialized");
        holds_gil = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Check");
    }
    const char *setting = getenv("VRAMSHIM_FAKEGPU_EXIT_GRACE");
    if ((setting && !strcmp(setting, "0")) || !is_initialized || !holds_gil) {
        __atomic_store_n(&settled, 1, __ATOMIC_RELEASE);
        return;
    }
    /* Only with the GIL held: asking for it here could wait on a thread that waits on us. */
    if (!is_initialized() || !holds_gil())
        return;
    /* Threads holding the GIL run one at a time: no other can be between the check and this. */
    if (__atomic_exchange_n(&settled, 1, __ATOMIC_ACQ_REL))
        return;
    py_object *(*import)(const char *) =
        (py_object * (*)(const char *)) dlsym(RTLD_DEFAULT, "PyImport_ImportModule");
    py_object *(*attribute)(py_object *, const char *) =
        (py_object * (*)(py_object *, const char *)) dlsym(RTLD_DEFAULT, "PyObject_GetAttrString");
    py_object *(*call_method)(py_object *, const char *, const char *, ...) =
        (py_object * (*)(py_object *, const char *, const char *, ...))
            dlsym(RTLD_DEFAULT, "PyObject_CallMethod");
    void (*decref)(py_object *) = (void (*)(py_object *))dlsym(RTLD_DEFAULT, "Py_DecRef");
    void (*fetch)(py_object **, py_object **, py_object **) =
        (void (*)(py_object **, py_object **, py_object **))dlsym(RTLD_DEFAULT, "PyErr_Fetch");
    void (*restore)(py_object *, py_object *, py_object *) =
        (void (*)(py_object *, py_object *, py_object *))dlsym(RTLD_DEFAULT, "PyErr_Restore");
    if (!import || !attribute || !call_method || !decref || !fetch || !restore)
        return;
    /* Whatever exception the caller has pending stays pending; ours are dropped. */
    py_object *type, *value, *traceback;
    fetch(&type, &value, &traceback);
    py_object *atexit_module = import("atexit");
    py_object *time_module = atexit_module ? import("time") : NULL;
    py_object *sleep = time_module ? attribute(time_module, "sleep") : NULL;
    py_object *registered =
        sleep ? call_method(atexit_module, "register", "Od", sleep, GRACE_SECONDS) : NULL;
    decref(registered);
    decref(sleep);
    decref(time_module);
    decref(atexit_module);
    restore(type, value, traceback);
}
