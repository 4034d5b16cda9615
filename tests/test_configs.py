"""The example configs in ``configs/``: every key reaches its class, the schedule they describe builds,
and each one trains for two steps on the synthetic videos.

Every test is parametrized over ``configs/*.yaml``, so a new config is covered by adding the file.
The CLI runs in-process (``lightning_multigrid.cli.commands.main``): one import of torch and Lightning for the
whole module instead of one per subprocess. The dry run keeps the config's wiring (classes, data
and multigrid options, the multigrid callback) and swaps what a CPU test cannot afford: the
``tiny`` backbone (one pathway, so no SlowFast split), a 2 x 8 x 32 base shape on the 64x48 test
videos, one CPU device in fp32, a one-epoch baseline without LR milestones (two multigrid
epochs: a long-cycle shape change), and ``fast_dev_run 2`` (two training and validation batches;
``limit_*_batches 1`` from the command line would mean 100%: jsonargparse reads it as the float 1.0).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from lightning_multigrid.callback import MultigridCallback
from lightning_multigrid.cli.commands import main
from lightning_multigrid.cli.trainer import build_cli
from lightning_multigrid.data.synthetic import SyntheticDataset
from lightning_multigrid.grid import GridShape
from lightning_multigrid.models import BACKBONES, TWO_PATHWAY_BACKBONES
from lightning_multigrid.schedule import build_schedule
from lightning_multigrid.schedule.config import DEFAULT_SHORT_RUN, DEFAULTS, MultigridConfig, ShortRun

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
# Set by MultigridCLI's link from the DataModule (`data.num_classes`), not from the config.
LINKED = {("model", "num_classes")}


@pytest.fixture(autouse=True)
def _restore_seed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """LightningCLI's ``seed_everything`` sets PL_GLOBAL_SEED and PL_SEED_WORKERS for the whole
    process: put them back as they were, so later tests do not inherit a seed."""
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.setenv(name, "0")  # records the value before the test, to restore it after
        monkeypatch.delenv(name)


def _load(config: Path) -> dict[str, Any]:
    return yaml.safe_load(config.read_text(encoding="utf-8"))


def _run(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``lightning-multigrid ARGS`` in-process: (exit status, stdout, stderr)."""
    # LightningCLI warns when sys.argv (pytest's here) holds arguments besides `args`.
    monkeypatch.setattr(sys, "argv", ["lightning-multigrid"])
    monkeypatch.setenv("COLUMNS", "200")  # keep help lines unwrapped
    code = 0
    try:
        main(args)
    except SystemExit as exit_info:
        code = exit_info.code if isinstance(exit_info.code, int) else (0 if exit_info.code is None else 1)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_configs_exist() -> None:
    names = {config.name for config in CONFIGS}
    assert {
        "kinetics400_slowfast_r50.yaml",
        "kinetics400_x3d_m.yaml",
        "ssv2_slowfast_r50.yaml",
        "charades_slowfast_r50.yaml",
    } <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_print_config_keeps_every_setting(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fit --config X --print_config`` parses, and every value written in X comes back unchanged.

    A key that LightningCLI drops silently (a linked argument such as ``model.init_args.num_classes``)
    would come back missing, so a config cannot claim a setting it does not make. The linked
    ``num_classes`` is exempt: the CLI sets it from ``data.num_classes`` whatever the config says.
    """
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(["fit", "--config", str(config), "--print_config"], monkeypatch, capsys)
    assert code == 0, err
    printed = yaml.safe_load(out)
    written = _load(config)
    for section in ("model", "data"):
        assert printed[section]["class_path"] == written[section]["class_path"]
        for key, value in written[section].get("init_args", {}).items():
            if (section, key) in LINKED:
                continue
            assert key in printed[section]["init_args"], f"{config.name}: {section}.init_args.{key} was dropped"
            assert printed[section]["init_args"][key] == value, f"{config.name}: {section}.init_args.{key}"
    for section in ("trainer", "multigrid"):
        for key, value in (written.get(section) or {}).items():
            assert printed[section][key] == value, f"{config.name}: {section}.{key}"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_config_describes_a_consistent_run(config: Path) -> None:
    """Backbone, pathways, crop and LR stages agree, and the multigrid schedule they describe builds
    with every long-cycle shape (no stage dropped for want of epochs)."""
    settings = _load(config)
    model = settings["model"]["init_args"]
    data = settings["data"]["init_args"]
    trainer = settings["trainer"]
    multigrid = settings.get("multigrid") or {}

    backbone = model.get("backbone", "tiny")
    assert backbone in BACKBONES
    alpha = model.get("slowfast_alpha") or TWO_PATHWAY_BACKBONES.get(backbone)
    if model.get("slowfast_alpha") is not None:
        assert backbone in TWO_PATHWAY_BACKBONES, "slowfast_alpha on a one-pathway backbone"
    assert data.get("slowfast_alpha") in (None, alpha), "data and model split the pathways differently"
    # The long cycle shortens clips to a quarter: the slow pathway must keep at least one frame.
    if alpha is not None:
        assert data["num_frames"] // 4 >= alpha
    jitter = data.get("jitter_scales")
    if jitter is not None:
        assert jitter[0] >= data["crop_size"]
    milestones = model.get("milestones", [])
    assert all(model.get("warmup_epochs", 0) < m < trainer["max_epochs"] for m in milestones)
    assert trainer.get("sync_batchnorm") is not True, "the multigrid callback groups BatchNorm itself"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped long-cycle stage warns
        schedule = build_schedule(
            MultigridConfig(
                base=GridShape(data["batch_size"], data["num_frames"], data["crop_size"]),
                max_epochs=trainer["max_epochs"],
                milestones=tuple(multigrid.get("milestones") or milestones),
                sampling_rate=data.get("sampling_rate", 4),
                gamma=model.get("gamma", 0.1),
                devices=int(trainer.get("devices", 1)) * int(trainer.get("num_nodes", 1)),
                jitter_scales=None if jitter is None else tuple(jitter),
                options=MultigridCallback(**multigrid).options,  # the options as the callback builds them
            )
        )
    if config.name == "kinetics400_slowfast_r50.yaml":
        # The paper's run (DESIGN.md, golden numbers): 358 epochs, 3.42x fewer iterations on 240k clips.
        assert schedule.max_epochs == 358
        assert [s.end_epoch for s in schedule.stages][:4] == [73, 110, 142, 158]
        saving = schedule.baseline_iterations(240_000) / schedule.total_iterations(240_000)
        assert saving == pytest.approx(3.42, abs=0.01)


def _write_multi_label_manifests(dataset: SyntheticDataset, directory: Path) -> tuple[Path, Path]:
    """The synthetic manifests with a second label per video (``path a,b``): a multi-label dataset."""
    paths = []
    for source in (dataset.train_manifest, dataset.val_manifest):
        lines = []
        for line in source.read_text(encoding="utf-8").splitlines():
            path, label = line.rsplit(maxsplit=1)
            lines.append(f"{path} {label},{(int(label) + 1) % dataset.num_classes}")
        target = directory / source.name
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(target)
    return paths[0], paths[1]


def _dry_run_args(config: Path, dataset: SyntheticDataset, tmp_path: Path) -> list[str]:
    model = _load(config)["model"]["init_args"]
    if model.get("multi_label"):
        train_manifest, val_manifest = _write_multi_label_manifests(dataset, tmp_path)
    else:
        train_manifest, val_manifest = dataset.train_manifest, dataset.val_manifest
    overrides = {
        # one CPU device, fp32, two training + two validation batches, no progress output
        "trainer.accelerator": "cpu",
        "trainer.devices": "1",
        "trainer.num_nodes": "1",
        "trainer.strategy": "auto",
        "trainer.precision": "32",
        "trainer.max_epochs": "1",
        "trainer.fast_dev_run": "2",
        "trainer.default_root_dir": str(tmp_path),
        "trainer.enable_progress_bar": "false",
        "trainer.enable_model_summary": "false",
        # a small one-pathway network and a schedule that fits one baseline epoch
        "model.init_args.backbone": "tiny",
        "model.init_args.tiny_width": "4",
        "model.init_args.slowfast_alpha": "null",
        "model.init_args.warmup_epochs": "0",
        "model.init_args.milestones": "[]",
        # the session's synthetic videos at a small base shape, decoded in this process
        "data.init_args.synthetic": "null",
        "data.init_args.train_manifest": str(train_manifest),
        "data.init_args.val_manifest": str(val_manifest),
        "data.init_args.test_manifest": "null",
        "data.init_args.root_dir": str(dataset.root),
        "data.init_args.class_names": str(dataset.class_names_file),
        "data.init_args.reader_settings": "null",
        "data.init_args.batch_size": "2",
        "data.init_args.num_frames": "8",
        "data.init_args.crop_size": "32",
        "data.init_args.jitter_scales": "null",  # default: (256, 320) * 32 / 224
        "data.init_args.slowfast_alpha": "null",
        "data.init_args.num_workers": "0",
        "data.init_args.pin_memory": "false",
        "multigrid.precise_bn_batches": "1",
        "multigrid.milestones": "null",
    }
    args = ["fit", "--config", str(config)]
    for key, value in overrides.items():
        args += [f"--{key}", value]
    return args


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_dry_run_on_synthetic_videos(
    config: Path,
    synthetic_dataset: SyntheticDataset,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(_dry_run_args(config, synthetic_dataset, tmp_path), monkeypatch, capsys)
    assert code == 0, err
    # One baseline epoch is two multigrid epochs (16 x 2 x 23, then 8 x 4 x 23); at 16 training
    # videos the first takes one step, so the second step runs after a long-cycle shape change.
    assert re.search(r"multigrid training finished: [12] epochs, 2 optimizer steps", out), out
    metric = "val/map" if _load(config)["model"]["init_args"].get("multi_label") else "val/top1"
    assert metric in out, out


def test_multigrid_enabled_false_runs_the_baseline(
    synthetic_dataset: SyntheticDataset,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    config = CONFIG_DIR / "kinetics400_slowfast_r50.yaml"
    args = _dry_run_args(config, synthetic_dataset, tmp_path) + ["--multigrid.enabled", "false"]
    code, out, err = _run(args, monkeypatch, capsys)
    assert code == 0, err
    # No schedule: the baseline's one epoch of 2-clip batches, cut to two steps by fast_dev_run.
    assert "baseline training finished: 1 epochs, 2 optimizer steps" in out, out


def test_fit_help_lists_the_multigrid_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(["fit", "--help"], monkeypatch, capsys)
    assert code == 0
    text = re.sub(r"\s+", " ", out)
    for option, help_text in (
        ("--multigrid.enabled", "turns the callback into a no-op"),
        ("--multigrid.epoch_factor", "multigrid epochs relative to the baseline"),
        ("--multigrid.long_cycle", "vary frames and crop over epochs"),
        ("--multigrid.short_cycle", "vary the crop every iteration"),
        ("--multigrid.bn_base_size", "clips over which BatchNorm computes statistics"),
    ):
        assert option in text, option
        assert help_text in text, help_text
    assert "--model" in text and "--data" in text


def _callback_of(args: list[str]) -> MultigridCallback:
    """The multigrid callback the real CLI parser builds from ``fit`` arguments (nothing trains)."""
    cli = build_cli(args[1:], save_config_callback=None)  # without the `fit` sub-command
    try:
        return next(c for c in cli.trainer.callbacks if isinstance(c, MultigridCallback))
    finally:
        cli.datamodule.teardown("fit")


@pytest.mark.parametrize(
    "value, expected",
    [
        ("false", None),
        ("true", DEFAULT_SHORT_RUN),
        ("{coarse_share: 0.25, max_lr_factor: 2}", ShortRun(coarse_share=0.25, max_lr_factor=2)),
    ],
)
def test_multigrid_options_from_the_command_line(
    value: str, expected: ShortRun | None, synthetic_dataset: SyntheticDataset, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "argv", ["lightning-multigrid"])
    args = _dry_run_args(CONFIG_DIR / "demo.yaml", synthetic_dataset, tmp_path)
    callback = _callback_of([*args, "--multigrid.short_run", value, "--multigrid.epoch_factor", "1.25"])
    assert callback.options == dataclasses.replace(DEFAULTS, epoch_factor=1.25, short_run=expected)


def test_short_run_from_a_yaml_config(synthetic_dataset: SyntheticDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["lightning-multigrid"])
    extra = tmp_path / "short_run.yaml"
    extra.write_text("multigrid:\n  short_run:\n    coarse_share: 0.3\n", encoding="utf-8")
    args = _dry_run_args(CONFIG_DIR / "demo.yaml", synthetic_dataset, tmp_path)
    callback = _callback_of([*args, "--config", str(extra)])
    assert callback.options.short_run == ShortRun(coarse_share=0.3)  # the other setting keeps its default


def test_a_bad_short_run_setting_is_refused_by_the_cli(
    synthetic_dataset: SyntheticDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    args = _dry_run_args(CONFIG_DIR / "demo.yaml", synthetic_dataset, tmp_path)
    # jsonargparse checks the value's fields on parsing and builds the ShortRun, which checks itself,
    # when it builds the callback: before anything is fitted.
    code, _, err = _run([*args, "--multigrid.short_run", "{coarse_share: 1.5}"], monkeypatch, capsys)
    assert code == 2
    assert "`--multigrid.short_run.coarse_share` must be a number in [0, 1), got 1.5" in err



def test_batch_sizing_from_the_command_line(
    synthetic_dataset: SyntheticDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["lightning-multigrid"])
    args = _dry_run_args(CONFIG_DIR / "demo.yaml", synthetic_dataset, tmp_path)
    assert _callback_of([*args, "--multigrid.batch_sizing", "time"]).options.batch_sizing == "time"
    assert _callback_of(args).options.batch_sizing == "equation1"  # off by default
