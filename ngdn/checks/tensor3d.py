"""3D tensor state properties (CONTRACT section 4) as functions of (implementation, draw) -> errors.

Each property test runs one of these on the real implementation and asserts every
error is within tolerance; the mutation tests run the same function on a
deliberately broken implementation (``tensor3d_mutants.py``) and assert it fails.
The 2D oracle of the identities is ``reference.naive_gdn2`` in float64 (GDN-2 with
``b = 0, w = 1`` is gated linear attention; ``b = w = β`` is the gated delta rule),
itself checked against fla's naive recurrences in ``test_gdn2.py``.
"""
from __future__ import annotations

import torch

from ngdn.inputs import as_reference, cast, generator, randn
from ngdn.tensor3d_inputs import NAMES, Tensor3DShape, tensor3d_inputs
from ngdn.tolerances import compare
from optimized import chunk_tensor3d, triton_mode
from reference import naive_gdn2, naive_tensor3d, naive_tensor3d_numpy, second_query_key, state_size

IDENTITIES = "tensor3d_identities"


def grad_or_zero(x: torch.Tensor) -> torch.Tensor:
    return x.grad if x.grad is not None else torch.zeros_like(x)


def run(impl, x: dict, mode: str, **overrides):
    """``impl(q1, k1, q2, k2, v, g, beta, mode, initial_state=…, output_final_state=True)``."""
    x = {**x, **overrides}
    return impl(*(x[n] for n in NAMES), x["g"], x["beta"], mode, initial_state=x["initial_state"],
                output_final_state=True)


def gdn2_gates(x: dict, mode: str, K: int, V: int):
    """The 2D erase and write gates of one mode: gla ``b = 0, w = 1``; delta ``b = w = β``."""
    v = x["v"]
    if mode == "gla":
        return v.new_zeros(*v.shape[:3], K), v.new_ones(*v.shape[:3], V)
    beta = x["beta"][..., None]
    return beta.expand(*v.shape[:3], K), beta.expand(*v.shape[:3], V)


def decay_2d(g, K: int, E: int, j: int | None = None):
    """The 2D log-decay ``[B, T, H, K]`` (``j`` given: of tile ``j``) or ``[B, T, H, K·E]``
    (``j`` None: flattened, channel ``i·E + j``), written with explicit indices."""
    def channel(i, jj):
        if g.dim() == 3:
            return g
        if g.dim() == 4:
            return g[..., jj]
        return g[..., i, jj]

    if j is not None:
        return torch.stack([channel(i, j) for i in range(K)], dim=-1)
    return torch.stack([channel(i, jj) for i in range(K) for jj in range(E)], dim=-1)


