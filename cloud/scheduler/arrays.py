"""numpy array aliases shared by the scheduler modules.

Every node attribute lives in a column indexed by node position; these names keep
the element type visible in signatures without repeating ``npt.NDArray[...]``.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
CodeArray = npt.NDArray[np.int8]

_A = TypeVar("_A", bound=np.ndarray)


def read_only(array: _A) -> _A:
    """Freeze an array in place, so a snapshot column cannot be changed by accident."""
    array.setflags(write=False)
    return array
