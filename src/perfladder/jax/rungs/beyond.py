"""Rungs past the seed: ``B1`` ... ``B8`` continue the JAX waterfall from R3.

    B1  embedding gradient in fp32 (look up in the fp32 table, cast after)
    B2  scatter-free embedding: one_hot(X) @ table, whose gradient is a matmul
    B3  split/merge ``jax.jit`` step with donated state, instead of ``nnx.jit``
    B4  cuDNN fused attention (GPU only)
    B5  batch x2
    B6  batch x4
    B7  residual add fused into the LayerNorm after it (a Pallas kernel under custom_vjp)
    B8  split + RoPE + causal attention + head merge in one Pallas kernel each way (GPU only)
    B9  XLA's GEMMs through cuBLASLt (bias and GELU in their epilogues), this step's compile only
    B10 GELU's backward with FC1's bias gradient in one Pallas kernel (GPU only)
    B11 XLA's command buffers (CUDA graphs) for every command type, this step's compile only
    B12 the QKV bias added on load in B8's kernels, its gradient summed where d(qkv) is written
        (GPU only; on a configuration without B8's kernels there is nothing to change)

B9 and B11 set XLA debug options per program (``Recipe.xla_options``,
``perfladder.jax.compile_options``), in either jitted step form: ``XLA_FLAGS`` is read once per
process, so two rungs of one ladder could not differ in it. Both are GPU options, which the CPU compiler accepts and
ignores: on a CPU they would time their base's program again.

Each builds on the fastest configuration so far (the engine's chain), changes one field of
its recipe, and is gated against its base: the losses of the first steps from the same
init on the same batches (``trial.loss_gate``), plus its own gate where it has one.

B2 is declared an ``alternative``: it replaces B1's lookup (a gather from the fp32 table)
with another implementation of the same lookup (the lookup gate proves the same rows) and
goes after the same cost, the embedding gradient's scatter. B9 to B12 are alternatives
too: another implementation of what the step already does (the GEMMs' library and epilogues,
GELU's backward, how the kernels are launched, where the QKV bias is added), none of which a
multi-GPU rank that no ladder handed a configuration should assume
(``perfladder.ladder.declared``). The others add something no earlier rung chose.
"""
from __future__ import annotations

import collections
import re

import jax.numpy as jnp

from perfladder.jax.checks import _compare, check_attention_parity, two_forwards_program
from perfladder.jax.lab import JaxLab
from perfladder.jax.profile import host_overhead, per_step_times, step_stats
from perfladder.jax.program import embedding_scatters
from perfladder.jax.rungs import changes as ch
from perfladder.jax.step import scatter_add_dtypes
from perfladder.jax.trial import trial
from perfladder.ladder.rung import Evidence, Given, NotMeasured, Rung
from perfladder.measure.evidence import Gate
from perfladder.measure.gates import LOOKUP_TOL as _LOOKUP
from perfladder.measure.gates import PARITY_TOL

LOOKUP_TOL = _LOOKUP["fp32"]   # one-hot rows vs gathered rows in the lookup's own dtype: exact


def _base_scatter(given: Given, base_step, X, Y) -> dict:
    """The embedding-gradient scatters of the base's compiled step (its record, else compiled)."""
    found = given.base.details.get("hlo_embedding_scatter") if given.base is not None else None
    if found is not None:
        return found
    text = base_step.lower(X, Y).compile().as_text()
    return embedding_scatters(text, tuple(base_step.model.token_emb.embedding.shape))


def _per_step(lab: JaxLab, given: Given | None = None):
    """``after`` hook: step-by-step stats of the candidate (and of its base, with ``given``)."""
    def after(step, stream, base):
        n = lab.config.timed
        out = {"per_step": step_stats(per_step_times(step, stream, n))}
        if given is not None:
            X, Y = next(stream)
            base_step = base()
            stats = step_stats(per_step_times(base_step, stream, n))
            base_step.commit()
            out["before"] = {"per_step": stats,
                             "jaxpr_embedding_scatter_add": scatter_add_dtypes(base_step.model, X, Y),
                             "hlo_embedding_scatter": _base_scatter(given, base_step, X, Y)}
        return out
    return after


def b1_embed_fp32_lookup(lab: JaxLab, given: Given) -> Evidence:
    """Look up in the fp32 table, so the gradient's scatter-add is f32."""
    recipe = given.recipe
    tr = trial(lab, given, loss_gate_=True, evidence=True, after=_per_step(lab, given))
    d, T, V = tr.details, lab.config.num_steps, lab.gpt_config.vocab_size
    notes = [f"embedding gradient: scatter-add of {recipe.batch_size * T:,} rows into {V} table "
             f"rows; jaxpr {d['before']['jaxpr_embedding_scatter_add']} -> "
             f"{d['jaxpr_embedding_scatter_add']}; HLO types {d['before']['hlo_embedding_scatter']['types']} "
             f"-> {d['hlo_embedding_scatter']['types']}; known issue: openxla/xla#26371 "
             "(bf16 atomic add compiled to a compare-and-swap loop)"]
    tr.notes += notes
    return tr


