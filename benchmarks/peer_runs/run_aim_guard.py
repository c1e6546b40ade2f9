"""AIM (private-pgm ``mechanisms/aim.py``) with a guard against mbi's non-finite fast message passing.

The same run as ``../shared/tools/aim/run_aim.py`` (declared cell codes, workload all 2-way marginals
≤ 10,000 cells, δ = 1e-9, jax float64), run with the AIM virtualenv's Python in ``$BEAMSYNTH_AIM_DIR``
(it imports ``ppgm/mechanisms/aim.py`` from there). No private-pgm code is kept here; two of its
functions are wrapped at run time:

- every ``mbi.estimation.mirror_descent`` call AIM makes is timed and its potentials and marginals
  checked; if any value is NaN/inf, the same call (same measurements, same starting potentials) is
  redone with ``marginal_oracle=mbi.marginal_oracles.message_passing_stable``, an option of
  ``mirror_descent`` (exact log-space message passing over the junction tree's cliques instead of
  the default ``message_passing_fast``, whose per-factor max shift underflows to 0 and then gives
  ``-inf - -inf = NaN`` once log-potentials span several hundred). Same estimator, other numerics;
  no randomness is drawn, so a run that never meets a non-finite value is AIM unchanged, draw for draw.
- AIM's exponential mechanism logs which candidate scores are non-finite (diagnosis only).

Unguarded, the NaN marginal reaches AIM's next selection as a NaN score and numpy stops the run with
``ValueError: probabilities contain NaN`` (issue 18: every ACS ε = 0.5 run, COMPAS ε = 0.5, German
ε = 2). Outputs: OUT (synthetic codes) and OUT.json (seconds, settings, guard counters).

usage: run_aim_guard.py CODES DOMAIN OUT EPS SEED MMS [DEGREE [ITERS [GUARD=1|0]]]
"""
import itertools
import json
import sys
import time

T0 = time.perf_counter()
STATS = {"md_calls": 0, "md_nonfinite": 0, "md_fallback_finite": 0, "nonfinite_scores": 0}


def log(*parts) -> None:
    print(f"[{time.perf_counter() - T0:8.0f}s]", *parts, flush=True)


def main(argv: list[str]) -> int:
    sys.path.insert(0, "ppgm/mechanisms")
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import aim as aim_mod
    import numpy as np
    import pandas as pd
    from aim import AIM
    from mbi import Dataset, Domain, estimation, marginal_oracles

    codes_csv, dom_json, out_csv = argv[0], argv[1], argv[2]
    eps, seed, mms = float(argv[3]), int(argv[4]), float(argv[5])
    degree = int(argv[6]) if len(argv) > 6 else 2
    iters = int(argv[7]) if len(argv) > 7 else 1000
    guard = (argv[8] != "0") if len(argv) > 8 else True

    def nonfinite(cv) -> list:
        return [cl for cl, f in cv.arrays.items() if not bool(np.all(np.isfinite(np.asarray(f.values))))]

    plain_md = estimation.mirror_descent

    def guarded_md(domain, loss_fn, **kw):
        t = time.perf_counter()
        STATS["md_calls"] += 1
        model = plain_md(domain, loss_fn, **kw)
        bad_p, bad_m = nonfinite(model.potentials), nonfinite(model.marginals)
        log(f"mirror_descent #{STATS['md_calls']}: {len(loss_fn)} measurements, total {model.total:.1f}, "
            f"{time.perf_counter() - t:.0f}s, non-finite potentials {len(bad_p)} marginals {len(bad_m)}")
        if bad_p or bad_m:
            STATS["md_nonfinite"] += 1
            log("NONFINITE fast message passing: potentials", bad_p[:5], "marginals", bad_m[:5])
            if kw.get("potentials") is not None:
                log("start potentials non-finite:", nonfinite(kw["potentials"])[:5])
            if guard:
                t = time.perf_counter()
                model = plain_md(domain, loss_fn, marginal_oracle=marginal_oracles.message_passing_stable, **kw)
                bad_p, bad_m = nonfinite(model.potentials), nonfinite(model.marginals)
                STATS["md_fallback_finite"] += int(not bad_p and not bad_m)
                log(f"  redone with message_passing_stable: {time.perf_counter() - t:.0f}s, non-finite "
                    f"potentials {len(bad_p)} marginals {len(bad_m)}")
        return model

    aim_mod.estimation.mirror_descent = guarded_md
    plain_em = AIM.exponential_mechanism

    def checked_em(self, qualities, epsilon, sensitivity=1.0, base_measure=None):
        if isinstance(qualities, dict):
            bad = [(cl, float(q)) for cl, q in qualities.items() if not np.isfinite(q)]
            if bad:
                STATS["nonfinite_scores"] += 1
                log(f"NONFINITE scores at eps {epsilon:.5f}: {len(bad)} of {len(qualities)}", bad[:10])
        return plain_em(self, qualities, epsilon, sensitivity, base_measure=base_measure)

    AIM.exponential_mechanism = checked_em

    df = pd.read_csv(codes_csv)
    with open(dom_json) as fh:
        sizes = json.load(fh)
    data = Dataset(df, Domain(list(sizes), [sizes[c] for c in sizes]))
    work = [(cl, 1.0) for cl in itertools.combinations(data.domain, degree) if data.domain.size(cl) <= 10000]
    np.random.seed(seed)
    t0 = time.perf_counter()
    mech = AIM(eps, 1e-9, prng=np.random.RandomState(seed), max_model_size=mms, max_iters=iters)
    log(f"AIM eps={eps} seed={seed} mms={mms} iters={iters} rows={len(df)} workload={len(work)} "
        f"rho={mech.rho:.6f} guard={guard}")
    _, synth = mech.run(data, work, num_synth_rows=len(df))
    secs = time.perf_counter() - t0
    synth.df.to_csv(out_csv, index=False)
    with open(out_csv + ".json", "w") as fh:
        json.dump({"seconds": secs, "eps": eps, "seed": seed, "mms": mms, "degree": degree, "iters": iters,
                   "guard": guard, **STATS}, fh)
    log("AIM seconds", secs, STATS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
