/*
 * _send_share: one share of a fan-out's writes, made with the GIL released for the whole share.
 *
 * Why C: the pure-Python share (``_fanout_writes._send_share``) calls os.write once per socket,
 * and each call lets go of the GIL and takes it back. With the loop's thread and the helpers all
 * sending, every return from the kernel queues for the GIL behind another thread's Python, so
 * the helpers' sends are paced by the loop's bookkeeping. Here the descriptors and buffers are
 * read under the GIL once, then every send of the share runs without it.
 *
 * The contract is _send_share's exactly: send_share(share: list[tuple[int, bytes]]) -> list[int],
 * per pair the bytes the socket took, 0 if it would block (or a signal came first), -1 on any
 * other error (the caller's transport.write meets the error again and closes the connection).
 * The bytes objects are held (a reference each) while the GIL is released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* not Linux: Python ignores SIGPIPE anyway */
#endif

typedef struct {
    int fd;
    const char *buf;
    Py_ssize_t len;
    Py_ssize_t sent;
} one_send;

static void
send_all(one_send *sends, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        ssize_t r = send(sends[i].fd, sends[i].buf, (size_t)sends[i].len, MSG_NOSIGNAL);
        if (r >= 0) {
            sends[i].sent = (Py_ssize_t)r;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            sends[i].sent = 0;
        } else {
            sends[i].sent = -1;
        }
    }
}

static PyObject *
send_share(PyObject *module, PyObject *share)
{
    (void)module;
    PyObject *seq = PySequence_Fast(share, "send_share() takes a list of (descriptor, bytes) pairs");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    one_send *sends = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(one_send));
    PyObject **held = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(PyObject *));
    PyObject *result = NULL;
    Py_ssize_t filled = 0;
    if (sends == NULL || held == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; filled < n; filled++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, filled);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "send_share() pair %zd is not a (descriptor, bytes) tuple", filled);
            goto done;
        }
        PyObject *data = PyTuple_GET_ITEM(pair, 1);
        if (!PyBytes_Check(data)) {
            PyErr_Format(PyExc_TypeError, "send_share() pair %zd: the data is %.100s, not bytes", filled,
                         Py_TYPE(data)->tp_name);
            goto done;
        }
        int fd = PyObject_AsFileDescriptor(PyTuple_GET_ITEM(pair, 0));
        if (fd < 0) {
            goto done;
        }
        Py_INCREF(data);
        held[filled] = data;
        sends[filled].fd = fd;
        sends[filled].buf = PyBytes_AS_STRING(data);
        sends[filled].len = PyBytes_GET_SIZE(data);
    }
    Py_BEGIN_ALLOW_THREADS
    send_all(sends, n);
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    if (result == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sent = PyLong_FromSsize_t(sends[i].sent);
        if (sent == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, sent);
    }
done:
    if (held != NULL) {
        for (Py_ssize_t i = 0; i < filled; i++) {
            Py_XDECREF(held[i]);
        }
    }
    PyMem_Free(held);
    PyMem_Free(sends);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"send_share", send_share, METH_O,
     "send_share(share: list[tuple[int, bytes]]) -> list[int]: each pair's bytes sent to its socket "
     "with the GIL released for the whole share; per pair the bytes taken, 0 (would block) or -1 (an error)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_send_share", "One share of a fan-out's socket writes, without the GIL.", 0, methods,
};

PyMODINIT_FUNC
PyInit__send_share(void)
{
    return PyModuleDef_Init(&module_def);
}
