"""Categories of the ops of a compiled XLA module from its HLO text (what a fusion holds;
which Python code it came from). XLA's own names do not say whether a fusion holds a dot, a
reduction or the AdamW update; the module text does.
"""
from __future__ import annotations

import re


# -- HLO text: what a compiled op contains --------------------------------------------------------
_MATMUL_OPS = {"dot", "convolution", "ragged-dot", "scaled-dot"}
_REDUCE_OPS = {"reduce", "reduce-window", "select-and-scatter"}
_COLLECTIVE_OPS = {"all-reduce", "all-reduce-start", "all-reduce-done", "all-gather",
                   "all-gather-start", "all-gather-done", "reduce-scatter", "all-to-all",
                   "ragged-all-to-all", "collective-permute", "collective-permute-start",
                   "collective-permute-done", "collective-broadcast", "send", "recv",
                   "send-done", "recv-done"}
# no arithmetic: a fusion of only these moves (or casts) data
_DATA_OPS = {"parameter", "constant", "copy", "copy-start", "copy-done", "transpose", "bitcast",
             "bitcast-convert", "broadcast", "reshape", "slice", "dynamic-slice",
             "dynamic-update-slice", "concatenate", "pad", "reverse", "tuple",
             "get-tuple-element", "iota", "convert"}
_CONTROL_OPS = {"fusion", "call", "while", "conditional", "async-start", "async-done",
                "async-update"}
