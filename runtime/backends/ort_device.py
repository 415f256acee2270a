"""ONNX Runtime on a GPU execution provider (CUDA, or TensorRT's): what stays in device memory, and how.

NOT RUN ON A GPU: written against ONNX Runtime's Python API (IOBinding.bind_input / bind_output with a device
address, OrtValue.ortvalue_from_shape_and_type / ortvalue_from_numpy on "cuda", data_ptr) and checked only with
a test double (tests/test_ort_device.py), which checks the calls and where each byte lives, not the GPU.

- KV caches: device OrtValues bound once (backends/ort.py).
- Shallow states: `StateStore`, one device buffer of [max_context, hidden] per shallow piece. A shallow call
  binds its `hidden` output at the rows of the call's slots, and returns a `DeviceStates` (common.py) naming
  those rows; `deep` and the adapter bind their `hidden_in` at the rows' address. No copy, in either direction.
- Attention bias: a chain's bias is all zeros, so it is bound as a view of one zero buffer per dtype, uploaded
  once and grown when a call needs more, up to ZEROS_MAX_BYTES (a longer prefill uploads zeros of its own).
  A tree's bias is built on the host and uploaded once per distinct mask: `shallow` and `deep` of a verify
  step bind the same upload. Its width follows the call's position (the zeros before the tree's root grow with
  it), so a repeated tree shape at a new position is a new upload of n x width elements: ONNX Runtime's Python
  API has no device-side copy into part of a buffer that would let the tree's rows be patched into a resident
  one.
- Everything else a call needs goes in as host arrays (token ids, positions, sequence lengths, logits_to_keep:
  O(tokens) bytes), and only the results sampling reads come back: the kept logits rows, and a draft head's
  top_token / top_prob.

ONNX Runtime synchronizes the provider's stream at the end of every run (run option
`disable_synchronize_execution_providers` is "0" by default), so rows a shallow run wrote are complete when
another session's run reads them, even from another thread (PEARL).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import onnxruntime as ort

from ..errors import RunError, SpecExportError
from .common import DeviceStates, TreeMask, attention_bias

DEVICE_ID = 0
MASKS_KEPT = 4  # uploaded tree masks kept per device: a verify step's two pieces, and a few sessions' worth
# the most a zero buffer may grow to: enough for a 2,048-token prefill at fp32 (2,048 x 2,048 x 4 bytes); a call
# that needs more (a longer prefill) gets zeros uploaded for it alone rather than holding them for good
ZEROS_MAX_BYTES = 16 << 20


class StateStore:
    """One device buffer of `rows` shallow states: row p holds the state of cache slot p."""

    def __init__(self, device: str, rows: int, hidden: int, dtype: str) -> None:
        self.device, self.rows, self.hidden, self.dtype = device, rows, hidden, np.dtype(dtype)
        self.row_bytes = hidden * self.dtype.itemsize
        self.value = ort.OrtValue.ortvalue_from_shape_and_type([1, rows, hidden], self.dtype, device, DEVICE_ID)
        self.ptr = self.value.data_ptr()

    def bind_output(self, binding, name: str, start: int, n: int) -> DeviceStates:
        """Bind output `name` at rows [start, start + n) and return them."""
        if start + n > self.rows:
            raise RunError(f"positions {start}..{start + n - 1} run past the context of {self.rows} slots")
        states = DeviceStates(self, start, n)
        binding.bind_output(name, self.device, DEVICE_ID, self.dtype, [1, n, self.hidden], states.ptr)
        return states


def bind_states(binding, name: str, states: DeviceStates, device: str) -> None:
    """Bind input `name` to device states by address (no copy)."""
    store = states.store
    if store.device != device:
        raise SpecExportError(f"shallow states on {store.device} cannot feed a piece on {device or 'the CPU'};"
                              " open every piece on the same execution provider")
    binding.bind_input(name, device, DEVICE_ID, store.dtype, list(states.shape), states.ptr)


class DeviceBiases:
    """The `attention_bias` inputs of every piece on one device (see the module)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.lock = threading.Lock()
        self.zeros: dict[np.dtype, ort.OrtValue] = {}
        self.masks: OrderedDict[tuple, ort.OrtValue] = OrderedDict()

    def value(self, start: int, n: int, width: int, dtype: str, tree: TreeMask | None) -> tuple[ort.OrtValue, bool]:
        """(device value holding the bias, whether it is a zero buffer to bind as a view)."""
        dt = np.dtype(dtype)
        with self.lock:
            if tree is None:
                zeros = self.zeros.get(dt)
                if zeros is None or zeros.shape()[0] < n * width:  # grown by doubling: rare after the prefill
                    size = max(n * width, 2 * (zeros.shape()[0] if zeros is not None else 0))
                    size = min(size, max(n * width, ZEROS_MAX_BYTES // dt.itemsize))
                    zeros = ort.OrtValue.ortvalue_from_numpy(np.zeros(size, dt), self.device, DEVICE_ID)
                    if size * dt.itemsize <= ZEROS_MAX_BYTES:
                        self.zeros[dt] = zeros
                return zeros, True
            key = (dt.str, start, n, width, tree.base, tree.visible.shape, tree.visible.tobytes())
            mask = self.masks.get(key)
            if mask is None:
                mask = ort.OrtValue.ortvalue_from_numpy(attention_bias(start, n, width, dtype, tree), self.device,
                                                        DEVICE_ID)
                self.masks[key] = mask
                if len(self.masks) > MASKS_KEPT:
                    self.masks.popitem(last=False)
            else:
                self.masks.move_to_end(key)
            return mask, False

    def bind(self, binding, name: str, start: int, n: int, width: int, dtype: str,
             tree: TreeMask | None) -> ort.OrtValue:
        """Bind input `name`; returns the device value, which the caller keeps until its run is over (a view
        bound by address does not keep its buffer alive, and the buffer may be replaced when it grows)."""
        value, is_zeros = self.value(start, n, width, dtype, tree)
        if is_zeros:
            binding.bind_input(name, self.device, DEVICE_ID, np.dtype(dtype), [1, 1, n, width], value.data_ptr())
        else:
            binding.bind_ortvalue_input(name, value)
        return value


_biases: dict[str, DeviceBiases] = {}
_biases_lock = threading.Lock()


def device_biases(device: str) -> DeviceBiases:
    """The process's DeviceBiases for `device`, shared by every piece on it (so a verify step's shallow and
    deep bind one upload of its tree mask)."""
    with _biases_lock:
        if device not in _biases:
            _biases[device] = DeviceBiases(device)
        return _biases[device]
