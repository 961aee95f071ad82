"""Odin's bookkeeping kernels (cuda/csrc): fused cull + conflict check, seqlocked gather, in-order scatter, publish.

See :mod:`odin_nerfstudio.kernels.ops` for the ops and :mod:`odin_nerfstudio.kernels._torch_impl` for their
pure-torch reference.
"""
