"""The launch sweep's choice of K slices (benchmarks/probes/mma_sweep.py), with a fake timer; no GPU."""

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def sweep():
    return load_script("probes/mma_sweep.py")


def fake_times(m1: dict, others: dict):
    """A timer: at M = 1 the time of each config's slice count from ``m1``; at other M from ``others[m]``; plus a
    little per K warp so the configs of one count differ."""
    def time_config(cfg, m):
        from anyfp4.kernels.cuda.weight_mma import k_slices

        table = m1 if m == 1 else others[m]
        return table[k_slices(cfg)] + 1e-9 * cfg.kw * cfg.depth * cfg.warps
    return time_config


def test_the_slices_are_chosen_over_every_m(sweep):
    # 16 slices win at M = 1 by a little; 8 lose a little there and win by a lot at M = 16 and 32
    m1 = {1: 10.7, 2: 9.7, 4: 9.2, 8: 8.0, 16: 7.7, 32: 10.1}
    others = {16: {8: 12.7, 16: 14.8}, 32: {8: 18.1, 16: 21.2}}
    chosen, timed = sweep.sweep_shape(fake_times(m1, others), [1, 16, 32], False, 4096, 128, candidates=2)
    assert chosen == 8
    assert set(timed[16]) == set(timed[32]) == {8, 16}  # only the two fastest of M = 1 are swept further
    assert all(sweep.k_slices(cfg) == sl for m in timed for sl, (_, cfg) in timed[m].items())


def test_with_one_candidate_m_1_decides(sweep):
    m1 = {1: 10.7, 2: 9.7, 4: 9.2, 8: 8.0, 16: 7.7, 32: 10.1}
    others = {16: {16: 14.8}, 32: {16: 21.2}}
    chosen, _ = sweep.sweep_shape(fake_times(m1, others), [1, 16, 32], False, 4096, 128, candidates=1)
    assert chosen == 16


def test_a_tie_goes_to_m_1(sweep):
    timed = {1: {8: (2.0, None), 16: (1.0, None)}, 8: {8: (1.0, None), 16: (2.0, None)}}
    assert sweep.choose_slices([1, 8], timed) == 16


def test_shared_rings_are_swept_without_the_register_limits(sweep):
    """``--shared-ring``: shared-memory rings of every depth beside one m16 tile or two (their depth costs no
    registers), never four tiles; without it, register rings alone; any K-slice counts (``--slice-counts``)."""
    plain = list(sweep.configs_for(1, False, 8192))
    both = list(sweep.configs_for(1, False, 8192, rings=(0, 1), counts=(1, 3, 16)))
    assert all(c.shared_ring == 0 for c in plain)
    rings = [c for c in both if c.shared_ring]
    assert rings and all(c.mt in (1, 2) for c in rings)
    assert any(c.depth == 8 and c.mt == 2 for c in rings)  # a register ring of 8 takes one tile only
    assert not any(c.depth == 8 and c.mt == 2 for c in both if not c.shared_ring)
    assert {c.split_k * c.kw for c in both} == {1, 3, 16}
    assert not any(c.kw > 1 and c.split_k * c.kw == 3 for c in both)  # K warps need powers of two


def test_every_m_is_swept_with_shared_rings_too(sweep):
    """With shared rings asked for, the M > 1 buckets time them as M = 1 does (not register rings alone)."""
    seen = []

    def time_config(cfg, m):
        seen.append((m, cfg.shared_ring))
        return 1.0 + 1e-9 * cfg.depth * cfg.warps
    sweep.sweep_shape(time_config, [1, 16], False, 4096, 128, candidates=1, rings=(0, 1))
    assert {(1, 0), (1, 1), (16, 0), (16, 1)} <= set(seen)


def test_warpgroup_mmas_are_swept_where_the_kernel_takes_them(sweep):
    """``--wgmma``: warpgroup mmas (1 and 2) beside mma.sync, one K warp, 4 or 8 warps, register rings of 2 or 4,
    one or two m16 tiles; every M bucket times them too."""
    both = list(sweep.configs_for(16, False, 8192, wgmmas=(0, 1, 2)))
    wg = [c for c in both if c.wgmma]
    assert {c.wgmma for c in wg} == {1, 2} and any(not c.wgmma for c in both)
    assert all(c.kw == 1 and c.warps in (4, 8) and c.depth in (2, 4) and c.mt in (1, 2) and not c.shared_ring
               for c in wg)
    seen = set()

    def time_config(cfg, m):
        seen.add((m, cfg.wgmma))
        return 1.0 + 1e-9 * cfg.depth * cfg.warps
    sweep.sweep_shape(time_config, [1, 16], False, 4096, 128, candidates=1, wgmmas=(0, 2))
    assert {(1, 0), (1, 2), (16, 0), (16, 2)} <= seen


def test_a_swept_warpgroup_config_reaches_the_launch_table(sweep, tmp_path):
    """A sweep's best config with warpgroup mmas: its table line keeps ``wgmma``, and the table reads it back."""
    import json

    from anyfp4.dispatch.launch_tables import user_mma_table

    row = {"format": "nvfp4", "k": 4096, "n": 14336, "m": 16,
           "best_cfg": {"mt": 1, "warps": 8, "split_k": 4, "depth": 2, "kw": 1, "shared_ring": 0, "wgmma": 2}}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"sm": 90, "sweep": [row], "gated": []}))
    table = tmp_path / "table.json"
    table.write_text("\n".join(sweep.table_lines(str(path))))
    assert '"wgmma": 2' in table.read_text()
    (cfg,) = user_mma_table(str(table)).values()
    assert cfg.wgmma == 2 and cfg.split_k == 4
