"""What a step's program holds: the compiled XLA module, read from its HLO text
(``lower(...).compile().as_text()``), and the traced jaxpr.

* ``hlo_op_categories(text)`` / ``hlo_ops(text)`` -- a category (``perfladder.kernels.CATEGORIES``)
  for every op of the module, from what it contains (a fusion's body) and from the Python code it
  was traced from (optax / ``Optimizer.update`` -> optimizer; a LayerNorm's elementwise passes
  -> reduction/norm), and the part of the GPT that code is (``perfladder.jax.frames``). XLA's own
  names (``loop_multiply_fusion.3``, ``ynn_fusion.7``) do not say whether a fusion holds a dot, a
  reduction, a GELU or the AdamW update; the module text does;
* ``refine(kernel_name, op_category)`` -- a profiled kernel's category from both;
* ``scatters_in_hlo`` / ``embedding_scatters`` -- the module's ``scatter`` instructions, and
  which of them accumulate the embedding table's gradient (its [V, D] shape), with their
  element types;
* ``matmul_dtypes`` / ``dot_flops`` -- the operand dtypes and FLOPs of every ``dot_general`` of a
  traced jaxpr (the receipt that every matmul runs in bf16; the FLOP count checked against the
  formula); ``planned_temp_bytes`` -- the compiled program's planned temporaries.
"""
from __future__ import annotations

import collections
import math
import re

import jax
import jax.numpy as jnp
from flax import nnx

from perfladder.jax.frames import ELEMENTWISE_PARTS, NORM_PARTS, OPTIMIZER_FILES, Frames
from perfladder.kernels import CATEGORIES, categorize

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
_NO_ARITHMETIC = _DATA_OPS | _CONTROL_OPS
_ATTN_TARGET = re.compile(r"fmha|flash|attention|sdpa|splash", re.IGNORECASE)
_MATMUL_TARGET = re.compile(r"gemm|matmul|cublas|\$dot|dot_general", re.IGNORECASE)
_COLLECTIVE_TARGET = re.compile(r"nccl|all[-_]?reduce|all[-_]?gather", re.IGNORECASE)

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


def hlo_module_name(hlo_text: str) -> str | None:
    m = re.search(r"^HloModule\s+([^\s,]+)", hlo_text, re.MULTILINE)
    return m.group(1) if m else None


def hlo_op_categories(hlo_text: str) -> dict[str, str]:
    """``{op name: category}`` for every instruction of a compiled module's HLO text
    (``jitted.lower(...).compile().as_text()``): the categories of ``hlo_ops``."""
    return {name: cat for name, (cat, _) in hlo_ops(hlo_text).items()}


