"""Issue 30 item 8: the W&B table's scores/* columns hold numbers (a list per row), not JSON strings."""

from __future__ import annotations

import glob
import json
import math
import os

from lightning_xai.callbacks import AuditExample
from lightning_xai.reporting.wandb_logging import log_audit_to_wandb


def test_scores_columns_are_numbers_in_an_offline_run(tmp_path):
    from pytorch_lightning.loggers import WandbLogger
    from wandb.sdk.data_types._dtypes import ListType, NoneType, NumberType, UnionType

    def kind(wb_type):  # a column that may hold None is "None or <type>": its type is the other member
        if isinstance(wb_type, UnionType):
            (wb_type,) = [t for t in wb_type.params["allowed_types"] if not isinstance(t, NoneType)]
        return wb_type

    examples = [
        AuditExample(
            position=i,
            index=i,
            split="val",
            token_ids=[1, 2, 3],
            label=1,
            prediction=1,
            probability=0.9,
            tokens=["a", "good", "film"],
            maps={"attention": [0.2, 0.5, 0.3], "gradient": [0.1, -0.25, 1e-9 * i]},
            values={"kendall_tau/attention_vs_gradient": 0.3 * i},
        )
        for i in range(2)
    ]
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lightning-xai-tests")
    payload = log_audit_to_wandb(logger, "attention_audit", examples, step=3)
    run_dir = os.path.dirname(logger.experiment.dir)
    logger.experiment.finish()
    table = payload["attention_audit/examples"]
    types = {name: kind(wb_type) for name, wb_type in table._column_types.params["type_map"].items()}
    for column in ("scores/attention", "scores/gradient"):
        assert isinstance(types[column], ListType), (column, types[column])
        assert isinstance(types[column].params["element_type"], NumberType), types[column]
    assert isinstance(types["probability"], NumberType)
    files = glob.glob(os.path.join(run_dir, "files", "media", "table", "**", "*.table.json"), recursive=True)
    assert len(files) == 1, sorted(glob.glob(os.path.join(run_dir, "**"), recursive=True))
    logged = json.load(open(files[0], encoding="utf-8"))
    column = logged["columns"].index("scores/gradient")
    cells = [row[column] for row in logged["data"]]
    assert all(isinstance(cell, list) and all(isinstance(x, float) for x in cell) for cell in cells), cells
    assert cells[1][:2] == [0.1, -0.25] and math.isclose(cells[1][2], 1e-9)  # full precision, no rounding to 0
