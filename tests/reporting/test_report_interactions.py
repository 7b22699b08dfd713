"""Issue 17: the report draws Integrated Hessians' strongest token pairs — words and Γ equal to
``attribute(..., "integrated_hessians")`` on the same example — and draws none without the method."""

from __future__ import annotations

import html
import re
import warnings

import pytest
import torch

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.data.datamodule import collate
from lightning_xai.reporting import AuditReport

IH = {"n_steps": 4, "inner_steps": 4}
TOP = 5


def _fit(kit, tmp_path, methods, **options):
    dm = kit.make_dm(train=64, val=3, batch_size=16)
    audit = AttentionAudit(methods=methods, metrics=("kendall_tau",), num_samples=3, num_report_examples=2, **options)
    report = AuditReport(dirpath=str(tmp_path / "report"), png=False, max_examples=2)
    model = kit.make_model(dm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # IH's completeness warning at 4 nodes
        kit.make_trainer(tmp_path, [audit, report], max_epochs=1).fit(model, dm)
    page = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    return dm, model, audit, page


def _block(page, ident):
    start = page.index(f'id="{ident}"')
    return page[start : page.index("</details></div>", start)]


def test_report_draws_the_strongest_pairs_of_integrated_hessians(kit, tmp_path):
    dm, model, audit, page = _fit(
        kit, tmp_path, ("gradient", "integrated_hessians"), method_options={"integrated_hessians": IH}, top_pairs=TOP
    )
    shown = [e for e in audit.latest.examples if e.maps]
    assert len(shown) == 2 and all(e.interactions is not None for e in shown)
    assert all(e.interactions is None for e in audit.latest.examples if not e.maps)  # only the report's examples
    assert page.count('<div class="pairs"') == 2 and "Σ_j Γ_ij = IG_i" in page
    model.eval()
    for example in shown:
        words = dm.tokens(example.split, example.index)
        batch = collate([dm.dataset(example.split)[example.index]])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            gamma = attribute(model, batch, "integrated_hessians", target=None, **IH)[1][0].double()  # oracle
        real = torch.triu(torch.ones_like(gamma, dtype=torch.bool), diagonal=1)
        order = gamma[real].abs().argsort(descending=True)[:TOP]
        rows, cols = real.nonzero().T
        expected = [(int(rows[o]), int(cols[o]), float(gamma[rows[o], cols[o]])) for o in order]
        block = _block(page, f"pairs-attention_audit-{example.split}-{example.index}")
        listed = re.findall(r'<li data-i="(\d+)" data-j="(\d+)" data-gamma="([^"]+)">([^<]*)</li>', block)
        assert [(int(i), int(j)) for i, j, _, _ in listed] == [(i, j) for i, j, _ in expected]
        for (i, j, value, text), (_, _, want) in zip(listed, expected):
            assert float(value) == pytest.approx(want, rel=1e-4, abs=0)
            assert html.unescape(text).startswith(f"{words[int(i)]} × {words[int(j)]}: ")
        involved = sorted({p for i, j, _ in expected for p in (i, j)})
        header = re.findall(r'<th title="token (\d+)">([^<]*)</th>', block)
        assert [int(p) for p, _ in header[: len(involved)]] == involved
        assert [html.unescape(w) for _, w in header[: len(involved)]] == [words[p] for p in involved]
        cells = [float(v) for v in re.findall(r'<td class="num" data-gamma="([^"]+)"', block)]
        want = [float(gamma[p, q]) for p in involved for q in involved if p != q]
        assert cells == pytest.approx(want, rel=1e-4, abs=0)


def test_no_pair_block_without_integrated_hessians(kit, tmp_path):
    _, _, audit, page = _fit(kit, tmp_path, ("gradient",))
    assert all(e.interactions is None for e in audit.latest.examples)
    assert 'class="pairs"' not in page and "Integrated Hessians" not in page
