"""The nested op before and after this folder's changes, in one process: the code at 0c3a2a6 (``REV``) of the
four changed modules (``optimized/nested/function.py``, ``optimized/nested/fwd.py``,
``optimized/param_casts.py``, ``optimized/nested/probe_fused.py``) loaded beside the working
tree's, and the working tree with one change reverted at a time (the old behaviour put back by
wrapping the new code, so each change's own share shows).

``ops()`` returns ``{name: chunk_nested_gdn2}``; each entry installs what it needs on every call
(the backward's ``probe_bwd`` and the wrappers), so the entries may be called in any order.
Import from the repository root (``host_ab.py``, ``bitwise_check.py``)."""
from __future__ import annotations

import functools
import subprocess
import sys
import types

import optimized.nested.bwd as bwd
import optimized.nested.function as function
import optimized.nested.fwd as fwd
import optimized.nested.probe_fused as probe_fused
import optimized.param_casts as param_casts
from optimized.autograd import first_order_only

CHANGED = {"param_casts": "optimized/param_casts.py", "probe_fused": "optimized/nested/probe_fused.py",
           "fwd": "optimized/nested/fwd.py", "function": "optimized/nested/function.py"}
REV = "0c3a2a6"     # the code before this folder's changes


def _load(key: str, path: str) -> types.ModuleType:
    """The module at ``REV``, under its own name (``<module>_at_head``, registered: dataclasses look
    their module up)."""
    src = subprocess.run(["git", "show", f"{REV}:{path}"], check=True, capture_output=True, text=True).stdout
    real = sys.modules[path[:-3].replace("/", ".")]
    mod = types.ModuleType(real.__name__ + "_at_head")
    mod.__dict__.update(__file__=path + f" at {REV}", __package__=real.__package__)
    sys.modules[mod.__name__] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


@functools.lru_cache(maxsize=1)
def head_modules() -> dict:
    """The changed modules at ``REV``, wired to each other (not to the working tree's)."""
    m = {key: _load(key, path) for key, path in CHANGED.items()}
    m["fwd"].float32_params = m["param_casts"].float32_params
    m["fwd"].probe_fwd = m["probe_fused"].probe_fwd
    m["function"].nested_fwd = m["fwd"].nested_fwd
    m["function"].cast_like = m["param_casts"].cast_like
    return m


NEW = {"bwd.probe_bwd": probe_fused.probe_bwd, "function.nested_fwd": fwd.nested_fwd,
       "function.NestedGDN2Function.apply": function.NestedGDN2Function.apply,
       "fwd.float32_params": param_casts.float32_params, "param_casts._cast_together": param_casts._cast_together,
       "probe_fused._weights": probe_fused._weights, "probe_fused._kept_weights": probe_fused._kept_weights}
MODULES = {"bwd": bwd, "function": function, "fwd": fwd, "param_casts": param_casts, "probe_fused": probe_fused}


def _install(over: dict) -> None:
    for key, value in {**NEW, **over}.items():
        mod, *path = key.split(".")
        owner = MODULES[mod]
        for attr in path[:-1]:
            owner = getattr(owner, attr)
        setattr(owner, path[-1], value)


def _old_apply(meta, *xs):
    """Change 2 reverted: the inputs through the identity Function of ``first_order_only`` first."""
    return NEW["function.NestedGDN2Function.apply"](meta, *first_order_only("chunk_nested_gdn2", *xs))


def _finals_always(*args, **kwargs):
    """Change 1 reverted: the final states made (and returned through the Function) on every call."""
    return NEW["function.nested_fwd"](*args, **{**kwargs, "finals": True})


def _old_float32_params(groups):
    """Change 3 reverted: every parameter detached before the cast (HEAD's body)."""
    flat = [t.detach() for g in groups if g is not None for t in g.values()]
    cast = iter(param_casts._cast_together(flat, [param_casts.torch.float32] * len(flat)))
    return [None if g is None else {name: next(cast) for name in g} for g in groups]


def _weights_each_pass(scheme, params, saved=None):
    """Change 5 reverted: the weights concatenated again in the backward."""
    return NEW["probe_fused._weights"](scheme, params)


REVERTS = {   # change -> what puts the old behaviour back on the new code
    "1 finals only when asked": {"function.nested_fwd": _finals_always},
    "2 refusal in the backward": {"function.NestedGDN2Function.apply": _old_apply},
    "3 detach only pass-throughs": {"fwd.float32_params": _old_float32_params},
    "4 C++ flatten/unflatten": {"param_casts._cast_together": None},    # HEAD's, filled in by ops()
    "5 W kept for the backward": {"probe_fused._weights": _weights_each_pass,
                                  "probe_fused._kept_weights": lambda scheme, params, W: None},
}


def ops() -> dict:
    """``{"head": ..., "new": ..., "new - <change>": ...}``, each ``chunk_nested_gdn2``'s signature."""
    head = head_modules()
    REVERTS["4 C++ flatten/unflatten"]["param_casts._cast_together"] = head["param_casts"]._cast_together

    def head_op(*args, **kwargs):
        _install({"bwd.probe_bwd": head["probe_fused"].probe_bwd})
        return head["function"].chunk_nested_gdn2(*args, **kwargs)

    def variant(over):
        def op(*args, **kwargs):
            _install(over)
            return function.chunk_nested_gdn2(*args, **kwargs)
        return op

    out = {"head": head_op, "new": variant({})}
    out.update({f"new - {name}": variant(over) for name, over in REVERTS.items()})
    return out
