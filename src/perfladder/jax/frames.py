"""Where a compiled XLA op came from: the Python stack JAX records for every op of a module
(the FileNames / FunctionNames / FileLocations / StackFrames tables of its HLO text, each op's
``stack_frame_id``).

Two questions are asked of a stack:

* ``optimizer(frame_id)`` -- was the op traced from optax or the framework's optimizer wrapper?
  XLA fuses the AdamW update into loop fusions whose names say nothing.
* ``part(frame_id)`` -- which part of the GPT traced it (``PARTS``): XLA splits a LayerNorm into
  a reduce fusion and loop fusions, fuses the residual add into whichever is nearest, and names
  FC1's bias + GELU ``loop_add_multiply_fusion``: by what they hold, half of every LayerNorm
  would count as elementwise and no GELU would be found. The innermost frame that names a part
  decides (a ``Linear`` inside the FFN is the linear layer, not the GELU around it).
"""
from __future__ import annotations

import re

# Python frames that make an op part of the optimizer update: optax (minus its losses, which
# the loss function calls), and the framework's optimizer wrapper (flax nnx Optimizer.update).
OPTIMIZER_FILES = re.compile(r"[/\\]optax[/\\](?!losses[/\\]|_src[/\\]loss\.py)")
OPTIMIZER_FUNCTIONS = re.compile(r"(^|\.)(Optimizer\.(update|step)|apply_updates)$")

# (part, the functions that are it): flax's modules and perfladder's own model and kernels
# (perfladder/jax/model.py, perfladder/jax/fused/); the first part whose pattern matches a
# frame's function name, innermost frame first, is the op's part.
PARTS: tuple[tuple[str, re.Pattern], ...] = (
    ("LayerNorm", re.compile(r"^(LayerNorm\.__call__|fused_norm|add_layer_norm\w*)$")),
    ("RoPE", re.compile(r"^(rope|rope_tables)$")),
    ("linear", re.compile(r"^(Linear\.__call__|Embed\.attend|matmul_and_bias)$")),
    ("GELU", re.compile(r"^(FFN\.__call__|ffn|gelu_bias\w*|_gelu\w*)$")),
    ("attention", re.compile(r"^CausalAttention\.__call__$")),
    ("residual add", re.compile(r"^(Block\.__call__|Block\.forward_addnorm|_run_block\w*)$")),
    ("embedding", re.compile(r"^GPT\.(embed|_onehot_lookup)$")),
    ("loss", re.compile(r"^(loss_fn|softmax_cross_entropy\w*)$")),
)
PART_NAMES = tuple(p for p, _ in PARTS)
# the parts whose elementwise fusions belong with the reductions: a LayerNorm's normalising
# passes and the residual add fused into it (as inductor's add+LayerNorm kernels are)
NORM_PARTS = ("LayerNorm", "residual add")
# the parts whose passes are the roofline's elementwise rows: XLA fuses GELU's backward into the
# reduce that sums FC1's bias gradient (one kernel reads h and dg, writes dh and the sums), so
# the fusion's root is the Linear's reduce while its work is GELU's
ELEMENTWISE_PARTS = ("GELU", "RoPE")


class Frames:
    """The stack tables of one HLO module's text."""

    SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")

    def __init__(self, text: str):
        tables: dict[str, dict[int, str]] = {k: {} for k in self.SECTIONS}
        cur = None
        for line in text.splitlines():
            if line in tables:                    # an unindented section title
                cur = tables[line]
                continue
            idx, _, val = line.strip().partition(" ")
            if cur is None or not idx.isdigit():
                cur = None
                continue
            cur[int(idx)] = val.strip()
        num = lambda s: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", s)}  # noqa: E731
        self.files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
        self.funcs = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
        self.locs = {k: num(v) for k, v in tables["FileLocations"].items()}
        self.frames = {k: num(v) for k, v in tables["StackFrames"].items()}
        # Some XLA versions print parent ids shifted by one (a root frame then names itself as
        # its parent); a frame can never be its own parent, so that tells the layouts apart.
        self.shift = int(any(f.get("parent_frame_id") == k for k, f in self.frames.items()))
        self._optimizer: dict[int, bool] = {}
        self._part: dict[int, str | None] = {}

    def stack(self, frame_id: int):
        """``(file, function)`` of each frame of ``frame_id``'s stack, innermost first."""
        seen, fid = set(), frame_id
        while fid and fid in self.frames and fid not in seen:
            seen.add(fid)
            loc = self.locs.get(self.frames[fid].get("file_location_id", 0), {})
            yield (self.files.get(loc.get("file_name_id", 0), ""),
                   self.funcs.get(loc.get("function_name_id", 0), ""))
            fid = self.frames[fid].get("parent_frame_id", 0) - self.shift

    def optimizer(self, frame_id: int) -> bool:
        """Does the Python stack of ``frame_id`` pass through optax / ``Optimizer.update``?"""
        if frame_id not in self._optimizer:
            self._optimizer[frame_id] = any(
                OPTIMIZER_FILES.search(file) or OPTIMIZER_FUNCTIONS.search(func)
                for file, func in self.stack(frame_id))
        return self._optimizer[frame_id]

    def part(self, frame_id: int) -> str | None:
        """The part of the GPT (``PART_NAMES``) the innermost recognised frame names; ``None``
        where no frame does (the optimizer, code outside the model)."""
        if frame_id not in self._part:
            self._part[frame_id] = next((part for _, func in self.stack(frame_id)
                                         for part, pattern in PARTS if pattern.match(func)), None)
        return self._part[frame_id]
