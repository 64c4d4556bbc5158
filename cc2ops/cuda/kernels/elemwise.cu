<%doc>
Elementwise kernels generated from PyTensor scalar ops (GpuElemwise).

Constants
---------
name : str
    Kernel name (elemwise_<scalar>_<hash8>_c_<dt> or ..._nd<k>_<dt>).
in_dtypes, out_dtypes : str
    Comma-separated numpy dtype names of the inputs and outputs.
body : str
    The scalar C code: reads cc2_in<k>, writes cc2_out<k> (PyTensor's own
    ``c_code`` of the scalar op, host-only branches removed).
support : str
    The scalar op's support code (macros, or device functions written for
    PyTensor's WITHIN_KERNEL convention).
ndim : int
    0: flat (contiguous) path; k >= 1: strided path over k collapsed dims.
pattern : str
    Flat path only: one letter per operand (inputs, then outputs): 'c'
    indexes element i, 's' element 0 (a broadcast input). Ignored when ndim > 0.
wide : bool
    Strided path: peel coordinates with 64-bit division (more than 2^31 - 1
    elements, or an extent that large); otherwise 32-bit.

Layout of the strided path's arguments: per operand (inputs, then outputs)
the pointer and ndim strides in elements (0 on broadcast dims, may be
negative); then the ndim extents n0..n<k-1> (outermost first) and the
element count. The flat path takes the pointers and the element count.

The def npy_env() (the numpy C types and macros PyTensor scalar code needs)
is also used by reduction.cu through a Mako namespace.
Outputs may alias inputs (in place), so no pointer is __restrict__ and inputs
are read with plain loads; every element is read and written by one thread.
</%doc>
<%def name="npy_env()">
// ---- the numpy / PyTensor scalar C environment, on the device -------------
// PyTensor's scalar c_code guards its host-only error paths with KERNEL and
// marks device-ready support functions with WITHIN_KERNEL (as Theano's GPU
// back ends did).
#define KERNEL 1
#define WITHIN_KERNEL __device__ __forceinline__
typedef unsigned char npy_bool;
typedef signed char npy_int8;
typedef unsigned char npy_uint8;
typedef short npy_int16;
typedef unsigned short npy_uint16;
typedef int npy_int32;
typedef unsigned int npy_uint32;
typedef long long npy_int64;
typedef unsigned long long npy_uint64;
typedef float npy_float32;
typedef double npy_float64;
typedef long long npy_intp;
typedef int npy_int;
typedef float npy_float;
typedef double npy_double;
#define NPY_TRUE 1
#define NPY_FALSE 0
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#define NPY_INFINITY INFINITY
#define NPY_NAN NAN
#define NPY_PZERO 0.0
#define NPY_NZERO (-0.0)
#define NPY_PI 3.141592653589793238462643383279502884
#define NPY_E 2.718281828459045235360287471352662498
#define NPY_MAX_INT8 127
#define NPY_MIN_INT8 (-128)
#define NPY_MAX_UINT8 255
#define NPY_MAX_INT16 32767
#define NPY_MIN_INT16 (-32768)
#define NPY_MAX_UINT16 65535
#define NPY_MAX_INT32 2147483647
#define NPY_MIN_INT32 (-NPY_MAX_INT32 - 1)
#define NPY_MAX_UINT32 4294967295U
#define NPY_MAX_INT64 9223372036854775807LL
#define NPY_MIN_INT64 (-NPY_MAX_INT64 - 1LL)
#define NPY_MAX_UINT64 18446744073709551615ULL
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#ifndef M_LN2
#define M_LN2 0.69314718055994530942
#endif
#define npy_isnan(x) isnan(x)
#define npy_isinf(x) isinf(x)
#define npy_isfinite(x) isfinite(x)
#define npy_signbit(x) signbit(x)
#define npy_rint(x) rint(x)
#define npy_floor(x) floor(x)
#define npy_ceil(x) ceil(x)
#define npy_fabs(x) fabs(x)
#define npy_sqrt(x) sqrt(x)
#define npy_exp(x) exp(x)
#define npy_log(x) log(x)
#define npy_log1p(x) log1p(x)
#define npy_expm1(x) expm1(x)
</%def>
<%include file="common.cuh"/>
<%
in_types = [t for t in in_dtypes.split(",") if t]
out_types = [t for t in out_dtypes.split(",") if t]
nin = len(in_types)
nout = len(out_types)
nops = nin + nout
ctype = lambda d: "npy_" + d
%>
${npy_env()}
// ---- support code of the scalar op ----------------------------------------
${support}

// ---- the kernel ------------------------------------------------------------
% if ndim == 0:
extern "C" __global__ void ${name}(
% for k in range(nin):
    const ${ctype(in_types[k])}* p_in${k},
% endfor
% for k in range(nout):
    ${ctype(out_types[k])}* p_out${k},
% endfor
    index_t n)
{
    CC2_GRID_STRIDE_LOOP(cc2_i, n) {
% for k in range(nin):
        const ${ctype(in_types[k])} cc2_in${k} = p_in${k}[${"cc2_i" if pattern[k] == "c" else "0"}];
% endfor
% for k in range(nout):
        ${ctype(out_types[k])} cc2_out${k};
% endfor
        {
${body}
        }
% for k in range(nout):
        p_out${k}[cc2_i] = cc2_out${k};
% endfor
    }
}
% else:
<% idx = "index_t" if wide else "unsigned int" %>
extern "C" __global__ void ${name}(
% for k in range(nin):
    const ${ctype(in_types[k])}* p_in${k},
    ${", ".join("index_t s%d_%d" % (k, d) for d in range(ndim))},
% endfor
% for k in range(nout):
    ${ctype(out_types[k])}* p_out${k},
    ${", ".join("index_t s%d_%d" % (nin + k, d) for d in range(ndim))},
% endfor
    ${", ".join("index_t n%d" % d for d in range(ndim))},
    index_t n)
{
    CC2_GRID_STRIDE_LOOP(cc2_i, n) {
        // peel the output's C-order index into per-operand offsets, innermost first
        ${idx} cc2_rest = (${idx})cc2_i;
% for k in range(nops):
        index_t cc2_off${k} = 0;
% endfor
% for d in reversed(range(ndim)):
        {
% if d > 0:
            const ${idx} cc2_q = cc2_rest / (${idx})n${d};
            const index_t cc2_c = (index_t)(cc2_rest - cc2_q * (${idx})n${d});
            cc2_rest = cc2_q;
% else:
            const index_t cc2_c = (index_t)cc2_rest;
% endif
% for k in range(nops):
            cc2_off${k} += cc2_c * s${k}_${d};
% endfor
        }
% endfor
% for k in range(nin):
        const ${ctype(in_types[k])} cc2_in${k} = p_in${k}[cc2_off${k}];
% endfor
% for k in range(nout):
        ${ctype(out_types[k])} cc2_out${k};
% endfor
        {
${body}
        }
% for k in range(nout):
        p_out${k}[cc2_off${nin + k}] = cc2_out${k};
% endfor
    }
}
% endif
