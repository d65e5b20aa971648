"""A learned activation budget: a Stable-Baselines3 policy trained by ``flowgym train``."""

from __future__ import annotations

import importlib.resources
import math
import os
import pickle
import re
import reprlib
from typing import Any

import numpy as np

from flowgym.agents.base import Agent
from flowgym.envs.flow_control import OBSERVATION_OPTIONS, FlowControlConfig
from flowgym.envs.spaces import LOAD_OBSERVATIONS, MULTIPLIER_OF, log_multiplier_size
from flowgym.envs.view import SystemView
from flowgym.sim import _json
from flowgym.sim._checks import is_count
from flowgym.sim.estimators import FEATURE_VERSIONS
from flowgym.sim.latency import PRESETS as LATENCY_PRESETS

__all__ = [
    "LearnedBudget",
    "DEFAULT_MODEL",
    "POLICY_FILE",
    "NORM_FILE",
    "write_safe",
    "resave",
    "ACTION_RULES",
    "ALGORITHMS",
    "MODEL_FILE",
    "VECNORM_FILE",
    "META_FILE",
    "algorithm_class",
    "policy_action",
    "require_sb3",
    "valid_levels",
    "ArrayPolicy",
    "MemoryArrayPolicy",
    "ARRAYS_FILE",
    "ARRAY_ALGORITHMS",
]

# --------------------------------------------------------------------------- the model directory format
# The learned agent owns what a model directory holds; training imports these names.

#: Files of a model directory (written by :func:`flowgym.lab.train.train`, read here). The agent
#: loads only ``POLICY_FILE`` (tensors, ``torch.load(weights_only=True)``), ``NORM_FILE`` (plain
#: arrays, no pickle) and ``META_FILE`` (JSON): nothing in them can run code. ``MODEL_FILE`` and
#: ``VECNORM_FILE`` are SB3's own formats (pickle inside), kept to continue training with SB3 and
#: read only when the caller trusts the directory (``trust=True``).
MODEL_FILE = "model.zip"
VECNORM_FILE = "vecnormalize.pkl"
META_FILE = "flowgym_agent.json"
POLICY_FILE = "policy.pt"
NORM_FILE = "normalization.npz"
#: The shipped generalist (``learned`` with no path): the pickle-free files of ``flowgym train``
#: with no scenario, installed with the package (reproduce: ``flowgym train``; docs/training.md).
DEFAULT_MODEL = str(importlib.resources.files("flowgym.data") / "models" / "generalist")
#: The policy of a derivative-free search (``flowgym train --algo ars``): plain arrays, read with
#: ``numpy.load(allow_pickle=False)``; such a model needs neither torch nor Stable-Baselines3.
ARRAYS_FILE = "policy.npz"
#: Algorithms whose policy is an :class:`ArrayPolicy` in ``ARRAYS_FILE`` (not an SB3 policy).
ARRAY_ALGORITHMS = ("ars",)
#: Version of the layout of a model directory (2: the policy and normalisation load without pickle).
FORMAT_VERSION = 2

#: SB3 and sb3-contrib algorithms known by short name: the only ones a model directory may name
#: unless trusted (anything else: ``"package.module:Class"``, imported only with ``trust=True``).
ALGORITHMS = {"ppo": "stable_baselines3:PPO", "a2c": "stable_baselines3:A2C", "dqn": "stable_baselines3:DQN",
              "sac": "stable_baselines3:SAC", "td3": "stable_baselines3:TD3", "ddpg": "stable_baselines3:DDPG",
              "qrdqn": "sb3_contrib:QRDQN", "trpo": "sb3_contrib:TRPO", "maskable-ppo": "sb3_contrib:MaskablePPO",
              "recurrent-ppo": "sb3_contrib:RecurrentPPO"}
#: What a recurrent (LSTM) policy's constructor may read from ``flowgym_agent.json``'s ``policy_kwargs``, and the
#: type each must have (:func:`write_safe` records them from the trained policy).
LSTM_KWARGS = {"lstm_hidden_size": int, "n_lstm_layers": int, "shared_lstm": bool, "enable_critic_lstm": bool}

#: How a trained policy's action distribution becomes a budget (see :func:`policy_action`).
ACTION_RULES = ("mean", "mode")


def require_sb3() -> None:
    """Raise ``ImportError`` with the install hint when Stable-Baselines3 or torch is missing."""
    try:
        import stable_baselines3  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"training and learned agents need Stable-Baselines3 and torch ({e}); "
            "install them with: pip install -e '.[train]' in the flowgym checkout"
        ) from None


def algorithm_class(algo: str) -> type:
    """The SB3 algorithm class of ``algo`` (a short name or ``"package.module:Class"``)."""
    import importlib

    target = ALGORITHMS.get(algo.lower(), algo)
    mod, _, cls = target.partition(":")
    if not cls:
        raise ValueError(f"algo must be one of {sorted(ALGORITHMS)} or 'package.module:Class', got {algo!r}")
    try:
        return getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load algorithm {algo!r}: {e}") from None


def policy_alias(algo_cls: type) -> str:
    """The name of ``algo_cls``'s multilayer-perceptron policy: ``"MlpLstmPolicy"`` for a recurrent algorithm
    (sb3-contrib's ``RecurrentPPO``), else ``"MlpPolicy"``."""
    return "MlpLstmPolicy" if "MlpLstmPolicy" in getattr(algo_cls, "policy_aliases", {}) else "MlpPolicy"


def is_recurrent(model: Any) -> bool:
    """Whether ``model`` (an SB3 algorithm or policy) carries a hidden state from one decision to the next."""
    policy = getattr(model, "policy", model)
    return hasattr(policy, "lstm_actor") or getattr(policy, "recurrent", False) is True


def valid_levels(levels: Any) -> bool:
    """Budget levels are a list or tuple of at least two ascending, distinct, non-negative integers."""
    if not isinstance(levels, (list, tuple)) or len(levels) < 2:
        return False
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in levels):
        return False
    return all(b > a for a, b in zip(levels, levels[1:]))


def policy_action(model: Any, obs: np.ndarray, rule: str = "mean") -> np.ndarray:
    """Deterministic budgets of ``model`` for a batch of (normalised) observations.

    ``"mode"`` is SB3's ``predict(deterministic=True)``, the most likely budget.
    ``"mean"`` is the expected budget under the policy's action distribution,
    rounded: for an ordinal action such as a budget it is steadier than the mode,
    which jumps when a spread distribution's peak moves (on adaptive-switch the
    mode of one policy gave 1472 slots of time in system, its mean 93). Algorithms
    without an action distribution (DQN) fall back to ``"mode"``. With
    ``budget_levels`` the actions are level indices and so is the result (the
    expected index, rounded, for ``"mean"``).
    """
    obs = np.asarray(obs, dtype=np.float32)
    policy = getattr(model, "policy", model)  # an SB3 algorithm, or its policy alone
    if rule == "mean" and hasattr(policy, "get_distribution"):
        import torch

        with torch.no_grad():
            t, _ = policy.obs_to_tensor(obs)
            dist = policy.get_distribution(t).distribution
        probs = getattr(dist, "probs", None)
        if probs is not None and probs.ndim == 2:
            return _expected_index(probs)
    action, _ = model.predict(obs, deterministic=True)
    return np.asarray(action)


def _expected_index(probs: Any) -> np.ndarray:
    """The expected index of each row of a batch of discrete distributions (a torch tensor), rounded."""
    p = probs.cpu().numpy().astype(np.float64)
    return np.rint(p @ np.arange(p.shape[1])).astype(np.int64)


