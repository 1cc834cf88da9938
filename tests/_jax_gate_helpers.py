"""Shared by the JAX gate tests: the smoke data, fixed batches, fresh models from the same
initial weights. Imported first, it turns on the cheap CPU compiles (as the other JAX tests do)."""
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.data import TimeMachine  # noqa: E402
from perfladder.jax.model import GPT  # noqa: E402
from perfladder.jax.stream import batches  # noqa: E402

CFG = get_config("smoke").replace(num_blks=1)   # one block: every parameter kind, half the compile
DATA = TimeMachine(CFG.batch_size, CFG.num_steps, num_train=CFG.num_train, num_val=CFG.num_val)
GPT_CFG = CFG.gpt(vocab_size=len(DATA.vocab))


def fixed(batch_size, n=1, seed=7):
    s = batches(DATA, batch_size, seed=seed)
    return [next(s) for _ in range(n)]


def model(dtype=jnp.float32, **kw) -> GPT:
    return GPT(GPT_CFG, rngs=nnx.Rngs(CFG.seed), dtype=dtype, **kw)
