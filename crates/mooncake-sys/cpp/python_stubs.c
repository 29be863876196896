/*
 * Python C-API stand-ins for loading the PyPI wheel's engine.so without
 * libpython.
 *
 * engine.so is a pybind11 extension module: besides the C++ class
 * mooncake::TransferEngine (which the shim drives), it references the
 * Python C API symbols below. None of them is reached on the transfer path
 * (they serve the Python bindings only), but the dynamic loader must bind
 * every undefined symbol of a library it loads, so this file defines each
 * one: functions that report their name and abort, and data objects as
 * zeroed storage. Linking them into the executable (they come from the
 * same static library as the shim, and the shim references
 * kvc_python_stubs_anchor so the linker keeps this object) exports them
 * to engine.so.
 *
 * The list is the set of undefined Py* symbols of engine.so in
 * mooncake-transfer-engine-non-cuda 0.3.13.post1 and in the CUDA 12 wheel
 * mooncake-transfer-engine 0.3.13.post1 (which adds PyBool_Type,
 * PyLong_Type, PyInterpreterState_Get and PyInterpreterState_GetDict)
 * (`readelf --dyn-syms -W engine.so | awk '$7=="UND" && $8 ~ /Py/'`).
 * A wheel needing more fails at link time with the missing name.
 */
#include <stdio.h>
#include <stdlib.h>

void kvc_python_stubs_anchor(void) {}

static void kvc_python_stub_called(const char *name) {
    fprintf(stderr,
            "mooncake-sys: engine.so called the Python C API (%s) outside "
            "Python; this path is not supported by kvc\n",
            name);
    abort();
}