def recurrent_action(model: Any, obs: np.ndarray, state: Any, episode_start: Any,
                     rule: str = "mean") -> tuple[np.ndarray, Any]:
    """:func:`policy_action` for a recurrent policy (``recurrent-ppo``): the deterministic actions of a batch of
    (normalised) observations and the LSTM state after them.

    ``state`` is the state :func:`recurrent_action` returned for the previous decision (``None``: zeros);
    ``episode_start`` marks, per row, a decision that starts an episode (its state is reset to zeros first;
    ``None``: every row when ``state`` is ``None``, else none).
    The rules are :func:`policy_action`'s: ``"mean"`` of a discrete budget distribution is its expected
    index, rounded; otherwise the policy's ``predict(deterministic=True)`` (a continuous action's mean).
    """
    obs = np.asarray(obs, dtype=np.float32)
    starts = (np.full(len(obs), state is None) if episode_start is None
              else np.asarray(episode_start, dtype=bool).reshape(len(obs)))
    policy = getattr(model, "policy", model)
    if rule == "mean" and hasattr(policy.action_space, "n"):
        import torch

        if state is None:
            zeros = np.zeros((policy.lstm_hidden_state_shape[0], len(obs), policy.lstm_hidden_state_shape[2]))
            state = (zeros, zeros)
        with torch.no_grad():
            t, _ = policy.obs_to_tensor(obs)
            lstm = tuple(torch.as_tensor(x, dtype=torch.float32, device=policy.device) for x in state)
            dist, new = policy.get_distribution(t, lstm, torch.as_tensor(starts, dtype=torch.float32,
                                                                         device=policy.device))
        return _expected_index(dist.distribution.probs), tuple(x.cpu().numpy() for x in new)
    action, state = policy.predict(obs, state=state, episode_start=starts, deterministic=True)
    return np.asarray(action), state


# --------------------------------------------------------------------------- loading without pickle


def _known_target(target: Any) -> str | None:
    """The :data:`ALGORITHMS` entry that ``"package[.module...]:Class"`` names (same top package and class), if any:
    ``"stable_baselines3.sac.sac:SAC"`` and ``"stable_baselines3:SAC"`` name ``"stable_baselines3:SAC"``."""
    if not isinstance(target, str) or ":" not in target:
        return None
    mod, _, cls = target.partition(":")
    for known in ALGORITHMS.values():
        kmod, _, kcls = known.partition(":")
        if cls == kcls and mod.split(".")[0] == kmod:
            return known
    return None


def _algorithm(meta: dict[str, Any], trust: bool) -> type:
    """The algorithm class a model directory names: from :data:`ALGORITHMS` unless trusted."""
    name = meta.get("algo")
    target = meta.get("algo_class")
    if isinstance(name, str) and name.lower() in ALGORITHMS:
        return algorithm_class(name)
    known = _known_target(name) or _known_target(target)
    if known is not None:  # a known class under its full name: import it from its package, not the recorded module
        return algorithm_class(known)
    if trust and isinstance(target, str):
        return algorithm_class(target)
    raise ValueError(f"learned agent: the model directory names the algorithm {name!r} ({target!r}), which is "
                     f"not one of {sorted(ALGORITHMS)}; importing another module runs its code: pass trust=True "
                     "only for a directory you trust")


def action_space_of(meta: dict[str, Any]) -> Any:
    """The policy's action space that ``flowgym_agent.json`` records: ``Discrete(action_n)``, or the
    ``Box(-1, 1, (1,))`` of ``action="log-multiplier"`` (``(2,)`` with ``multiplier_of="max"`` or ``"max-head"``,
    ``(3,)`` with ``"max-drain"``;
    ``"action_space": {"kind": "box", ...}``)."""
    from gymnasium import spaces

    desc = meta.get("action_space")
    if desc is None and meta.get("action_n") == 0:  # what an ARS model writes beside its box: the box is missing
        raise ValueError(f"learned agent: {META_FILE} has no action_space (action_n=0: a model whose action is a "
                         "box records it there)")
    if desc is None or desc == {"kind": "discrete", "n": meta.get("action_n")}:
        n = meta.get("action_n")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"learned agent: {META_FILE} has action_n={n!r}; it must be a positive integer")
        return spaces.Discrete(n)
    if isinstance(desc, dict) and desc.get("kind") == "box":
        low, high = desc.get("low"), desc.get("high")
        if (not isinstance(low, list) or not isinstance(high, list) or len(low) != len(high) or not low
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                           for v in low + high) or any(a >= b for a, b in zip(low, high))):
            raise ValueError(f"learned agent: {META_FILE} has action_space={desc!r}; a box needs finite low < high lists")
        return spaces.Box(np.array(low, np.float32), np.array(high, np.float32), dtype=np.float32)
    if isinstance(desc, dict) and desc.get("kind") == "discrete" and "action_n" in meta:  # both say n: they differ
        raise ValueError(f"learned agent: {META_FILE} has action_n={meta.get('action_n')!r} but action_space="
                         f"{desc!r}: the two must give the same number of actions")
    raise ValueError(f"learned agent: {META_FILE} has action_space={desc!r}; expected "
                     "{'kind': 'discrete', 'n': N} or {'kind': 'box', 'low': [...], 'high': [...]}")


def describe_action_space(space: Any) -> dict[str, Any]:
    """The JSON description of an action space that :func:`action_space_of` reads back."""
    if hasattr(space, "n"):
        return {"kind": "discrete", "n": int(space.n)}
    return {"kind": "box", "low": [float(v) for v in np.ravel(space.low)],
            "high": [float(v) for v in np.ravel(space.high)]}


