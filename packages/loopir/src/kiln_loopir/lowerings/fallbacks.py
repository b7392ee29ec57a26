"""The declared aten fallbacks: ops that run as a call of the aten op (an ``ExternKernel``,
counted in ``counters["aten_fallbacks"]``), each with why. An op of an ATen graph with neither
a lowering nor a line here fails with ``MissingLowering`` naming it; a lowering that declines
some arguments (``LoweringError``) also takes the aten call."""

from __future__ import annotations

import torch

from ..lowering import aten_ops, fallback

aten = torch.ops.aten


_DECLARED = {
    "data-dependent output size (known only once the op ran)": [
        "nonzero.default", "masked_scatter.default", "_local_scalar_dense.default",
        "masked_select.default", "_unique2.default", "unique_dim.default",
        "unique_consecutive.default", "repeat_interleave.Tensor", "item.default",
    ],
    "sorting and selection: a library kernel (no sort in the loop IR)": [
        "sort.default", "sort.stable", "topk.default", "randperm.default",
    ],
    # rand, randn, randint, bernoulli, native_dropout, uniform, normal and exponential are
    # lowered (lowerings/random.py) where the codegen has philox random ops; elsewhere their
    # lowerings decline: the aten call
    "random numbers: eager's generator, so that results match eager's stream": [
        "multinomial.default", "poisson.default",
    ],
    "FFT: a library kernel": ["_fft_r2c.default", "_fft_c2r.default"],
    "index tables of a triangle (DLRM's feature interactions): the aten factory": [
        "tril_indices.default", "triu_indices.default",
    ],
    "pairwise distances and embedding bags: reductions over gathered rows, not lowered yet": [
        "_cdist_forward.default", "_pdist_forward.default", "_embedding_bag.default",
        "_embedding_bag_forward_only.default",
    ],
    "3-d pooling, bilinear sampling and upsampling of vec overloads: not lowered yet": [
        "avg_pool3d.default", "max_pool3d_with_indices.default", "grid_sampler_2d.default",
        "upsample_bilinear2d.vec", "upsample_nearest2d.vec",
    ],
    "linear algebra (factorizations, solves, decompositions): cuSOLVER/LAPACK kernels": [
        "cholesky.default", "cholesky_inverse.default", "cholesky_solve.default", "geqrf.default",
        "lu_unpack.default", "linalg_lu_factor_ex.default", "linalg_lu_solve.default",
        "linalg_matrix_exp.default", "linalg_pinv.atol_rtol_tensor", "linalg_qr.default",
        "ormqr.default", "triangular_solve.default", "_linalg_svd.default",
        "_linalg_det.default", "_linalg_slogdet.default", "linalg_inv_ex.default",
        "_linalg_eigh.default", "_linalg_solve_ex.default", "linalg_eig.default",
        "_linalg_eigvals.default", "linalg_householder_product.default",
        "linalg_cholesky_ex.default", "linalg_ldl_factor_ex.default", "linalg_lstsq.default",
        "_linalg_check_errors.default",
    ],
    "random distributions without a loop-IR random op: eager's generator": [
        "cauchy.default", "geometric.default", "log_normal.default", "normal_functional.default",
        "rrelu_with_noise_functional.default", "fractional_max_pool2d.default",
        "fractional_max_pool3d.default",
    ],
    "interpolation modes, attention and scatters not lowered yet: the aten kernel": [
        "upsample_bilinear2d.default", "upsample_bicubic2d.default", "upsample_trilinear3d.default",
        "_upsample_bilinear2d_aa.default", "_trilinear.default", "_efficient_attention_forward.default",
        "as_strided_scatter.default", "put.default", "_batch_norm_with_update_functional.default",
    ],
    "float bit manipulation without an op in the loop IR: the aten kernel": [
        "frexp.Tensor", "nextafter.default",
    ],
    "recurrent layers (LSTM/GRU on CPU decompose to oneDNN's fused layer): a library kernel": [
        "mkldnn_rnn_layer.default",
    ],
    "backward of pooling and convolution: not lowered yet (training graphs)": [
        "_adaptive_avg_pool2d_backward.default", "avg_pool2d_backward.default",
        "max_pool2d_with_indices_backward.default", "convolution_backward.default",
    ],
}

#: whole op packets (every overload), for families torch spells with many overloads
_DECLARED_PACKETS = {
    "special functions without a formula in the loop IR's ops: the aten kernel": [
        "i0", "igamma", "igammac", "mvlgamma", "special_airy_ai", "special_bessel_j0",
        "special_bessel_j1", "special_bessel_y0", "special_bessel_y1",
        "special_chebyshev_polynomial_t", "special_chebyshev_polynomial_u",
        "special_chebyshev_polynomial_v", "special_chebyshev_polynomial_w", "special_entr",
        "special_erfcx", "special_hermite_polynomial_h", "special_hermite_polynomial_he",
        "special_i0e", "special_i1", "special_i1e", "special_laguerre_polynomial_l",
        "special_legendre_polynomial_p", "special_log_ndtr", "special_modified_bessel_i0",
        "special_modified_bessel_i1", "special_modified_bessel_k0", "special_modified_bessel_k1",
        "special_ndtr", "special_ndtri", "special_scaled_modified_bessel_k0",
        "special_scaled_modified_bessel_k1", "special_shifted_chebyshev_polynomial_t",
        "special_shifted_chebyshev_polynomial_u", "special_shifted_chebyshev_polynomial_v",
        "special_shifted_chebyshev_polynomial_w", "special_spherical_bessel_j0",
        "special_xlog1py", "special_zeta",
    ],
    "order statistics, histograms and binary searches: library kernels": [
        "kthvalue", "median", "nanmedian", "mode", "histc", "bincount", "bucketize",
        "searchsorted",
    ],
}

for _reason, _names in _DECLARED.items():
    fallback(*aten_ops(*_names), reason=_reason)
for _reason, _names in _DECLARED_PACKETS.items():
    fallback(*[getattr(aten, n, None) for n in _names], reason=_reason)
