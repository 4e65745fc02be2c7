"""Reference kernels written against `xp` (NumPy; they also run on CuPy arrays).

See kernels/__init__.py for the ops and their shapes.
"""
