"""Python kernels that fail the ways kernel-check must report while the run goes on
(tests/CMakeLists.txt, kernel_check.python.*): the correct NumPy kernel
(plugins/python/numpy_paged_decode.py) on most cases, and on some
  crash      SIGSEGV (a read of address 0 through ctypes) on batches of more than two sequences
  hang       never returns when block_size is 1
  exception  raises ValueError on batches of more than two sequences (a run-error, traceback)
"""
import ctypes
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "numpy_paged_decode",
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins", "python", "numpy_paged_decode.py"))
_kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kernel)

KVPROOF_PLUGIN = dict(_kernel.KVPROOF_PLUGIN, name="python-planted-faults")


def crash(args):
    if args.num_seqs > 2:
        ctypes.string_at(0)
    _kernel.paged_attention(args)


def hang(args):
    while args.block_size == 1:
        pass
    _kernel.paged_attention(args)


def _check_batch(args):
    if args.num_seqs > 2:
        raise ValueError(f"planted: {args.num_seqs} sequences")


def exception(args):
    _check_batch(args)
    _kernel.paged_attention(args)


def writes_input(args):
    """Correct output, then a write into the query it was given (inputs-unchanged)."""
    _kernel.paged_attention(args)
    args.query[0, 0, 0] += 1.0
