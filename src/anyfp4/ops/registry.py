"""How the quantized linears become ``torch.ops.anyfp4.*``: a plain ``torch.library.Library`` registration.

A decoder runs its quantized linears ~100 times a token, and on the CPU a small layer's arithmetic takes tens of
microseconds: ``torch.library.custom_op``'s Python wrapper around every call (its autograd and dynamo layers)
costs ~5 us more a call than an op defined and implemented through the library directly (2-CPU VM, torch 2.13).
The schema is inferred from the function's annotations as ``custom_op`` infers it; the fake implementation is
registered with ``torch.library.register_fake`` (torch.compile and vLLM's graphs trace it). There is no autograd
formula: a call that autograd would record (grad enabled, a tensor argument requiring grad) is refused with an
error naming the op, never a silently missing gradient. The ops that mutate their arguments stay ``custom_op``
(``ops.glue``, ``ops.gdn``), whose functionalisation they rely on.
"""

from __future__ import annotations

import functools

import torch

NAMESPACE = "anyfp4"


@functools.lru_cache(maxsize=1)
def _library() -> torch.library.Library:
    return torch.library.Library(NAMESPACE, "FRAGMENT")


class RegisteredOp:
    """What ``linear_op`` returns: called, the op through the dispatcher (as a ``custom_op`` object is); and
    ``register_fake``."""

    def __init__(self, name: str, fn):
        self.name = name
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return getattr(getattr(torch.ops, NAMESPACE), self.name)(*args, **kwargs)

    def register_fake(self, fake):
        torch.library.register_fake(f"{NAMESPACE}::{self.name}", lib=_library())(fake)
        return fake


def linear_op(name: str):
    """Decorator: define ``torch.ops.anyfp4.<name>`` with the function's inferred schema and the function as its
    implementation on every device (``CompositeExplicitAutograd``)."""
    def register(fn) -> RegisteredOp:
        def impl(*args, **kwargs):
            if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                               for a in (*args, *kwargs.values())):
                raise RuntimeError(f"{NAMESPACE}::{name} has no backward: call it under torch.no_grad() or "
                                   f"torch.inference_mode(), or on tensors that do not require grad")
            return fn(*args, **kwargs)

        lib = _library()
        lib.define(name + torch.library.infer_schema(fn, mutates_args=()))
        lib.impl(name, impl, "CompositeExplicitAutograd")
        return RegisteredOp(name, fn)
    return register
