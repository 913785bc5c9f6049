"""Memory an export holds: `release_freed_memory` hands what a finished stage freed back to the system."""

import ctypes
import gc


def release_freed_memory():
    """Collects Python's garbage and hands the C heap's free pages back to the system (glibc's
    `malloc_trim`; elsewhere a garbage collection alone): TensorFlow's converter frees gigabytes
    that glibc otherwise keeps in its arenas, resident through the checks that follow."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
