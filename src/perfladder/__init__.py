"""perfladder: a small GPT taken down a measured ladder of speed techniques.

Framework-free pieces live at the top (``data``, ``config``, ``hardware``, ``timing``,
``results``, ``plot``); each framework has one subpackage that imports only its own
framework::

    from perfladder import torch as ladder   # imports torch, never jax
    from perfladder import jax as ladder     # imports jax/flax, never torch
"""
__version__ = "0.1.0"