#define KVC_PY_FN(name) \
    void name(void) { kvc_python_stub_called(#name); }
/* Type objects, exception pointers and the singletons: zeroed storage that
 * is larger than any of them and suitably aligned. */
#define KVC_PY_DATA(name) _Alignas(16) unsigned char name[512];

KVC_PY_DATA(PyBaseObject_Type)
KVC_PY_DATA(PyBool_Type)
KVC_PY_DATA(PyByteArray_Type)
KVC_PY_DATA(PyCFunction_Type)
KVC_PY_DATA(PyCapsule_Type)
KVC_PY_DATA(PyDict_Type)
KVC_PY_DATA(PyExc_BufferError)
KVC_PY_DATA(PyExc_FutureWarning)
KVC_PY_DATA(PyExc_ImportError)
KVC_PY_DATA(PyExc_IndexError)
KVC_PY_DATA(PyExc_MemoryError)
KVC_PY_DATA(PyExc_OverflowError)
KVC_PY_DATA(PyExc_RuntimeError)
KVC_PY_DATA(PyExc_SystemError)
KVC_PY_DATA(PyExc_TypeError)
KVC_PY_DATA(PyExc_ValueError)
KVC_PY_DATA(PyFloat_Type)
KVC_PY_DATA(PyInstanceMethod_Type)
KVC_PY_DATA(PyLong_Type)
KVC_PY_DATA(PyMemoryView_Type)
KVC_PY_DATA(PyMethod_Type)
KVC_PY_DATA(PyModule_Type)
KVC_PY_DATA(PyProperty_Type)
KVC_PY_DATA(PyStaticMethod_Type)
KVC_PY_DATA(PyType_Type)
KVC_PY_DATA(_Py_FalseStruct)
KVC_PY_DATA(_Py_NoneStruct)
KVC_PY_DATA(_Py_NotImplementedStruct)
KVC_PY_DATA(_Py_TrueStruct)

KVC_PY_FN(PyBuffer_Release)
KVC_PY_FN(PyByteArray_AsString)
KVC_PY_FN(PyByteArray_Size)
KVC_PY_FN(PyBytes_AsString)
KVC_PY_FN(PyBytes_AsStringAndSize)
KVC_PY_FN(PyBytes_FromString)
KVC_PY_FN(PyBytes_FromStringAndSize)
KVC_PY_FN(PyBytes_Size)
KVC_PY_FN(PyCMethod_New)
KVC_PY_FN(PyCallable_Check)
KVC_PY_FN(PyCapsule_GetContext)
KVC_PY_FN(PyCapsule_GetName)
KVC_PY_FN(PyCapsule_GetPointer)
KVC_PY_FN(PyCapsule_New)
KVC_PY_FN(PyCapsule_SetContext)
KVC_PY_FN(PyCapsule_SetPointer)
KVC_PY_FN(PyDict_Contains)
KVC_PY_FN(PyDict_Copy)
KVC_PY_FN(PyDict_DelItemString)
KVC_PY_FN(PyDict_GetItemWithError)
KVC_PY_FN(PyDict_New)
KVC_PY_FN(PyInterpreterState_Get)
KVC_PY_FN(PyInterpreterState_GetDict)
KVC_PY_FN(PyDict_Next)
KVC_PY_FN(PyDict_Size)
KVC_PY_FN(PyErr_Clear)
KVC_PY_FN(PyErr_Fetch)
KVC_PY_FN(PyErr_Format)
KVC_PY_FN(PyErr_NormalizeException)
KVC_PY_FN(PyErr_Occurred)
KVC_PY_FN(PyErr_Restore)
KVC_PY_FN(PyErr_SetString)
KVC_PY_FN(PyErr_WarnEx)
KVC_PY_FN(PyErr_WriteUnraisable)
KVC_PY_FN(PyEval_AcquireThread)
KVC_PY_FN(PyEval_GetBuiltins)
KVC_PY_FN(PyEval_RestoreThread)
KVC_PY_FN(PyEval_SaveThread)
KVC_PY_FN(PyException_SetCause)
KVC_PY_FN(PyException_SetContext)
KVC_PY_FN(PyException_SetTraceback)
KVC_PY_FN(PyFrame_GetBack)
KVC_PY_FN(PyFrame_GetCode)
KVC_PY_FN(PyFrame_GetLineNumber)
KVC_PY_FN(PyGILState_Check)
KVC_PY_FN(PyGILState_Ensure)
KVC_PY_FN(PyGILState_GetThisThreadState)
KVC_PY_FN(PyGILState_Release)
KVC_PY_FN(PyImport_ImportModule)
KVC_PY_FN(PyIndex_Check)
KVC_PY_FN(PyInstanceMethod_New)
KVC_PY_FN(PyList_GetItem)
KVC_PY_FN(PyList_New)
KVC_PY_FN(PyList_Size)
KVC_PY_FN(PyLong_AsLong)
KVC_PY_FN(PyLong_AsUnsignedLong)
KVC_PY_FN(PyLong_FromLong)
KVC_PY_FN(PyLong_FromSize_t)
KVC_PY_FN(PyLong_FromSsize_t)
KVC_PY_FN(PyMem_Calloc)
KVC_PY_FN(PyMem_Free)
KVC_PY_FN(PyMemoryView_FromBuffer)
KVC_PY_FN(PyMemoryView_FromMemory)
KVC_PY_FN(PyMemoryView_FromObject)
KVC_PY_FN(PyModule_AddObject)
KVC_PY_FN(PyModule_Create2)
KVC_PY_FN(PyNumber_And)
KVC_PY_FN(PyNumber_Check)
KVC_PY_FN(PyNumber_Invert)
KVC_PY_FN(PyNumber_Long)
KVC_PY_FN(PyNumber_Or)
KVC_PY_FN(PyNumber_Xor)
KVC_PY_FN(PyObject_CallFunctionObjArgs)
KVC_PY_FN(PyObject_CallObject)
KVC_PY_FN(PyObject_ClearWeakRefs)
KVC_PY_FN(PyObject_GC_UnTrack)
KVC_PY_FN(PyObject_GenericGetDict)
KVC_PY_FN(PyObject_GenericSetDict)
KVC_PY_FN(PyObject_GetAttr)
KVC_PY_FN(PyObject_GetAttrString)
KVC_PY_FN(PyObject_GetItem)
KVC_PY_FN(PyObject_HasAttrString)
KVC_PY_FN(PyObject_IsInstance)
KVC_PY_FN(PyObject_Malloc)
KVC_PY_FN(PyObject_Repr)
KVC_PY_FN(PyObject_RichCompareBool)
KVC_PY_FN(PyObject_SetAttr)
KVC_PY_FN(PyObject_SetAttrString)
KVC_PY_FN(PyObject_SetItem)
KVC_PY_FN(PyObject_Str)
KVC_PY_FN(PySequence_Check)
KVC_PY_FN(PySequence_GetItem)
KVC_PY_FN(PySequence_Size)
KVC_PY_FN(PySequence_Tuple)
KVC_PY_FN(PyStaticMethod_New)
KVC_PY_FN(PyThreadState_Clear)
KVC_PY_FN(PyThreadState_DeleteCurrent)
KVC_PY_FN(PyThreadState_Get)
KVC_PY_FN(PyThreadState_New)
KVC_PY_FN(PyThread_tss_alloc)
KVC_PY_FN(PyThread_tss_create)
KVC_PY_FN(PyThread_tss_get)
KVC_PY_FN(PyThread_tss_set)
KVC_PY_FN(PyTuple_GetItem)
KVC_PY_FN(PyTuple_New)
KVC_PY_FN(PyTuple_SetItem)
KVC_PY_FN(PyTuple_Size)
KVC_PY_FN(PyType_IsSubtype)
KVC_PY_FN(PyType_Ready)
KVC_PY_FN(PyUnicode_AsEncodedString)
KVC_PY_FN(PyUnicode_AsUTF8AndSize)
KVC_PY_FN(PyUnicode_AsUTF8String)
KVC_PY_FN(PyUnicode_DecodeUTF8)
KVC_PY_FN(PyUnicode_FromFormat)
KVC_PY_FN(PyUnicode_FromString)
KVC_PY_FN(PyUnicode_FromStringAndSize)
KVC_PY_FN(PyWeakref_NewRef)
KVC_PY_FN(Py_GetVersion)
KVC_PY_FN(_PyObject_GetDictPtr)
KVC_PY_FN(_PyThreadState_UncheckedGet)
KVC_PY_FN(_PyType_Lookup)
KVC_PY_FN(_Py_Dealloc)