def b2_onehot_embedding(lab: JaxLab, given: Given) -> Evidence:
    """The embedding as ``one_hot(X) @ table``: its gradient is a matmul, no scatter."""
    def lookup(step, X, Y):
        model = step.model
        dtype = jnp.float32 if model.embed_fp32 else model.dtype
        want = jnp.take(model.token_emb.embedding[...].astype(dtype), X, axis=0).astype(model.dtype)
        got = model.embed(X)
        if got.shape != want.shape or got.dtype != want.dtype:
            raise AssertionError(f"one-hot lookup gave {got.shape} {got.dtype}, gather {want.shape} {want.dtype}")
        rel = _compare(got, want, LOOKUP_TOL, "one-hot lookup vs gathered rows")
        return [Gate(name="lookup parity", passed=True, values={"rel_diff": rel},
                     tolerances={"rel_diff": LOOKUP_TOL}, reference="the gathered rows of the same table")]

    def no_scatter(text, details):
        if details["hlo_embedding_scatter"]["count"]:
            raise AssertionError(f"the one-hot model still scatters into the table: "
                                 f"{details['hlo_embedding_scatter']}")
        return {}

    tr = trial(lab, given, check=lookup, loss_gate_=True, evidence=True,
               inspect=no_scatter, after=_per_step(lab))
    V, D = lab.gpt_config.vocab_size, lab.gpt_config.num_hiddens
    notes = [f"embedding scatters in the compiled step: 0; extra lookup FLOPs per token "
             f"{4 * V * D:,} (forward and gradient); known issue: jax-ml/jax#38806 (f32 atomic "
             "add compiled to a compare-and-swap loop)"]
    tr.notes += notes
    return tr


