"""Make Triton 3.6's CPU interpreter (TRITON_INTERPRET=1) usable with NumPy >= 2.4 loop bounds.

The interpreter holds every scalar as a 1-element array and gives tensors `__index__` =
`int(array)`, which NumPy 2.4 rejects for 1-D arrays ("only 0-dimensional arrays can be converted"),
so any `for i in range(start, end)` with a runtime bound fails.  The kernels need such loops (a
while loop would lose software pipelining on the GPU), so under the interpreter only, `__index__`
reads the single element instead.  Compiled (GPU) runs never import the interpreter.
"""

from __future__ import annotations

import os


def patch_interpreter() -> None:
    """Idempotent; a no-op unless TRITON_INTERPRET=1."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_oscar_index_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._oscar_index_fix = True
    interpreter._patch_lang_tensor = patched