def vec(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``vec(x1 ⊗ x2)`` with explicit indices: entry ``i·E + j`` is ``x1[..., i] · x2[..., j]``."""
    K, E = x1.shape[-1], x2.shape[-1]
    return torch.stack([x1[..., i] * x2[..., j] for i in range(K) for j in range(E)], dim=-1)


def vec_state(S: torch.Tensor) -> torch.Tensor:
    """``[B, H, K, E, V] -> [B, H, K·E, V]`` with row ``i·E + j`` = ``S[:, :, i, j]``."""
    K, E = S.shape[2], S.shape[3]
    return torch.stack([S[:, :, i, j] for i in range(K) for j in range(E)], dim=2)


# --- reference properties (float64) -------------------------------------------------------------

def torch_vs_numpy(shape, seed, mode, gate, key_mode, reference=naive_tensor3d, log=True, regime="typical"):
    x = tensor3d_inputs(shape, seed, mode, gate, key_mode, regime=regime)
    y, ht = run(reference, x, mode)
    y_np, ht_np = naive_tensor3d_numpy(*(x[n].numpy() for n in NAMES),
                                       None if x["g"] is None else x["g"].numpy(),
                                       None if x["beta"] is None else x["beta"].numpy(), mode,
                                       initial_state=x["initial_state"].numpy())
    return compare("tensor3d_torch_vs_numpy", torch.float64,
                   {"output": (y, torch.from_numpy(y_np)), "final_state": (ht, torch.from_numpy(ht_np))},
                   log=log)


def no_decay_parallel_form(shape, seed, key_mode, reference=naive_tensor3d, log=True):
    """Mode gla without decay from a zero state:
    ``y_t = scale Σ_{τ≤t} (q1_t·k1_τ)(q2_t·k2_τ) v_τ``."""
    x = tensor3d_inputs(shape, seed, "gla", "none", key_mode, initial_state=False)
    y, _ = run(reference, x, "gla")
    T, K = shape.T, shape.K
    scores = (torch.einsum("bthk,bshk->bhts", x["q1"], x["k1"])
              * torch.einsum("bthe,bshe->bhts", x["q2"], x["k2"]))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = K ** -0.5 * torch.einsum("bhts,bshv->bthv", scores.masked_fill(~causal, 0.0), x["v"])
    return compare(IDENTITIES, torch.float64, {"output": (y, expected)}, log=log)


def one_hot_reduces_to_2d(shape, seed, mode, gate, reference=naive_tensor3d, log=True, regime="typical"):
    """``q2 = k2 = e_j``: the output is 2D linear attention (gla) / the gated delta rule
    (delta) on ``(q1, k1, v)`` with tile ``j``'s decay and initial state, and tile ``j`` of
    the final state is the 2D final state. ``j = seed mod E``."""
    x = tensor3d_inputs(shape, seed, mode, gate, "sigmoid", regime=regime)
    B, T, H, K, E, V = shape
    j = seed % E
    e_j = torch.zeros(B, T, H, E, dtype=torch.float64)
    e_j[..., j] = 1.0
    y, ht = run(reference, x, mode, q2=e_j, k2=e_j.clone())
    g2 = torch.zeros(B, T, H, K, dtype=torch.float64) if x["g"] is None else decay_2d(x["g"], K, E, j)
    b, w = gdn2_gates(x, mode, K, V)
    y2, ht2 = naive_gdn2(x["q1"], x["k1"], x["v"], g2, b, w, scale=K ** -0.5,
                         initial_state=x["initial_state"][:, :, :, j], output_final_state=True)
    return compare(IDENTITIES, torch.float64, {"output": (y, y2), "final_state": (ht[:, :, :, j], ht2)},
                   log=log)


def ones_is_e_times_2d(shape, seed, mode, gate, reference=naive_tensor3d, log=True, regime="typical"):
    """``q2 = k2 = 1`` with one gate for the whole state (``gate`` none or head), zero start.

    gla: every tile holds the 2D state of ``(k1, v)`` and ``y = E · y_2D``.
    delta: every tile still holds one 2D state, whose erase reads all E tiles, so it is
    GDN-2 with ``b = E·β, w = β`` and again ``y = E · y_2D``; β is drawn in ``(0, 1/E)``
    so that ``E·β < 1`` keeps the transition non-expansive.
    """
    if gate not in ("none", "head"):
        raise ValueError(f"the ones identity needs one gate for the whole state, got gate {gate!r}")
    x = tensor3d_inputs(shape, seed, mode, gate, "ones", initial_state=False, regime=regime)
    B, T, H, K, E, V = shape
    if mode == "delta":
        x["beta"] = x["beta"] / E
        x["k2"] = torch.ones_like(x["q2"])           # un-normalised: the all-ones key itself
    y, ht = run(reference, x, mode)
    g2 = torch.zeros(B, T, H, K, dtype=torch.float64) if x["g"] is None else decay_2d(x["g"], K, E, 0)
    b, w = gdn2_gates(x, mode, K, V)
    y2, ht2 = naive_gdn2(x["q1"], x["k1"], x["v"], g2, E * b, w, scale=K ** -0.5, output_final_state=True)
    return compare(IDENTITIES, torch.float64,
                   {"output": (y, E * y2), "final_state": (ht, ht2[:, :, :, None].expand_as(ht))}, log=log)


def flattened_equals_2d(shape, seed, mode, gate, key_mode, reference=naive_tensor3d, log=True, regime="typical"):
    """The 3D state flattened to ``[K·E, V]`` is the 2D state with key ``vec(k1 ⊗ k2)``,
    query ``vec(q1 ⊗ q2)``, the gate broadcast to K·E channels and ``scale = K ** -0.5``."""
    x = tensor3d_inputs(shape, seed, mode, gate, key_mode, regime=regime)
    B, T, H, K, E, V = shape
    y, ht = run(reference, x, mode)
    g2 = torch.zeros(B, T, H, K * E, dtype=torch.float64) if x["g"] is None else decay_2d(x["g"], K, E)
    b, w = gdn2_gates(x, mode, K * E, V)
    y2, ht2 = naive_gdn2(vec(x["q1"], x["q2"]), vec(x["k1"], x["k2"]), x["v"], g2, b, w, scale=K ** -0.5,
                         initial_state=vec_state(x["initial_state"]), output_final_state=True)
    return compare(IDENTITIES, torch.float64, {"output": (y, y2), "final_state": (vec_state(ht), ht2)},
                   log=log)


def second_key_modes(shape, seed, key_mode, helper=second_query_key, log=True):
    """The mode helpers against their formulas: ones; ``1 / (1 + e^-x)``; ``e^x / Σ_E e^x``."""
    gen = generator(seed)
    B, T, H, _, E, _ = shape
    raw = {"q2": 3 * randn(gen, B, T, H, E), "k2": 3 * randn(gen, B, T, H, E)}
    q2, k2 = helper(raw["q2"], raw["k2"], key_mode)

    def formula(r):
        if key_mode == "ones":
            return torch.ones_like(r)
        if key_mode == "sigmoid":
            return 1.0 / (1.0 + torch.exp(-r))
        return torch.exp(r) / torch.exp(r).sum(-1, keepdim=True)

    return compare(IDENTITIES, torch.float64, {"q2": (q2, formula(raw["q2"])), "k2": (k2, formula(raw["k2"]))},
                   log=log)


def state_sizes(K, E, V, helper=state_size):
    """``state_size`` counts the numbers of a real state: the reference's 3D final state per
    head (diagonal) and a 2D head of key width K·E and value width V·E (cross).
    Returns ``{pairing: (|difference|, 0)}`` in the shape of ``compare``'s result."""
    x = tensor3d_inputs(Tensor3DShape(1, 1, 1, K, E, V), 0, "gla", "none", "ones")
    _, ht = run(naive_tensor3d, x, "gla")
    diagonal = ht[0, 0].numel()
    cross = torch.zeros(K * E, V * E).numel()
    return {"diagonal": (abs(helper(K, E, V, "diagonal") - diagonal), 0),
            "cross": (abs(helper(K, E, V, "cross") - cross), 0)}


# --- optimized vs reference -----------------------------------------------------------------------

def optimized_vs_reference(shape, seed, dtype, mode, gate, key_mode, optimized=chunk_tensor3d, log=True):
    """Outputs, final state and every gradient (q1, k1, q2, k2, v, g, β, initial state)."""
    x = tensor3d_inputs(shape, seed, mode, gate, key_mode)
    dev = triton_mode.device()
    names = NAMES + tuple(n for n in ("g", "beta") if x[n] is not None)
    ins = {n: cast(x[n], dtype, dev, True) for n in names}
    h0 = cast(x["initial_state"], torch.float32, dev, True)
    y, ht = optimized(*(ins[n] for n in NAMES), ins.get("g"), ins.get("beta"), mode, initial_state=h0,
                      output_final_state=True)
    ((y.float() * x["dy"].to(dev, torch.float32)).sum()
     + (ht * x["dht"].to(dev, torch.float32)).sum()).backward()

    refs = {n: as_reference(x[n], dtype, True) for n in names}
    h0_ref = as_reference(x["initial_state"], torch.float32, True)
    y_ref, ht_ref = naive_tensor3d(*(refs[n] for n in NAMES), refs.get("g"), refs.get("beta"), mode,
                                   initial_state=h0_ref, output_final_state=True)
    ((y_ref * x["dy"]).sum() + (ht_ref * x["dht"]).sum()).backward()

    pairs = {"output": (y, y_ref), "final_state": (ht, ht_ref)}
    pairs.update({f"d{n}": (grad_or_zero(ins[n]), refs[n].grad) for n in names})
    pairs["dinitial_state"] = (grad_or_zero(h0), h0_ref.grad)
    return compare(f"tensor3d_{mode}", dtype, pairs, log=log)



def optimized_defaults(shape, seed, mode, gate, optimized=chunk_tensor3d, log=True):
    """Default arguments: no initial state (zeros), no final state asked for (None
    returned), default scale ``K ** -0.5``; output in q1's dtype."""
    x = tensor3d_inputs(shape, seed, mode, gate, "softmax", initial_state=False)
    dev = triton_mode.device()
    names = NAMES + ("g", "beta")
    y, ht = optimized(*(cast(x[n], torch.float32, dev) for n in names), mode=mode)
    y_ref, _ = naive_tensor3d(*(x[n] for n in names), mode=mode)
    errors = compare(f"tensor3d_{mode}", torch.float32, {"output": (y, y_ref)}, log=log)
    if ht is not None or y.dtype != torch.float32:
        errors["defaults"] = (float("inf"), 0.0)
    return errors
