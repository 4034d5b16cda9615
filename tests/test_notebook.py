"""``notebooks/quickstart.ipynb`` runs from top to bottom without errors (nbclient, a fresh kernel)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
KERNEL_NAME = "lightning-multigrid-test"


def _kernel_for_this_interpreter(directory: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernelspec that runs ``sys.executable``, first on the Jupyter path.

    A `python3` kernelspec may come from the user's or the system's Jupyter directories and run
    another interpreter, without this package; JUPYTER_PATH is searched before those.
    """
    spec = directory / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "lightning-multigrid tests",
                "language": "python",
            }
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv("JUPYTER_PATH", str(directory))
    return KERNEL_NAME


@pytest.mark.slow
def test_quickstart_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    kernel_name = _kernel_for_this_interpreter(tmp_path / "jupyter", monkeypatch)
    workdir = tmp_path / "run"
    workdir.mkdir()
    # The kernel inherits the environment: keep it on one intra-op thread like the rest of the suite.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The notebook writes into tempfile.mkdtemp(): keep that inside this test's directory.
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,  # per cell; the whole notebook takes about a minute on 2 loaded cores
        startup_timeout=120,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError, with the traceback, when a cell fails

    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    errors = [o for cell in code_cells for o in cell.outputs if o.output_type == "error"]
    assert not errors
    # Chunks of one stream may be split anywhere: join them as they came.
    text = "".join(
        o.get("text", "")
        for cell in code_cells
        for o in cell.outputs
        if o.output_type == "stream" and o.name == "stdout"
    )
    # The Kinetics table: the paper's 358 multigrid epochs for the 239-epoch baseline.
    assert "358" in text
    assert "358 multigrid epochs for a 239-epoch baseline" in text
    # Training ran the multigrid schedule: 1.5 x 6 baseline epochs.
    assert "9 multigrid epochs" in text
    images = [o for cell in code_cells for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the schedule figure and the logged metrics
    assert not list(workdir.iterdir())  # nothing lands in the working directory
    assert list((tmp_path / "tmp").glob("multigrid-quickstart-*/quickstart/version_0/metrics.csv"))