def _load_safe(path: str, meta: dict[str, Any], trust: bool) -> tuple[Any, Any]:
    """The policy from tensors (``torch.load(weights_only=True)``) and the normalisation from plain arrays."""
    import torch
    from gymnasium import spaces

    cls = _algorithm(meta, trust)
    arrays, norm = _load_norm(path)
    obs_space = spaces.Box(arrays["obs_low"].astype(np.float32), arrays["obs_high"].astype(np.float32),
                           dtype=np.float32)
    act_space = action_space_of(meta)
    kwargs = meta.get("policy_kwargs", {})
    alias = policy_alias(cls)
    allowed = ["net_arch", *(LSTM_KWARGS if alias == "MlpLstmPolicy" else ())]
    if not isinstance(kwargs, dict) or set(kwargs) - set(allowed):
        raise ValueError(f"learned agent: {META_FILE} in {path!r}: policy_kwargs may only hold "
                         f"{', '.join(allowed)}, got {kwargs!r}")
    for key, kind in LSTM_KWARGS.items():
        v = kwargs.get(key)
        if v is not None and (type(v) is not kind or (kind is int and v < 1)):
            raise ValueError(f"learned agent: {META_FILE} in {path!r}: policy_kwargs {key}={v!r}; expected "
                             f"{'a positive integer' if kind is int else 'true or false'}")
    _check_policy_size(path)
    try:
        state = torch.load(os.path.join(path, POLICY_FILE), map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling refusal, not a file of tensors
        raise ValueError(f"learned agent: {POLICY_FILE} in {path!r} is not a file of plain tensors; nothing in it "
                         f"was run ({_brief(e)})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"learned agent: {POLICY_FILE} in {path!r} does not hold a mapping of names to tensors")
    for k, v in state.items():
        if v.layout is not torch.strided or v.device.type != "cpu":  # torch's checks below would fail on them, raw
            what = f"a {v.layout} tensor" if v.layout is not torch.strided else f"a tensor on device {v.device.type!r}"
            raise ValueError(f"learned agent: {POLICY_FILE} in {path!r}: tensor {k!r} is {what}; expected dense "
                             "weights in memory (torch.strided, on the cpu)")
        if not (v.dtype.is_floating_point and not v.dtype.is_complex):
            raise ValueError(f"learned agent: {POLICY_FILE} in {path!r}: tensor {k!r} holds {v.dtype} values; "
                             "expected real floating-point weights")
        if not bool(torch.isfinite(v).all()):
            raise ValueError(f"learned agent: {POLICY_FILE} in {path!r}: tensor {k!r} holds a non-finite value")
    policy_cls = cls.policy_aliases[alias]
    # the sizes the JSON and the normalisation file give must be the tensors', checked before the policy is
    # built: a size in flowgym_agent.json alone could ask for gigabytes
    try:
        if alias == "MlpLstmPolicy":
            _check_lstm_kwargs(policy_cls, kwargs, state)
        _check_shapes(policy_cls, obs_space, act_space, kwargs, state)
    except ValueError as e:
        raise ValueError(f"learned agent: {META_FILE} and {NORM_FILE} in {path!r} do not describe the tensors in "
                         f"{POLICY_FILE}: {e}") from None
    try:
        policy = policy_cls(obs_space, act_space, lambda _: 0.0, **kwargs)
        policy.load_state_dict(state)
    except Exception as e:  # a missing or mismatched tensor: torch's first line names no tensor, its next ones do
        raise ValueError(f"learned agent: {POLICY_FILE} in {path!r} is not this policy's tensors "
                         f"({_brief(e, lines=3)})") from None
    policy.set_training_mode(False)
    return policy, norm


def _check_policy_size(path: str) -> None:
    """Raise ``ValueError`` if ``POLICY_FILE`` in ``path``, a zip archive (torch's format), would inflate to more
    than :data:`MAX_ARRAY_ELEMENTS` numbers of 8 bytes and :data:`POLICY_INDEX_BYTES` (its members' sizes, read
    from the archive's directory before ``torch.load`` reads anything): a file of a few KB whose members are
    compressed could hold gigabytes. Another file is left to ``torch.load`` (which reads or refuses it)."""
    import zipfile

    file = os.path.join(path, POLICY_FILE)
    try:
        with open(file, "rb") as raw:
            if raw.read(4) != b"PK\x03\x04":  # what torch.load reads as a zip archive
                return
        with zipfile.ZipFile(file) as z:
            size = sum(info.file_size for info in z.infolist())
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        raise ValueError(f"learned agent: {POLICY_FILE} in {path!r} is not a file of plain tensors; nothing in it "
                         f"was run ({_brief(e)})") from None
    cap = MAX_ARRAY_ELEMENTS * 8 + POLICY_INDEX_BYTES
    if size > cap:
        raise ValueError(f"learned agent: {POLICY_FILE} in {path!r} holds {size} bytes uncompressed, more than "
                         f"{cap} ({MAX_ARRAY_ELEMENTS} numbers of 8 bytes and {POLICY_INDEX_BYTES} for the names); "
                         "nothing in it was read")


def _brief(e: Exception, lines: int = 1) -> str:
    """``Type: first line`` of an exception's message (its first ``lines`` non-empty lines, joined, each cut at
    300 characters), without terminal colour codes (torch's has them)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    kept = [ln.strip()[:300] for ln in text.splitlines() if ln.strip()][:lines]
    return f"{type(e).__name__}: {' '.join(kept)}"


def _check_shapes(policy_cls: type, obs_space: Any, act_space: Any, kwargs: dict[str, Any], state: Any) -> None:
    """Raise ``ValueError`` unless the sizes an SB3 policy would be built with are those of the weight matrices
    in ``state``, so that what it builds is a small multiple of the file's own contents at most (a list shared
    by the actor and the critics, and the target networks, are built once per network):

    * the observation's size is the input size of some matrix (the first layer's);
    * the action's size (``n`` of a discrete action, the length of a box) divides the output size of some
      matrix (the action head's; QR-DQN's is ``n`` times its quantiles);
    * each list of ``net_arch`` the policy reads (the list itself, or ``pi`` and ``vf`` of an actor-critic,
      ``pi`` and ``qf`` of the others) asks only for layers it holds: the first ``(width, input)`` with the
      input the observation's size, the observation's and the action's (a critic), or the LSTM's hidden
      size, and each later one ``(width, previous width)``, each matrix used once over all the lists."""
    from collections import Counter

    from stable_baselines3.common.policies import ActorCriticPolicy

    shapes = Counter(tuple(v.shape) for v in state.values() if v.ndim == 2 and min(v.shape) > 0)
    obs_n, act_n = int(np.prod(obs_space.shape)), int(getattr(act_space, "n", 0) or np.prod(act_space.shape))
    if not any(s[1] == obs_n for s in shapes):
        raise ValueError(f"the observation has {obs_n} entries ({NORM_FILE}'s obs_low), which no weight matrix reads")
    if not any(s[0] % act_n == 0 for s in shapes):  # s[0] > 0: an empty matrix outputs nothing
        raise ValueError(f"the action has size {act_n} (action_n or action_space), which no weight matrix outputs")
    net_arch = kwargs.get("net_arch")
    if net_arch is None:
        return
    shown = reprlib.repr(net_arch)
    if isinstance(net_arch, dict):
        known = ("pi", "vf") if issubclass(policy_cls, ActorCriticPolicy) else ("pi", "qf")
        if set(net_arch) - {"pi", "vf", "qf"}:
            raise ValueError(f"policy_kwargs net_arch={shown}: a dict may only have the keys pi, vf, qf")
        lists = [net_arch[k] for k in known if k in net_arch]  # the keys this policy reads
    else:
        lists = [net_arch]
    # a first layer reads the observation, a critic's the observation and the action, a recurrent policy's the
    # LSTM's output (its hidden size, already checked against the tensors)
    inputs = {obs_n, obs_n + act_n, *(int(v.shape[1]) for k, v in state.items() if "weight_hh" in k and v.ndim == 2)}
    for widths in lists:
        if not isinstance(widths, list) or any(type(w) is not int or w < 1 for w in widths):
            raise ValueError(f"policy_kwargs net_arch={shown}: expected a list of positive integer widths, or a dict "
                             "of such lists under pi, vf, qf")
        for i, w in enumerate(widths):
            have = [s for s in shapes if shapes[s] and s[0] == w and (s[1] == widths[i - 1] if i else s[1] in inputs)]
            if not have:
                raise ValueError(f"policy_kwargs net_arch={shown} asks for a layer of width {w}"
                                 f"{f' after {widths[i - 1]}' if i else ''} that the tensors do not hold")
            shapes[have[0]] -= 1  # each matrix serves one layer


def _check_lstm_kwargs(policy_cls: type, kwargs: dict[str, Any], state: Any) -> None:
    """Raise ``ValueError`` unless the recurrent policy's ``policy_kwargs`` (``policy_cls``'s defaults where absent)
    describe the LSTMs whose tensors ``state`` holds: hidden size, layer count, a critic LSTM or not."""
    import inspect

    params = inspect.signature(policy_cls).parameters
    kwargs = {**{k: params[k].default for k in LSTM_KWARGS}, **kwargs}
    for name, present in (("lstm_actor", True), ("lstm_critic", kwargs["enable_critic_lstm"] and not kwargs["shared_lstm"])):
        layers = sum(1 for k in state if k.startswith(f"{name}.weight_hh_l"))
        if not present:
            if layers:
                raise ValueError(f"policy_kwargs ask for no {name} but the tensors hold one")
            continue
        want_h, want_n = kwargs["lstm_hidden_size"], kwargs["n_lstm_layers"]
        w = state.get(f"{name}.weight_hh_l0")
        have_h = None if w is None or w.ndim != 2 else int(w.shape[1])
        if layers != want_n or have_h != want_h:
            raise ValueError(f"policy_kwargs ask for {name} with lstm_hidden_size={want_h}, n_lstm_layers={want_n}; "
                             f"the tensors hold hidden size {have_h} in {layers} layer(s)")


def _load_trusted(path: str, meta: dict[str, Any]) -> tuple[Any, Any]:
    """SB3's zip and VecNormalize pickle (format 1, or when asked): only for trusted directories."""
    cls = _algorithm(meta, True)
    model = cls.load(os.path.join(path, MODEL_FILE), device="cpu")
    norm = None
    vn = os.path.join(path, VECNORM_FILE)
    if os.path.exists(vn):
        with open(vn, "rb") as fh:
            vec = pickle.load(fh)
        if vec.norm_obs:
            norm = (np.asarray(vec.obs_rms.mean, dtype=np.float64),
                    np.sqrt(np.asarray(vec.obs_rms.var, dtype=np.float64) + vec.epsilon), float(vec.clip_obs))
    return model, norm


