"""What each technique key does and which cost it goes after, in the words the computed
sentences of the pages use (framework-free).

Keys are the rung declarations' ``key`` (``perfladder.ladder.engine.Rung``), shared by both
frameworks. ``attacks`` names the regimes of ``perfladder.measure.verdict.REGIMES`` a technique can
relieve; a sentence that says "it cannot pay here" is the base rung's measured regime missing
from this tuple. A key missing from ``TECHNIQUES`` is described by its rung's label only.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Technique:
    does: str                          # a verb phrase: "<label> <does>"
    attacks: tuple[str, ...] = ()      # regimes it relieves
    control: bool = False              # a control measurement, not a waterfall step
    memory_trade: bool = False         # trades time for memory (pays only when memory binds)
    devices: bool = False              # adds devices (read against a prediction)
    noun: str = ""                     # how a sentence names a control ("fp32 control")


HOST, MEMORY, COMPUTE = "host-bound", "memory-bound", "compute-bound"

TECHNIQUES: dict[str, Technique] = {
    "eager": Technique("runs the training step operator by operator"),
    "compile": Technique("compiles the step, fusing the elementwise chains between the matmuls "
                         "and cutting the number of kernel launches", (HOST, MEMORY)),
    "bf16_naive_cast": Technique("casts the parameters to bf16 without changing the compute dtype "
                                 "the modules remember", control=True, noun="naive-cast control"),
    "bf16": Technique("computes in bf16, which doubles the tensor cores' rate and halves the "
                      "bytes of every activation", (COMPUTE, MEMORY)),
    "fp32_control": Technique("runs fp32 at the big batch, to separate the batch's effect from "
                              "bf16's", control=True, noun="fp32 control"),
    "batch_up": Technique("raises the batch, so each matmul is bigger and every fixed per-step cost "
                          "is spread over more tokens", (HOST,)),
    "checkpoint": Technique("recomputes each block's activations in the backward pass instead of "
                            "storing them", memory_trade=True),
    "fused_adamw": Technique("does the whole AdamW update in one fused pass over the parameters",
                             (HOST, MEMORY)),
    "compiled_adamw": Technique("compiles the optimizer step so its arithmetic is fused",
                                (HOST, MEMORY)),
    "cuda_graphs": Technique("replays the compiled step as CUDA graphs, one launch where there "
                             "were hundreds", (HOST,)),
    "onehot_embedding": Technique("looks tokens up with a one-hot matmul, so the embedding's "
                                  "gradient is a matmul instead of a scatter-add", (MEMORY,)),
    "embed_fp32_lookup": Technique("gathers rows from the fp32 table and casts them afterwards, so "
                                   "the embedding gradient's scatter-add runs in fp32", (MEMORY,)),
    "split_jit": Technique("splits the model and optimizer state once and jits a pure step that "
                           "donates its inputs, so each call does less host work", (HOST,)),
    "attention_kernel": Technique("runs attention as one fused kernel that keeps its score tiles "
                                  "on chip", (MEMORY, COMPUTE)),
    "batch_x2": Technique("doubles the batch again", (HOST,)),
    "batch_x4": Technique("quadruples the batch", (HOST,)),
    "max_autotune": Technique("lets the compiler autotune its kernels", (COMPUTE,)),
    "fused_rope": Technique("rotates q and k in one hand-written kernel straight from the QKV "
                            "projection, the rotation done in registers", (MEMORY,)),
    "fused_gelu": Technique("computes GELU and its derivative in one hand-written pass each",
                            (MEMORY,)),
    "fused_addnorm": Technique("fuses each residual add into the LayerNorm after it, with a "
                               "one-pass LayerNorm backward", (MEMORY,)),
    "data_parallel": Technique("splits each batch across GPUs and sums the gradients every step",
                               devices=True),
    "data_parallel_fast": Technique("runs data parallelism on the fastest single-GPU "
                                    "configuration", devices=True),
    "fsdp": Technique("shards the parameters and optimizer state across GPUs as well as the "
                      "batch", devices=True),
}

# What comes next, read from a step's own regime: the move, and the technique keys that make it.
NEXT_MOVES: dict[str, tuple[str, tuple[str, ...]]] = {
    HOST: ("amortise the fixed per-step cost: a bigger batch, or capture the step so that one "
           "launch replaces many",
           ("compile", "batch_up", "cuda_graphs", "split_jit", "batch_x2", "batch_x4")),
    MEMORY: ("fuse, or move fewer bytes",
             ("compile", "bf16", "fused_adamw", "compiled_adamw", "onehot_embedding",
              "embed_fp32_lookup", "attention_kernel")),
    COMPUTE: ("make each FLOP cheaper: a lower precision, or better kernels",
              ("bf16", "attention_kernel", "max_autotune")),
    "mixed": ("measure before choosing: no single cost dominates, so the next rung is an "
              "experiment that tells the suspects apart", ()),
}

# A rung read against a control measured at the same batch: {rung key: control key}.
CONTROLS = {"batch_up": "fp32_control", "bf16": "bf16_naive_cast"}
# When a bf16 rung loses to its fp32 control, the rungs that test the diagnosis (first present).
DIAGNOSES = {"batch_up": ("embed_fp32_lookup", "onehot_embedding")}


def technique(key: str) -> Technique | None:
    return TECHNIQUES.get(key)
