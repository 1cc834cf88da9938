"""Every technique of the ladder, keyed once (framework-free): what it does, the cost it goes
after, the roofline groups it targets, and the chapter section whose tool it applies.

Keys are the rung declarations' ``key`` (``perfladder.ladder.rung.Rung``), shared by both
frameworks, so one technique has one description and one section whichever framework runs
it. ``attacks`` names the regimes of ``perfladder.measure.verdict.REGIMES`` a technique can
relieve; ``targets`` the roofline groups (``perfladder.kernels.taxonomy.ROOFLINE_GROUPS``)
it goes after, which the kernel report's "tried against it" column reads.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfladder.measure.verdict import COMPUTE, HOST, MEMORY


@dataclass(frozen=True)
class Technique:
    does: str                          # a verb phrase: "<label> <does>"
    attacks: tuple[str, ...] = ()      # regimes it relieves
    section: str = ""                  # the chapter section whose tool it applies
    cost: str = ""                     # the cost it goes after, in a few words
    targets: tuple[str, ...] = ()      # roofline groups it attacks
    control: bool = False              # a control measurement, not a waterfall step
    memory_trade: bool = False         # trades time for memory (pays only when memory binds)
    devices: bool = False              # adds devices (read against a prediction)
    noun: str = ""                     # how a sentence names a control ("fp32 control")



S_MEASURE, S_ROOF, S_COMPILE, S_OVERHEAD = ("13.1 measurement and profiling",
                                            "13.1 roofline: arithmetic intensity",
                                            "13.3 compilation", "13.3 overhead")
S_FUSION, S_KERNEL, S_PRECISION = "13.3 fusion", "13.3 fusion (a hand-written kernel)", "13.4 mixed precision"
S_DP, S_ATTN = "13.5 and 13.6 data parallelism", "10.5 fused attention"
E_REST, ATTN, NORM, MATMUL = "elementwise: rest", "attention", "layernorm/reductions", "matmul"

TECHNIQUES: dict[str, Technique] = {
    "eager": Technique("runs the training step operator by operator", section=S_MEASURE,
                       cost="nothing: the ladder's first measurement"),
    "compile": Technique("compiles the step, fusing the elementwise chains between the matmuls "
                         "and cutting the number of kernel launches", (HOST, MEMORY), S_COMPILE,
                         "per-op dispatch and the unfused elementwise kernels"),
    "bf16_naive_cast": Technique("casts the parameters to bf16 without changing the compute dtype "
                                 "the modules remember", (), S_PRECISION,
                                 "matmul time, which it does not reach", control=True,
                                 noun="naive-cast control"),
    "bf16": Technique("computes in bf16, which doubles the tensor cores' rate and halves the "
                      "bytes of every activation", (COMPUTE, MEMORY), S_PRECISION,
                      "matmul time and activation bytes"),
    "fp32_control": Technique("runs fp32 at the big batch, to separate the batch's effect from "
                              "bf16's", (), "13.4 memory anatomy",
                              "nothing: prices the big batch without bf16", control=True,
                              noun="fp32 control"),
    "batch_up": Technique("raises the batch, so each matmul is bigger and every fixed per-step cost "
                          "is spread over more tokens", (HOST,), S_ROOF,
                          "fixed per-step costs (launches, the AdamW update, dispatch)"),
    "checkpoint": Technique("recomputes each block's activations in the backward pass instead of "
                            "storing them", (), "13.4 activation checkpointing",
                            "activation memory, paid for in recomputed FLOPs", memory_trade=True),
    "fused_adamw": Technique("does the whole AdamW update in one fused pass over the parameters",
                             (HOST, MEMORY), S_FUSION, "the optimizer's many small kernels",
                             ("optimizer",)),
    "compiled_adamw": Technique("compiles the optimizer step so its arithmetic is fused",
                                (HOST, MEMORY), S_COMPILE, "the optimizer's many small kernels",
                                ("optimizer",)),
    "cuda_graphs": Technique("replays the compiled step as CUDA graphs, one launch where there "
                             "were hundreds", (HOST,), S_OVERHEAD, "launch overhead"),
    "onehot_embedding": Technique("looks tokens up with a one-hot matmul, so the embedding's "
                                  "gradient is a matmul instead of a scatter-add", (MEMORY,), S_ROOF,
                                  "the embedding gradient's scatter-add (contended atomics)",
                                  (E_REST,)),
    "embed_fp32_lookup": Technique("gathers rows from the fp32 table and casts them afterwards, so "
                                   "the embedding gradient's scatter-add runs in fp32", (MEMORY,),
                                   S_PRECISION, "the embedding gradient's bf16 scatter-add",
                                   (E_REST,)),
    "split_jit": Technique("splits the model and optimizer state once and jits a pure step that "
                           "donates its inputs, so each call does less host work", (HOST,),
                           S_OVERHEAD, "host work per call (graph traversal, fresh state buffers)"),
    "attention_kernel": Technique("runs attention as one fused kernel that keeps its score tiles "
                                  "on chip", (MEMORY, COMPUTE), S_ATTN,
                                  "attention: scores, mask and softmax through memory", (ATTN,)),
    "batch_x2": Technique("doubles the batch again", (HOST,), S_ROOF,
                          "per-step costs that do not grow with the batch"),
    "batch_x4": Technique("quadruples the batch", (HOST,), S_ROOF,
                          "per-step costs that do not grow with the batch"),
    "max_autotune": Technique("lets the compiler autotune its GEMM and fusion kernels", (COMPUTE,),
                              S_COMPILE, "cuBLAS's first-choice GEMM algorithms", (MATMUL,)),
    "fused_rope": Technique("rotates q and k in one hand-written kernel straight from the QKV "
                            "projection, the rotation done in registers", (MEMORY,), S_KERNEL,
                            "the RoPE apply, an elementwise pass", ("elementwise: RoPE",)),
    "fused_gelu": Technique("computes GELU and its derivative in one hand-written pass each",
                            (MEMORY,), S_KERNEL, "GELU, an elementwise pass", ("elementwise: GELU",)),
    "fused_addnorm": Technique("fuses each residual add into the LayerNorm after it, with a "
                               "one-pass LayerNorm backward", (MEMORY,), S_KERNEL,
                               "residual adds and LayerNorm", (NORM,)),
    "fused_attention": Technique("runs attention in one hand-written kernel that reads the QKV "
                                 "projection directly and rotates q and k on load", (MEMORY,),
                                 S_KERNEL, "attention's copies and the RoPE passes around it",
                                 (ATTN, "elementwise: RoPE", "copies")),
    "fused_mlp": Technique("computes FC1's bias and GELU inside its GEMM, and GELU's derivative "
                           "inside FC2's input-gradient GEMM, so the hidden activation's "
                           "elementwise passes never go through memory", (MEMORY,), S_KERNEL,
                           "GELU and bias passes over the 4D-wide hidden activation",
                           ("elementwise: GELU", E_REST)),
    "bf16_residual": Technique("keeps the residual stream between blocks in bf16 (a numerics "
                               "change)", (MEMORY,), S_PRECISION,
                               "the bytes of the residual stream and its casts", (NORM, E_REST)),
    "cublaslt_epilogues": Technique("computes FC1's bias and GELU, and GELU's derivative with FC1's "
                                    "bias gradient, in the epilogues of cuBLASLt's own GEMMs, so the "
                                    "hidden activation's elementwise passes never go through memory",
                                    (MEMORY,), S_FUSION,
                                    "GELU and bias passes over the 4D-wide hidden activation",
                                    ("elementwise: GELU", E_REST)),
    "fused_cuda_graphs": Technique("replays the fastest fused step as CUDA graphs, one launch where "
                                   "there were hundreds, so the GPU stops idling between kernels",
                                   (HOST,), S_OVERHEAD, "the idle time between the fused step's kernels"),
    "tuned_gemms": Technique("runs every GEMM of the step through a cuBLASLt plan whose algorithm "
                             "was chosen by timing, once per shape", (COMPUTE,), S_COMPILE,
                             "cuBLAS's first-choice GEMM algorithms", (MATMUL,)),
    "gemm_bias_grads": Technique("computes each linear layer's bias gradient in the epilogue of its "
                                 "weight-gradient GEMM, so the output gradient is not read again for "
                                 "a separate sum", (MEMORY,), S_FUSION,
                                 "the bias gradients' reductions over the output gradients",
                                 (NORM, MATMUL)),
    "xla_cublaslt": Technique("compiles the step's GEMMs to cuBLASLt calls, whose epilogues XLA "
                              "gives FC1's bias add and GELU", (MEMORY,), S_FUSION,
                              "GELU and bias passes over the 4D-wide hidden activation (forward)",
                              ("elementwise: GELU", E_REST)),
    "attention_bias": Technique("adds the QKV projection's bias where the attention kernels load "
                                "q, k and v, and sums its gradient where they write d(qkv), so the "
                                "bias is no longer a pass of its own over the projection",
                                (MEMORY,), S_KERNEL, "the QKV bias's pass over the 3D-wide "
                                "projection and its gradient's read of d(qkv)", (E_REST,)),
    "fused_gelu_bias_grad": Technique("computes GELU's derivative and FC1's bias gradient in one "
                                      "hand-written pass, so the hidden gradient is written once "
                                      "and not read back for the bias sum", (MEMORY,), S_KERNEL,
                                      "GELU's backward and the bias gradient's reduction over the "
                                      "4D-wide hidden gradient", ("elementwise: GELU", E_REST)),
    "command_buffers": Technique("records the step's kernels into CUDA graphs (XLA's command "
                                 "buffers), so they launch as a few graphs instead of one by one",
                                 (HOST,), S_OVERHEAD, "the idle time between kernels (no "
                                 "roofline group: the device runs nothing then)"),
    "data_parallel": Technique("splits each batch across GPUs and sums the gradients every step",
                               section=S_DP, cost="one GPU's throughput: k GPUs, gradients all-reduced",
                               devices=True),
    "data_parallel_fast": Technique("runs data parallelism on the fastest single-GPU "
                                    "configuration", section=S_DP,
                                    cost="one GPU's throughput, from the fastest configuration",
                                    devices=True),
    "fsdp": Technique("shards the parameters and optimizer state across GPUs as well as the "
                      "batch", section=S_DP, cost="per-GPU memory of the replicated state",
                      devices=True),
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


def technique(key: str) -> Technique:
    """The technique of ``key``; a key nobody described is an error naming the valid ones."""
    try:
        return TECHNIQUES[key]
    except KeyError:
        raise KeyError(f"technique key {key!r} is not described in perfladder.ladder.techniques; "
                       f"valid choices: {', '.join(TECHNIQUES)}") from None