def write_safe(path: str, policy: Any, norm: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``POLICY_FILE`` and ``NORM_FILE`` for an SB3 ``policy`` and a ``VecNormalize`` (or ``None``);
    return ``meta`` updated to :data:`FORMAT_VERSION` (the caller writes it)."""
    import torch

    torch.save({k: v.detach().cpu() for k, v in policy.state_dict().items()}, os.path.join(path, POLICY_FILE))
    space = policy.observation_space
    arrays = {"obs_low": np.asarray(space.low), "obs_high": np.asarray(space.high)}
    if norm is not None and norm.norm_obs:
        arrays.update(obs_mean=np.asarray(norm.obs_rms.mean, dtype=np.float64),
                      obs_var=np.asarray(norm.obs_rms.var, dtype=np.float64),
                      epsilon=np.float64(norm.epsilon), clip_obs=np.float64(norm.clip_obs))
    np.savez(os.path.join(path, NORM_FILE), **arrays)
    net_arch = getattr(policy, "net_arch", None)
    out = dict(meta)
    out["format"] = FORMAT_VERSION
    if net_arch is not None:
        out["policy_kwargs"] = {"net_arch": net_arch if not isinstance(net_arch, tuple) else list(net_arch)}
    if hasattr(policy, "lstm_actor"):  # what rebuilds its LSTM
        out.setdefault("policy_kwargs", {}).update(
            lstm_hidden_size=int(policy.lstm_actor.hidden_size), n_lstm_layers=int(policy.lstm_actor.num_layers),
            shared_lstm=bool(policy.shared_lstm), enable_critic_lstm=bool(policy.enable_critic_lstm))
    return out


def resave(path: str) -> None:
    """Convert a trusted model directory to the format that loads without pickle (in place)."""
    with open(os.path.join(path, META_FILE)) as fh:
        meta = _json.loads(fh.read())
    model, _ = _load_trusted(path, meta)
    vec = None
    vn = os.path.join(path, VECNORM_FILE)
    if os.path.exists(vn):
        with open(vn, "rb") as fh:
            vec = pickle.load(fh)
    meta = write_safe(path, model.policy, vec, meta)
    with open(os.path.join(path, META_FILE), "w") as fh:
        _json.dump(meta, fh, indent=1)


class ArrayPolicy:
    """A small tanh network in numpy: ``a = tanh(W_n ... tanh(W_1 x + b_1) ... + b_n)``, actions in ``[-1, 1]``.

    The policy of ``flowgym train --algo ars`` (:mod:`flowgym.lab.ars`), for the continuous
    ``action="log-multiplier"`` (one output; two with ``multiplier_of="max"`` or ``"max-head"``, three with
    ``"max-drain"``). ``layers`` is a
    list of ``(W, b)`` pairs, ``W`` of shape ``(out, in)``; one pair is a linear policy; the last
    layer's ``out`` is the action's size (1, 2 or 3). ``predict`` mirrors SB3's so
    :func:`policy_action` and :class:`LearnedBudget` treat it like an SB3 model.
    """

    #: Whether the policy carries a state from one decision to the next (:class:`MemoryArrayPolicy`).
    recurrent = False

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], obs_low: np.ndarray, obs_high: np.ndarray,
                 _extra_inputs: int = 0) -> None:
        from gymnasium import spaces

        if not layers:
            raise ValueError("ArrayPolicy needs at least one (W, b) layer")
        self.layers = [(np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)) for w, b in layers]
        n_in = np.asarray(obs_low).shape[0] + _extra_inputs
        for i, (w, b) in enumerate(self.layers):
            if w.ndim != 2 or b.shape != (w.shape[0],) or w.shape[1] != n_in:
                raise ValueError(f"ArrayPolicy: layer {i} has W {w.shape} and b {b.shape}; expected W of shape "
                                 f"(n, {n_in}) and b of shape (n,)")
            if not (np.all(np.isfinite(w)) and np.all(np.isfinite(b))):
                raise ValueError(f"ArrayPolicy: layer {i} holds a non-finite weight")
            n_in = w.shape[0]
        if n_in not in (1, 2, 3):
            raise ValueError(f"ArrayPolicy: the last layer has {n_in} outputs; the action is one float "
                             "(two: multiplier_of='max' or 'max-head'; three: 'max-drain')")
        self.observation_space = spaces.Box(np.asarray(obs_low, np.float32), np.asarray(obs_high, np.float32),
                                            dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (n_in,), dtype=np.float32)

    @classmethod
    def from_vector(cls, theta: np.ndarray, sizes: list[int], obs_low: np.ndarray,
                    obs_high: np.ndarray) -> ArrayPolicy:
        """The network with layer sizes ``sizes`` (inputs first, the action's size last) whose weights, layer by layer
        (``W`` row-major, then ``b``), are ``theta``."""
        layers, k = [], 0
        for a, b in zip(sizes[:-1], sizes[1:]):
            w = theta[k:k + a * b].reshape(b, a)
            k += a * b
            layers.append((w, theta[k:k + b]))
            k += b
        if k != len(theta):
            raise ValueError(f"ArrayPolicy: {len(theta)} weights for layer sizes {sizes} (which need {k})")
        return cls(layers, obs_low, obs_high)

    @staticmethod
    def n_weights(sizes: list[int]) -> int:
        """How many weights a network of layer sizes ``sizes`` has."""
        return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of normalised observations, shape ``(n, action size)``."""
        h = np.asarray(obs, dtype=np.float64)
        for w, b in self.layers:
            h = np.tanh(h @ w.T + b)
        return h

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, None]:
        """SB3's signature: the (deterministic) actions of a batch of observations."""
        return self(np.asarray(obs)).astype(np.float32), None

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights as ``ARRAYS_FILE`` stores them (``w0``, ``b0``, ``w1``, ...)."""
        out: dict[str, np.ndarray] = {}
        for i, (w, b) in enumerate(self.layers):
            out[f"w{i}"], out[f"b{i}"] = w, b
        return out


class MemoryArrayPolicy(ArrayPolicy):
    """An :class:`ArrayPolicy` with a memory: ``m`` leaky tanh units carried from one decision to the next.

    At each decision, with ``x`` the normalised observation and ``h`` the memory (zeros at the start of an
    episode)::

        h' = (1 - leak) * h + leak * tanh(U x + A h + c)      # leak: one fixed rate in (0, 1] per unit
        a  = network(concat(x, h'))                           # the layers of ArrayPolicy

    A leaky (continuous-time) recurrent layer: each unit is an exponential average, at its own time
    constant ``1 / leak`` decisions, of a learned projection of the load features and of the memory itself.
    ``U`` has shape ``(m, n_obs)``, ``A`` ``(m, m)``, ``c`` and ``leak`` ``(m,)``; the first layer reads
    ``n_obs + m`` inputs. ``predict`` takes and returns the memory as SB3's recurrent policies take and
    return their LSTM state (``state``: ``(n, m)`` or ``None`` for zeros; ``episode_start`` resets rows), so
    :class:`LearnedBudget` carries it through an episode (``flowgym train --algo ars --memory m``;
    docs/training.md, "A memory searched by ARS").
    """

    recurrent = True

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], obs_low: np.ndarray, obs_high: np.ndarray,
                 mem_u: np.ndarray, mem_a: np.ndarray, mem_b: np.ndarray, mem_leak: np.ndarray) -> None:
        u, a = np.asarray(mem_u, dtype=np.float64), np.asarray(mem_a, dtype=np.float64)
        c, leak = np.asarray(mem_b, dtype=np.float64), np.asarray(mem_leak, dtype=np.float64)
        n_obs = np.asarray(obs_low).shape[0]
        m = u.shape[0] if u.ndim == 2 else -1
        if m < 1 or u.shape != (m, n_obs) or a.shape != (m, m) or c.shape != (m,) or leak.shape != (m,):
            raise ValueError(f"MemoryArrayPolicy: mem_u {u.shape}, mem_a {a.shape}, mem_b {c.shape} and mem_leak "
                             f"{leak.shape}; expected (m, {n_obs}), (m, m), (m,) and (m,) with m >= 1")
        for name, v in (("mem_u", u), ("mem_a", a), ("mem_b", c)):
            if not np.all(np.isfinite(v)):
                raise ValueError(f"MemoryArrayPolicy: {name} holds a non-finite weight")
        if not np.all((leak > 0) & (leak <= 1)):
            raise ValueError(f"MemoryArrayPolicy: every mem_leak must be in (0, 1], got {leak.tolist()}")
        super().__init__(layers, obs_low, obs_high, _extra_inputs=m)
        self.mem_u, self.mem_a, self.mem_b, self.mem_leak = u, a, c, leak
        self.memory = m

    @staticmethod
    def leaks(m: int) -> np.ndarray:
        """The fixed leak rates of ``flowgym train --memory m``: time constants ``1 / leak`` spread evenly on a
        log scale from 2 to 128 decisions (16 to 1,024 slots at 8 slots a decision); 16 for one unit."""
        if m == 1:
            return np.array([1.0 / 16.0])
        return 1.0 / (2.0 * 64.0 ** (np.arange(m) / (m - 1)))

    @staticmethod
    def n_weights(sizes: list[int], memory: int, n_obs: int) -> int:  # type: ignore[override]
        """How many weights the network of layer sizes ``sizes`` (its first reading ``n_obs + memory`` inputs)
        and a memory of ``memory`` units on ``n_obs`` features have."""
        return ArrayPolicy.n_weights(sizes) + memory * (n_obs + memory + 1)

    @classmethod
    def from_vector(cls, theta: np.ndarray, sizes: list[int], obs_low: np.ndarray,  # type: ignore[override]
                    obs_high: np.ndarray, leak: np.ndarray | None = None) -> MemoryArrayPolicy:
        """The policy whose weights are ``theta``: the network's (as :meth:`ArrayPolicy.from_vector`, layer
        sizes ``sizes``, the first ``n_obs + m``), then ``U`` and ``A`` row-major and ``c``; ``leak`` the fixed
        rates (``m`` of them)."""
        leak = np.asarray(leak, dtype=np.float64)
        m, n_obs = len(leak), np.asarray(obs_low).shape[0]
        n_net, need = ArrayPolicy.n_weights(sizes), MemoryArrayPolicy.n_weights(sizes, m, n_obs)
        if sizes[0] != n_obs + m or len(theta) != need:
            raise ValueError(f"MemoryArrayPolicy: {len(theta)} weights for layer sizes {sizes} and a memory of {m} "
                             f"on {n_obs} inputs (which need {need}, and sizes[0] = {n_obs + m})")
        net = ArrayPolicy.from_vector(theta[:n_net], sizes, np.zeros(sizes[0]), np.zeros(sizes[0]))
        k = n_net
        u = theta[k:k + m * n_obs].reshape(m, n_obs)
        k += m * n_obs
        a = theta[k:k + m * m].reshape(m, m)
        k += m * m
        return cls(net.layers, obs_low, obs_high, u, a, theta[k:k + m], leak)

    def step(self, obs: np.ndarray, h: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Actions ``(n, action size)`` and the new memory ``(n, m)`` for a batch of normalised observations
        and their memories (``None``: zeros)."""
        x = np.asarray(obs, dtype=np.float64)
        h = np.zeros((len(x), self.memory)) if h is None else np.asarray(h, dtype=np.float64)
        h = (1.0 - self.mem_leak) * h + self.mem_leak * np.tanh(x @ self.mem_u.T + h @ self.mem_a.T + self.mem_b)
        return ArrayPolicy.__call__(self, np.hstack([x, h])), h

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of normalised observations, each from an empty memory (an episode's first decision)."""
        return self.step(obs)[0]

    def predict(self, obs: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[override]
        """SB3's recurrent signature: the actions and the memory after them; rows where ``episode_start`` is
        true start from zeros."""
        x = np.asarray(obs, dtype=np.float64)
        h = np.zeros((len(x), self.memory)) if state is None else np.array(state, dtype=np.float64)
        if episode_start is not None:
            h[np.asarray(episode_start, dtype=bool).reshape(len(x))] = 0.0
        actions, h = self.step(x, h)
        return actions.astype(np.float32), h

    def arrays(self) -> dict[str, np.ndarray]:
        """The weights as ``ARRAYS_FILE`` stores them (the layers', then ``mem_u``, ``mem_a``, ``mem_b``,
        ``mem_leak``)."""
        return {**super().arrays(), "mem_u": self.mem_u, "mem_a": self.mem_a, "mem_b": self.mem_b,
                "mem_leak": self.mem_leak}


#: The arrays of a :class:`MemoryArrayPolicy`'s memory in ``ARRAYS_FILE`` (all four, or none).
MEMORY_KEYS = ("mem_u", "mem_a", "mem_b", "mem_leak")

#: The most numbers one array of a model's ``.npz`` files may hold (16.8M: 134 MB of float64, far beyond any policy
#: or observation here). Checked on each array's header before it is read, so that a small file whose header
#: asks for a huge (zero-filled, well-compressed) array is refused instead of allocated.
MAX_ARRAY_ELEMENTS = 1 << 24
#: What ``POLICY_FILE`` (a zip archive) may hold beyond :data:`MAX_ARRAY_ELEMENTS` numbers of 8 bytes, uncompressed:
#: its index of tensor names and its version records (a few KB for the policies here).
POLICY_INDEX_BYTES = 1 << 20

#: The arrays ``NORM_FILE`` may hold (what :func:`write_safe` and ``flowgym train --algo ars`` write).
NORM_KEYS = ("obs_low", "obs_high", "obs_mean", "obs_var", "epsilon", "clip_obs")


def _read_arrays(path: str, name: str, allowed: Any = None) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``name`` in ``path``, read without pickle; each must hold real numbers.

    The archive is read member by member (not through ``np.load``, which reads a lone ``.npy`` too and may
    read another member than the one checked): every member a ``name.npy`` array, each name once;
    ``allowed(key)`` says which array names the file may hold (any, by default). Each array's header is
    read first, and one of more than :data:`MAX_ARRAY_ELEMENTS` numbers, of more than 8 bytes a number or of
    a sub-array type is refused before any is read, as is a file whose arrays hold more than that together."""
    import zipfile
    import zlib

    where = f"learned agent: {name} in {path!r}"
    fmt = np.lib.format
    arrays: dict[str, np.ndarray] = {}
    try:
        if not os.path.isfile(os.path.join(path, name)):
            raise _Refused(f"{where} is missing")
        with open(os.path.join(path, name), "rb") as raw:
            if raw.read(4) != b"PK\x03\x04":  # a zip archive starts with a member (np.load reads a lone .npy)
                raise _Refused(f"{where} is not a plain array file (not an .npz archive of named arrays)")
        with zipfile.ZipFile(os.path.join(path, name)) as z:
            members = z.namelist()
            for member in members:
                if not member.endswith(".npy"):
                    raise _Refused(f"{where}: {member!r} is no array (an archive member that is not .npy)")
            keys = [m[:-4] for m in members]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:
                raise _Refused(f"{where} holds the arrays {twice} more than once")
            bad = sorted(k for k in keys if allowed is not None and not allowed(k))
            if bad:
                raise _Refused(f"{where} holds arrays {bad} that it has no use for")
            total = 0
            for k, member in zip(keys, members):  # every header before any data: the file's size in numbers
                with z.open(member) as fh:
                    version = fmt.read_magic(fh)
                    shape, _, dtype = (fmt.read_array_header_1_0(fh) if version == (1, 0)
                                       else fmt.read_array_header_2_0(fh))
                if dtype.shape != () or dtype.itemsize > 8:
                    raise _Refused(f"{where}: {k!r} holds {dtype} values; expected real numbers")
                if math.prod(shape) > MAX_ARRAY_ELEMENTS:
                    raise _Refused(f"{where}: {k!r} has shape {shape}, more than {MAX_ARRAY_ELEMENTS} numbers")
                total += math.prod(shape)
                if total > MAX_ARRAY_ELEMENTS:  # many arrays each under the cap (a few KB compressed each)
                    raise _Refused(f"{where}: its arrays hold more than {MAX_ARRAY_ELEMENTS} numbers together "
                                   f"(up to {k!r})")
            for k, member in zip(keys, members):
                with z.open(member) as fh:
                    arrays[k] = fmt.read_array(fh, allow_pickle=False)
    except _Refused as e:
        raise ValueError(str(e)) from None
    except (OSError, ValueError, KeyError, MemoryError, EOFError, zipfile.BadZipFile, zlib.error,
            NotImplementedError, RuntimeError) as e:  # ValueError: an object array (pickle refused), a bad header
        raise ValueError(f"{where} is not a plain array file ({_brief(e)})") from None
    for k, v in arrays.items():
        if v.dtype.kind not in "fiu":
            raise ValueError(f"{where}: {k!r} holds {v.dtype} values; expected real numbers")
    return arrays


class _Refused(Exception):
    """A model file refused for a reason its message states in full (not wrapped as 'not a plain array file')."""


def _load_norm(path: str) -> tuple[dict[str, np.ndarray], Any]:
    """``NORM_FILE``'s arrays (without pickle) and the normalisation ``(mean, std, clip)`` or ``None``."""
    arrays = _read_arrays(path, NORM_FILE, NORM_KEYS.__contains__)
    where = f"learned agent: {NORM_FILE} in {path!r}"
    for k in ("obs_low", "obs_high"):
        if k not in arrays:
            raise ValueError(f"{where} has no {k!r}")
    shape = arrays["obs_low"].shape
    if len(shape) != 1 or arrays["obs_high"].shape != shape:
        raise ValueError(f"{where}: obs_low and obs_high must be vectors of one length, got shapes "
                         f"{shape} and {arrays['obs_high'].shape}")
    low, high = arrays["obs_low"].astype(np.float64), arrays["obs_high"].astype(np.float64)
    if np.any(np.isnan(low)) or np.any(np.isnan(high)) or np.any(low > high):
        raise ValueError(f"{where}: obs_low and obs_high must be numbers with obs_low <= obs_high")
    norm = None
    if "obs_mean" in arrays:
        for k in ("obs_var", "epsilon", "clip_obs"):
            if k not in arrays:
                raise ValueError(f"{where} has obs_mean but no {k!r}")
        mean, var = arrays["obs_mean"].astype(np.float64), arrays["obs_var"].astype(np.float64)
        if mean.shape != shape or var.shape != shape:
            raise ValueError(f"{where}: obs_mean and obs_var must have the observation's shape {shape}, got "
                             f"{mean.shape} and {var.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var >= 0)):
            raise ValueError(f"{where}: obs_mean must be finite and obs_var finite and >= 0")
        eps, clip = arrays["epsilon"], arrays["clip_obs"]
        if eps.ndim != 0 or clip.ndim != 0 or not (math.isfinite(float(eps)) and float(eps) >= 0
                                                    and math.isfinite(float(clip)) and float(clip) > 0):
            raise ValueError(f"{where}: epsilon must be one finite number >= 0 and clip_obs one finite number > 0 "
                             "(0-d arrays), "
                             f"got {eps!r} and {clip!r}")
        if not np.all(var + float(eps) > 0):
            zero = int(np.flatnonzero(~(var + float(eps) > 0))[0])
            raise ValueError(f"{where}: obs_var[{zero}] + epsilon is 0, so the normalised observation would divide "
                             "by zero; epsilon must be > 0 where a variance is 0")
        norm = (mean, np.sqrt(var + float(eps)), float(clip))
    return arrays, norm


def _weight_name(key: str) -> bool:
    """A name ``ARRAYS_FILE`` may hold: a layer's ``w<i>`` or ``b<i>``, or a memory's arrays."""
    return re.fullmatch(r"[wb](0|[1-9][0-9]{0,3})", key) is not None or key in MEMORY_KEYS


def _load_arrays(path: str, meta: dict[str, Any]) -> tuple[ArrayPolicy, Any]:
    """An :class:`ArrayPolicy` from ``ARRAYS_FILE`` and the normalisation, both plain arrays."""
    arrays, norm = _load_norm(path)
    if norm is None:
        raise ValueError(f"learned agent: {NORM_FILE} in {path!r} has no obs_mean: an {meta.get('algo')!r} "
                         "model is trained on normalised observations")
    if meta["agent_env_options"].get("action") != "log-multiplier":
        raise ValueError(f"learned agent: {META_FILE} in {path!r}: an {meta.get('algo')!r} model acts with "
                         "action='log-multiplier'; agent_env_options says "
                         f"{meta['agent_env_options'].get('action')!r}")
    weights = _read_arrays(path, ARRAYS_FILE, _weight_name)  # the names' order and pairing checked below
    layers = []
    while f"w{len(layers)}" in weights:
        i = len(layers)
        if f"b{i}" not in weights:
            raise ValueError(f"learned agent: {ARRAYS_FILE} in {path!r} has w{i} but no b{i}")
        layers.append((weights[f"w{i}"], weights[f"b{i}"]))
    mem = [k for k in MEMORY_KEYS if k in weights]
    extra = sorted(set(weights) - {f"{c}{i}" for i in range(len(layers)) for c in "wb"} - set(MEMORY_KEYS))
    if extra:
        n = len(layers)
        want = "no layer (w0 is missing)" if n == 0 else "w0, b0" if n == 1 else f"w0, b0, ..., w{n - 1}, b{n - 1}"
        raise ValueError(f"learned agent: {ARRAYS_FILE} in {path!r} has arrays {extra} that are no layer "
                         f"(expected {want}, and for a memory {', '.join(MEMORY_KEYS)})")
    if mem and len(mem) != len(MEMORY_KEYS):
        raise ValueError(f"learned agent: {ARRAYS_FILE} in {path!r} has {mem} but not "
                         f"{[k for k in MEMORY_KEYS if k not in mem]} (a memory needs all of {list(MEMORY_KEYS)})")
    try:
        if mem:
            policy: ArrayPolicy = MemoryArrayPolicy(layers, arrays["obs_low"], arrays["obs_high"],
                                                    *(weights[k] for k in MEMORY_KEYS))
        else:
            policy = ArrayPolicy(layers, arrays["obs_low"], arrays["obs_high"])
    except ValueError as e:
        raise ValueError(f"learned agent: {ARRAYS_FILE} in {path!r}: {e}") from None
    if "memory" in meta and not (is_count(meta["memory"]) and meta["memory"] == getattr(policy, "memory", 0)):
        raise ValueError(f"learned agent: {META_FILE} in {path!r} records memory={meta['memory']!r}, but the "
                         f"weights in {ARRAYS_FILE} have a memory of {getattr(policy, 'memory', 0)} units")
    sizes = [int(layers[0][0].shape[1]), *(int(w.shape[0]) for w, _ in layers)]
    if "layer_sizes" in meta and meta["layer_sizes"] != sizes:
        raise ValueError(f"learned agent: {META_FILE} in {path!r} records layer_sizes={meta['layer_sizes']!r}, but "
                         f"the weights in {ARRAYS_FILE} have layer sizes {sizes}")
    return policy, norm


#: What ``agent_env_options`` may hold: the options a learned agent declares (``flowgym train`` writes these and
#: no others). Anything else, the engine or the workload above all, would change the system the model is scored
#: on, so a model directory naming it is refused.
AGENT_OPTION_KEYS = frozenset({"observation", "max_budget", "action", "multipliers", "multiplier_of",
                               *OBSERVATION_OPTIONS})


def _check_meta(meta: dict[str, Any], path: str) -> None:
    """Raise ``ValueError`` naming the field unless ``flowgym_agent.json``'s fields the loader reads have their types."""
    where = f"learned agent: {META_FILE} in {path!r}"
    fmt = meta.get("format", 1)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or not 1 <= fmt <= FORMAT_VERSION:
        raise ValueError(f"{where} has format={fmt!r}; this flowgym reads formats 1 to {FORMAT_VERSION}")
    shape = meta["observation_shape"]
    if (not isinstance(shape, list) or not shape
            or not all(type(x) is int and x >= 1 for x in shape)):
        raise ValueError(f"{where} has observation_shape={reprlib.repr(shape)}; expected a list of positive integers")
    opts = meta["agent_env_options"]
    if not isinstance(opts, dict):
        raise ValueError(f"{where} has agent_env_options={reprlib.repr(opts)}; expected an object")
    unknown = sorted(set(opts) - AGENT_OPTION_KEYS)
    if unknown:
        raise ValueError(f"{where}: agent_env_options holds {unknown}, which a learned agent may not set (it may "
                         f"only declare {sorted(AGENT_OPTION_KEYS)}): they would change the system it is scored on")
    obs = opts.get("observation")
    if obs is not None and not isinstance(obs, str):
        raise ValueError(f"{where}: agent_env_options observation={reprlib.repr(obs)}; expected a name such as "
                         "'load-v2'")
    if obs in LOAD_OBSERVATIONS and shape != [len(FEATURE_VERSIONS[LOAD_OBSERVATIONS[obs]])]:
        raise ValueError(f"{where}: agent_env_options observation={obs!r} has "
                         f"{len(FEATURE_VERSIONS[LOAD_OBSERVATIONS[obs]])} features, but observation_shape={shape!r}")
    of = opts.get("multiplier_of")
    if of is not None and not (isinstance(of, str) and of in MULTIPLIER_OF):
        raise ValueError(f"{where}: agent_env_options multiplier_of={reprlib.repr(of)}; expected one of "
                         f"{list(MULTIPLIER_OF)}")
    mb = opts.get("max_budget", 1)
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 1:
        raise ValueError(f"{where}: agent_env_options max_budget={mb!r}; expected a positive integer")
    # every value as the environment checks it (a bad one would otherwise fail only when an environment is built);
    # a model declares no clock, so its options must hold in slots or in continuous time (rate_window is in slots
    # or in seconds), and reset() compares them with the environment it meets
    errors: list[Exception] = []
    for clock in ("slot", next(iter(LATENCY_PRESETS))):
        try:
            FlowControlConfig(**opts, time_model=clock).validate()
            break
        except (ValueError, TypeError, OverflowError) as e:
            errors.append(e)
    else:  # the continuous-time error: the slot clock's may be its rate_window alone, valid in seconds
        raise ValueError(f"{where}: agent_env_options {errors[-1]}")
    algo = meta.get("algo")
    if algo is not None and not isinstance(algo, str):
        raise ValueError(f"{where} has algo={algo!r}; expected a name such as 'ppo' or 'ars'")


# --------------------------------------------------------------------------- the agent


class LearnedBudget(Agent):
    """``B_t`` chosen by a trained policy (SB3, or the numpy network of ``--algo ars``), deterministically.

    ``LearnedBudget(path)`` loads the model directory written by
    :func:`flowgym.lab.train.train` (``model.zip``, ``vecnormalize.pkl``,
    ``flowgym_agent.json``): the policy, the observation normalisation it was
    trained with, and the environment options it needs, which it declares
    (:meth:`env_options`: ``observation="flat"``, its action range as
    ``max_budget``, the length knowledge, eviction, queue order and every
    observation-shaping argument at its trained value). So it runs through
    :func:`flowgym.lab.evaluation.evaluate` like any scripted agent, and a scenario
    that sets one of those options differently is refused by name. An
    environment whose observation does not have the trained shape (e.g. a
    continuous-time scenario for a model trained in slots) is refused at the
    first step. Each decision is held for the ``action_repeat`` slots it was
    trained with (``flowgym_agent.json``), so the agent keeps a little state,
    reset by :meth:`reset`; a recurrent policy (``recurrent-ppo``, sb3-contrib's
    ``RecurrentPPO``) also keeps its LSTM state from one decision to the next,
    zeros at the start of each episode. A model trained with ``budget_levels`` chooses the
    index of a level, and the agent plays that level's budget. A model of
    ``flowgym train --algo ars`` (``"algo": "ars"``) is an :class:`ArrayPolicy` in
    ``policy.npz``: it loads and runs with numpy alone (no torch, no SB3).

    With no path it loads the shipped generalist (:data:`DEFAULT_MODEL`: trained by
    ``flowgym train`` with no scenario on randomised workloads, pieces of the Azure traces in
    continuous time among them; scale-free, so it runs on any scenario with unknown lengths, in
    slots or in continuous time). By name: ``make_agent("learned")``,
    ``make_agent("learned", path="runs/ppo-generalist")``, or
    ``flowgym compare --add-agents "learned"``.

    Args:
        path: the model directory (default: :data:`DEFAULT_MODEL`).
        label: table label (default ``learned (<directory name>)``).
        trust: also load SB3's pickle-based files (``model.zip``, ``vecnormalize.pkl``) and
            algorithms outside :data:`ALGORITHMS`; loading them can run code, so only for a
            directory you trust (default ``False``: the policy comes from ``policy.pt``, plain
            tensors, and ``normalization.npz``, plain arrays).
        action_rule: ``"mean"`` (the expected budget under the policy's action
            distribution, rounded) or ``"mode"`` (its most likely budget); default: the
            rule the model was evaluated and selected with during training
            (``flowgym_agent.json``; ``"mode"`` for models that do not record one).
        carry_state: a recurrent policy's LSTM state goes from each decision to the next (default
            ``True``, as trained); ``False`` starts every decision from a zero state, an ablation that
            shows what the policy's memory is worth (``benchmarks/select_generalist.py --memoryless``).
    """

    name = "learned"

    def __init__(self, path: str | None = None, label: str | None = None, action_rule: str | None = None,
                 trust: bool = False, carry_state: bool = True) -> None:
        if label is not None and not isinstance(label, str):  # a table label: 5 would fail only when printed
            raise ValueError(f"learned agent: label must be a string, got {label!r}")
        if label is not None and not label.strip():  # "" would fall back to the default label unseen
            raise ValueError(f"learned agent: label is empty ({label!r}); leave it out for the default")
        default_label = label is None
        if path is None:
            path = DEFAULT_MODEL
            label = label or "learned (generalist)"
        if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
            raise ValueError(f"learned agent: path {path!r} is not a model directory (written by flowgym train)")
        self.path = os.fspath(path)
        if not isinstance(trust, bool):  # a string such as "False" would be truthy and unpickle the files
            raise ValueError(f"learned agent: trust must be true or false, got {trust!r}")
        if not isinstance(carry_state, bool):
            raise ValueError(f"learned agent: carry_state must be true or false, got {carry_state!r}")
        self.carry_state = carry_state
        if not os.path.exists(os.path.join(self.path, META_FILE)):
            raise ValueError(f"learned agent: {self.path!r} lacks {[META_FILE]} (not a flowgym train output?)")
        try:
            with open(os.path.join(self.path, META_FILE)) as fh:
                self.meta: dict[str, Any] = _json.loads(fh.read())  # a key given twice is refused, not overwritten
        except _json.DuplicateKeyError as e:  # valid JSON, but which of the two values would be meant?
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r}: {e}") from None
        except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, an integer of 5000 digits
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} is not JSON ({_brief(e)})") from None
        except OSError as e:
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} cannot be read ({_brief(e)})") from None
        if not isinstance(self.meta, dict):
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} is not a JSON object")
        for key in ("algo_class", "agent_env_options", "observation_shape", "action_n"):
            if key not in self.meta:
                raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has no {key!r}")
        _check_meta(self.meta, self.path)
        self.obs_shape = tuple(self.meta["observation_shape"])
        #: The policy's action is a float vector (``action="log-multiplier"``), not an index.
        self.continuous = not hasattr(action_space_of(self.meta), "n")
        if isinstance(self.meta.get("algo"), str) and self.meta["algo"].lower() in ARRAY_ALGORITHMS:  # numpy weights: no torch, no SB3, no pickle
            if not self.continuous:
                raise ValueError(f"learned agent: {META_FILE} in {self.path!r} names algo "
                                 f"{self.meta.get('algo')!r}, whose policy has a continuous action, but records "
                                 f"action_space={self.meta.get('action_space')!r}")
            self.model, self._norm = _load_arrays(self.path, self.meta)
        else:
            self._load_sb3(trust)
        self._finish_init(label, action_rule, name_variant=default_label)

    def _load_sb3(self, trust: bool) -> None:
        require_sb3()
        import torch

        torch.set_num_threads(1)
        if self.meta.get("format", 1) >= 2 and os.path.exists(os.path.join(self.path, POLICY_FILE)):
            self.model, self._norm = _load_safe(self.path, self.meta, trust)
        elif trust:  # SB3's own files: pickle inside, run only for a directory the caller vouches for
            self.model, self._norm = _load_trusted(self.path, self.meta)
        else:
            raise ValueError(
                f"learned agent: {self.path!r} stores its policy only in SB3's pickle-based files ({MODEL_FILE}, "
                f"{VECNORM_FILE}), which can run code when loaded. If it comes from a source you trust, load it "
                f"with trust=True ('learned:path=DIR,trust=true'), or convert it once with "
                f"flowgym.agents.learned.resave(DIR) (writes {POLICY_FILE} and {NORM_FILE})")

    def _finish_init(self, label: str | None, action_rule: str | None = None, name_variant: bool = False) -> None:
        if tuple(self.model.observation_space.shape) != self.obs_shape:
            raise ValueError(f"learned agent: model observation shape {self.model.observation_space.shape} "
                             f"differs from {META_FILE}'s {self.obs_shape}")
        if self.continuous:
            want = action_space_of(self.meta)
            if tuple(self.model.action_space.shape) != tuple(want.shape):
                raise ValueError(f"learned agent: the policy's action has shape {self.model.action_space.shape}; "
                                 f"{META_FILE} records action_space={self.meta.get('action_space')!r}")
            if not (np.all(want.low == -1.0) and np.all(want.high == 1.0)):
                raise ValueError(f"learned agent: {META_FILE} in {self.path!r} records action_space="
                                 f"{self.meta.get('action_space')!r}; a log-multiplier action is the box [-1, 1]")
            of = self.meta["agent_env_options"].get("multiplier_of")
            dim = log_multiplier_size(of)  # what the environment the agent asks for takes
            if tuple(want.shape) != (dim,):
                raise ValueError(f"learned agent: {META_FILE} in {self.path!r} records action_space="
                                 f"{self.meta.get('action_space')!r} but agent_env_options multiplier_of={of!r}, "
                                 f"whose action has {dim} float(s)")
        if self._norm is not None and self._norm[0].shape != self.obs_shape:
            raise ValueError(f"learned agent: normalisation statistics have shape {self._norm[0].shape}, "
                             f"the model's observation {self.obs_shape}")
        self.requires = dict(self.meta["agent_env_options"])
        if self.requires.get("observation") in LOAD_OBSERVATIONS:
            # the load features read no output length (a request's is seen only once it completes, known or not),
            # so the model plays the same on a scenario that knows them: the same episode, bit for bit (tested).
            # The flat and dict observations do read them when known (projected usage): they keep the need.
            self.requires.pop("output_length_known", None)
        #: Slots each decision is held for, as in training (``flowgym_agent.json``'s ``action_repeat``).
        self.action_repeat = self.meta.get("action_repeat", 1)
        if isinstance(self.action_repeat, bool) or not isinstance(self.action_repeat, int) or self.action_repeat < 1:
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has action_repeat="
                             f"{self.action_repeat!r}; it must be a positive integer")
        #: The budget of each action index (``budget_levels`` of training), or ``None``: the index is the budget.
        levels = self.meta.get("budget_levels")
        if levels is not None and (not valid_levels(levels) or len(levels) != self.meta["action_n"]):
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has budget_levels={levels!r}; it must "
                             f"list {self.meta['action_n']} ascending non-negative integer budgets, one per action")
        if levels is not None and levels[-1] > self.meta["agent_env_options"].get("max_budget", levels[-1]):
            raise ValueError(f"learned agent: {META_FILE} in {self.path!r} has budget_levels up to {levels[-1]}, above "
                             f"agent_env_options max_budget={self.meta['agent_env_options']['max_budget']}")
        self.budget_levels: list[int] | None = levels
        self._held, self._left = 0, 0
        #: A recurrent policy (``recurrent-ppo``) carries its LSTM state from decision to decision (``_lstm``:
        #: ``None`` at the start of an episode, when the state is zeros).
        self.recurrent = is_recurrent(self.model)
        self._lstm: Any = None
        self.action_rule = action_rule if action_rule is not None else self.meta.get("action_rule", "mode")
        if self.action_rule not in ACTION_RULES:
            raise ValueError(f"learned agent: action_rule must be one of {list(ACTION_RULES)}, got {self.action_rule!r}")
        self._label = label or f"learned ({os.path.basename(os.path.normpath(self.path))})"
        if name_variant:  # a variant of the same model gets its own label (a comparison refuses two alike)
            if action_rule is not None and action_rule != self.meta.get("action_rule", "mode"):
                self._label += f" action_rule={action_rule}"
            if not self.carry_state and self.recurrent:  # only a recurrent policy carries a state
                self._label += " carry_state=false"

    @classmethod
    def from_policy(cls, policy: ArrayPolicy, norm: Any, env_options: dict[str, Any], action_repeat: int,
                    label: str = "learned (candidate)") -> LearnedBudget:
        """An agent around an in-memory :class:`ArrayPolicy` (a candidate during ``flowgym train --algo
        ars``): it acts exactly as the model directory written from it will. ``norm`` is
        ``(mean, std, clip)`` or ``None``; ``env_options`` the environment options it needs."""
        self = cls.__new__(cls)
        self.path, self.carry_state = "", True
        self.meta = {"algo": "ars", "agent_env_options": dict(env_options), "action_repeat": int(action_repeat),
                     "action_space": describe_action_space(policy.action_space), "action_n": 0,
                     "observation_shape": list(policy.observation_space.shape), "action_rule": "mode"}
        self.obs_shape = tuple(policy.observation_space.shape)
        self.continuous = True
        self.model, self._norm = policy, norm
        self._finish_init(label)
        return self

    def reset(self, config: FlowControlConfig, seed: int | None = None) -> None:
        """Start an episode; refuses a configuration whose observation-shaping options differ."""
        super().reset(config, seed)
        self._held, self._left = 0, 0
        self._lstm = None
        for key, want in self.requires.items():
            have = getattr(config, key)
            if key == "max_budget":
                if have < want:
                    raise ValueError(f"learned agent {self._label!r} needs max_budget >= {want}, the environment has {have}")
                continue
            if isinstance(have, tuple):
                have = list(have)
            if have != want:
                raise ValueError(f"learned agent {self._label!r} was trained with {key}={want!r}; "
                                 f"this environment has {key}={have!r}")

    def normalize(self, observation: Any) -> np.ndarray:
        """The observation as the policy sees it (VecNormalize's statistics, frozen)."""
        obs = np.asarray(observation, dtype=np.float64)
        if obs.shape != self.obs_shape:
            raise ValueError(
                f"learned agent {self._label!r} expects a flat observation of shape {self.obs_shape} "
                f"(trained on {self.meta.get('scenario')!r}); this environment gives shape {obs.shape}. "
                "Was it trained in the other time model (slots vs continuous time) or length knowledge?")
        if self._norm is None:
            return obs.astype(np.float32)
        mean, std, clip = self._norm
        return np.clip((obs - mean) / std, -clip, clip).astype(np.float32)

    @property
    def normalization(self) -> tuple[np.ndarray, np.ndarray, float] | None:
        """The frozen statistics :meth:`normalize` applies, ``(mean, std, clip)``, or ``None`` (the observation
        is read as it is). Two models whose policies should read the same features compare these."""
        return self._norm

    @property
    def decides_next(self) -> bool:
        """Whether the next :meth:`act` consults the policy (else it repeats the held decision)."""
        return self._left == 0

    def act(self, observation: Any, view: SystemView) -> int:
        """The policy's budget, recomputed every ``action_repeat`` slots (held in between)."""
        if self._left > 0:
            self._left -= 1
            return self._held
        obs = self.normalize(observation)[None]
        if self.recurrent:
            state = self._lstm if self.carry_state else None
            actions, self._lstm = recurrent_action(self.model, obs, state, [state is None], self.action_rule)
            action = actions[0]
        else:
            action = policy_action(self.model, obs, self.action_rule)[0]
        if self.continuous:  # a log-multiplier: the Gaussian policy's mean, clipped to its box
            self._held = np.asarray(action, dtype=np.float32).reshape(-1)
            if not np.all(np.isfinite(self._held)):
                raise ValueError(f"learned agent {self._label!r}: the policy in {self.path or 'memory'!r} gave the "
                                 f"non-finite action {self._held!r} (weights too large for its inputs?)")
        else:
            index = int(action)
            self._held = index if self.budget_levels is None else self.budget_levels[index]
        self._left = self.action_repeat - 1
        return self._held

    def label(self) -> str:
        return self._label