def hlo_ops(hlo_text: str) -> dict[str, tuple[str, str | None]]:
    """``{op name: (category, part)}`` for every instruction of a compiled module's HLO text.

    An op's category comes from what it contains (its own opcode plus, recursively, the
    computations it calls -- a fusion's body), in this order: collective; optimizer (the op
    was traced from optax / ``Optimizer.update``, read from the module's stack-frame tables or
    ``source_file`` metadata); attention (a fused-attention custom call); matmul (a dot or
    convolution, or a cuBLAS custom call); reduction/norm (a reduce); memcpy/memset (only
    data movement: copies, transposes, broadcasts, casts); elementwise (anything else
    arithmetic); an unknown custom call is 'other'. Its part is the part of the GPT its stack
    names (``perfladder.jax.frames.PART_NAMES``, or ``None``); an elementwise op of a LayerNorm
    or of the residual add beside it counts with the reductions (``frames.NORM_PARTS``), and a
    Linear's bias-gradient reduce whose body's arithmetic is mostly GELU's (or RoPE's) backward
    counts as that part's elementwise pass (``frames.ELEMENTWISE_PARTS``), as the Pallas kernel
    doing the same (B10's ``gelu_bias_grad_bwd``) does.
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
    frames = Frames(hlo_text)
    comp_names = set(comps)
    contents: dict[str, tuple[set, set, collections.Counter]] = {}

    def called(rest: str) -> list[str]:
        # computations referenced by the instruction (calls=, to_apply=, body=, ...): every
        # token after the operand list that names a computation
        return [t for t in _TOKEN.findall(rest) if t.lstrip("%") in comp_names]

    def frame_of(rest: str, depth: int = 0) -> int | None:
        # the op's own stack frame; XLA:CPU writes none on a fusion, only on what it fuses:
        # then that of the last op of its body that has one (XLA:GPU copies its ROOT's)
        fm = _FRAME.search(rest)
        if fm:
            return int(fm.group(1))
        for c in called(rest) if depth < 4 else ():
            for _, _, inner in reversed(comps.get(c.lstrip("%"), ())):
                fid = frame_of(inner, depth + 1)
                if fid is not None:
                    return fid
        return None

    def content(comp: str, stack=()) -> tuple[set, set, collections.Counter]:
        # the opcodes and custom-call targets of a computation and of what it calls, and the
        # parts of the GPT its arithmetic was traced from (one count per op)
        if comp in contents:
            return contents[comp]
        ops, targets, parts = set(), set(), collections.Counter()
        if comp not in stack:
            for _, op, rest in comps.get(comp, ()):
                ops.add(op)
                t = _TARGET.search(rest)
                if t:
                    targets.add(t.group("t"))
                fm = _FRAME.search(rest)
                if fm and op not in _NO_ARITHMETIC:
                    parts[frames.part(int(fm.group(1)))] += 1
                for c in called(rest):
                    o2, t2, p2 = content(c.lstrip("%"), stack + (comp,))
                    ops |= o2
                    targets |= t2
                    parts += p2
        contents[comp] = (ops, targets, parts)
        return contents[comp]

    out: dict[str, tuple[str, str | None]] = {}
    for comp, instrs in comps.items():
        for name, op, rest in instrs:
            ops, targets, body = {op}, set(), collections.Counter()
            t = _TARGET.search(rest)
            if t:
                targets.add(t.group("t"))
            for c in called(rest):
                o2, t2, p2 = content(c.lstrip("%"))
                ops |= o2
                targets |= t2
                body += p2
            optimizer, part = False, None
            fid = frame_of(rest)
            if fid is not None:
                optimizer, part = frames.optimizer(fid), frames.part(fid)
            sm = _SRC.search(rest)
            if sm and OPTIMIZER_FILES.search(sm.group("f")):
                optimizer = True
            cat = _op_category(ops, targets, optimizer)
            if cat == "elementwise" and part in NORM_PARTS:
                cat = "reduction/norm"
            elif cat == "reduction/norm" and part == "linear":
                most = body.most_common(1)
                if most and most[0][0] in ELEMENTWISE_PARTS:
                    cat, part = "elementwise", most[0][0]
            out[name] = (cat, part)
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
    if ops <= _NO_ARITHMETIC:
        return "memcpy/memset"
    return "elementwise"


_EXPLICIT_TRANSFER = re.compile(r"^(cuda)?mem(cpy|set)", re.IGNORECASE)


def refine(name: str, op_category: str | None) -> str:
    """Combine a kernel's name-based category with its HLO op's category (``None``: unknown).

    The op decides -- it knows what a fusion holds and whether it belongs to the optimizer --
    except that a library kernel's own name is more specific than the op that launched it
    (a cuBLAS gemm or a cuDNN attention kernel stays itself; an explicit memcpy/memset
    activity stays a copy), unless the op is the optimizer's or a collective.
    """
    by_name = categorize(name)
    if op_category is None:
        return by_name
    if op_category not in CATEGORIES:
        raise ValueError(f"op category {op_category!r} is not valid; valid choices: {CATEGORIES}")
    if op_category in ("optimizer", "collective"):
        return op_category
    if _EXPLICIT_TRANSFER.match(name):
        return "memcpy/memset"
    if by_name in ("matmul", "attention"):
        return by_name
    return op_category


# -- scatters -----------------------------------------------------------------------------------
# `%name = bf16[28,512]{1,0} scatter(bf16[28,512]{1,0} %a, s32[65536,1]{1,0} %b, ...), ...`
_SCATTER = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<out>\(?[\w\[\],{}:\s]*?\)?)\s+"
                      r"scatter\((?P<args>[^)]*)\)")
_TYPE = re.compile(r"\b(pred|[sfu]\d+|bf16|f8\w*)\[([\d,]*)\]")


def scatters_in_hlo(text: str, table_shape: tuple[int, int]) -> list[dict]:
    """Every ``scatter`` instruction of an HLO module text, with element types and shapes.

    Fused computations are part of ``as_text()``, so scatters inside fusions are listed too.
    ``embedding_grad`` marks the one whose result has the embedding table's shape [V, D].
    """
    out = []
    for line in text.splitlines():
        m = _SCATTER.search(line)
        if not m:
            continue
        results = _TYPE.findall(m.group("out"))
        operands = _TYPE.findall(m.group("args"))
        shapes = [[int(d) for d in dims.split(",") if d] for _, dims in results]
        out.append({
            "name": m.group("name"),
            "result_types": [f"{t}[{d}]" for t, d in results],
            "operand_types": [f"{t}[{d}]" for t, d in operands],
            "element_types": sorted({t for t, _ in results + operands if not t.startswith(("s", "u"))}),
            "embedding_grad": any(tuple(s) == tuple(table_shape) for s in shapes),
            "line": line.strip()[:400],
        })
    return out


def embedding_scatters(text: str, table_shape) -> dict:
    """How many scatters into the [V, D] table the compiled program holds, and their types."""
    found = [s for s in scatters_in_hlo(text, table_shape) if s["embedding_grad"]]
    return {"count": len(found), "types": sorted({t for s in found for t in s["element_types"]})}


# -- the traced program (jaxpr) -------------------------------------------------------------
def _eqns(jaxpr):
    """Every equation of a jaxpr, nested ones (jit, custom_jvp, remat, ...) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def matmul_dtypes(model, X) -> dict[str, int]:
    """Operand dtypes of every matmul (``dot_general``) in the traced forward pass.

    A stronger receipt than one activation: ``{'bfloat16': 13}`` means every matmul of the
    forward runs on bf16 operands.
    """
    graphdef, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda s, X: nnx.merge(graphdef, s)(X))(state, X)
    counts: collections.Counter = collections.Counter()
    for eqn in _eqns(jaxpr.jaxpr):
        if eqn.primitive.name == "dot_general":
            counts["+".join(sorted({str(v.aval.dtype) for v in eqn.invars}))] += 1
    return dict(counts)




def dot_flops(eqn) -> int:
    """FLOPs of one ``dot_general``: 2 x (batch x contracted x free dims of both operands)."""
    (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    rhs_free = math.prod(d for i, d in enumerate(rhs) if i not in rhs_contract and i not in rhs_batch)
    return 2 * math.prod(lhs) * rhs_free




def planned_temp_bytes(compiled) -> int | None:
    """Temporary buffer bytes the compiled program plans (``memory_analysis()``)."""
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    return int(ma.temp_size_in_bytes)


def param_dtypes(*trees) -> set[str]:
    """The dtypes of every floating array in the ``nnx.Param`` / optimizer state given."""
    out = set()
    for t in trees:
        for leaf in jax.tree.leaves(t):
            if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
                out.add(str(leaf.dtype))
    return out
