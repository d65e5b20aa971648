"""Workload generators for many episodes at once: ``np.random.default_rng(seed)``, without its per-call cost.

Each episode of a FlowControl-v0 environment draws its workload from
``np.random.default_rng(seed)`` (``seed`` drawn from the environment's
``np_random``). Building one costs ~8 us, mostly ``SeedSequence``'s hashing in
Python-level loops; at 256 environments resetting together that is 2 ms a reset.
:func:`reseed` gives the same generators: it hashes all the seeds at once with
numpy (``SeedSequence``'s algorithm, on uint32 arrays), seeds ``PCG64`` as its C
code does (integer arithmetic below) and sets the state of a generator kept
from the environment's previous episode (``tests/test_vector.py`` checks the
states and draws against numpy's for seeds over the whole range).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["seed_words", "reseed"]

_U32 = np.uint32
# numpy/random/bit_generator.pyx (SeedSequence; pool of 4 words)
_INIT_A, _MULT_A = _U32(0x43B0D7E5), _U32(0x931E8875)
_INIT_B, _MULT_B = _U32(0x8B51F9DD), _U32(0x58F38DED)
_MIX_L, _MIX_R = _U32(0xCA01F9DD), _U32(0x4973F715)
_XSHIFT = _U32(16)
_POOL = 4
# numpy/random/src/pcg64 (PCG_DEFAULT_MULTIPLIER_128)
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_M128 = (1 << 128) - 1


def seed_words(seeds: Sequence[int]) -> np.ndarray:
    """``SeedSequence(s).generate_state(4, np.uint64)`` for each seed ``s`` in ``[0, 2**64)``: shape ``(n, 4)``."""
    s = np.asarray([int(x) for x in seeds], dtype=np.uint64)
    with np.errstate(over="ignore"):
        # the entropy words, little end first; a seed below 2**32 has one, and the pool's
        # second word then hashes a 0, as its missing high word here
        ent = [(s & np.uint64(0xFFFFFFFF)).astype(_U32), (s >> np.uint64(32)).astype(_U32)]
        ent += [np.zeros(s.size, _U32)] * (_POOL - 2)
        hc = _INIT_A

        def hashmix(value: np.ndarray) -> np.ndarray:
            nonlocal hc
            value = value ^ hc
            hc = _U32(hc * _MULT_A)
            value = value * hc
            return value ^ (value >> _XSHIFT)

        mixer = [hashmix(ent[i]) for i in range(_POOL)]
        for i_src in range(_POOL):
            for i_dst in range(_POOL):
                if i_src != i_dst:
                    y = hashmix(mixer[i_src])
                    r = _MIX_L * mixer[i_dst] - _MIX_R * y
                    mixer[i_dst] = r ^ (r >> _XSHIFT)
        hb = _INIT_B
        out = np.empty((s.size, 2 * _POOL), _U32)
        for i_dst in range(2 * _POOL):  # generate_state(8 uint32 words), the pool cycled twice
            v = mixer[i_dst % _POOL] ^ hb
            hb = _U32(hb * _MULT_B)
            v = v * hb
            out[:, i_dst] = v ^ (v >> _XSHIFT)
    return out.astype("<u4").view("<u8").astype(np.uint64)


def reseed(seeds: Sequence[int], keep: Sequence[np.random.Generator | None]) -> list[np.random.Generator]:
    """``[np.random.default_rng(s) for s in seeds]``, reusing the generators of ``keep`` (re-seeded in place).

    ``keep[j]`` (a PCG64 generator, or ``None`` for a new one) gets the state
    ``default_rng(seeds[j])`` starts in, so it draws the same numbers; whatever it
    drew before is forgotten. Only the state is the seed's: ``bit_generator.seed_seq``
    (and so ``spawn``) is not.
    """
    if len(keep) != len(seeds):
        raise ValueError(f"keep must hold one generator (or None) per seed ({len(seeds)}), got {len(keep)}")
    words = seed_words(seeds).tolist()
    gens = []
    for (s0, s1, i0, i1), gen in zip(words, keep):
        # pcg64_set_seed: initstate = s0:s1, initseq = i0:i1 (high:low), then pcg_setseq_128_srandom_r
        inc = (((i0 << 64) | i1) << 1 | 1) & _M128
        state = (((inc + ((s0 << 64) | s1)) * _PCG_MULT) + inc) & _M128
        if gen is None or not isinstance(gen.bit_generator, np.random.PCG64):
            gen = np.random.Generator(np.random.PCG64(0))
        gen.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                                   "has_uint32": 0, "uinteger": 0}
        gens.append(gen)
    return gens