def b3_split_jit(lab: JaxLab, given: Given) -> Evidence:
    """``nnx.split`` once, ``jax.jit`` a pure step with the state donated, ``nnx.merge`` inside."""
    n = max(3, lab.config.timed // 4)

    def after(step, stream, base):
        return {"host_overhead": {"base": host_overhead(base(), stream, n),
                                  "split": host_overhead(step, stream, n)}}

    return trial(lab, given, loss_gate_=True, after=after)


def b4_attention_kernel(lab: JaxLab, given: Given) -> Evidence:
    """cuDNN's fused attention kernel in place of XLA's."""
    base, ref = given.base_name, given.base_recipe

    def parity(step, X, Y):
        tol = PARITY_TOL["bfloat16"]
        rel = check_attention_parity(step.model, lab.model(ref, plain_code=True), X, tol=tol)
        return [Gate(name="attention parity", passed=True, values={"rel_diff": rel},
                     tolerances={"rel_diff": tol},
                     reference=f"{base}'s recipe (XLA attention) logits, same init, probe weights")]

    def calls(text, details):
        n = text.count("__cudnn$fmha")       # forward and backward custom calls
        if not n:
            raise AssertionError("no cuDNN attention call (__cudnn$fmha...) in the compiled step")
        return {"cudnn_attention_calls": n}

    def programs(step, X, Y):
        return [two_forwards_program(step.model, lab.model(ref, plain_code=True), X)]

    return trial(lab, given, check=parity, check_programs=programs, loss_gate_=True, inspect=calls)


_EPILOGUE = re.compile(r'"epilogue":"(\w+)"')
_COMMAND_BUFFER = re.compile(r"%(command_buffer[\w.\-]*)")     # XLA's outlined computations


def compiled_calls(text: str) -> dict:
    """What a compiled step's HLO says of the options B9 and B11 set: its cuBLASLt and cuBLAS
    GEMM calls, their epilogues (``{"BIAS_GELU": 6, ...}``) and its command buffers (the
    computations XLA outlined to record into CUDA graphs)."""
    return {"cublaslt_calls": text.count("__cublas$lt$matmul"), "cublas_calls": text.count("__cublas$gemm"),
            "gemm_epilogues": dict(collections.Counter(_EPILOGUE.findall(text))),
            "command_buffers": len(set(_COMMAND_BUFFER.findall(text)))}


def xla_options_rung(lab: JaxLab, given: Given) -> Evidence:
    """Its base's step compiled with XLA debug options of its own (``Recipe.xla_options``), its
    gate programs with them too: the loss gate and the model gate run what they compiled."""
    recipe, ref = given.recipe, given.base_recipe
    changed = sorted(k for k, v in recipe.to_dict().items() if ref.to_dict()[k] != v)
    if changed != ["xla_options"]:
        raise AssertionError(f"{given.rung.name} must change the XLA options alone; changed {changed}")
    options = dict(recipe.xla_options)

    def compiled_with(step, X, Y):
        got = getattr(step._split or getattr(step, "_jitted", None), "xla_options", {})
        if got != options:
            raise AssertionError(f"the step compiles with XLA options {got}, its recipe names {options}")
        return [Gate(name="XLA options", passed=True, values={"options": len(options)},
                     reference=f"{given.base_name}'s recipe", detail={"xla_options": options})]

    def calls(text, details):
        return {"xla_options": options, **compiled_calls(text)}

    return trial(lab, given, check=compiled_with, loss_gate_=True, inspect=calls,
                 details={"xla_options": options})


def kernel_rung(lab: JaxLab, given: Given) -> Evidence:
    """A Pallas kernel (under custom_vjp) in place of the ops it replaces: the loss gate."""
    return trial(lab, given, loss_gate_=True)


def batch_rung(lab: JaxLab, given: Given) -> Evidence:
    """A bigger batch, and nothing else: checked against the recipe it builds on."""
    recipe, base, ref = given.recipe, given.base_name, given.base_recipe
    changed = sorted(k for k, v in recipe.to_dict().items() if ref.to_dict()[k] != v)
    if changed != ["batch_size"]:
        raise AssertionError(f"{given.rung.name} must change the batch alone; changed {changed}")

    def only_batch(step, X, Y):
        return [Gate(name="batch only", passed=True,
                     values={"batch_size": recipe.batch_size, "base_batch_size": ref.batch_size},
                     reference=f"{base}'s recipe", detail={"changed": changed})]

    return trial(lab, given, check=only_batch)


LOSS_GATE = "loss over the first steps == the plain bf16 recipe's (same init, same batches)"
STAGE = dict(stage="beyond")
B1 = Rung("B1", "embed_fp32_lookup", "+fp32 embedding grad", b1_embed_fp32_lookup, **STAGE,
          change=ch.fp32_embedding_lookup,
          gate=LOSS_GATE)
B2 = Rung("B2", "onehot_embedding", "+one-hot embedding", b2_onehot_embedding, **STAGE,
          change=ch.onehot_embedding, alternative=True,
          gate="one-hot rows == gathered rows; " + LOSS_GATE)
B3 = Rung("B3", "split_jit", "+split jit, donated", b3_split_jit, **STAGE,
          change=ch.split_jit,
          gate=LOSS_GATE)
B4 = Rung("B4", "attention_kernel", "+cuDNN attention", b4_attention_kernel, **STAGE,
          change=ch.cudnn_attention,
          gate="logits == XLA attention's; " + LOSS_GATE,
          needs_gpu="cuDNN fused attention (jax.nn.dot_product_attention(implementation='cudnn'))")
B5 = Rung("B5", "batch_x2", "+batch x2", batch_rung, **STAGE,
          change=ch.batch_x2, gate="its base's step; only the batch changes")
B6 = Rung("B6", "batch_x4", "+batch x4", batch_rung, **STAGE,
          change=ch.batch_x4, gate="its base's step; only the batch changes")

B7 = Rung("B7", "fused_addnorm", "+fused add+LayerNorm", kernel_rung, **STAGE,
          change=ch.fused_addnorm, gate=LOSS_GATE,
          needs_gpu="Pallas kernels compile for a GPU; on CPU they run only through Pallas's "
                    "interpreter, in tests/jax/test_fused.py")

# The fused attention kernel replaces jax.nn.dot_product_attention (so no implementation is
# chosen) and rotates q and k itself, reading the QKV projection directly.
B8 = Rung("B8", "fused_attention", "+fused attention", kernel_rung, **STAGE,
          change=ch.fused_attention,
          gate=LOSS_GATE, needs_gpu=B7.needs_gpu)

XLA_GPU = "XLA's GPU compiler options; the CPU compiler accepts and ignores them (tests/jax/test_compile_options.py)"
B9 = Rung("B9", "xla_cublaslt", "+XLA cuBLASLt GEMMs", xla_options_rung, **STAGE,
          alternative=True, change=ch.xla_cublaslt, gate="compiled with its options; " + LOSS_GATE, needs_gpu=XLA_GPU)
B10 = Rung("B10", "fused_gelu_bias_grad", "+fused GELU backward", kernel_rung, **STAGE,
           alternative=True, change=ch.fused_gelu_bias_grad, gate=LOSS_GATE,
           needs_gpu="a Pallas kernel compiles for a GPU; on CPU it runs only through Pallas's "
                     "interpreter, in tests/jax/test_fused_gelu_bias_grad.py")
B11 = Rung("B11", "command_buffers", "+command buffers", xla_options_rung, **STAGE,
           alternative=True, change=ch.command_buffers, gate="compiled with its options; " + LOSS_GATE,
           needs_gpu=XLA_GPU)

def bias_on_load_rung(lab: JaxLab, given: Given) -> Evidence:
    """B8's kernels adding the QKV bias themselves: measured on a configuration that runs them."""
    if "attention" not in given.base_recipe.fused:
        raise NotMeasured(f"{given.rung.name} adds the QKV bias inside B8's attention kernels, and "
                          f"{given.base_name}, which it builds on, does not run them")
    return kernel_rung(lab, given)


B12 = Rung("B12", "attention_bias", "+QKV bias in attention", bias_on_load_rung, **STAGE,
           alternative=True, change=ch.attention_bias, gate=LOSS_GATE,
           needs_gpu="Pallas kernels compile for a GPU; on CPU they run only through Pallas's "
                     "interpreter, in tests/jax/test_fused_attention.py")

BEYOND = [B1, B2, B3, B4, B5, B6, B7, B8, B9, B10, B11, B12]