_ATTN_TARGET = re.compile(r"fmha|flash|attention|sdpa|splash", re.IGNORECASE)
_MATMUL_TARGET = re.compile(r"gemm|matmul|cublas|\$dot|dot_general", re.IGNORECASE)
_COLLECTIVE_TARGET = re.compile(r"nccl|all[-_]?reduce|all[-_]?gather", re.IGNORECASE)
# Python frames that make an op part of the optimizer update: optax (minus its losses, which
# the loss function calls), and the framework's optimizer wrapper (flax nnx Optimizer.update).
OPTIMIZER_FILES = re.compile(r"[/\\]optax[/\\](?!losses[/\\]|_src[/\\]loss\.py)")
OPTIMIZER_FUNCTIONS = re.compile(r"(^|\.)(Optimizer\.(update|step)|apply_updates)$")

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(]+)\s*(\(.*)?\{\s*$")
_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-]*)\(")
_TARGET = re.compile(r'custom_call_target="(?P<t>[^"]*)"')
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_SRC = re.compile(r'source_file="(?P<f>[^"]*)"')
_TOKEN = re.compile(r"[\w.\-$]+")


def _opcode(rest: str) -> str | None:
    """The opcode after ``name = <type>``; the type may be a parenthesised tuple."""
    i = 0
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        i += 1
    else:
        i = rest.find(" ")
        if i < 0:
            return None
    m = _OPCODE.match(rest, i)
    return m.group("op") if m else None


class _Frames:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables of an HLO dump, and
    the question asked of them: was this op traced from optimizer code?"""

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
        self._memo: dict[int, bool] = {}

    def optimizer(self, frame_id: int) -> bool:
        """Does the Python stack of ``frame_id`` pass through optax / ``Optimizer.update``?"""
        if frame_id in self._memo:
            return self._memo[frame_id]
        seen, fid, hit = set(), frame_id, False
        while fid and fid in self.frames and fid not in seen:
            seen.add(fid)
            loc = self.locs.get(self.frames[fid].get("file_location_id", 0), {})
            if (OPTIMIZER_FILES.search(self.files.get(loc.get("file_name_id", 0), ""))
                    or OPTIMIZER_FUNCTIONS.search(self.funcs.get(loc.get("function_name_id", 0), ""))):
                hit = True
                break
            fid = self.frames[fid].get("parent_frame_id", 0) - self.shift
        self._memo[frame_id] = hit
        return hit


def hlo_module_name(hlo_text: str) -> str | None:
    m = re.search(r"^HloModule\s+([^\s,]+)", hlo_text, re.MULTILINE)
    return m.group(1) if m else None


def hlo_op_categories(hlo_text: str) -> dict[str, str]:
    """``{op name: category}`` for every instruction of a compiled module's HLO text
    (``jitted.lower(...).compile().as_text()``).

    An op's category comes from what it contains (its own opcode plus, recursively, the
    computations it calls -- a fusion's body), in this order: collective; optimizer (the op
    was traced from optax / ``Optimizer.update``, read from the module's stack-frame tables or
    ``source_file`` metadata); attention (a fused-attention custom call); matmul (a dot or
    convolution, or a cuBLAS custom call); reduction/norm (a reduce); memcpy/memset (only
    data movement: copies, transposes, broadcasts, casts); elementwise (anything else
    arithmetic); an unknown custom call is 'other'.
    """
    if not isinstance(hlo_text, str) or "HloModule" not in hlo_text:
        raise ValueError("hlo_text must be the text of a compiled XLA module (it starts with "
                         "'HloModule'); get it with jitted.lower(*args).compile().as_text()")
    comps: dict[str, list[tuple[str, str, str]]] = {}      # computation -> [(name, opcode, line)]
    cur = None
    for line in hlo_text.splitlines():
        if not line.startswith((" ", "\t")):
            m = _HEADER.match(line)
            cur = comps.setdefault(m.group("name"), []) if m else None
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        op = _opcode(m.group("rest"))
        if op:
            cur.append((m.group("name"), op, m.group("rest")))
    frames = _Frames(hlo_text)
    comp_names = set(comps)
    contents: dict[str, tuple[set, set]] = {}

    def called(rest: str) -> list[str]:
        # computations referenced by the instruction (calls=, to_apply=, body=, ...): every
        # token after the operand list that names a computation
        return [t for t in _TOKEN.findall(rest) if t.lstrip("%") in comp_names]

    def content(comp: str, stack=()) -> tuple[set, set]:
        if comp in contents:
            return contents[comp]
        ops, targets = set(), set()
        if comp not in stack:
            for _, op, rest in comps.get(comp, ()):
                ops.add(op)
                t = _TARGET.search(rest)
                if t:
                    targets.add(t.group("t"))
                for c in called(rest):
                    o2, t2 = content(c.lstrip("%"), stack + (comp,))
                    ops |= o2
                    targets |= t2
        contents[comp] = (ops, targets)
        return ops, targets

    out: dict[str, str] = {}
    for comp, instrs in comps.items():
        for name, op, rest in instrs:
            ops, targets = {op}, set()
            t = _TARGET.search(rest)
            if t:
                targets.add(t.group("t"))
            for c in called(rest):
                o2, t2 = content(c.lstrip("%"))
                ops |= o2
                targets |= t2
            optimizer = False
            fm = _FRAME.search(rest)
            if fm:
                optimizer = frames.optimizer(int(fm.group(1)))
            sm = _SRC.search(rest)
            if sm and OPTIMIZER_FILES.search(sm.group("f")):
                optimizer = True
            out[name] = _op_category(ops, targets, optimizer)
    return out


def _op_category(ops: set, targets: set, optimizer: bool) -> str:
    if ops & _COLLECTIVE_OPS or any(_COLLECTIVE_TARGET.search(t) for t in targets):
        return "collective"
    if optimizer:
        return "optimizer"
    if any(_ATTN_TARGET.search(t) for t in targets):
        return "attention"
    if ops & _MATMUL_OPS or any(_MATMUL_TARGET.search(t) for t in targets):
        return "matmul"
    if ops & _REDUCE_OPS:
        return "reduction/norm"
    if "custom-call" in ops:
        return "other"
    if ops <= (_DATA_OPS | _CONTROL_OPS):
        return "memcpy/memset"
    return "elementwise"
