"""How the kernel was advised to back an array's memory, from Linux's /proc/self/smaps."""

from pathlib import Path

SMAPS = Path("/proc/self/smaps")


def advice(array):
    """The `VmFlags` of the mapping that holds the middle of `array`'s data ("hg": huge pages,
    `MADV_HUGEPAGE`; NumPy advises the whole pages of a large array, not the one it starts in)."""
    address, inside = array.ctypes.data + array.nbytes // 2, False
    for line in SMAPS.read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(bound, 16) for bound in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError("no mapping holds the array")
