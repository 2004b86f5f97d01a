/* The callgrind switch of ``attribute_instructions.py``: sys.monitoring's
 * PY_START/PY_RESUME/PY_THROW and PY_RETURN/PY_YIELD/PY_UNWIND callbacks keep
 * a stack of the frames' buckets and turn callgrind's collection on while the
 * innermost classified frame is the bucket measured, off otherwise.  Each
 * callback turns collection off first and on last, so what it costs itself
 * is not counted (a few instructions of the switch's tail).  A code object is
 * classified once, by the Python callable given to ``start``: 0 outside (the
 * HTTP client, the MCP SDK, asyncio: never counted), 1 the bucket measured,
 * 2 the plugin's other code (not counted), 3 neutral (the standard library,
 * OpenTelemetry: counted where the frame under it is). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <valgrind/callgrind.h>

static PyObject *classify_fn = NULL;
static PyObject *cache = NULL;
#define MAXD 8192
static signed char stack[MAXD];
static int depth = 0;
static int collecting = 0;

static inline int top_state(void) { return depth > 0 && depth <= MAXD ? stack[depth-1] : 0; }

static void push(PyObject *code) {
    int top = top_state();
    PyObject *key = PyLong_FromVoidPtr(code);
    PyObject *v = PyDict_GetItemWithError(cache, key);
    long c;
    if (v == NULL) {
        PyObject *r = PyObject_CallOneArg(classify_fn, code);
        if (r == NULL) { PyErr_Clear(); c = 3; } else { c = PyLong_AsLong(r); Py_DECREF(r); }
        PyObject *cv = PyLong_FromLong(c);
        PyDict_SetItem(cache, key, cv); Py_DECREF(cv);
        Py_INCREF(code);  /* keep alive: pointer stays unique */
    } else c = PyLong_AsLong(v);
    Py_DECREF(key);
    int s;
    if (c == 0) s = 0; else if (c == 1) s = 3; else if (c == 2) s = 2; else s = top;
    if (depth < MAXD) stack[depth] = s;
    depth++;
}

#define ENTER if (collecting) { CALLGRIND_TOGGLE_COLLECT; collecting = 0; }
#define LEAVE if (top_state() & 1) { CALLGRIND_TOGGLE_COLLECT; collecting = 1; } Py_RETURN_NONE;

static PyObject *on_start(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    ENTER
    push(args[0]);
    LEAVE
}
static PyObject *on_return(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    ENTER
    if (depth > 0) depth--;
    LEAVE
}

static PyObject *start(PyObject *self, PyObject *fn) {
    Py_XDECREF(classify_fn); Py_INCREF(fn); classify_fn = fn;
    if (!cache) cache = PyDict_New();
    depth = 0;
    CALLGRIND_ZERO_STATS;
    CALLGRIND_START_INSTRUMENTATION;
    Py_RETURN_NONE;
}
static PyObject *stop(PyObject *self, PyObject *name) {
    if (collecting) { CALLGRIND_TOGGLE_COLLECT; collecting = 0; }
    CALLGRIND_STOP_INSTRUMENTATION;
    CALLGRIND_DUMP_STATS_AT(PyUnicode_AsUTF8(name));
    Py_RETURN_NONE;
}
static PyMethodDef M[] = {
    {"start", start, METH_O, ""}, {"stop", stop, METH_O, ""},
    {"on_start", (PyCFunction)(void(*)(void))on_start, METH_FASTCALL, ""},
    {"on_return", (PyCFunction)(void(*)(void))on_return, METH_FASTCALL, ""},
    {NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "cgmon", NULL, -1, M};
PyMODINIT_FUNC PyInit_cgmon(void) { return PyModule_Create(&mod); }
